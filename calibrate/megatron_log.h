// Megatron-LM training logs in: the per-interval iteration lines and the per-rank memory lines a run prints
// (megatron/training/training.py training_log and report_memory, https://github.com/NVIDIA/Megatron-LM), read into
// measurement records (calibrate/measurement.h) for `lcplan calibrate`.
//
//  [2025-01-01 10:00:00] iteration 50/5000 | consumed samples: 51200 | elapsed time per iteration (ms): 61674.3 |
//      throughput per GPU (TFLOP/s/GPU): 68.2 | ... | global batch size: 1024 | ... | number of nan iterations: 0 |
//  [Rank 0] (after 10 iterations) memory (MB) | allocated: 24761.03 | max allocated: 65203.93 | reserved: ... |
//      max reserved: 74306.0
//
// A launcher prefix ("[default3]:", "0:") may precede either. Newer releases print "compute per GPU (TFLOP/s/GPU):
// 496.3 (avg 496.1)" and a tokens-per-GPU field; both are read. "MB" there is MiB.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "estimator/plan.h"

namespace lcplan {

struct MegatronIteration {
  long iteration = 0, total = 0;
  double elapsed_ms = 0;                  // elapsed time per iteration, averaged over the log interval
  std::optional<double> tflops_per_gpu;   // throughput / compute per GPU (model FLOPs, as Megatron counts them)
  std::optional<double> tokens_per_gpu;   // tokens per second per GPU (newer releases)
  std::optional<long> global_batch;
  long skipped = 0, nan = 0;              // number of skipped / nan iterations in the interval
  int line = 0;
};

struct MegatronMemory {
  int rank = 0;
  long after_iterations = 0;
  double allocated_mib = 0, max_allocated_mib = 0, reserved_mib = 0, max_reserved_mib = 0;
  int line = 0;
};

enum class RunFailure { None, OutOfMemory, Nccl, Traceback };
const char* to_string(RunFailure f);

// A size the run reported about itself at startup: Megatron's "using world size: 32, data-parallel size: 32,
// context-parallel size: 1, tensor-model-parallel size: 1, pipeline-model-parallel size: 1" line
// (megatron/training/arguments.py validate_args) and its argument dump ("  tensor_model_parallel_size ..... 2").
struct MegatronStartupSize {
  std::string name;  // the plan's word: gpus, tp, pp, cp, ep, etp, seq_len, micro_batch
  long value = 0;
  int line = 0;
};

struct MegatronLog {
  std::vector<MegatronStartupSize> startup;  // in the order printed (the first of each name is compared)
  std::vector<MegatronIteration> iterations;
  std::vector<MegatronMemory> memory;
  bool truncated_last_line = false;  // the text did not end with a newline: its last line was cut off and ignored
  RunFailure failure = RunFailure::None;
  std::string failure_reason;        // the line that says why (an exception, the OOM message, the NCCL error)
  int failure_line = 0;
};

// Pure: reads every line it recognizes, ignores the rest.
MegatronLog parse_megatron_log(const std::string& text);

struct IngestOptions {
  std::string id;           // record id
  std::string file;         // the log's name, for errors and provenance
  int skip_iterations = 1;  // logged iterations dropped at the start (warm-up)
};

// The measurement record of one run of `plan` (README "Measurement"): median step time and TFLOP/s/GPU over the
// logged iterations after the skipped ones, peak = the largest `max allocated` over ranks (MiB x 2^20, the rank
// kept in `source`), `max reserved` as peak_reserved_bytes. A run that ran out of CUDA memory gets
// "status": "out_of_memory" and its reason in "failure" (the plan did not fit); lcplan calibrate skips such
// records. Throws UserError, one sentence naming the file, for: no iteration lines, a run that failed (traceback,
// NCCL error) before its first logged iteration, every iteration skipped, a global batch other than the plan's, a
// startup size (world size, TP, PP, CP, EP, expert TP, sequence length, micro batch) other than the plan's.
nlohmann::json megatron_measurement(const MegatronLog& log, const Plan& plan, const IngestOptions& opt);

}  // namespace lcplan
