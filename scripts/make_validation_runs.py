#!/usr/bin/env python3
"""Turn the public validation tables in data/validation/ into lcplan measurement files.

Inputs (copies of public tables, each row with its source address):
  article-qwen35-35b-a3b.json        the article's tuning path and chunked-EP proxy
                                     (https://iseekyan.github.io/posts/qwen35-long-sequence-moe-rl/)
  megatron-bridge-h100.json          Megatron-Bridge H100 performance tables
  megatron-bridge-blackwell.json     Megatron-Bridge B200/B300/GB200/GB300 performance tables
                                     (https://docs.nvidia.com/nemo/megatron-bridge/latest/performance-summary.html)
  megatron-moe-long-context-h100.json  Megatron-MoE-ModelZoo Qwen3-235B-A22B at 16K-128K with CP 1-8
                                     (https://github.com/yanring/Megatron-MoE-ModelZoo, best_practice/qwen3)
  megatron-moe-layer-perf-h100.json  Megatron-LM's single-MoE-layer benchmarks on 8 H100 (the file's source fields)
Outputs: bumblebee-runs.json, megatron-bridge-h100-runs.json, megatron-bridge-blackwell-runs.json,
megatron-moe-long-context-h100-runs.json, megatron-moe-layer-perf-h100-runs.json (in data/validation/, or the folder
given by --out DIR).

Every row becomes a record. Rows lcplan cannot express carry "not_modelled" (the reason); rows of an older container
with the same configuration as a newer one carry "superseded_by" (they are predicted and reported, not fitted).
Assumptions are written into each record's notes."""
import json, os, re, sys

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "validation")
# --out DIR writes the outputs there instead (tests/calibrate: the committed files are what this script makes).
out_dir = root
if len(sys.argv) == 3 and sys.argv[1] == "--out" and os.path.isdir(sys.argv[2]):
    out_dir = sys.argv[2]
elif len(sys.argv) > 1:
    print("make_validation_runs.py: arguments %r are not valid (none, or --out DIR with DIR an existing folder)"
          % sys.argv[1:], file=sys.stderr)
    sys.exit(2)


def dump(name, description, runs):
    with open(os.path.join(out_dir, name), "w") as f:
        json.dump({"description": description, "measurements": runs}, f, indent=1)
        f.write("\n")


# ---- the article: chunked-EP proxy (one MoE layer) and the five tuning-path points ----
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
    rec = {
        "id": "tuning-" + row["id"],
        "source": row["source"]["table"] + " (" + row["source"]["url"] + ")",
        "plan": {"model": "qwen3.5-35b-a3b", "hardware": "h100-sxm-80gb", "gpus": row["num_gpus"],
                 "seq_len": row["seq_len"], "micro_batch": 1, "global_batch": GLOBAL_BATCH, "precision": "bf16",
                 "parallel": {"tp": row["TP"], "pp": row["PP"], "cp": row["CP"], "ep": row["EP"], "etp": 1},
                 "optimizer_sharding": "fsdp" if row["optimizer_sharding"] == "fsdp" else "dist_opt",
                 "recompute": "full", "linear_ce": row["linear_ce"], "moe": {"ep_chunks": row["moe_ep_chunks"]},
                 "implementation": "bumblebee"},
        "tflops_per_gpu": tf,
        "notes": "global batch not stated by the article: 64 sequences assumed; chunked-EP row uses the midpoint of "
                 "185.96-187.10; peak memory read as rank 0's (stage 0), GB = 1e9 bytes as the article prints"}
    if meas.get("peak_mem_gb") or meas.get("peak_mem_gb_min"):
        rec["peak_stage"] = 0  # the article's peak is read as rank 0's, which holds pipeline stage 0
    if meas.get("peak_mem_gb"):
        rec["peak_bytes"] = meas["peak_mem_gb"] * 1e9
    elif meas.get("peak_mem_gb_min"):
        rec["peak_bytes"] = (meas["peak_mem_gb_min"] + meas["peak_mem_gb_max"]) / 2 * 1e9
    runs.append(rec)
dump("bumblebee-runs.json", "bumblebee (article) measurements: chunked-EP proxy and tuning path", runs)

# ---- Megatron-Bridge tables ----
ZOO = {"LLAMA3.1_405B": "llama-3.1-405b", "LLAMA3_70B": "llama-3.1-70b", "LLAMA3_8B": "llama-3.1-8b",
       "GPT OSS 120B": "gpt-oss-120b", "Qwen3_30B_a3B": "qwen3-30b-a3b", "Qwen3_235B_a22B": "qwen3-235b-a22b",
       "DeepSeekV3": "deepseek-v3"}
HARDWARE = {"H100": "h100-sxm-80gb", "B200": "b200", "B300": "b300", "GB200": "gb200-nvl72", "GB300": "gb300-nvl72"}


def hardware(text):
    return HARDWARE[text.split(" ")[0]]


def precision(text):
    t = text.upper()
    if t.startswith("BF16"): return "bf16"
    if t.startswith("NVFP4"): return "nvfp4"
    if t.startswith("MXFP8") or t.startswith("FP8-MX"): return "mxfp8"
    if t.startswith("FP8"): return "fp8"  # FP8, FP8-CS (current scaling), FP8 with no recipe named
    raise ValueError(text)


# What Megatron-Bridge's performance recipes set (src/megatron/bridge/perf_recipes/**, Megatron-Bridge@067f987df03b):
# gradients reduced in bf16 (grad_reduce_in_fp32 False), the DP overlaps on, fp8 current scaling for "FP8-CS", and
# the recompute modules and CUDA graphs the recipes name for these models.
def state_recipe_settings(plan, base, r, notes):
    plan["optimizer"] = {"grad_dtype": "bf16"}
    plan["comm"] = {"overlap_grad_reduce": True, "overlap_param_gather": True}
    notes.append("recipe: grad_reduce_in_fp32 False, overlap_grad_reduce and overlap_param_gather on (perf_recipes/_common.py)")
    if r["precision"].upper().startswith("FP8-CS"):
        plan["fp8"] = {"recipe": "tensorwise"}
    hw = r["hardware"].split(" ")[0]
    if base == "LLAMA3_70B" and (r["TP"] or 1) > 1:
        plan["comm"]["tp_overlap"] = True
        notes.append("recipe: TP communication overlap with userbuffers (Llama3-70B perf recipes)")
    if base == "DeepSeekV3":
        modules = ["mla_up_proj", "mlp"] if hw == "H100" else ["mla_up_proj"]
        plan["recompute"], plan["recompute_modules"] = "selective", modules
        notes.append("recipe: selective recompute of %s (DeepSeek-V3 %s perf recipes)" % (", ".join(modules), hw))
        if hw == "GB200":
            plan["cuda_graphs"] = {"impl": "transformer_engine", "modules": ["attn", "moe_router", "moe_preprocess"]}
            notes.append("recipe: Transformer Engine CUDA graphs of attn, moe_router, moe_preprocess (DeepSeek-V3 GB200 perf recipes)")
    elif r.get("is_moe"):
        plan["recompute"], plan["recompute_modules"] = "selective", ["layernorm", "moe_act"]
        notes.append("recipe: selective recompute of layernorm, moe_act (MoE perf recipes)")
    elif base == "LLAMA3_8B" and hw == "H100" and r["precision"].upper().startswith("FP8-CS"):
        plan["recompute"], plan["recompute_layers"], plan["recompute_method"] = "full", 5, "block"
        notes.append("recipe: full recompute, block method, 5 layers (Llama3-8B H100 fp8cs perf recipe)")


# A configuration as the tables state it (the recipe settings stated above do not tell two rows apart: a row without
# a named fp8 recipe is the same configuration as one with it).
def configuration_key(plan):
    recipe = {"fp8", "recompute", "recompute_modules", "recompute_layers", "recompute_method", "cuda_graphs", "optimizer",
              "comm", "implementation"}
    p = {k: v for k, v in plan.items() if k not in recipe}
    if "moe" in p:
        p["moe"] = {k: v for k, v in p["moe"].items() if k not in ("routing", "pad_to_capacity")}
    return json.dumps(p, sort_keys=True)


def version(c):
    return tuple(int(x) for x in c.split("."))


def convert(rows, out_name, description):
    runs, newest = [], {}
    for r in rows:
        rid = r.get("id") or "bw%03d" % r["row"]
        base = r["model"].split(" (")[0]
        variant = r["model"][len(base):].strip(" ()")
        of = r["other_flags"]
        rec = {"id": rid,
               "source": "%s (%s @ %s, %s)" % (r["source"]["table"], r["source"]["path"], r["source"]["commit"][:8],
                                               r["source"]["url"]),
               }
        # Step time from the published tokens/s/GPU: the physical quantity. The published TFLOP/s use the container's
        # own FLOP count, which changed between containers for some models (GPT-OSS, DeepSeek-V3 without MTP), so
        # they are kept in the notes and not fitted.
        meas = r["measured"]
        rec["step_seconds"] = r["global_batch"] * r["seq_len"] / (meas["tokens_per_s_per_gpu"] * r["num_gpus"])
        notes = ["step_seconds = global_batch x seq_len / (tokens/s/GPU %g x %d GPUs); published %g TFLOP/s/GPU by "
                 "the container's FLOP count" % (meas["tokens_per_s_per_gpu"], r["num_gpus"], meas["tflops_per_gpu"])]
        if base not in ZOO:
            rec["not_modelled"] = base + " has Mamba layers, which lcplan's model zoo cannot express"
        elif of["task"].startswith("LoRA"):
            rec["not_modelled"] = "LoRA fine-tuning (frozen base weights, adapter gradients only) is not a plan lcplan models"
        model = ZOO.get(base, base)
        vpp = r["VPP"] or 1
        plan = {"model": model, "hardware": hardware(r["hardware"]), "gpus": r["num_gpus"], "seq_len": r["seq_len"],
                "micro_batch": r["micro_batch"], "global_batch": r["global_batch"],
                "precision": precision(r["precision"]),
                "parallel": {"tp": r["TP"], "pp": r["PP"], "vpp": vpp, "cp": r["CP"], "ep": r["EP"] or 1,
                             "etp": r["ETP"] or 1},
                "optimizer_sharding": "fsdp" if of.get("FSDP_column") else "dist_opt",
                "recompute": "none", "implementation": "megatron-bridge"}
        notes.append("assumed: %s (the table states neither)" %
                     ("FSDP over the FSDP column's ranks" if of.get("FSDP_column") else "distributed optimizer"))
        state_recipe_settings(plan, base, r, notes)
        if variant == "tokendrop":
            plan["moe"] = dict(plan.get("moe", {}), capacity_factor=1.0, pad_to_capacity=True)
            notes.append("token dropping at capacity factor 1.0 with experts padded to capacity")
        if variant == "w/o MTP":
            plan["mtp_layers"] = 0
        elif variant == "w/ MTP":
            plan["mtp_layers"] = 1
        elif base == "DeepSeekV3":
            notes.append("MTP as the model defines it (1 module): the row does not say")
        if r.get("is_moe"):
            moe = plan.setdefault("moe", {})
            moe["routing"] = "forced"
            notes.append("routing force-balanced (the page's footnote)")
            if base == "DeepSeekV3":
                moe["dispatcher"] = "deepep"
                notes.append("assumed: DeepEP token dispatch (Megatron's flex dispatcher), as the DeepSeek-V3 recipes use")
            overlap_allowed = (r["EP"] or 1) > 1 and (r["PP"] == 1 or vpp > 1)
            if overlap_allowed and base == "GPT OSS 120B":
                notes.append("EP all-to-all not overlapped across microbatches (Megatron-LM's default): the table's own "
                             "EP 8 / EP 64 pairs of the 26.02 containers (B300 5.45 -> 9.80 s, B200 5.97 -> 10.18 s) "
                             "pay EP 64's cross-node all-to-all nearly in full, which an overlapped one would mostly hide")
            elif overlap_allowed:
                moe["a2a_overlap"] = True
                notes.append("assumed: EP all-to-all overlapped across microbatches where Megatron allows it (pp 1 or "
                             "vpp > 1), as Megatron-Bridge's MoE performance recipes do")
        if of["task"].startswith("SFT"):
            notes.append("SFT with packed sequences, costed as pre-training of the same shape")
        if r["precision"].startswith("FP8 ("):
            notes.append("FP8 recipe not named by the table")
        if "alternate variant" in (r.get("notes") or ""):
            notes.append("the table's parenthesised value (another FP8 granularity) of the same row")
        rec["plan"] = plan
        rec["notes"] = "; ".join(notes)
        runs.append(rec)
        if "not_modelled" in rec or "alternate variant" in (r.get("notes") or ""):
            continue
        key = configuration_key(plan) + of["task"]
        if key not in newest or version(of["container"]) > version(newest[key][1]):
            newest[key] = (rid, of["container"])
    by_id = {rec["id"]: rec for rec in runs}
    winners = {v[0] for v in newest.values()}
    for rec in runs:
        if "not_modelled" in rec or rec["id"] in winners:
            continue
        key = configuration_key(rec["plan"])
        task = next(r["other_flags"]["task"] for r in rows if (r.get("id") or "bw%03d" % r["row"]) == rec["id"])
        rec["superseded_by"] = newest[key + task][0] if key + task in newest else ""
        if not rec["superseded_by"]:
            del rec["superseded_by"]
    dump(out_name, description, runs)
    fitted = sum(1 for r in runs if "not_modelled" not in r and "superseded_by" not in r and
                 "parenthesised" not in r["notes"])
    print(f"{out_name}: {len(runs)} rows, {fitted} newest per configuration", file=sys.stderr)


convert(json.load(open(os.path.join(root, "megatron-bridge-h100.json"))), "megatron-bridge-h100-runs.json",
        "Megatron-Bridge H100 measurements (every row; older containers marked superseded_by)")
convert(json.load(open(os.path.join(root, "megatron-bridge-blackwell.json"))), "megatron-bridge-blackwell-runs.json",
        "Megatron-Bridge Blackwell measurements (every row; older containers marked superseded_by)")


# ---- Megatron-MoE-ModelZoo: Qwen3-235B-A22B at 16K-128K on 256 H100 (CP 1-8) ----
def convert_long_context(rows, out_name, description):
    runs = []
    for r in rows:
        s = r["source"]
        of = r["other_flags"]
        vpp = r["VPP"] or 1
        plan = {"model": "qwen3-235b-a22b", "hardware": "h100-sxm-80gb", "gpus": r["num_gpus"], "seq_len": r["seq_len"],
                "micro_batch": r["micro_batch"] or 1, "global_batch": r["global_batch"], "precision": "bf16",
                "parallel": {"tp": r["TP"], "pp": r["PP"], "vpp": vpp, "cp": r["CP"], "ep": r["EP"], "etp": r["ETP"]},
                "optimizer_sharding": "dist_opt", "recompute": "selective", "recompute_modules": ["layernorm", "moe"],
                "moe": {"dispatcher": "deepep" if of["dispatcher"] == "DeepEP" else "alltoall",
                        "routing": "forced" if of["routing"] == "forced balance" else "aux_loss",
                        "a2a_overlap": bool(of["A2A_OVERLAP"])},
                "implementation": "megatron"}
        notes = ["measured TFLOPs/GPU by Megatron-LM's FLOP count (causal attention halved, as lcplan counts)",
                 "micro batch 1 (the script's default; the table does not state it)",
                 "settings the table does not state take Megatron-LM's defaults"]
        runs.append({"id": "mz-" + r["id"], "source": "%s (https://github.com/%s/blob/%s/%s)" % (
                         s["table"], s["repo"], s["commit"], s["path"]),
                     "tflops_per_gpu": r["measured"]["tflops_per_gpu"], "plan": plan, "notes": "; ".join(notes)})
    dump(out_name, description, runs)
    print(f"{out_name}: {len(runs)} rows", file=sys.stderr)


convert_long_context(json.load(open(os.path.join(root, "megatron-moe-long-context-h100.json"))),
                     "megatron-moe-long-context-h100-runs.json",
                     "Megatron-MoE-ModelZoo Qwen3-235B-A22B long-context runs on 256 H100 (force-balanced routing)")


def convert_moe_layer_perf(rows, out_name, description):
    """Megatron-LM's single-MoE-layer benchmarks as moe_layer-scope rows: forward + backward of one layer (its time
    fitted, its max allocated bytes checked only)."""
    runs = []
    for r in rows:
        s, of, mc = r["source"], r["other_flags"], r["other_flags"]["model_config"]
        mixtral = mc["hidden_size"] == 4096
        dispatcher = of["dispatcher"].lower()
        plan = {"model": "mixtral-8x7b" if mixtral else "models/deepseek-moe-layer-proxy.json",
                "hardware": "h100-sxm-80gb", "gpus": r["num_gpus"], "seq_len": r["seq_len"],
                "micro_batch": r["micro_batch"], "global_batch": r["global_batch"],
                "precision": "bf16" if r["precision"] == "bf16" else "fp8",
                "parallel": {"tp": r["TP"], "pp": 1, "cp": r["CP"], "ep": r["EP"], "etp": r["ETP"]},
                "moe": {"dispatcher": "deepep" if "deepep" in dispatcher else "hybridep" if "hybridep" in dispatcher
                        else "alltoall",
                        "routing": "forced", "permute_fusion": bool(of["moe_permute_fusion"]),
                        "router_dtype": "fp32" if mc.get("router_dtype") == "fp32" else "bf16"},
                "cuda_graphs": {"impl": "none"}, "implementation": "megatron"}
        if plan["precision"] == "fp8":
            plan["fp8"] = {"recipe": "blockwise"}
        m = r["measured"]
        notes = ["forward %.3f ms + backward %.3f ms (CUDA events, mean of 20 iterations, rank 0); max allocated %d bytes"
                 % (m["forward_ms"], m["backward_ms"], m["max_allocated_bytes"]),
                 "4,096 tokens per rank, one MoE layer (router and experts, no attention)",
                 "Mixtral-8x7B's MoE layer" if mixtral else "the DeepSeek-like proxy (data/validation/models)"]
        runs.append({"id": r["id"], "source": "%s (%s)" % (s["table"], s["url"]), "scope": "moe_layer",
                     "step_seconds": (m["forward_ms"] + m["backward_ms"]) / 1e3, "plan": plan,
                     "notes": "; ".join(notes), "peak_bytes": float(m["max_allocated_bytes"]),
                     "memory_not_fitted": "the benchmark's peak moves with the dispatcher alone (DeepEP and HybridEP keep "
                                          "their buffers outside PyTorch's allocator), which the estimate's routed-copy "
                                          "buffer count does not separate (README, Known gaps)"})
    dump(out_name, description, runs)
    print(f"{out_name}: {len(runs)} rows", file=sys.stderr)


convert_moe_layer_perf(json.load(open(os.path.join(root, "megatron-moe-layer-perf-h100.json"))),
                       "megatron-moe-layer-perf-h100-runs.json",
                       "Megatron-LM's single MoE layer benchmarks on 8 H100 (forward + backward of one layer, forced "
                       "balance, 4,096 tokens per rank)")
