#!/usr/bin/env python3
"""Writes the seed corpora under fuzz/corpus/<target>/ from models/zoo, data/ and hand-made edge cases.
Seeds are named seed-*; files the fuzzer finds (crash-*/regress-*) are kept beside them and never overwritten."""
import json, os, glob, hashlib

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
corpus = os.path.join(root, "fuzz", "corpus")

def put(target, name, data):
    d = os.path.join(corpus, target)
    os.makedirs(d, exist_ok=True)
    if not isinstance(data, (str, bytes)):
        data = json.dumps(data, indent=1)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, "seed-" + name), "wb") as f:
        f.write(data)

def load(path):
    with open(path) as f:
        return json.load(f)

# HF configs: every zoo file, a nested text_config wrapper, and broken variants naming fields.
for p in sorted(glob.glob(os.path.join(root, "models", "zoo", "*.json"))):
    name = os.path.basename(p)[:-5]
    cfg = load(p)
    put("hf_config", name, cfg)
    put("hf_config", name + "-wrapped", {"architectures": ["Wrapper"], "text_config": cfg})
    broken = dict(cfg); broken["hidden_size"] = -1
    put("hf_config", name + "-neg-hidden", broken)
    broken = dict(cfg); broken["num_hidden_layers"] = "many"
    put("hf_config", name + "-layers-string", broken)
    broken = dict(cfg); broken.pop("vocab_size", None)
    put("hf_config", name + "-no-vocab", broken)
for i, text in enumerate(["", "{}", "[]", "null", "{\"model_type\": \"llama\"}", "{\"text_config\": {\"text_config\": {}}}",
                          "{\"model_type\":\"llama\",\"hidden_size\":1e300}", "{\"num_hidden_layers\": 4294967297}"]):
    put("hf_config", "edge-%d" % i, text)

# Plans: the validation recipes, plan_to_json-style full records, and edge cases.
plans = []
for p in sorted(glob.glob(os.path.join(root, "data", "validation", "*.json"))):
    j = load(p)
    ms = j if isinstance(j, list) else j.get("measurements", [])
    for m in ms:
        if isinstance(m, dict) and "plan" in m:
            plans.append(m["plan"])
for i, pl in enumerate(plans[:40]):
    put("plan", "validation-%02d" % i, pl)
ref = {"model": "qwen3.5-35b-a3b", "hardware": "h100-sxm-80gb", "gpus": 32, "seq_len": "128k", "micro_batch": 1,
       "global_batch": 32, "precision": "bf16", "parallel": {"tp": 1, "pp": 1, "vpp": 1, "cp": 4, "ep": 8, "etp": 1},
       "sequence_parallel": True, "optimizer_sharding": "fsdp", "recompute": "full", "recompute_layers": 0,
       "offload": {"optimizer": False, "activations": False}, "linear_ce": True,
       "moe": {"ep_chunks": 2, "routing_imbalance": 1.0, "capacity_factor": 0}, "implementation": "bumblebee"}
put("plan", "reference", ref)
edge_plans = [
    dict(ref, dp=8), dict(ref, dp=7), dict(ref, dp="8"), dict(ref, seq_len=-5), dict(ref, seq_len="1.5M"),
    dict(ref, seq_len=9223372036854775807), dict(ref, gpus=2147483647), dict(ref, gpus=2147483648),
    dict(ref, parallel={"tp": 65536, "pp": 65536, "cp": 65536}, dp=1), dict(ref, micro_batch=2147483647),
    dict(ref, parallel={"tp": 1, "bogus": 2}), dict(ref, moe={"routing_imbalance": 1e308}),
    dict(ref, moe={"routing_imbalance": "x"}), dict(ref, recompute="partial"), {"model": ""}, {}, [], 5, "plan",
    dict(ref, parallel={"tp": 2, "pp": 2, "vpp": 2, "cp": 1, "ep": 8, "etp": 1}, pipeline={"microbatch_group": 4},
         sequence_parallel=False, distribute_saved_activations=True),
]
for i, pl in enumerate(edge_plans):
    put("plan", "edge-%02d" % i, pl)

# Measurements: the validation files whole, each record alone, and edge cases.
for p in sorted(glob.glob(os.path.join(root, "data", "validation", "*.json"))):
    j = load(p)
    if isinstance(j, list) or "measurements" in j:
        put("measurement", os.path.basename(p)[:-5], j)
for i, pl in enumerate(plans[:12]):
    put("measurement", "one-%02d" % i, [{"id": "m%d" % i, "plan": pl, "peak_bytes": 6.4e10, "step_seconds": 3.5}])
edge_meas = [[], {}, {"measurements": []}, {"measurements": [{}]}, [{"plan": ref}],
             [{"plan": ref, "peak_bytes": -1}], [{"plan": ref, "scope": "moe_layer", "peak_bytes": 1}],
             [{"plan": ref, "step_seconds": 1e309}], [{"id": 5, "plan": ref, "step_seconds": 1}],
             [{"plan": ref, "step_seconds": 1, "source": {"nested": [1, 2]}}], [{"plan": ref, "tflops_per_gpu": 0}],
             [{"plan": ref, "step_seconds": 1, "memory_not_fitted": "no peak"}],
             [{"plan": ref, "peak_bytes": 1e9, "memory_not_fitted": 5}]]
for i, m in enumerate(edge_meas):
    put("measurement", "edge-%02d" % i, m)
# lcplan-exec records: the optional detail (breakdowns, phases, ranks, scale, steps) and broken variants of it.
bd = {"params": 1.4e5, "grads": 2.9e5, "optimizer": 8.7e5, "fsdp_buffers": 9.9e5, "activations": 2.8e6,
      "logits": 0, "moe_buffers": 9.4e6, "workspace": 3.3e7, "cuda_context": 0, "fragmentation": 0}
exec_rec = {"id": "lcplan-exec", "source": "lcplan-exec, CPU backend", "plan": dict(ref, gpus=4, implementation="lcplan-exec"),
            "scope": "step", "peak_bytes": 4.8e7, "step_seconds": 1.9, "breakdown": bd, "peak_phase": "backward",
            "peak_rank": 2, "phases": {"forward": {"peak_bytes": 4.5e7, "breakdown": bd, "category_peaks": bd, "seconds": 0.5},
                                       "backward": {"peak_bytes": 4.8e7, "breakdown": bd, "seconds": 1.0}},
            "ranks": [{"rank": r, "peak_bytes": 4.7e7, "peak_phase": "backward", "workspace_high_water_bytes": 4.7e6} for r in range(4)],
            "scale": {"factor": 64, "layers_per_kind": 1, "mtp_dropped": 1, "kept_layers": [0, 3], "model": {"hidden": 32}},
            "steps": 2, "loss": 8.76, "grad_norm": 0.37, "per_step": [{"loss": 8.76, "grad_norm": 0.37, "seconds": 2.1}],
            "backend": "cpu", "device": "cpu", "host": "Linux", "executor": {"moe_routing_load": 1.04}, "notes": "n"}
put("measurement", "executor-record", [exec_rec])
for i, (k, v) in enumerate([("breakdown", {"activation": 1}), ("peak_phase", "warmup"), ("peak_rank", -1),
                            ("phases", {"forward": {"seconds": -1}}), ("phases", {"prefill": {}}), ("ranks", [{}]),
                            ("ranks", {"rank": 0}), ("scale", {"factor": 0}), ("scale", {"kept_layers": "0,3"}),
                            ("steps", 1.5), ("loss", "nan"), ("per_step", [{"seconds": 1e309}]), ("executor", [1]),
                            ("host", 5)]):
    put("measurement", "executor-edge-%02d" % i, [dict(exec_rec, **{k: v})])

# Calibration: the shipped profiles and broken variants.
for p in sorted(glob.glob(os.path.join(root, "data", "calibration", "*.json"))):
    name = os.path.basename(p)[:-5]
    c = load(p)
    put("calibration", name, c)
    coeffs = c.get("coefficients", {})
    if coeffs:
        k = sorted(coeffs)[0]
        for tag, val in [("neg", -1), ("str", "1"), ("huge", 1e308), ("null", None)]:
            b = json.loads(json.dumps(c)); b["coefficients"][k]["value"] = val
            put("calibration", "%s-%s" % (name, tag), b)
        b = json.loads(json.dumps(c)); b["coefficients"][k] = 3
        put("calibration", name + "-flat", b)
        b = json.loads(json.dumps(c)); del b["coefficients"][k]["provenance"]
        put("calibration", name + "-noprov", b)
for i, t in enumerate(["{}", "[]", "{\"coefficients\": []}", "{\"coefficients\": {}, \"extra\": 1}"]):
    put("calibration", "edge-%d" % i, t)

# Size strings.
for i, s in enumerate(["128k", "1.5M", "64K", "131072", "1M", "4096", "1G", "0", "-4", "12x", "1.5", "k", "", ".5k",
                       "1..5k", "99999999999999999999999999999999", "0.0000001M", "1e5", " 128k", "128k ", "nan",
                       "inf", "0x10", "1.00000000000000000000000000001k", "bf16", "fp8", "full", "selective", "none",
                       "dist_opt", "fsdp", "\u00b9\u00b2"]):
    put("size", "%02d" % i, s)

# Estimate: byte strings decoded by fuzz_estimate.cpp into plans (first bytes pick model/hardware/calibration).
for i in range(64):
    put("estimate", "%02d" % i, hashlib.sha256(b"lcplan-estimate-%d" % i).digest() * 2)
for i in range(16):
    put("estimate", "zeros-%02d" % i, bytes([i, 0, 0] + [0] * 40))

# Run settings: recipe keys read on top of fuzz_run_settings.cpp's fixed MoE plan (implementations, dtypes, modules,
# graphs, dispatchers, overlap switches), and a bad module name.
run_settings = {
    "megatron-defaults": {},
    "bridge": {"implementation": "megatron-bridge", "precision": "fp8", "optimizer_sharding": "dist_opt"},
    "precision-aware": {"optimizer": {"grad_dtype": "bf16", "main_params_dtype": "fp32", "exp_avg_dtype": "bf16",
                                      "exp_avg_sq_dtype": "bf16", "precision_aware": True},
                        "offload": {"optimizer": True, "optimizer_fraction": 0.5}},
    "dist-opt-instances": {"optimizer_sharding": "dist_opt", "optimizer": {"instances": 2}},
    "microbatch-group": {"pipeline": {"microbatch_group": 4}},
    "distributed-checkpoints": {"recompute": "full", "sequence_parallel": False, "distribute_saved_activations": True},
    "recompute-modules": {"recompute": "selective", "recompute_modules": ["core_attn", "layernorm", "moe_act", "shared_experts"]},
    "uniform": {"recompute": "full", "recompute_method": "uniform", "recompute_layers": 2},
    "offload-modules": {"offload": {"modules": ["qkv_linear", "core_attn", "attn_proj", "expert_fc1", "moe_act"],
                                    "modules_fraction": 0.5}},
    "graphs-te": {"cuda_graphs": {"impl": "transformer_engine", "modules": ["attn", "moe_router", "moe_preprocess"]}},
    "graphs-full": {"cuda_graphs": {"impl": "full_iteration"}, "moe": {"capacity_factor": 1.0, "pad_to_capacity": True}},
    "dispatchers": {"moe": {"dispatcher": "hybridep", "routing": "aux_loss", "routing_imbalance": 1.3, "router_dtype": "fp64",
                            "permute_fusion": False, "a2a_overlap": True}},
    "hybridep-stash": {"cuda_graphs": {"impl": "full_iteration"},
                       "moe": {"dispatcher": "hybridep", "rank_capacity_factor": 1.5, "paged_stash": True}},
    "comm": {"comm": {"overlap_grad_reduce": False, "overlap_param_gather": True, "tp_overlap": True, "cp": "a2a"}},
    "fp8": {"precision": "fp8", "fp8": {"recipe": "blockwise", "param_gather": True, "attention": True}},
    "bumblebee": {"implementation": "bumblebee", "moe": {"ep_chunks": 2}},
    "bad-module": {"recompute": "selective", "recompute_modules": ["attention"]},
}
for name, settings in run_settings.items():
    put("run_settings", name, settings)

# Sequence-length files (--seq-lengths): lines with comments, JSON lists, histograms, and bad ones.
for i, s in enumerate(["4096\n65536\n4096\n", "# rollouts\n 8192 \n\n16384\n", "[4096, 8192, 131072]",
                       "[[4096, 70], [65536, 30]]", "[[1, 1], [4294967296, 1]]", "", "0\n", "-1\n", "1.5\n", "4k\n",
                       "[]", "[[4096]]", "[[4096, -1]]", "[4096", "{\"lengths\": [1]}", "1\n2\n3\n5\n8\n13\n21\n",
                       "[[100, 0.5], [200, 1e300]]", "99999999999999\n", "\u00b9\u00b2\n", "[[100, 0.5], [200, 1e308]]"]):
    put("seq_lengths", "%02d" % i, s)
