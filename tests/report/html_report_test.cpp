// The report page, built in-process from estimate and search records: bar heights proportional to the record's
// bytes and seconds, numbers printed as the record has them, the error bands and measured runs where they are drawn,
// the Pareto front one point per plan with hover titles naming it, escaping, and nothing that loads from elsewhere.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "common/data_dir.h"
#include "common/user_error.h"
#include "estimator/estimate.h"
#include "estimator/packing.h"
#include "estimator/plan_rules.h"
#include "models/zoo.h"
#include "report/html_report.h"
#include "report/svg.h"
#include "search/batch_search.h"
#include "search/emit.h"
#include "search/reduce.h"
#include "search/search.h"
#include "markup.h"

using namespace lcplan;
using nlohmann::json;
using report_test::Element;
using report_test::Markup;
using report_test::scan;

namespace {

constexpr double GiB = 1024.0 * 1024.0 * 1024.0;

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// The article's recipe with PP 2, so the memory chart has two stages.
Plan reference_plan() {
  Plan p;
  p.model = "qwen3.5-35b-a3b";
  p.gpus = 32;
  p.gpus_per_node = 8;
  p.seq_len = 131072;
  p.parallel.pp = 2;
  p.parallel.ep = 8;
  p.parallel.cp = 4;
  p.optimizer_sharding = OptimizerSharding::Fsdp;
  p.recompute = Recompute::Full;
  p.linear_ce = true;
  p.moe.ep_chunks = 2;
  p.implementation = "bumblebee";
  return p;
}

struct Inputs {
  ModelSpec model;
  Hardware hw;
  Calibration cal;
};

Inputs inputs(const Plan& p) {
  const std::string dir = data_dir();
  return {load_model(p.model, dir), load_hardware(p.hardware, dir), calibration_for(load_calibration("default", dir), p.hardware, p.implementation)};
}

ReportInput estimate_input(const Plan& p) {
  const Inputs in = inputs(p);
  require_valid_plan(in.model, p);
  ReportInput r;
  r.model = in.model;
  r.hardware = in.hw;
  r.estimate = estimate_to_json(estimate(in.model, p, in.hw, in.cal), p);
  return r;
}

// A text's box as a browser lays it out, estimated: 0.62 em per character (UTF-8 code points) from its anchor,
// 0.8 em above the baseline and 0.2 em below. Rotated texts (the axis titles) are left out.
struct Box {
  double x0, y0, x1, y1;
  bool meets(const Box& o) const { return x0 < o.x1 && o.x0 < x1 && y0 < o.y1 && o.y0 < y1; }
};

Box text_box(const Element& t) {
  double chars = 0;
  for (unsigned char c : t.text) chars += (c & 0xC0) != 0x80;
  const double size = t.num("font-size"), w = 0.62 * size * chars, x = t.num("x"), y = t.num("y");
  const std::string a = t.attr("text-anchor");
  const double x0 = a == "end" ? x - w : a == "middle" ? x - w / 2 : x;
  return {x0, y - 0.8 * size, x0 + w, y + 0.2 * size};
}

void collect_texts(const Markup& m, const Element& e, std::vector<const Element*>& out) {
  for (int c : e.children) {
    const Element& k = m.elements[c];
    if (k.name == "text" && k.attr("transform").empty() && !k.text.empty()) out.push_back(&k);
    collect_texts(m, k, out);
  }
}

// No two labels of one chart overlap, and the Pareto chart's labels cover none of its points (issue 28 item 9).
void expect_no_overlapping_text(const Markup& m, const std::string& page) {
  for (const Element* svg : m.all("svg")) {
    std::vector<const Element*> texts;
    collect_texts(m, *svg, texts);
    for (size_t i = 0; i < texts.size(); ++i) {
      for (size_t j = i + 1; j < texts.size(); ++j)
        EXPECT_FALSE(text_box(*texts[i]).meets(text_box(*texts[j])))
            << page << ": \"" << texts[i]->text << "\" overlaps \"" << texts[j]->text << "\"";
      if (!texts[i]->has_class("chosen-label") && !texts[i]->has_class("recipe-label")) continue;
      for (const Element* pt : m.all("circle", "pareto-point")) {
        const Box dot{pt->num("cx") - 5, pt->num("cy") - 5, pt->num("cx") + 5, pt->num("cy") + 5};
        EXPECT_FALSE(text_box(*texts[i]).meets(dot)) << page << ": \"" << texts[i]->text << "\" covers a Pareto point";
      }
    }
  }
}

Markup page(const ReportInput& in) {
  Markup m = scan(report_html(in));
  EXPECT_EQ(m.error, "") << "the page does not scan as well-formed markup";
  return m;
}

// Segments of a stacked bar: heights proportional to their values with one scale for the whole chart, each sitting
// on the one below. `size` is the length attribute ("height" or "width"), `pos` its position ("y" or "x").
double check_proportional(const std::vector<const Element*>& segs, const char* value_attr, const char* size) {
  double sum_px = 0, sum_v = 0;
  for (const Element* e : segs) sum_px += e->num(size), sum_v += e->num(value_attr);
  EXPECT_GT(sum_v, 0);
  const double k = sum_px / sum_v;
  // Each length is written to 0.01 px (+-0.005), and k inherits the n segments' rounding: at most 0.005 (n + 1) px.
  const double tolerance = 0.005 * double(segs.size() + 1) + 1e-9;
  for (const Element* e : segs)
    EXPECT_NEAR(e->num(size), e->num(value_attr) * k, tolerance)
        << e->attr("data-category") << ": " << e->num(size) << " px for " << e->attr(value_attr);
  return k;
}

TEST(Svg, EscapesAndFormats) {
  EXPECT_EQ(svg::escape("a<b>&\"c'd"), "a&lt;b&gt;&amp;&quot;c&#39;d");
  EXPECT_EQ(svg::num(1.005), "1.00");  // two decimals, as printed
  EXPECT_EQ(svg::num(-0.001), "0.00");
  EXPECT_EQ(svg::num(std::nan("")), "0.00");
  const std::string r = svg::rect(1, 2, 3, -4, svg::fill("#fff"), "a <title> & more", {{"data-x", "\"q\""}});
  EXPECT_NE(r.find("height=\"0.00\""), std::string::npos) << r;
  EXPECT_NE(r.find("<title>a &lt;title&gt; &amp; more</title></rect>"), std::string::npos) << r;
  EXPECT_NE(r.find("data-x=\"&quot;q&quot;\""), std::string::npos) << r;
  EXPECT_EQ(svg::PathData().move(0, 1).to(2, 3).close().str(), "M0.00 1.00 L2.00 3.00 Z");
  const Markup m = scan(svg::document(10, 10, r + svg::text(1, 1, "<&>\"") + svg::polyline({{0, 0}, {1, 1}}, svg::stroke("#000")),
                                      "label \"x\""));
  EXPECT_EQ(m.error, "");
  ASSERT_EQ(m.all("text").size(), 1u);
  EXPECT_EQ(m.all("text")[0]->text, "<&>\"");
}

TEST(Report, MemoryBarsAreProportionalToTheRecordsBytes) {
  const ReportInput in = estimate_input(reference_plan());
  const Markup m = page(in);
  const auto segs = m.all("rect", "mem-seg");
  const json& stages = in.estimate["memory"]["stages"];
  ASSERT_EQ(stages.size(), 2u);
  ASSERT_EQ(segs.size(), 2u * 10u) << "one segment per category per stage";
  const double k = check_proportional(segs, "data-bytes", "height");
  for (const Element* e : segs) {
    const json& st = stages[std::stoi(e->attr("data-stage"))];
    // The record's own numbers, exactly.
    EXPECT_EQ(e->num("data-bytes"), st["breakdown"][e->attr("data-category")].get<double>()) << e->attr("data-category");
    EXPECT_NE(m.title_of(*e).find(fmt("%.2f GiB", e->num("data-bytes") / GiB)), std::string::npos) << m.title_of(*e);
  }
  // Segments stack: each sits on the one below, and a bar is as tall as its stage's peak.
  for (const json& st : stages) {
    double bottom = -1, height = 0;
    for (const Element* e : segs) {
      if (e->attr("data-stage") != std::to_string(st["stage"].get<int>())) continue;
      if (bottom >= 0) {
        EXPECT_NEAR(e->num("y") + e->num("height"), bottom, 0.02);  // three coordinates printed to 0.01 px
      }
      bottom = e->num("y");
      height += e->num("height");
    }
    EXPECT_NEAR(height, st["peak_bytes"].get<double>() * k, 0.11);
  }
  // Totals printed over the bars are the record's, in GiB with two decimals.
  const auto totals = m.all("text", "stage-total");
  ASSERT_EQ(totals.size(), 2u);
  for (size_t i = 0; i < 2; ++i) EXPECT_EQ(totals[i]->text, fmt("%.2f GiB", stages[i]["peak_bytes"].get<double>() / GiB));
  // The capacity line at the record's capacity on the same scale.
  const auto cap = m.all("line", "capacity");
  ASSERT_EQ(cap.size(), 1u);
  const double base = segs[0]->num("y") + segs[0]->num("height");
  // base (y + height) and y1 are each printed to 0.01 px, and k comes from rounded heights: 0.025 px covers both.
  EXPECT_NEAR(base - cap[0]->num("y1"), in.estimate["memory"]["capacity_bytes"].get<double>() * k, 0.025);
  // Every category has its legend swatch in its fixed colour, the same as its segments.
  for (const Element* e : segs) {
    bool found = false;
    for (const Element* s : m.all("rect", "legend-swatch"))
      found = found || (s->attr("data-category") == e->attr("data-category") && s->attr("fill") == e->attr("fill"));
    EXPECT_TRUE(found) << e->attr("data-category");
  }
}

TEST(Report, TimeBarIsProportionalAndTotalsAreTheRecords) {
  const ReportInput in = estimate_input(reference_plan());
  const std::string html = report_html(in);
  const Markup m = scan(html);
  ASSERT_EQ(m.error, "");
  const auto segs = m.all("rect", "time-seg");
  ASSERT_EQ(segs.size(), 12u);
  const double k = check_proportional(segs, "data-seconds", "width");
  double width = 0;
  for (const Element* e : segs) width += e->num("width");
  EXPECT_NEAR(width, in.estimate["time"]["step_seconds"].get<double>() * k, 0.1);
  const json& t = in.estimate["time"];
  EXPECT_NE(html.find(fmt("%.1f TFLOP/s", t["tflops_per_gpu"].get<double>())), std::string::npos);
  EXPECT_NE(html.find(fmt("%.3f s", t["step_seconds"].get<double>())), std::string::npos);
  EXPECT_NE(html.find(fmt("%.2f GiB", in.estimate["memory"]["peak_bytes"].get<double>() / GiB)), std::string::npos);
}

TEST(Report, DrawsTheErrorBandsWhenTheRecordCarriesThem) {
  ReportInput in = estimate_input(reference_plan());
  in.estimate["memory"].erase("band");
  in.estimate["time"].erase("band");
  EXPECT_EQ(page(in).all("g", "band").size(), 0u) << "a band drawn that the record does not carry";
  const double peak = in.estimate["memory"]["peak_bytes"], step = in.estimate["time"]["step_seconds"];
  const double tf = in.estimate["time"]["tflops_per_gpu"];
  in.estimate["memory"]["band"] = {{"low_bytes", peak * 0.93}, {"high_bytes", peak * 1.06}, {"points", 10}};
  in.estimate["time"]["band"] = {{"low_seconds", step * 0.9}, {"high_seconds", step * 1.2},
                                 {"low_tflops", tf / 1.2},    {"high_tflops", tf / 0.9}, {"points", 10}};
  const std::string html = report_html(in);
  const Markup m = scan(html);
  ASSERT_EQ(m.error, "");
  const auto bands = m.all("g", "band");
  ASSERT_EQ(bands.size(), 2u);
  // Memory whisker: from low to high on the bars' scale, on the peak stage.
  const auto segs = m.all("rect", "mem-seg");
  const double k = check_proportional(segs, "data-bytes", "height");
  const double base = segs[0]->num("y") + segs[0]->num("height");
  const Element& whisker = m.elements[bands[0]->children.at(1)];  // children: title, then the vertical line
  ASSERT_EQ(whisker.name, "line");
  // Three coordinates printed to 0.01 px and a k from rounded heights (as for the capacity line above).
  EXPECT_NEAR(base - whisker.num("y1"), peak * 0.93 * k, 0.025);
  EXPECT_NEAR(base - whisker.num("y2"), peak * 1.06 * k, 0.025);
  EXPECT_NE(m.title_of(*bands[0]).find(fmt("%.2f GiB", peak * 0.93 / GiB)), std::string::npos);
  // Time whisker, on the time bar's scale.
  const auto tsegs = m.all("rect", "time-seg");
  const double kt = check_proportional(tsegs, "data-seconds", "width");
  const Element& tw = m.elements[bands[1]->children.at(1)];
  // Two coordinates printed with two decimals (0.005 px each), and kt from twelve rounded segments: 0.025 px, as for
  // the memory whisker above.
  EXPECT_NEAR(tw.num("x1") - tsegs[0]->num("x"), step * 0.9 * kt, 0.025);
  EXPECT_NEAR(tw.num("x2") - tsegs[0]->num("x"), step * 1.2 * kt, 0.025);
  // The summary prints the bands in the record's units.
  EXPECT_NE(html.find(fmt("%.2f GiB", peak * 1.06 / GiB)), std::string::npos);
  EXPECT_NE(html.find(fmt("%.1f TFLOP/s", tf / 0.9)), std::string::npos);
}

TEST(Report, MeasuredRunsSitBesideTheirPlansPrediction) {
  ReportInput in = estimate_input(reference_plan());
  const json& st0 = in.estimate["memory"]["stages"][0];
  json breakdown = json::object();
  for (const auto& [k, v] : st0["breakdown"].items()) breakdown[k] = v.get<double>() * 1.02;
  breakdown["phases"] = {{"forward", 3.1e10}, {"backward", 3.6e10}};
  json record = {{"id", "run <1>"}, {"source", "test"},
                 {"plan", in.estimate["plan"]}, {"scope", "step"},
                 {"peak_bytes", 4.0e10},        {"step_seconds", 17.5},
                 {"breakdown", breakdown}};
  in.measured = measured_runs_from_json(json::array({record}), "runs.json");
  ASSERT_EQ(in.measured.size(), 1u);
  EXPECT_EQ(matched_measured_runs(in), 1u);
  const std::string html = report_html(in);
  const Markup m = scan(html);
  ASSERT_EQ(m.error, "");
  const auto markers = m.all("g", "measured-marker");
  ASSERT_EQ(markers.size(), 2u) << "one beside the memory bar, one on the time bar";
  EXPECT_NE(m.deep_text(*markers[0]).find(fmt("measured %.2f GiB", 4.0e10 / GiB)), std::string::npos);
  EXPECT_NE(m.deep_text(*markers[1]).find("measured 17.500 s"), std::string::npos);
  // The measured breakdown is a stacked bar on the same scale as the predicted one.
  auto segs = m.all("rect", "mem-seg");
  const double k = check_proportional(segs, "data-bytes", "height");
  const auto msegs = m.all("rect", "measured-seg");
  ASSERT_EQ(msegs.size(), 10u);
  for (const Element* e : msegs) EXPECT_NEAR(e->num("height"), e->num("data-bytes") * k, 0.011);
  // Per-phase peaks are listed; the id is escaped.
  EXPECT_NE(html.find("phases.backward"), std::string::npos);
  EXPECT_NE(html.find("run &lt;1&gt;"), std::string::npos);

  // A run of another plan is listed but drawn nowhere.
  record["plan"]["parallel"]["cp"] = 8;
  in.measured = measured_runs_from_json(json::array({record}), "runs.json");
  EXPECT_EQ(matched_measured_runs(in), 0u);
  EXPECT_EQ(page(in).all("g", "measured-marker").size(), 0u);
}

TEST(Report, MeasurementFilesAreCheckedLikeCalibratesAndTheBreakdownToo) {
  const json plan = {{"model", "qwen3.5-35b-a3b"}, {"gpus", 32}, {"seq_len", 131072}};
  auto error_of = [](const json& j) {
    try {
      measured_runs_from_json(j, "runs.json");
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error_of(json::array({{{"id", "a"}, {"plan", plan}, {"peak_bytes", 1e10}, {"breakdown", "big"}}})).find("breakdown"),
            std::string::npos);
  EXPECT_NE(error_of(json::array({{{"id", "a"}, {"plan", plan}, {"peak_bytes", 1e10}, {"breakdown", {{"params", -1}}}}}))
                .find("byte counts"),
            std::string::npos);
  EXPECT_NE(error_of(json::array({{{"id", "a"}, {"plan", plan}, {"peak_bytes", 1e10}, {"colour", "red"}}})).find("colour"),
            std::string::npos);
  EXPECT_NE(error_of(json::array({{{"id", "a"}, {"plan", plan}, {"scope", "moe_layer"}, {"step_seconds", 0.1}}})).find("whole-step"),
            std::string::npos);
  // One record alone and {"measurements": [...]} are accepted too.
  EXPECT_EQ(measured_runs_from_json({{"id", "a"}, {"plan", plan}, {"peak_bytes", 1e10}}, "run.json").size(), 1u);
  EXPECT_EQ(measured_runs_from_json({{"measurements", json::array({{{"id", "a"}, {"plan", plan}, {"tflops_per_gpu", 200}}})}}, "r.json")
                .size(),
            1u);
}

TEST(Report, EscapesEveryStringFromTheRecordsAndTheModel) {
  ReportInput in = estimate_input(reference_plan());
  const std::string weird = "/tmp/we<i&r>d\"dir/config.json";
  in.model.name = weird;
  in.estimate["plan"]["model"] = weird;
  in.estimate["warnings"] = json::array({"a <b>warning</b> & \"more\""});
  in.command = "lcplan report --model '" + weird + "'";
  const std::string html = report_html(in);
  EXPECT_EQ(html.find("we<i&r>d\"dir"), std::string::npos) << "the raw path reached the page";
  EXPECT_EQ(html.find("<b>warning"), std::string::npos);
  const Markup m = scan(html);
  ASSERT_EQ(m.error, "");
  EXPECT_NE(m.all("h1").at(0)->text.find(weird), std::string::npos) << "the title, decoded, is not the model path";
}

// The reference case with every dimension free (bumblebee: chunked EP too), as the search pages start from.
Plan search_base() {
  Plan base;
  base.model = "qwen3.5-35b-a3b";
  base.gpus = 32;
  base.gpus_per_node = 8;
  base.seq_len = 131072;
  base.global_batch = 32;
  base.implementation = "bumblebee";
  return base;
}

TEST(Report, SearchPageHasOnePointPerParetoPlanNamedOnHover) {
  const Plan base = search_base();
  const Inputs c = inputs(base);
  SearchOptions opt;
  opt.headroom_bytes = 4.0 * (1 << 30);
  const SearchResult r = search_plans(c.model, base, default_space(c.model, base), c.hw, c.cal, opt);
  const ReducedRecipe recipe = reduce_recipe(c.model, base, c.hw, c.cal, opt, r);
  ASSERT_FALSE(r.top.empty());
  ReportInput in;
  in.model = c.model;
  in.hardware = c.hw;
  in.search = search_json(r, recipe);
  in.estimate = in.search["top"][0];
  const std::string html = report_html(in);
  const Markup m = scan(html);
  ASSERT_EQ(m.error, "");

  const auto points = m.all("circle", "pareto-point");
  ASSERT_EQ(points.size(), in.search["pareto"].size());
  ASSERT_GT(points.size(), 3u);
  for (size_t i = 0; i < points.size(); ++i) {
    const json& c = in.search["pareto"][i];
    const json& q = c["plan"]["parallel"];
    const std::string name = "TP" + std::to_string(q["tp"].get<int>()) + " PP" + std::to_string(q["pp"].get<int>());
    const std::string title = m.title_of(*points[i]);
    EXPECT_NE(title.find(name), std::string::npos) << title;
    EXPECT_NE(title.find("CP" + std::to_string(q["cp"].get<int>()) + " EP" + std::to_string(q["ep"].get<int>())),
              std::string::npos) << title;
    EXPECT_NE(title.find(fmt("%.2f GiB", c["memory"]["peak_bytes"].get<double>() / GiB)), std::string::npos) << title;
    EXPECT_NE(title.find(fmt("%.1f TFLOP/s", c["time"]["tflops_per_gpu"].get<double>())), std::string::npos) << title;
    EXPECT_EQ(points[i]->num("data-peak-bytes"), c["memory"]["peak_bytes"].get<double>());
  }
  // Points lie where their numbers say: more memory further right, more TFLOP/s higher up.
  for (size_t i = 1; i < points.size(); ++i) {
    EXPECT_GE(points[i]->num("cx"), points[i - 1]->num("cx"));
    EXPECT_LE(points[i]->num("cy"), points[i - 1]->num("cy") + 0.011);
  }
  // The chosen plan and the reduced recipe are marked and labelled.
  ASSERT_EQ(m.all("circle", "chosen-point").size(), 1u);
  ASSERT_EQ(m.all("path", "recipe-point").size(), 1u);
  EXPECT_EQ(m.all("text", "chosen-label").at(0)->text.rfind("chosen: ", 0), 0u);
  EXPECT_EQ(m.all("text", "recipe-label").at(0)->text.rfind("reduced recipe: ", 0), 0u);
  EXPECT_NE(m.title_of(*m.all("path", "recipe-point")[0]).find("EP8"), std::string::npos);
  // Rationale and gap, as the search found them.
  for (const json& line : in.search["reduced_recipe"]["rationale"])
    EXPECT_NE(html.find(svg::escape(line.get<std::string>())), std::string::npos) << line;
  EXPECT_NE(html.find(fmt("%.1f%% less throughput", 100 * in.search["reduced_recipe"]["throughput_gap"].get<double>())),
            std::string::npos);
  // Two time bars (chosen plan, reduced recipe) on one scale; two memory charts.
  EXPECT_EQ(m.all("g", "time-bar").size(), 2u);
  check_proportional(m.all("rect", "time-seg"), "data-seconds", "width");
  expect_no_overlapping_text(m, "search page");
}

// Pages of pipelines 1, 4 and 16 stages deep: every label keeps to itself, the peak's label above its whisker.
TEST(Report, LabelsDoNotOverlapAtAnyPipelineDepth) {
  Plan deep;
  deep.model = "llama-3.1-70b";
  deep.gpus = 128;
  deep.gpus_per_node = 8;
  deep.seq_len = 8192;
  deep.parallel.tp = 8;
  deep.parallel.pp = 16;
  Plan shallow = reference_plan(), four = reference_plan();
  shallow.parallel.pp = 1;
  four.parallel.pp = 4;
  for (const Plan& plan : {shallow, four, deep}) {
    const Markup m = page(estimate_input(plan));
    const std::string name = "PP " + std::to_string(plan.parallel.pp);
    EXPECT_EQ(m.all("g", "mem-bar").size(), size_t(plan.parallel.pp)) << name;
    expect_no_overlapping_text(m, name);
    const auto bands = m.all("g", "band");
    if (!bands.empty()) {  // the peak stage's label is above the top of its whisker
      const Element& whisker = m.elements[bands[0]->children.at(1)];
      double label_bottom = 1e9;
      for (const Element* t : m.all("text", "stage-total"))
        if (t->attr("font-weight") == "bold") label_bottom = text_box(*t).y1;
      EXPECT_LE(label_bottom, std::min(whisker.num("y1"), whisker.num("y2")) + 0.01) << name;
    }
  }
}

// A plan over variable-length batches (estimate --seq-lengths): the microbatch histogram's bars are proportional to
// the record's counts, the peak percentiles and the straggler are printed, and no label overlaps another.
TEST(Report, VariableLengthBatchesDrawTheirMicrobatchHistogram) {
  Plan p = reference_plan();
  p.parallel.pp = 1;
  const Inputs in = inputs(p);
  PackingOptions o;
  o.tokens_per_microbatch = 32768;
  o.global_tokens = 4 << 20;
  o.samples = 4;
  const BatchEstimate b = estimate_batches(in.model, p, in.hw, in.cal, {{4096, 65536, 131072}, {6, 3, 1}}, o);
  ReportInput r;
  r.model = in.model;
  r.hardware = in.hw;
  r.estimate = estimate_to_json(b.worst_estimate, b.worst_plan);
  r.estimate["batches"] = batch_estimate_to_json(b);
  const Markup m = page(r);
  const auto bars = m.all("rect", "batch-bin");
  ASSERT_EQ(bars.size(), b.token_histogram.size());
  int most = 0;
  for (const auto& bin : b.token_histogram) most = std::max(most, bin.count);
  double tallest = 0;
  for (const Element* e : bars) tallest = std::max(tallest, e->num("height"));
  for (size_t i = 0; i < bars.size(); ++i)
    EXPECT_NEAR(bars[i]->num("height"), tallest * b.token_histogram[i].count / most, 0.02) << i;
  const std::string html = report_html(r);
  EXPECT_NE(html.find(fmt("%.2f", b.peak_p99_bytes / GiB)), std::string::npos);
  EXPECT_NE(html.find(fmt("%.1f", 100 * b.straggler_share) + "%"), std::string::npos);
  expect_no_overlapping_text(m, "batches");
}

// A search over a length distribution (report --search --seq-lengths): the chosen plan's batches are drawn and every
// best plan is listed with its record's own expected tokens/s and fullest-microbatch peak, no label overlapping.
TEST(Report, BatchSearchListsItsBestPlansOverTheDrawnBatches) {
  const Plan base = search_base();
  const Inputs c = inputs(base);
  PackingOptions o;
  o.samples = 4;
  SearchOptions opt;
  opt.headroom_bytes = 4.0 * (1 << 30);
  opt.top_k = 4;
  const LengthDistribution dist{{4096, 32768, 131072}, {6, 3, 1}};
  const BatchSearchResult r = search_batches(c.model, base, default_space(c.model, base), c.hw, c.cal, opt, dist, o);
  ASSERT_GE(r.top.size(), 2u);
  ReportInput in;
  in.model = c.model;
  in.hardware = c.hw;
  in.batch_search = batch_search_json(r);
  const BatchEstimate& best = r.top.front().batches;
  in.estimate = estimate_to_json(best.worst_estimate, best.worst_plan);
  in.estimate["batches"] = batch_estimate_to_json(best);
  const std::string html = report_html(in);
  const size_t at = html.find("Best plans over the drawn batches");
  ASSERT_NE(at, std::string::npos);
  EXPECT_NE(html.find("Chosen plan: "), std::string::npos);
  for (const BatchCandidate& b : r.top) {
    EXPECT_NE(html.find(fmt("%.0f", b.batches.tokens_per_second_per_gpu), at), std::string::npos);
    EXPECT_NE(html.find(fmt("%.2f", b.batches.peak_max_bytes / GiB), at), std::string::npos);
  }
  const Markup m = page(in);
  EXPECT_EQ(m.all("rect", "batch-bin").size(), best.token_histogram.size());
  expect_no_overlapping_text(m, "batch search");
}

TEST(Report, NothingLoadsFromElsewhere) {
  const std::string html = report_html(estimate_input(reference_plan()));
  for (const char* bad : {"http", "https", "src=", "@import", "url(", "<script", "<link", "<img", "<iframe", "<object"})
    EXPECT_EQ(html.find(bad), std::string::npos) << bad;
}

}  // namespace
