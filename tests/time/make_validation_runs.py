#!/usr/bin/env python3
"""Turn the public validation tables (data/validation/*.json, copied from shared/validation) into lcplan
Measurement files. Assumptions are written into each record's "notes"; rows lcplan cannot express are listed."""
import json, os, sys

root = os.path.join(os.path.dirname(__file__), "..", "..", "data", "validation")

# ---- bumblebee: the article's chunked-EP proxy (one MoE layer) and the five tuning-path points ----
art = json.load(open(os.path.join(root, "article-qwen35-35b-a3b.json")))
runs = []
for row in art["chunked_ep_single_layer_proxy"]["rows"]:
    for chunks, key in ((1, "no_chunk_ms"), (2, "chunked_ms")):
        L = row["local_seq"]
        runs.append({
            "id": f"proxy-{L // 1024}k-chunk{chunks}",
            "source": "article section 2.4 chunked EP single-MoE-layer proxy",
            "scope": "moe_layer",
            "plan": {"model": "qwen3.5-35b-a3b", "hardware": "h100-sxm-80gb", "gpus": 8, "seq_len": L,
                     "micro_batch": 1, "parallel": {"tp": 1, "pp": 1, "cp": 1, "ep": 8},
                     "moe": {"ep_chunks": chunks}, "implementation": "bumblebee"},
            "step_seconds": row[key] / 1e3,
            "notes": "local_seq tokens per rank; EP=8 on one node assumed (the article's proxy runs EP8)"})
GLOBAL_BATCH = 64  # not stated by the article; 64 x 128K-token sequences assumed (see notes)
for row in art["tuning_path"]:
    meas = row["measured"]
    tf = meas.get("tflops_per_gpu") or (meas["tflops_per_gpu_min"] + meas["tflops_per_gpu_max"]) / 2
    runs.append({
        "id": "tuning-" + row["id"],
        "source": row["source"]["table"],
        "plan": {"model": "qwen3.5-35b-a3b", "hardware": "h100-sxm-80gb", "gpus": row["num_gpus"],
                 "seq_len": row["seq_len"], "micro_batch": 1, "global_batch": GLOBAL_BATCH, "precision": "bf16",
                 "parallel": {"tp": row["TP"], "pp": row["PP"], "cp": row["CP"], "ep": row["EP"], "etp": 1},
                 "optimizer_sharding": "fsdp" if row["optimizer_sharding"] == "fsdp" else "dist_opt",
                 "recompute": "full", "linear_ce": row["linear_ce"], "moe": {"ep_chunks": row["moe_ep_chunks"]},
                 "implementation": "bumblebee"},
        "tflops_per_gpu": tf,
        "notes": "global batch not stated by the article: 64 sequences assumed; chunked-EP row uses the midpoint of 185.96-187.10"})
json.dump({"description": "bumblebee (article) measurements: chunked-EP proxy and tuning path", "measurements": runs},
          open(os.path.join(root, "bumblebee-runs.json"), "w"), indent=1)

# ---- megatron: Megatron-Bridge H100 table, newest container per configuration ----
rows = json.load(open(os.path.join(root, "megatron-bridge-h100.json")))
zoo = {"LLAMA3.1_405B": "llama-3.1-405b", "LLAMA3_70B": "llama-3.1-70b", "LLAMA3_8B": "llama-3.1-8b",
       "GPT OSS 120B": "gpt-oss-120b", "Qwen3_30B_a3B": "qwen3-30b-a3b", "Qwen3_235B_a22B": "qwen3-235b-a22b",
       "DeepSeekV3": "deepseek-v3"}
layers = {"llama-3.1-405b": 126, "llama-3.1-70b": 80, "llama-3.1-8b": 32, "gpt-oss-120b": 36, "qwen3-30b-a3b": 48,
          "qwen3-235b-a22b": 94, "deepseek-v3": 61}
def version(c): return tuple(int(x) for x in c.split("."))
def key(r):
    base = r["model"].split(" (")[0]
    return (base, "tokendrop" in r["model"], r["other_flags"]["task"], r["num_gpus"], r["seq_len"], r["micro_batch"],
            r["global_batch"], r["TP"], r["PP"], r["VPP"] or 1, r["EP"] or 1, r["CP"], bool(r["other_flags"]["FSDP_column"]))
newest, skipped = {}, []
for r in rows:
    if "alternate variant" in (r["notes"] or ""):
        skipped.append((r["id"], "parenthesised alternate FP8 granularity of the same row")); continue
    k = key(r)
    if k not in newest or version(r["other_flags"]["container"]) > version(newest[k]["other_flags"]["container"]):
        if k in newest: skipped.append((newest[k]["id"], "older container of " + r["id"]))
        newest[k] = r
    else:
        skipped.append((r["id"], "older container of " + newest[k]["id"]))
runs = []
for k, r in newest.items():
    base = k[0]
    if base not in zoo:
        skipped.append((r["id"], f"{base} is a hybrid Mamba model lcplan cannot express")); continue
    if r["other_flags"]["task"].startswith("LoRA"):
        skipped.append((r["id"], "LoRA fine-tuning (frozen base weights) is not a plan lcplan models")); continue
    model = zoo[base]
    vpp = r["VPP"] or 1
    chunks = r["PP"] * vpp
    # Megatron splits layers evenly, or layers + 2 when embedding and loss count as layers (parallel/pipeline_split.h).
    if layers[model] % chunks and (chunks <= 2 or (layers[model] + 2) % chunks):
        skipped.append((r["id"], f"{layers[model]} layers do not split over pp*vpp = {chunks} by either Megatron rule (needs a custom pipeline layout)")); continue
    drop = "tokendrop" in r["model"]
    plan = {"model": model, "hardware": "h100-sxm-80gb", "gpus": r["num_gpus"], "seq_len": r["seq_len"],
            "micro_batch": r["micro_batch"], "global_batch": r["global_batch"],
            "precision": "fp8" if r["precision"].startswith("FP8") else "bf16",
            "parallel": {"tp": r["TP"], "pp": r["PP"], "vpp": vpp, "cp": r["CP"], "ep": r["EP"] or 1, "etp": r["ETP"] or 1},
            "optimizer_sharding": "fsdp" if r["other_flags"]["FSDP_column"] else "dist_opt",
            "recompute": "none", "implementation": "megatron"}
    if drop: plan["moe"] = {"capacity_factor": 1.0}
    runs.append({"id": r["id"], "source": f'{r["source"]["table"]} ({r["source"]["path"]} @ {r["source"]["commit"][:8]})',
                 "plan": plan, "tflops_per_gpu": r["measured"]["tflops_per_gpu"],
                 "notes": "assumed: distributed optimizer unless the FSDP column is set, no recompute" +
                          (", token dropping at capacity factor 1.0" if drop else "")})
json.dump({"description": "Megatron-Bridge H100 measurements, newest container per configuration",
           "measurements": runs}, open(os.path.join(root, "megatron-bridge-runs.json"), "w"), indent=1)
for s in skipped: print("skipped", *s, file=sys.stderr)
print(len(runs), "megatron runs", file=sys.stderr)
