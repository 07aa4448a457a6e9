// `lcplan report` end to end: the page's numbers are `lcplan estimate --json`'s and `lcplan search --json`'s, the
// page is self-contained and escaped, bad invocations write nothing, and (where chromium exists) the reference-case
// page renders to a picture that holds the charts' colours.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#ifdef LCPLAN_HAVE_ZLIB
#include <zlib.h>
#endif

#include "markup.h"
#include "tests/common/cli_runner.h"

namespace fs = std::filesystem;
using nlohmann::json;
using report_test::Element;
using report_test::Markup;
using report_test::scan;

namespace {

constexpr double GiB = 1024.0 * 1024.0 * 1024.0;

using lcplan::testing::Outcome;
using lcplan::testing::slurp;

const fs::path& scratch() { return lcplan::testing::scratch("lcplan_report_test"); }

// Runs a program (no shell) in a process group of its own (chromium's helpers share it, so a timeout kills them all).
Outcome run(const std::string& bin, std::vector<std::string> args, int timeout_s = 120) {
  args.insert(args.begin(), bin);
  lcplan::testing::RunOptions opt;
  opt.timeout_s = timeout_s;
  opt.own_group = true;
  return lcplan::testing::run_program(args, opt);
}

Outcome lcplan(const std::vector<std::string>& args) { return run(LCPLAN_BINARY, args); }

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

const std::vector<std::string> kPlan = {"--model", "qwen3.5-35b-a3b", "--gpus", "32", "--seq", "128k", "--tp", "1",
                                        "--pp", "1", "--ep", "8", "--cp", "4", "--fsdp", "--recompute", "full",
                                        "--linear-ce", "--ep-chunks", "2", "--implementation", "bumblebee"};
const std::vector<std::string> kSearch = {"--model", "qwen3.5-35b-a3b", "--gpus", "32", "--seq", "128k"};

std::vector<std::string> with(std::vector<std::string> head, const std::vector<std::string>& tail) {
  head.insert(head.end(), tail.begin(), tail.end());
  return head;
}

// Runs `report` and returns the page; the command must succeed silently on a non-terminal stderr.
std::string report(const std::vector<std::string>& flags, const std::string& name) {
  const fs::path out = scratch() / name;
  const Outcome r = lcplan(with(with({"report"}, flags), {"--out", out.string()}));
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.err, "") << "stderr is not a terminal: nothing but errors belongs there";
  EXPECT_EQ(r.out, "wrote " + out.string() + "\n");
  return slurp(out);
}

void expect_self_contained(const std::string& html) {
  for (const char* bad : {"http", "https", "src=", "@import", "url(", "<script", "<link", "<img"})
    EXPECT_EQ(html.find(bad), std::string::npos) << "the page holds \"" << bad << "\"";
}

TEST(ReportCli, EstimatePageShowsTheEstimatesOwnNumbers) {
  const Outcome e = lcplan(with({"estimate", "--json"}, kPlan));
  ASSERT_EQ(e.status, 0) << e.err;
  const json rec = json::parse(e.out);
  const std::string html = report(kPlan, "estimate.html");
  expect_self_contained(html);
  const Markup m = scan(html);
  ASSERT_EQ(m.error, "");
  // Totals printed: peak in GiB with two decimals, TFLOP/s with one, as the estimate record has them.
  const double peak = rec["memory"]["peak_bytes"], tf = rec["time"]["tflops_per_gpu"];
  EXPECT_NE(html.find(fmt("%.2f GiB", peak / GiB)), std::string::npos);
  EXPECT_NE(html.find(fmt("%.1f TFLOP/s", tf)), std::string::npos);
  EXPECT_EQ(m.all("text", "stage-total").at(0)->text, fmt("%.2f GiB", rec["memory"]["stages"][0]["peak_bytes"].get<double>() / GiB));
  // Every segment carries the record's bytes (seconds) exactly, and its height (width) is proportional to them.
  const auto segs = m.all("rect", "mem-seg");
  ASSERT_EQ(segs.size(), 10u);
  double px = 0, bytes = 0;
  for (const Element* s : segs) px += s->num("height"), bytes += s->num("data-bytes");
  for (const Element* s : segs) {
    EXPECT_EQ(s->num("data-bytes"), rec["memory"]["stages"][0]["breakdown"][s->attr("data-category")].get<double>());
    EXPECT_NEAR(s->num("height"), s->num("data-bytes") * px / bytes, 0.011) << s->attr("data-category");
  }
  EXPECT_DOUBLE_EQ(bytes, peak);
  const auto tsegs = m.all("rect", "time-seg");
  ASSERT_EQ(tsegs.size(), 12u);
  for (const Element* s : tsegs) {
    const std::string c = s->attr("data-category");
    const json& b = rec["time"]["breakdown"];
    const double want = c.rfind("exposed_comm/", 0) == 0 ? b["exposed_comm"][c.substr(13)].get<double>() : b[c].get<double>();
    EXPECT_EQ(s->num("data-seconds"), want) << c;
  }
  // The plan as a recipe file gives the same page numbers.
  const fs::path recipe = scratch() / "recipe.json";
  {
    std::ofstream(recipe) << rec["plan"].dump(2);
  }
  const std::string from_plan = report({"--plan", recipe.string()}, "from_plan.html");
  EXPECT_NE(from_plan.find(fmt("%.2f GiB", peak / GiB)), std::string::npos);
  EXPECT_NE(from_plan.find(fmt("%.1f TFLOP/s", tf)), std::string::npos);
}

// report reads a Megatron-LM launch as estimate does (issue 28 item 3): the page draws the launch's plan.
TEST(ReportCli, AMegatronLaunchIsDrawnAsEstimateReadsIt) {
  const std::vector<std::string> launch = {
      "--model", "qwen3-30b-a3b", "--megatron-args",
      "torchrun --nnodes 2 --nproc-per-node 8 pretrain_gpt.py --seq-length 4096 --micro-batch-size 1 "
      "--global-batch-size 64 --expert-model-parallel-size 8 --use-distributed-optimizer --bf16"};
  const Outcome e = lcplan(with(with({"estimate", "--json"}, launch), {}));
  ASSERT_EQ(e.status, 0) << e.err;
  const json rec = json::parse(e.out);
  const std::string html = report(launch, "megatron.html");
  EXPECT_NE(html.find(fmt("%.1f TFLOP/s", rec["time"]["tflops_per_gpu"].get<double>())), std::string::npos);
  EXPECT_NE(html.find("qwen3-30b-a3b"), std::string::npos);
}

TEST(ReportCli, SearchPageHasTheParetoFrontOfTheSearch) {
  const Outcome s = lcplan(with({"search", "--json"}, kSearch));
  ASSERT_EQ(s.status, 0) << s.err;
  EXPECT_EQ(s.err, "");
  const json rec = json::parse(s.out);
  const std::string html = report(with(kSearch, {"--search"}), "search.html");
  expect_self_contained(html);
  const Markup m = scan(html);
  ASSERT_EQ(m.error, "");
  const auto points = m.all("circle", "pareto-point");
  ASSERT_EQ(points.size(), rec["pareto"].size()) << "one point per Pareto plan";
  for (size_t i = 0; i < points.size(); ++i) {
    const json& q = rec["pareto"][i]["plan"]["parallel"];
    const std::string name = "TP" + std::to_string(q["tp"].get<int>()) + " PP" + std::to_string(q["pp"].get<int>());
    EXPECT_NE(m.title_of(*points[i]).find(name), std::string::npos) << m.title_of(*points[i]);
    EXPECT_EQ(points[i]->num("data-peak-bytes"), rec["pareto"][i]["memory"]["peak_bytes"].get<double>());
  }
  // The chosen plan is the search's best.
  const json& best = rec["top"][0];
  EXPECT_NE(html.find(fmt("%.2f GiB", best["memory"]["peak_bytes"].get<double>() / GiB)), std::string::npos);
  EXPECT_NE(html.find(fmt("%.1f TFLOP/s", best["time"]["tflops_per_gpu"].get<double>())), std::string::npos);
  EXPECT_EQ(m.all("circle", "chosen-point").size(), 1u);
  EXPECT_EQ(m.all("path", "recipe-point").size(), 1u);
}

TEST(ReportCli, AModelPathWithMarkupCharactersIsEscaped) {
  const fs::path dir = scratch() / "we<i&r>d\"dir";
  fs::create_directories(dir);
  fs::copy_file(fs::path(LCPLAN_SOURCE_DIR) / "models/zoo/qwen3.5-35b-a3b.json", dir / "config.json");
  std::vector<std::string> flags = kPlan;
  flags[1] = (dir / "config.json").string();
  const std::string html = report(flags, "escaped.html");
  EXPECT_EQ(html.find("we<i&r>d\"dir"), std::string::npos) << "the raw path reached the page";
  EXPECT_NE(html.find("we&lt;i&amp;r&gt;d&quot;dir"), std::string::npos);
  const Markup m = scan(html);
  ASSERT_EQ(m.error, "");
  EXPECT_NE(m.all("h1").at(0)->text.find((dir / "config.json").string()), std::string::npos);
  expect_self_contained(html);
}

TEST(ReportCli, MeasuredRunIsDrawnBesideItsPlan) {
  const Outcome e = lcplan(with({"estimate", "--json"}, kPlan));
  ASSERT_EQ(e.status, 0) << e.err;
  const json rec = json::parse(e.out);
  const fs::path runs = scratch() / "runs.json";
  {
    std::ofstream(runs) << json::array({{{"id", "r1"}, {"source", "test"}, {"plan", rec["plan"]},
                                         {"peak_bytes", 6.5e10}, {"tflops_per_gpu", 180.25}}})
                               .dump();
  }
  const std::string html = report(with(kPlan, {"--measured", runs.string()}), "measured.html");
  const Markup m = scan(html);
  ASSERT_EQ(m.error, "");
  const auto markers = m.all("g", "measured-marker");
  ASSERT_EQ(markers.size(), 2u);
  EXPECT_NE(m.deep_text(*markers[0]).find(fmt("measured %.2f GiB", 6.5e10 / GiB)), std::string::npos);
  EXPECT_NE(m.deep_text(*markers[1]).find("180.2 TFLOP/s"), std::string::npos) << m.deep_text(*markers[1]);
}

// A bad invocation prints one sentence, exits 2 and writes no file, not even a partial one.
TEST(ReportCli, BadInvocationsWriteNothing) {
  const fs::path other = scratch() / "other_runs.json";
  {
    std::ofstream(other) << R"([{"id": "x", "plan": {"model": "qwen3.5-35b-a3b", "gpus": 64, "seq_len": 4096}, "peak_bytes": 1e10}])";
  }
  const fs::path out = scratch() / "never.html";
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {with({"report"}, kPlan), "--out"},
      {with(with({"report"}, kPlan), {"--headroom", "2", "--out", out.string()}), "--search"},
      {with({"report", "--tp", "1,2", "--out", out.string()}, kSearch), "--search"},
      {with(with({"report"}, kPlan), {"--measured", other.string(), "--out", out.string()}), "plan"},
      {with(with({"report"}, kPlan), {"--measured", (scratch() / "missing.json").string(), "--out", out.string()}), "missing.json"},
      {with(with({"report"}, kPlan), {"--out", (scratch() / "no_dir" / "r.html").string()}), "no_dir"},
      {{"report", "--search", "--model", "deepseek-v3", "--gpus", "8", "--seq", "1M", "--out", out.string()}, "fits"},
  };
  for (const auto& [args, word] : cases) {
    const Outcome r = lcplan(args);
    std::string cmd = "lcplan";
    for (const auto& a : args) cmd += " " + a;
    EXPECT_EQ(r.status, 2) << cmd << ": " << r.err;
    EXPECT_EQ(r.out, "") << cmd;
    EXPECT_EQ(r.err.rfind("lcplan: error: ", 0), 0u) << cmd << ": " << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << cmd << ": " << r.err;
    EXPECT_NE(r.err.find(word), std::string::npos) << cmd << ": " << r.err;
    EXPECT_FALSE(fs::exists(out)) << cmd << ": wrote " << out;
  }
  for (const auto& e : fs::directory_iterator(scratch()))
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << "left " << e.path();
}

// ---- rendering ---------------------------------------------------------------------------------------------------

struct Image {
  int width = 0, height = 0;
  std::vector<uint32_t> rgb;  // 0xRRGGBB per pixel
  std::string error;
};

uint32_t be32(const std::string& s, size_t at) {
  return uint32_t(uint8_t(s[at])) << 24 | uint32_t(uint8_t(s[at + 1])) << 16 | uint32_t(uint8_t(s[at + 2])) << 8 |
         uint32_t(uint8_t(s[at + 3]));
}

// Decodes an 8-bit RGB or RGBA, non-interlaced PNG (what chromium writes): chunks, zlib-inflated IDAT, scanline
// filters undone.
Image decode_png(const std::string& png) {
  Image img;
  if (png.size() < 8 || png.compare(0, 8, "\x89PNG\r\n\x1a\n") != 0) return img.error = "not a PNG", img;
  size_t at = 8;
  int depth = 0, colour = 0, interlace = 0;
  std::string idat;
  while (at + 8 <= png.size()) {
    const uint32_t len = be32(png, at);
    const std::string type = png.substr(at + 4, 4);
    if (at + 12 + len > png.size()) return img.error = "truncated chunk " + type, img;
    if (type == "IHDR") {
      img.width = int(be32(png, at + 8));
      img.height = int(be32(png, at + 12));
      depth = uint8_t(png[at + 16]);
      colour = uint8_t(png[at + 17]);
      interlace = uint8_t(png[at + 20]);
    } else if (type == "IDAT") {
      idat += png.substr(at + 8, len);
    } else if (type == "IEND") {
      break;
    }
    at += 12 + len;
  }
  if (depth != 8 || (colour != 2 && colour != 6) || interlace != 0)
    return img.error = "unsupported PNG (depth " + std::to_string(depth) + ", colour type " + std::to_string(colour) + ")", img;
#ifdef LCPLAN_HAVE_ZLIB
  const int bpp = colour == 6 ? 4 : 3;
  const size_t stride = size_t(img.width) * bpp;
  std::vector<unsigned char> raw(size_t(img.height) * (stride + 1));
  uLongf raw_len = raw.size();
  if (uncompress(raw.data(), &raw_len, reinterpret_cast<const Bytef*>(idat.data()), idat.size()) != Z_OK ||
      raw_len != raw.size())
    return img.error = "IDAT does not inflate to the image size", img;
  std::vector<unsigned char> prev(stride, 0), cur(stride);
  img.rgb.reserve(size_t(img.width) * img.height);
  for (int y = 0; y < img.height; ++y) {
    const unsigned char* line = &raw[size_t(y) * (stride + 1)];
    const int filter = line[0];
    for (size_t x = 0; x < stride; ++x) {
      const int a = x >= size_t(bpp) ? cur[x - bpp] : 0, b = prev[x], c = x >= size_t(bpp) ? prev[x - bpp] : 0;
      int pred = 0;
      switch (filter) {
        case 0: pred = 0; break;
        case 1: pred = a; break;
        case 2: pred = b; break;
        case 3: pred = (a + b) / 2; break;
        case 4: {
          const int p = a + b - c, pa = std::abs(p - a), pb = std::abs(p - b), pc = std::abs(p - c);
          pred = pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
          break;
        }
        default: return img.error = "bad filter " + std::to_string(filter), img;
      }
      cur[x] = static_cast<unsigned char>(line[1 + x] + pred);
    }
    for (int x = 0; x < img.width; ++x)
      img.rgb.push_back(uint32_t(cur[x * bpp]) << 16 | uint32_t(cur[x * bpp + 1]) << 8 | cur[x * bpp + 2]);
    std::swap(prev, cur);
  }
#else
  img.error = "built without zlib: cannot inflate IDAT";
#endif
  return img;
}

// Pixels within `tol` per channel of `colour`.
size_t pixels_near(const Image& img, uint32_t colour, int tol = 3) {
  size_t n = 0;
  for (uint32_t p : img.rgb) {
    const int dr = int(p >> 16) - int(colour >> 16), dg = int((p >> 8) & 255) - int((colour >> 8) & 255),
              db = int(p & 255) - int(colour & 255);
    n += std::abs(dr) <= tol && std::abs(dg) <= tol && std::abs(db) <= tol;
  }
  return n;
}

const char* chromium_path() {
  const char* env = std::getenv("LCPLAN_CHROMIUM");
  return env && *env ? env : "/usr/bin/chromium";
}

// `report` with `flags`, rendered headless to a 1200x1600 picture that is not blank (many colours, some not white).
Image rendered(const std::vector<std::string>& flags, const std::string& name) {
  const fs::path html = scratch() / (name + ".html"), png = scratch() / (name + ".png");
  const Outcome r = lcplan(with({"report"}, with(flags, {"--out", html.string()})));
  EXPECT_EQ(r.status, 0) << r.err;
  const auto t0 = std::chrono::steady_clock::now();
  const Outcome c = run(chromium_path(),
                        {"--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars",
                         "--force-color-profile=srgb", "--no-first-run", "--user-data-dir=" + (scratch() / "chromium").string(),
                         "--screenshot=" + png.string(), "--window-size=1200,1600", "file://" + html.string()},
                        60);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!fs::exists(png)) {
    ADD_FAILURE() << name << ": chromium wrote no screenshot (exit " << c.status << ", " << secs << " s): " << c.err.substr(0, 2000);
    return Image{0, 0, {}, "no screenshot"};
  }
  const Image img = decode_png(slurp(png));
  if (!img.error.empty()) return img;
  EXPECT_EQ(img.width, 1200) << name;
  EXPECT_EQ(img.height, 1600) << name;
  std::set<uint32_t> colours(img.rgb.begin(), img.rgb.end());
  size_t non_white = 0;
  for (uint32_t p : img.rgb) non_white += p != 0xffffff;
  EXPECT_GT(colours.size(), 50u) << name << ": a blank or nearly blank picture";
  EXPECT_GT(double(non_white) / double(img.rgb.size()), 0.03) << name << ": almost everything is white";
  std::printf("%s: chromium rendered %dx%d in %.1f s: %zu colours, %.1f%% not white\n", name.c_str(), img.width,
              img.height, secs, colours.size(), 100.0 * double(non_white) / double(img.rgb.size()));
  std::fflush(stdout);  // before the next fork, which would copy what is buffered
  return img;
}

// Pages of pipelines 1, 4 and 16 stages deep render (their labels keep apart: html_report_test checks the SVG's
// label boxes).
TEST(ReportRender, PagesOfEveryPipelineDepthRender) {
  if (::access(chromium_path(), X_OK) != 0) GTEST_SKIP() << chromium_path() << " not found: nothing renders the page";
#ifndef LCPLAN_HAVE_ZLIB
  GTEST_SKIP() << "built without zlib: the PNG cannot be decoded";
#endif
  for (const char* pp : {"1", "4"}) {
    std::vector<std::string> flags = kPlan;
    *(std::find(flags.begin(), flags.end(), "--pp") + 1) = pp;
    EXPECT_EQ(rendered(flags, std::string("pp") + pp).error, "");
  }
  EXPECT_EQ(rendered({"--model", "llama-3.1-70b", "--gpus", "128", "--seq", "8k", "--tp", "8", "--pp", "16"}, "pp16").error, "");
}

// The reference case's search report, rendered headless: the picture is not blank and holds the charts' colours
// (the legend alone could not: each memory category colour must cover more than its 14x14 swatch).
TEST(ReportRender, ReferenceReportRendersWithItsChartColours) {
  if (::access(chromium_path(), X_OK) != 0) GTEST_SKIP() << chromium_path() << " not found: nothing renders the page";
#ifndef LCPLAN_HAVE_ZLIB
  GTEST_SKIP() << "built without zlib: the PNG cannot be decoded";
#endif
  const Image img = rendered(with(kSearch, {"--search"}), "reference");
  ASSERT_EQ(img.error, "");
  // The colours of the categories the chosen plan's bar holds (params, grads, activations, logits, fragmentation all
  // non-zero there) cover more than a legend swatch, and the capacity line is drawn.
  for (uint32_t colour : {0x4e79a7u, 0xa0cbe8u, 0x59a14fu})
    EXPECT_GT(pixels_near(img, colour), 14u * 14u + 400u) << std::hex << colour;
}

}  // namespace
