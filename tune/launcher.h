// How lcplan tune runs a plan: a command template with placeholders, run by /bin/sh in its own process group with
// its output in a log file and a time limit, and the measurement read back from what the run wrote.
//
// Placeholders (README "Tune"): {plan} recipe.json path, {out} where a measurement record may be written, {log} the
// run's log file, {run_dir}, {id}, {gpus}, {nodes}, {gpus_per_node}, {megatron_flags} (alias {flags}: the plan's
// Megatron-LM flags, search/megatron_flags.h), {megatron_model_flags} (the model's shape flags, empty for models Megatron-LM
// flags cannot describe). "{{" and "}}" are literal braces.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "calibrate/measurement.h"
#include "estimator/plan.h"

namespace lcplan {

const std::vector<std::string>& launch_placeholders();

// Throws UserError (one sentence) for an unknown or unclosed placeholder, or a template that names no plan
// placeholder ({plan}, {megatron_flags} or {flags}): every run of it would be the same command.
void check_launch_template(const std::string& tmpl);

// Replaces every placeholder by its value in `values` (which must hold every name the template uses).
std::string expand_launch_template(const std::string& tmpl, const std::map<std::string, std::string>& values);

// A value as one shell word: unchanged when it is made of safe characters, else single-quoted.
std::string shell_quote(const std::string& s);

struct ProcessResult {
  int exit_status = 0;   // the command's exit status (128 + signal when a signal ended it)
  bool timed_out = false;
  bool interrupted = false;  // this process got SIGINT or SIGTERM while waiting: the command was stopped
  double seconds = 0;
};

// Runs `command` with /bin/sh -c in a new process group, its stdout and stderr appended to `log_path`. At the time
// limit, or on SIGINT/SIGTERM to this process, the whole group gets SIGTERM, then SIGKILL after a grace period.
// Throws UserError when the log cannot be opened or the shell cannot be started.
ProcessResult run_shell(const std::string& command, const std::string& log_path, double timeout_seconds);

struct RunFiles {
  std::string out;  // the measurement record a command may write ({out})
  std::string log;  // the run's log ({log}: stdout and stderr)
};

// The measurement of a finished run: the record the command wrote at `files.out` (lcplan-exec, or any tool that
// writes the measurement format), else the log read as a Megatron-LM training log of `plan` (calibrate/
// megatron_log.h), where a CUDA out-of-memory line gives status out_of_memory. Throws UserError, one sentence naming
// the run and its log, when the run timed out, was interrupted, exited non-zero without running out of memory, or
// left neither a record nor a readable training log.
Measurement read_run_measurement(const ProcessResult& pr, const RunFiles& files, const Plan& plan, const std::string& id,
                                 int skip_iterations);

}  // namespace lcplan
