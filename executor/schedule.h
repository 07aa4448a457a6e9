// The pipeline schedule lcplan-exec runs: Megatron-LM's order of forward and backward passes of (microbatch, virtual
// chunk) on one pipeline stage (megatron/core/pipeline_parallel/schedules.py,
// forward_backward_pipelining_without_interleaving and forward_backward_pipelining_with_interleaving,
// https://github.com/NVIDIA/Megatron-LM). Pure functions over plain structs: the executor walks the list and the
// tests check it against the estimator's in-flight microbatches (estimator/derived_plan.h LayerRecord::inflight).
//
// 1F1B (vpp = 1): warmup = min(pp - stage - 1, M) forwards, then one forward and one backward per step, then the
// remaining backwards. Interleaved (vpp > 1): virtual microbatch k runs (microbatch, chunk) of Megatron's schedule
// table (groups of g microbatches, default pp, chunk by chunk; backward visits the chunks in reverse), warmup =
// 2 (pp - stage - 1) + (vpp - 1) g forwards (all of them when that reaches M vpp), then 1F1B, then the cooldown.
#pragma once

#include <string>
#include <vector>

namespace lcplan::exec {

struct PipeAction {
  bool forward = true;
  int microbatch = 0;
  int chunk = 0;  // virtual chunk on this stage (0 .. vpp-1): virtual stage chunk * pp + stage
};

// The actions of pipeline stage `stage` in Megatron's order. pp >= 1, vpp >= 1, 0 <= stage < pp, microbatches >= 1;
// `group`: the interleaved schedule's microbatch group (Plan::microbatch_group; 0 = pp).
std::vector<PipeAction> pipeline_schedule(int pp, int vpp, int stage, int microbatches, int group = 0);

// Megatron's interleaved schedule table: virtual microbatch k -> (microbatch, chunk) of the forward pass (the
// backward uses chunk vpp - 1 - chunk), microbatches in groups of `group` (Megatron's
// microbatch_group_size_per_vp_stage, default pp).
std::vector<std::pair<int, int>> interleaved_table(int microbatches, int vpp, int group);

// Runs every stage's list against the others (a forward of virtual stage v needs v - 1's forward of the same
// microbatch, a backward needs v + 1's backward, the last virtual stage's backward its own forward) with blocking
// receives and sends that never block, as lcplan-exec does. Returns "" when every list completes, else one sentence
// naming the stage that waits forever. `held` (optional): per stage, the (microbatch, chunk) activations held just
// before each action, as counts per chunk.
struct HeldCounts {
  std::vector<std::vector<int>> before_action;  // [action][chunk]: forwards done and not yet backpropagated
};
std::string simulate_pipeline(int pp, int vpp, int microbatches, std::vector<HeldCounts>* held = nullptr, int group = 0);

// Per chunk, microbatches whose activations stage `stage` holds at the start of its first backward (the peak the
// estimator sizes: every forward of the warmup and of the first steady step done, nothing freed yet).
std::vector<int> held_at_first_backward(int pp, int vpp, int stage, int microbatches, int group = 0);

// Messages between stages on GPUs go over comm::PipeLinks (one two-rank NCCL communicator per direction and
// neighbour pair): NCCL has no tags, so on each link the k-th message one stage sends must be the k-th the other
// receives. Returns "" when that holds for every stage's schedule, else one sentence naming the first mismatch.
// `per_direction` false: activations and gradients between two stages share one communicator (the layout that fails
// on two interleaved stages, kept so the tests show it does).
std::string pipeline_message_order_error(int pp, int vpp, int microbatches, bool per_direction = true);

}  // namespace lcplan::exec
