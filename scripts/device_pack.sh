#!/usr/bin/env bash
# Packs what a GPU node needs to run this build's GPU checks (scripts/device_check.sh) without building there: the
# node is bare (no OpenMPI, no Eigen or GoogleTest headers, no registry), but it has the NVIDIA driver and CUDA's
# own libraries. Run here after `cmake --preset release && cmake --build --preset release` with nvcc present:
#   scripts/device_pack.sh [BUILD_DIR] [PACK_DIR]        (defaults: build/release, .devpack)
# PACK_DIR then holds
#   build/          lcplan, lcplan-profile (what `lcplan profile` and `lcplan selftest` run), lcplan-exec and every
#                   binary of BUILD_DIR/gpu_tests.tsv at its place in the build tree,
#                   with the manifest (so `lcplan selftest --gpu --build-dir PACK_DIR/build` finds them);
#   lib/            every shared library those binaries and OpenMPI's plugins load, except glibc's and CUDA's
#                   (driver, cudart, cuBLAS, NCCL, CUPTI: the node's own, found by env.sh);
#   usr/, etc/      OpenMPI's launcher, plugins, help texts and settings, relocated with OPAL_* variables;
#   env.sh          sourced on the node: the library path, OpenMPI's relocation, and the CUDA libraries it found.
# It refuses a pack over 60 MiB (the device tool carries 64 MiB with the working tree). .devpack is git-ignored:
# name it in the device tool's carry list.
set -euo pipefail
cd "$(dirname "$0")/.."

build=${1:-build/release}
pack=${2:-.devpack}
manifest="$build/gpu_tests.tsv"
if [ ! -f "$manifest" ] || [ ! -x "$build/cli/lcplan" ] || [ ! -x "$build/cli/lcplan-profile" ]; then
  echo "device_pack: $build has no gpu_tests.tsv, cli/lcplan or cli/lcplan-profile: build it first (cmake --preset release && cmake --build --preset release)" >&2
  exit 2
fi
if ! grep -qv '^#' "$manifest"; then
  echo "device_pack: $manifest lists no GPU tests (nvcc was missing when $build was configured)" >&2
  exit 2
fi

rm -rf "$pack"
mkdir -p "$pack/build/cli" "$pack/lib"
bins=("$build/cli/lcplan" "$build/cli/lcplan-profile" "$build/cli/lcplan-exec")
cp "${bins[@]}" "$pack/build/cli/"  # lcplan runs lcplan-profile from its own folder
cp "$manifest" "$pack/build/"
while IFS=$'\t' read -r name rel np; do
  [ -z "$name" ] || [ "${name:0:1}" = "#" ] && continue
  if [ ! -x "$build/$rel" ]; then
    echo "device_pack: $manifest lists $rel but $build/$rel was not built" >&2
    exit 2
  fi
  mkdir -p "$pack/build/$(dirname "$rel")"
  cp "$build/$rel" "$pack/build/$rel"
  bins+=("$build/$rel")
done <"$manifest"

# OpenMPI as Debian installs it (ompi_info --path all: prefix /usr, libdir /usr/lib/x86_64-linux-gnu/openmpi/lib,
# plugins in its openmpi3/, help texts in /usr/share/openmpi, settings in /etc/openmpi).
ompi=/usr/lib/x86_64-linux-gnu/openmpi
mkdir -p "$pack/usr/bin" "$pack/usr/lib/x86_64-linux-gnu" "$pack/usr/share" "$pack/etc"
cp -a "$ompi" "$pack/usr/lib/x86_64-linux-gnu/"
rm -rf "$pack/usr/lib/x86_64-linux-gnu/openmpi/include" "$pack/usr/lib/x86_64-linux-gnu/openmpi/lib/pkgconfig"
# Its lib/ links point back into /usr/lib (libmpi.so.40 ...), which lib/ below holds: drop the links that dangle here.
find "$pack/usr" -xtype l -delete
cp -L /usr/bin/orterun "$pack/usr/bin/orterun"
cp "$pack/usr/bin/orterun" "$pack/usr/bin/mpirun"
cp "$pack/usr/bin/orterun" "$pack/usr/bin/mpiexec"
cp -L /usr/bin/orted "$pack/usr/bin/orted" 2>/dev/null || true
cp -a /usr/share/openmpi "$pack/usr/share/"
cp -a /etc/openmpi "$pack/etc/"

# Shared libraries: what ldd resolves for every binary and plugin, minus the ones the node brings itself.
provided='^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libresolv|libutil|libcuda|libcudart|libcublas|libcublasLt|libnccl|libcupti|libnvrtc|libnvJitLink|libnvidia-)[.-]'
objs=("${bins[@]}" "$pack/usr/bin/orterun")
while IFS= read -r -d '' so; do objs+=("$so"); done < <(find "$pack/usr/lib/x86_64-linux-gnu/openmpi" -name '*.so*' -type f -print0)
declare -A seen=()
for o in "${objs[@]}"; do
  while read -r soname path; do
    [ -n "$path" ] && [ -f "$path" ] || continue
    [[ "$soname" =~ $provided ]] && continue
    [ -n "${seen[$soname]:-}" ] && continue
    seen[$soname]=1
    cp -L "$path" "$pack/lib/$soname"
  done < <(ldd "$o" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}')
done

cat >"$pack/env.sh" <<'EOF'
# Sourced on the GPU node from the repository root (scripts/device_check.sh): the pack's libraries first, then the
# node's CUDA libraries (the toolkit's, or the Python packages' where the toolkit lacks one), and OpenMPI relocated.
pack=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cuda_dirs=""
for lib in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libnccl.so.2 libcupti.so.13; do
  found=""
  for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/extras/CUPTI/lib64 /usr/lib/x86_64-linux-gnu; do
    [ -e "$d/$lib" ] && found=$d && break
  done
  [ -z "$found" ] && found=$(dirname "$(find / -xdev -name "$lib" -not -path '/proc/*' 2>/dev/null | head -1)" 2>/dev/null || true)
  if [ -n "$found" ] && [ "$found" != . ]; then
    case ":$cuda_dirs:" in *":$found:"*) ;; *) cuda_dirs="$cuda_dirs:$found" ;; esac
  else
    echo "env.sh: $lib not found on this node" >&2
  fi
done
export LD_LIBRARY_PATH="$pack/lib:$pack/usr/lib/x86_64-linux-gnu/openmpi/lib$cuda_dirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export OPAL_PREFIX="$pack/usr" OPAL_EXEC_PREFIX="$pack/usr" OPAL_BINDIR="$pack/usr/bin"
export OPAL_LIBDIR="$pack/usr/lib/x86_64-linux-gnu/openmpi/lib"
export OPAL_PKGLIBDIR="$pack/usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3"
export OPAL_DATAROOTDIR="$pack/usr/share" OPAL_DATADIR="$pack/usr/share" OPAL_PKGDATADIR="$pack/usr/share/openmpi"
export OPAL_SYSCONFDIR="$pack/etc/openmpi"
export PATH="$pack/usr/bin:$pack/build/cli:$PATH"
export PMIX_MCA_pcompress_base_silence_warning=1  # the node lacks PMIx's zlib plugin; the warning fills every log
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
EOF

# Symbols are not needed on the node (compute-sanitizer reports device frames from the fatbinary); dropping them keeps
# the pack under the carry limit.
find "$pack/build" "$pack/lib" -type f -exec strip --strip-unneeded {} + 2>/dev/null || true
size=$(du -sbL "$pack" | cut -f1)
echo "device_pack: $pack holds ${#bins[@]} binaries and ${#seen[@]} libraries, $((size / 1048576)) MiB"
if [ "$size" -gt $((60 * 1048576)) ]; then
  echo "device_pack: $pack is over 60 MiB, more than the device tool carries beside the working tree" >&2
  exit 1
fi
