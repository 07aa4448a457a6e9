#include "estimator/batch_spec.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>

#include "common/user_error.h"

namespace lcplan {

namespace {

// Lengths above this are not sequences anyone trains on (and keep sums of a step far from overflow).
constexpr int64_t kMaxLength = int64_t(1) << 32;

int64_t parse_length(const std::string& text, const std::string& where) {
  const bool digits = !text.empty() && text.size() <= 12 &&
                      std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
  const int64_t v = digits ? std::stoll(text) : 0;
  if (!digits || v < 1 || v > kMaxLength)
    throw UserError(where + " holds \"" + text + "\", not a sequence length (valid: a whole number of tokens from 1 to " +
                    std::to_string(kMaxLength) + ")");
  return v;
}

constexpr double kMaxCount = 1e15;  // sequences of one length in a histogram

int64_t json_length(const nlohmann::json& v, const std::string& where) {
  if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > kMaxLength)
    throw UserError(where + " holds " + v.dump() + ", not a sequence length (valid: a whole number of tokens from 1 to " +
                    std::to_string(kMaxLength) + ")");
  return v.get<int64_t>();
}

LengthDistribution from_counts(const std::map<int64_t, double>& counts, const std::string& source) {
  LengthDistribution d;
  for (const auto& [l, c] : counts)
    if (c > 0) d.lengths.push_back(l), d.weights.push_back(c);
  if (d.lengths.empty()) throw UserError(source + " lists no sequence (valid: at least one length with a positive count)");
  return d;
}

LengthDistribution parse_json_lengths(const std::string& text, const std::string& source) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw UserError(source + " is not valid JSON (" + std::string(e.what()) + ")");
  }
  if (!j.is_array())
    throw UserError(source + " must be a JSON list of lengths or of [length, count] pairs");
  std::map<int64_t, double> counts;
  for (const auto& e : j) {
    if (e.is_array()) {
      // A count past 1e15 sequences is no histogram of a run and would overflow the token sums (length x count).
      if (e.size() != 2 || !e[1].is_number() || !(e[1].get<double>() >= 0) || !(e[1].get<double>() <= kMaxCount))
        throw UserError(source + " holds " + e.dump() + " (valid histogram entry: [length, count] with a count from 0 to 1e15)");
      double& c = counts[json_length(e[0], source)];
      c += e[1].get<double>();
      if (c > kMaxCount) throw UserError(source + " counts more than 1e15 sequences of one length (valid: 0 to 1e15)");
    } else {
      counts[json_length(e, source)] += 1;
    }
  }
  return from_counts(counts, source);
}

}  // namespace

double LengthDistribution::mean_length() const {
  double n = 0, s = 0;
  for (size_t i = 0; i < lengths.size(); ++i) n += weights[i], s += weights[i] * double(lengths[i]);
  return n > 0 ? s / n : 0;
}

LengthDistribution parse_seq_lengths(const std::string& text, const std::string& source) {
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) throw UserError(source + " is empty (valid: one length per line, or a JSON list)");
  if (text[first] == '[') return parse_json_lengths(text, source);
  std::map<int64_t, double> counts;
  std::istringstream in(text);
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    line = line.substr(0, line.find('#'));
    const size_t a = line.find_first_not_of(" \t\r"), b = line.find_last_not_of(" \t\r");
    if (a == std::string::npos) continue;
    counts[parse_length(line.substr(a, b - a + 1), source + " line " + std::to_string(n))] += 1;
  }
  return from_counts(counts, source);
}

LengthDistribution read_seq_lengths_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw UserError("cannot read the sequence-length file " + path);
  std::ostringstream s;
  s << f.rdbuf();
  return parse_seq_lengths(s.str(), path);
}

const char* to_string(PackingPolicy p) { return p == PackingPolicy::Balanced ? "balanced" : "first_fit"; }

PackingPolicy parse_packing_policy(const std::string& s, const std::string& what) {
  if (s == "first_fit") return PackingPolicy::FirstFit;
  if (s == "balanced") return PackingPolicy::Balanced;
  throw UserError(what + " is \"" + s + "\" (valid: first_fit, balanced)");
}

BatchSpec batch_spec_from_json(const nlohmann::json& j) {
  const std::string w = "plan: \"batches\"";
  if (!j.is_object() || !j.contains("seq_lengths"))
    throw UserError(w + " must be an object with \"seq_lengths\" (a list of lengths or of [length, count] pairs)");
  for (const auto& [k, v] : j.items())
    if (k != "seq_lengths" && k != "tokens_per_microbatch" && k != "packing" && k != "global_tokens" && k != "samples" &&
        k != "seed")
      throw UserError(w + " has unknown field \"" + k + "\" (valid: seq_lengths, tokens_per_microbatch, packing, "
                      "global_tokens, samples, seed)");
  BatchSpec b;
  b.lengths = parse_seq_lengths(j.at("seq_lengths").dump(), w + ".seq_lengths");
  auto integer = [&](const char* key, int64_t lo, int64_t hi, int64_t fallback) {
    if (!j.contains(key)) return fallback;
    const auto& v = j.at(key);
    if (!v.is_number_integer() || v.get<int64_t>() < lo || v.get<int64_t>() > hi)
      throw UserError(w + "." + key + " is " + v.dump() + " (valid: a whole number from " + std::to_string(lo) + " to " +
                      std::to_string(hi) + ")");
    return v.get<int64_t>();
  };
  b.packing.tokens_per_microbatch = integer("tokens_per_microbatch", 0, int64_t(1) << 40, 0);
  b.packing.global_tokens = integer("global_tokens", 0, int64_t(1) << 40, 0);
  if (j.contains("packing")) {
    if (!j.at("packing").is_string())
      throw UserError(w + ".packing is " + j.at("packing").dump() + " (valid: \"first_fit\" or \"balanced\")");
    b.packing.policy = parse_packing_policy(j.at("packing").get<std::string>(), w + ".packing");
  }
  b.packing.samples = int(integer("samples", 1, 10000, 16));
  b.packing.seed = uint64_t(integer("seed", 0, 2147483647, 1));
  return b;
}

nlohmann::json batch_spec_to_json(const BatchSpec& b) {
  nlohmann::json lengths = nlohmann::json::array();
  for (size_t i = 0; i < b.lengths.lengths.size(); ++i) lengths.push_back({b.lengths.lengths[i], b.lengths.weights[i]});
  nlohmann::json j = {{"seq_lengths", lengths}, {"samples", b.packing.samples}, {"seed", b.packing.seed}};
  if (b.packing.tokens_per_microbatch > 0) j["tokens_per_microbatch"] = b.packing.tokens_per_microbatch;
  if (b.packing.policy != PackingPolicy::FirstFit) j["packing"] = to_string(b.packing.policy);
  if (b.packing.global_tokens > 0) j["global_tokens"] = b.packing.global_tokens;
  return j;
}

}  // namespace lcplan
