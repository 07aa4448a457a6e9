#include "common/flag_text.h"

#include <charconv>
#include <climits>
#include <cmath>

#include "common/user_error.h"

namespace lcplan {

namespace {

std::string range_text(long long lo, long long hi) {
  return hi == INT_MAX ? std::to_string(lo) + " or more" : std::to_string(lo) + " to " + std::to_string(hi);
}

}  // namespace

int parse_int_in(const std::string& text, const std::string& flag, int lo, int hi) {
  const std::string valid = " (valid: a whole number, " + range_text(lo, hi) + ")";
  const size_t sign = !text.empty() && text[0] == '-' ? 1 : 0;
  if (sign == text.size()) throw UserError(flag + " \"" + text + "\" is not a whole number" + valid);
  for (size_t i = sign; i < text.size(); ++i)
    if (text[i] < '0' || text[i] > '9') throw UserError(flag + " \"" + text + "\" is not a whole number" + valid);
  // More than 10 digits cannot be an int; checking the length first keeps stoll away from overflow.
  const bool huge = text.size() - sign > 10;
  const long long v = huge ? (sign ? LLONG_MIN : LLONG_MAX) : std::stoll(text);
  if (v > hi && hi == INT_MAX) throw UserError(flag + " \"" + text + "\" is too large (valid: at most " + std::to_string(hi) + ")");
  if (v < lo || v > hi) throw UserError(flag + " \"" + text + "\" is out of range" + valid);
  return int(v);
}

int parse_positive_int(const std::string& text, const std::string& flag) { return parse_int_in(text, flag, 1, INT_MAX); }

std::vector<int> parse_int_list(const std::string& text, const std::string& flag, int lo) {
  std::vector<int> out;
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    const std::string item = text.substr(start, comma - start);
    if (item.empty())
      throw UserError(flag + " \"" + text + "\" has an empty entry (valid: whole numbers, " + range_text(lo, INT_MAX) +
                      ", comma-separated, e.g. 4,8)");
    out.push_back(parse_int_in(item, flag, lo, INT_MAX));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

std::optional<double> finite_number(const std::string& text) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (used == 0 || used != text.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

double parse_number(const std::string& text, const std::string& flag, double lo, double hi, const std::string& valid) {
  const std::optional<double> n = finite_number(text);
  if (!n) throw UserError(flag + " \"" + text + "\" is not a number (valid: " + valid + ")");
  const double v = *n;
  if (v < lo || v > hi) throw UserError(flag + " \"" + text + "\" is out of range (valid: " + valid + ")");
  return v;
}

bool parse_on_off(const std::string& text, const std::string& flag) {
  if (text == "on") return true;
  if (text == "off") return false;
  throw UserError(flag + " \"" + text + "\" is not valid (valid: on, off)");
}

std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    out.push_back(text.substr(start, comma - start));
    if (comma == std::string::npos) return out;
    start = comma + 1;
  }
}

std::string number_text(double v) {
  char buf[32];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);  // shortest round-trip form (C++17 <charconv>)
  return std::string(buf, r.ptr);
}

}  // namespace lcplan
