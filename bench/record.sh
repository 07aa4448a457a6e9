#!/usr/bin/env bash
# Benchmarks that remember (issue 26): the search, one estimate, a tune round's own cost, the CPU profile of the
# reference recipe and the planner's start (`lcplan models`), each run several times; medians are kept in
# bench/results.json with the machine they ran on, and a fresh run is compared with a record as ratios of medians.
# The host is shared and noisy: compare ratios on the same machine, never absolute times (CI times nothing).
#   bench/record.sh [--build DIR] [--runs N] [--only REGEX]                      compare with the last record
#   bench/record.sh ... --against LABEL [--max-ratio R]                          compare with that record (exit 1 above R)
#   bench/record.sh ... --record LABEL [--note TEXT] [--commit C]                run and store as LABEL (replacing it)
# DIR defaults to build/release; it needs bench_search, bench_estimator_time, bench_tune and cli/lcplan. C names the
# commit DIR was built from when it is not this checkout's (a record of older binaries).
set -euo pipefail
cd "$(dirname "$0")/.."

build=build/release runs=5 only=. record="" against="" note="" max_ratio="" commit=""
while [ $# -gt 0 ]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    --record) record=$2; shift 2 ;;
    --against) against=$2; shift 2 ;;
    --note) note=$2; shift 2 ;;
    --max-ratio) max_ratio=$2; shift 2 ;;
    --commit) commit=$2; shift 2 ;;
    *) echo "record.sh: unknown argument \"$1\" (valid: --build, --runs, --only, --record, --against, --note, --max-ratio, --commit)" >&2; exit 2 ;;
  esac
done
case $runs in ''|*[!0-9]*|0) echo "record.sh: --runs \"$runs\" is not a whole number of runs (1 or more)" >&2; exit 2 ;; esac
for f in bench/search/bench_search bench/estimator_time/bench_estimator_time bench/tune/bench_tune cli/lcplan; do
  [ -x "$build/$f" ] || { echo "record.sh: $build/$f is missing (build it: cmake --build $build --target $(basename $f))" >&2; exit 2; }
done
export LCPLAN_DATA_DIR=$PWD
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
samples=$tmp/samples.tsv  # name, unit, value: one line per run

# One Google Benchmark case: its CPU time per iteration, in the unit it reports.
gbench() {  # gbench NAME BINARY FILTER
  "$build/$2" --benchmark_filter="$3" --benchmark_format=json 2>/dev/null |
    python3 -c 'import json,sys; b=json.load(sys.stdin)["benchmarks"][0]; print(b["time_unit"], b["cpu_time"])' |
    while read -r unit value; do printf '%s\t%s\t%s\n' "$1" "$unit" "$value" >>"$samples"; done
}
# A command's wall and CPU milliseconds (perf's task-clock, when perf runs here: the wall time of a short command on
# a loaded host is mostly waiting) and peak resident memory (KiB, /usr/bin/time's maximum resident set size).
have_perf=$(perf stat -e task-clock -x, true 2>&1 >/dev/null | grep -q task-clock && echo 1 || true)
timed() {  # timed NAME COMMAND...
  local name=$1 start end
  shift
  start=$(date +%s%N)
  /usr/bin/time -f '%M' -o "$tmp/time" "$@" >/dev/null 2>"$tmp/err" || { cat "$tmp/err" >&2; return 1; }
  end=$(date +%s%N)
  printf '%s\t%s\t%s\n' "$name" ms "$(((end - start) / 1000))e-3" >>"$samples"
  printf '%s_peak_rss\t%s\t%s\n' "$name" KiB "$(tail -1 "$tmp/time")" >>"$samples"
  [ -n "$have_perf" ] || return 0
  perf stat -e task-clock -x, -o "$tmp/perf" "$@" >/dev/null 2>&1
  printf '%s_cpu\t%s\t%s\n' "$name" ms "$(awk -F, '/task-clock/ {print $1}' "$tmp/perf")" >>"$samples"
}

want() { [[ $1 =~ $only ]]; }
for ((i = 1; i <= runs; i++)); do
  echo "record.sh: run $i of $runs" >&2
  want search_qwen && gbench search_qwen35_32gpu_128k bench/search/bench_search 'qwen35_35b_32gpu_128k$'
  want search_deepseek && gbench search_deepseek_v3_1024gpu_4k bench/search/bench_search 'deepseek_v3_1024gpu_4k$'
  want search_qwen && gbench search_qwen35_32gpu_128k_bumblebee bench/search/bench_search 'qwen35_35b_32gpu_128k_bumblebee$'
  # Issue 29: a search over a 1,000-bucket length histogram against search_qwen35_32gpu_128k_bumblebee (target 3x).
  want search_batches && gbench search_qwen35_32gpu_1000_lengths bench/search/bench_search 'BatchSearch'
  want search_deepseek && gbench search_deepseek_v3_1024gpu_4k_bumblebee bench/search/bench_search 'deepseek_v3_1024gpu_4k_bumblebee$'
  want estimate && gbench estimate_qwen35_chunked_ep bench/estimator_time/bench_estimator_time 'BM_Qwen35_ChunkedEp$'
  want estimate && gbench estimate_llama70b_pp8_vpp5 bench/estimator_time/bench_estimator_time 'BM_Llama70B_Pp8Vpp5$'
  want estimate && gbench estimate_qwen3_235b_1024gpus bench/estimator_time/bench_estimator_time 'BM_Qwen3_235B_1024Gpus$'
  want tune && gbench tune_round bench/tune/bench_tune 'BM_TuneRounds'
  want models && timed lcplan_models "$build/cli/lcplan" models
  want search_deepseek && timed lcplan_search_deepseek "$build/cli/lcplan" search --model deepseek-v3 --gpus 1024 --seq 4k
  # The profile takes most of a minute (its CPU time is measured by a second run only with perf: skipped).
  want profile && have_perf="" timed lcplan_profile_cpu_quick "$build/cli/lcplan" profile --plan bench/reference-recipe.json \
    --backend cpu --quick --out "$tmp/profile.json" --hardware-out "$tmp/hardware.json"
done

[ -n "$commit" ] || commit=$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . ':!bench/results.json' || echo "+changes")
python3 - "$samples" "$record" "$against" "$note" "$max_ratio" "$commit" "$runs" "$build" <<'EOF'
import datetime, json, os, statistics, sys
samples, record, against, note, max_ratio, commit, runs, build = sys.argv[1:]
path = "bench/results.json"
results = {}
for line in open(samples):
    name, unit, value = line.rstrip("\n").split("\t")
    r = results.setdefault(name, {"unit": unit, "runs": []})
    r["runs"].append(float(value))
for r in results.values():
    r["median"] = statistics.median(r["runs"])
store = json.load(open(path)) if os.path.exists(path) else {"records": []}
if record:
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "unknown")
    entry = {"label": record, "commit": commit, "date": datetime.date.today().isoformat(), "build": build,
             "machine": {"cpu": cpu, "cores": os.cpu_count(), "load_1min": os.getloadavg()[0]},
             "runs": int(runs), "note": note, "results": results}
    store["records"] = [r for r in store["records"] if r["label"] != record] + [entry]
    with open(path + ".tmp", "w") as f:
        json.dump(store, f, indent=2)
        f.write("\n")
    os.replace(path + ".tmp", path)
    print(f"record.sh: stored \"{record}\" in {path}")
base = next((r for r in store["records"] if r["label"] == against), None) if against else \
       next((r for r in reversed(store["records"]) if r["label"] != record), None)
if against and base is None:
    sys.exit(f"record.sh: {path} has no record \"{against}\" (valid: " + ", ".join(r["label"] for r in store["records"]) + ")")
print(f"{'benchmark':42} {'unit':>4} {'median':>10}" + (f" {'recorded':>10} {'ratio':>6}   (recorded: {base['label']}, {base['commit']})" if base else ""))
worst = 0.0
for name, r in results.items():
    line = f"{name:42} {r['unit']:>4} {r['median']:10.4g}"
    old = base["results"].get(name) if base else None
    if old and old["median"] > 0:
        ratio = r["median"] / old["median"]
        worst = max(worst, ratio)
        line += f" {old['median']:10.4g} {ratio:6.2f}"
    print(line)
if max_ratio and worst > float(max_ratio):
    sys.exit(f"record.sh: a median is {worst:.2f} x its record, above --max-ratio {max_ratio}")
EOF
