#include "search/megatron_args.h"

#include "estimator/frameworks.h"

#include <algorithm>
#include <cctype>
#include <functional>
#include <map>
#include <set>
#include <sstream>

#include "common/user_error.h"
#include "parallel/pipeline_split.h"
#include "search/shell_words.h"

namespace lcplan {

namespace {

// Sources: Megatron-LM megatron/training/arguments.py and megatron/core/transformer/transformer_config.py; which
// flags lcplan reads and how is the table of search/megatron_flags.h.

bool is_env_word(const std::string& w) {
  const size_t eq = w.find('=');
  if (eq == std::string::npos || eq == 0) return false;
  for (size_t i = 0; i < eq; ++i)
    if (!(std::isalnum(static_cast<unsigned char>(w[i])) || w[i] == '_') || (i == 0 && std::isdigit(static_cast<unsigned char>(w[0]))))
      return false;
  return true;
}


// A word-level pass: launcher words, environment assignments, Megatron flags and Megatron-Bridge overrides.
struct Words {
  std::vector<std::pair<std::string, std::vector<std::string>>> flags;  // in order
  std::map<std::string, std::string> env;
  std::vector<std::string> launcher;  // torchrun's own words (before the script)
  bool bridge = false;                // a Megatron-Bridge override was read
};

// Megatron-Bridge's `section.field=value` (or `mixed_precision=recipe`) as the Megatron flag the table names for the
// field; false when the word is not such an override.
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
    for (auto& flag : bridge_mixed_precision_flags(value)) out.flags.push_back(std::move(flag));
    return true;
  }
  const MegatronFlag* known = find_bridge_field(field);
  std::string flag = known ? known->name : "--" + field;
  std::replace(flag.begin(), flag.end(), '_', '-');
  std::string lower = value;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  if (known && known->bridge && known->bridge[0] == '!') {  // the field is the switch's negation
    if (lower == "false") out.flags.push_back({flag, {}});
    return true;
  }
  if (lower == "none" || lower == "null") return true;  // Bridge's way of leaving a field at its default
  if ((known && known->arity == Arity::Switch) || lower == "true" || lower == "false") {
    if (lower == "true" || lower == "1") out.flags.push_back({flag, {}});
    else if (lower != "false" && lower != "0") out.flags.push_back({flag, {value}});
    return true;
  }
  std::vector<std::string> values;
  if (known && known->arity == Arity::List && value.size() >= 2 && value.front() == '[' && value.back() == ']') {
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

// The Megatron flags follow the training script (pretrain_gpt.py, or the module after `-m`); the launcher's words come
// before it. Returns the index of the first Megatron word (0: no script, every word is a Megatron flag).
size_t script_start(const std::vector<std::string>& words, Words& out) {
  size_t start = 0;
  for (size_t i = 0; i < words.size(); ++i) {
    const std::string& w = words[i];
    const bool py = w.size() > 3 && w.compare(w.size() - 3, 3, ".py") == 0 && w.rfind("--", 0) != 0;
    const bool module = w == "-m" && i + 1 < words.size();
    if (py || module) {
      start = py ? i + 1 : i + 2;
      out.launcher.assign(words.begin(), words.begin() + i);
      // python -m torch.distributed.run ... pretrain_gpt.py: keep looking for the script.
      if (module && words[i + 1].find("torch.distributed") != std::string::npos) continue;
      break;
    }
  }
  return start;
}

// Launcher words: environment assignments in front, torchrun's --nnodes / --nproc-per-node.
void read_launcher(Words& out) {
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

Words split_words(const std::vector<std::string>& words) {
  Words out;
  const size_t start = script_start(words, out);
  if (start > 0) read_launcher(out);
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
      if (bridge_override(w, out)) out.bridge = true;  // anything else (a stray word before the flags) is the launcher's
    }
  }
  return out;
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

// MLA or GQA attention from the shape flags, with Megatron's defaults (arguments.py): GQA only with
// --group-query-attention, kv_channels = hidden / heads, bias in linear layers unless --disable-bias-linear.
void attention_from_flags(const MegatronFlagSet& f, MegatronLaunch& l, ModelSpec& m, int heads, bool bias) {
  if (f.on("--multi-latent-attention")) {
    m.mla.heads = heads;
    m.mla.q_lora_rank = f.integer("--q-lora-rank", 0).value_or(0);
    m.mla.kv_lora_rank = f.integer("--kv-lora-rank", 1).value_or(32);
    m.mla.qk_nope_head_dim = f.integer("--qk-head-dim", 1).value_or(128);
    m.mla.qk_rope_head_dim = f.integer("--qk-pos-emb-head-dim", 0).value_or(64);
    m.mla.v_head_dim = f.integer("--v-head-dim", 1).value_or(128);
    return;
  }
  m.attn.heads = heads;
  const auto groups = f.integer("--num-query-groups", 1);
  const bool gqa = f.on("--group-query-attention");
  if (groups && !gqa) l.notes.push_back("--num-query-groups has no effect without --group-query-attention (Megatron uses one KV head per attention head)");
  m.attn.kv_heads = gqa ? groups.value_or(1) : heads;
  if (heads % m.attn.kv_heads != 0)
    throw UserError("--num-query-groups " + std::to_string(m.attn.kv_heads) + " does not divide --num-attention-heads " +
                    std::to_string(heads) + " (give a divisor)");
  if (const auto kv = f.integer("--kv-channels", 1)) m.attn.head_dim = *kv;
  else if (m.hidden % heads != 0)
    throw UserError("--hidden-size " + std::to_string(m.hidden) + " is not divisible by --num-attention-heads " +
                    std::to_string(heads) + " (give --kv-channels)");
  else m.attn.head_dim = m.hidden / heads;
  m.attn.qkv_bias = bias || f.on("--add-qkv-bias");
  m.attn.o_bias = bias;
  m.attn.qk_norm = f.on("--qk-layernorm");
  m.attn.partial_rotary = f.number("--rotary-percent", 1e-6, 1, "a fraction in (0, 1]").value_or(1.0);
}

// The experts from the shape flags (--moe-router-topk defaults to 2); which layers are MoE, per --moe-layer-freq.
std::vector<bool> moe_from_flags(const MegatronFlagSet& f, MegatronLaunch& l, ModelSpec& m, int layers, bool bias) {
  if (l.num_experts == 0) {
    if (f.has("--moe-layer-freq")) l.notes.push_back("--moe-layer-freq has no effect without --num-experts");
    if (f.has("--moe-latent-size")) l.notes.push_back("--moe-latent-size has no effect without --num-experts");
    return std::vector<bool>(size_t(layers), false);
  }
  std::vector<bool> pattern =
      f.has("--moe-layer-freq") ? moe_layer_pattern(*f.text("--moe-layer-freq"), layers) : std::vector<bool>(size_t(layers), true);
  MoeSpec& e = m.moe;
  e.num_experts = l.num_experts;
  e.top_k = l.top_k > 0 ? l.top_k : 2;
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
  e.latent = l.moe_latent;
  return pattern;
}

// A ModelSpec from the shape flags (the table's "model" row: dense GQA / MLA decoders, MoE per --moe-layer-freq),
// with Megatron's defaults (arguments.py): ffn 4h (SwiGLU: 4h*2/3 rounded down to 64), tied embeddings.
void model_from_flags(const MegatronFlagSet& f, MegatronLaunch& l, int tp) {
  const auto layers = f.integer("--num-layers", 1);
  const auto hidden = f.integer("--hidden-size", 1);
  const auto heads = f.integer("--num-attention-heads", 1);
  const auto padded = f.integer("--padded-vocab-size", 1);
  const auto vocab = f.integer("--vocab-size", 1);
  l.num_layers = layers.value_or(0);
  l.hidden = hidden.value_or(0);
  l.num_experts = f.integer("--num-experts", 1).value_or(0);
  l.top_k = f.integer("--moe-router-topk", 1).value_or(0);
  l.moe_latent = f.integer("--moe-latent-size", 1).value_or(0);
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
  attention_from_flags(f, l, m, *heads, bias);
  const std::vector<bool> moe = moe_from_flags(f, l, m, *layers, bias);
  const MixerKind mixer = f.on("--multi-latent-attention") ? MixerKind::MLA : MixerKind::FullAttention;
  m.layers.resize(size_t(*layers));
  for (size_t i = 0; i < m.layers.size(); ++i) {
    m.layers[i].mixer = mixer;
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
  MegatronFlagSet f(l.notes);
  std::set<std::string> ignored;
  for (const auto& [name, values] : w.flags) {
    const std::string flag = name == "--nproc_per_node" ? "--nproc-per-node" : name;
    if (find_megatron_flag(flag)) f.set(flag, values);
    else if (!megatron_flag_without_effect(name) && ignored.insert(name).second) l.ignored.push_back(name);
  }
  read_megatron_rows(f, w.env, script_world_size, l);
  // A Megatron-Bridge launch: the settings its overrides leave out are its performance recipes' (frameworks.h).
  if (w.bridge) l.plan.implementation = "megatron-bridge";
  model_from_flags(f, l, l.plan.parallel.tp);
  if (l.model) l.plan.model = l.model->name;
  return l;
}

MegatronLaunch parse_megatron_args(const std::string& text) {
  require_closed_quotes(text, "--megatron-args");
  const ShellCommand c = shell_words(text);
  return parse_megatron_words(c.words);
}

MegatronLaunch parse_megatron_script(const std::string& script, const std::string& name) {
  const ShellCommand c = launch_command_from_script(script, name);
  int world = 0;
  if (auto it = c.vars.find("WORLD_SIZE"); it != c.vars.end() && !it->second.values.empty() && !it->second.values[0].empty() &&
                                            !unresolved_text(it->second.values[0]))
    world = launcher_count(it->second.values[0], name + ": WORLD_SIZE");
  return parse_megatron_words(c.words, world);
}

namespace {

// Shape flags against the model (one named with --model): a mismatch means the wrong model or the wrong script.
void check_shape_flags(const MegatronLaunch& l, const ModelSpec& m) {
  auto check = [&](const char* flag, int given, int model, const char* what) {
    if (given > 0 && given != model)
      throw UserError(std::string(flag) + " " + std::to_string(given) + " disagrees with model " + m.name + "'s " +
                      std::to_string(model) + " " + what + " (give the model the script trains)");
  };
  check("--num-layers", l.num_layers, int(m.layers.size()), "layers");
  check("--hidden-size", l.hidden, m.hidden, "hidden size");
  if (has_moe(m)) {
    check("--num-experts", l.num_experts, m.moe.num_experts, "experts");
    check("--moe-router-topk", l.top_k, m.moe.top_k, "routed experts per token");
    if (l.moe_latent > 0 && l.moe_latent != m.moe.latent)
      throw UserError("--moe-latent-size " + std::to_string(l.moe_latent) +
                      " disagrees with model " + m.name + "'s latent width " +
                      (m.moe.latent > 0 ? std::to_string(m.moe.latent) : std::string("(none: experts in the hidden width)")) +
                      " (give the model the script trains)");
  } else if (l.num_experts > 0) {
    throw UserError("--num-experts " + std::to_string(l.num_experts) + " disagrees with model " + m.name +
                    ", which is dense (give the model the script trains)");
  }
}

}  // namespace

Plan finish_megatron_plan(const MegatronLaunch& l, const ModelSpec& m, int gpus, std::vector<std::string>* notes) {
  check_shape_flags(l, m);
  Plan p = l.plan;
  p.gpus = gpus;
  p.model = m.name;
  finish_megatron_rows(l, m, p, notes);
  // What the absent flags mean: the launch's implementation's defaults (Megatron-LM's, or a Megatron-Bridge recipe's),
  // kept marked as assumed so that loading the plan (estimator/plan_inputs.h) says so and applies another
  // implementation's if one is given.
  apply_run_defaults(p, m);
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
    if (m.moe.latent > 0) o << " --moe-latent-size " << m.moe.latent;
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

}  // namespace lcplan
