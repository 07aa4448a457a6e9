// Flag values as text: whole numbers, numbers, on/off and comma lists, for every command's flags and the flag rows
// that give estimate and search their run-setting flags (search/megatron_flags.h). Bad input throws one UserError
// sentence in one format for every flag:
//   <flag> "<text>" is not a whole number|not a number|out of range|not valid (valid: <what>)
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace lcplan {

int parse_int_in(const std::string& text, const std::string& flag, int lo, int hi);
int parse_positive_int(const std::string& text, const std::string& flag);  // 1 or more
// Comma list ("8" or "4,8,16") of whole numbers of at least `lo`.
std::vector<int> parse_int_list(const std::string& text, const std::string& flag, int lo = 1);
// The whole text as a finite number (std::stod), or nothing.
std::optional<double> finite_number(const std::string& text);
// A finite number in [lo, hi]; `valid` words the range for the message ("0 to 1").
double parse_number(const std::string& text, const std::string& flag, double lo, double hi, const std::string& valid);
bool parse_on_off(const std::string& text, const std::string& flag);  // "on" or "off"
std::vector<std::string> split_commas(const std::string& text);       // "a,b" -> {"a", "b"}; "" -> {""}
// The shortest text that reads back (finite_number) to exactly `v`: what a flag emitted for a plan must carry.
std::string number_text(double v);

}  // namespace lcplan
