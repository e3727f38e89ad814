#include "json.h"

#include <cerrno>
#include <cstdlib>

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
        case '"': out->push_back('"'); break;
        case '\\': out->push_back('\\'); break;
        case '/': out->push_back('/'); break;
        case 'b': out->push_back('\b'); break;
        case 'f': out->push_back('\f'); break;
        case 'n': out->push_back('\n'); break;
        case 'r': out->push_back('\r'); break;
        case 't': out->push_back('\t'); break;
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
        default: return Fail("a bad escape");
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
