#include "parallel/pipeline_split.h"

#include <algorithm>
#include <numeric>

namespace lcplan {

const char* to_string(SplitRule r) {
  switch (r) {
    case SplitRule::Even: return "even";
    case SplitRule::EmbeddingAndLoss: return "embedding_and_loss";
    case SplitRule::FirstLast: return "first_last";
    case SplitRule::Explicit: return "explicit";
    case SplitRule::Balanced: return "balanced";
  }
  return "?";
}

int PipelineSplit::max_chunk_layers() const { return layers.empty() ? 0 : *std::max_element(layers.begin(), layers.end()); }

int PipelineSplit::stage_layers(int stage) const {
  int n = 0;
  for (int c = stage; c < chunks(); c += pp) n += layers[c];
  return n;
}

namespace {

SplitResult fail(std::string msg) {
  SplitResult r;
  r.error = std::move(msg);
  return r;
}

std::string str(long v) { return std::to_string(v); }

}  // namespace

SplitResult split_layers(int layers, int pp, int vpp, const PipelineLayout& want) {
  if (pp < 1 || vpp < 1 || layers < 1)
    return fail("pp = " + str(pp) + ", vpp = " + str(vpp) + " and " + str(layers) + " layers must all be at least 1");
  const long chunks = long(pp) * vpp;
  SplitResult r;
  PipelineSplit& s = r.split;
  s.pp = pp;
  s.vpp = vpp;
  if (!want.chunk_layers.empty()) {
    if (want.first_stage_layers > 0 || want.last_stage_layers > 0)
      return fail("give either per-virtual-stage pipeline layers or first/last stage layers, not both");
    if (long(want.chunk_layers.size()) != chunks)
      return fail("pipeline layers list has " + str(long(want.chunk_layers.size())) + " entries but pp*vpp = " + str(chunks) +
                  " virtual stages need one each");
    long sum = 0;
    for (int n : want.chunk_layers) {
      if (n < 0) return fail("pipeline layers list has a negative count " + str(n) + " (valid: 0 or more per virtual stage)");
      sum += n;
    }
    if (sum != layers)
      return fail("pipeline layers list sums to " + str(sum) + " but the model has " + str(layers) + " layers");
    s.rule = SplitRule::Explicit;
    s.layers = want.chunk_layers;
    r.ok = true;
    return r;
  }
  if (want.first_stage_layers < 0 || want.last_stage_layers < 0)
    return fail("first/last stage layers must be positive (0 = not given)");
  if (want.first_stage_layers > 0 || want.last_stage_layers > 0) {
    if (pp < 2) return fail("first/last pipeline stage layers need pp > 1 (pp = " + str(pp) + ")");
    const long first = want.first_stage_layers, last = want.last_stage_layers;
    const long rest = layers - first - last;
    const long left = pp - (first > 0) - (last > 0);
    if (rest < 0 || (left == 0 && rest != 0) || (left > 0 && (rest % left != 0 || rest / left < 1)))
      return fail("first/last stage layers " + str(first) + "/" + str(last) + " leave " + str(rest) + " of the " + str(layers) +
                  " layers for " + str(left) + " other stages (they must share them evenly, at least one each)");
    std::vector<long> stage(pp, left > 0 ? rest / left : 0);
    if (first > 0) stage[0] = first;
    if (last > 0) stage[pp - 1] = last;
    for (int st = 0; st < pp; ++st)
      if (stage[st] % vpp != 0)
        return fail("pipeline stage " + str(st) + " holds " + str(stage[st]) + " layers, not divisible by vpp = " + str(vpp));
    s.rule = SplitRule::FirstLast;
    s.layers.resize(chunks);
    for (long c = 0; c < chunks; ++c) s.layers[c] = int(stage[c % pp] / vpp);
    r.ok = true;
    return r;
  }
  if (chunks > long(layers) + 2)
    return fail("pp*vpp = " + str(chunks) + " virtual stages exceed the " + str(layers) +
                " layers plus embedding and loss (valid: at most " + str(long(layers) + 2) + ")");
  s.layers.assign(chunks, 0);
  if (layers % chunks == 0) {
    s.rule = SplitRule::Even;
    std::fill(s.layers.begin(), s.layers.end(), int(layers / chunks));
  } else if (chunks > 2 && (layers + 2) % chunks == 0 && (layers + 2) / chunks >= 2) {
    s.rule = SplitRule::EmbeddingAndLoss;
    std::fill(s.layers.begin(), s.layers.end(), int((layers + 2) / chunks));
    s.layers.front()--;
    s.layers.back()--;
  } else {
    // Embedding and loss take one slot each; the remainder goes to the middle virtual stages first, so the edges
    // hold fewer layers (0 allowed there: a stage holding only the embedding or only the loss, as in
    // Megatron-Bridge's DeepSeek-V3 layout "Et|(tt|)*30mL").
    s.rule = SplitRule::Balanced;
    const long slots = long(layers) + 2, base = slots / chunks;
    long extra = slots % chunks;
    std::fill(s.layers.begin(), s.layers.end(), int(base));
    for (long c = 1; c + 1 < chunks && extra > 0; ++c, --extra) s.layers[c]++;
    if (extra > 0) s.layers.front()++, --extra;
    if (extra > 0) s.layers.back()++, --extra;
    s.layers.front()--;
    s.layers.back()--;
  }
  r.ok = true;
  return r;
}

std::vector<LayerPlace> place_layers(const PipelineSplit& s) {
  std::vector<LayerPlace> out;
  out.reserve(std::accumulate(s.layers.begin(), s.layers.end(), size_t(0)));
  for (int c = 0; c < s.chunks(); ++c)
    for (int i = 0; i < s.layers[c]; ++i) out.push_back({c % s.pp, c / s.pp, i});
  return out;
}

}  // namespace lcplan
