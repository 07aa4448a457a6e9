#include "search/megatron_flags.h"

#include <algorithm>
#include <cctype>
#include <climits>
#include <cmath>
#include <set>
#include <sstream>

#include "common/flag_text.h"
#include "common/user_error.h"
#include "search/megatron_args.h"
#include "search/megatron_rows.h"

namespace lcplan {

namespace {

template <typename T>
void add(FieldValues& v, const char* field, const T& value) {
  add_value(v, field, value);
}

bool has_moe(const ModelSpec& m) {
  return std::any_of(m.layers.begin(), m.layers.end(), [](const LayerSpec& l) { return l.ffn == FfnKind::MoE; });
}

// ---- launch and parallel sizes ----------------------------------------------------------------------------------

// WORLD_SIZE in front of the command or set by the script, or torchrun's nodes x processes per node. A size the
// text leaves to a shell variable is unknown here, not an error: --gpus gives it.
void read_world_size(MegatronReading& r) {
  const MegatronFlagSet& f = r.f;
  int world = 0;
  if (auto it = r.env.find("WORLD_SIZE"); it != r.env.end() && !unresolved_text(it->second))
    world = launcher_count(it->second, "WORLD_SIZE");
  else if (r.script_world_size > 0) world = r.script_world_size;
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
    const long g = long(launcher_count(*nnodes, "--nnodes")) * launcher_count(*nproc, "--nproc-per-node");
    if (g > INT_MAX) throw UserError("--nnodes x --nproc-per-node is too large (give the GPU count with --gpus)");
    if (world > 0 && world != g)
      throw UserError("WORLD_SIZE " + std::to_string(world) + " disagrees with --nnodes " + *nnodes + " x --nproc-per-node " +
                      *nproc + " = " + std::to_string(g) + " (give one, or the GPU count with --gpus)");
    world = int(g);
  }
  r.l.world_size = world;
  r.p.gpus = world;
}

void emit_world_size(MegatronEmission& e) {
  const Plan& p = e.p;
  const int mp = p.parallel.tp * p.parallel.pp * p.parallel.cp;
  // GPUs per node as the plan's loader resolved it (estimator/derived_plan.h nvlink_domain_gpus); unknown: no split.
  const int node = p.gpus_per_node;
  const int nodes = node > 0 && p.gpus > node && p.gpus % node == 0 ? p.gpus / node : 1;
  const std::string launcher = node > 0 ? " (e.g. torchrun --nnodes " + std::to_string(nodes) + " --nproc-per-node " +
                                              std::to_string(p.gpus / nodes) + ")" : "";
  e.comments.push_back("# world size " + std::to_string(p.gpus) + " GPUs, the launcher's" + launcher + "; dp = " +
                       std::to_string(mp > 0 ? p.gpus / mp : 0));
}

void read_virtual_stages(MegatronReading& r) {
  MegatronLaunch& l = r.l;
  l.layers_per_virtual_stage = r.f.integer("--num-layers-per-virtual-pipeline-stage", 1).value_or(0);
  l.virtual_stages = r.f.integer("--num-virtual-stages-per-pipeline-rank", 1).value_or(0);
  if (const auto v = r.f.integer("--virtual-pipeline-model-parallel-size", 1)) {
    if (l.virtual_stages && l.virtual_stages != *v)
      throw UserError("--virtual-pipeline-model-parallel-size " + std::to_string(*v) +
                      " contradicts --num-virtual-stages-per-pipeline-rank " + std::to_string(l.virtual_stages) + " (give one)");
    l.virtual_stages = *v;
  }
  if (l.layers_per_virtual_stage && l.virtual_stages)
    throw UserError("--num-layers-per-virtual-pipeline-stage contradicts --num-virtual-stages-per-pipeline-rank "
                    "(Megatron takes one of them; give one)");
}

// The virtual pipeline size: from the layout's stages, or either vpp flag (layers per stage needs the model).
void finish_virtual_stages(MegatronFinishing& c) {
  const MegatronLaunch& l = c.l;
  Parallel& q = c.p.parallel;
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
    if ((c.layers + acc) % per_rank != 0)
      throw UserError("--num-layers-per-virtual-pipeline-stage " + std::to_string(l.layers_per_virtual_stage) + " x pp " +
                      std::to_string(q.pp) + " does not divide the " + std::to_string(c.layers + acc) +
                      " layers to place (give a divisor)");
    q.vpp = int((c.layers + acc) / per_rank);
  }
}

void emit_virtual_stages(MegatronEmission& e) {
  if (!e.split.ok || e.p.parallel.vpp <= 1) return;
  switch (e.split.split.rule) {
    case SplitRule::Even: e.flags << " --num-layers-per-virtual-pipeline-stage " << e.split.split.max_chunk_layers(); break;
    // Uneven splits set vpp by count: --num-layers-per-virtual-pipeline-stage would have to count E and L.
    case SplitRule::EmbeddingAndLoss:
    case SplitRule::FirstLast: e.flags << " --num-virtual-stages-per-pipeline-rank " << e.p.parallel.vpp; break;
    case SplitRule::Explicit:
    case SplitRule::Balanced: break;  // the layout's stage count says it
  }
}

// Uneven pipelines: first/last stage counts, the account-for flags, or a layout string; one way at a time.
void read_pipeline(MegatronReading& r) {
  const MegatronFlagSet& f = r.f;
  MegatronLaunch& l = r.l;
  PipelineLayout& pl = r.p.pipeline;
  pl.first_stage_layers = f.integer("--decoder-first-pipeline-num-layers", 1).value_or(0);
  pl.last_stage_layers = f.integer("--decoder-last-pipeline-num-layers", 1).value_or(0);
  l.account_embedding = f.on("--account-for-embedding-in-pipeline-split");
  l.account_loss = f.on("--account-for-loss-in-pipeline-split");
  const bool first_last = pl.first_stage_layers > 0 || pl.last_stage_layers > 0;
  const std::string fl_name = pl.first_stage_layers > 0 ? "--decoder-first-pipeline-num-layers" : "--decoder-last-pipeline-num-layers";
  const std::string acc_name = l.account_embedding ? "--account-for-embedding-in-pipeline-split" : "--account-for-loss-in-pipeline-split";
  if (const auto layout = f.text("--pipeline-model-parallel-layout")) {
    if (first_last) throw UserError("--pipeline-model-parallel-layout contradicts " + fl_name + " (a layout places every layer; give one)");
    if (l.account_embedding || l.account_loss)
      throw UserError("--pipeline-model-parallel-layout contradicts " + acc_name + " (a layout places the embedding and loss itself; give one)");
    if (l.layers_per_virtual_stage)
      throw UserError("--pipeline-model-parallel-layout contradicts --num-layers-per-virtual-pipeline-stage (the layout's "
                      "stages set the virtual pipeline size; give one)");
    const ParsedLayout parsed = parse_pipeline_layout(*layout);
    l.layout_layers = parsed.layers;
    l.layout_mtp = parsed.mtp;
    l.layout_text = *layout;
    if (parsed.layers.size() % size_t(r.q.pp) != 0)
      throw UserError("--pipeline-model-parallel-layout has " + std::to_string(parsed.layers.size()) +
                      " stages, not a multiple of --pipeline-model-parallel-size " + std::to_string(r.q.pp) +
                      " (give pp x virtual stages per rank stages)");
  }
  if (first_last && (l.account_embedding || l.account_loss))
    throw UserError(fl_name + " contradicts " + acc_name + " (Megatron splits one way at a time; give one)");
  if (first_last && l.layers_per_virtual_stage)
    throw UserError(fl_name + " contradicts --num-layers-per-virtual-pipeline-stage (Megatron needs "
                    "--num-virtual-stages-per-pipeline-rank with uneven stages; use it instead)");
  if (first_last && r.q.pp == 1) throw UserError(fl_name + " needs --pipeline-model-parallel-size above 1 (give pp, or drop it)");
}

// The layers list as the plan's pipeline request: empty when lcplan's automatic split gives the same layers.
PipelineLayout as_request(const std::vector<int>& layers, int model_layers, int pp, int vpp) {
  const SplitResult automatic = split_layers(model_layers, pp, vpp, {});
  PipelineLayout r;
  if (!(automatic.ok && automatic.split.layers == layers)) r.chunk_layers = layers;
  return r;
}

// A layout or the account-for flags become explicit layers per virtual stage unless they equal the automatic split.
void finish_pipeline(MegatronFinishing& c) {
  const MegatronLaunch& l = c.l;
  const Parallel& q = c.p.parallel;
  const int acc = int(l.account_embedding) + int(l.account_loss);
  const int mtp = std::max(0, l.mtp_layers);
  if (!l.layout_layers.empty()) {
    long t = 0;
    for (int n : l.layout_layers) t += n;
    if (t != c.layers)
      throw UserError("--pipeline-model-parallel-layout places " + std::to_string(t) + " transformer layers (t) but model " +
                      c.m.name + " has " + std::to_string(c.layers) + " (give one t per layer)");
    if (l.layout_mtp != mtp)
      throw UserError("--pipeline-model-parallel-layout places " + std::to_string(l.layout_mtp) + " MTP layers (m) but "
                      "--mtp-num-layers trains " + std::to_string(mtp) + " (give one m per MTP layer)");
    c.p.pipeline = as_request(l.layout_layers, c.layers, q.pp, q.vpp);
  } else if (acc > 0) {
    // Megatron's account-for split: embedding and loss count as a layer each on the first / last virtual stage.
    const long chunks = long(q.pp) * q.vpp, total = c.layers + acc;
    if (total % chunks != 0 || total / chunks < 1)
      throw UserError(std::string(l.account_embedding ? "--account-for-embedding-in-pipeline-split" : "--account-for-loss-in-pipeline-split") +
                      " leaves " + std::to_string(total) + " layers (model layers plus embedding/loss) not divisible by "
                      "pp x virtual stages = " + std::to_string(chunks) + " (give sizes that divide)");
    std::vector<int> split(size_t(chunks), int(total / chunks));
    if (l.account_embedding) split.front()--;
    if (l.account_loss) split.back()--;
    if (split.front() < 0 || split.back() < 0)
      throw UserError("--account-for-embedding-in-pipeline-split with one layer per virtual stage leaves none for the first stage");
    c.p.pipeline = as_request(split, c.layers, q.pp, q.vpp);
  }
}

// Megatron's --pipeline-model-parallel-layout: per virtual stage E (embedding), t (decoder layer), m (MTP), L (loss).
std::string layout_string(const PipelineSplit& s, int mtp_layers) {
  std::string out;
  for (int c = 0; c < s.chunks(); ++c) {
    if (c > 0) out += "|";
    if (c == 0) out += "E";
    out.append(s.layers_in(c), 't');
    if (c == s.chunks() - 1) out.append(mtp_layers, 'm').append("L");
  }
  return out;
}

void emit_pipeline(MegatronEmission& e) {
  if (!e.split.ok) return;
  const PipelineLayout& pl = e.p.pipeline;
  switch (e.split.split.rule) {
    case SplitRule::Even: break;
    case SplitRule::EmbeddingAndLoss:
      e.flags << " --account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split";
      break;
    case SplitRule::FirstLast:
      if (pl.first_stage_layers > 0) e.flags << " --decoder-first-pipeline-num-layers " << pl.first_stage_layers;
      if (pl.last_stage_layers > 0) e.flags << " --decoder-last-pipeline-num-layers " << pl.last_stage_layers;
      break;
    case SplitRule::Explicit:
    case SplitRule::Balanced: e.flags << " --pipeline-model-parallel-layout \"" << layout_string(e.split.split, e.mtp) << "\""; break;
  }
}

void expressed_pipeline(const Plan& p, FieldValues& v) {
  add(v, "pipeline.first_stage_layers", p.pipeline.first_stage_layers);
  add(v, "pipeline.last_stage_layers", p.pipeline.last_stage_layers);
  std::vector<std::string> layers;
  for (int n : p.pipeline.chunk_layers) layers.push_back(std::to_string(n));
  add(v, "pipeline.layers", join_words(layers, ","));
}

// Megatron turns sequence parallelism off at TP 1 (arguments.py); lcplan keeps its default there, where it means nothing.
void read_sequence_parallel(MegatronReading& r) {
  r.p.sequence_parallel = r.f.on("--sequence-parallel") || r.q.tp == 1;
  if (r.q.ep > 1 && r.q.tp > 1 && !r.p.sequence_parallel)
    throw UserError("--expert-model-parallel-size " + std::to_string(r.q.ep) + " with --tensor-model-parallel-size " +
                    std::to_string(r.q.tp) + " needs --sequence-parallel (Megatron requires it with expert and tensor "
                    "parallelism; add it)");
}

void emit_sequence_parallel(MegatronEmission& e) {
  const Parallel& q = e.p.parallel;
  if (q.tp > 1 && e.p.sequence_parallel) e.flags << " --sequence-parallel";
  if (q.ep > 1 && q.tp > 1 && !e.p.sequence_parallel)
    e.comments.push_back("# Megatron requires --sequence-parallel with expert and tensor parallelism; this plan has it off");
}

std::vector<MegatronRow> parallel_rows() {
  return {
      {.field = "gpus",
       .flags = {{"--nnodes", Arity::One}, {"--nproc-per-node", Arity::One}},
       .fidelity = Fidelity::NoFlag,
       .note = "the launcher's world size (torchrun --nnodes N --nproc-per-node M, or WORLD_SIZE), not a Megatron flag",
       .read = read_world_size,
       .emit = emit_world_size},
      {.field = "parallel.tp",
       .flags = {{"--tensor-model-parallel-size", Arity::One}},
       .fidelity = Fidelity::Exact,
       .note = "",
       .read = [](MegatronReading& r) { r.q.tp = r.f.integer("--tensor-model-parallel-size", 1).value_or(1); },
       .emit = [](MegatronEmission& e) { e.flags << " --tensor-model-parallel-size " << e.p.parallel.tp; },
       .expressed = [](const Plan& p, FieldValues& v) { add(v, "tp", p.parallel.tp); }},
      {.field = "parallel.pp",
       .flags = {{"--pipeline-model-parallel-size", Arity::One}},
       .fidelity = Fidelity::Exact,
       .note = "",
       .read = [](MegatronReading& r) { r.q.pp = r.f.integer("--pipeline-model-parallel-size", 1).value_or(1); },
       .emit = [](MegatronEmission& e) { e.flags << " --pipeline-model-parallel-size " << e.p.parallel.pp; },
       .expressed = [](const Plan& p, FieldValues& v) { add(v, "pp", p.parallel.pp); }},
      {.field = "parallel.vpp",
       .flags = {{"--num-layers-per-virtual-pipeline-stage", Arity::One},
                 {"--num-virtual-stages-per-pipeline-rank", Arity::One, "virtual_pipeline_model_parallel_size"},
                 {"--virtual-pipeline-model-parallel-size", Arity::One}},
       .fidelity = Fidelity::Exact,
       .note = "",
       .read = read_virtual_stages,
       .finish = finish_virtual_stages,
       .emit = emit_virtual_stages,
       .expressed = [](const Plan& p, FieldValues& v) { add(v, "vpp", p.parallel.vpp); }},
      {.field = "pipeline",
       .flags = {{"--decoder-first-pipeline-num-layers", Arity::One, "num_layers_in_first_pipeline_stage"},
                 {"--decoder-last-pipeline-num-layers", Arity::One, "num_layers_in_last_pipeline_stage"},
                 {"--account-for-embedding-in-pipeline-split", Arity::Switch},
                 {"--account-for-loss-in-pipeline-split", Arity::Switch},
                 {"--pipeline-model-parallel-layout", Arity::One}},
       .fidelity = Fidelity::Exact,
       .note = "",
       .read = read_pipeline,
       .finish = finish_pipeline,
       .emit = emit_pipeline,
       .expressed = expressed_pipeline},
      // The interleaved schedule's microbatch group (megatron-settings.md section 7; default pp, depth-first).
      {.field = "pipeline.microbatch_group",
       .flags = {{"--microbatch-group-size-per-virtual-pipeline-stage", Arity::One, "microbatch_group_size_per_vp_stage"}},
       .fidelity = Fidelity::Exact,
       .note = "",
       .read = [](MegatronReading& r) {
         r.p.microbatch_group = r.f.integer("--microbatch-group-size-per-virtual-pipeline-stage", 1).value_or(0);
       },
       .finish = [](MegatronFinishing& c) {
         if (c.p.microbatch_group > 0 && c.p.parallel.vpp == 1 && c.notes)
           c.notes->push_back("--microbatch-group-size-per-virtual-pipeline-stage has no effect without virtual pipeline stages");
         if (c.p.parallel.vpp == 1 || c.p.microbatch_group == c.p.parallel.pp) c.p.microbatch_group = 0;  // the default
       },
       .emit = [](MegatronEmission& e) {
         if (e.p.microbatch_group > 0 && e.p.microbatch_group != e.p.parallel.pp)
           e.flags << " --microbatch-group-size-per-virtual-pipeline-stage " << e.p.microbatch_group;
       },
       .expressed = [](const Plan& p, FieldValues& v) {
         add(v, "microbatch_group", microbatch_group_size(p));
       },
       .lcplan = {{"--microbatch-group", "interleaved schedule: microbatches run on one virtual stage before the next (0 = pp)",
                    [](Plan& p, const std::string& t) { p.microbatch_group = parse_int_in(t, "--microbatch-group", 0, 1 << 20); }}}},
      {.field = "parallel.cp",
       .flags = {{"--context-parallel-size", Arity::One}},
       .fidelity = Fidelity::Exact,
       .note = "",
       .read = [](MegatronReading& r) { r.q.cp = r.f.integer("--context-parallel-size", 1).value_or(1); },
       .emit = [](MegatronEmission& e) { e.flags << " --context-parallel-size " << e.p.parallel.cp; },
       .expressed = [](const Plan& p, FieldValues& v) { add(v, "cp", p.parallel.cp); }},
      {.field = "parallel.ep",
       .flags = {{"--expert-model-parallel-size", Arity::One}},
       .fidelity = Fidelity::Exact,
       .note = "",
       .read = [](MegatronReading& r) { r.q.ep = r.f.integer("--expert-model-parallel-size", 1).value_or(1); },
       .emit = [](MegatronEmission& e) { if (e.moe) e.flags << " --expert-model-parallel-size " << e.p.parallel.ep; },
       .expressed = [](const Plan& p, FieldValues& v) { add(v, "ep", p.parallel.ep); }},
      // Expert TP is explicit: Megatron's default is TP (resolved with the model), lcplan's is 1.
      {.field = "parallel.etp",
       .flags = {{"--expert-tensor-parallel-size", Arity::One}},
       .fidelity = Fidelity::Exact,
       .note = "",
       .read = [](MegatronReading& r) {
         if (const auto etp = r.f.integer("--expert-tensor-parallel-size", 1)) r.q.etp = *etp, r.l.etp_given = true;
       },
       .finish = [](MegatronFinishing& c) { if (!c.l.etp_given) c.p.parallel.etp = has_moe(c.m) ? c.p.parallel.tp : 1; },
       .emit = [](MegatronEmission& e) { if (e.moe) e.flags << " --expert-tensor-parallel-size " << e.p.parallel.etp; },
       .expressed = [](const Plan& p, FieldValues& v) { add(v, "etp", p.parallel.etp); }},
      {.field = "sequence_parallel",
       .flags = {{"--sequence-parallel", Arity::Switch}},
       .fidelity = Fidelity::Exact,
       .note = "",
       .read = read_sequence_parallel,
       .emit = emit_sequence_parallel,
       // Sequence parallelism means nothing at tp 1 (tp is compared first).
       .expressed = [](const Plan& p, FieldValues& v) {
         add(v, "sequence_parallel", p.parallel.tp > 1 ? std::to_string(p.sequence_parallel) : "-");
       }},
  };
}

// ---- batch ------------------------------------------------------------------------------------------------------

std::vector<MegatronRow> batch_rows() {
  return {
      {.field = "seq_len",
       .flags = {{"--seq-length", Arity::One}, {"--encoder-seq-length", Arity::One}},
       .fidelity = Fidelity::Exact,
       .note = "",
       .read = [](MegatronReading& r) {
         auto seq = r.f.integer("--seq-length", 1);
         if (!seq) seq = r.f.integer("--encoder-seq-length", 1);
         r.p.seq_len = seq.value_or(0);
       },
       .emit = [](MegatronEmission& e) { e.flags << " --seq-length " << e.p.seq_len; },
       .expressed = [](const Plan& p, FieldValues& v) { add(v, "seq_len", p.seq_len); }},
      // The loader's cu_seqlens (megatron-settings.md section 8): attention within each packed document, whose lengths
      // the flags do not give.
      {.field = "(documents)",
       .flags = {{"--sft", Arity::Switch}, {"--dataloader-inter-document-masking", Arity::Switch}},
       .fidelity = Fidelity::Approximate,
       .note = "packed documents attend within themselves; lcplan counts whole sequences unless --seq-lengths gives them",
       .read = [](MegatronReading& r) {
         for (const char* flag : {"--sft", "--dataloader-inter-document-masking"})
           if (r.f.on(flag))
             r.l.notes.push_back(std::string(flag) + " packs documents that attend only within themselves (THD); lcplan "
                                 "counts whole --seq-length sequences unless --seq-lengths gives the documents' lengths");
       }},
      {.field = "micro_batch",
       .flags = {{"--micro-batch-size", Arity::One}},
       .fidelity = Fidelity::Exact,
       .note = "",
       .read = [](MegatronReading& r) { r.p.micro_batch = r.f.integer("--micro-batch-size", 1).value_or(1); },
       .emit = [](MegatronEmission& e) { e.flags << " --micro-batch-size " << e.p.micro_batch; },
       .expressed = [](const Plan& p, FieldValues& v) { add(v, "micro_batch", p.micro_batch); }},
      // Megatron's default global batch is micro batch x dp, which needs the GPU count.
      {.field = "global_batch",
       .flags = {{"--global-batch-size", Arity::One}},
       .fidelity = Fidelity::Exact,
       .note = "",
       .read = [](MegatronReading& r) {
         if (const auto gb = r.f.integer("--global-batch-size", 1)) r.p.global_batch = *gb, r.l.global_batch_given = true;
       },
       .finish = [](MegatronFinishing& c) {
         const Parallel& q = c.p.parallel;
         if (!c.l.global_batch_given && q.tp > 0 && q.pp > 0 && q.cp > 0 && c.p.gpus % (q.tp * q.pp * q.cp) == 0)
           c.p.global_batch = c.p.micro_batch * (c.p.gpus / (q.tp * q.pp * q.cp));
       },
       .emit = [](MegatronEmission& e) { e.flags << " --global-batch-size " << effective_global_batch(e.p); },
       .expressed = [](const Plan& p, FieldValues& v) { add(v, "global_batch", effective_global_batch(p)); }},
  };
}

// ---- optimizer, offload, recompute, loss --------------------------------------------------------------------------

// Megatron-FSDP's sharding strategy decides (default no_shard); torch FSDP2 refuses the distributed optimizer
// (arguments.py) and is ZeRO-3.
void read_optimizer_sharding(MegatronReading& r) {
  const MegatronFlagSet& f = r.f;
  Plan& p = r.p;
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
      r.l.notes.push_back("--data-parallel-sharding-strategy optim_grads (ZeRO-2) is modelled as dist_opt: gradients "
                          "counted unsharded, an overestimate");
  } else {
    if (strategy) r.l.notes.push_back("--data-parallel-sharding-strategy has no effect without --use-megatron-fsdp");
    p.optimizer_sharding = fsdp2 ? OptimizerSharding::Fsdp : dist ? OptimizerSharding::DistOpt : OptimizerSharding::None;
  }
  if (f.on("--overlap-param-gather") && p.optimizer_sharding == OptimizerSharding::None && !mfsdp)
    throw UserError("--overlap-param-gather needs --use-distributed-optimizer (Megatron gathers parameters only when "
                    "they are sharded; add it or drop the overlap)");
}

void emit_optimizer_sharding(MegatronEmission& e) {
  switch (e.p.optimizer_sharding) {
    case OptimizerSharding::None: break;
    case OptimizerSharding::DistOpt: e.flags << " --use-distributed-optimizer"; break;
    case OptimizerSharding::Fsdp:
      e.flags << " --use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params --use-distributed-optimizer"
                 " --no-gradient-accumulation-fusion";
      e.comments.push_back("# fsdp: Megatron-FSDP (optim_grads_params = ZeRO-3) shards experts over the expert-data-parallel "
                           "group as lcplan models; Megatron-LM's --use-torch-fsdp2 path refuses the distributed optimizer "
                           "and is not used here");
      break;
  }
}

// Optimizer state offload: fraction 1 (Megatron's default) offloads all of it.
void read_optimizer_offload(MegatronReading& r) {
  const MegatronFlagSet& f = r.f;
  if (f.on("--optimizer-cpu-offload")) {
    // The fraction's argument default is 1.0 (arguments.py; the config dataclass's 0.0 applies to Megatron-Bridge).
    const double frac = f.number("--optimizer-offload-fraction", 0, 1, "0 to 1").value_or(1.0);
    r.p.offload.optimizer = frac > 0;
    r.p.offload.optimizer_fraction = frac > 0 ? frac : 1.0;
    if (frac == 0) r.l.notes.push_back("--optimizer-offload-fraction 0 offloads nothing");
  } else if (f.has("--optimizer-offload-fraction")) {
    f.number("--optimizer-offload-fraction", 0, 1, "0 to 1");
    r.l.notes.push_back("--optimizer-offload-fraction has no effect without --optimizer-cpu-offload");
  }
}

// Activation offload: no pipeline parallelism (transformer_config.py); the layer count needs the model.
void read_activation_offload(MegatronReading& r) {
  r.p.offload.activations = r.f.on("--cpu-offloading");
  r.l.cpu_offloading_layers = r.f.integer("--cpu-offloading-num-layers", 0).value_or(-1);
  if (r.p.offload.activations && r.q.pp > 1)
    throw UserError("--cpu-offloading contradicts --pipeline-model-parallel-size " + std::to_string(r.q.pp) +
                    " (Megatron offloads activations only without pipeline parallelism; give one)");
  if (!r.p.offload.activations && r.l.cpu_offloading_layers >= 0)
    r.l.notes.push_back("--cpu-offloading-num-layers has no effect without --cpu-offloading");
}

// --cpu-offloading-num-layers defaults to 0 (no layer offloaded) and is at most layers - 1 (transformer_config.py).
void finish_activation_offload(MegatronFinishing& c) {
  if (!c.p.offload.activations) return;
  const int n = std::max(0, c.l.cpu_offloading_layers);
  if (n >= c.layers)
    throw UserError("--cpu-offloading-num-layers " + std::to_string(n) + " is out of range (valid: 0 to " +
                    std::to_string(c.layers - 1) + ", fewer than the model's " + std::to_string(c.layers) + " layers)");
  if (n == 0) c.p.offload.activations = false;
  if (c.notes && n == 0)
    c.notes->push_back("--cpu-offloading with --cpu-offloading-num-layers 0 (Megatron's default) offloads no layer");
  else if (c.notes && n < c.layers - 1)
    c.notes->push_back("--cpu-offloading-num-layers " + std::to_string(n) + " is modelled as every layer's activations offloaded");
}

void emit_activation_offload(MegatronEmission& e) {
  if (!e.p.offload.activations) return;
  e.flags << " --cpu-offloading --cpu-offloading-num-layers " << e.layers - 1;
  if (e.p.parallel.pp > 1)
    e.comments.push_back("# Megatron's --cpu-offloading does not support pipeline parallelism (pp = " +
                         std::to_string(e.p.parallel.pp) + ")");
}

// Full recompute needs a method and a layer count (transformer_config.py); block recomputes the first N layers of
// each virtual stage, uniform keeps one checkpoint per N layers.
void read_full_recompute(MegatronReading& r, const std::optional<std::string>& method, const std::optional<int>& layers,
                         bool modules) {
  r.p.recompute = Recompute::Full;
  if (!method)
    throw UserError("--recompute-granularity full needs --recompute-method (uniform or block; Megatron refuses full "
                    "recompute without one)");
  if (!layers)
    throw UserError("--recompute-method " + *method + " needs --recompute-num-layers (1 for uniform, or for block the "
                    "layers per virtual stage to recompute)");
  if (*method == "block") {
    r.p.recompute_layers = *layers;
  } else if (*layers > 1) {  // one checkpoint per `layers` layers, every layer recomputed
    r.p.recompute_method = RecomputeMethod::Uniform;
    r.p.recompute_layers = *layers;
  }
  if (modules) r.l.notes.push_back("--recompute-modules has no effect with --recompute-granularity full");
}

// Selective recompute takes no layer count; its modules default to core_attn (transformer_config.py).
void read_selective_recompute(MegatronReading& r, const std::optional<std::string>& method, const std::optional<int>& layers,
                              const std::optional<std::vector<std::string>>& modules) {
  r.p.recompute = Recompute::Selective;
  if (layers)
    throw UserError("--recompute-num-layers contradicts --recompute-granularity selective (Megatron takes a layer count "
                    "only for full recompute; give one)");
  if (method) r.l.notes.push_back("--recompute-method has no effect with --recompute-granularity selective");
  if (!modules) return;  // Megatron's default, core_attn (transformer_config.py __post_init__): the implementation's
  r.p.assumed &= ~kFieldRecomputeModules;
  // Modules Megatron-LM has for layers lcplan's zoo does not build (gated DeltaProduct, HyperConnection) or whose
  // tensors lcplan does not count separately: read, with a note, as dropping nothing.
  static const std::set<std::string> unmodelled = {"gdn_norm_out", "gdp_in_proj", "gdp_qkv", "mhc"};
  std::vector<std::string> mods;
  for (const auto& mod : *modules) {
    if (!unmodelled.count(mod)) mods.push_back(mod);
    else r.l.notes.push_back("--recompute-modules " + mod + " is not modelled (lcplan counts its tensors as kept)");
  }
  r.p.recompute_modules = parse_modules(mods, recompute_module_names(), "--recompute-modules");
}

void read_recompute(MegatronReading& r) {
  const MegatronFlagSet& f = r.f;
  auto gran = f.choice("--recompute-granularity", {"full", "selective"});
  if (f.on("--recompute-activations")) {
    if (gran && *gran != "selective")
      throw UserError("--recompute-activations contradicts --recompute-granularity " + *gran +
                      " (--recompute-activations means selective; give one)");
    gran = "selective";
  }
  const auto method = f.choice("--recompute-method", {"uniform", "block"});
  const auto layers = f.integer("--recompute-num-layers", 1);
  const auto modules = f.list("--recompute-modules");
  if (gran && *gran == "full") read_full_recompute(r, method, layers, modules.has_value());
  else if (gran && *gran == "selective") read_selective_recompute(r, method, layers, modules);
  else if (method || layers || modules)
    r.l.notes.push_back(std::string(method ? "--recompute-method" : layers ? "--recompute-num-layers" : "--recompute-modules") +
                        " has no effect without --recompute-granularity");
}

void emit_recompute(MegatronEmission& e) {
  switch (e.p.recompute) {
    case Recompute::None: break;
    case Recompute::Selective:
      e.flags << " --recompute-granularity selective --recompute-modules "
              << join_words(module_list(e.p.recompute_modules, recompute_module_names()));
      break;
    case Recompute::Full:
      e.flags << " --recompute-granularity full --recompute-method ";
      if (e.p.recompute_method == RecomputeMethod::Uniform && e.p.recompute_layers > 1)
        e.flags << "uniform --recompute-num-layers " << e.p.recompute_layers;
      else if (e.p.recompute_layers > 0 && e.p.recompute_method == RecomputeMethod::Block)
        e.flags << "block --recompute-num-layers " << e.p.recompute_layers;
      else
        e.flags << "uniform --recompute-num-layers 1";
      break;
  }
}

void read_linear_ce(MegatronReading& r) {
  const bool fusion = r.f.on("--cross-entropy-loss-fusion");
  const auto impl = r.f.choice("--cross-entropy-fusion-impl", {"native", "te", "linear"});
  r.p.linear_ce = fusion && impl && *impl == "linear";
  if (impl && *impl == "linear" && !fusion)
    r.l.notes.push_back("--cross-entropy-fusion-impl linear has no effect without --cross-entropy-loss-fusion (logits are materialized)");
}

void emit_linear_ce(MegatronEmission& e) {
  if (!e.p.linear_ce) return;
  e.flags << " --cross-entropy-loss-fusion --cross-entropy-fusion-impl linear";
  e.comments.push_back("# linear CE: --cross-entropy-fusion-impl linear needs Megatron-LM's development branch (PRs #2256, "
                       "#2739, #3345); released versions accept only native and te");
}

std::vector<MegatronRow> optimizer_rows() {
  return {
      {.field = "optimizer_sharding",
       .flags = {{"--use-distributed-optimizer", Arity::Switch}, {"--use-torch-fsdp2", Arity::Switch},
                 {"--use-megatron-fsdp", Arity::Switch}, {"--data-parallel-sharding-strategy", Arity::One},
                 {"--no-gradient-accumulation-fusion", Arity::Switch}},
       .fidelity = Fidelity::Exact,
       .note = "",
       .read = read_optimizer_sharding,
       .emit = emit_optimizer_sharding,
       .expressed = [](const Plan& p, FieldValues& v) { add(v, "optimizer_sharding", to_string(p.optimizer_sharding)); }},
      // Partial distributed optimizer: the state sharded over DP / N ranks, N copies (megatron-settings.md section 1).
      {.field = "optimizer.instances",
       .flags = {{"--num-distributed-optimizer-instances", Arity::One}},
       .fidelity = Fidelity::Exact,
       .note = "",
       .read = [](MegatronReading& r) {
         r.p.optimizer.instances = r.f.integer("--num-distributed-optimizer-instances", 1).value_or(1);
       },
       .emit = [](MegatronEmission& e) {
         if (e.p.optimizer.instances > 1) e.flags << " --num-distributed-optimizer-instances " << e.p.optimizer.instances;
       },
       .expressed = [](const Plan& p, FieldValues& v) { add(v, "optimizer.instances", p.optimizer.instances); },
       .lcplan = {{"--dist-opt-instances", "distributed-optimizer instances: the state sharded over DP / N, N copies",
                    [](Plan& p, const std::string& t) { p.optimizer.instances = parse_int_in(t, "--dist-opt-instances", 1, 1024); }}}},
      {.field = "(optimizer)",
       .flags = {{"--optimizer", Arity::One}},
       .fidelity = Fidelity::Approximate,
       .note = "lcplan models Adam (12 bytes of state per parameter) for every optimizer",
       .read = [](MegatronReading& r) {
         if (const auto opt = r.f.text("--optimizer"); opt && *opt != "adam")
           r.l.notes.push_back("--optimizer " + *opt + " is modelled as Adam (12 bytes of state per parameter)");
       }},
      {.field = "offload.optimizer",
       .flags = {{"--optimizer-cpu-offload", Arity::Switch}, {"--optimizer-offload-fraction", Arity::One}},
       .fidelity = Fidelity::Exact,
       .note = "",
       .read = read_optimizer_offload,
       .emit = [](MegatronEmission& e) {
         if (!e.p.offload.optimizer) return;
         e.flags << " --optimizer-cpu-offload --optimizer-offload-fraction "
                 << number_text(e.p.offload.optimizer_fraction);
       },
       .expressed = [](const Plan& p, FieldValues& v) {
         add(v, "offload.optimizer", p.offload.optimizer);
         add(v, "offload.optimizer_fraction", p.offload.optimizer ? p.offload.optimizer_fraction : 0.0);
       },
       .lcplan = {{"--offload-fraction", "with --offload-optimizer: the share of optimizer state on the host",
                    [](Plan& p, const std::string& t) {
                      p.offload.optimizer_fraction = parse_number(t, "--offload-fraction", 0, 1, "above 0, up to 1");
                    }}}},
      {.field = "offload.activations",
       .flags = {{"--cpu-offloading", Arity::Switch}, {"--cpu-offloading-num-layers", Arity::One}},
       .fidelity = Fidelity::Exact,
       .note = "",
       .read = read_activation_offload,
       .finish = finish_activation_offload,
       .emit = emit_activation_offload,
       .expressed = [](const Plan& p, FieldValues& v) { add(v, "offload.activations", p.offload.activations); }},
      {.field = "recompute, recompute_layers",
       .flags = {{"--recompute-granularity", Arity::One}, {"--recompute-method", Arity::One},
                 {"--recompute-num-layers", Arity::One}, {"--recompute-modules", Arity::List},
                 {"--recompute-activations", Arity::Switch}},
       .fidelity = Fidelity::Exact,
       .note = "",
       .read = read_recompute,
       .emit = emit_recompute,
       .expressed = [](const Plan& p, FieldValues& v) {
         add(v, "recompute", to_string(p.recompute));
         const bool uniform = p.recompute_method == RecomputeMethod::Uniform && p.recompute_layers > 1;
         add(v, "recompute_method", uniform ? "uniform" : "block");
         add(v, "recompute_layers", uniform || p.recompute_method == RecomputeMethod::Block ? p.recompute_layers : 0);
         add(v, "recompute_modules", p.recompute == Recompute::Selective ? module_text(p.recompute_modules, recompute_module_names()) : "-");
       },
       .lcplan = {{"--recompute-modules",
                    "selective recompute modules, comma-separated: core_attn, layernorm, mla_up_proj, moe_act, mlp, moe, shared_experts",
                    [](Plan& p, const std::string& t) {
                      p.recompute_modules = parse_modules(split_commas(t), recompute_module_names(), "--recompute-modules");
                      p.assumed &= ~kFieldRecomputeModules;
                    }},
                   {"--recompute-method", "full recompute: block (first N layers) or uniform (N layers per checkpoint)",
                    [](Plan& p, const std::string& t) { p.recompute_method = parse_recompute_method(t); }}}},
      // Full recompute's checkpoints split over TP without sequence parallelism (megatron-settings.md section 2).
      {.field = "distribute_saved_activations",
       .flags = {{"--distribute-saved-activations", Arity::Switch}},
       .fidelity = Fidelity::Exact,
       .note = "",
       .read = [](MegatronReading& r) { r.p.distribute_saved_activations = r.f.on("--distribute-saved-activations"); },
       .emit = [](MegatronEmission& e) {
         if (e.p.distribute_saved_activations) e.flags << " --distribute-saved-activations";
       },
       .expressed = [](const Plan& p, FieldValues& v) { add(v, "distribute_saved_activations", p.distribute_saved_activations); },
       .lcplan = {{"--distribute-saved-activations",
                   "on or off: full recompute's checkpoints split over the TP ranks (tp > 1 without sequence parallelism)",
                   [](Plan& p, const std::string& t) {
                     p.distribute_saved_activations = parse_on_off(t, "--distribute-saved-activations");
                   }}}},
      {.field = "linear_ce",
       .flags = {{"--cross-entropy-loss-fusion", Arity::Switch}, {"--cross-entropy-fusion-impl", Arity::One}},
       .fidelity = Fidelity::Exact,
       .note = "",
       .read = read_linear_ce,
       .emit = emit_linear_ce,
       .expressed = [](const Plan& p, FieldValues& v) { add(v, "linear_ce", p.linear_ce); }},
  };
}

// ---- MoE and precision ------------------------------------------------------------------------------------------

// The dispatcher's default is allgather, the flex dispatcher's backend DeepEP (megatron/training/arguments.py); the
// deprecated --moe-enable-deepep is flex with DeepEP.
void read_dispatcher(MegatronReading& r) {
  auto dispatcher = r.f.choice("--moe-token-dispatcher-type", {"alltoall", "allgather", "flex", "alltoall_seq"});
  const auto backend = r.f.choice("--moe-flex-dispatcher-backend", {"deepep", "hybridep", "ncclep"});
  if (r.f.on("--moe-enable-deepep")) dispatcher = "flex";
  if (!dispatcher) {
    if (backend) r.l.notes.push_back("--moe-flex-dispatcher-backend has no effect without --moe-token-dispatcher-type flex");
    return;  // Megatron's allgather: the implementation's default (Plan::assumed)
  }
  r.p.assumed &= ~kFieldDispatcher;
  if (*dispatcher == "allgather") r.p.moe.dispatcher = MoeDispatcher::AllGather;
  else if (*dispatcher != "flex") r.p.moe.dispatcher = MoeDispatcher::AllToAll;
  else r.p.moe.dispatcher = backend && *backend == "hybridep" ? MoeDispatcher::HybridEP : MoeDispatcher::DeepEP;
  if (*dispatcher == "alltoall_seq") r.l.notes.push_back("--moe-token-dispatcher-type alltoall_seq is modelled as alltoall");
  if (backend && *backend == "ncclep") r.l.notes.push_back("--moe-flex-dispatcher-backend ncclep is modelled as DeepEP");
  if (backend && *dispatcher != "flex")
    r.l.notes.push_back("--moe-flex-dispatcher-backend has no effect without --moe-token-dispatcher-type flex");
}

void emit_dispatcher(MegatronEmission& e) {
  if (!e.moe) return;
  e.flags << " --moe-grouped-gemm";  // the expert GEMMs the calibration's grouped_gemm_efficiency stands for
  if (e.p.parallel.ep <= 1) return;
  switch (e.p.moe.dispatcher) {
    case MoeDispatcher::AllToAll: e.flags << " --moe-token-dispatcher-type alltoall"; break;
    case MoeDispatcher::AllGather: e.flags << " --moe-token-dispatcher-type allgather"; break;
    case MoeDispatcher::DeepEP: e.flags << " --moe-token-dispatcher-type flex --moe-flex-dispatcher-backend deepep"; break;
    case MoeDispatcher::HybridEP: e.flags << " --moe-token-dispatcher-type flex --moe-flex-dispatcher-backend hybridep"; break;
  }
}

// Capacity = ceil(tokens / experts x factor); padding to it only with --moe-pad-expert-input-to-capacity (moe_utils.py).
void read_capacity(MegatronReading& r) {
  if (const auto cf = r.f.number("--moe-expert-capacity-factor", 0, 64, "a positive capacity factor, up to 64")) {
    r.p.moe.capacity_factor = *cf;
    r.p.moe.pad_to_capacity = r.f.on("--moe-pad-expert-input-to-capacity");
    r.p.assumed &= ~kFieldPadToCapacity;
  } else if (r.f.on("--moe-pad-expert-input-to-capacity")) {
    throw UserError("--moe-pad-expert-input-to-capacity needs --moe-expert-capacity-factor (Megatron pads to a capacity "
                    "only when one is set; add it)");
  }
}

// fp8 and fp4 recipes are alternatives; fp8's default recipe is delayed scaling.
void read_precision(MegatronReading& r) {
  const MegatronFlagSet& f = r.f;
  std::vector<std::string>& notes = r.l.notes;
  const auto fp8 = f.choice("--fp8-format", {"e4m3", "hybrid"});
  const auto fp4 = f.choice("--fp4-format", {"e2m1"});
  const auto fp8_recipe = f.choice("--fp8-recipe", {"tensorwise", "delayed", "blockwise", "mxfp8"});
  const auto fp4_recipe = f.choice("--fp4-recipe", {"nvfp4"});
  if (fp8 && fp4) throw UserError("--fp8-format " + *fp8 + " contradicts --fp4-format " + *fp4 + " (one GEMM format per run; give one)");
  const bool bf16 = f.on("--bf16"), fp16 = f.on("--fp16");
  if (bf16 && fp16) throw UserError("--bf16 contradicts --fp16 (give one)");
  if (fp8 && fp8_recipe && *fp8_recipe != "mxfp8") r.p.fp8.recipe = parse_fp8_recipe(*fp8_recipe), r.p.assumed &= ~kFieldFp8Recipe;
  if (fp8) r.p.precision = fp8_recipe && *fp8_recipe == "mxfp8" ? Precision::MXFP8 : Precision::FP8;
  else if (fp4) r.p.precision = Precision::NVFP4;
  else if (fp8_recipe) notes.push_back("--fp8-recipe has no effect without --fp8-format (the run trains in bf16)");
  if (fp4_recipe && !fp4) notes.push_back("--fp4-recipe has no effect without --fp4-format");
  if (fp16) notes.push_back("--fp16 is modelled as bf16 (same bytes per value)");
  if (!bf16 && !fp16) notes.push_back("neither --bf16 nor --fp16 is given: Megatron trains in fp32, lcplan models bf16");
}

void emit_precision(MegatronEmission& e) {
  switch (e.p.precision) {
    case Precision::BF16: break;
    case Precision::FP8: e.flags << " --fp8-format hybrid --fp8-recipe " << to_string(e.p.fp8.recipe); break;
    case Precision::MXFP8: e.flags << " --fp8-format e4m3 --fp8-recipe mxfp8"; break;
    case Precision::NVFP4: e.flags << " --fp4-format e2m1 --fp4-recipe nvfp4"; break;
  }
  e.flags << " --bf16";
}

std::vector<MegatronRow> moe_and_precision_rows() {
  return {
      {.field = "moe.dispatcher",
       .flags = {{"--moe-token-dispatcher-type", Arity::One}, {"--moe-flex-dispatcher-backend", Arity::One},
                 {"--moe-enable-deepep", Arity::Switch}, {"--moe-grouped-gemm", Arity::Switch}},
       .fidelity = Fidelity::Exact,
       .note = "",
       .read = read_dispatcher,
       .emit = emit_dispatcher,
       // The dispatcher means nothing without expert parallelism (ep is compared first).
       .expressed = [](const Plan& p, FieldValues& v) {
         add(v, "moe.dispatcher", p.parallel.ep > 1 ? to_string(p.moe.dispatcher) : "-");
       }},
      {.field = "moe.a2a_overlap",
       .flags = {{"--overlap-moe-expert-parallel-comm", Arity::Switch}, {"--delay-wgrad-compute", Arity::Switch}},
       .fidelity = Fidelity::Exact,
       .note = "",
       .read = [](MegatronReading& r) {
         r.p.moe.a2a_overlap = r.f.on("--overlap-moe-expert-parallel-comm");
         if (r.f.on("--delay-wgrad-compute") && !r.p.moe.a2a_overlap)
           r.l.notes.push_back("--delay-wgrad-compute has no effect without --overlap-moe-expert-parallel-comm");
       },
       .emit = [](MegatronEmission& e) {
         if (e.moe && e.p.parallel.ep > 1 && e.p.moe.a2a_overlap) e.flags << " --overlap-moe-expert-parallel-comm --delay-wgrad-compute";
       },
       .expressed = [](const Plan& p, FieldValues& v) { add(v, "moe.a2a_overlap", p.moe.a2a_overlap); }},
      // Megatron trains MTP modules only with --mtp-num-layers; the plan keeps -1 (the model's) when they agree.
      {.field = "mtp_layers",
       .flags = {{"--mtp-num-layers", Arity::One}},
       .fidelity = Fidelity::Exact,
       .note = "",
       .read = [](MegatronReading& r) { r.l.mtp_layers = r.f.integer("--mtp-num-layers", 0).value_or(-1); },
       .finish = [](MegatronFinishing& c) {
         const int mtp = std::max(0, c.l.mtp_layers);
         c.p.mtp_layers = mtp == c.m.mtp_layers ? -1 : mtp;
       },
       .emit = [](MegatronEmission& e) { if (e.mtp > 0) e.flags << " --mtp-num-layers " << e.mtp; },
       .expressed = [](const Plan& p, FieldValues& v) { add(v, "mtp_layers", p.mtp_layers); }},
      {.field = "moe.capacity_factor, moe.pad_to_capacity",
       .flags = {{"--moe-expert-capacity-factor", Arity::One}, {"--moe-pad-expert-input-to-capacity", Arity::Switch}},
       .fidelity = Fidelity::Exact,
       .note = "",
       .read = read_capacity,
       .emit = [](MegatronEmission& e) {
         if (e.p.moe.capacity_factor <= 0) return;
         e.flags << " --moe-expert-capacity-factor " << number_text(e.p.moe.capacity_factor);
         if (e.p.moe.pad_to_capacity) e.flags << " --moe-pad-expert-input-to-capacity";
       },
       .expressed = [](const Plan& p, FieldValues& v) {
         add(v, "moe.capacity_factor", p.moe.capacity_factor);
         add(v, "moe.pad_to_capacity", p.moe.capacity_factor > 0 ? std::to_string(p.moe.pad_to_capacity) : "-");
       },
       .lcplan = {{"--pad-to-capacity", "on or off: token dropping pads experts to capacity",
                    [](Plan& p, const std::string& t) {
                      p.moe.pad_to_capacity = parse_on_off(t, "--pad-to-capacity"), p.assumed &= ~kFieldPadToCapacity;
                    }}}},
      // HybridEP's per-rank token budget and the paged stash of expert activations: together a dropless HybridEP layer
      // gets static buffers and full_iteration graphs capture it (megatron-settings.md sections 4 and 5).
      {.field = "moe.rank_capacity_factor, moe.paged_stash",
       .flags = {{"--moe-expert-rank-capacity-factor", Arity::One}, {"--moe-paged-stash", Arity::Switch}},
       .fidelity = Fidelity::Exact,
       .note = "",
       .read = [](MegatronReading& r) {
         if (const auto f = r.f.number("--moe-expert-rank-capacity-factor", 0, 64, "a positive per-rank capacity factor, up to 64"))
           r.p.moe.rank_capacity_factor = *f;
         r.p.moe.paged_stash = r.f.on("--moe-paged-stash");
       },
       .emit = [](MegatronEmission& e) {
         if (e.p.moe.rank_capacity_factor > 0)
           e.flags << " --moe-expert-rank-capacity-factor " << number_text(e.p.moe.rank_capacity_factor);
         if (e.p.moe.paged_stash) e.flags << " --moe-paged-stash";
       },
       .expressed = [](const Plan& p, FieldValues& v) {
         add(v, "moe.rank_capacity_factor", p.moe.rank_capacity_factor);
         add(v, "moe.paged_stash", p.moe.paged_stash);
       },
       .lcplan = {{"--rank-capacity-factor", "HybridEP: a rank receives at most this x its balanced routed tokens (0 = no budget)",
                    [](Plan& p, const std::string& t) {
                      p.moe.rank_capacity_factor =
                          parse_number(t, "--rank-capacity-factor", 0, 64, "0 = no per-rank budget, or up to 64");
                    }},
                   {"--paged-stash", "on or off: HybridEP's expert activations in a paged stash (static buffers)",
                    [](Plan& p, const std::string& t) { p.moe.paged_stash = parse_on_off(t, "--paged-stash"); }}}},
      {.field = "precision",
       .flags = {{"--bf16", Arity::Switch}, {"--fp16", Arity::Switch}, {"--fp8-format", Arity::One, "fp8"},
                 {"--fp8-recipe", Arity::One}, {"--fp4-format", Arity::One, "fp4"}, {"--fp4-recipe", Arity::One}},
       .fidelity = Fidelity::Exact,
       .note = "",
       .read = read_precision,
       .emit = emit_precision,
       .expressed = [](const Plan& p, FieldValues& v) {
         add(v, "precision", to_string(p.precision));
         add(v, "fp8.recipe", p.precision == Precision::FP8 ? to_string(p.fp8.recipe) : "-");
       },
       .lcplan = {{"--fp8-recipe", "fp8 scaling: tensorwise, delayed or blockwise",
                    [](Plan& p, const std::string& t) { p.fp8.recipe = parse_fp8_recipe(t), p.assumed &= ~kFieldFp8Recipe; }}}},
  };
}

// ---- fields without a Megatron flag, and the model's shape ----------------------------------------------------------

void emit_ep_chunks(MegatronEmission& e) {
  const int chunks = e.p.moe.ep_chunks;
  if (e.p.parallel.ep > 1 && chunks > 1)
    e.comments.push_back("# ep_chunks " + std::to_string(chunks) +
                         ": chunking one MoE layer's all-to-all under its expert GEMMs is lcplan's/bumblebee's schedule (no "
                         "Megatron flag); Megatron's nearest is the cross-microbatch overlap, "
                         "--overlap-moe-expert-parallel-comm (plan moe.a2a_overlap)");
  if (chunks > 1) e.no_flag.push_back("ep_chunks " + std::to_string(chunks));
}

// A plan's variable-length batches: packed THD microbatches under a token budget. Megatron-LM reads packed data
// through PackedSeqParams, and its token-budget scheduler (data_schedule.py DpBalancedScheduler, set by
// config.sequence_packing_scheduler) has no command-line flag on main (../README "Megatron-LM interop").
void emit_batches(MegatronEmission& e) {
  if (!e.p.batches) return;
  const PackingOptions& o = e.p.batches->packing;
  std::ostringstream c;
  c << "# batches: sequences of " << e.p.batches->lengths.lengths.size() << " distinct lengths up to "
    << e.p.batches->lengths.max_length() << " tokens packed (THD)";
  if (o.tokens_per_microbatch > 0)
    c << " into microbatches of at most " << o.tokens_per_microbatch << " tokens per GPU (" << to_string(o.policy)
      << "); Megatron-LM: max_seqlen_per_dp_cp_rank " << o.tokens_per_microbatch
      << " of its sequence-packing scheduler (no command-line flag); verl: use_dynamic_bsz, ppo_max_token_len_per_gpu "
      << o.tokens_per_microbatch;
  e.comments.push_back(c.str());
  e.no_flag.push_back("batches");
}

std::vector<MegatronRow> no_flag_rows() {
  return {
      {.field = "hardware",
       .fidelity = Fidelity::NoFlag,
       .note = "the GPU a launch runs on is the cluster's, not a flag",
       .emit = [](MegatronEmission& e) { e.no_flag.push_back("hardware " + e.p.hardware); }},
      {.field = "gpus_per_node",
       .fidelity = Fidelity::NoFlag,
       .note = "the NVLink domain, which is not --nproc-per-node on NVL72",
       .emit = [](MegatronEmission& e) { e.no_flag.push_back("gpus_per_node"); }},
      {.field = "moe.routing_imbalance",
       .fidelity = Fidelity::NoFlag,
       .note = "the auxiliary-loss router's busiest rank over the mean: a modelling input (forced balance is 1)",
       .emit = [](MegatronEmission& e) {
         if (!e.moe || e.p.moe.routing == Routing::Forced) return;
         std::ostringstream o;
         o << "routing_imbalance " << e.p.moe.routing_imbalance << " (the auxiliary-loss router's)";
         e.no_flag.push_back(o.str());
       }},
      {.field = "implementation",
       .fidelity = Fidelity::NoFlag,
       .note = "the calibration profile of the framework that runs the plan",
       .emit = [](MegatronEmission& e) { e.no_flag.push_back("implementation " + e.p.implementation); }},
      {.field = "batches",
       .fidelity = Fidelity::NoFlag,
       .note = "packed variable-length microbatches by token budget: Megatron-LM's sequence-packing scheduler has no flag",
       .emit = emit_batches},
      {.field = "moe.ep_chunks",
       .fidelity = Fidelity::NoFlag,
       .note = "chunking one layer's all-to-all under its own expert GEMMs is lcplan's/bumblebee's schedule; it reads back as 1",
       .emit = emit_ep_chunks},
      // Read by model_from_flags and written by megatron_model_flags (search/megatron_args.h): the model, not the plan.
      {.field = "model (not a plan field)",
       .flags = {{"--num-layers", Arity::One}, {"--hidden-size", Arity::One}, {"--ffn-hidden-size", Arity::One},
                 {"--num-attention-heads", Arity::One}, {"--group-query-attention", Arity::Switch},
                 {"--num-query-groups", Arity::One}, {"--kv-channels", Arity::One}, {"--vocab-size", Arity::One},
                 {"--padded-vocab-size", Arity::One}, {"--make-vocab-size-divisible-by", Arity::One},
                 {"--untie-embeddings-and-output-weights", Arity::Switch, "!share_embeddings_and_output_weights"},
                 {"--swiglu", Arity::Switch, "gated_linear_unit"}, {"--normalization", Arity::One},
                 {"--position-embedding-type", Arity::One}, {"--max-position-embeddings", Arity::One},
                 {"--rotary-percent", Arity::One}, {"--qk-layernorm", Arity::Switch}, {"--add-qkv-bias", Arity::Switch},
                 {"--disable-bias-linear", Arity::Switch}, {"--multi-latent-attention", Arity::Switch},
                 {"--q-lora-rank", Arity::One}, {"--kv-lora-rank", Arity::One}, {"--qk-head-dim", Arity::One},
                 {"--qk-pos-emb-head-dim", Arity::One}, {"--v-head-dim", Arity::One},
                 {"--num-experts", Arity::One, "num_moe_experts"}, {"--moe-router-topk", Arity::One},
                 {"--moe-ffn-hidden-size", Arity::One}, {"--moe-shared-expert-intermediate-size", Arity::One},
                 {"--moe-shared-expert-gate", Arity::Switch}, {"--moe-router-score-function", Arity::One},
                 {"--moe-router-num-groups", Arity::One}, {"--moe-router-group-topk", Arity::One},
                 {"--moe-layer-freq", Arity::One}, {"--moe-latent-size", Arity::One}},
       .fidelity = Fidelity::Exact,
       .note = ""},
  };
}

}  // namespace

const std::vector<MegatronRow>& megatron_rows() {
  static const std::vector<MegatronRow> rows = [] {
    std::vector<MegatronRow> all;
    for (auto group : {parallel_rows, batch_rows, optimizer_rows, moe_and_precision_rows, run_setting_rows, no_flag_rows})
      for (MegatronRow& r : group()) all.push_back(std::move(r));
    return all;
  }();
  return rows;
}

const MegatronFlag* find_megatron_flag(const std::string& name) {
  static const std::map<std::string, const MegatronFlag*> by_name = [] {
    std::map<std::string, const MegatronFlag*> m;
    for (const MegatronRow& r : megatron_rows())
      for (const MegatronFlag& f : r.flags) m[f.name] = &f;
    return m;
  }();
  const auto it = by_name.find(name);
  return it == by_name.end() ? nullptr : it->second;
}

const MegatronFlag* find_bridge_field(const std::string& field) {
  static const std::map<std::string, const MegatronFlag*> by_field = [] {
    std::map<std::string, const MegatronFlag*> m;
    for (const MegatronRow& r : megatron_rows())
      for (const MegatronFlag& f : r.flags)
        if (f.bridge) m[f.bridge[0] == '!' ? f.bridge + 1 : f.bridge] = &f;
    return m;
  }();
  if (const auto it = by_field.find(field); it != by_field.end()) return it->second;
  std::string flag = "--" + field;
  std::replace(flag.begin(), flag.end(), '_', '-');
  return find_megatron_flag(flag);
}

const std::vector<std::string>& megatron_flags_without_effect() {
  static const std::vector<std::string> f = {
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
      "--moe-router-fusion", "--moe-aux-loss-coeff",
      "--moe-z-loss-coeff", "--moe-router-pre-softmax", "--moe-token-drop-policy",
      "--moe-router-bias-update-rate", "--moe-router-topk-scaling-factor", "--moe-router-enable-expert-bias",
      "--moe-shared-expert-overlap", "--moe-use-legacy-grouped-gemm", "--moe-per-layer-logging",
      "--moe-layer-recompute", "--manual-gc", "--manual-gc-interval", "--rotary-base",
      "--rotary-scaling-factor", "--use-rotary-position-embeddings", "--rotary-interleaved",
      "--ckpt-fully-parallel-save", "--ckpt-fully-parallel-load", "--async-save", "--no-create-attention-mask-in-dataloader",
      "--num-workers", "--dataloader-type", "--eod-mask-loss", "--reset-position-ids", "--reset-attention-mask",
      "--norm-epsilon", "--apply-layernorm-1p", "--fp8-amax-history-len",
      "--fp8-amax-compute-algo", "--fp8-margin", "--rerun-mode", "--check-for-nan-in-loss-and-grad",
      "--profile", "--profile-step-start", "--profile-step-end",
      "--profile-ranks", "--use-pytorch-profiler", "--nccl-communicator-config-path", "--tp-comm-bootstrap-backend",
      "--enable-experimental", "--defer-embedding-wgrad-compute", "--wgrad-deferral-limit", "--align-grad-reduce",
      "--align-param-gather", "--ddp-bucket-size", "--ddp-average-in-collective", "--mtp-loss-scaling-factor",
      "--mscale", "--mscale-all-dim", "--beta-fast", "--beta-slow", "--original-max-position-embeddings",
      "--sgd-momentum", "--num-dataset-builder-threads", "--no-mmap-bin-files",
      "--overlap-p2p-communication", "--no-overlap-p2p-communication", "--use-cpu-initialization",
      "--empty-unused-memory-level", "--cross-entropy-loss-fusion-impl", "--log-straggler", "--no-persist-layer-norm",
      "--hybrid-override-pattern", "--cpu-offloading-activations", "--cpu-offloading-weights",
      "--first-last-layers-bf16", "--num-layers-at-start-in-bf16", "--num-layers-at-end-in-bf16",
      "--moe-router-padding-for-fp8", "--moe-router-padding-for-quantization", "--gradient-accumulation-fusion",
      "--no-async-tensor-model-parallel-allreduce", "--use-legacy-models", "--spec", "--cuda-graph-warmup-steps",
  };
  return f;
}

bool megatron_flag_without_effect(const std::string& name) {
  static const std::set<std::string> s(megatron_flags_without_effect().begin(), megatron_flags_without_effect().end());
  return s.count(name) > 0;
}

std::vector<std::pair<std::string, std::vector<std::string>>> bridge_mixed_precision_flags(const std::string& recipe) {
  std::vector<std::pair<std::string, std::vector<std::string>>> out;
  auto has = [&](const char* part) { return recipe.find(part) != std::string::npos; };
  auto gemm = [&](const char* format_flag, const char* format, const char* recipe_flag, const char* name) {
    out.push_back({format_flag, {format}});
    out.push_back({recipe_flag, {name}});
  };
  if (has("nvfp4")) gemm("--fp4-format", "e2m1", "--fp4-recipe", "nvfp4");
  else if (has("mxfp8")) gemm("--fp8-format", "e4m3", "--fp8-recipe", "mxfp8");
  else if (has("fp8_current")) gemm("--fp8-format", "hybrid", "--fp8-recipe", "tensorwise");
  else if (has("fp8_subchannel") || has("fp8_blockwise")) gemm("--fp8-format", "e4m3", "--fp8-recipe", "blockwise");
  else if (has("fp8")) gemm("--fp8-format", "hybrid", "--fp8-recipe", "delayed");
  out.push_back({has("fp16") ? "--fp16" : "--bf16", {}});
  return out;
}

// ---- MegatronFlagSet ----------------------------------------------------------------------------------------------

namespace {

std::string example(const std::string& name) {
  return name + (name.find("size") != std::string::npos || name.find("layers") != std::string::npos ? " 2" : " VALUE");
}

UserError unresolved(const std::string& name, const std::string& v) {
  return UserError(name + " \"" + v + "\" depends on a shell variable or command the text does not set (set it in the "
                                      "script, or give the value itself)");
}

}  // namespace

void MegatronFlagSet::set(const std::string& name, std::vector<std::string> values) {
  auto it = map_.find(name);
  if (it != map_.end() && it->second != values)
    notes_.push_back(name + " is given twice (\"" + join_words(it->second) + "\" and \"" + join_words(values) +
                     "\"); Megatron uses the last one");
  map_[name] = std::move(values);
}

std::optional<std::string> MegatronFlagSet::raw(const std::string& name) const {
  auto it = map_.find(name);
  if (it == map_.end() || it->second.size() != 1) return std::nullopt;
  return it->second[0];
}

bool MegatronFlagSet::on(const std::string& name) const {
  auto it = map_.find(name);
  if (it == map_.end()) return false;
  if (!it->second.empty())
    throw UserError(name + " is a switch and takes no value, got \"" + join_words(it->second) + "\" (give " + name + " alone)");
  return true;
}

std::optional<std::string> MegatronFlagSet::text(const std::string& name) const {
  auto it = map_.find(name);
  if (it == map_.end()) return std::nullopt;
  const auto& v = it->second;
  if (v.empty()) throw UserError(name + " needs a value (e.g. " + example(name) + ")");
  if (v.size() > 1) throw UserError(name + " is given " + std::to_string(v.size()) + " values (\"" + join_words(v) + "\"); it takes one");
  if (unresolved_text(v[0])) throw unresolved(name, v[0]);
  return v[0];
}

std::optional<std::vector<std::string>> MegatronFlagSet::list(const std::string& name) const {
  auto it = map_.find(name);
  if (it == map_.end()) return std::nullopt;
  if (it->second.empty()) throw UserError(name + " needs at least one value (e.g. " + example(name) + ")");
  for (const auto& v : it->second)
    if (unresolved_text(v)) throw unresolved(name, v);
  return it->second;
}

std::optional<int> MegatronFlagSet::integer(const std::string& name, int lo) const {
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

std::optional<double> MegatronFlagSet::number(const std::string& name, double lo, double hi, const std::string& valid) const {
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

std::optional<std::string> MegatronFlagSet::choice(const std::string& name, const std::vector<std::string>& valid) const {
  auto t = text(name);
  if (t && std::find(valid.begin(), valid.end(), *t) == valid.end())
    throw UserError(name + " \"" + *t + "\" is not valid (valid: " + join_words(valid, ", ") + ")");
  return t;
}

bool unresolved_text(const std::string& v) { return v.find('$') != std::string::npos || v.find('`') != std::string::npos; }

std::string join_words(const std::vector<std::string>& v, const std::string& sep) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : sep) + x;
  return s;
}

int launcher_count(const std::string& text, const std::string& what) {
  if (text.empty() || text.size() > 9 ||
      !std::all_of(text.begin(), text.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }) ||
      std::stol(text) < 1)
    throw UserError(what + " \"" + text + "\" is not a whole number of 1 or more (give the GPU count with --gpus)");
  return int(std::stol(text));
}

// ---- the drivers --------------------------------------------------------------------------------------------------

void read_megatron_rows(const MegatronFlagSet& f, const std::map<std::string, std::string>& env, int script_world_size,
                        MegatronLaunch& l) {
  MegatronReading r{f, l, l.plan, l.plan.parallel, env, script_world_size};
  l.plan.assumed = kAllRunFields;  // a run setting whose flags are absent takes the implementation's default
  for (const MegatronRow& row : megatron_rows())
    if (row.read) row.read(r);
}

void finish_megatron_rows(const MegatronLaunch& l, const ModelSpec& m, Plan& p, std::vector<std::string>* notes) {
  MegatronFinishing c{l, m, int(m.layers.size()), p, notes};
  for (const MegatronRow& row : megatron_rows())
    if (row.finish) row.finish(c);
}

std::string megatron_flags(const Plan& p, const ModelSpec& m) {
  const int layers = int(m.layers.size());
  MegatronEmission e{p, m, has_moe(m), layers, p.mtp_layers >= 0 ? p.mtp_layers : m.mtp_layers,
                     split_layers(layers, p.parallel.pp, p.parallel.vpp, p.pipeline), {}, {}, {}};
  for (const MegatronRow& row : megatron_rows())
    if (row.emit) row.emit(e);
  std::string out = e.flags.str().substr(1) + "\n";  // every flag starts with a space
  for (const std::string& c : e.comments) out += c + "\n";
  return out + "# no Megatron flag: " + join_words(e.no_flag, ", ") + "\n";
}

std::string megatron_plan_difference(const Plan& a, const Plan& b) {
  for (const MegatronRow& row : megatron_rows()) {
    if (!row.expressed) continue;
    FieldValues va, vb;
    row.expressed(a, va);
    row.expressed(b, vb);
    for (size_t i = 0; i < va.size() && i < vb.size(); ++i)
      if (va[i].second != vb[i].second) return va[i].first + ": " + va[i].second + " vs " + vb[i].second;
  }
  return "";
}

}  // namespace lcplan
