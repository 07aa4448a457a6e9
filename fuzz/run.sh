#!/usr/bin/env bash
# Runs one libFuzzer target for a chosen time:  fuzz/run.sh <target> <seconds> [extra libFuzzer flags]
#   targets: hf_config plan measurement calibration size estimate megatron_args megatron_log run_settings seq_lengths
# Builds the fuzz preset (clang) if needed, fuzzes with the seed corpus read-only (new inputs go to a scratch
# corpus under build/fuzz/), and writes any crash to build/fuzz/artifacts/<target>/. A crash found should be
# copied into fuzz/corpus/<target>/ (named regress-<what>) together with its fix, so every replay checks it.
set -euo pipefail
cd "$(dirname "$0")/.."
target=${1:?usage: fuzz/run.sh <target> <seconds> [libFuzzer flags]}
seconds=${2:?usage: fuzz/run.sh <target> <seconds> [libFuzzer flags]}
shift 2
build=${LCPLAN_FUZZ_BUILD:-build/fuzz}
# LCPLAN_FUZZ_SANITIZERS=undefined (with another LCPLAN_FUZZ_BUILD) builds without ASan, for campaigns at volume.
# Another build folder gets only the areas the fuzzers link: the estimator needs kernels/ (lcplan_moe_schedule),
# the measurement target profiler/ (lcplan_profiler); the CLI, tests and benchmarks are left out.
if [ ! -f "$build/CMakeCache.txt" ]; then
  if [ "$build" = build/fuzz ]; then cmake --preset fuzz >/dev/null
  else cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLCPLAN_CUDA=OFF -DLCPLAN_FUZZ=ON -DLCPLAN_BENCH=OFF \
         -DLCPLAN_FUZZ_SANITIZERS="${LCPLAN_FUZZ_SANITIZERS:-address,undefined}" \
         -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang -DLCPLAN_AREAS="common;models;parallel;estimator;calibrate;search;kernels;profiler;fuzz" \
         >/dev/null; fi
fi
cmake --build "$build" --target "fuzz_$target" -j "${LCPLAN_JOBS:-2}"
scratch="$build/fuzz/scratch/$target"
artifacts="$build/fuzz/artifacts/$target"
mkdir -p "$scratch" "$artifacts"
export LCPLAN_DATA_DIR="$PWD"
# halt_on_error/abort: a sanitizer report is a crash; print_final_stats gives the executed-input count for the README.
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1} UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
exec "$build/fuzz/fuzz_$target" -max_total_time="$seconds" -print_final_stats=1 -max_len=8192 -timeout=10 \
     -rss_limit_mb=4096 -artifact_prefix="$artifacts/" "$@" "$scratch" "fuzz/corpus/$target"
