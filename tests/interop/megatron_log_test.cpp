// Megatron-LM logs in: every field of the iteration and memory lines, launcher prefixes, several ranks, warm-up
// skipping, medians, truncated logs, crashed runs (out of memory -> a record that says the plan did not fit;
// traceback / NCCL error -> one sentence), a global batch other than the plan's, and records lcplan calibrate
// reads back. Sample logs: tests/interop/logs/.
#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <sstream>

#include "calibrate/measurement.h"
#include "calibrate/megatron_log.h"
#include "common/user_error.h"

namespace lcplan {
namespace {

std::string sample(const std::string& name) {
  std::ifstream in(std::string(LCPLAN_INTEROP_LOGS) + "/" + name, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_FALSE(ss.str().empty()) << name;
  return ss.str();
}

Plan plan(int global_batch = 64) {
  Plan p;
  p.model = "qwen3-30b-a3b";
  p.gpus = 32;
  p.seq_len = 4096;
  p.parallel.ep = 8;
  p.global_batch = global_batch;
  return p;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

nlohmann::json ingest(const std::string& text, int skip = 1, const std::string& file = "run.log") {
  IngestOptions opt;
  opt.id = "r1";
  opt.file = file;
  opt.skip_iterations = skip;
  return megatron_measurement(parse_megatron_log(text), plan(), opt);
}

std::string iteration(long i, double ms, double tflops, long gb = 64, const std::string& prefix = "") {
  char buf[600];
  std::snprintf(buf, sizeof buf,
                "%s [2026-05-01 10:00:00] iteration %8ld/     500 | consumed samples: %12ld | elapsed time per iteration "
                "(ms): %.1f | throughput per GPU (TFLOP/s/GPU): %.1f | learning rate: 1.0E-04 | global batch size: %5ld | "
                "lm loss: 6.681113E+00 | loss scale: 1.0 | grad norm: 1.234 | number of skipped iterations:   0 | number "
                "of nan iterations:   0 |\n",
                prefix.c_str(), i, i * gb, ms, tflops, gb);
  return buf;
}

// The run's own startup lines are checked against the plan (issue 28, item 8): a log of another layout is refused
// in one sentence naming the size, its line and the plan's value; agreeing sizes pass.
TEST(MegatronLog, StartupSizesAreCheckedAgainstThePlan) {
  const std::string body = iteration(10, 2400, 150) + iteration(20, 1200, 300);
  const std::string agree =
      "[default0]:using world size: 32, data-parallel size: 4, context-parallel size: 1, tensor-model-parallel size: 1, "
      "pipeline-model-parallel size: 1\n  expert_model_parallel_size ...................... 8\n";
  EXPECT_NO_THROW(ingest(agree + body));
  const MegatronLog log = parse_megatron_log(agree + body);
  ASSERT_EQ(log.startup.size(), 5u);
  EXPECT_EQ(log.startup.back().name, "ep");
  EXPECT_EQ(log.startup.back().value, 8);
  const std::string e = error_of([&] {
    ingest("using world size: 16, data-parallel size: 8, context-parallel size: 1, tensor-model-parallel size: 2, "
           "pipeline-model-parallel size: 1\n" + body);
  });
  EXPECT_NE(e.find("run.log: the run reports gpus 16 (line 1) but the plan's gpus is 32"), std::string::npos) << e;
  const std::string dump = error_of([&] { ingest("    tensor_model_parallel_size ...................... 4\n" + body); });
  EXPECT_NE(dump.find("reports tp 4"), std::string::npos) << dump;
  const std::string seq = error_of([&] { ingest("[default0]:  seq_length ...................................... 8192\n" + body); });
  EXPECT_NE(seq.find("reports seq_len 8192"), std::string::npos) << seq;
}

TEST(MegatronLog, IterationFields) {
  const MegatronLog log = parse_megatron_log(iteration(50, 61674.3, 68.2, 1024));
  ASSERT_EQ(log.iterations.size(), 1u);
  const MegatronIteration& it = log.iterations[0];
  EXPECT_EQ(it.iteration, 50);
  EXPECT_EQ(it.total, 500);
  EXPECT_DOUBLE_EQ(it.elapsed_ms, 61674.3);
  EXPECT_DOUBLE_EQ(*it.tflops_per_gpu, 68.2);
  EXPECT_EQ(*it.global_batch, 1024);
  EXPECT_EQ(it.skipped, 0);
  EXPECT_EQ(it.nan, 0);
  EXPECT_EQ(it.line, 1);
  EXPECT_FALSE(it.tokens_per_gpu);
}

TEST(MegatronLog, NewerReleaseFields) {
  const MegatronLog log = parse_megatron_log(
      "0:  [2026-05-01] iteration 10/ 100 | elapsed time per iteration (ms): 1250.0 | compute per GPU (TFLOP/s/GPU): "
      "496.3 (avg 496.1) | Tokens per second per GPU (Tok/s/GPU): 3276.8 | global batch size: 64 |\n"
      " iteration 20/100 | elapsed time per iteration (ms): 1240.0 | tokens per GPU (tokens/s/GPU): 3300.5 | "
      "number of skipped iterations: 2 | number of nan iterations: 1 |\n");
  ASSERT_EQ(log.iterations.size(), 2u);
  EXPECT_DOUBLE_EQ(*log.iterations[0].tflops_per_gpu, 496.3);  // the instantaneous value, not the average
  EXPECT_DOUBLE_EQ(*log.iterations[0].tokens_per_gpu, 3276.8);
  EXPECT_DOUBLE_EQ(*log.iterations[1].tokens_per_gpu, 3300.5);
  EXPECT_FALSE(log.iterations[1].tflops_per_gpu);
  EXPECT_EQ(log.iterations[1].skipped, 2);
  EXPECT_EQ(log.iterations[1].nan, 1);
}

TEST(MegatronLog, MemoryFieldsAndLauncherPrefixes) {
  const MegatronLog log = parse_megatron_log(
      "[default3]:[Rank 3] (after 10 iterations) memory (MB) | allocated: 24761.03 | max allocated: 65203.93 | "
      "reserved: 64438.0 | max reserved: 74306.0\n"
      "12: [Rank 12] (after 10 iterations) memory (MB) | allocated: 1.5 | max allocated: 2.5 | reserved: 3.5 | max reserved: 4.5\n"
      "[1,0]<stdout>:[Rank 0] (after 10 iterations) memory (MB) | allocated: 1 | max allocated: 2 | reserved: 3 | max reserved: 4\n");
  ASSERT_EQ(log.memory.size(), 3u);
  const MegatronMemory& m = log.memory[0];
  EXPECT_EQ(m.rank, 3);
  EXPECT_EQ(m.after_iterations, 10);
  EXPECT_DOUBLE_EQ(m.allocated_mib, 24761.03);
  EXPECT_DOUBLE_EQ(m.max_allocated_mib, 65203.93);
  EXPECT_DOUBLE_EQ(m.reserved_mib, 64438.0);
  EXPECT_DOUBLE_EQ(m.max_reserved_mib, 74306.0);
  EXPECT_EQ(log.memory[1].rank, 12);
  EXPECT_EQ(log.memory[2].rank, 0);
}

TEST(MegatronLog, SampleRunMediansAfterWarmupAndPeakOverRanks) {
  const nlohmann::json r = ingest(sample("qwen3-30b-ep8.log"), 1, "qwen3-30b-ep8.log");
  // Iterations 20..50 after skipping 10: elapsed 1210.4, 1205.0, 1230.9, 1208.8 -> median 1209.6 ms.
  EXPECT_NEAR(r.at("step_seconds").get<double>(), 1.2096, 1e-9);
  EXPECT_NEAR(r.at("tflops_per_gpu").get<double>(), (301.2 + 301.7) / 2, 1e-9);
  // Rank 2 holds the largest max allocated (63001.50 MiB); rank 3 the largest max reserved.
  EXPECT_DOUBLE_EQ(r.at("peak_bytes").get<double>(), 63001.50 * 1024 * 1024);
  EXPECT_DOUBLE_EQ(r.at("peak_reserved_bytes").get<double>(), 72100.0 * 1024 * 1024);
  const auto& s = r.at("source");
  EXPECT_EQ(s.at("file"), "qwen3-30b-ep8.log");
  EXPECT_EQ(s.at("peak_rank"), 2);
  EXPECT_EQ(s.at("peak_reserved_rank"), 3);
  EXPECT_EQ(s.at("memory_ranks"), 4);
  EXPECT_EQ(s.at("iterations"), nlohmann::json::array({20, 50}));
  EXPECT_EQ(s.at("logged_iterations_used"), 4);
  EXPECT_EQ(r.at("plan").at("global_batch"), 64);
  EXPECT_FALSE(r.contains("status"));
  // lcplan calibrate reads it back.
  const Measurement m = measurement_from_json(r, "runs.json");
  EXPECT_EQ(m.status, MeasurementStatus::Ok);
  EXPECT_DOUBLE_EQ(*m.peak_bytes, 63001.50 * 1024 * 1024);
  EXPECT_NE(m.notes.find("median of 4 logged iterations (20 to 50)"), std::string::npos) << m.notes;
}

TEST(MegatronLog, SkipIterations) {
  const std::string text = iteration(1, 9000, 10) + iteration(2, 100, 300) + iteration(3, 200, 200) + iteration(4, 300, 100);
  EXPECT_NEAR(ingest(text, 0).at("step_seconds").get<double>(), 0.25, 1e-12);  // 100 200 300 9000: mean of middle two
  EXPECT_NEAR(ingest(text, 1).at("step_seconds").get<double>(), 0.2, 1e-12);
  EXPECT_NEAR(ingest(text, 3).at("step_seconds").get<double>(), 0.3, 1e-12);
  const std::string e = error_of([&] { ingest(text, 4); });
  EXPECT_NE(e.find("4 iteration lines, all skipped by --skip-iterations 4 (valid: 0 to 3)"), std::string::npos) << e;
}

TEST(MegatronLog, TruncatedLastLineIsIgnoredAndNoted) {
  const std::string text = sample("truncated-newer-release.log");
  const MegatronLog log = parse_megatron_log(text);
  EXPECT_TRUE(log.truncated_last_line);
  EXPECT_EQ(log.iterations.size(), 3u);  // the cut fourth line is not read
  const nlohmann::json r = ingest(text);
  EXPECT_NE(r.at("notes").get<std::string>().find("last line was cut off"), std::string::npos);
  EXPECT_NEAR(r.at("step_seconds").get<double>(), 1.255, 1e-12);
  EXPECT_NEAR(r.at("tflops_per_gpu").get<double>(), 299.0, 1e-12);
  EXPECT_NE(r.at("notes").get<std::string>().find("tokens/s/GPU"), std::string::npos);
  // A complete log ends with a newline: nothing noted.
  EXPECT_FALSE(parse_megatron_log(iteration(1, 1, 1)).truncated_last_line);
}

TEST(MegatronLog, NoIterationLines) {
  const std::string e = error_of([] { ingest("just some text\nand more\n"); });
  EXPECT_NE(e.find("run.log has no iteration lines"), std::string::npos) << e;
  EXPECT_NE(error_of([] { ingest(""); }).find("no iteration lines"), std::string::npos);
}

TEST(MegatronLog, OutOfMemoryBeforeTheFirstIterationIsARecordThatTheRunDidNotFit) {
  const MegatronLog log = parse_megatron_log(sample("oom-before-first-iteration.log"));
  EXPECT_EQ(log.failure, RunFailure::OutOfMemory);
  EXPECT_EQ(log.failure_line, 6);
  const nlohmann::json r = ingest(sample("oom-before-first-iteration.log"));
  EXPECT_EQ(r.at("status"), "out_of_memory");
  EXPECT_EQ(r.at("failure").get<std::string>().rfind("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 9.27 GiB", 0), 0u)
      << r.at("failure");
  EXPECT_FALSE(r.contains("step_seconds"));
  EXPECT_NE(r.at("notes").get<std::string>().find("the plan did not fit"), std::string::npos);
  const Measurement m = measurement_from_json(r, "runs.json");  // accepted without any measured value
  EXPECT_EQ(m.status, MeasurementStatus::OutOfMemory);
}

TEST(MegatronLog, OutOfMemoryAfterIterationsKeepsTheMeasuredValues) {
  const std::string text = iteration(10, 1000, 100) + iteration(20, 1100, 90) + iteration(30, 1200, 80) +
                           "[default0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.00 GiB.\n";
  const nlohmann::json r = ingest(text);
  EXPECT_EQ(r.at("status"), "out_of_memory");
  EXPECT_NEAR(r.at("step_seconds").get<double>(), 1.15, 1e-12);
  EXPECT_NE(r.at("notes").get<std::string>().find("after the iterations measured"), std::string::npos);
}

TEST(MegatronLog, TracebackBeforeTheFirstIterationIsOneSentence) {
  const MegatronLog log = parse_megatron_log(sample("traceback.log"));
  EXPECT_EQ(log.failure, RunFailure::Traceback);
  EXPECT_EQ(log.failure_reason, "AssertionError: num_layers should be divisible by pipeline parallel size");
  const std::string e = error_of([] { ingest(sample("traceback.log"), 1, "traceback.log"); });
  EXPECT_EQ(e, "traceback.log: the run failed before its first logged iteration (line 2, exception: AssertionError: "
               "num_layers should be divisible by pipeline parallel size)");
}

TEST(MegatronLog, NcclErrorBeforeTheFirstIteration) {
  const std::string e = error_of([] {
    ingest("[default5]:[rank5]: torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled "
           "system error. Last error: socket timeout\n");
  });
  EXPECT_NE(e.find("failed before its first logged iteration (line 1, nccl_error: NCCL error in: ProcessGroupNCCL.cpp:1970, "
                   "unhandled system error)"),
            std::string::npos)
      << e;
}

TEST(MegatronLog, FailureAfterIterationsKeepsThemWithANote) {
  const std::string text = iteration(10, 1000, 100) + iteration(20, 1000, 100) + "Traceback (most recent call last):\n" +
                           "  File \"x.py\", line 1\nRuntimeError: node failure\n";
  const nlohmann::json r = ingest(text);
  EXPECT_FALSE(r.contains("status"));
  EXPECT_NE(r.at("notes").get<std::string>().find("failed later, at line 3 (exception: RuntimeError: node failure)"),
            std::string::npos)
      << r.at("notes");
}

TEST(MegatronLog, GlobalBatchOtherThanThePlans) {
  const std::string e = error_of([] { ingest(iteration(10, 1000, 100, 64) + iteration(20, 1000, 100, 128)); });
  EXPECT_EQ(e, "run.log: global batch size 128 at iteration 20 disagrees with the plan's global_batch 64 (give the plan of "
               "this run)");
}

TEST(MegatronLog, MissingThroughputAndMemoryAreNoted) {
  const nlohmann::json r = ingest(" iteration 1/9 | elapsed time per iteration (ms): 5.0 |\n iteration 2/9 | elapsed time per "
                                  "iteration (ms): 7.0 |\n");
  EXPECT_FALSE(r.contains("tflops_per_gpu"));
  EXPECT_FALSE(r.contains("peak_bytes"));
  const std::string notes = r.at("notes");
  EXPECT_NE(notes.find("--log-throughput"), std::string::npos) << notes;
  EXPECT_NE(notes.find("no memory lines"), std::string::npos) << notes;
}

TEST(Measurement, StatusAndExtraFieldsAreChecked) {
  nlohmann::json j = {{"id", "x"}, {"plan", {{"model", "llama-3.1-8b"}, {"gpus", 8}, {"seq_len", 4096}}}};
  EXPECT_NE(error_of([&] { measurement_from_json(j, "runs.json"); }).find("no measured value"), std::string::npos);
  j["status"] = "crashed";
  EXPECT_NE(error_of([&] { measurement_from_json(j, "runs.json"); }).find("\"ok\" or \"out_of_memory\""), std::string::npos);
  j["status"] = "out_of_memory";
  j["failure"] = 3;
  EXPECT_NE(error_of([&] { measurement_from_json(j, "runs.json"); }).find("\"failure\" must be a string"), std::string::npos);
  j["failure"] = "CUDA out of memory";
  j["peak_reserved_bytes"] = -1;
  EXPECT_NE(error_of([&] { measurement_from_json(j, "runs.json"); }).find("peak_reserved_bytes"), std::string::npos);
  j.erase("peak_reserved_bytes");
  EXPECT_EQ(measurement_from_json(j, "runs.json").failure, "CUDA out of memory");
}

}  // namespace
}  // namespace lcplan
