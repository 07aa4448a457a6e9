#!/usr/bin/env python3
"""Record the visible corpus's validation errors: data/validation/recorded-errors.json and README's table.

Runs `lcplan validate --json` on the corpus (the files CI validates), writes every group's in-sample and left-out
step-time error (model, hardware, context band: leave that group out and refit) with the date and commit, and
rewrites the README block between the validation markers. tests/time/validation_test.cpp fails when a group's error
grows more than 2 points beyond what is recorded here, or when README and this file disagree.

Usage: scripts/record_validation.py [path/to/lcplan]   (default build/release/cli/lcplan)"""
import datetime, json, os, re, subprocess, sys

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
LAYERS = "megatron-moe-layer-perf-h100-runs.json"  # one MoE layer's forward + backward: also held case by case


def fitted_files():
    """Every file the default profile is fitted to (scripts/fit_default_profile.sh's names): a refit that leaves a
    group out must see every other row the shipped fit saw, or its error is not the shipped profile's."""
    text = open(os.path.join(root, "scripts", "fit_default_profile.sh")).read()
    m = re.search(r"^names=\(([^)]*)\)", text, re.M)
    if not m:
        sys.exit("record_validation.py: scripts/fit_default_profile.sh has no names=(...) list of measurement files")
    return m.group(1).split()


CORPUS = fitted_files()
BEGIN, END = "<!-- validation-groups:begin -->", "<!-- validation-groups:end -->"
LAYER_BEGIN, LAYER_END = "<!-- moe-layer-benchmarks:begin -->", "<!-- moe-layer-benchmarks:end -->"


def group_line(name, g):
    left = "-" if g["left_out"] is None else "%.1f%%" % (100 * g["left_out"])
    return "| %s | %d | %.1f%% | %s |" % (name, g["rows"], 100 * g["in_sample"], left)


def main():
    lcplan = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "build", "release", "cli", "lcplan")
    files = [os.path.join(root, "data", "validation", f) for f in CORPUS]
    out = subprocess.run([lcplan, "validate", "--json", "--measurements"] + files, check=True, capture_output=True,
                         text=True).stdout
    s = json.loads(out)["summary"]
    groups = {}
    for kind in ("by_model", "by_hardware", "by_context"):
        for g in s[kind]:
            groups[g["group"]] = {"rows": g["rows"], "in_sample": g["in_sample"], "left_out": g["left_out"]}
    commit = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    record = {"description": "step-time mean |relative error| per group of the visible corpus, in sample and with the "
                             "group left out of the fit (scripts/record_validation.py)",
              "date": datetime.date.today().isoformat(), "commit": commit, "corpus": ["data/validation/" + f for f in CORPUS],
              "summary": {k: s[k] for k in ("time_rows", "time_in_sample", "time_leave_one_model_out",
                                            "time_leave_one_hardware_out", "time_leave_one_context_band_out")},
              "groups": groups}
    layer_out = subprocess.run([lcplan, "validate", "--json", "--no-refit", "--measurements",
                                os.path.join(root, "data", "validation", LAYERS)],
                               check=True, capture_output=True, text=True).stdout
    layers = {}
    for r in json.loads(layer_out)["rows"]:
        c = layers.setdefault(r["id"], {"model": os.path.basename(r["model"]).removesuffix(".json"),
                                        "precision": r["precision"]})
        if r["quantity"] == "peak_bytes":
            c.update(measured_peak_bytes=r["measured"], predicted_peak_bytes=r["predicted"], peak_error=r["error"])
        else:
            c.update(measured_seconds=r["measured"], predicted_seconds=r["predicted"], error=r["error"])
    record["moe_layer_benchmarks"] = {"file": "data/validation/" + LAYERS, "cases": layers}
    with open(os.path.join(root, "data", "validation", "recorded-errors.json"), "w") as f:
        json.dump(record, f, indent=1)
        f.write("\n")
    table = [BEGIN, "| group (step time) | rows | in sample | left out of the fit |", "|---|---|---|---|"]
    table += [group_line(name, g) for name, g in groups.items()]
    table.append(END)
    readme = os.path.join(root, "README.md")
    text = open(readme).read()
    a, b = text.index(BEGIN), text.index(END) + len(END)
    text = text[:a] + "\n".join(table) + text[b:]
    rows = [LAYER_BEGIN, "| case | layer | precision | measured (ms) | predicted (ms) | error | max allocated (GB) | "
                         "predicted (GB) | error |", "|---|---|---|---|---|---|---|---|---|"]
    rows += ["| %s | %s | %s | %.2f | %.2f | %+.1f%% | %.2f | %.2f | %+.1f%% |" % (
        i, c["model"], c["precision"], 1e3 * c["measured_seconds"], 1e3 * c["predicted_seconds"], 100 * c["error"],
        1e-9 * c["measured_peak_bytes"], 1e-9 * c["predicted_peak_bytes"], 100 * c["peak_error"])
             for i, c in layers.items()]
    rows.append(LAYER_END)
    a, b = text.index(LAYER_BEGIN), text.index(LAYER_END) + len(LAYER_END)
    open(readme, "w").write(text[:a] + "\n".join(rows) + text[b:])


if __name__ == "__main__":
    main()
