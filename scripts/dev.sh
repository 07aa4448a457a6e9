#!/usr/bin/env bash
# One entry point for a fresh Debian machine (run as root):
#   scripts/dev.sh main   install what is missing, build, run the main job
#   scripts/dev.sh test   install what is missing, build, run the whole test suite (normal + sanitizer build)
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(build-essential cmake git libeigen3-dev nlohmann-json3-dev libcli11-dev libgtest-dev libgmock-dev
          libbenchmark-dev openmpi-bin libopenmpi-dev clang libclang-rt-14-dev)

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
      ctest --preset asan -j "$jobs"
    fi
    ;;
  *)
    echo "usage: scripts/dev.sh main|test" >&2
    exit 2
    ;;
esac
