#include "json.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>

namespace stages {

namespace {
constexpr int kMaxDepth = 64;
}  // namespace

class JsonReader {
 public:
  explicit JsonReader(std::string_view text) : text_(text) {}

  bool Document(Json* value) {
    if (!Value(value, 0)) return false;
    SkipSpace();
    return position_ == text_.size() || Fail("text after the value");
  }

  const std::string& error() const { return error_; }

 private:
  bool Fail(const std::string& why) {
    if (error_.empty()) error_ = why + " at byte " + std::to_string(position_);
    return false;
  }

  void SkipSpace() {
    while (position_ < text_.size()) {
      const char c = text_[position_];
      if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
      ++position_;
    }
  }

  bool Literal(std::string_view word) {
    if (text_.substr(position_, word.size()) != word) return Fail("an unknown word");
    position_ += word.size();
    return true;
  }

  bool Value(Json* value, int depth) {
    if (depth > kMaxDepth) return Fail("nesting too deep");
    SkipSpace();
    if (position_ >= text_.size()) return Fail("a value expected");
    const char c = text_[position_];
    if (c == '{') return Object(value, depth);
    if (c == '[') return Array(value, depth);
    if (c == '"') {
      value->kind_ = Json::Kind::kString;
      return String(&value->text_);
    }
    if (c == 't' || c == 'f') {
      value->kind_ = Json::Kind::kBool;
      value->truth_ = c == 't';
      return Literal(c == 't' ? "true" : "false");
    }
    if (c == 'n') {
      value->kind_ = Json::Kind::kNull;
      return Literal("null");
    }
    return Number(value);
  }

  bool Peek(char wanted) const { return position_ < text_.size() && text_[position_] == wanted; }

  bool PeekDigit() const {
    return position_ < text_.size() && text_[position_] >= '0' && text_[position_] <= '9';
  }

  // Digits, at least one: false where there is none.
  bool Digits() {
    if (!PeekDigit()) return false;
    while (PeekDigit()) ++position_;
    return true;
  }

  // RFC 8259's number: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
  bool Number(Json* value) {
    const size_t start = position_;
    if (Peek('-')) ++position_;
    if (Peek('0')) {
      ++position_;
    } else if (!Digits()) {
      return Fail("a value expected");
    }
    if (Peek('.')) {
      ++position_;
      if (!Digits()) return Fail("digits expected after '.'");
    }
    if (Peek('e') || Peek('E')) {
      ++position_;
      if (Peek('+') || Peek('-')) ++position_;
      if (!Digits()) return Fail("digits expected in an exponent");
    }
    value->kind_ = Json::Kind::kNumber;
    value->text_ = std::string(text_.substr(start, position_ - start));
    return true;
  }

  static void Utf8(uint32_t point, std::string* out) {
    if (point < 0x80) {
      out->push_back(static_cast<char>(point));
    } else if (point < 0x800) {
      out->push_back(static_cast<char>(0xC0 | (point >> 6)));
      out->push_back(static_cast<char>(0x80 | (point & 0x3F)));
    } else if (point < 0x10000) {
      out->push_back(static_cast<char>(0xE0 | (point >> 12)));
      out->push_back(static_cast<char>(0x80 | ((point >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (point & 0x3F)));
    } else {
      out->push_back(static_cast<char>(0xF0 | (point >> 18)));
      out->push_back(static_cast<char>(0x80 | ((point >> 12) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | ((point >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (point & 0x3F)));
    }
  }

  bool Hex4(uint32_t* point) {
    if (text_.size() - position_ < 4) return Fail("a short \\u escape");
    *point = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = text_[position_++];
      uint32_t digit;
      if (c >= '0' && c <= '9') {
        digit = static_cast<uint32_t>(c - '0');
      } else if (c >= 'a' && c <= 'f') {
        digit = static_cast<uint32_t>(c - 'a' + 10);
      } else if (c >= 'A' && c <= 'F') {
        digit = static_cast<uint32_t>(c - 'A' + 10);
      } else {
        return Fail("a bad \\u escape");
      }
      *point = (*point << 4) | digit;
    }
    return true;
  }

  bool String(std::string* out) {
    ++position_;  // the opening quote
    while (position_ < text_.size()) {
      const char c = text_[position_++];
      if (c == '"') return true;
      if (static_cast<unsigned char>(c) < 0x20) return Fail("a control character in a string");
      if (c != '\\') {
        out->push_back(c);
        continue;
      }
      if (position_ >= text_.size()) break;
      const char escape = text_[position_++];
      switch (escape) {
        case '"':
          out->push_back('"');
          break;
        case '\\':
          out->push_back('\\');
          break;
        case '/':
          out->push_back('/');
          break;
        case 'b':
          out->push_back('\b');
          break;
        case 'f':
          out->push_back('\f');
          break;
        case 'n':
          out->push_back('\n');
          break;
        case 'r':
          out->push_back('\r');
          break;
        case 't':
          out->push_back('\t');
          break;
        case 'u': {
          uint32_t point = 0;
          if (!Hex4(&point)) return false;
          if (point >= 0xD800 && point < 0xDC00 && text_.substr(position_, 2) == "\\u") {
            // A pair makes one code point; a high surrogate without its low one stays alone (as
            // Python's reader keeps it), and the escape after it is read on its own.
            const size_t second = position_;
            position_ += 2;
            uint32_t low = 0;
            if (!Hex4(&low)) return false;
            if (low >= 0xDC00 && low < 0xE000) {
              point = 0x10000 + ((point - 0xD800) << 10) + (low - 0xDC00);
            } else {
              position_ = second;
            }
          }
          Utf8(point, out);
          break;
        }
        default:
          return Fail("a bad escape");
      }
    }
    return Fail("an unterminated string");
  }

  bool Array(Json* value, int depth) {
    value->kind_ = Json::Kind::kArray;
    ++position_;
    SkipSpace();
    if (position_ < text_.size() && text_[position_] == ']') {
      ++position_;
      return true;
    }
    while (true) {
      value->items_.emplace_back();
      if (!Value(&value->items_.back(), depth + 1)) return false;
      SkipSpace();
      if (position_ >= text_.size()) return Fail("an unterminated array");
      const char c = text_[position_++];
      if (c == ']') return true;
      if (c != ',') return Fail("',' or ']' expected");
    }
  }

  bool Object(Json* value, int depth) {
    value->kind_ = Json::Kind::kObject;
    ++position_;
    SkipSpace();
    if (position_ < text_.size() && text_[position_] == '}') {
      ++position_;
      return true;
    }
    while (true) {
      SkipSpace();
      if (position_ >= text_.size() || text_[position_] != '"') return Fail("a member name expected");
      std::string name;
      if (!String(&name)) return false;
      SkipSpace();
      if (position_ >= text_.size() || text_[position_] != ':') return Fail("':' expected");
      ++position_;
      Json member;
      if (!Value(&member, depth + 1)) return false;
      value->members_.emplace_back(std::move(name), std::move(member));
      SkipSpace();
      if (position_ >= text_.size()) return Fail("an unterminated object");
      const char c = text_[position_++];
      if (c == '}') return true;
      if (c != ',') return Fail("',' or '}' expected");
    }
  }

  std::string_view text_;
  size_t position_ = 0;
  std::string error_;
};

std::optional<Json> Json::Parse(std::string_view text, std::string* error) {
  JsonReader reader(text);
  Json value;
  if (!reader.Document(&value)) {
    *error = reader.error();
    return std::nullopt;
  }
  return value;
}

std::optional<int64_t> Json::integer() const {
  if (kind_ == Kind::kString || kind_ == Kind::kNumber) {
    // Triton writes 64-bit integers of a config (dims among them) as numbers or as strings.
    if (text_.empty()) return std::nullopt;
    errno = 0;
    char* end = nullptr;
    const long long value = std::strtoll(text_.c_str(), &end, 10);
    if (errno != 0 || end != text_.c_str() + text_.size()) return std::nullopt;
    return static_cast<int64_t>(value);
  }
  return std::nullopt;
}

const Json* Json::member(const std::string& name) const {
  // The last of repeated names, as most readers take it.
  for (auto entry = members_.rbegin(); entry != members_.rend(); ++entry) {
    if (entry->first == name) return &entry->second;
  }
  return nullptr;
}

}  // namespace stages

namespace stages {

namespace {

// The code point of the UTF-8 sequence at `text[*at]`, advancing past it; a byte that starts no
// valid sequence stands for itself (its value). Surrogates encoded as three bytes are taken as
// they are (the reader writes a lone \uD8XX so).
uint32_t NextPoint(std::string_view text, size_t* at) {
  const auto byte = [&](size_t index) { return static_cast<unsigned char>(text[index]); };
  const unsigned char lead = byte(*at);
  int length = 0;
  uint32_t point = 0;
  uint32_t smallest = 0;
  if (lead < 0x80) {
    ++*at;
    return lead;
  } else if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2, point = lead & 0x1Fu, smallest = 0x80;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3, point = lead & 0x0Fu, smallest = 0x800;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4, point = lead & 0x07u, smallest = 0x10000;
  }
  if (length == 0 || text.size() - *at < static_cast<size_t>(length)) {
    ++*at;
    return lead;
  }
  for (int index = 1; index < length; ++index) {
    const unsigned char next = byte(*at + index);
    if ((next & 0xC0u) != 0x80u) {
      ++*at;
      return lead;
    }
    point = (point << 6) | (next & 0x3Fu);
  }
  if (point < smallest || point > 0x10FFFF) {
    ++*at;
    return lead;
  }
  *at += length;
  return point;
}

void AppendEscape(uint32_t unit, std::string* out) {
  static constexpr char kDigits[] = "0123456789abcdef";
  *out += "\\u";
  for (int shift = 12; shift >= 0; shift -= 4) *out += kDigits[(unit >> shift) & 0xFu];
}

void AppendString(std::string_view text, std::string* out) {
  *out += '"';
  for (size_t at = 0; at < text.size();) {
    const uint32_t point = NextPoint(text, &at);
    switch (point) {
      case '"':
        *out += "\\\"";
        break;
      case '\\':
        *out += "\\\\";
        break;
      case '\b':
        *out += "\\b";
        break;
      case '\f':
        *out += "\\f";
        break;
      case '\n':
        *out += "\\n";
        break;
      case '\r':
        *out += "\\r";
        break;
      case '\t':
        *out += "\\t";
        break;
      default:
        if (point >= 0x20 && point <= 0x7E) {
          *out += static_cast<char>(point);
        } else if (point < 0x10000) {
          AppendEscape(point, out);
        } else {
          AppendEscape(0xD800 + ((point - 0x10000) >> 10), out);
          AppendEscape(0xDC00 + ((point - 0x10000) & 0x3FFu), out);
        }
    }
  }
  *out += '"';
}

// A number token as json.dumps writes the value json.loads made of it.
void AppendNumber(const std::string& token, std::string* out) {
  if (token.find_first_of(".eE") == std::string::npos) {
    // An int: its digits (JSON allows no leading zeros), "-0" being 0.
    *out += token.find_first_not_of("-0") == std::string::npos ? "0" : token;
    return;
  }
  const double value = std::strtod(token.c_str(), nullptr);
  if (value == HUGE_VAL) {
    *out += "Infinity";
  } else if (value == -HUGE_VAL) {
    *out += "-Infinity";
  } else {
    *out += PythonFloatRepr(value);
  }
}

void AppendCanonical(const Json& value, std::string* out) {
  switch (value.kind()) {
    case Json::Kind::kNull:
      *out += "null";
      return;
    case Json::Kind::kBool:
      *out += value.truth() ? "true" : "false";
      return;
    case Json::Kind::kNumber:
      AppendNumber(value.text(), out);
      return;
    case Json::Kind::kString:
      AppendString(value.text(), out);
      return;
    case Json::Kind::kArray: {
      *out += '[';
      for (size_t index = 0; index < value.items().size(); ++index) {
        if (index) *out += ',';
        AppendCanonical(value.items()[index], out);
      }
      *out += ']';
      return;
    }
    case Json::Kind::kObject: {
      // Of a repeated name the last value, as json.loads keeps it; byte order of UTF-8 is the
      // code points' order, as Python sorts the names.
      std::map<std::string_view, const Json*> members;
      for (const auto& [name, member] : value.members()) members[name] = &member;
      *out += '{';
      bool first = true;
      for (const auto& [name, member] : members) {
        if (!first) *out += ',';
        first = false;
        AppendString(name, out);
        *out += ':';
        AppendCanonical(*member, out);
      }
      *out += '}';
      return;
    }
  }
}

// The decimal digits (no trailing zeros) and exponent of `value` (> 0, finite) written with
// `precision` significant digits, correctly rounded: value ~ d.ddd x 10^exponent.
void Digits(double value, int precision, std::string* digits, int* exponent) {
  char text[64];
  std::snprintf(text, sizeof(text), "%.*e", precision - 1, value);
  digits->clear();
  const char* at = text;
  for (; *at != 'e'; ++at) {
    if (*at != '.') *digits += *at;
  }
  *exponent = std::atoi(at + 1);
}

double ReadBack(const std::string& digits, int exponent) {
  const std::string text = digits.substr(0, 1) + "." + digits.substr(1) + "e" + std::to_string(exponent);
  return std::strtod(text.c_str(), nullptr);
}

// `digits` (of one length) plus `step` (+1 or -1) in the last place, carrying; the exponent moves
// where the length would change. Empty where it leaves that length downward (1000 - 1).
bool Step(std::string* digits, int* exponent, int step) {
  std::string next = *digits;
  size_t index = next.size();
  while (index > 0) {
    --index;
    if (step > 0) {
      if (next[index] != '9') {
        ++next[index];
        *digits = next;
        return true;
      }
      next[index] = '0';
    } else {
      if (next[index] != '0') {
        --next[index];
        if (next[0] == '0') return false;
        *digits = next;
        return true;
      }
      next[index] = '9';
    }
  }
  if (step < 0) return false;
  // 999 + 1: 1000, one place up.
  *digits = "1" + std::string(next.size() - 1, '0');
  ++*exponent;
  return true;
}

}  // namespace

std::string CanonicalJson(const Json& value) {
  std::string out;
  AppendCanonical(value, &out);
  return out;
}

std::string JsonString(std::string_view text) {
  std::string out;
  AppendString(text, &out);
  return out;
}

std::string PythonFloatRepr(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  const bool negative = std::signbit(value);
  if (value == 0) return negative ? "-0.0" : "0.0";
  const double magnitude = std::fabs(value);
  std::string digits;
  int exponent = 0;
  for (int precision = 1; precision <= 17; ++precision) {
    Digits(magnitude, precision, &digits, &exponent);
    if (ReadBack(digits, exponent) == magnitude) break;
    // Next to a power of two the values that read back as `magnitude` lie closer on one side
    // than on the other: the nearest digits of this length may miss while the next ones above
    // or below still hit. Python's repr takes those (shorter wins over nearer).
    std::string above = digits, below = digits;
    int above_exponent = exponent, below_exponent = exponent;
    const bool up = Step(&above, &above_exponent, +1) && ReadBack(above, above_exponent) == magnitude;
    const bool down = Step(&below, &below_exponent, -1) && ReadBack(below, below_exponent) == magnitude;
    if (up || down) {
      const long double a = std::strtold(
          (above.substr(0, 1) + "." + above.substr(1) + "e" + std::to_string(above_exponent)).c_str(),
          nullptr);
      const long double b = std::strtold(
          (below.substr(0, 1) + "." + below.substr(1) + "e" + std::to_string(below_exponent)).c_str(),
          nullptr);
      const long double target = magnitude;
      if (up && (!down || std::fabs(a - target) <= std::fabs(b - target))) {
        digits = above, exponent = above_exponent;
      } else {
        digits = below, exponent = below_exponent;
      }
      break;
    }
  }
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  // The decimal point's place in the digits: value = 0.ddd x 10^point.
  const int point = exponent + 1;
  std::string out = negative ? "-" : "";
  if (point <= -4 || point > 16) {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    const int shown = point - 1;
    char tail[16];
    std::snprintf(tail, sizeof(tail), "e%c%02d", shown < 0 ? '-' : '+', shown < 0 ? -shown : shown);
    out += tail;
  } else if (point <= 0) {
    out += "0." + std::string(static_cast<size_t>(-point), '0') + digits;
  } else if (static_cast<size_t>(point) >= digits.size()) {
    out += digits + std::string(static_cast<size_t>(point) - digits.size(), '0') + ".0";
  } else {
    out += digits.substr(0, static_cast<size_t>(point)) + "." + digits.substr(static_cast<size_t>(point));
  }
  return out;
}

bool ValidUtf8(std::string_view text) {
  for (size_t at = 0; at < text.size();) {
    const auto lead = static_cast<unsigned char>(text[at]);
    if (lead < 0x80) {
      ++at;
      continue;
    }
    // The bytes that follow a lead, and the range of the first of them (the rest 0x80..0xBF).
    size_t length = 0;
    unsigned char low = 0x80, high = 0xBF;
    if (lead >= 0xC2 && lead <= 0xDF) {
      length = 1;
    } else if (lead >= 0xE0 && lead <= 0xEF) {
      length = 2;
      if (lead == 0xE0) low = 0xA0;   // no overlong form
      if (lead == 0xED) high = 0x9F;  // no surrogate
    } else if (lead >= 0xF0 && lead <= 0xF4) {
      length = 3;
      if (lead == 0xF0) low = 0x90;   // no overlong form
      if (lead == 0xF4) high = 0x8F;  // nothing above U+10FFFF
    } else {
      return false;
    }
    if (text.size() - at - 1 < length) return false;
    for (size_t index = 1; index <= length; ++index) {
      const auto byte = static_cast<unsigned char>(text[at + index]);
      if (byte < (index == 1 ? low : 0x80) || byte > (index == 1 ? high : 0xBF)) return false;
    }
    at += length + 1;
  }
  return true;
}

}  // namespace stages
