// ast.literal_eval, as numpy's header check calls it (python_values.h: LiteralEval).
#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "python_values.h"

namespace stages::embedding::py {

namespace {

// Nesting Python's parser allows (its tokenizer's MAXLEVEL).
constexpr int kMaxNesting = 200;

// ast.literal_eval over code points: a recursive descent over the part of Python's grammar that
// literals use, with Python's limits (nesting, leading zeros, underscores, escapes).
class Literal {
 public:
  explicit Literal(const std::vector<uint32_t>& text) : text_(text) {}

  std::optional<Value> Parse() {
    // Python refuses source text with a NUL anywhere.
    if (std::find(text_.begin(), text_.end(), 0u) != text_.end()) return std::nullopt;
    // literal_eval strips leading spaces and tabs; blank lines before the value are fine.
    SkipSpace(true);
    std::optional<Node> node = ExpressionList(0, true);
    SkipSpace(true);
    if (!node || failed_ || !AtEnd()) return std::nullopt;
    return std::move(node->value);
  }

 private:
  // A parsed value, and whether it is a signed number (a second sign makes no literal).
  struct Node {
    Value value;
    bool has_sign = false;
  };

  bool AtEnd() const { return at_ >= text_.size(); }
  uint32_t Peek(size_t ahead = 0) const { return at_ + ahead < text_.size() ? text_[at_ + ahead] : 0; }
  static bool IsDigit(uint32_t c) { return c >= '0' && c <= '9'; }
  static bool IsAlpha(uint32_t c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
  static bool IsAlnum(uint32_t c) { return IsDigit(c) || IsAlpha(c); }
  static bool IsHex(uint32_t c) { return IsDigit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }
  static uint32_t Lower(uint32_t c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; }

  // Spaces, tabs, form feeds, comments and backslash-newlines; line ends too inside brackets.
  void SkipSpace(bool lines) {
    while (!AtEnd()) {
      const uint32_t c = Peek();
      if (c == ' ' || c == '\t' || c == '\f' || (lines && (c == '\n' || c == '\r'))) {
        ++at_;
      } else if (c == '#') {
        while (!AtEnd() && Peek() != '\n' && Peek() != '\r') ++at_;
      } else if (c == '\\' && (Peek(1) == '\n' || Peek(1) == '\r')) {
        at_ += (Peek(1) == '\r' && Peek(2) == '\n') ? 3 : 2;
        if (AtEnd()) failed_ = true;  // a continuation into nothing: an unexpected end
      } else {
        return;
      }
    }
  }

  bool Take(uint32_t c, bool lines) {
    SkipSpace(lines);
    if (AtEnd() || Peek() != c) return false;
    ++at_;
    return true;
  }

  // `a, b, ...` where a bare tuple may stand: the top level (one line) and inside parentheses.
  std::optional<Node> ExpressionList(int depth, bool top) {
    std::optional<Node> first = Expression(depth, !top);
    if (!first || !Take(',', !top)) return first;
    Node tuple;
    tuple.value.kind = Value::Kind::kTuple;
    tuple.value.items.push_back(std::move(first->value));
    while (true) {
      SkipSpace(!top);
      if (AtEnd() || Peek() == ')' || Peek() == '\n' || Peek() == '\r') break;  // a trailing comma
      std::optional<Node> item = Expression(depth, !top);
      if (!item) return std::nullopt;
      tuple.value.items.push_back(std::move(item->value));
      if (!Take(',', !top)) break;
    }
    return tuple;
  }

  // A value, or `a + bj` / `a - bj` (a real number and an imaginary one: literal_eval's one
  // binary operation).
  std::optional<Node> Expression(int depth, bool lines) {
    std::optional<Node> left = SignedAtom(depth, lines);
    if (!left) return std::nullopt;
    SkipSpace(lines);
    if (Peek() != '+' && Peek() != '-') return left;
    const bool minus = Peek() == '-';
    ++at_;
    SkipSpace(lines);
    const std::optional<Node> right = Atom(depth, lines);
    const Value& a = left->value;
    if (!right || right->value.kind != Value::Kind::kComplex || right->has_sign ||
        (a.kind != Value::Kind::kInt && a.kind != Value::Kind::kFloat)) {
      return std::nullopt;
    }
    const double real = a.kind == Value::Kind::kFloat ? a.real
                        : a.huge                      ? std::strtod(a.text.c_str(), nullptr)
                                                      : static_cast<double>(a.integer);
    Node sum;
    sum.value = Value::Complex(minus ? real - right->value.real : real + right->value.real,
                               minus ? -right->value.imag : right->value.imag);
    sum.has_sign = true;
    SkipSpace(lines);
    if (Peek() == '+' || Peek() == '-') return std::nullopt;  // a longer sum is no literal
    return sum;
  }

  // A value, or one sign on a number (parentheses around the number are no node of their own).
  std::optional<Node> SignedAtom(int depth, bool lines) {
    if (failed_ || depth > kMaxNesting) return std::nullopt;
    SkipSpace(lines);
    if (Peek() != '+' && Peek() != '-') return Atom(depth, lines);
    const bool negative = Peek() == '-';
    ++at_;
    SkipSpace(lines);
    std::optional<Node> number = Atom(depth + 1, lines);
    if (!number || number->has_sign) return std::nullopt;
    Value& value = number->value;
    if (value.kind == Value::Kind::kFloat || value.kind == Value::Kind::kComplex) {
      if (negative) value.real = -value.real, value.imag = -value.imag;
    } else if (value.kind == Value::Kind::kInt && !value.huge) {
      if (negative) value.integer = -value.integer;
    } else if (value.kind == Value::Kind::kInt) {
      if (negative) value.text = value.text[0] == '-' ? value.text.substr(1) : "-" + value.text;
    } else {
      return std::nullopt;
    }
    number->has_sign = true;
    return number;
  }

  std::optional<Node> Atom(int depth, bool lines) {
    if (AtEnd()) return std::nullopt;
    const uint32_t c = Peek();
    if (c == '(' || c == '[' || c == '{') return Bracket(depth + 1);
    if (c == '\'' || c == '"') return Strings(lines);
    if (IsDigit(c) || (c == '.' && IsDigit(Peek(1)))) return Number();
    if (!IsAlpha(c) && c != '_') return std::nullopt;
    size_t end = at_;
    std::string word;
    while (end < text_.size() && (IsAlnum(text_[end]) || text_[end] == '_')) {
      word += static_cast<char>(text_[end++]);
    }
    if (end < text_.size() && (text_[end] == '\'' || text_[end] == '"')) return Strings(lines);  // a prefix
    at_ = end;
    Node node;
    if (word == "True" || word == "False") {
      node.value = Value::Bool(word == "True");
    } else if (word != "None") {
      return std::nullopt;  // a name: no literal
    }
    return node;
  }

  // (...), [...] or {...}.
  std::optional<Node> Bracket(int depth) {
    if (depth > kMaxNesting) return std::nullopt;
    const uint32_t open = text_[at_++];
    const uint32_t close = open == '(' ? ')' : open == '[' ? ']' : '}';
    Node out;
    out.value.kind = open == '['   ? Value::Kind::kList
                     : open == '(' ? Value::Kind::kTuple
                                   : Value::Kind::kDict;
    if (Take(close, true)) return out;
    if (open == '(') {
      std::optional<Node> inner = ExpressionList(depth, false);
      if (!inner || !Take(')', true)) return std::nullopt;
      return inner;
    }
    bool dict = false;
    for (bool first = true;; first = false) {
      std::optional<Node> item = Expression(depth, true);
      if (!item) return std::nullopt;
      if (open == '{' && first) dict = Take(':', true);
      if (open == '{' && !first && dict && !Take(':', true)) return std::nullopt;
      if (dict) {
        std::optional<Node> value = Expression(depth, true);
        if (!value) return std::nullopt;
        out.value.Put(std::move(item->value), std::move(value->value));
      } else if (open == '{') {
        out.value.kind = Value::Kind::kSet;
        AddToSet(std::move(item->value), &out.value);
      } else {
        out.value.items.push_back(std::move(item->value));
      }
      if (!Take(',', true)) break;
      if (Take(close, true)) return out;
    }
    if (!Take(close, true)) return std::nullopt;
    return out;
  }

  static void AddToSet(Value item, Value* set) {
    if (item.kind == Value::Kind::kList || item.kind == Value::Kind::kDict ||
        item.kind == Value::Kind::kSet) {
      throw py::Exception("TypeError", "unhashable type: '" + py::TypeName(item) + "'");
    }
    for (const Value& existing : set->items) {
      if (py::Equal(existing, item)) return;
    }
    set->items.push_back(std::move(item));
  }

  // Digits that `is_digit` accepts, with single underscores between them, appended to `out`;
  // false where there is none.
  template <typename Test>
  bool DigitRun(Test is_digit, std::string* out) {
    if (AtEnd() || !is_digit(Peek())) return false;
    while (!AtEnd()) {
      if (is_digit(Peek())) {
        *out += static_cast<char>(text_[at_++]);
      } else if (Peek() == '_' && is_digit(Peek(1))) {
        ++at_;
      } else {
        break;
      }
    }
    return true;
  }

  static int DigitValue(uint32_t c) {
    if (IsDigit(c)) return static_cast<int>(c - '0');
    if (IsAlpha(c)) return static_cast<int>(Lower(c) - 'a') + 10;
    return 99;
  }

  // A number: an int (decimal, 0x, 0o, 0b), a float or an imaginary number (2j).
  std::optional<Node> Number() {
    const auto decimal = [](uint32_t c) { return IsDigit(c); };
    // A name character right after a number ("1abc", "1_", "1j") is no literal either.
    const auto name_follows = [this]() {
      return !AtEnd() && (Peek() >= 0x80 || Peek() == '_' || IsAlnum(Peek()));
    };
    Node node;
    const uint32_t marker = Lower(Peek(1));
    if (Peek() == '0' && (marker == 'x' || marker == 'o' || marker == 'b')) {
      const int base = marker == 'x' ? 16 : marker == 'o' ? 8 : 2;
      at_ += 2;
      if (Peek() == '_') ++at_;
      std::string digits;
      if (!DigitRun([base](uint32_t c) { return DigitValue(c) < base; }, &digits) || name_follows()) {
        return std::nullopt;
      }
      Int value = 0;
      for (const char digit : digits) {
        if (__builtin_mul_overflow(value, base, &value) ||
            __builtin_add_overflow(value, DigitValue(digit), &value)) {
          return std::nullopt;
        }
      }
      node.value = Value::Integer(value);
      return node;
    }
    std::string whole, fraction, exponent;
    bool real = false;
    if (Peek() != '.' && !DigitRun(decimal, &whole)) return std::nullopt;
    if (Peek() == '.') {
      real = true;
      ++at_;
      if (decimal(Peek())) DigitRun(decimal, &fraction);
    }
    if (Peek() == 'e' || Peek() == 'E') {
      ++at_;
      std::string sign;
      if (Peek() == '+' || Peek() == '-') sign = static_cast<char>(text_[at_++]);
      if (!DigitRun(decimal, &exponent)) return std::nullopt;
      exponent = sign + exponent;
      real = true;
    }
    if (Peek() == 'j' || Peek() == 'J') {
      ++at_;
      if (name_follows()) return std::nullopt;
      const std::string text =
          (whole.empty() ? "0" : whole) + "." + fraction + (exponent.empty() ? "" : "e" + exponent);
      node.value = Value::Complex(0, std::strtod(text.c_str(), nullptr));
      return node;
    }
    if (name_follows()) return std::nullopt;
    if (real) {
      const std::string text =
          (whole.empty() ? "0" : whole) + "." + fraction + (exponent.empty() ? "" : "e" + exponent);
      node.value = Value::Float(std::strtod(text.c_str(), nullptr));
      return node;
    }
    // "01" is no literal ("00" is 0).
    if (whole.size() > 1 && whole[0] == '0' && whole.find_first_not_of('0') != std::string::npos)
      return std::nullopt;
    node.value = Value::Integer(0);
    for (const char digit : whole) {
      if (__builtin_mul_overflow(node.value.integer, 10, &node.value.integer) ||
          __builtin_add_overflow(node.value.integer, digit - '0', &node.value.integer)) {
        node.value.huge = true;
      }
    }
    if (node.value.huge) node.value.text = whole;
    return node;
  }

  // One or more adjacent string literals (all str or all bytes), concatenated.
  std::optional<Node> Strings(bool lines) {
    std::optional<bool> bytes;
    std::string out;
    while (true) {
      SkipSpace(lines);
      size_t end = at_;
      std::string prefix;
      while (end < text_.size() && IsAlpha(text_[end])) {
        prefix += static_cast<char>(Lower(text_[end++]));
      }
      if (end >= text_.size() || (text_[end] != '\'' && text_[end] != '"')) break;
      if (prefix != "" && prefix != "r" && prefix != "u" && prefix != "b" && prefix != "rb" &&
          prefix != "br") {
        return std::nullopt;  // an f-string, or a name before a string
      }
      const bool is_bytes = prefix.find('b') != std::string::npos;
      if (bytes && *bytes != is_bytes) return std::nullopt;
      bytes = is_bytes;
      at_ = end;
      if (!OneString(is_bytes, prefix.find('r') != std::string::npos, &out)) return std::nullopt;
    }
    if (!bytes) return std::nullopt;
    Node node;
    node.value = *bytes ? Value::Bytes(std::move(out)) : Value::Str(std::move(out));
    return node;
  }

  // `count` hex digits as a number; nothing where one is missing.
  std::optional<uint32_t> Hex(int count) {
    uint32_t value = 0;
    for (int index = 0; index < count; ++index) {
      if (AtEnd() || !IsHex(Peek())) return std::nullopt;
      value = value * 16 + static_cast<uint32_t>(DigitValue(text_[at_++]));
    }
    return value;
  }

  // One literal from its opening quote, appended to `out` (UTF-8, or a bytes literal's bytes).
  bool OneString(bool bytes, bool raw, std::string* out) {
    const uint32_t quote = text_[at_];
    const bool triple = Peek(1) == quote && Peek(2) == quote;
    at_ += triple ? 3 : 1;
    const auto put = [&](uint32_t c) {
      if (bytes) {
        out->push_back(static_cast<char>(c & 0xFF));
      } else {
        py::AppendUtf8(c, out);
      }
    };
    while (true) {
      if (AtEnd()) return false;
      const uint32_t c = text_[at_];
      if (c == quote && (!triple || (Peek(1) == quote && Peek(2) == quote))) {
        at_ += triple ? 3 : 1;
        return true;
      }
      if ((c == '\n' || c == '\r') && !triple) return false;
      if (bytes && c >= 0x80) return false;
      ++at_;
      if (c != '\\') {
        put(c);
        continue;
      }
      if (AtEnd()) return false;
      const uint32_t e = text_[at_++];
      if (raw) {
        // A raw literal keeps its backslashes; one still keeps the quote after it from ending it.
        put('\\');
        put(e);
        continue;
      }
      std::optional<uint32_t> code;
      switch (e) {
        case '\n':
          break;
        case '\r':
          if (Peek() == '\n') ++at_;
          break;
        case 'a':
          put(0x07);
          break;
        case 'b':
          put(0x08);
          break;
        case 'f':
          put(0x0c);
          break;
        case 'n':
          put('\n');
          break;
        case 'r':
          put('\r');
          break;
        case 't':
          put('\t');
          break;
        case 'v':
          put(0x0b);
          break;
        case 'x':
          if (!(code = Hex(2))) return false;
          put(*code);
          break;
        case 'u':
        case 'U':
          if (bytes) {
            put('\\');
            put(e);
            break;
          }
          if (!(code = Hex(e == 'u' ? 4 : 8)) || *code > 0x10FFFF) return false;
          put(*code);
          break;
        case 'N':
          if (!bytes) return false;  // \N{name}: not read here
          put('\\');
          put('N');
          break;
        default:
          if (e >= '0' && e <= '7') {
            uint32_t value = e - '0';
            for (int index = 0; index < 2 && !AtEnd() && Peek() >= '0' && Peek() <= '7'; ++index) {
              value = value * 8 + (text_[at_++] - '0');
            }
            put(value);
          } else if (e == '\\' || e == '\'' || e == '"') {
            put(e);
          } else {
            put('\\');
            put(e);
          }
      }
    }
  }

  const std::vector<uint32_t>& text_;
  size_t at_ = 0;
  bool failed_ = false;
};

}  // namespace

std::optional<Value> LiteralEval(const std::vector<uint32_t>& text) { return Literal(text).Parse(); }

}  // namespace stages::embedding::py
