// The project's own tiny SVG writer: each function returns one element as text, every string escaped, every
// coordinate printed with two decimals. A <title> child gives the element a hover text in any browser.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace lcplan::svg {

// Escapes the five characters XML and HTML give a meaning to (& < > " '), for text and attribute values alike.
std::string escape(std::string_view s);

// A coordinate or length: two decimals, no exponent, "-0.00" printed as "0.00".
std::string num(double v);

struct Style {
  std::string fill = "none";
  std::string stroke = "none";
  double stroke_width = 1;
  std::string dash;   // stroke-dasharray, e.g. "6 4"
  std::string cls;    // class attribute
};

struct TextStyle {
  double size = 12;
  std::string anchor = "start";  // start, middle, end
  std::string fill = "#222";
  bool bold = false;
  std::string cls;
};

// Styles by what they set (the rest at their defaults).
Style fill(const std::string& colour, const std::string& cls = "");
Style stroke(const std::string& colour, double width = 1, const std::string& dash = "", const std::string& cls = "");
Style filled_outline(const std::string& fill, const std::string& stroke, double width, const std::string& cls = "");
TextStyle font(double size, const std::string& anchor = "start", const std::string& fill = "#222", bool bold = false);

// Extra attributes (data-*), escaped.
using Attrs = std::vector<std::pair<std::string, std::string>>;

std::string rect(double x, double y, double w, double h, const Style& s, const std::string& title = "",
                 const Attrs& attrs = {});
std::string line(double x1, double y1, double x2, double y2, const Style& s, const std::string& title = "",
                 const Attrs& attrs = {});
std::string circle(double cx, double cy, double r, const Style& s, const std::string& title = "", const Attrs& attrs = {});
std::string text(double x, double y, const std::string& content, const TextStyle& s = {}, const Attrs& attrs = {});
// The width a browser gives `content` at font size `size`, estimated: 0.62 em per character (DejaVu Sans digits are
// 0.64 em, lower case 0.5-0.6), counting UTF-8 code points. What placement uses to keep labels apart.
double text_width(const std::string& content, double size);
// Path data: move to, line to, close; coordinates through num().
class PathData {
 public:
  PathData& move(double x, double y) { return add('M', x, y); }
  PathData& to(double x, double y) { return add('L', x, y); }
  PathData& close() {
    d_ += " Z";
    return *this;
  }
  const std::string& str() const { return d_; }

 private:
  PathData& add(char op, double x, double y);
  std::string d_;
};

// `d` is path data (PathData::str()).
std::string path(const std::string& d, const Style& s, const std::string& title = "", const Attrs& attrs = {});
std::string polyline(const std::vector<std::pair<double, double>>& points, const Style& s, const std::string& title = "",
                     const Attrs& attrs = {});
// <g> around `body`, with a hover title for the whole group.
std::string group(const std::string& body, const std::string& title = "", const Attrs& attrs = {});
// The <svg> element: width x height pixels, `label` for screen readers. No xmlns: the SVG is inline in HTML5.
std::string document(double width, double height, const std::string& body, const std::string& label);

}  // namespace lcplan::svg
