// A small XML-ish scan of the report's HTML and inline SVG, strict enough to catch what escaping must prevent: every
// tag closes in order, attribute values are quoted, text holds no raw '<' or '>', and every '&' starts an entity.
// Elements keep their attributes and their own text (entities decoded), so tests can read numbers back.
#pragma once

#include <cctype>
#include <cstdlib>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace report_test {

struct Element {
  std::string name;
  std::map<std::string, std::string> attrs;
  std::string text;  // direct text content, decoded
  int parent = -1;
  std::vector<int> children;

  std::string attr(const std::string& k) const {
    auto it = attrs.find(k);
    return it == attrs.end() ? "" : it->second;
  }
  double num(const std::string& k) const { return std::strtod(attr(k).c_str(), nullptr); }
  bool has_class(const std::string& c) const {
    // Appended piece by piece: GCC 12 misreads " " + std::string chains (-Wrestrict).
    std::string v(" "), w(" ");
    v.append(attr("class")).append(" ");
    w.append(c).append(" ");
    return v.find(w) != std::string::npos;
  }
};

struct Markup {
  std::vector<Element> elements;
  std::string error;  // empty when the document scanned cleanly

  std::vector<const Element*> all(const std::string& name, const std::string& cls = "") const {
    std::vector<const Element*> out;
    for (const Element& e : elements)
      if (e.name == name && (cls.empty() || e.has_class(cls))) out.push_back(&e);
    return out;
  }
  // The text of the <title> child of `e` (the SVG hover text), or "".
  std::string title_of(const Element& e) const {
    for (int c : e.children)
      if (elements[c].name == "title") return elements[c].text;
    return "";
  }
  // All text under `e`, depth first.
  std::string deep_text(const Element& e) const {
    std::string s = e.text;
    for (int c : e.children) s += deep_text(elements[c]);
    return s;
  }
};

// Decodes the entities the report writes; any other '&' (or a malformed one) is an error.
inline bool decode(const std::string& raw, std::string& out, std::string& why) {
  static const std::map<std::string, std::string> named = {{"amp", "&"}, {"lt", "<"},     {"gt", ">"},
                                                           {"quot", "\""}, {"#39", "'"}, {"middot", "\xC2\xB7"}};
  out.clear();
  for (size_t i = 0; i < raw.size(); ++i) {
    if (raw[i] != '&') {
      out += raw[i];
      continue;
    }
    const size_t semi = raw.find(';', i);
    const std::string name = semi == std::string::npos ? "" : raw.substr(i + 1, semi - i - 1);
    auto it = named.find(name);
    if (it == named.end()) {
      why = "a raw '&' (or an unknown entity) near \"" + raw.substr(i, 20) + "\"";
      return false;
    }
    out += it->second;
    i = semi;
  }
  return true;
}

inline Markup scan(const std::string& doc) {
  static const std::set<std::string> void_elements = {"meta", "br", "hr", "img", "input", "link"};
  Markup m;
  std::vector<int> stack;
  auto fail = [&](const std::string& why, size_t at) {
    m.error = why + " at byte " + std::to_string(at) + ": \"" + doc.substr(at, 60) + "\"";
    return m;
  };
  size_t i = 0;
  while (i < doc.size()) {
    if (doc[i] != '<') {
      const size_t end = doc.find('<', i);
      const std::string raw = doc.substr(i, end == std::string::npos ? std::string::npos : end - i);
      if (raw.find('>') != std::string::npos) return fail("a raw '>' in text", i);
      std::string text, why;
      if (!decode(raw, text, why)) return fail(why, i);
      if (!stack.empty()) m.elements[stack.back()].text += text;
      else if (text.find_first_not_of(" \n\t\r") != std::string::npos) return fail("text outside the document", i);
      i = end == std::string::npos ? doc.size() : end;
      continue;
    }
    if (doc.compare(i, 4, "<!--") == 0) {
      const size_t end = doc.find("-->", i);
      if (end == std::string::npos) return fail("an unclosed comment", i);
      i = end + 3;
      continue;
    }
    if (doc.compare(i, 2, "<!") == 0) {
      const size_t end = doc.find('>', i);
      if (end == std::string::npos) return fail("an unclosed declaration", i);
      i = end + 1;
      continue;
    }
    if (doc.compare(i, 2, "</") == 0) {
      const size_t end = doc.find('>', i);
      if (end == std::string::npos) return fail("an unclosed end tag", i);
      const std::string name = doc.substr(i + 2, end - i - 2);
      if (stack.empty() || m.elements[stack.back()].name != name)
        return fail("</" + name + "> closes " + (stack.empty() ? "nothing" : "<" + m.elements[stack.back()].name + ">"), i);
      stack.pop_back();
      i = end + 1;
      continue;
    }
    // Start tag: name, then name="value" pairs, then '>' or '/>'.
    size_t j = i + 1;
    while (j < doc.size() && (std::isalnum(static_cast<unsigned char>(doc[j])) || doc[j] == '-')) ++j;
    Element e;
    e.name = doc.substr(i + 1, j - i - 1);
    if (e.name.empty()) return fail("a raw '<' in text", i);
    bool self_closing = false;
    while (true) {
      while (j < doc.size() && std::isspace(static_cast<unsigned char>(doc[j]))) ++j;
      if (j >= doc.size()) return fail("an unclosed tag", i);
      if (doc[j] == '>') {
        ++j;
        break;
      }
      if (doc.compare(j, 2, "/>") == 0) {
        self_closing = true;
        j += 2;
        break;
      }
      size_t k = j;
      while (k < doc.size() && (std::isalnum(static_cast<unsigned char>(doc[k])) || doc[k] == '-' || doc[k] == '_' ||
                                doc[k] == ':'))
        ++k;
      if (k == j) return fail("a malformed attribute", j);
      const std::string key = doc.substr(j, k - j);
      if (doc.compare(k, 2, "=\"") != 0) return fail("attribute " + key + " without a quoted value", k);
      const size_t close = doc.find('"', k + 2);
      if (close == std::string::npos) return fail("an unterminated attribute value", k);
      const std::string raw = doc.substr(k + 2, close - k - 2);
      if (raw.find('<') != std::string::npos || raw.find('>') != std::string::npos)
        return fail("a raw '<' or '>' in attribute " + key, k);
      std::string val, why;
      if (!decode(raw, val, why)) return fail(why + " in attribute " + key, k);
      if (e.attrs.count(key)) return fail("attribute " + key + " given twice", k);
      e.attrs[key] = val;
      j = close + 1;
    }
    e.parent = stack.empty() ? -1 : stack.back();
    m.elements.push_back(e);
    const int idx = int(m.elements.size()) - 1;
    if (e.parent >= 0) m.elements[e.parent].children.push_back(idx);
    i = j;
    if (e.name == "style") {
      // CSS is raw text up to </style>.
      const size_t end = doc.find("</style>", i);
      if (end == std::string::npos) return fail("an unclosed <style>", i);
      m.elements[idx].text = doc.substr(i, end - i);
      i = end + 8;
      continue;
    }
    if (!self_closing && !void_elements.count(e.name)) stack.push_back(idx);
  }
  if (!stack.empty()) {
    m.error = "<" + m.elements[stack.back()].name + "> is never closed";
  }
  return m;
}

}  // namespace report_test
