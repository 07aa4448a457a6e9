#include "search/megatron_args.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <set>
#include <sstream>

#include "common/user_error.h"
#include "parallel/pipeline_split.h"
#include "search/shell_words.h"

namespace lcplan {

namespace {

// Sources for every rule below: Megatron-LM megatron/training/arguments.py (flags, defaults, validate_args) and
// megatron/core/transformer/transformer_config.py (__post_init__ checks), https://github.com/NVIDIA/Megatron-LM.

enum class Arity { Switch, One, List };

// Flags lcplan reads, by arity. A flag missing here and from kNoEffect is listed as ignored.
const std::map<std::string, Arity>& read_flags() {
  static const std::map<std::string, Arity> f = {
      // parallel sizes and batch
      {"--tensor-model-parallel-size", Arity::One}, {"--pipeline-model-parallel-size", Arity::One},
      {"--num-layers-per-virtual-pipeline-stage", Arity::One}, {"--num-virtual-stages-per-pipeline-rank", Arity::One},
      {"--virtual-pipeline-model-parallel-size", Arity::One}, {"--context-parallel-size", Arity::One},
      {"--cp-comm-type", Arity::List}, {"--expert-model-parallel-size", Arity::One},
      {"--expert-tensor-parallel-size", Arity::One}, {"--sequence-parallel", Arity::Switch},
      {"--micro-batch-size", Arity::One}, {"--global-batch-size", Arity::One}, {"--seq-length", Arity::One},
      {"--encoder-seq-length", Arity::One},
      // uneven pipelines
      {"--decoder-first-pipeline-num-layers", Arity::One}, {"--decoder-last-pipeline-num-layers", Arity::One},
      {"--account-for-embedding-in-pipeline-split", Arity::Switch}, {"--account-for-loss-in-pipeline-split", Arity::Switch},
      {"--pipeline-model-parallel-layout", Arity::One},
      // optimizer, sharding, offload
      {"--use-distributed-optimizer", Arity::Switch}, {"--overlap-grad-reduce", Arity::Switch},
      {"--overlap-param-gather", Arity::Switch}, {"--use-torch-fsdp2", Arity::Switch}, {"--use-megatron-fsdp", Arity::Switch},
      {"--data-parallel-sharding-strategy", Arity::One}, {"--optimizer-cpu-offload", Arity::Switch},
      {"--optimizer-offload-fraction", Arity::One}, {"--main-grads-dtype", Arity::One}, {"--main-params-dtype", Arity::One},
      {"--exp-avg-dtype", Arity::One}, {"--exp-avg-sq-dtype", Arity::One}, {"--optimizer", Arity::One},
      // recompute, activation offload
      {"--recompute-granularity", Arity::One}, {"--recompute-method", Arity::One}, {"--recompute-num-layers", Arity::One},
      {"--recompute-modules", Arity::List}, {"--recompute-activations", Arity::Switch}, {"--cpu-offloading", Arity::Switch},
      {"--cpu-offloading-num-layers", Arity::One},
      // MoE
      {"--num-experts", Arity::One}, {"--moe-router-topk", Arity::One}, {"--moe-ffn-hidden-size", Arity::One},
      {"--moe-shared-expert-intermediate-size", Arity::One}, {"--moe-shared-expert-gate", Arity::Switch},
      {"--moe-token-dispatcher-type", Arity::One}, {"--moe-flex-dispatcher-backend", Arity::One},
      {"--moe-expert-capacity-factor", Arity::One}, {"--moe-pad-expert-input-to-capacity", Arity::Switch},
      {"--moe-router-force-load-balancing", Arity::Switch}, {"--overlap-moe-expert-parallel-comm", Arity::Switch},
      {"--delay-wgrad-compute", Arity::Switch}, {"--moe-layer-freq", Arity::One},
      {"--moe-router-score-function", Arity::One}, {"--moe-router-num-groups", Arity::One},
      {"--moe-router-group-topk", Arity::One},
      // loss, precision
      {"--cross-entropy-loss-fusion", Arity::Switch}, {"--cross-entropy-fusion-impl", Arity::One},
      {"--bf16", Arity::Switch}, {"--fp16", Arity::Switch}, {"--fp8-format", Arity::One}, {"--fp8-recipe", Arity::One},
      {"--fp4-format", Arity::One}, {"--fp4-recipe", Arity::One},
      // model shape
      {"--num-layers", Arity::One}, {"--hidden-size", Arity::One}, {"--ffn-hidden-size", Arity::One},
      {"--num-attention-heads", Arity::One}, {"--group-query-attention", Arity::Switch}, {"--num-query-groups", Arity::One},
      {"--kv-channels", Arity::One}, {"--vocab-size", Arity::One}, {"--padded-vocab-size", Arity::One},
      {"--make-vocab-size-divisible-by", Arity::One}, {"--untie-embeddings-and-output-weights", Arity::Switch},
      {"--swiglu", Arity::Switch}, {"--normalization", Arity::One}, {"--multi-latent-attention", Arity::Switch},
      {"--q-lora-rank", Arity::One}, {"--kv-lora-rank", Arity::One}, {"--qk-head-dim", Arity::One},
      {"--qk-pos-emb-head-dim", Arity::One}, {"--v-head-dim", Arity::One}, {"--mtp-num-layers", Arity::One},
      {"--position-embedding-type", Arity::One}, {"--max-position-embeddings", Arity::One},
      {"--rotary-percent", Arity::One}, {"--qk-layernorm", Arity::Switch}, {"--add-qkv-bias", Arity::Switch},
      {"--disable-bias-linear", Arity::Switch},
      // the launcher's (torchrun), when they appear among the flags
      {"--nnodes", Arity::One}, {"--nproc-per-node", Arity::One}, {"--nproc_per_node", Arity::One},
  };
  return f;
}

// Megatron flags that change nothing lcplan models: schedule, data, logging, checkpoints, fused kernels the
// calibration profile stands for. Accepted silently.
const std::set<std::string>& no_effect_flags() {
  static const std::set<std::string> f = {
      "--train-iters", "--train-samples", "--lr", "--min-lr", "--lr-decay-style", "--lr-decay-iters", "--lr-decay-samples",
      "--lr-warmup-iters", "--lr-warmup-samples", "--lr-warmup-fraction", "--lr-warmup-init", "--weight-decay",
      "--clip-grad", "--adam-beta1", "--adam-beta2", "--adam-eps", "--init-method-std", "--seed", "--data-path",
      "--train-data-path", "--valid-data-path", "--test-data-path", "--split", "--data-cache-path", "--mock-data",
      "--tokenizer-type", "--tokenizer-model", "--vocab-file", "--merge-file", "--save", "--load", "--save-interval",
      "--eval-interval", "--eval-iters", "--log-interval", "--log-throughput", "--tensorboard-dir",
      "--tensorboard-log-interval", "--wandb-project", "--wandb-exp-name", "--wandb-save-dir", "--log-timers-to-tensorboard",
      "--log-memory-to-tensorboard", "--log-validation-ppl-to-tensorboard", "--log-params-norm", "--log-num-zeros-in-grad",
      "--timing-log-level", "--distributed-backend", "--distributed-timeout-minutes", "--ckpt-format", "--use-dist-ckpt",
      "--no-load-optim", "--no-load-rng", "--no-save-optim", "--no-save-rng", "--finetune", "--exit-interval",
      "--exit-duration-in-mins", "--use-mcore-models", "--transformer-impl", "--attention-dropout", "--hidden-dropout",
      "--attention-softmax-in-fp32", "--use-flash-attn", "--attention-backend", "--no-masked-softmax-fusion",
      "--no-bias-gelu-fusion", "--no-bias-swiglu-fusion", "--no-bias-dropout-fusion", "--no-rope-fusion",
      "--no-gradient-accumulation-fusion", "--moe-grouped-gemm", "--moe-permute-fusion", "--moe-router-fusion",
      "--moe-router-load-balancing-type", "--moe-aux-loss-coeff", "--moe-z-loss-coeff", "--moe-router-dtype",
      "--moe-router-pre-softmax", "--moe-token-drop-policy", "--moe-router-bias-update-rate",
      "--moe-router-topk-scaling-factor", "--moe-router-enable-expert-bias", "--moe-shared-expert-overlap",
      "--moe-enable-deepep", "--moe-use-legacy-grouped-gemm", "--moe-per-layer-logging", "--moe-layer-recompute",
      "--tp-comm-overlap", "--manual-gc", "--manual-gc-interval", "--rotary-base", "--rotary-scaling-factor",
      "--use-rotary-position-embeddings", "--rotary-interleaved", "--calculate-per-token-loss",
      "--ckpt-fully-parallel-save", "--ckpt-fully-parallel-load", "--async-save", "--no-create-attention-mask-in-dataloader",
      "--num-workers", "--dataloader-type", "--eod-mask-loss", "--reset-position-ids", "--reset-attention-mask",
      "--norm-epsilon", "--apply-layernorm-1p", "--accumulate-allreduce-grads-in-fp32", "--fp8-amax-history-len",
      "--fp8-amax-compute-algo", "--fp8-margin", "--fp8-param-gather", "--rerun-mode", "--check-for-nan-in-loss-and-grad",
      "--no-check-for-nan-in-loss-and-grad", "--profile", "--profile-step-start", "--profile-step-end",
      "--profile-ranks", "--use-pytorch-profiler", "--nccl-communicator-config-path", "--tp-comm-bootstrap-backend",
      "--enable-experimental", "--defer-embedding-wgrad-compute", "--wgrad-deferral-limit", "--align-grad-reduce",
      "--align-param-gather", "--ddp-bucket-size", "--ddp-average-in-collective", "--mtp-loss-scaling-factor",
      "--mscale", "--mscale-all-dim", "--beta-fast", "--beta-slow", "--original-max-position-embeddings",
      "--use-precision-aware-optimizer", "--sgd-momentum", "--num-dataset-builder-threads", "--no-mmap-bin-files",
      "--overlap-p2p-communication", "--no-overlap-p2p-communication", "--use-cpu-initialization",
      "--empty-unused-memory-level", "--cross-entropy-loss-fusion-impl", "--log-straggler", "--no-persist-layer-norm",
      "--hybrid-override-pattern", "--cpu-offloading-activations", "--cpu-offloading-weights",
      "--first-last-layers-bf16", "--num-layers-at-start-in-bf16", "--num-layers-at-end-in-bf16",
      "--moe-router-padding-for-fp8", "--moe-router-padding-for-quantization", "--gradient-accumulation-fusion",
      "--no-async-tensor-model-parallel-allreduce", "--use-legacy-models", "--spec",
  };
  return f;
}

// Megatron-Bridge config fields whose name differs from the Megatron-LM flag they mirror
// (megatron/core/transformer/transformer_config.py and model_parallel_config.py field names).
const std::map<std::string, std::string>& bridge_aliases() {
  static const std::map<std::string, std::string> a = {
      {"num_moe_experts", "--num-experts"},
      {"num_layers_in_first_pipeline_stage", "--decoder-first-pipeline-num-layers"},
      {"num_layers_in_last_pipeline_stage", "--decoder-last-pipeline-num-layers"},
      {"virtual_pipeline_model_parallel_size", "--num-virtual-stages-per-pipeline-rank"},
      {"fp8", "--fp8-format"},
      {"fp4", "--fp4-format"},
      {"gated_linear_unit", "--swiglu"},
  };
  return a;
}

struct Given {
  std::vector<std::string> values;
  bool switch_off = false;  // a Bridge override set it to False
};

std::string join(const std::vector<std::string>& v, const std::string& sep = " ") {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : sep) + x;
  return s;
}

bool unresolved_text(const std::string& v) { return v.find('$') != std::string::npos || v.find('`') != std::string::npos; }

bool is_env_word(const std::string& w) {
  const size_t eq = w.find('=');
  if (eq == std::string::npos || eq == 0) return false;
  for (size_t i = 0; i < eq; ++i)
    if (!(std::isalnum(static_cast<unsigned char>(w[i])) || w[i] == '_') || (i == 0 && std::isdigit(static_cast<unsigned char>(w[0]))))
      return false;
  return true;
}

// The flags of a launch, with Megatron's argparse semantics: the last occurrence of a flag wins.
class FlagSet {
 public:
  FlagSet(std::vector<std::string>& notes) : notes_(notes) {}

  void set(const std::string& name, std::vector<std::string> values, bool switch_off = false) {
    auto it = map_.find(name);
    if (it != map_.end() && (it->second.values != values || it->second.switch_off != switch_off))
      notes_.push_back(name + " is given twice (\"" + join(it->second.values) + "\" and \"" + join(values) +
                       "\"); Megatron uses the last one");
    map_[name] = {std::move(values), switch_off};
  }
  // The single value as written, unchecked (nothing when absent, valueless or given several values).
  std::optional<std::string> raw(const std::string& name) const {
    auto it = map_.find(name);
    if (it == map_.end() || it->second.switch_off || it->second.values.size() != 1) return std::nullopt;
    return it->second.values[0];
  }
  bool has(const std::string& name) const {
    auto it = map_.find(name);
    return it != map_.end() && !it->second.switch_off;
  }
  bool on(const std::string& name) const {
    auto it = map_.find(name);
    if (it == map_.end() || it->second.switch_off) return false;
    if (!it->second.values.empty())
      throw UserError(name + " is a switch and takes no value, got \"" + join(it->second.values) + "\" (give " + name + " alone)");
    return true;
  }
  std::optional<std::string> text(const std::string& name) const {
    auto it = map_.find(name);
    if (it == map_.end() || it->second.switch_off) return std::nullopt;
    const auto& v = it->second.values;
    if (v.empty()) throw UserError(name + " needs a value (e.g. " + example(name) + ")");
    if (v.size() > 1)
      throw UserError(name + " is given " + std::to_string(v.size()) + " values (\"" + join(v) + "\"); it takes one");
    if (unresolved_text(v[0])) throw unresolved(name, v[0]);
    return v[0];
  }
  std::optional<std::vector<std::string>> list(const std::string& name) const {
    auto it = map_.find(name);
    if (it == map_.end() || it->second.switch_off) return std::nullopt;
    if (it->second.values.empty()) throw UserError(name + " needs at least one value (e.g. " + example(name) + ")");
    for (const auto& v : it->second.values)
      if (unresolved_text(v)) throw unresolved(name, v);
    return it->second.values;
  }
  std::optional<int> integer(const std::string& name, int lo) const {
    auto t = text(name);
    if (!t) return std::nullopt;
    const std::string valid = " (valid: a whole number, " + std::to_string(lo) + " or more)";
    size_t b = (*t)[0] == '-' ? 1 : 0;
    if (t->size() == b || t->size() - b > 9 ||
        !std::all_of(t->begin() + b, t->end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }))
      throw UserError(name + " \"" + *t + "\" is not a whole number" + valid);
    const long v = std::stol(*t);
    if (v < lo) throw UserError(name + " \"" + *t + "\" is out of range" + valid);
    return int(v);
  }
  std::optional<double> number(const std::string& name, double lo, double hi, const std::string& valid) const {
    auto t = text(name);
    if (!t) return std::nullopt;
    size_t used = 0;
    double v = 0;
    try {
      v = std::stod(*t, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != t->size() || !std::isfinite(v))
      throw UserError(name + " \"" + *t + "\" is not a number (valid: " + valid + ")");
    if (v < lo || v > hi) throw UserError(name + " \"" + *t + "\" is out of range (valid: " + valid + ")");
    return v;
  }
  std::optional<std::string> choice(const std::string& name, const std::vector<std::string>& valid) const {
    auto t = text(name);
    if (t && std::find(valid.begin(), valid.end(), *t) == valid.end())
      throw UserError(name + " \"" + *t + "\" is not valid (valid: " + join(valid, ", ") + ")");
    return t;
  }

 private:
  static std::string example(const std::string& name) {
    return name + (name.find("size") != std::string::npos || name.find("layers") != std::string::npos ? " 2" : " VALUE");
  }
  static UserError unresolved(const std::string& name, const std::string& v) {
    return UserError(name + " \"" + v + "\" depends on a shell variable or command the text does not set (set it in the "
                                        "script, or give the value itself)");
  }
  std::map<std::string, Given> map_;
  std::vector<std::string>& notes_;
};

// A word-level pass: launcher words, environment assignments, Megatron flags and Megatron-Bridge overrides.
struct Words {
  std::vector<std::pair<std::string, std::vector<std::string>>> flags;  // in order
  std::map<std::string, std::string> env;
  std::vector<std::string> launcher;  // torchrun's own words (before the script)
};

// Megatron-Bridge's `section.field=value` (or `mixed_precision=recipe`) as the Megatron flag it sets; false when the
// word is not such an override.
bool bridge_override(const std::string& w, Words& out) {
  const size_t eq = w.find('=');
  if (eq == std::string::npos || eq == 0 || w[0] == '-') return false;
  std::string key = w.substr(0, eq);
  const std::string value = w.substr(eq + 1);
  while (!key.empty() && (key[0] == '+' || key[0] == '~')) key.erase(0, 1);  // Hydra's add / delete prefixes
  const size_t dot = key.rfind('.');
  if (dot == std::string::npos && key != "mixed_precision") return false;
  const std::string field = dot == std::string::npos ? key : key.substr(dot + 1);
  if (field.empty()) return false;
  if (field == "mixed_precision" || key.rfind("mixed_precision", 0) == 0) {
    // Megatron-Bridge recipe names (src/megatron/bridge/training/mixed_precision.py).
    if (value.find("nvfp4") != std::string::npos) out.flags.push_back({"--fp4-format", {"e2m1"}}), out.flags.push_back({"--fp4-recipe", {"nvfp4"}});
    else if (value.find("mxfp8") != std::string::npos) out.flags.push_back({"--fp8-format", {"e4m3"}}), out.flags.push_back({"--fp8-recipe", {"mxfp8"}});
    else if (value.find("fp8_current") != std::string::npos) out.flags.push_back({"--fp8-format", {"hybrid"}}), out.flags.push_back({"--fp8-recipe", {"tensorwise"}});
    else if (value.find("fp8_subchannel") != std::string::npos || value.find("fp8_blockwise") != std::string::npos) out.flags.push_back({"--fp8-format", {"e4m3"}}), out.flags.push_back({"--fp8-recipe", {"blockwise"}});
    else if (value.find("fp8") != std::string::npos) out.flags.push_back({"--fp8-format", {"hybrid"}}), out.flags.push_back({"--fp8-recipe", {"delayed"}});
    if (value.find("fp16") != std::string::npos) out.flags.push_back({"--fp16", {}});
    else out.flags.push_back({"--bf16", {}});
    return true;
  }
  std::string flag;
  if (auto it = bridge_aliases().find(field); it != bridge_aliases().end()) flag = it->second;
  else {
    flag = "--" + field;
    std::replace(flag.begin(), flag.end(), '_', '-');
  }
  std::string lower = value;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  if (field == "share_embeddings_and_output_weights") {
    if (lower == "false") out.flags.push_back({"--untie-embeddings-and-output-weights", {}});
    return true;
  }
  auto it = read_flags().find(flag);
  const bool is_switch = it != read_flags().end() && it->second == Arity::Switch;
  if (lower == "none" || lower == "null") return true;  // Bridge's way of leaving a field at its default
  if (is_switch || lower == "true" || lower == "false") {
    if (lower == "true" || lower == "1") out.flags.push_back({flag, {}});
    else if (lower != "false" && lower != "0") out.flags.push_back({flag, {value}});
    return true;
  }
  std::vector<std::string> values;
  if (it != read_flags().end() && it->second == Arity::List && value.size() >= 2 && value.front() == '[' && value.back() == ']') {
    std::string inner = value.substr(1, value.size() - 2);
    std::replace(inner.begin(), inner.end(), ',', ' ');
    std::istringstream in(inner);
    for (std::string x; in >> x;) values.push_back(x);
  } else {
    values.push_back(value);
  }
  out.flags.push_back({flag, values});
  return true;
}

Words split_words(const std::vector<std::string>& words) {
  Words out;
  // The Megatron flags follow the training script (pretrain_gpt.py, or the module after `-m`); the launcher's come
  // before it. Without a script every word is a Megatron flag.
  size_t start = 0;
  for (size_t i = 0; i < words.size(); ++i) {
    const std::string& w = words[i];
    const bool py = w.size() > 3 && w.compare(w.size() - 3, 3, ".py") == 0 && w.rfind("--", 0) != 0;
    const bool module = w == "-m" && i + 1 < words.size();
    if (py || module) {
      start = py ? i + 1 : i + 2;
      out.launcher.assign(words.begin(), words.begin() + i);
      if (module && words[i + 1].find("torch.distributed") != std::string::npos) {
        // python -m torch.distributed.run ... pretrain_gpt.py: keep looking for the script.
        continue;
      }
      break;
    }
  }
  if (start > 0) {
    // Launcher words: environment assignments in front, torchrun's --nnodes / --nproc-per-node.
    for (size_t i = 0; i < out.launcher.size(); ++i) {
      const std::string& w = out.launcher[i];
      if (is_env_word(w)) {
        out.env[w.substr(0, w.find('='))] = w.substr(w.find('=') + 1);
        continue;
      }
      std::string name = w.substr(0, w.find('='));
      std::replace(name.begin(), name.end(), '_', '-');
      if (name == "--nnodes" || name == "--nproc-per-node") {
        std::string value = w.find('=') != std::string::npos ? w.substr(w.find('=') + 1)
                                                              : (i + 1 < out.launcher.size() ? out.launcher[++i] : "");
        out.flags.push_back({name, {value}});
      }
    }
  }
  bool seen_flag = false;
  for (size_t i = start; i < words.size(); ++i) {
    const std::string& w = words[i];
    if (w.rfind("--", 0) == 0 && w.size() > 2) {
      seen_flag = true;
      const size_t eq = w.find('=');
      std::vector<std::string> values;
      if (eq != std::string::npos) values.push_back(w.substr(eq + 1));
      while (i + 1 < words.size() && !(words[i + 1].rfind("--", 0) == 0 && words[i + 1].size() > 2) &&
             !(words[i + 1].size() > 1 && words[i + 1][0] == '-' && std::isalpha(static_cast<unsigned char>(words[i + 1][1])))) {
        // A Bridge override after a switch is its own word, not the switch's value.
        const std::string& n = words[i + 1];
        if (n.find('=') != std::string::npos && n.find('.') < n.find('=') && !std::isdigit(static_cast<unsigned char>(n[0]))) break;
        values.push_back(words[++i]);
      }
      out.flags.push_back({w.substr(0, eq), values});
    } else if (w.size() > 1 && w[0] == '-' && std::isalpha(static_cast<unsigned char>(w[1]))) {
      // A one-dash flag (a Megatron-Bridge performance script's -tp 2): not Megatron's, listed as ignored.
      seen_flag = true;
      out.flags.push_back({w, {}});
      while (i + 1 < words.size() && words[i + 1][0] != '-') ++i;
    } else if (!seen_flag && is_env_word(w) && w.find('.') > w.find('=') && w.rfind("mixed_precision=", 0) != 0) {
      out.env[w.substr(0, w.find('='))] = w.substr(w.find('=') + 1);
    } else {
      bridge_override(w, out);  // anything else (a stray word before the flags) is the launcher's
    }
  }
  return out;
}

int count_positive(const std::string& text, const std::string& what) {
  if (text.empty() || text.size() > 9 || !std::all_of(text.begin(), text.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }) ||
      std::stol(text) < 1)
    throw UserError(what + " \"" + text + "\" is not a whole number of 1 or more (give the GPU count with --gpus)");
  return int(std::stol(text));
}

// --moe-layer-freq: an int k (every k-th layer, counting from 0, is MoE) or a Python list expression such as
// ([0]*3+[1]*58) or [1,0,1,...] (arguments.py moe_freq_type).
std::vector<bool> moe_layer_pattern(const std::string& text, int layers) {
  const std::string bad = "--moe-layer-freq \"" + text + "\" is not valid (valid: a whole number k for every k-th layer, "
                          "or a list of 0/1 per layer such as ([0]*3+[1]*58))";
  if (!text.empty() && std::all_of(text.begin(), text.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); })) {
    if (text.size() > 6 || std::stoi(text) < 1) throw UserError(bad);
    const int k = std::stoi(text);
    std::vector<bool> out(static_cast<size_t>(layers));
    for (int i = 0; i < layers; ++i) out[size_t(i)] = i % k == 0;
    return out;
  }
  // expr := term ('+' term)*; term := atom ('*' n)?; atom := '[' n (',' n)* ']' | '(' expr ')'
  size_t i = 0;
  std::function<std::vector<int>()> expr;
  auto ws = [&] {
    while (i < text.size() && (text[i] == ' ' || text[i] == '\t')) ++i;
  };
  auto num = [&]() -> long {
    ws();
    size_t b = i;
    while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) ++i;
    if (b == i || i - b > 6) throw UserError(bad);
    return std::stol(text.substr(b, i - b));
  };
  auto atom = [&]() -> std::vector<int> {
    ws();
    if (i >= text.size()) throw UserError(bad);
    std::vector<int> v;
    if (text[i] == '(') {
      ++i;
      v = expr();
      ws();
      if (i >= text.size() || text[i] != ')') throw UserError(bad);
      ++i;
    } else if (text[i] == '[') {
      ++i;
      ws();
      if (i < text.size() && text[i] == ']') {
        ++i;
        return v;
      }
      while (true) {
        v.push_back(int(num()));
        ws();
        if (i < text.size() && text[i] == ',') {
          ++i;
          continue;
        }
        if (i < text.size() && text[i] == ']') {
          ++i;
          break;
        }
        throw UserError(bad);
      }
    } else {
      throw UserError(bad);
    }
    return v;
  };
  expr = [&]() -> std::vector<int> {
    std::vector<int> out;
    while (true) {
      std::vector<int> t = atom();
      ws();
      if (i < text.size() && text[i] == '*') {
        ++i;
        const long n = num();
        if (t.size() * size_t(n) > 100000) throw UserError(bad);
        std::vector<int> r;
        for (long k = 0; k < n; ++k) r.insert(r.end(), t.begin(), t.end());
        t = r;
      }
      out.insert(out.end(), t.begin(), t.end());
      if (out.size() > 100000) throw UserError(bad);
      ws();
      if (i < text.size() && text[i] == '+') {
        ++i;
        continue;
      }
      return out;
    }
  };
  const std::vector<int> v = expr();
  ws();
  if (i != text.size()) throw UserError(bad);
  if (long(v.size()) != layers)
    throw UserError("--moe-layer-freq \"" + text + "\" lists " + std::to_string(v.size()) + " layers but --num-layers is " +
                    std::to_string(layers) + " (give one 0/1 per layer)");
  std::vector<bool> out;
  for (int x : v) {
    if (x != 0 && x != 1) throw UserError(bad);
    out.push_back(x == 1);
  }
  return out;
}

bool has_moe(const ModelSpec& m) {
  return std::any_of(m.layers.begin(), m.layers.end(), [](const LayerSpec& l) { return l.ffn == FfnKind::MoE; });
}

// A ModelSpec from the shape flags (dense GQA / MLA decoders, MoE per --moe-layer-freq), with Megatron's defaults
// (arguments.py): ffn 4h (SwiGLU: 4h*2/3 rounded down to 64), GQA only with --group-query-attention, tied
// embeddings, bias in linear layers unless --disable-bias-linear, kv_channels = hidden / heads.
void build_model(const FlagSet& f, MegatronLaunch& l, int tp) {
  const auto layers = f.integer("--num-layers", 1);
  const auto hidden = f.integer("--hidden-size", 1);
  const auto heads = f.integer("--num-attention-heads", 1);
  const auto padded = f.integer("--padded-vocab-size", 1);
  const auto vocab = f.integer("--vocab-size", 1);
  l.num_layers = layers.value_or(0);
  l.hidden = hidden.value_or(0);
  l.num_experts = f.integer("--num-experts", 1).value_or(0);
  l.top_k = f.integer("--moe-router-topk", 1).value_or(0);
  l.mtp_layers = f.integer("--mtp-num-layers", 0).value_or(-1);
  if (!layers) l.missing_shape.push_back("--num-layers");
  if (!hidden) l.missing_shape.push_back("--hidden-size");
  if (!heads) l.missing_shape.push_back("--num-attention-heads");
  if (!padded && !vocab) l.missing_shape.push_back("--vocab-size");
  if (!l.missing_shape.empty()) return;

  ModelSpec m;
  m.name = "megatron-flags";
  m.hidden = *hidden;
  // Megatron pads the vocabulary to a multiple of --make-vocab-size-divisible-by x TP
  // (megatron/training/tokenizer/tokenizer.py _vocab_size_with_padding).
  if (padded) {
    m.vocab = *padded;
  } else {
    const long multiple = long(f.integer("--make-vocab-size-divisible-by", 1).value_or(128)) * tp;
    m.vocab = int((long(*vocab) + multiple - 1) / multiple * multiple);
  }
  m.tied_embeddings = !f.on("--untie-embeddings-and-output-weights");
  m.gated_mlp = f.on("--swiglu");
  m.dense_ffn = f.integer("--ffn-hidden-size", 1).value_or(m.gated_mlp ? int(4.0 * *hidden * 2 / 3 / 64) * 64 : 4 * *hidden);
  m.mtp_layers = std::max(0, l.mtp_layers);
  m.max_position = f.integer("--max-position-embeddings", 1).value_or(0);
  const bool bias = !f.on("--disable-bias-linear");
  const bool mla = f.on("--multi-latent-attention");
  if (mla) {
    m.mla.heads = *heads;
    m.mla.q_lora_rank = f.integer("--q-lora-rank", 0).value_or(0);
    m.mla.kv_lora_rank = f.integer("--kv-lora-rank", 1).value_or(32);
    m.mla.qk_nope_head_dim = f.integer("--qk-head-dim", 1).value_or(128);
    m.mla.qk_rope_head_dim = f.integer("--qk-pos-emb-head-dim", 0).value_or(64);
    m.mla.v_head_dim = f.integer("--v-head-dim", 1).value_or(128);
  } else {
    m.attn.heads = *heads;
    const auto groups = f.integer("--num-query-groups", 1);
    const bool gqa = f.on("--group-query-attention");
    if (groups && !gqa) l.notes.push_back("--num-query-groups has no effect without --group-query-attention (Megatron uses one KV head per attention head)");
    m.attn.kv_heads = gqa ? groups.value_or(1) : *heads;
    if (*heads % m.attn.kv_heads != 0)
      throw UserError("--num-query-groups " + std::to_string(m.attn.kv_heads) + " does not divide --num-attention-heads " +
                      std::to_string(*heads) + " (give a divisor)");
    if (const auto kv = f.integer("--kv-channels", 1)) m.attn.head_dim = *kv;
    else if (*hidden % *heads != 0)
      throw UserError("--hidden-size " + std::to_string(*hidden) + " is not divisible by --num-attention-heads " +
                      std::to_string(*heads) + " (give --kv-channels)");
    else m.attn.head_dim = *hidden / *heads;
    m.attn.qkv_bias = bias || f.on("--add-qkv-bias");
    m.attn.o_bias = bias;
    m.attn.qk_norm = f.on("--qk-layernorm");
    m.attn.partial_rotary = f.number("--rotary-percent", 1e-6, 1, "a fraction in (0, 1]").value_or(1.0);
  }
  std::vector<bool> moe(size_t(*layers), false);
  if (l.num_experts > 0) {
    moe = f.has("--moe-layer-freq") ? moe_layer_pattern(*f.text("--moe-layer-freq"), *layers) : std::vector<bool>(size_t(*layers), true);
    MoeSpec& e = m.moe;
    e.num_experts = l.num_experts;
    e.top_k = l.top_k > 0 ? l.top_k : 2;  // --moe-router-topk default
    if (e.top_k > e.num_experts)
      throw UserError("--moe-router-topk " + std::to_string(e.top_k) + " exceeds --num-experts " + std::to_string(e.num_experts) +
                      " (valid: at most the number of experts)");
    e.expert_ffn = f.integer("--moe-ffn-hidden-size", 1).value_or(m.dense_ffn);
    if (const auto shared = f.integer("--moe-shared-expert-intermediate-size", 1)) {
      e.shared_experts = 1;  // Megatron builds the shared experts as one MLP of this size
      e.shared_ffn = *shared;
    }
    e.shared_expert_gate = f.on("--moe-shared-expert-gate");
    e.expert_bias = bias;
    const auto score = f.choice("--moe-router-score-function", {"softmax", "sigmoid"});
    e.router = score && *score == "sigmoid" ? RouterKind::SigmoidGroupLimited : RouterKind::SoftmaxTopK;
    e.n_group = f.integer("--moe-router-num-groups", 1).value_or(1);
    e.topk_group = f.integer("--moe-router-group-topk", 1).value_or(1);
  } else if (f.has("--moe-layer-freq")) {
    l.notes.push_back("--moe-layer-freq has no effect without --num-experts");
  }
  m.layers.resize(size_t(*layers));
  for (size_t i = 0; i < m.layers.size(); ++i) {
    m.layers[i].mixer = mla ? MixerKind::MLA : MixerKind::FullAttention;
    m.layers[i].ffn = moe[i] ? FfnKind::MoE : FfnKind::Dense;
  }
  if (const auto pos = f.choice("--position-embedding-type", {"learned_absolute", "rope", "mrope", "yarn", "relative", "none"});
      pos && *pos == "learned_absolute")
    l.notes.push_back("--position-embedding-type learned_absolute adds a position table lcplan does not count "
                      "(max positions x hidden parameters)");
  l.model = std::move(m);
}

// --pipeline-model-parallel-layout grammar (megatron/core/transformer/pipeline_parallel_layer_layout.py):
// symbols E t m L, '|' between virtual stages, X*n repeats a symbol or a parenthesized group.
std::string expand_layout(const std::string& s, size_t& i, int depth, const std::string& whole) {
  const std::string bad = "--pipeline-model-parallel-layout \"" + whole + "\"";
  if (depth > 32) throw UserError(bad + " nests parentheses too deeply (valid: at most 32 levels)");
  std::string out;
  while (i < s.size() && s[i] != ')') {
    std::string item;
    const char c = s[i];
    if (c == '(') {
      ++i;
      item = expand_layout(s, i, depth + 1, whole);
      if (i >= s.size() || s[i] != ')') throw UserError(bad + " opens a parenthesis it never closes");
      ++i;
    } else if (c == 'E' || c == 't' || c == 'm' || c == 'L' || c == '|') {
      item = std::string(1, c);
      ++i;
    } else if (c == ' ' || c == ',' || c == '"' || c == '\'') {
      ++i;
      continue;
    } else {
      throw UserError(bad + " has \"" + std::string(1, c) + "\" (valid: E, t, m, L, |, parentheses and *n repeats)");
    }
    if (i < s.size() && s[i] == '*') {
      ++i;
      size_t b = i;
      while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
      if (b == i || i - b > 5) throw UserError(bad + " has a * without a repeat count (valid: X*n, e.g. (tt|)*30)");
      const long n = std::stol(s.substr(b, i - b));
      if (item.size() * size_t(n) + out.size() > 200000) throw UserError(bad + " expands to too many stages");
      std::string rep;
      for (long k = 0; k < n; ++k) rep += item;
      item = rep;
    }
    out += item;
    if (out.size() > 200000) throw UserError(bad + " expands to too many stages");
  }
  return out;
}

}  // namespace

ParsedLayout parse_pipeline_layout(const std::string& layout) {
  size_t i = 0;
  const std::string flat = expand_layout(layout, i, 0, layout);
  const std::string bad = "--pipeline-model-parallel-layout \"" + layout + "\"";
  if (i != layout.size()) throw UserError(bad + " closes a parenthesis it never opened");
  std::vector<std::string> stages(1);
  for (char c : flat) {
    if (c == '|') stages.emplace_back();
    else stages.back() += c;
  }
  ParsedLayout r;
  for (size_t s = 0; s < stages.size(); ++s) {
    const std::string& st = stages[s];
    const bool first = s == 0, last = s + 1 == stages.size();
    for (size_t k = 0; k < st.size(); ++k) {
      if (st[k] == 'E' && !(first && k == 0))
        throw UserError(bad + " puts the embedding E elsewhere than at the start of the first stage (valid: E first)");
      if (st[k] == 'L' && !(last && k + 1 == st.size()))
        throw UserError(bad + " puts the loss L elsewhere than at the end of the last stage (valid: L last)");
      if (st[k] == 'm' && !last)
        throw UserError(bad + " puts MTP layers (m) before the last stage (lcplan places them on the last stage)");
    }
    r.layers.push_back(int(std::count(st.begin(), st.end(), 't')));
    r.mtp += int(std::count(st.begin(), st.end(), 'm'));
  }
  if (stages.front().find('E') == std::string::npos || stages.back().find('L') == std::string::npos)
    throw UserError(bad + " lacks the embedding E in its first stage or the loss L in its last (valid: E...|...L)");
  return r;
}

MegatronLaunch parse_megatron_words(const std::vector<std::string>& words, int script_world_size) {
  MegatronLaunch l;
  const Words w = split_words(words);
  FlagSet f(l.notes);
  std::set<std::string> ignored;
  for (const auto& [name, values] : w.flags) {
    if (read_flags().count(name)) {
      f.set(name == "--nproc_per_node" ? "--nproc-per-node" : name, values);
    } else if (!no_effect_flags().count(name) && ignored.insert(name).second) {
      l.ignored.push_back(name);
    }
  }
  Plan& p = l.plan;
  Parallel& q = p.parallel;

  // World size: WORLD_SIZE in front of the command or set by the script, or torchrun's nodes x processes per node.
  // A size the text leaves to a shell variable is unknown here, not an error: --gpus gives it.
  int world = 0;
  if (auto it = w.env.find("WORLD_SIZE"); it != w.env.end() && !unresolved_text(it->second))
    world = count_positive(it->second, "WORLD_SIZE");
  else if (script_world_size > 0) world = script_world_size;
  const auto launcher_value = [&](const char* name) -> std::optional<std::string> {
    const auto v = f.raw(name);
    return v && !unresolved_text(*v) ? v : std::nullopt;
  };
  const auto nnodes = launcher_value("--nnodes");
  const auto nproc = launcher_value("--nproc-per-node");
  if ((nnodes || nproc) && !(f.raw("--nnodes") && f.raw("--nproc-per-node") && (!nnodes || !nproc))) {
    if (!nnodes || !nproc)
      throw UserError(std::string(nnodes ? "--nnodes" : "--nproc-per-node") + " is given without " +
                      (nnodes ? "--nproc-per-node" : "--nnodes") + " (give both, or the GPU count with --gpus)");
    if (nnodes->find(':') != std::string::npos)
      throw UserError("--nnodes \"" + *nnodes + "\" is an elastic range (give the GPU count with --gpus)");
    const long g = long(count_positive(*nnodes, "--nnodes")) * count_positive(*nproc, "--nproc-per-node");
    if (g > INT_MAX) throw UserError("--nnodes x --nproc-per-node is too large (give the GPU count with --gpus)");
    if (world > 0 && world != g)
      throw UserError("WORLD_SIZE " + std::to_string(world) + " disagrees with --nnodes " + *nnodes + " x --nproc-per-node " +
                      *nproc + " = " + std::to_string(g) + " (give one, or the GPU count with --gpus)");
    world = int(g);
  }
  l.world_size = world;
  p.gpus = world;

  // Parallel sizes (arguments.py defaults: 1 each; expert TP defaults to TP, resolved with the model).
  q.tp = f.integer("--tensor-model-parallel-size", 1).value_or(1);
  q.pp = f.integer("--pipeline-model-parallel-size", 1).value_or(1);
  q.cp = f.integer("--context-parallel-size", 1).value_or(1);
  q.ep = f.integer("--expert-model-parallel-size", 1).value_or(1);
  if (const auto etp = f.integer("--expert-tensor-parallel-size", 1)) q.etp = *etp, l.etp_given = true;
  l.layers_per_virtual_stage = f.integer("--num-layers-per-virtual-pipeline-stage", 1).value_or(0);
  l.virtual_stages = f.integer("--num-virtual-stages-per-pipeline-rank", 1).value_or(0);
  if (const auto v = f.integer("--virtual-pipeline-model-parallel-size", 1)) {
    if (l.virtual_stages && l.virtual_stages != *v)
      throw UserError("--virtual-pipeline-model-parallel-size " + std::to_string(*v) + " contradicts --num-virtual-stages-per-pipeline-rank " +
                      std::to_string(l.virtual_stages) + " (give one)");
    l.virtual_stages = *v;
  }
  if (l.layers_per_virtual_stage && l.virtual_stages)
    throw UserError("--num-layers-per-virtual-pipeline-stage contradicts --num-virtual-stages-per-pipeline-rank "
                    "(Megatron takes one of them; give one)");
  if (const auto cp_comm = f.list("--cp-comm-type")) {
    for (const auto& t : *cp_comm) {
      if (t != "p2p" && t != "a2a" && t != "allgather" && t != "a2a+p2p")
        throw UserError("--cp-comm-type \"" + t + "\" is not valid (valid: p2p, a2a, allgather, a2a+p2p)");
      if (t != "p2p" && q.cp > 1) {
        l.notes.push_back("--cp-comm-type " + t + " is modelled as the p2p ring lcplan costs for context parallelism");
        break;
      }
    }
  }
  // Megatron turns sequence parallelism off at TP 1 (arguments.py); lcplan keeps its default there, where it means nothing.
  p.sequence_parallel = f.on("--sequence-parallel") || q.tp == 1;
  if (q.ep > 1 && q.tp > 1 && !p.sequence_parallel)
    throw UserError("--expert-model-parallel-size " + std::to_string(q.ep) + " with --tensor-model-parallel-size " +
                    std::to_string(q.tp) + " needs --sequence-parallel (Megatron requires it with expert and tensor "
                    "parallelism; add it)");
  p.micro_batch = f.integer("--micro-batch-size", 1).value_or(1);
  if (const auto gb = f.integer("--global-batch-size", 1)) p.global_batch = *gb, l.global_batch_given = true;
  auto seq = f.integer("--seq-length", 1);
  if (!seq) seq = f.integer("--encoder-seq-length", 1);
  p.seq_len = seq.value_or(0);

  // Uneven pipelines: first/last stage counts, the account-for flags, or a layout string; one way at a time.
  p.pipeline.first_stage_layers = f.integer("--decoder-first-pipeline-num-layers", 1).value_or(0);
  p.pipeline.last_stage_layers = f.integer("--decoder-last-pipeline-num-layers", 1).value_or(0);
  l.account_embedding = f.on("--account-for-embedding-in-pipeline-split");
  l.account_loss = f.on("--account-for-loss-in-pipeline-split");
  const bool first_last = p.pipeline.first_stage_layers > 0 || p.pipeline.last_stage_layers > 0;
  const std::string fl_name = p.pipeline.first_stage_layers > 0 ? "--decoder-first-pipeline-num-layers" : "--decoder-last-pipeline-num-layers";
  const std::string acc_name = l.account_embedding ? "--account-for-embedding-in-pipeline-split" : "--account-for-loss-in-pipeline-split";
  if (const auto layout = f.text("--pipeline-model-parallel-layout")) {
    if (first_last) throw UserError("--pipeline-model-parallel-layout contradicts " + fl_name + " (a layout places every layer; give one)");
    if (l.account_embedding || l.account_loss)
      throw UserError("--pipeline-model-parallel-layout contradicts " + acc_name + " (a layout places the embedding and loss itself; give one)");
    if (l.layers_per_virtual_stage)
      throw UserError("--pipeline-model-parallel-layout contradicts --num-layers-per-virtual-pipeline-stage (the layout's "
                      "stages set the virtual pipeline size; give one)");
    const ParsedLayout pl = parse_pipeline_layout(*layout);
    l.layout_layers = pl.layers;
    l.layout_mtp = pl.mtp;
    l.layout_text = *layout;
    if (pl.layers.size() % size_t(q.pp) != 0)
      throw UserError("--pipeline-model-parallel-layout has " + std::to_string(pl.layers.size()) +
                      " stages, not a multiple of --pipeline-model-parallel-size " + std::to_string(q.pp) +
                      " (give pp x virtual stages per rank stages)");
  }
  if (first_last && (l.account_embedding || l.account_loss))
    throw UserError(fl_name + " contradicts " + acc_name + " (Megatron splits one way at a time; give one)");
  if (first_last && l.layers_per_virtual_stage)
    throw UserError(fl_name + " contradicts --num-layers-per-virtual-pipeline-stage (Megatron needs "
                    "--num-virtual-stages-per-pipeline-rank with uneven stages; use it instead)");
  if (first_last && q.pp == 1) throw UserError(fl_name + " needs --pipeline-model-parallel-size above 1 (give pp, or drop it)");

  // Optimizer sharding. Megatron-FSDP's sharding strategy decides (default no_shard); torch FSDP2 refuses the
  // distributed optimizer (arguments.py) and is ZeRO-3.
  const bool dist = f.on("--use-distributed-optimizer"), fsdp2 = f.on("--use-torch-fsdp2"), mfsdp = f.on("--use-megatron-fsdp");
  if (fsdp2 && mfsdp) throw UserError("--use-torch-fsdp2 contradicts --use-megatron-fsdp (two FSDP implementations; give one)");
  if (fsdp2 && dist)
    throw UserError("--use-torch-fsdp2 contradicts --use-distributed-optimizer (Megatron's torch FSDP2 path refuses the "
                    "distributed optimizer; give one)");
  const auto strategy = f.choice("--data-parallel-sharding-strategy", {"no_shard", "optim", "optim_grads", "optim_grads_params"});
  if (mfsdp) {
    const std::string s = strategy.value_or("no_shard");
    if (s == "optim_grads_params") p.optimizer_sharding = OptimizerSharding::Fsdp;
    else if (s == "no_shard") p.optimizer_sharding = dist ? OptimizerSharding::DistOpt : OptimizerSharding::None;
    else p.optimizer_sharding = OptimizerSharding::DistOpt;
    if (s == "optim_grads")
      l.notes.push_back("--data-parallel-sharding-strategy optim_grads (ZeRO-2) is modelled as dist_opt: gradients "
                        "counted unsharded, an overestimate");
  } else {
    if (strategy) l.notes.push_back("--data-parallel-sharding-strategy has no effect without --use-megatron-fsdp");
    p.optimizer_sharding = fsdp2 ? OptimizerSharding::Fsdp : dist ? OptimizerSharding::DistOpt : OptimizerSharding::None;
  }
  if (f.on("--overlap-param-gather") && p.optimizer_sharding == OptimizerSharding::None && !mfsdp)
    throw UserError("--overlap-param-gather needs --use-distributed-optimizer (Megatron gathers parameters only when "
                    "they are sharded; add it or drop the overlap)");
  f.on("--overlap-grad-reduce");
  for (const char* dtype : {"--main-grads-dtype", "--main-params-dtype", "--exp-avg-dtype", "--exp-avg-sq-dtype"})
    if (const auto t = f.text(dtype); t && *t != "fp32")
      l.notes.push_back(std::string(dtype) + " " + *t + " is modelled as fp32 (lcplan counts fp32 master weights, gradients "
                                                       "and Adam moments)");
  if (const auto opt = f.text("--optimizer"); opt && *opt != "adam")
    l.notes.push_back("--optimizer " + *opt + " is modelled as Adam (12 bytes of state per parameter)");

  // Offload: optimizer state (fraction 1 = all of it) and activations (no pipeline parallelism, transformer_config.py).
  if (f.on("--optimizer-cpu-offload")) {
    const double frac = f.number("--optimizer-offload-fraction", 0, 1, "0 to 1").value_or(1.0);
    p.offload.optimizer = frac > 0;
    if (frac > 0 && frac < 1)
      l.notes.push_back("--optimizer-offload-fraction " + *f.text("--optimizer-offload-fraction") +
                        " is modelled as offloading all optimizer state");
    if (frac == 0) l.notes.push_back("--optimizer-offload-fraction 0 offloads nothing");
  } else if (f.has("--optimizer-offload-fraction")) {
    f.number("--optimizer-offload-fraction", 0, 1, "0 to 1");
    l.notes.push_back("--optimizer-offload-fraction has no effect without --optimizer-cpu-offload");
  }
  p.offload.activations = f.on("--cpu-offloading");
  l.cpu_offloading_layers = f.integer("--cpu-offloading-num-layers", 0).value_or(-1);
  if (p.offload.activations && q.pp > 1)
    throw UserError("--cpu-offloading contradicts --pipeline-model-parallel-size " + std::to_string(q.pp) +
                    " (Megatron offloads activations only without pipeline parallelism; give one)");
  if (!p.offload.activations && l.cpu_offloading_layers >= 0)
    l.notes.push_back("--cpu-offloading-num-layers has no effect without --cpu-offloading");

  // Recompute (transformer_config.py: full needs a method and a layer count; selective takes no layer count).
  auto gran = f.choice("--recompute-granularity", {"full", "selective"});
  if (f.on("--recompute-activations")) {
    if (gran && *gran != "selective")
      throw UserError("--recompute-activations contradicts --recompute-granularity " + *gran +
                      " (--recompute-activations means selective; give one)");
    gran = "selective";
  }
  const auto method = f.choice("--recompute-method", {"uniform", "block"});
  const auto rec_layers = f.integer("--recompute-num-layers", 1);
  const auto modules = f.list("--recompute-modules");
  if (gran && *gran == "full") {
    p.recompute = Recompute::Full;
    if (!method)
      throw UserError("--recompute-granularity full needs --recompute-method (uniform or block; Megatron refuses full "
                      "recompute without one)");
    if (!rec_layers)
      throw UserError("--recompute-method " + *method + " needs --recompute-num-layers (1 for uniform, or for block the "
                      "layers per virtual stage to recompute)");
    if (*method == "block") {
      p.recompute_layers = *rec_layers;
    } else if (*rec_layers > 1) {
      l.notes.push_back("--recompute-method uniform --recompute-num-layers " + std::to_string(*rec_layers) +
                        " keeps one checkpoint per " + std::to_string(*rec_layers) +
                        " layers; lcplan models one per layer (all layers recomputed either way)");
    }
    if (modules) l.notes.push_back("--recompute-modules has no effect with --recompute-granularity full");
  } else if (gran && *gran == "selective") {
    p.recompute = Recompute::Selective;
    if (rec_layers)
      throw UserError("--recompute-num-layers contradicts --recompute-granularity selective (Megatron takes a layer count "
                      "only for full recompute; give one)");
    if (method) l.notes.push_back("--recompute-method has no effect with --recompute-granularity selective");
    std::vector<std::string> mods = modules.value_or(std::vector<std::string>{"core_attn"});
    std::sort(mods.begin(), mods.end());
    static const std::set<std::string> valid = {"core_attn", "layernorm", "mlp", "moe", "moe_act", "shared_experts", "mla_up_proj"};
    for (const auto& mod : mods)
      if (!valid.count(mod))
        throw UserError("--recompute-modules \"" + mod + "\" is not valid (valid: core_attn, layernorm, mlp, moe, moe_act, "
                        "shared_experts, mla_up_proj)");
    if (mods != std::vector<std::string>{"core_attn", "layernorm", "moe_act"})
      l.notes.push_back("--recompute-modules " + join(mods) + " is modelled as lcplan's selective recompute (core_attn, "
                        "layernorm, moe_act)");
  } else if (method || rec_layers || modules) {
    l.notes.push_back(std::string(method ? "--recompute-method" : rec_layers ? "--recompute-num-layers" : "--recompute-modules") +
                      " has no effect without --recompute-granularity");
  }

  // Loss.
  const bool ce_fusion = f.on("--cross-entropy-loss-fusion");
  const auto ce_impl = f.choice("--cross-entropy-fusion-impl", {"native", "te", "linear"});
  p.linear_ce = ce_fusion && ce_impl && *ce_impl == "linear";
  if (ce_impl && *ce_impl == "linear" && !ce_fusion)
    l.notes.push_back("--cross-entropy-fusion-impl linear has no effect without --cross-entropy-loss-fusion (logits are materialized)");

  // MoE options.
  const auto dispatcher = f.choice("--moe-token-dispatcher-type", {"alltoall", "allgather", "flex", "alltoall_seq"});
  if (dispatcher && *dispatcher == "allgather" && q.ep > 1)
    l.notes.push_back("--moe-token-dispatcher-type allgather is modelled as the all-to-all lcplan costs for expert parallelism");
  const auto flex_backend = f.choice("--moe-flex-dispatcher-backend", {"deepep", "hybridep"});
  if (flex_backend && !(dispatcher && *dispatcher == "flex"))
    l.notes.push_back("--moe-flex-dispatcher-backend has no effect without --moe-token-dispatcher-type flex");
  // The flex dispatcher's backend defaults to DeepEP (megatron/training/arguments.py).
  if (dispatcher && *dispatcher == "flex") {
    p.moe.dispatcher = MoeDispatcher::DeepEP;
    if (flex_backend && *flex_backend == "hybridep")
      l.notes.push_back("--moe-flex-dispatcher-backend hybridep is modelled as DeepEP (deduplicated, fp8 dispatch)");
  }
  if (const auto cf = f.number("--moe-expert-capacity-factor", 0, 64, "a positive capacity factor, up to 64")) {
    p.moe.capacity_factor = *cf;
    if (!f.on("--moe-pad-expert-input-to-capacity"))
      l.notes.push_back("--moe-expert-capacity-factor without --moe-pad-expert-input-to-capacity: lcplan counts every "
                        "expert padded to capacity, an upper bound");
  } else if (f.on("--moe-pad-expert-input-to-capacity")) {
    throw UserError("--moe-pad-expert-input-to-capacity needs --moe-expert-capacity-factor (Megatron pads to a capacity "
                    "only when one is set; add it)");
  }
  f.on("--moe-router-force-load-balancing");  // routing_imbalance 1, lcplan's default: balanced routing
  p.moe.a2a_overlap = f.on("--overlap-moe-expert-parallel-comm");
  if (f.on("--delay-wgrad-compute") && !p.moe.a2a_overlap)
    l.notes.push_back("--delay-wgrad-compute has no effect without --overlap-moe-expert-parallel-comm");

  // Precision (fp8 and fp4 recipes are alternatives; fp8's default recipe is delayed scaling).
  const auto fp8 = f.choice("--fp8-format", {"e4m3", "hybrid"});
  const auto fp4 = f.choice("--fp4-format", {"e2m1"});
  const auto fp8_recipe = f.choice("--fp8-recipe", {"tensorwise", "delayed", "blockwise", "mxfp8"});
  const auto fp4_recipe = f.choice("--fp4-recipe", {"nvfp4"});
  if (fp8 && fp4) throw UserError("--fp8-format " + *fp8 + " contradicts --fp4-format " + *fp4 + " (one GEMM format per run; give one)");
  const bool bf16 = f.on("--bf16"), fp16 = f.on("--fp16");
  if (bf16 && fp16) throw UserError("--bf16 contradicts --fp16 (give one)");
  if (fp8) p.precision = fp8_recipe && *fp8_recipe == "mxfp8" ? Precision::MXFP8 : Precision::FP8;
  else if (fp4) p.precision = Precision::NVFP4;
  else if (fp8_recipe) l.notes.push_back("--fp8-recipe has no effect without --fp8-format (the run trains in bf16)");
  if (fp4_recipe && !fp4) l.notes.push_back("--fp4-recipe has no effect without --fp4-format");
  if (fp16) l.notes.push_back("--fp16 is modelled as bf16 (same bytes per value)");
  if (!bf16 && !fp16) l.notes.push_back("neither --bf16 nor --fp16 is given: Megatron trains in fp32, lcplan models bf16");

  // Model shape.
  build_model(f, l, q.tp);
  if (l.model) p.model = l.model->name;
  // Flags read above but not yet asked for (those that only matter with others) must not count as ignored.
  for (const char* name : {"--normalization", "--make-vocab-size-divisible-by"}) f.has(name);
  return l;
}

MegatronLaunch parse_megatron_args(const std::string& text) {
  const ShellCommand c = shell_words(text);
  return parse_megatron_words(c.words);
}

MegatronLaunch parse_megatron_script(const std::string& script, const std::string& name) {
  const ShellCommand c = launch_command_from_script(script, name);
  int world = 0;
  if (auto it = c.vars.find("WORLD_SIZE"); it != c.vars.end() && !it->second.values.empty() && !it->second.values[0].empty() &&
                                            !unresolved_text(it->second.values[0]))
    world = count_positive(it->second.values[0], name + ": WORLD_SIZE");
  return parse_megatron_words(c.words, world);
}

namespace {

// The layers list as the plan's pipeline request: empty when lcplan's automatic split gives the same layers.
PipelineLayout as_request(const std::vector<int>& layers, int model_layers, int pp, int vpp) {
  const SplitResult automatic = split_layers(model_layers, pp, vpp, {});
  PipelineLayout r;
  if (!(automatic.ok && automatic.split.layers == layers)) r.chunk_layers = layers;
  return r;
}

}  // namespace

Plan finish_megatron_plan(const MegatronLaunch& l, const ModelSpec& m, int gpus, std::vector<std::string>* notes) {
  Plan p = l.plan;
  p.gpus = gpus;
  p.model = m.name;
  const int layers = int(m.layers.size());
  Parallel& q = p.parallel;
  // Shape flags against the model (one named with --model): a mismatch means the wrong model or the wrong script.
  {
    auto check = [&](const char* flag, int given, int model, const char* what) {
      if (given > 0 && given != model)
        throw UserError(std::string(flag) + " " + std::to_string(given) + " disagrees with model " + m.name + "'s " +
                        std::to_string(model) + " " + what + " (give the model the script trains)");
    };
    check("--num-layers", l.num_layers, layers, "layers");
    check("--hidden-size", l.hidden, m.hidden, "hidden size");
    if (has_moe(m)) {
      check("--num-experts", l.num_experts, m.moe.num_experts, "experts");
      check("--moe-router-topk", l.top_k, m.moe.top_k, "routed experts per token");
    } else if (l.num_experts > 0) {
      throw UserError("--num-experts " + std::to_string(l.num_experts) + " disagrees with model " + m.name +
                      ", which is dense (give the model the script trains)");
    }
  }
  // Megatron trains MTP modules only with --mtp-num-layers; the plan keeps -1 (the model's) when they agree.
  const int mtp = std::max(0, l.mtp_layers);
  p.mtp_layers = mtp == m.mtp_layers ? -1 : mtp;
  // Virtual pipeline size: from the layout's stages, or either vpp flag.
  const int acc = int(l.account_embedding) + int(l.account_loss);
  q.vpp = 1;
  if (!l.layout_layers.empty()) {
    q.vpp = int(l.layout_layers.size()) / q.pp;
    if (l.virtual_stages && l.virtual_stages != q.vpp)
      throw UserError("--num-virtual-stages-per-pipeline-rank " + std::to_string(l.virtual_stages) +
                      " disagrees with --pipeline-model-parallel-layout's " + std::to_string(l.layout_layers.size()) +
                      " stages over pp " + std::to_string(q.pp) + " (" + std::to_string(q.vpp) + " per rank; give one)");
  } else if (l.virtual_stages) {
    q.vpp = l.virtual_stages;
  } else if (l.layers_per_virtual_stage) {
    const long per_rank = long(l.layers_per_virtual_stage) * q.pp;
    if ((layers + acc) % per_rank != 0)
      throw UserError("--num-layers-per-virtual-pipeline-stage " + std::to_string(l.layers_per_virtual_stage) + " x pp " +
                      std::to_string(q.pp) + " does not divide the " + std::to_string(layers + acc) +
                      " layers to place (give a divisor)");
    q.vpp = int((layers + acc) / per_rank);
  }
  // Pipeline split.
  if (!l.layout_layers.empty()) {
    long t = 0;
    for (int n : l.layout_layers) t += n;
    if (t != layers)
      throw UserError("--pipeline-model-parallel-layout places " + std::to_string(t) + " transformer layers (t) but model " +
                      m.name + " has " + std::to_string(layers) + " (give one t per layer)");
    if (l.layout_mtp != mtp)
      throw UserError("--pipeline-model-parallel-layout places " + std::to_string(l.layout_mtp) + " MTP layers (m) but "
                      "--mtp-num-layers trains " + std::to_string(mtp) + " (give one m per MTP layer)");
    p.pipeline = as_request(l.layout_layers, layers, q.pp, q.vpp);
  } else if (acc > 0) {
    // Megatron's account-for split: embedding and loss count as a layer each on the first / last virtual stage.
    const long chunks = long(q.pp) * q.vpp, total = layers + acc;
    if (total % chunks != 0 || total / chunks < 1)
      throw UserError(std::string(l.account_embedding ? "--account-for-embedding-in-pipeline-split" : "--account-for-loss-in-pipeline-split") +
                      " leaves " + std::to_string(total) + " layers (model layers plus embedding/loss) not divisible by "
                      "pp x virtual stages = " + std::to_string(chunks) + " (give sizes that divide)");
    std::vector<int> split(size_t(chunks), int(total / chunks));
    if (l.account_embedding) split.front()--;
    if (l.account_loss) split.back()--;
    if (split.front() < 0 || split.back() < 0)
      throw UserError("--account-for-embedding-in-pipeline-split with one layer per virtual stage leaves none for the first stage");
    p.pipeline = as_request(split, layers, q.pp, q.vpp);
  }
  // Megatron's defaults that need the model or the GPU count.
  if (!l.etp_given) q.etp = has_moe(m) ? q.tp : 1;
  if (!l.global_batch_given && q.tp > 0 && q.pp > 0 && q.cp > 0 && gpus % (q.tp * q.pp * q.cp) == 0)
    p.global_batch = p.micro_batch * (gpus / (q.tp * q.pp * q.cp));
  // --cpu-offloading-num-layers defaults to 0 (no layer offloaded) and is at most layers - 1 (transformer_config.py).
  if (p.offload.activations) {
    const int n = std::max(0, l.cpu_offloading_layers);
    if (n >= layers)
      throw UserError("--cpu-offloading-num-layers " + std::to_string(n) + " is out of range (valid: 0 to " +
                      std::to_string(layers - 1) + ", fewer than the model's " + std::to_string(layers) + " layers)");
    if (n == 0) p.offload.activations = false;
    if (notes && n == 0)
      notes->push_back("--cpu-offloading with --cpu-offloading-num-layers 0 (Megatron's default) offloads no layer");
    else if (notes && n < layers - 1)
      notes->push_back("--cpu-offloading-num-layers " + std::to_string(n) + " is modelled as every layer's activations offloaded");
  }
  return p;
}

std::string megatron_model_flags(const ModelSpec& m, bool with_mtp) {
  if (m.layers.empty()) return "";
  const MixerKind mixer = m.layers.front().mixer;
  for (const auto& l : m.layers)
    if (l.mixer != mixer || l.sliding) return "";
  if (mixer == MixerKind::LinearAttention || (mixer == MixerKind::FullAttention && (m.attn.output_gate || m.attn.sinks))) return "";
  if (m.moe.expert_bias) return "";
  std::ostringstream o;
  o << "--num-layers " << m.layers.size() << " --hidden-size " << m.hidden;
  const bool moe = has_moe(m);
  const bool dense = std::any_of(m.layers.begin(), m.layers.end(), [](const LayerSpec& l) { return l.ffn == FfnKind::Dense; });
  const int ffn = dense || m.dense_ffn > 0 ? m.dense_ffn : m.moe.expert_ffn;
  o << " --ffn-hidden-size " << ffn;
  if (mixer == MixerKind::MLA) {
    o << " --num-attention-heads " << m.mla.heads << " --multi-latent-attention";
    if (m.mla.q_lora_rank > 0) o << " --q-lora-rank " << m.mla.q_lora_rank;
    o << " --kv-lora-rank " << m.mla.kv_lora_rank << " --qk-head-dim " << m.mla.qk_nope_head_dim << " --qk-pos-emb-head-dim "
      << m.mla.qk_rope_head_dim << " --v-head-dim " << m.mla.v_head_dim;
  } else {
    o << " --num-attention-heads " << m.attn.heads;
    if (m.attn.kv_heads != m.attn.heads) o << " --group-query-attention --num-query-groups " << m.attn.kv_heads;
    o << " --kv-channels " << m.attn.head_dim;
    if (m.attn.qk_norm) o << " --qk-layernorm";
    if (m.attn.qkv_bias && !m.attn.o_bias) o << " --add-qkv-bias";
    if (m.attn.partial_rotary != 1.0) o << " --rotary-percent " << m.attn.partial_rotary;
  }
  // Bias in every linear layer is Megatron's default; the zoo's models have none beyond q/k/v.
  const bool all_bias = mixer == MixerKind::FullAttention && m.attn.o_bias;
  if (!all_bias) o << " --disable-bias-linear";
  // The zoo's vocabulary sizes are already padded; divisible-by 1 keeps Megatron from padding them again.
  o << " --vocab-size " << m.vocab << " --make-vocab-size-divisible-by 1";
  if (!m.tied_embeddings) o << " --untie-embeddings-and-output-weights";
  if (m.gated_mlp) o << " --swiglu";
  o << " --normalization RMSNorm --position-embedding-type rope";
  if (moe) {
    o << " --num-experts " << m.moe.num_experts << " --moe-router-topk " << m.moe.top_k << " --moe-ffn-hidden-size "
      << m.moe.expert_ffn;
    if (m.moe.shared_experts > 0) o << " --moe-shared-expert-intermediate-size " << m.moe.shared_experts * m.moe.shared_ffn;
    if (m.moe.shared_expert_gate) o << " --moe-shared-expert-gate";
    if (m.moe.router == RouterKind::SigmoidGroupLimited) {
      o << " --moe-router-score-function sigmoid --moe-router-enable-expert-bias";
      if (m.moe.n_group > 1) o << " --moe-router-num-groups " << m.moe.n_group << " --moe-router-group-topk " << m.moe.topk_group;
    }
    if (dense) {
      // Run-length list, e.g. ([0]*3+[1]*58) (arguments.py --moe-layer-freq).
      std::string list = "(";
      for (size_t i = 0; i < m.layers.size();) {
        size_t j = i;
        while (j < m.layers.size() && m.layers[j].ffn == m.layers[i].ffn) ++j;
        list += (i > 0 ? "+[" : "[") + std::string(m.layers[i].ffn == FfnKind::MoE ? "1" : "0") + "]*" + std::to_string(j - i);
        i = j;
      }
      o << " --moe-layer-freq \"" << list << ")\"";
    }
  }
  if (with_mtp && m.mtp_layers > 0) o << " --mtp-num-layers " << m.mtp_layers;
  return o.str();
}

std::string megatron_plan_difference(const Plan& a, const Plan& b) {
  std::ostringstream o;
  auto cmp = [&](const char* field, const auto& x, const auto& y) {
    if (o.tellp() == 0 && !(x == y)) o << field << ": " << x << " vs " << y;
  };
  cmp("seq_len", a.seq_len, b.seq_len);
  cmp("micro_batch", a.micro_batch, b.micro_batch);
  cmp("global_batch", effective_global_batch(a), effective_global_batch(b));
  cmp("precision", std::string(to_string(a.precision)), std::string(to_string(b.precision)));
  cmp("tp", a.parallel.tp, b.parallel.tp);
  cmp("pp", a.parallel.pp, b.parallel.pp);
  cmp("vpp", a.parallel.vpp, b.parallel.vpp);
  cmp("cp", a.parallel.cp, b.parallel.cp);
  cmp("ep", a.parallel.ep, b.parallel.ep);
  cmp("etp", a.parallel.etp, b.parallel.etp);
  cmp("pipeline.first_stage_layers", a.pipeline.first_stage_layers, b.pipeline.first_stage_layers);
  cmp("pipeline.last_stage_layers", a.pipeline.last_stage_layers, b.pipeline.last_stage_layers);
  cmp("pipeline.layers", join([&] { std::vector<std::string> v; for (int n : a.pipeline.chunk_layers) v.push_back(std::to_string(n)); return v; }(), ","),
      join([&] { std::vector<std::string> v; for (int n : b.pipeline.chunk_layers) v.push_back(std::to_string(n)); return v; }(), ","));
  if (a.parallel.tp > 1) cmp("sequence_parallel", a.sequence_parallel, b.sequence_parallel);
  cmp("optimizer_sharding", std::string(to_string(a.optimizer_sharding)), std::string(to_string(b.optimizer_sharding)));
  cmp("recompute", std::string(to_string(a.recompute)), std::string(to_string(b.recompute)));
  cmp("recompute_layers", a.recompute_layers, b.recompute_layers);
  cmp("offload.optimizer", a.offload.optimizer, b.offload.optimizer);
  cmp("offload.activations", a.offload.activations, b.offload.activations);
  cmp("linear_ce", a.linear_ce, b.linear_ce);
  cmp("moe.capacity_factor", a.moe.capacity_factor, b.moe.capacity_factor);
  cmp("moe.dispatcher", std::string(to_string(a.moe.dispatcher)), std::string(to_string(b.moe.dispatcher)));
  cmp("moe.a2a_overlap", a.moe.a2a_overlap, b.moe.a2a_overlap);
  cmp("mtp_layers", a.mtp_layers, b.mtp_layers);
  return o.str();
}

}  // namespace lcplan
