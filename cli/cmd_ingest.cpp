// lcplan ingest megatron LOG... --plan recipe.json --out runs.json: measured runs into measurement records.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <set>

#include <CLI/CLI.hpp>

#include "calibrate/measurement.h"
#include "calibrate/megatron_log.h"
#include "cli/commands.h"
#include "cli/plan_flags.h"
#include "common/json_file.h"
#include "common/user_error.h"
#include "estimator/plan_rules.h"

namespace lcplan {

namespace {

struct IngestArgs {
  std::vector<std::string> logs;
  std::string plan, id, skip = "1", out;
  bool append = false;
};

constexpr double GiB = 1024.0 * 1024.0 * 1024.0;

std::string summary(const nlohmann::json& r) {
  char buf[512];
  std::string s = "  " + r.at("id").get<std::string>() + ":";
  if (r.contains("step_seconds")) {
    std::snprintf(buf, sizeof buf, " step %.3f s", r.at("step_seconds").get<double>());
    s += buf;
  }
  if (r.contains("tflops_per_gpu")) {
    std::snprintf(buf, sizeof buf, ", %.1f TFLOP/s/GPU", r.at("tflops_per_gpu").get<double>());
    s += buf;
  }
  if (r.contains("peak_bytes")) {
    std::snprintf(buf, sizeof buf, ", peak %.2f GiB (rank %d)", r.at("peak_bytes").get<double>() / GiB,
                  r.at("source").value("peak_rank", 0));
    s += buf;
  }
  if (r.value("status", "ok") == "out_of_memory") s += " out of memory, the plan did not fit (" + r.at("failure").get<std::string>() + ")";
  return s + "\n    " + r.at("notes").get<std::string>() + "\n";
}

}  // namespace

void register_ingest(CLI::App& app, int& exit_code) {
  auto a = std::make_shared<IngestArgs>();
  auto* ingest = app.add_subcommand("ingest", "read training logs into measurement records for lcplan calibrate");
  ingest->require_subcommand(1);
  auto* cmd = ingest->add_subcommand(
      "megatron", "Megatron-LM logs: median step time and TFLOP/s/GPU, peak memory over ranks, out-of-memory runs");
  cmd->add_option("logs", a->logs, "Megatron-LM log files, one run each (ranks' lines together: concatenate per-node files)")
      ->required();
  cmd->add_option("--plan", a->plan, "recipe.json of the runs (the plan each measurement belongs to)")->required();
  cmd->add_option("--id", a->id, "record id (default: the log's file name; with several logs PREFIX-<file name>)");
  cmd->add_option("--skip-iterations", a->skip, "logged iterations dropped at the start as warm-up (default 1)");
  cmd->add_option("--out", a->out, "measurements file to write (JSON array)")->required();
  cmd->add_flag("--append", a->append, "keep the measurements already in --out and add these");
  cmd->callback([a, &exit_code]() {
    const int skip = cli::parse_int_in(a->skip, "--skip-iterations", 0, 1000000);
    Plan plan = load_plan_file(a->plan);
    {
      // The records must be accepted by lcplan calibrate: the plan must name a model and hardware and be valid.
      const cli::Inputs in = cli::load_inputs(plan, "");
      require_valid_plan(in.model, plan);
    }
    nlohmann::json all = nlohmann::json::array();
    std::set<std::string> ids;
    if (a->append && std::filesystem::exists(a->out)) {
      for (const Measurement& m : load_measurements(a->out)) ids.insert(m.id);
      const nlohmann::json old = read_json_file(a->out, "measurements file");
      all = old.is_array() ? old : old.at("measurements");
    }
    std::string report;
    for (const std::string& log : a->logs) {
      const std::string stem = std::filesystem::path(log).stem().string();
      IngestOptions opt;
      opt.file = log;
      opt.skip_iterations = skip;
      opt.id = a->logs.size() == 1 ? (a->id.empty() ? stem : a->id) : (a->id.empty() ? stem : a->id + "-" + stem);
      if (!ids.insert(opt.id).second)
        throw UserError("record id \"" + opt.id + "\" is given twice (" + log +
                        "; give logs distinct file names, another --id, or drop --append)");
      const nlohmann::json rec = megatron_measurement(parse_megatron_log(read_text_file(log, "log file")), plan, opt);
      measurement_from_json(rec, log);  // the record lcplan calibrate will read back
      all.push_back(rec);
      report += summary(rec);
    }
    write_file_atomic(a->out, all.dump(2) + "\n");  // first: a failed write must leave no report on stdout
    std::fputs(report.c_str(), stdout);
    std::printf("wrote %s (%zu measurements)\n", a->out.c_str(), all.size());
    exit_code = 0;
  });
}

}  // namespace lcplan
