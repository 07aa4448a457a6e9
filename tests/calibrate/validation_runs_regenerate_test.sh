#!/usr/bin/env bash
# The committed measurement files in data/validation/ are exactly what scripts/make_validation_runs.py makes from the
# public tables beside them: a hand edit of a *-runs.json (or a script change not rerun) fails here.
# Usage: validation_runs_regenerate_test.sh PYTHON SOURCE_DIR
set -euo pipefail
python=$1 src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$python" "$src/scripts/make_validation_runs.py" --out "$tmp" 2>/dev/null
n=0
for f in "$tmp"/*-runs.json; do
  name=$(basename "$f")
  if ! cmp -s "$f" "$src/data/validation/$name"; then
    echo "FAIL: data/validation/$name differs from what scripts/make_validation_runs.py makes (rerun it and commit)"
    diff <("$python" -m json.tool "$src/data/validation/$name") <("$python" -m json.tool "$f") | head -20 || true
    exit 1
  fi
  n=$((n + 1))
done
[ "$n" -ge 5 ] || { echo "FAIL: the script made $n measurement files, expected 5"; exit 1; }
# Bad arguments: one sentence and exit 2, nothing written.
if "$python" "$src/scripts/make_validation_runs.py" --out "$tmp/missing" 2>"$tmp/err"; then
  echo "FAIL: a missing --out folder was accepted"; exit 1
fi
grep -q "not valid" "$tmp/err" || { echo "FAIL: no sentence for a bad argument"; cat "$tmp/err"; exit 1; }
echo "OK: $n measurement files match their generator"
