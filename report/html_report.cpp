#include "report/html_report.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "calibrate/measurement.h"
#include "common/user_error.h"
#include "estimator/derived_plan.h"
#include "estimator/estimate.h"
#include "estimator/memory_categories.h"
#include "models/model_table.h"
#include "models/params.h"
#include "report/svg.h"

namespace lcplan {

namespace {

using nlohmann::json;
using svg::escape;
using svg::num;

constexpr double GiB = 1024.0 * 1024.0 * 1024.0;

struct Category {
  const char* key;     // field in the record's breakdown
  const char* label;   // legend text
  const char* colour;  // fixed per category so that pages compare at a glance
};

// Memory category colours, indexed like kMemoryCategories (bottom of the stack first): fixed per category so that
// pages compare at a glance.
constexpr const char* kMemoryColour[] = {"#4e79a7", "#a0cbe8", "#f28e2b", "#ffbe7d", "#59a14f",
                                         "#8cd17d", "#b6992d", "#499894", "#86bcb6", "#e15759"};
static_assert(std::size(kMemoryColour) == kMemoryCategories.size(), "one colour per memory category");
constexpr std::array<Category, kMemoryCategoryCount> kMemory = [] {
  std::array<Category, kMemoryCategoryCount> a{};
  for (int i = 0; i < kMemoryCategoryCount; ++i)
    a[i] = {kMemoryCategories[i].name, kMemoryCategories[i].name, kMemoryColour[i]};
  return a;
}();

// Time categories: key paths into time.breakdown ("exposed_comm/tp" is nested).
constexpr Category kTime[] = {
    {"compute", "compute", "#4e79a7"},
    {"recompute", "recompute", "#a0cbe8"},
    {"exposed_comm/tp", "exposed tp", "#f28e2b"},
    {"exposed_comm/cp", "exposed cp", "#ffbe7d"},
    {"exposed_comm/ep", "exposed ep", "#e15759"},
    {"exposed_comm/pp", "exposed pp", "#ff9d9a"},
    {"exposed_comm/dp_fsdp", "exposed dp/fsdp", "#b07aa1"},
    {"bubble", "bubble", "#bab0ac"},
    {"launch_overhead", "launch", "#9c755f"},
    {"optimizer", "optimizer", "#59a14f"},
    {"offload", "offload", "#d4a6c8"},
    {"step_overhead", "step overhead", "#79706e"},
};

constexpr const char* kBand = "#222222";
constexpr const char* kMeasured = "#d62728";
constexpr const char* kCapacity = "#c0392b";

// ---- reading records ---------------------------------------------------------------------------------------------

// The number at a '/'-separated path, or nullopt when a step is missing or the value is not a number.
std::optional<double> number_at(const json& j, const std::string& path) {
  const json* cur = &j;
  size_t start = 0;
  while (true) {
    const size_t slash = path.find('/', start);
    const std::string key = path.substr(start, slash - start);
    if (!cur->is_object() || !cur->contains(key)) return std::nullopt;
    cur = &cur->at(key);
    if (slash == std::string::npos) break;
    start = slash + 1;
  }
  if (!cur->is_number()) return std::nullopt;
  return cur->get<double>();
}

double value(const json& j, const std::string& path) { return number_at(j, path).value_or(0.0); }

std::string string_at(const json& j, const char* key) {
  return j.is_object() && j.contains(key) && j.at(key).is_string() ? j.at(key).get<std::string>() : "";
}

// The record's own text for a number (nlohmann's shortest round trip), for data attributes a test compares exactly.
std::string raw(double v) { return json(v).dump(); }

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}
std::string gib(double bytes) { return fmt("%.2f", bytes / GiB) + " GiB"; }
std::string gb(double bytes) { return fmt("%.2f", bytes / 1e9) + " GB"; }
std::string secs(double s) { return fmt("%.3f", s) + " s"; }
std::string tflops(double t) { return fmt("%.1f", t) + " TFLOP/s"; }
std::string percent(double f) { return fmt("%.1f", 100 * f) + "%"; }

struct Band {
  double low = 0, high = 0;
};
std::optional<Band> band(const json& record, const char* section, const char* low, const char* high) {
  const auto lo = number_at(record, std::string(section) + "/band/" + low);
  const auto hi = number_at(record, std::string(section) + "/band/" + high);
  // A band from no validation points is the estimate itself: nothing to draw.
  const auto points = number_at(record, std::string(section) + "/band/points");
  if (!lo || !hi || (points && *points <= 0)) return std::nullopt;
  return Band{*lo, *hi};
}

Plan record_plan(const json& record) { return plan_from_json(record.at("plan")); }

// "TP1 PP1 CP4 EP8 · fsdp · recompute full · linear CE · 2 EP chunks": what tells plans of one search apart.
std::string plan_label(const Plan& p) {
  const Parallel& q = p.parallel;
  std::string s = "TP" + std::to_string(q.tp) + " PP" + std::to_string(q.pp);
  if (q.vpp > 1) s += " VPP" + std::to_string(q.vpp);
  s += " CP" + std::to_string(q.cp) + " EP" + std::to_string(q.ep);
  if (q.etp > 1) s += " ETP" + std::to_string(q.etp);
  if (p.micro_batch > 1) s += " mb" + std::to_string(p.micro_batch);
  s += std::string(" · ") + to_string(p.optimizer_sharding) + " · recompute " + to_string(p.recompute);
  if (p.recompute_layers > 0) s += "/" + std::to_string(p.recompute_layers);
  s += p.linear_ce ? " · linear CE" : " · no linear CE";
  if (p.moe.ep_chunks > 1) s += " · " + std::to_string(p.moe.ep_chunks) + " EP chunks";
  if (p.offload.optimizer) s += " · optimizer offload";
  if (p.offload.activations) s += " · activation offload";
  return s;
}

// Ticks at 1, 2 or 5 times a power of ten, about `want` of them up to `max`.
double tick_step(double max, int want) {
  if (!(max > 0)) return 1;
  const double raw_step = max / want;
  const double p10 = std::pow(10.0, std::floor(std::log10(raw_step)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * p10 >= raw_step) return m * p10;
  return 10 * p10;
}

// ---- measured runs -----------------------------------------------------------------------------------------------

std::vector<const MeasuredRun*> runs_for(const std::vector<MeasuredRun>& runs, const Plan& p, const Hardware& hw) {
  std::vector<const MeasuredRun*> out;
  for (const MeasuredRun& r : runs)
    if (same_plan(r.plan, p, hw)) out.push_back(&r);
  return out;
}

// Bytes per memory category a measured breakdown gives, when it names any (else empty).
std::vector<std::pair<const Category*, double>> measured_categories(const MeasuredRun& r) {
  std::vector<std::pair<const Category*, double>> out;
  if (!r.breakdown.is_object()) return out;
  for (const Category& c : kMemory)
    if (r.breakdown.contains(c.key) && r.breakdown.at(c.key).is_number()) out.push_back({&c, r.breakdown.at(c.key).get<double>()});
  return out;
}

// Measured step seconds: as measured, else from the measured TFLOP/s and the record's model FLOPs per step.
std::optional<double> measured_seconds(const MeasuredRun& r, const json& record) {
  if (r.step_seconds) return r.step_seconds;
  const double flops = value(record, "time/model_flops_per_step"), gpus = value(record, "plan/gpus");
  if (r.tflops_per_gpu && flops > 0 && gpus > 0) return flops / (*r.tflops_per_gpu * 1e12 * gpus);
  return std::nullopt;
}

std::optional<double> measured_tflops(const MeasuredRun& r, const json& record) {
  if (r.tflops_per_gpu) return r.tflops_per_gpu;
  const double flops = value(record, "time/model_flops_per_step"), gpus = value(record, "plan/gpus");
  if (r.step_seconds && flops > 0 && gpus > 0) return flops / *r.step_seconds / gpus / 1e12;
  return std::nullopt;
}

// ---- charts ------------------------------------------------------------------------------------------------------

std::string legend(const Category* cats, size_t n, double x, double y, const std::string& title) {
  std::string s = svg::text(x, y, title, svg::font(12, "start", "#222", true));
  for (size_t i = 0; i < n; ++i) {
    const double yy = y + 10 + 20 * double(i);
    s += svg::rect(x, yy, 14, 14, svg::fill(cats[i].colour), cats[i].label, {{"class", "legend-swatch"}, {"data-category", cats[i].key}});
    s += svg::text(x + 20, yy + 11, cats[i].label, svg::font(12));
  }
  return s;
}

// Per-stage peak memory: one stacked bar per pipeline stage, the capacity line, the error band on the peak stage,
// and a measured marker (and measured stacked bar, when the run has a breakdown) beside it.
// A phase name in three letters or four, for deep pipelines' narrow slots.
std::string short_phase(const std::string& phase) {
  if (phase == "forward") return "fwd";
  if (phase == "backward") return "bwd";
  if (phase == "optimizer") return "opt";
  return phase;
}

std::string memory_chart(const json& record, const std::vector<const MeasuredRun*>& measured, const std::string& id) {
  const json& stages = record.at("memory").at("stages");
  const double capacity = value(record, "memory/capacity_bytes");
  const int peak_stage = int(value(record, "memory/peak_stage"));
  const auto b = band(record, "memory", "low_bytes", "high_bytes");
  const MeasuredRun* run = nullptr;
  for (const MeasuredRun* r : measured)
    if (r->peak_bytes || !measured_categories(*r).empty()) run = r;

  double top = capacity;
  for (const json& s : stages) top = std::max(top, value(s, "peak_bytes"));
  if (b) top = std::max(top, b->high);
  if (run && run->peak_bytes) top = std::max(top, *run->peak_bytes);
  if (run) {
    double sum = 0;
    for (const auto& [c, v] : measured_categories(*run)) sum += v;
    top = std::max(top, sum);
  }
  top *= 1.08;

  const double W = 1040, H = 430, left = 70, right = 190, up = 24, down = 46;
  const double plot_w = W - left - right, plot_h = H - up - down;
  const double px_per_byte = plot_h / top;
  auto y_of = [&](double bytes) { return up + plot_h - bytes * px_per_byte; };
  std::string s;

  // Axis and grid in GiB.
  const double step = tick_step(top / GiB, 7);
  for (double g = 0; g * GiB <= top; g += step) {
    s += svg::line(left, y_of(g * GiB), left + plot_w, y_of(g * GiB), svg::stroke("#e3e3e3"));
    s += svg::text(left - 8, y_of(g * GiB) + 4, fmt("%g", g), svg::font(11, "end", "#555"));
  }
  s += svg::text(16, up + plot_h / 2, "GiB per GPU", svg::font(12, "middle", "#555"),
                 {{"transform", "rotate(-90 16 " + num(up + plot_h / 2) + ")"}});
  s += svg::line(left, up + plot_h, left + plot_w, up + plot_h, svg::stroke("#555"));

  const size_t n = stages.size();
  const double slot = plot_w / double(std::max<size_t>(n, 1));
  const double bar_w = std::min(90.0, slot * (run ? 0.42 : 0.55));
  // Labels that fit a stage's slot: at deep pipelines the units move to the axis and the words shorten.
  const double room = slot - 6;
  const bool narrow = svg::text_width("stage " + std::to_string(n - 1), 11) > room ||
                      svg::text_width(gib(top), 11) > room || svg::text_width("optimizer", 10) > room;
  if (narrow) s += svg::text(left + plot_w / 2, H - 4, "pipeline stage", svg::font(11, "middle", "#555"));
  for (size_t i = 0; i < n; ++i) {
    const json& st = stages[i];
    const int stage = int(value(st, "stage"));
    const double x = left + slot * double(i) + (slot - bar_w * (run && stage == peak_stage ? 1.7 : 1.0)) / 2;
    double acc = 0;
    std::string bar;
    for (const Category& c : kMemory) {
      const double v = value(st, std::string("breakdown/") + c.key);
      const double y0 = y_of(acc), y1 = y_of(acc + v);
      acc += v;
      bar += svg::rect(x, y1, bar_w, y0 - y1, svg::fill(c.colour, "mem-seg"),
                       "stage " + std::to_string(stage) + ", " + c.label + ": " + gib(v) + " (" + gb(v) + ")",
                       {{"data-stage", std::to_string(stage)}, {"data-category", c.key}, {"data-bytes", raw(v)}});
    }
    const double peak = value(st, "peak_bytes");
    s += svg::group(bar, "", {{"class", "mem-bar"}, {"data-stage", std::to_string(stage)}, {"data-peak-bytes", raw(peak)}});
    // The peak stage's label sits above its error whisker, every label within its slot.
    const double label_y = std::min(y_of(acc), b && stage == peak_stage ? y_of(b->high) : y_of(acc)) - 6;
    s += svg::text(x + bar_w / 2, label_y, narrow ? fmt("%.1f", peak / GiB) : gib(peak),
                   svg::font(11, "middle", "#222", stage == peak_stage), {{"class", "stage-total"}});
    s += svg::text(x + bar_w / 2, up + plot_h + 16, (narrow ? "" : "stage ") + std::to_string(stage),
                   svg::font(11, "middle", "#333"));
    const std::string phase = string_at(st, "peak_phase");
    s += svg::text(x + bar_w / 2, up + plot_h + 30, narrow ? short_phase(phase) : phase, svg::font(10, "middle", "#777"));

    if (stage != peak_stage) continue;
    const double cx = x + bar_w / 2;
    if (b) {
      // The whisker spans the calibration's validation residuals around the peak.
      const std::string t = "error band of the peak: " + gib(b->low) + " to " + gib(b->high) +
                            " (relative residuals of the calibration's validation)";
      std::string w = svg::line(cx, y_of(b->low), cx, y_of(b->high), svg::stroke(kBand, 1.5));
      w += svg::line(cx - 8, y_of(b->low), cx + 8, y_of(b->low), svg::stroke(kBand, 1.5));
      w += svg::line(cx - 8, y_of(b->high), cx + 8, y_of(b->high), svg::stroke(kBand, 1.5));
      s += svg::group(w, t, {{"class", "band"}, {"data-low-bytes", raw(b->low)}, {"data-high-bytes", raw(b->high)}});
    }
    if (run) {
      const double mx = x + bar_w + 6, mw = bar_w * 0.6;
      double macc = 0;
      std::string mbar;
      for (const auto& [c, v] : measured_categories(*run)) {
        const double y0 = y_of(macc), y1 = y_of(macc + v);
        macc += v;
        mbar += svg::rect(mx, y1, mw, y0 - y1, svg::filled_outline(c->colour, "#fff", 0.5, "measured-seg"),
                          "measured " + std::string(c->label) + ": " + gib(v),
                          {{"data-category", c->key}, {"data-bytes", raw(v)}});
      }
      if (!mbar.empty()) s += svg::group(mbar, "measured breakdown of run " + run->id, {{"class", "measured-bar"}, {"opacity", "0.75"}});
      if (run->peak_bytes) {
        const double my = y_of(*run->peak_bytes), tip = mx + mw / 2;
        const std::string t = "measured peak of run " + run->id + ": " + gib(*run->peak_bytes) + " (" +
                              gb(*run->peak_bytes) + "); predicted " + gib(peak);
        std::string m = svg::line(x + bar_w, my, mx + mw, my, svg::stroke(kMeasured, 2, "4 3"));
        m += svg::path(svg::PathData().move(tip, my - 7).to(tip + 7, my).to(tip, my + 7).to(tip - 7, my).close().str(),
                       svg::fill(kMeasured));
        m += svg::text(mx + mw + 6, my + 4, "measured " + gib(*run->peak_bytes), svg::font(11, "start", kMeasured),
                       {{"class", "measured-value"}});
        s += svg::group(m, t, {{"class", "measured-marker"}, {"data-bytes", raw(*run->peak_bytes)}});
      }
    }
  }

  if (capacity > 0) {
    s += svg::line(left, y_of(capacity), left + plot_w, y_of(capacity),
                   svg::stroke(kCapacity, 1.5, "7 4", "capacity"),
                   "HBM capacity " + gib(capacity), {{"data-bytes", raw(capacity)}});
    s += svg::text(left + plot_w, y_of(capacity) - 5, "capacity " + gib(capacity), svg::font(11, "end", kCapacity));
  }
  s += legend(kMemory.data(), kMemory.size(), W - right + 24, up + 4, "memory category");
  return svg::document(W, H, s, "per-stage peak memory by category, " + id);
}

struct TimeRow {
  std::string name;
  const json* record;
  std::vector<const MeasuredRun*> measured;
};

// Step time: one horizontal stacked bar per plan, on a shared scale, with the band and measured markers.
std::string time_chart(const std::vector<TimeRow>& rows) {
  double top = 0;
  for (const TimeRow& r : rows) {
    top = std::max(top, value(*r.record, "time/step_seconds"));
    if (auto b = band(*r.record, "time", "low_seconds", "high_seconds")) top = std::max(top, b->high);
    for (const MeasuredRun* m : r.measured)
      if (auto ms = measured_seconds(*m, *r.record)) top = std::max(top, *ms);
  }
  top *= 1.05;
  const double W = 1040, left = 150, right = 190, row_h = 74, up = 16;
  const double plot_w = W - left - right;
  const double H = up + row_h * double(rows.size()) + 40 + 20 * std::ceil(double(std::size(kTime)) / 4);
  const double px_per_s = top > 0 ? plot_w / top : 0;
  auto x_of = [&](double s) { return left + s * px_per_s; };
  std::string s;

  const double axis_y = up + row_h * double(rows.size());
  const double step = tick_step(top, 8);
  for (double t = 0; t <= top; t += step) {
    s += svg::line(x_of(t), up, x_of(t), axis_y, svg::stroke("#e3e3e3"));
    s += svg::text(x_of(t), axis_y + 14, fmt("%g", t) + " s", svg::font(11, "middle", "#555"));
  }
  for (size_t i = 0; i < rows.size(); ++i) {
    const json& rec = *rows[i].record;
    const double y = up + row_h * double(i) + 10, h = 26;
    const double step_s = value(rec, "time/step_seconds"), tf = value(rec, "time/tflops_per_gpu");
    s += svg::text(left - 10, y + 17, rows[i].name, svg::font(12, "end", "#222", true));
    double acc = 0;
    std::string bar;
    for (const Category& c : kTime) {
      const double v = value(rec, std::string("time/breakdown/") + c.key);
      bar += svg::rect(x_of(acc), y, v * px_per_s, h, svg::fill(c.colour, "time-seg"),
                       std::string(c.label) + ": " + secs(v) + " (" + percent(step_s > 0 ? v / step_s : 0) + " of the step)",
                       {{"data-category", c.key}, {"data-seconds", raw(v)}});
      acc += v;
    }
    s += svg::group(bar, "", {{"class", "time-bar"}, {"data-row", rows[i].name}, {"data-step-seconds", raw(step_s)}});
    // The total goes right of everything drawn on the row (bar, band, measured marker).
    double row_end = acc;
    if (auto b = band(rec, "time", "low_seconds", "high_seconds")) row_end = std::max(row_end, b->high);
    for (const MeasuredRun* m : rows[i].measured)
      if (auto ms = measured_seconds(*m, rec)) row_end = std::max(row_end, *ms);
    s += svg::text(x_of(row_end) + 10, y + 17, secs(step_s) + " · " + tflops(tf), svg::font(12), {{"class", "step-total"}});
    if (auto b = band(rec, "time", "low_seconds", "high_seconds")) {
      const double cy = y + h + 8;
      std::string t = "error band of the step time: " + secs(b->low) + " to " + secs(b->high);
      if (auto tb = band(rec, "time", "low_tflops", "high_tflops"))
        t += " (" + fmt("%.1f", std::min(tb->low, tb->high)) + " to " + tflops(std::max(tb->low, tb->high)) + ")";
      std::string w = svg::line(x_of(b->low), cy, x_of(b->high), cy, svg::stroke(kBand, 1.5));
      w += svg::line(x_of(b->low), cy - 5, x_of(b->low), cy + 5, svg::stroke(kBand, 1.5));
      w += svg::line(x_of(b->high), cy - 5, x_of(b->high), cy + 5, svg::stroke(kBand, 1.5));
      s += svg::group(w, t, {{"class", "band"}, {"data-low-seconds", raw(b->low)}, {"data-high-seconds", raw(b->high)}});
    }
    for (const MeasuredRun* m : rows[i].measured) {
      const auto ms = measured_seconds(*m, rec);
      if (!ms) continue;
      const auto mt = measured_tflops(*m, rec);
      const double mx = x_of(*ms), my = y + h + 18;
      std::string label = "measured " + secs(*ms);
      if (mt) label.append(" · ").append(tflops(*mt));  // appended: GCC 12 misreads "..." + string here (-Wrestrict)
      std::string g = svg::line(mx, y - 4, mx, y + h + 4, svg::stroke(kMeasured, 2));
      g += svg::path(svg::PathData().move(mx, my - 8).to(mx + 6, my).to(mx - 6, my).close().str(),
                     svg::fill(kMeasured));
      g += svg::text(mx + 9, my + 1, label, svg::font(11, "start", kMeasured), {{"class", "measured-value"}});
      s += svg::group(g, "run " + m->id + ": " + label + "; predicted " + secs(step_s) + " · " + tflops(tf),
                      {{"class", "measured-marker"}, {"data-seconds", raw(*ms)}});
    }
  }
  // Legend under the bars, four per line.
  const double ly = axis_y + 30;
  for (size_t i = 0; i < std::size(kTime); ++i) {
    const double x = left + double(i % 4) * 190, yy = ly + 20 * double(i / 4);
    s += svg::rect(x, yy, 14, 14, svg::fill(kTime[i].colour), kTime[i].label,
                   {{"class", "legend-swatch"}, {"data-category", kTime[i].key}});
    s += svg::text(x + 20, yy + 11, kTime[i].label, svg::font(12));
  }
  return svg::document(W, H, s, "step time by category");
}

// Pareto front of the search: peak memory against TFLOP/s per GPU, every front plan a point with its name on hover;
// the chosen plan and the reduced recipe marked and labelled; measured runs as crosses.
// The layout part of plan_label ("TP1 PP1 CP4 EP8"): what fits beside a point; the hover title has the rest.
std::string layout_label(const Plan& p) {
  const std::string full = plan_label(p);
  return full.substr(0, full.find(" · "));
}

// Places a point's label beside it: the first of eight spots (right or left, above or below, near then farther)
// whose box covers nothing taken and stays inside the plot, else the first spot inside it. Boxes: svg::text_width
// wide, 0.8 em above the baseline and 0.2 em below.
struct LabelPlacer {
  struct Box {
    double x0, y0, x1, y1;
  };
  struct Spot {
    double x, y;
    std::string anchor;
  };
  double left, top, right, bottom;
  std::vector<Box> taken;

  Spot place(double x, double y, const std::string& text, double size, bool below_first) {
    const double w = svg::text_width(text, size);
    std::vector<Spot> spots;
    for (double dy : {14.0, 34.0, 54.0})
      for (bool below : {below_first, !below_first})
        for (bool right_side : {x < (left + right) / 2, x >= (left + right) / 2})
          spots.push_back({right_side ? x + 14 : x - 14, below ? y + dy + 0.8 * size : y - dy, right_side ? "start" : "end"});
    const Spot* inside = nullptr;
    for (const Spot& s : spots) {
      const Box b{s.anchor == "start" ? s.x : s.x - w, s.y - 0.8 * size, s.anchor == "start" ? s.x + w : s.x, s.y + 0.2 * size};
      if (b.x0 < left || b.x1 > right || b.y0 < top || b.y1 > bottom) continue;
      if (!inside) inside = &s;
      if (std::none_of(taken.begin(), taken.end(), [&](const Box& t) {
            return b.x0 < t.x1 && t.x0 < b.x1 && b.y0 < t.y1 && t.y0 < b.y1;
          })) {
        taken.push_back(b);
        return s;
      }
    }
    return inside ? *inside : spots.front();
  }
};

std::string pareto_chart(const json& search, const std::vector<MeasuredRun>& runs, const Hardware& hw) {
  const json& front = search.at("pareto");
  const json* best = search.contains("top") && !search.at("top").empty() ? &search.at("top")[0] : nullptr;
  const json* recipe = search.contains("reduced_recipe") && search.at("reduced_recipe").contains("estimate")
                           ? &search.at("reduced_recipe").at("estimate")
                           : nullptr;
  struct Pt {
    double gib, tf;
  };
  std::vector<Pt> all;
  for (const json& c : front) all.push_back({value(c, "memory/peak_bytes") / GiB, value(c, "time/tflops_per_gpu")});
  if (recipe) all.push_back({value(*recipe, "memory/peak_bytes") / GiB, value(*recipe, "time/tflops_per_gpu")});
  std::vector<std::pair<const MeasuredRun*, const json*>> measured_pts;  // a run and the record of its plan
  auto add_measured = [&](const json& rec) {
    const Plan p = record_plan(rec);
    for (const MeasuredRun* m : runs_for(runs, p, hw))
      if (m->peak_bytes && measured_tflops(*m, rec)) {
        bool seen = false;
        for (const auto& [mm, _] : measured_pts) seen = seen || mm == m;
        if (seen) continue;
        measured_pts.push_back({m, &rec});
        all.push_back({*m->peak_bytes / GiB, *measured_tflops(*m, rec)});
      }
  };
  for (const json& c : front) add_measured(c);
  if (recipe) add_measured(*recipe);

  double x0 = 1e300, x1 = -1e300, y0 = 1e300, y1 = -1e300;
  for (const Pt& p : all) {
    x0 = std::min(x0, p.gib), x1 = std::max(x1, p.gib), y0 = std::min(y0, p.tf), y1 = std::max(y1, p.tf);
  }
  if (all.empty()) x0 = 0, x1 = 1, y0 = 0, y1 = 1;
  const double xpad = std::max(1.0, (x1 - x0) * 0.08), ypad = std::max(1.0, (y1 - y0) * 0.1);
  x0 = std::max(0.0, x0 - xpad), x1 += xpad, y0 = std::max(0.0, y0 - ypad), y1 += ypad;

  const double W = 1040, H = 430, left = 70, right = 40, up = 20, down = 50;
  const double plot_w = W - left - right, plot_h = H - up - down;
  auto px = [&](double g) { return left + (g - x0) / (x1 - x0) * plot_w; };
  auto py = [&](double t) { return up + plot_h - (t - y0) / (y1 - y0) * plot_h; };
  std::string s;
  const double xs = tick_step(x1 - x0, 8), ys = tick_step(y1 - y0, 6);
  for (double g = std::ceil(x0 / xs) * xs; g <= x1; g += xs) {
    s += svg::line(px(g), up, px(g), up + plot_h, svg::stroke("#eeeeee"));
    s += svg::text(px(g), up + plot_h + 16, fmt("%g", g), svg::font(11, "middle", "#555"));
  }
  for (double t = std::ceil(y0 / ys) * ys; t <= y1; t += ys) {
    s += svg::line(left, py(t), left + plot_w, py(t), svg::stroke("#eeeeee"));
    s += svg::text(left - 8, py(t) + 4, fmt("%g", t), svg::font(11, "end", "#555"));
  }
  s += svg::line(left, up + plot_h, left + plot_w, up + plot_h, svg::stroke("#555"));
  s += svg::line(left, up, left, up + plot_h, svg::stroke("#555"));
  s += svg::text(left + plot_w / 2, H - 10, "peak memory per GPU (GiB)", svg::font(12, "middle", "#555"));
  s += svg::text(16, up + plot_h / 2, "TFLOP/s per GPU", svg::font(12, "middle", "#555"),
                 {{"transform", "rotate(-90 16 " + num(up + plot_h / 2) + ")"}});

  // The front as a staircase: more memory buys more throughput.
  std::vector<std::pair<double, double>> stairs;
  for (size_t i = 0; i < front.size(); ++i) {
    const double g = value(front[i], "memory/peak_bytes") / GiB, t = value(front[i], "time/tflops_per_gpu");
    if (i > 0) stairs.push_back({px(g), stairs.back().second});
    stairs.push_back({px(g), py(t)});
  }
  if (stairs.size() > 1) s += svg::polyline(stairs, svg::stroke("#9aa7b4", 1.2, "3 3"));

  auto hover = [](const json& rec, const std::string& what) {
    return what + record_plan(rec).model + ": " + plan_label(record_plan(rec)) + " | peak " +
           gib(value(rec, "memory/peak_bytes")) + " | " + tflops(value(rec, "time/tflops_per_gpu")) + " | " +
           fmt("%.0f", value(rec, "time/tokens_per_second_per_gpu")) + " tokens/s per GPU";
  };
  for (size_t i = 0; i < front.size(); ++i) {
    const json& c = front[i];
    s += svg::circle(px(value(c, "memory/peak_bytes") / GiB), py(value(c, "time/tflops_per_gpu")), 5,
                     svg::filled_outline("#4e79a7", "#ffffff", 1, "pareto-point"),
                     hover(c, "Pareto plan " + std::to_string(i + 1) + " of " + std::to_string(front.size()) + ", "),
                     {{"data-index", std::to_string(i)},
                      {"data-plan", plan_label(record_plan(c))},
                      {"data-peak-bytes", raw(value(c, "memory/peak_bytes"))},
                      {"data-tflops", raw(value(c, "time/tflops_per_gpu"))}});
  }
  // The two labels go where they cover no point, no other label and stay inside the plot.
  LabelPlacer placer{left, up, left + plot_w, up + plot_h, {}};
  for (const Pt& p : all) placer.taken.push_back({px(p.gib) - 10, py(p.tf) - 10, px(p.gib) + 10, py(p.tf) + 10});
  if (best) {
    const double x = px(value(*best, "memory/peak_bytes") / GiB), y = py(value(*best, "time/tflops_per_gpu"));
    s += svg::circle(x, y, 10, svg::stroke("#1b9e77", 2.5, "", "chosen-point"), hover(*best, "chosen plan (fastest that fits), "),
                     {{"data-plan", plan_label(record_plan(*best))}});
    const std::string label = "chosen: " + layout_label(record_plan(*best));
    const LabelPlacer::Spot at = placer.place(x, y, label, 12, false);
    s += svg::text(at.x, at.y, label, svg::font(12, at.anchor, "#1b9e77", true), {{"class", "chosen-label"}});
  }
  if (recipe) {
    const double x = px(value(*recipe, "memory/peak_bytes") / GiB), y = py(value(*recipe, "time/tflops_per_gpu"));
    s += svg::path(svg::PathData().move(x, y - 9).to(x + 9, y).to(x, y + 9).to(x - 9, y).close().str(),
                   svg::filled_outline("#f28e2b", "#7f3f00", 1, "recipe-point"),
                   hover(*recipe, "reduced recipe (article section 2.5 rules), "),
                   {{"data-plan", plan_label(record_plan(*recipe))}});
    const std::string label = "reduced recipe: " + layout_label(record_plan(*recipe));
    const LabelPlacer::Spot at = placer.place(x, y, label, 12, true);
    s += svg::text(at.x, at.y, label, svg::font(12, at.anchor, "#b35900", true), {{"class", "recipe-label"}});
  }
  for (const auto& [m, rec] : measured_pts) {
    const double x = px(*m->peak_bytes / GiB), y = py(*measured_tflops(*m, *rec));
    s += svg::path(svg::PathData().move(x - 6, y - 6).to(x + 6, y + 6).move(x - 6, y + 6).to(x + 6, y - 6).str(),
                   svg::stroke(kMeasured, 2.5, "", "measured-point"),
                   "measured run " + m->id + ": " + gib(*m->peak_bytes) + " | " + tflops(*measured_tflops(*m, *rec)) +
                       " (predicted " + gib(value(*rec, "memory/peak_bytes")) + " | " +
                       tflops(value(*rec, "time/tflops_per_gpu")) + ")");
  }
  return svg::document(W, H, s, "Pareto front: peak memory against TFLOP/s per GPU");
}

// ---- tables ------------------------------------------------------------------------------------------------------

// A table row; the first `text_cols` cells are text (left-aligned in numeric tables).
std::string row(const std::vector<std::string>& cells, bool head, size_t text_cols) {
  std::string r = "<tr>";
  for (size_t i = 0; i < cells.size(); ++i) {
    if (head) r.append("<th>").append(escape(cells[i])).append("</th>");
    else r.append(i < text_cols ? "<td class=\"t\">" : "<td>").append(escape(cells[i])).append("</td>");
  }
  return r + "</tr>\n";
}

std::string table(const std::vector<std::string>& head, const std::vector<std::vector<std::string>>& rows,
                  const std::string& cls, size_t text_cols = 1) {
  std::string t = "<table class=\"" + escape(cls) + "\">\n";
  if (!head.empty()) t += row(head, true, text_cols);
  for (const auto& r : rows) t += row(r, false, text_cols);
  return t + "</table>\n";
}

// Plan fields as "parallel.tp" = "1", in the record's order.
void flatten(const json& j, const std::string& prefix, std::vector<std::vector<std::string>>& out) {
  for (const auto& [k, v] : j.items()) {
    const std::string key = prefix.empty() ? k : prefix + "." + k;
    if (v.is_object()) flatten(v, key, out);
    else out.push_back({key, v.is_string() ? v.get<std::string>() : v.dump()});
  }
}

std::string model_table(const ModelSpec& m) {
  const ParamCounts c = count_params(m);
  std::vector<std::vector<std::string>> rows = {
      {"model", m.name},
      {"decoder layers", std::to_string(m.layers.size()) + " (" + layer_mix(m) + ")"},
      {"hidden size", std::to_string(m.hidden)},
      {"vocabulary", std::to_string(m.vocab)},
  };
  if (m.attn.heads > 0)
    rows.push_back({"attention heads / KV heads / head dim",
                    std::to_string(m.attn.heads) + " / " + std::to_string(m.attn.kv_heads) + " / " + std::to_string(m.attn.head_dim)});
  if (m.moe.num_experts > 0)
    rows.push_back({"experts", std::to_string(m.moe.num_experts) + " routed, top " + std::to_string(m.moe.top_k) +
                                   ", expert FFN " + std::to_string(m.moe.expert_ffn) +
                                   (m.moe.shared_experts > 0 ? ", " + std::to_string(m.moe.shared_experts) + " shared" : "")});
  if (m.dense_ffn > 0) rows.push_back({"dense FFN", std::to_string(m.dense_ffn)});
  if (m.mtp_layers > 0) rows.push_back({"MTP modules", std::to_string(m.mtp_layers)});
  rows.push_back({"parameters (total / active)", fmt("%.2f", c.total / 1e9) + " B / " + fmt("%.2f", c.active / 1e9) + " B"});
  return table({"model", "value"}, rows, "kv");
}

std::string memory_table(const json& record) {
  std::vector<std::string> head = {"stage", "phase", "layers", "in-flight mb"};
  for (const Category& c : kMemory) head.push_back(c.label);
  head.push_back("peak GiB");
  std::vector<std::vector<std::string>> rows;
  for (const json& st : record.at("memory").at("stages")) {
    std::vector<std::string> r = {fmt("%.0f", value(st, "stage")), string_at(st, "peak_phase"), fmt("%.0f", value(st, "layers")),
                                  fmt("%.2f", value(st, "inflight_microbatches"))};
    for (const Category& c : kMemory) r.push_back(fmt("%.2f", value(st, std::string("breakdown/") + c.key) / GiB));
    r.push_back(fmt("%.2f", value(st, "peak_bytes") / GiB));
    rows.push_back(r);
  }
  return table(head, rows, "num");
}

std::string time_table(const json& record) {
  const double step = value(record, "time/step_seconds");
  std::vector<std::vector<std::string>> rows;
  for (const Category& c : kTime) {
    const double v = value(record, std::string("time/breakdown/") + c.key);
    rows.push_back({c.label, fmt("%.3f", v), percent(step > 0 ? v / step : 0)});
  }
  rows.push_back({"step", fmt("%.3f", step), "100.0%"});
  return table({"time category", "seconds", "share"}, rows, "num");
}

// The headline numbers of one record, and its bands and measured runs when present.
std::string summary_table(const json& rec, const std::vector<const MeasuredRun*>& measured) {
  const double peak = value(rec, "memory/peak_bytes"), capacity = value(rec, "memory/capacity_bytes");
  const bool fits = rec.contains("fits") && rec.at("fits").is_boolean() && rec.at("fits").get<bool>();
  const bool fits_at_estimate = rec.contains("fits_at_estimate") && rec.at("fits_at_estimate").is_boolean() &&
                                rec.at("fits_at_estimate").get<bool>();
  std::vector<std::vector<std::string>> rows = {
      {"peak memory per GPU", gib(peak) + " (" + gb(peak) + ")"},
      {"peak stage / phase", fmt("%.0f", value(rec, "memory/peak_stage")) + " / " + string_at(rec.at("memory"), "peak_phase")},
      {"HBM capacity", gib(capacity) + (fits ? " (fits)" : std::string(" (") + fit_verdict(fits, fits_at_estimate) + ")")},
      {"step time", secs(value(rec, "time/step_seconds"))},
      {"throughput", tflops(value(rec, "time/tflops_per_gpu")) + " per GPU (model FLOPs), MFU " + percent(value(rec, "time/mfu"))},
      {"tokens/s per GPU", fmt("%.0f", value(rec, "time/tokens_per_second_per_gpu"))},
      {"bottleneck", string_at(rec.at("time"), "bottleneck")},
  };
  if (auto b = band(rec, "memory", "low_bytes", "high_bytes")) rows.push_back({"peak memory band", gib(b->low) + " to " + gib(b->high)});
  if (auto b = band(rec, "time", "low_seconds", "high_seconds")) rows.push_back({"step time band", secs(b->low) + " to " + secs(b->high)});
  if (auto b = band(rec, "time", "low_tflops", "high_tflops"))
    rows.push_back({"throughput band", fmt("%.1f", std::min(b->low, b->high)) + " to " + tflops(std::max(b->low, b->high))});
  for (const MeasuredRun* m : measured) {
    if (m->peak_bytes)
      rows.push_back({"measured peak (" + m->id + ")", gib(*m->peak_bytes) + ", predicted " + percent(peak / *m->peak_bytes - 1) + " off"});
    if (auto s = measured_seconds(*m, rec))
      rows.push_back({"measured step (" + m->id + ")",
                      secs(*s) + (m->step_seconds ? "" : " (from its TFLOP/s)") + ", predicted " +
                          percent(value(rec, "time/step_seconds") / *s - 1) + " off"});
    if (auto t = measured_tflops(*m, rec)) rows.push_back({"measured throughput (" + m->id + ")", tflops(*t)});
  }
  return table({"summary", "value"}, rows, "kv");
}

// A measured run's breakdown as rows of GiB, nested objects (per-phase peaks) flattened with dots.
void breakdown_rows(const json& j, const std::string& prefix, std::vector<std::vector<std::string>>& out) {
  for (const auto& [k, v] : j.items()) {
    const std::string key = prefix.empty() ? k : prefix + "." + k;
    if (v.is_object()) breakdown_rows(v, key, out);
    else if (v.is_number()) out.push_back({key, fmt("%.2f", v.get<double>() / GiB)});
  }
}

std::string list(const json& items) {
  std::string s = "<ul>\n";
  if (items.is_array())
    for (const json& i : items)
      if (i.is_string()) s += "<li>" + escape(i.get<std::string>()) + "</li>\n";
  return s + "</ul>\n";
}

const char* kCss = R"(
body { font-family: system-ui, -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 24px; color: #222;
       background: #fff; max-width: 1100px; }
h1 { font-size: 22px; margin: 0 0 4px 0; }
h2 { font-size: 17px; margin: 28px 0 8px 0; border-bottom: 1px solid #ddd; padding-bottom: 4px; }
h3 { font-size: 14px; margin: 16px 0 6px 0; }
p.sub, p.note { color: #555; margin: 4px 0; font-size: 13px; }
code { background: #f3f3f3; padding: 1px 4px; border-radius: 3px; font-size: 12px; overflow-wrap: anywhere; }
table { border-collapse: collapse; font-size: 12px; margin: 6px 0 10px 0; }
th, td { border: 1px solid #ddd; padding: 3px 7px; text-align: left; vertical-align: top; }
th { background: #f5f5f5; }
table.num td { text-align: right; font-variant-numeric: tabular-nums; }
table.num td.t { text-align: left; }
.cols { display: flex; gap: 24px; flex-wrap: wrap; align-items: flex-start; }
.warn { color: #a04000; }
.gap { font-weight: bold; }
svg { display: block; margin: 6px 0; }
)";

}  // namespace

bool same_plan(const Plan& a, const Plan& b, const Hardware& hw) {
  auto key = [&](Plan p) {
    p.gpus_per_node = nvlink_domain_gpus(p, hw);
    return plan_to_json(p);  // writes the effective global batch
  };
  return key(a) == key(b);
}

std::vector<MeasuredRun> measured_runs_from_json(const nlohmann::json& j, const std::string& where) {
  // calibrate's parser checks every field it knows; "breakdown" (optional) is checked here and kept as given.
  json list = j.is_object() && !j.contains("measurements") && j.contains("plan") ? json::array({j}) : j;
  json* items = list.is_object() && list.contains("measurements") ? &list["measurements"] : &list;
  std::vector<json> breakdowns;
  if (items->is_array()) {
    for (json& r : *items) {
      json b;
      if (r.is_object() && r.contains("breakdown")) {
        b = r.at("breakdown");
        r.erase("breakdown");
        const std::string rid = r.contains("id") && r.at("id").is_string() ? " \"" + r.at("id").get<std::string>() + "\"" : "";
        bool ok = b.is_object();
        for (const auto& [k, v] : b.items()) {
          if (v.is_number()) ok = ok && v.get<double>() >= 0;
          else if (v.is_object())
            for (const auto& [k2, v2] : v.items()) ok = ok && v2.is_number() && v2.get<double>() >= 0;
          else ok = false;
        }
        if (!ok)
          throw UserError(where + ": the breakdown of measurement" + rid +
                          " must be an object of byte counts (numbers of at least 0, or objects of them such as "
                          "per-phase peaks)");
      }
      breakdowns.push_back(b);
    }
  }
  const std::vector<Measurement> ms = measurements_from_json(list, where);
  std::vector<MeasuredRun> out;
  for (size_t i = 0; i < ms.size(); ++i) {
    if (ms[i].scope != MeasurementScope::Step) continue;
    if (const std::string e = scaled_record_error(ms[i]); !e.empty()) throw UserError(where + ": " + e);
    out.push_back({ms[i].id, ms[i].plan, ms[i].peak_bytes, ms[i].step_seconds, ms[i].tflops_per_gpu,
                   i < breakdowns.size() ? breakdowns[i] : json()});
  }
  if (out.empty())
    throw UserError(where + " holds no whole-step measurement (scope \"step\"); a report draws steps, not single MoE layers");
  return out;
}

size_t matched_measured_runs(const ReportInput& in) {
  std::vector<Plan> drawn = {record_plan(in.estimate)};
  if (in.search.is_object()) {
    for (const char* k : {"top", "pareto"})
      if (in.search.contains(k))
        for (const json& c : in.search.at(k)) drawn.push_back(record_plan(c));
    if (in.search.contains("reduced_recipe") && in.search.at("reduced_recipe").contains("estimate"))
      drawn.push_back(record_plan(in.search.at("reduced_recipe").at("estimate")));
  }
  size_t n = 0;
  for (const MeasuredRun& r : in.measured)
    n += std::any_of(drawn.begin(), drawn.end(), [&](const Plan& p) { return same_plan(r.plan, p, in.hardware); });
  return n;
}

// A search over a length distribution (`search --seq-lengths`): its best plans, each over every drawn step, with the
// token budget it packs by, the expected step and its spread, the straggler's share and the fullest microbatch's peak.
std::string batch_search_section(const json& s) {
  std::vector<std::vector<std::string>> rows;
  int rank = 1;
  for (const json& c : s.at("top")) {
    const json& b = c.at("batches");
    rows.push_back({std::to_string(rank++), plan_label(record_plan(c)), fmt("%.0f", value(c, "tokens_per_microbatch")),
                    fmt("%.0f", value(b, "tokens_per_second_per_gpu")), fmt("%.3f", value(b, "step_seconds/mean")),
                    fmt("%.3f", value(b, "step_seconds/p10")) + " - " + fmt("%.3f", value(b, "step_seconds/p90")),
                    fmt("%.1f%%", 100 * value(b, "straggler_share")), fmt("%.2f", value(b, "peak_bytes/max") / GiB)});
  }
  return "<h2>Best plans over the drawn batches</h2>\n<p class=\"sub\">" + fmt("%.0f", value(s, "searches")) +
         " fixed-length searches (CP size x token budget), " + fmt("%.0f", value(s, "candidates")) + " candidates, " +
         fmt("%.0f", value(s, "feasible")) + " fit their fullest microbatch; searched in " +
         fmt("%.1f", value(s, "seconds") * 1e3) + " ms</p>\n" +
         table({"#", "plan", "tokens per GPU per microbatch", "tokens/s per GPU", "step s (mean)", "step s (p10 - p90)",
                "straggler", "peak GiB (fullest)"},
               rows, "num", 2);
}

// Variable-length batches (`estimate --seq-lengths`): the drawn microbatches' tokens as a histogram, the peak by
// percentile and the step with its straggler.
std::string batches_section(const json& b) {
  std::string o = "<h3>Variable-length batches</h3>\n";
  const json& bins = b.at("token_histogram");
  double most = 0;
  for (const json& bin : bins) most = std::max(most, bin.at(2).get<double>());
  const double W = 720, H = 220, left = 60, bottom = 40, up = 14, plot_w = W - left - 20, plot_h = H - bottom - up;
  std::string s;
  const double bar_w = bins.empty() ? 0 : plot_w / double(bins.size());
  for (size_t i = 0; i < bins.size(); ++i) {
    const double lo = bins[i].at(0).get<double>(), hi = bins[i].at(1).get<double>(), n = bins[i].at(2).get<double>();
    const double h = most > 0 ? plot_h * n / most : 0;
    s += svg::rect(left + bar_w * double(i) + 1, up + plot_h - h, bar_w - 2, h, svg::fill("#4e79a7", "batch-bin"),
                   fmt("%.0f", n) + " microbatches of " + fmt("%.0f", lo) + " to " + fmt("%.0f", hi) + " tokens");
  }
  s += svg::line(left, up + plot_h, left + plot_w, up + plot_h, svg::stroke("#555"));
  if (!bins.empty()) {
    s += svg::text(left, up + plot_h + 16, "0", svg::font(11, "start", "#555"));
    s += svg::text(left + plot_w, up + plot_h + 16, fmt("%.0f", bins.back().at(1).get<double>()) + " tokens",
                   svg::font(11, "end", "#555"));
  }
  s += svg::text(left - 6, up + 10, fmt("%.0f", most), svg::font(11, "end", "#555"));
  s += svg::text(left + plot_w / 2, H - 6, "tokens per microbatch (drawn steps)", svg::font(11, "middle", "#555"));
  o += svg::document(W, H, s, "histogram of tokens per microbatch");
  std::vector<std::vector<std::string>> rows = {
      {"peak at the median / 90th / 99th percentile / fullest microbatch",
       fmt("%.2f", value(b, "peak_bytes/p50") / GiB) + " / " + fmt("%.2f", value(b, "peak_bytes/p90") / GiB) + " / " +
           fmt("%.2f", value(b, "peak_bytes/p99") / GiB) + " / " + fmt("%.2f", value(b, "peak_bytes/max") / GiB) + " GiB"},
      {"expected step (10th-90th percentile of the drawn steps)",
       fmt("%.3f", value(b, "step_seconds/mean")) + " s (" + fmt("%.3f", value(b, "step_seconds/p10")) + "-" +
           fmt("%.3f", value(b, "step_seconds/p90")) + " s)"},
      {"the mean DP rank's step; the straggler's share", fmt("%.3f", value(b, "mean_rank_step_seconds")) + " s; " +
                                                             percent(value(b, "straggler_share"))},
      {"throughput", fmt("%.1f", value(b, "tflops_per_gpu")) + " TFLOP/s, " +
                         fmt("%.0f", value(b, "tokens_per_second_per_gpu")) + " tokens/s per GPU"},
      {"microbatches per DP rank", fmt("%.1f", value(b, "microbatches_per_dp_rank"))}};
  return o + table({"over the drawn batches", "value"}, rows, "kv");
}

std::string report_html(const ReportInput& in) {
  const json& rec = in.estimate;
  const Plan plan = record_plan(rec);
  const bool is_search = in.search.is_object(), is_batch_search = in.batch_search.is_object();
  const json* recipe = is_search && in.search.contains("reduced_recipe") && in.search.at("reduced_recipe").contains("estimate")
                           ? &in.search.at("reduced_recipe").at("estimate")
                           : nullptr;
  const auto measured = runs_for(in.measured, plan, in.hardware);

  std::ostringstream o;
  const std::string seq = plan.seq_len % 1024 == 0 ? std::to_string(plan.seq_len / 1024) + "K" : std::to_string(plan.seq_len);
  const std::string title = "lcplan report: " + in.model.name + " on " + std::to_string(plan.gpus) + " x " +
                            in.hardware.name + ", " + seq + " tokens per sequence";
  o << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>" << escape(title) << "</title>\n"
    << "<style>" << kCss << "</style>\n</head>\n<body>\n";
  o << "<h1>" << escape(title) << "</h1>\n";
  o << "<p class=\"sub\">"
    << escape(is_search         ? "search: the fastest plan that fits, the Pareto front and the reduced recipe"
              : is_batch_search ? "search over a length distribution: the most expected tokens/s whose fullest "
                                  "microbatch fits"
                                : "estimate of one plan")
    << (in.command.empty() ? "" : " &middot; <code>" + escape(in.command) + "</code>") << "</p>\n";
  o << "<p class=\"note\">Memory in GiB (2<sup>30</sup> bytes) per GPU; TFLOP/s are model FLOPs per GPU (recompute not "
       "counted). Hover a bar segment or a point for its numbers.</p>\n";

  o << "<h2>" << (is_search || is_batch_search ? "Chosen plan: " : "Plan: ") << escape(plan_label(plan)) << "</h2>\n";
  o << "<div class=\"cols\"><div>" << summary_table(rec, measured) << "</div><div>" << model_table(in.model)
    << "</div></div>\n";
  if (rec.contains("warnings") && !rec.at("warnings").empty()) o << "<div class=\"warn\">" << list(rec.at("warnings")) << "</div>\n";

  // A search's overview first: the front it found, with the chosen plan and the reduced recipe on it.
  if (is_search) {
    const json& s = in.search;
    o << "<h3>Pareto front of the search (" << s.at("pareto").size() << " plans)</h3>\n<p class=\"sub\">"
      << fmt("%.0f", value(s, "candidates")) << " candidate plans, " << fmt("%.0f", value(s, "evaluated"))
      << " passed the rules, " << fmt("%.0f", value(s, "feasible")) << " fit; searched in "
      << fmt("%.1f", value(s, "seconds") * 1e3) << " ms</p>\n"
      << pareto_chart(s, in.measured, in.hardware);
  }
  if (rec.contains("batches")) o << batches_section(rec.at("batches"));
  o << "<h3>Peak memory per pipeline stage" << (rec.contains("batches") ? " at the fullest microbatch" : "") << "</h3>\n"
    << memory_chart(rec, measured, plan_label(plan)) << memory_table(rec);
  o << "<h3>Step time</h3>\n";
  std::vector<TimeRow> rows = {{is_search || is_batch_search ? "chosen plan" : "plan", &rec, measured}};
  if (recipe) rows.push_back({"reduced recipe", recipe, runs_for(in.measured, record_plan(*recipe), in.hardware)});
  o << time_chart(rows) << time_table(rec);
  if (is_batch_search) o << batch_search_section(in.batch_search);

  if (is_search) {
    const json& s = in.search;
    std::vector<std::vector<std::string>> top_rows;
    int rank = 1;
    for (const json& c : s.at("top"))
      top_rows.push_back({std::to_string(rank++), plan_label(record_plan(c)), fmt("%.2f", value(c, "memory/peak_bytes") / GiB),
                          fmt("%.1f", value(c, "time/tflops_per_gpu")), fmt("%.0f", value(c, "time/tokens_per_second_per_gpu")),
                          string_at(c.at("time"), "bottleneck")});
    o << "<h2>Best plans of the search</h2>\n"
      << table({"#", "plan", "peak GiB", "TFLOP/s", "tokens/s per GPU", "bottleneck"}, top_rows, "num", 2);

    o << "<h2>Reduced recipe (article section 2.5 rules)</h2>\n";
    const json& rr = s.at("reduced_recipe");
    if (recipe) {
      const Plan rp = record_plan(*recipe);
      o << "<p><b>" << escape(plan_label(rp)) << "</b>: peak " << escape(gib(value(*recipe, "memory/peak_bytes"))) << ", "
        << escape(tflops(value(*recipe, "time/tflops_per_gpu"))) << ", "
        << fmt("%.0f", value(*recipe, "time/tokens_per_second_per_gpu")) << " tokens/s per GPU</p>\n";
      o << "<h3>Rationale</h3>\n" << list(rr.value("rationale", json::array()));
      const double gap = value(rr, "throughput_gap"), dmem = value(rr, "memory_delta_bytes");
      o << "<p class=\"gap\">Gap to the exhaustive best: " << escape(percent(gap)) << " less throughput ("
        << escape(tflops(value(*recipe, "time/tflops_per_gpu"))) << " against " << escape(tflops(value(rec, "time/tflops_per_gpu")))
        << "), " << escape(fmt("%+.2f", dmem / GiB)) << " GiB peak memory.</p>\n";
      o << "<h3>Reduced recipe: peak memory per pipeline stage</h3>\n"
        << memory_chart(*recipe, runs_for(in.measured, rp, in.hardware), "reduced recipe") << memory_table(*recipe);
    } else {
      o << "<p>No plan following or bending the rules fits.</p>\n";
    }
    if (rr.contains("broken") && !rr.at("broken").empty()) o << "<h3>Rules bent, or why the recipe loses</h3>\n" << list(rr.at("broken"));
  }

  // The recipe record in full, two fields to a row.
  std::vector<std::vector<std::string>> fields, plan_rows;
  flatten(rec.at("plan"), "", fields);
  const size_t half = (fields.size() + 1) / 2;
  for (size_t i = 0; i < half; ++i) {
    std::vector<std::string> r = fields[i];
    if (i + half < fields.size()) r.insert(r.end(), fields[i + half].begin(), fields[i + half].end());
    plan_rows.push_back(r);
  }
  o << "<h2>" << (is_search || is_batch_search ? "Chosen plan" : "Plan") << " as recipe.json fields</h2>\n"
    << table({"field", "value", "field", "value"}, plan_rows, "kv");

  if (!in.measured.empty()) {
    o << "<h2>Measured runs</h2>\n";
    std::vector<std::vector<std::string>> mrows;
    for (const MeasuredRun& m : in.measured) {
      mrows.push_back({m.id, plan_label(m.plan), m.peak_bytes ? fmt("%.2f", *m.peak_bytes / GiB) : "-",
                       m.step_seconds ? fmt("%.3f", *m.step_seconds) : "-", m.tflops_per_gpu ? fmt("%.1f", *m.tflops_per_gpu) : "-"});
    }
    o << table({"run", "plan", "peak GiB", "step s", "TFLOP/s"}, mrows, "num", 2);
    for (const MeasuredRun& m : in.measured) {
      if (!m.breakdown.is_object() || m.breakdown.empty()) continue;
      std::vector<std::vector<std::string>> brows;
      breakdown_rows(m.breakdown, "", brows);
      o << "<h3>Measured breakdown of " << escape(m.id) << "</h3>\n" << table({"entry", "GiB"}, brows, "num");
    }
  }
  o << "<p class=\"note\">Generated by lcplan. Self-contained: no scripts, fonts or images are loaded.</p>\n</body>\n</html>\n";
  return o.str();
}

}  // namespace lcplan
