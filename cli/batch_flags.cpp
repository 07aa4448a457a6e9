#include "cli/batch_flags.h"

#include "common/user_error.h"
#include "estimator/plan_rules.h"

namespace lcplan::cli {

void add_batch_flags(CLI::App* cmd, BatchFlags& f) {
  cmd->add_option("--seq-lengths", f.seq_lengths,
                  "sequence lengths of the run's batches (one per line, a JSON list, or a JSON list of [length, count]); "
                  "replaces --seq");
  cmd->add_option("--tokens-per-microbatch", f.tokens_per_microbatch,
                  "with --seq-lengths: tokens per GPU per microbatch (x cp per microbatch), packed first-fit decreasing "
                  "(default: --micro-batch sequences per microbatch)");
  cmd->add_option("--packing", f.packing,
                  "with --tokens-per-microbatch: first_fit (default: first-fit decreasing, as many microbatches as a rank "
                  "needs) or balanced (RL trainers' dynamic batch size: the same count on every DP rank, tokens balanced)");
  cmd->add_option("--global-tokens", f.global_tokens, "with --seq-lengths: tokens per step instead of --global-batch sequences");
  cmd->add_option("--samples", f.samples, "with --seq-lengths: steps drawn from the distribution (default 16)");
  cmd->add_option("--seed", f.seed, "with --seq-lengths: seed of the draws (default 1)");
  cmd->add_flag("--beyond-max-position", f.beyond_max_position,
                "with --seq-lengths: the run extends positions past the model's max_position_embeddings (YaRN, RoPE scaling)");
}

std::optional<LengthDistribution> read_batch_lengths(const BatchFlags& f, PlanFlags& plan_flags) {
  if (!f.global_tokens.empty() && !plan_flags.global_batch.empty())
    throw UserError("--global-tokens " + f.global_tokens + " and --global-batch " + plan_flags.global_batch +
                    " both size the step (valid: one of them)");
  if (f.seq_lengths.empty()) return std::nullopt;
  if (!plan_flags.seq.empty())
    throw UserError("--seq " + plan_flags.seq + " and --seq-lengths " + f.seq_lengths +
                    " both give the sequence length (valid: one of them)");
  LengthDistribution d = read_seq_lengths_file(f.seq_lengths);
  plan_flags.seq = std::to_string(d.max_length());
  return d;
}

bool prepare_batches(const BatchFlags& f, const std::optional<LengthDistribution>& dist, const ModelSpec& m, Plan& plan) {
  const bool packing_flags = !f.tokens_per_microbatch.empty() || !f.packing.empty() || !f.global_tokens.empty() ||
                             !f.samples.empty() || !f.seed.empty() || f.beyond_max_position;
  if (!dist && !plan.batches) {
    if (packing_flags)
      throw UserError("--tokens-per-microbatch, --packing, --global-tokens, --samples, --seed and --beyond-max-position "
                      "need --seq-lengths FILE (or a recipe with \"batches\")");
    return false;
  }
  BatchSpec b = dist ? BatchSpec{*dist, {}} : *plan.batches;
  const std::string where = dist ? "--seq-lengths " + f.seq_lengths : std::string("the recipe's batches");
  if (m.max_position > 0 && b.lengths.max_length() > m.max_position && !f.beyond_max_position)
    throw UserError(where + " holds a sequence of " + std::to_string(b.lengths.max_length()) +
                    " tokens, above the model's max_position_embeddings " + std::to_string(m.max_position) +
                    " (valid: shorter sequences, or --beyond-max-position when the run extends positions)");
  PackingOptions& o = b.packing;
  if (!f.tokens_per_microbatch.empty()) o.tokens_per_microbatch = parse_size(f.tokens_per_microbatch, "--tokens-per-microbatch");
  if (!f.global_tokens.empty()) o.global_tokens = parse_size(f.global_tokens, "--global-tokens");
  if (!f.packing.empty()) o.policy = parse_packing_policy(f.packing, "--packing");
  if (o.policy == PackingPolicy::Balanced && o.tokens_per_microbatch <= 0)
    throw UserError("--packing balanced splits a rank's tokens by a budget (valid: with --tokens-per-microbatch N)");
  if (o.tokens_per_microbatch > 0 && plan.micro_batch != 1)
    throw UserError("--tokens-per-microbatch " + std::to_string(o.tokens_per_microbatch) + " and --micro-batch " +
                    std::to_string(plan.micro_batch) + " both size the microbatch (valid: one of them)");
  if (!f.samples.empty()) o.samples = parse_int_in(f.samples, "--samples", 1, 10000);
  if (!f.seed.empty()) o.seed = uint64_t(parse_int_in(f.seed, "--seed", 0, 2147483647));
  plan.seq_len = padded_length(b.lengths.max_length(), plan);
  plan.batches = std::make_shared<const BatchSpec>(std::move(b));
  return true;
}

BatchRecord estimate_batch_record(const PlanInputs& in, const Plan& plan) {
  require_valid_plan(in.model, plan);
  BatchRecord r;
  r.batches = estimate_batches(in.model, plan, in.hardware, in.calibration, plan.batches->lengths, plan.batches->packing);
  r.record = estimate_to_json(r.batches.worst_estimate, r.batches.worst_plan);
  r.record["batches"] = batch_estimate_to_json(r.batches);
  r.record["batches"]["plan"] = plan_to_json(plan);
  return r;
}

}  // namespace lcplan::cli
