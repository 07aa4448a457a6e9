#include "search/shell_words.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <optional>

#include "common/user_error.h"

namespace lcplan {

namespace {

bool blank(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool name_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// Index just past the bracket matching s[open] ('(' or '{'), skipping quoted text; npos when unbalanced.
size_t matching(const std::string& s, size_t open) {
  const char o = s[open], c = o == '(' ? ')' : '}';
  int depth = 0;
  for (size_t i = open; i < s.size(); ++i) {
    const char ch = s[i];
    if (ch == '\\') {
      ++i;
    } else if (ch == '\'') {
      const size_t e = s.find('\'', i + 1);
      if (e == std::string::npos) return std::string::npos;
      i = e;
    } else if (ch == '"') {
      size_t e = i + 1;
      while (e < s.size() && s[e] != '"') e += s[e] == '\\' ? 2 : 1;
      if (e >= s.size()) return std::string::npos;
      i = e;
    } else if (ch == o) {
      ++depth;
    } else if (ch == c && --depth == 0) {
      return i + 1;
    }
  }
  return std::string::npos;
}

// Integer arithmetic of $(( )): + - * / % and parentheses over numbers and variables holding numbers.
class Arithmetic {
 public:
  Arithmetic(const std::string& s, const ShellVars& vars) : s_(s), vars_(vars) {}
  std::optional<int64_t> eval() {
    auto v = sum();
    skip();
    if (!v || i_ != s_.size()) return std::nullopt;
    return v;
  }

 private:
  void skip() {
    while (i_ < s_.size() && blank(s_[i_])) ++i_;
  }
  std::optional<int64_t> sum() {
    auto v = product();
    while (v) {
      skip();
      if (i_ >= s_.size() || (s_[i_] != '+' && s_[i_] != '-')) break;
      const char op = s_[i_++];
      auto r = product();
      if (!r) return std::nullopt;
      v = op == '+' ? *v + *r : *v - *r;
    }
    return v;
  }
  std::optional<int64_t> product() {
    auto v = atom();
    while (v) {
      skip();
      if (i_ >= s_.size() || (s_[i_] != '*' && s_[i_] != '/' && s_[i_] != '%')) break;
      const char op = s_[i_++];
      auto r = atom();
      if (!r || (op != '*' && *r == 0)) return std::nullopt;
      if (op == '*' && (*v > INT32_MAX || *v < -INT32_MAX || *r > INT32_MAX || *r < -INT32_MAX)) return std::nullopt;
      v = op == '*' ? *v * *r : op == '/' ? *v / *r : *v % *r;
    }
    return v;
  }
  std::optional<int64_t> atom() {
    skip();
    if (i_ >= s_.size() || ++depth_ > 64) return std::nullopt;
    std::optional<int64_t> v;
    if (s_[i_] == '(') {
      ++i_;
      v = sum();
      skip();
      if (i_ >= s_.size() || s_[i_] != ')') return std::nullopt;
      ++i_;
    } else if (s_[i_] == '-') {
      ++i_;
      v = atom();
      if (v) v = -*v;
    } else if (std::isdigit(static_cast<unsigned char>(s_[i_]))) {
      int64_t n = 0;
      while (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]))) {
        if (n > INT64_MAX / 20) return std::nullopt;
        n = n * 10 + (s_[i_++] - '0');
      }
      v = n;
    } else {
      // $NAME, ${NAME} or a bare NAME: the variable must hold a whole number.
      if (s_[i_] == '$') ++i_;
      const bool brace = i_ < s_.size() && s_[i_] == '{';
      if (brace) ++i_;
      const size_t b = i_;
      while (i_ < s_.size() && name_char(s_[i_])) ++i_;
      const std::string name = s_.substr(b, i_ - b);
      if (brace) {
        if (i_ >= s_.size() || s_[i_] != '}') return std::nullopt;
        ++i_;
      }
      auto it = vars_.find(name);
      if (name.empty() || it == vars_.end() || it->second.values.empty()) return std::nullopt;
      const std::string& t = it->second.values.front();
      if (t.empty() || t.size() > 18 || !std::all_of(t.begin(), t.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }))
        return std::nullopt;
      v = std::stoll(t);
    }
    --depth_;
    return v;
  }

  const std::string s_;  // owned, like the lexer's text
  const ShellVars& vars_;
  size_t i_ = 0;
  int depth_ = 0;
};

// One pass over command text producing words. `split` = false reads an assignment value (one word, expansions
// not split on blanks, stopping at the first unquoted blank).
class Lexer {
 public:
  Lexer(const std::string& s, const ShellVars& vars, std::vector<std::string>& unresolved, bool split = true)
      : s_(s), vars_(vars), unresolved_(unresolved), split_(split) {}

  std::vector<std::string> words() {
    run();
    return std::move(words_);
  }
  // The one word of an assignment value and where it ended.
  std::string word(size_t& end) {
    run();
    end = i_;
    return words_.empty() ? std::string() : words_.front();
  }

 private:
  void finish() {
    if (in_word_) {
      if (discard_) discard_ = false;
      else words_.push_back(cur_);
    }
    cur_.clear();
    in_word_ = false;
  }
  void add(const std::string& t) {
    cur_ += t;
    in_word_ = true;
  }
  void add_split(const std::string& v) {
    if (!split_) return add(v);
    size_t k = 0;
    while (k < v.size()) {
      if (blank(v[k])) {
        finish();
        ++k;
        continue;
      }
      size_t e = k;
      while (e < v.size() && !blank(v[e])) ++e;
      add(v.substr(k, e - k));
      k = e;
    }
  }
  void literal_unresolved(const std::string& text) {
    add(text);
    if (std::find(unresolved_.begin(), unresolved_.end(), text) == unresolved_.end()) unresolved_.push_back(text);
  }

  // A whole string expanded as inside double quotes (defaults of ${X:-...}).
  std::string expand_quoted(const std::string& text) {
    std::vector<std::string> ws;
    Lexer sub("\"" + text + "\"", vars_, unresolved_, false);
    ws = sub.words();
    return ws.empty() ? std::string() : ws.front();
  }

  // s_[i_] == '$'.
  void dollar(bool quoted) {
    const size_t start = i_;
    if (i_ + 2 < s_.size() && s_[i_ + 1] == '(' && s_[i_ + 2] == '(') {
      const size_t end = matching(s_, i_ + 1);
      if (end != std::string::npos && end >= i_ + 4 && s_[end - 2] == ')') {
        const std::string expr = s_.substr(i_ + 3, end - 2 - (i_ + 3));
        i_ = end;
        if (auto v = Arithmetic(expr, vars_).eval()) add(std::to_string(*v));
        else literal_unresolved(s_.substr(start, end - start));
        return;
      }
    }
    if (i_ + 1 < s_.size() && s_[i_ + 1] == '(') {
      const size_t end = matching(s_, i_ + 1);
      i_ = end == std::string::npos ? s_.size() : end;
      return literal_unresolved(s_.substr(start, i_ - start));
    }
    if (i_ + 1 < s_.size() && s_[i_ + 1] == '{') {
      const size_t end = matching(s_, i_ + 1);
      i_ = end == std::string::npos ? s_.size() : end;
      if (end == std::string::npos) return literal_unresolved(s_.substr(start));
      return braced(s_.substr(start + 2, end - 1 - (start + 2)), s_.substr(start, end - start), quoted);
    }
    if (i_ + 1 < s_.size() && name_start(s_[i_ + 1])) {
      size_t e = i_ + 1;
      while (e < s_.size() && name_char(s_[e])) ++e;
      const std::string name = s_.substr(i_ + 1, e - i_ - 1);
      i_ = e;
      auto it = vars_.find(name);
      if (it == vars_.end()) return literal_unresolved("$" + name);
      const std::string v = it->second.values.empty() ? "" : it->second.values.front();
      return quoted ? add(v) : add_split(v);
    }
    if (i_ + 1 < s_.size() && std::string("0123456789@*#?$!-").find(s_[i_ + 1]) != std::string::npos) {
      i_ += 2;
      return literal_unresolved(s_.substr(start, 2));
    }
    ++i_;
    add("$");
  }

  // ${inner}: NAME, NAME[@], NAME[*], NAME[N], with :- - := = :+ + and a default.
  void braced(const std::string& inner, const std::string& whole, bool quoted) {
    size_t k = 0;
    while (k < inner.size() && name_char(inner[k])) ++k;
    const std::string name = inner.substr(0, k);
    if (name.empty() || !name_start(name[0])) return literal_unresolved(whole);
    enum { Scalar, All, Index } sel = Scalar;
    size_t index = 0;
    if (k < inner.size() && inner[k] == '[') {
      const size_t close = inner.find(']', k);
      if (close == std::string::npos) return literal_unresolved(whole);
      const std::string sub = inner.substr(k + 1, close - k - 1);
      if (sub == "@" || sub == "*") sel = All;
      else if (!sub.empty() && sub.size() < 9 && std::all_of(sub.begin(), sub.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }))
        sel = Index, index = std::stoul(sub);
      else return literal_unresolved(whole);
      k = close + 1;
    }
    std::string op, fallback;
    if (k < inner.size()) {
      const std::string rest = inner.substr(k);
      for (const char* o : {":-", ":=", ":+", "-", "=", "+"})
        if (rest.rfind(o, 0) == 0) {
          op = o;
          break;
        }
      if (op.empty()) return literal_unresolved(whole);  // ${X/a/b}, ${X%%.*}, ... are beyond this reader
      fallback = expand_quoted(rest.substr(op.size()));
    }
    auto it = vars_.find(name);
    const bool set = it != vars_.end();
    const bool empty = !set || it->second.values.empty() || (it->second.values.size() == 1 && it->second.values[0].empty());
    std::vector<std::string> vals;
    if (set) {
      if (sel == All) vals = it->second.values;
      else if (sel == Index) { if (index < it->second.values.size()) vals = {it->second.values[index]}; }
      else if (!it->second.values.empty()) vals = {it->second.values.front()};
    }
    const bool colon = !op.empty() && op[0] == ':';
    const char kind = op.empty() ? 0 : op.back();
    if (kind == '-' || kind == '=') {
      if (!set || (colon && empty)) vals = {fallback};
    } else if (kind == '+') {
      vals = (set && !(colon && empty)) ? std::vector<std::string>{fallback} : std::vector<std::string>{};
    } else if (!set) {
      return literal_unresolved(whole);
    }
    for (size_t e = 0; e < vals.size(); ++e) {
      if (e > 0 && sel == All) finish();
      if (quoted || sel == All) in_word_ = true;
      quoted ? add(vals[e]) : add_split(vals[e]);
    }
  }

  void double_quoted() {
    ++i_;
    in_word_ = true;
    while (i_ < s_.size() && s_[i_] != '"') {
      const char c = s_[i_];
      if (c == '\\' && i_ + 1 < s_.size()) {
        const char n = s_[i_ + 1];
        if (n == '\n') i_ += 2;
        else if (n == '$' || n == '`' || n == '"' || n == '\\') add(std::string(1, n)), i_ += 2;
        else add("\\"), ++i_;
      } else if (c == '$') {
        dollar(true);
      } else if (c == '`') {
        backtick();
      } else {
        add(std::string(1, c));
        ++i_;
      }
    }
    ++i_;  // closing quote (or end of text)
  }

  void backtick() {
    const size_t e = s_.find('`', i_ + 1);
    const size_t end = e == std::string::npos ? s_.size() : e + 1;
    literal_unresolved(s_.substr(i_, end - i_));
    i_ = end;
  }

  // > file, >> file, 2>&1, &> file, < file: the operator and its target are not words of the command.
  void redirection() {
    if (in_word_ && !cur_.empty() && std::all_of(cur_.begin(), cur_.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); })) {
      cur_.clear();
      in_word_ = false;
    }
    finish();
    while (i_ < s_.size() && (s_[i_] == '>' || s_[i_] == '<' || s_[i_] == '&' || s_[i_] == '|')) ++i_;
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t')) ++i_;
    discard_ = true;
  }

  void run() {
    while (i_ < s_.size()) {
      const char c = s_[i_];
      if (c == '\\') {
        if (i_ + 1 < s_.size() && s_[i_ + 1] == '\r' && i_ + 2 < s_.size() && s_[i_ + 2] == '\n') i_ += 3;
        else if (i_ + 1 < s_.size() && s_[i_ + 1] == '\n') i_ += 2;
        else if (i_ + 1 < s_.size()) add(std::string(1, s_[i_ + 1])), i_ += 2;
        else ++i_;
      } else if (blank(c)) {
        if (!split_) return finish();  // an assignment's value ends at the first blank (A= x runs x with A empty)
        finish();
        ++i_;
      } else if (c == '#' && !in_word_) {
        while (i_ < s_.size() && s_[i_] != '\n') ++i_;
      } else if (c == '\'') {
        const size_t e = s_.find('\'', i_ + 1);
        add(s_.substr(i_ + 1, (e == std::string::npos ? s_.size() : e) - i_ - 1));
        i_ = e == std::string::npos ? s_.size() : e + 1;
      } else if (c == '"') {
        double_quoted();
      } else if (c == '$' && i_ + 1 < s_.size() && s_[i_ + 1] == '\'') {
        ++i_;  // $'...': read as '...'
      } else if (c == '$') {
        dollar(false);
      } else if (c == '`') {
        backtick();
      } else if (c == '>' || c == '<' || (c == '&' && i_ + 1 < s_.size() && s_[i_ + 1] == '>')) {
        if (c == '<' && i_ + 1 < s_.size() && s_[i_ + 1] == '<') break;  // here-document: not a launch's words
        redirection();
      } else if (c == ';' || c == '|' || c == '&') {
        break;
      } else if (c == '(' || c == ')') {
        finish();
        ++i_;
      } else {
        add(std::string(1, c));
        ++i_;
      }
    }
    finish();
  }

  const std::string s_;  // owned: expand_quoted lexes a temporary
  const ShellVars& vars_;
  std::vector<std::string>& unresolved_;
  const bool split_;
  size_t i_ = 0;
  std::vector<std::string> words_;
  std::string cur_;
  bool in_word_ = false, discard_ = false;
};

struct Statement {
  std::string text;
  int line = 0;
};

// Statements of a script: newline- or ;-separated outside quotes and brackets, `\` continuations joined,
// comments dropped.
std::vector<Statement> statements(const std::string& s, const std::string& name) {
  std::vector<Statement> out;
  Statement cur;
  int line = 1, depth = 0, quote_line = 0;
  char quote = 0;
  auto put = [&](char c) {
    if (cur.line == 0 && !blank(c)) cur.line = line;
    cur.text += c;
  };
  auto flush = [&] {
    if (cur.line != 0) out.push_back(cur);
    cur = {};
  };
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (quote == '\'') {
      if (c == '\'') quote = 0;
      put(c);
    } else if (c == '\\' && i + 1 < s.size()) {
      put(c);
      put(s[++i]);
      if (s[i] == '\n') ++line;
      continue;
    } else if (quote == '"') {
      if (c == '"') quote = 0;
      put(c);
    } else if (c == '#' && (cur.text.empty() || blank(cur.text.back()) || cur.text.back() == ';')) {
      while (i + 1 < s.size() && s[i + 1] != '\n') ++i;
    } else if ((c == '\n' || c == ';') && depth == 0) {
      flush();
    } else {
      if (c == '\'' || c == '"') quote = c, quote_line = line;
      else if (c == '(' || c == '{') ++depth;
      else if ((c == ')' || c == '}') && depth > 0) --depth;
      put(c);
    }
    if (c == '\n') ++line;
  }
  if (quote)
    throw UserError(name + ": line " + std::to_string(quote_line) + " opens a " + (quote == '"' ? "double" : "single") +
                    " quote that is never closed (close it so the launch command can be read)");
  flush();
  return out;
}

bool is_launcher(const std::string& w) {
  const size_t slash = w.find_last_of('/');
  const std::string base = slash == std::string::npos ? w : w.substr(slash + 1);
  return (base.rfind("pretrain_", 0) == 0 && base.size() > 12 && base.compare(base.size() - 3, 3, ".py") == 0) ||
         base == "torchrun" || w.find("torch.distributed.run") != std::string::npos ||
         w.find("torch.distributed.launch") != std::string::npos;
}

std::string trim_left(const std::string& s) {
  size_t b = 0;
  while (b < s.size() && blank(s[b])) ++b;
  return s.substr(b);
}

}  // namespace

void require_closed_quotes(const std::string& text, const std::string& name) { statements(text, name); }

ShellCommand shell_words(const std::string& text, const ShellVars& vars) {
  ShellCommand c;
  c.words = Lexer(text, vars, c.unresolved).words();
  c.vars = vars;
  return c;
}

ShellCommand launch_command_from_script(const std::string& script, const std::string& name) {
  ShellVars vars;
  for (const Statement& st : statements(script, name)) {
    std::string t = trim_left(st.text);
    // Keywords that may lead an assignment or a command on the same statement.
    for (bool again = true; again;) {
      again = false;
      for (const char* kw : {"then ", "else ", "do ", "export ", "declare ", "typeset ", "local ", "readonly "}) {
        if (t.rfind(kw, 0) == 0) {
          t = trim_left(t.substr(std::string(kw).size()));
          while (t.size() > 1 && t[0] == '-' && t[1] != '-') {  // declare -a / -x options
            const size_t sp = t.find_first_of(" \t");
            t = sp == std::string::npos ? "" : trim_left(t.substr(sp));
          }
          again = true;
        }
      }
    }
    // Assignments, in order; what follows them (if anything) is a command run with them in its environment.
    while (!t.empty() && name_start(t[0])) {
      size_t k = 0;
      while (k < t.size() && name_char(t[k])) ++k;
      const bool append = k + 1 < t.size() && t[k] == '+' && t[k + 1] == '=';
      if (!(append || (k < t.size() && t[k] == '='))) break;
      const std::string var = t.substr(0, k);
      size_t v = k + (append ? 2 : 1);
      ShellVar& target = vars[var];
      std::vector<std::string> ignored;
      if (v < t.size() && t[v] == '(') {
        const size_t end = matching(t, v);
        const size_t stop = end == std::string::npos ? t.size() : end;
        std::vector<std::string> unres;
        const auto elems = Lexer(t.substr(v + 1, stop - v - 2 + (end == std::string::npos ? 1 : 0)), vars, unres).words();
        if (!append) target.values.clear();
        target.values.insert(target.values.end(), elems.begin(), elems.end());
        target.array = true;
        t = trim_left(t.substr(stop));
      } else {
        size_t used = 0;
        const std::string rest = t.substr(v);
        const std::string value = Lexer(rest, vars, ignored, false).word(used);
        if (!append) target.values = {value};
        else if (target.array) target.values.push_back(value);
        else if (target.values.empty()) target.values = {value};
        else target.values.front() += value;
        t = trim_left(rest.substr(std::min(used, rest.size())));
      }
    }
    if (t.empty()) continue;
    ShellCommand cmd;
    cmd.words = Lexer(t, vars, cmd.unresolved).words();
    if (cmd.words.empty() || cmd.words[0] == "echo" || cmd.words[0] == "printf") continue;
    for (const std::string& w : cmd.words) {
      if (!is_launcher(w) && !(w.find_first_of(" \t\n") != std::string::npos && (w.find("pretrain_") != std::string::npos || w.find("torchrun") != std::string::npos)))
        continue;
      if (w.find_first_of(" \t\n") != std::string::npos) {
        // A launch command held in one quoted string (eval "$CMD", bash -c "..."): read that string.
        ShellCommand inner;
        inner.words = Lexer(w, vars, inner.unresolved).words();
        cmd = inner;
      }
      cmd.vars = vars;
      cmd.line = st.line;
      return cmd;
    }
  }
  // No launch line: the file is a list of flags.
  ShellCommand all = shell_words(script, {});
  std::vector<std::string> words;
  std::vector<std::string> unresolved;
  for (const Statement& st : statements(script, name)) {
    auto w = Lexer(st.text, vars, unresolved).words();
    words.insert(words.end(), w.begin(), w.end());
  }
  all.words = words;
  all.unresolved = unresolved;
  all.vars = vars;
  return all;
}

}  // namespace lcplan
