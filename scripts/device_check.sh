#!/usr/bin/env bash
# The GPU checks of a session that is lent a GPU node, as one prepared call (README "On a GPU node"): build and pack
# here (scripts/device_pack.sh), then through the device tool
#   run  command: bash scripts/device_check.sh   carry: [".devpack"]   timeout_s: 560
# It runs on the node, from the repository root, within LCPLAN_CHECK_SECONDS (default 480) and writes to $OUT:
#   node.txt       the node (nvidia-smi, toolkit, libraries a packed binary could not find);
#   selftest.txt   lcplan selftest --gpu (run by lcplan-profile, which lcplan executes): every test of gpu_tests.tsv
#                  on the device, then a short profile;
#   selftest-profile.json   that profile (commit it with its provenance: node.txt's GPU, driver, date);
#   exec-cuda.json / exec-cuda.txt   one lcplan-exec --backend cuda --cupti run of a 1-GPU dense plan (its record:
#                  CUDA-event and CUPTI seconds per phase) and `lcplan validate` of it against its estimate;
#   exec-cuda-moe.json / exec-cuda-moe.txt   the same for a 1-GPU Qwen3.5 MoE plan;
#   exec-cuda-packed.json / exec-cuda-packed.txt   the same for a packed (THD) microbatch of four sequences;
#   sanitizer.txt  compute-sanitizer memcheck of each GPU test binary, in the time left;
#   summary.txt    one line per step: pass, FAIL, skipped or not run (out of time).
# Everything but summary.txt is then packed into device-check.tgz (the device tool returns at most 8 files).
# Exit status: 0 when every step that ran passed, 1 otherwise, 2 when the pack is missing.
set -uo pipefail
cd "$(dirname "$0")/.."

pack=${LCPLAN_PACK:-.devpack}
out=${OUT:-/tmp/lcplan-device-check}
budget=${LCPLAN_CHECK_SECONDS:-480}
mkdir -p "$out"
if [ ! -f "$pack/env.sh" ]; then
  echo "device_check: no $pack/env.sh: run scripts/device_pack.sh before the call and carry $pack" >&2
  exit 2
fi
# shellcheck source=/dev/null
source "$pack/env.sh" 2>"$out/env-warnings.txt"
export LCPLAN_DATA_DIR=$PWD
export PATH="$PATH:/usr/local/cuda/bin"  # nvcc and compute-sanitizer, where the node's PATH lacks them
start=$SECONDS
left() { echo $((budget - (SECONDS - start))); }
summary="$out/summary.txt"
: >"$summary"
status=0
note() {  # note <verdict> <what>
  printf '%-9s %s\n' "$1" "$2" | tee -a "$summary"
  case $1 in FAIL) status=1 ;; esac
}

manifest="$pack/build/gpu_tests.tsv"
{
  date -u
  nvidia-smi || echo "nvidia-smi failed"
  command -v nvcc >/dev/null && nvcc --version | tail -2
  command -v compute-sanitizer >/dev/null && compute-sanitizer --version | head -2
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  cat "$out/env-warnings.txt"
  for b in "$pack/build/cli/lcplan" "$pack/build/cli/lcplan-profile" "$pack/build/cli/lcplan-exec" $(awk -F'\t' '!/^#/ && NF == 3 {print "'"$pack/build/"'" $2}' "$manifest"); do
    missing=$(ldd "$b" 2>&1 | grep 'not found')
    [ -n "$missing" ] && echo "MISSING for $b: $missing"
  done
} >"$out/node.txt" 2>&1
rm -f "$out/env-warnings.txt"
if grep -q '^MISSING' "$out/node.txt"; then note FAIL "libraries: a packed binary cannot load (node.txt)"; else note pass "libraries"; fi

# 1. Every GPU test on the device and a short profile (per-test timeout 120 s).
timeout "$(left)" lcplan selftest --gpu --build-dir "$pack/build" --mpiexec "$pack/usr/bin/mpirun" \
  --profile-out "$out/selftest-profile.json" --timeout 120 >"$out/selftest.txt" 2>&1
rc=$?
case $rc in
  0) note pass "lcplan selftest --gpu" ;;
  77) note skipped "lcplan selftest --gpu (no usable device: selftest.txt)" ;;
  124) note FAIL "lcplan selftest --gpu (out of time)" ;;
  *) note FAIL "lcplan selftest --gpu (exit $rc: selftest.txt)" ;;
esac

# 2. The executor itself on the device: one GPU (the node may have no second), three steps, CUPTI per phase; a dense
#    plan, then Qwen3.5-35B-A3B scaled (gated DeltaNet, MoE in two EP chunks, executor/moe_cuda.cpp).
for run in "exec-cuda dense-1gpu.json 16 2" "exec-cuda-moe moe-1gpu.json 64 1" "exec-cuda-packed packed-1gpu.json 64 1"; do
  read -r name plan scale layers <<<"$run"
  if [ "$rc" -eq 77 ]; then
    note skipped "lcplan-exec --backend cuda $plan (no usable device)"
    continue
  fi
  t=$(left)
  t=$((t < 120 ? t : 120))
  timeout "$t" "$pack/usr/bin/mpirun" --allow-run-as-root --oversubscribe -np 1 "$pack/build/cli/lcplan-exec" \
    --plan "tests/executor/plans/$plan" --scale "$scale" --layers "$layers" --steps 3 --backend cuda --cupti \
    --out "$out/$name.json" >"$out/$name.txt" 2>&1 </dev/null
  erc=$?
  if [ "$erc" -eq 0 ]; then
    note pass "lcplan-exec --backend cuda --cupti $plan ($name.json)"
    lcplan validate --plan "tests/executor/plans/$plan" --measured "$out/$name.json" >>"$out/$name.txt" 2>&1 ||
      note FAIL "lcplan validate of the GPU run ($name.txt)"
  else
    note FAIL "lcplan-exec --backend cuda --cupti $plan (exit $erc: $name.txt)"
  fi
done

# 3. compute-sanitizer memcheck of each binary, the executor's first (never run on a GPU before), in the time left.
if ! command -v compute-sanitizer >/dev/null; then
  note skipped "compute-sanitizer (not on this node)"
else
  : >"$out/sanitizer.txt"
  rows=$(awk -F'\t' '!/^#/ && NF == 3' "$manifest" | sort -t$'\t' -k1,1 | awk -F'\t' '{print ($1 ~ /^executor_/ ? 0 : 1) "\t" $0}' | sort -s -k1,1 | cut -f2-)
  while IFS=$'\t' read -r name rel np; do
    t=$(left)
    if [ "$t" -lt 20 ]; then
      note "not run" "compute-sanitizer $name (out of time)"
      continue
    fi
    if [ "$name" = profiler_cupti_test ]; then  # CUPTI takes one subscriber, and compute-sanitizer is one
      note skipped "compute-sanitizer $name (CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED under the sanitizer)"
      continue
    fi
    t=$((t < 150 ? t : 150))
    # API errors are not reported: NCCL's init probes cudaFuncGetAttributes for kernels it did not build for this
    # architecture (error 209, seen on an H200 2026-11-27); our own CUDA calls throw on any error (CUDA_CHECK).
    cs=(compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 99 --print-limit 20)
    if [ "$np" -gt 0 ]; then
      cmd=(mpirun --allow-run-as-root --oversubscribe -np "$np" "${cs[@]}" "$pack/build/$rel" --gtest_brief=1)
    else
      cmd=("${cs[@]}" "$pack/build/$rel" --gtest_brief=1)
    fi
    echo "=== $name: ${cmd[*]}" >>"$out/sanitizer.txt"
    timeout "$t" "${cmd[@]}" </dev/null >>"$out/sanitizer.txt" 2>&1  # mpirun would read the rows
    rc=$?
    case $rc in
      0) note pass "compute-sanitizer $name" ;;
      124) note FAIL "compute-sanitizer $name (out of time: ${t} s)" ;;
      *) note FAIL "compute-sanitizer $name (exit $rc: sanitizer.txt)" ;;
    esac
  done <<<"$rows"
fi
echo "device_check: $(grep -c '^pass' "$summary") passed, $(grep -c '^FAIL' "$summary") failed in $((SECONDS - start)) s"
# The device tool brings back at most 8 files: everything but the summary travels as one archive.
(cd "$out" && find . -maxdepth 1 -type f ! -name summary.txt ! -name device-check.tgz -printf '%P\n' |
  tar czf device-check.tgz -T - --remove-files)
exit $status
