#!/usr/bin/env bash
# One entry point for a fresh Debian machine (run as root):
#   scripts/dev.sh main   install what is missing, build, run the main job
#   scripts/dev.sh test   install what is missing, build, run the whole test suite (normal + sanitizer build) and a
#                         fuzz smoke (each libFuzzer target, 20,000 inputs; about 2 minutes on 2 cores with the build)
# Environment: LCPLAN_SKIP_ASAN=1 skips the sanitizer build, LCPLAN_SKIP_FUZZ=1 the fuzz smoke (also skipped
# without clang++).
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(build-essential cmake git libeigen3-dev nlohmann-json3-dev libcli11-dev libgtest-dev libgmock-dev
          libbenchmark-dev openmpi-bin libopenmpi-dev clang libclang-rt-14-dev pybind11-dev python3-dev zlib1g-dev
          chromium)

install_missing() {
  local missing=()
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "installing: ${missing[*]}"
    local sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

jobs=$(nproc)
build() {  # build <preset>
  cmake --preset "$1" >/dev/null
  cmake --build --preset "$1" -j "$jobs"
}

# OpenMPI refuses root without these; CI runs as root.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1

case "${1:-}" in
  main)
    install_missing
    build release
    ./build/release/cli/lcplan search --model qwen3.5-35b-a3b --gpus 32 --seq 128k
    ;;
  test)
    install_missing
    build release
    ctest --preset release -j "$jobs"
    if [ "${LCPLAN_SKIP_ASAN:-0}" != 1 ]; then
      build asan
      ctest --preset asan -j "$jobs"      # leak checking on
      ctest --preset asan-mpi -j "$jobs"  # MPI tests, leak checking off (see CMakePresets.json)
    fi
    if [ "${LCPLAN_SKIP_FUZZ:-0}" != 1 ] && command -v clang++ >/dev/null; then
      # Smoke, not a campaign: each fuzzer from its seed corpus for 20,000 inputs (fuzz/README.md has the long runs).
      fuzz_build=${LCPLAN_FUZZ_BUILD:-build/fuzz}
      for t in hf_config plan measurement calibration size estimate megatron_args megatron_log run_settings seq_lengths; do
        log=$(mktemp)
        if ! fuzz/run.sh "$t" 300 -runs=20000 >"$log" 2>&1; then
          tail -40 "$log"
          echo "fuzz smoke: fuzz_$t failed (crash inputs in $fuzz_build/fuzz/artifacts/$t/)" >&2
          exit 1
        fi
        echo "fuzz smoke: fuzz_$t $(grep -o 'number_of_executed_units: [0-9]*' "$log"), no crash"
        rm -f "$log"
      done
    fi
    ;;
  *)
    echo "usage: scripts/dev.sh main|test" >&2
    exit 2
    ;;
esac
