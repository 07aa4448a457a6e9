#!/usr/bin/env bash
# Refit data/calibration/default.json from the priors and every visible measurement, then validate it and store its
# error bands (leave-one-model-out residuals). Run from the repository root after changing the model or the data.
#
# --try tries a variant instead and writes nothing under data/: it fits into a temporary profile, validates it on
# the corpus CI validates (with the leave-one-group-out refits) and prints every group against the record
# (data/validation/recorded-errors.json), the article's path (time and peak) and the long-context rows. Options (any mode):
#   --data DIR                 the measurement files from DIR (a modified copy of data/validation/, models/ beside)
#   --also FILE                fit FILE's rows too (a *-runs.json file found in the data)
#   --fit KEYS, --per-hardware KEYS, --per-implementation KEYS    replace the key lists below
#   --prior KEY=VALUE          start from a prior moved to VALUE (hold it there: leave KEY out of --fit)
set -euo pipefail
cd "$(dirname "$0")/.."
lcplan=${LCPLAN:-build/release/cli/lcplan}
data=data/validation
# Every visible row: the long-context Qwen3-235B runs and Megatron-LM's one-MoE-layer benchmarks too (their times;
# their max allocated bytes are checked, not fitted: memory_not_fitted in each record says why).
names=(megatron-bridge-h100-runs.json megatron-bridge-blackwell-runs.json bumblebee-runs.json
       megatron-moe-long-context-h100-runs.json megatron-moe-layer-perf-h100-runs.json)
# Shared (base) coefficients: kernel efficiencies by class and precision, host costs, overlaps.
fit=time.gemm_efficiency,time.grouped_gemm_efficiency,time.fp8_gemm_ratio,time.mxfp8_gemm_ratio,time.nvfp4_gemm_ratio
fit+=,time.fp8_grouped_gemm_ratio,time.mxfp8_grouped_gemm_ratio,time.attention_efficiency,time.linear_attention_efficiency
fit+=,time.attention_wide_head_backward
fit+=,time.launch_seconds,time.step_overhead_seconds,time.a2a_network_efficiency,time.tp_overlap,time.dp_overlap
fit+=,time.ep_overlap
# Per hardware profile: the GEMM efficiencies (shrunk toward the shared value).
per_hw=time.gemm_efficiency,time.grouped_gemm_efficiency
# Per implementation: what differs between frameworks (MoE data movement, all-to-all, memory reserves).
per_impl=time.moe_permute_passes,time.a2a_nvlink_efficiency,time.a2a_latency,time.moe_sync_seconds
per_impl+=,memory.moe_buffer_copies,memory.moe_chunk_overlap,memory.fragmentation
try=0 priors_moved=()
usage="valid: --try, --data DIR, --also FILE, --fit KEYS, --per-hardware KEYS, --per-implementation KEYS, --prior KEY=VALUE"
while [ $# -gt 0 ]; do
  case $1 in
    --try) try=1; shift ;;
    --data|--also|--fit|--per-hardware|--per-implementation|--prior)
      [ $# -ge 2 ] || { echo "fit_default_profile.sh: $1 needs a value ($usage)" >&2; exit 2; }
      case $1 in
        --data) data=$2 ;; --also) names+=("$2") ;; --fit) fit=$2 ;; --per-hardware) per_hw=$2 ;;
        --per-implementation) per_impl=$2 ;; --prior) priors_moved+=("$2") ;;
      esac
      shift 2 ;;
    *) echo "fit_default_profile.sh: unknown argument \"$1\" ($usage)" >&2; exit 2 ;;
  esac
done
[ -d "$data" ] || { echo "fit_default_profile.sh: --data \"$data\" is not a folder of measurement files" >&2; exit 2; }
runs=()
for n in "${names[@]}"; do
  [ -f "$data/$n" ] || { echo "fit_default_profile.sh: $data/$n does not exist (a *-runs.json file name)" >&2; exit 2; }
  runs+=("$data/$n")
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
priors=priors
if [ ${#priors_moved[@]} -gt 0 ]; then
  priors=$work/priors.json
  python3 - "$priors" "${priors_moved[@]}" <<'PY'
import json, sys
d = json.load(open("data/calibration/priors.json"))
for kv in sys.argv[2:]:
    k, _, v = kv.partition("=")
    if k not in d["coefficients"] or not v:
        print("fit_default_profile.sh: --prior %s is not KEY=VALUE with KEY a coefficient of priors.json" % kv,
              file=sys.stderr)
        sys.exit(2)
    d["coefficients"][k]["value"] = float(v)
    d["coefficients"][k]["provenance"] = "moved by fit_default_profile.sh --prior: " + d["coefficients"][k]["provenance"]
json.dump(d, open(sys.argv[1], "w"), indent=1)
PY
fi
tmp=$work/profile.json
"$lcplan" calibrate --measurements "${runs[@]}" --start "$priors" --priors "$priors" --out "$tmp" --no-loo \
  --fit "$fit" --per-hardware "$per_hw" --per-implementation "$per_impl" > "$work/calibrate.log"
[ $try = 1 ] || cat "$work/calibrate.log"
# Validated on what it is fitted to (the corpus CI validates, scripts/record_validation.py), so each leave-one-group-out
# refit sees every row the profile saw but the group; its leave-one-model-out residuals are an estimate's error band.
files=("${runs[@]}")
if [ $try = 1 ]; then
  "$lcplan" validate --json --calibration "$tmp" --priors "$priors" --measurements "${files[@]}" > "$work/validate.json"
  exec python3 - "$work/validate.json" "$tmp" <<'PY'
import json, sys
v, prof = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
rec = json.load(open("data/validation/recorded-errors.json"))
s, r = v["summary"], rec["summary"]
keys = ("time_in_sample", "time_leave_one_model_out", "time_leave_one_hardware_out", "time_leave_one_context_band_out")
print("all rows: " + ", ".join("%s %.1f%% (%+.1f)" % (k[5:], 100 * s[k], 100 * (s[k] - r[k])) for k in keys))
def cell(x, y):  # an error and its change against the record (x None: not measured; y None: not recorded)
    if x is None:
        return "-"
    return "%.1f%%" % (100 * x) + ("" if y is None else " (%+.1f)" % (100 * (x - y)))
print("%-28s %5s  %-16s %s" % ("group (against the record)", "rows", "in sample", "left out"))
for kind in ("by_model", "by_hardware", "by_context"):
    for g in s[kind]:
        old = rec["groups"].get(g["group"], {})
        print("%-28s %5d  %-16s %s" % (g["group"], g["rows"], cell(g["in_sample"], old.get("in_sample")),
                                      cell(g["left_out"], old.get("left_out"))))
rows = ["%s %+.1f%%" % (x["id"], 100 * (x["predicted"] / x["measured"] - 1)) for x in v["rows"]
        if x["quantity"] != "peak_bytes" and (x["id"].startswith("tuning") or x["id"].startswith("mz"))]
print("article and long rows: " + ", ".join(rows))
peaks = ["%s %+.1f%%" % (x["id"], 100 * (x["predicted"] / x["measured"] - 1)) for x in v["rows"]
         if x["quantity"] == "peak_bytes" and x["id"].startswith("tuning")]
print("article peaks: " + ", ".join(peaks))
fitted = lambda c: {k: float("%.3g" % x["value"]) for k, x in c.items() if x.get("provenance", "").startswith("fitted")}
print("fitted: %s" % fitted(prof["coefficients"]))
for kind in ("per_implementation", "per_hardware"):
    for name, c in prof.get(kind, {}).items():
        if fitted(c):
            print("  %s: %s" % (name, fitted(c)))
PY
fi
python3 - "$tmp" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
d["name"] = "default"
d["description"] = ("lcplan's profile: published priors (data/calibration/priors.json) fitted to every visible "
                    "measurement (data/validation/*-runs.json) by scripts/fit_default_profile.sh")
for c in d["coefficients"].values():
    c.pop("log_sigma", None)
json.dump(d, open(sys.argv[1], "w"), indent=2)
PY
"$lcplan" validate --measurements "${files[@]}" --calibration "$tmp" --priors "$priors" --out-profile data/calibration/default.json | tail -20
# validate names the stored profile after the file it read (the temporary one): give it its own name back.
python3 - <<'PY'
import json
p = "data/calibration/default.json"
d = json.load(open(p))
d["name"] = "default"
json.dump(d, open(p, "w"), indent=2)
open(p, "a").write("\n")
PY
