#include "report/svg.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace lcplan::svg {

std::string escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string num(double v) {
  if (!std::isfinite(v)) v = 0;  // a NaN in a coordinate would make the browser drop the element silently
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f", v);
  std::string s = buf;
  return s == "-0.00" ? "0.00" : s;
}

PathData& PathData::add(char op, double x, double y) {
  if (!d_.empty()) d_ += ' ';
  d_ += op;
  d_ += num(x);
  d_ += ' ';
  d_ += num(y);
  return *this;
}

Style fill(const std::string& colour, const std::string& cls) {
  Style s;
  s.fill = colour;
  s.cls = cls;
  return s;
}

Style stroke(const std::string& colour, double width, const std::string& dash, const std::string& cls) {
  Style s;
  s.stroke = colour;
  s.stroke_width = width;
  s.dash = dash;
  s.cls = cls;
  return s;
}

Style filled_outline(const std::string& fill, const std::string& stroke, double width, const std::string& cls) {
  Style s;
  s.fill = fill;
  s.stroke = stroke;
  s.stroke_width = width;
  s.cls = cls;
  return s;
}

TextStyle font(double size, const std::string& anchor, const std::string& fill, bool bold) {
  TextStyle t;
  t.size = size;
  t.anchor = anchor;
  t.fill = fill;
  t.bold = bold;
  return t;
}

namespace {

// Appends every piece to one string (no temporaries: GCC 12 misreads chains of "..." + std::string, -Wrestrict).
template <typename... T>
std::string cat(const T&... parts) {
  std::string out;
  (out.append(std::string_view(parts)), ...);
  return out;
}

// name="value" with the value escaped, after a space.
std::string attr(std::string_view name, std::string_view value) { return cat(" ", name, "=\"", escape(value), "\""); }

std::string style_attrs(const Style& s) {
  std::string a = attr("fill", s.fill);
  if (s.stroke != "none") {
    a += attr("stroke", s.stroke);
    a += attr("stroke-width", num(s.stroke_width));
    if (!s.dash.empty()) a += attr("stroke-dasharray", s.dash);
  }
  if (!s.cls.empty()) a += attr("class", s.cls);
  return a;
}

std::string extra(const Attrs& attrs) {
  std::string a;
  for (const auto& [k, v] : attrs) a += attr(escape(k), v);
  return a;
}

// Closes an element: self-closing without a title, else with a <title> child.
std::string close(std::string_view tag, const std::string& title) {
  if (title.empty()) return "/>\n";
  return cat("><title>", escape(title), "</title></", tag, ">\n");
}

}  // namespace

std::string rect(double x, double y, double w, double h, const Style& s, const std::string& title, const Attrs& attrs) {
  return cat("<rect", attr("x", num(x)), attr("y", num(y)), attr("width", num(std::max(0.0, w))),
             attr("height", num(std::max(0.0, h))), style_attrs(s), extra(attrs), close("rect", title));
}

std::string line(double x1, double y1, double x2, double y2, const Style& s, const std::string& title, const Attrs& attrs) {
  return cat("<line", attr("x1", num(x1)), attr("y1", num(y1)), attr("x2", num(x2)), attr("y2", num(y2)), style_attrs(s),
             extra(attrs), close("line", title));
}

std::string circle(double cx, double cy, double r, const Style& s, const std::string& title, const Attrs& attrs) {
  return cat("<circle", attr("cx", num(cx)), attr("cy", num(cy)), attr("r", num(r)), style_attrs(s), extra(attrs),
             close("circle", title));
}

std::string text(double x, double y, const std::string& content, const TextStyle& s, const Attrs& attrs) {
  std::string a = cat("<text", attr("x", num(x)), attr("y", num(y)), attr("font-size", num(s.size)),
                      attr("text-anchor", s.anchor), attr("fill", s.fill));
  if (s.bold) a += attr("font-weight", "bold");
  if (!s.cls.empty()) a += attr("class", s.cls);
  return cat(a, extra(attrs), ">", escape(content), "</text>\n");
}

double text_width(const std::string& content, double size) {
  double chars = 0;
  for (unsigned char c : content) chars += (c & 0xC0) != 0x80;  // continuation bytes are not characters
  return 0.62 * size * chars;
}

std::string path(const std::string& d, const Style& s, const std::string& title, const Attrs& attrs) {
  return cat("<path", attr("d", d), style_attrs(s), extra(attrs), close("path", title));
}

std::string polyline(const std::vector<std::pair<double, double>>& points, const Style& s, const std::string& title,
                     const Attrs& attrs) {
  std::string pts;
  for (const auto& [x, y] : points) {
    if (!pts.empty()) pts += ' ';
    pts.append(num(x)).append(",").append(num(y));
  }
  return cat("<polyline", attr("points", pts), style_attrs(s), extra(attrs), close("polyline", title));
}

std::string group(const std::string& body, const std::string& title, const Attrs& attrs) {
  return cat("<g", extra(attrs), ">", title.empty() ? std::string() : cat("<title>", escape(title), "</title>"), "\n",
             body, "</g>\n");
}

std::string document(double width, double height, const std::string& body, const std::string& label) {
  return cat("<svg", attr("width", num(width)), attr("height", num(height)),
             attr("viewBox", cat("0 0 ", num(width), " ", num(height))), attr("role", "img"), attr("aria-label", label),
             ">\n", body, "</svg>\n");
}

}  // namespace lcplan::svg
