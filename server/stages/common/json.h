// A small JSON reader for the model configs tritonserver hands a backend (as JSON text).
//
// Enough of RFC 8259 for a config: objects, arrays, strings (escapes and \u included), numbers,
// true, false, null. Nesting is bounded, and a malformed text is an error, never a crash.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace stages {

class Json {
 public:
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject };

  // Parses `text`; on failure returns nothing and says why in `error`.
  static std::optional<Json> Parse(std::string_view text, std::string* error);

  Kind kind() const { return kind_; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_array() const { return kind_ == Kind::kArray; }
  bool is_object() const { return kind_ == Kind::kObject; }

  // A bool's value; false for any other kind.
  bool truth() const { return truth_; }
  // A string's text, a number's digits as written; empty for any other kind.
  const std::string& text() const { return text_; }
  // A number as an integer, where it is one that fits an int64.
  std::optional<int64_t> integer() const;
  // An array's items; empty for any other kind.
  const std::vector<Json>& items() const { return items_; }
  // An object's member, or null where absent (or not an object); the last of a repeated name.
  const Json* member(const std::string& name) const;
  // An object's members in their order, repeats kept.
  const std::vector<std::pair<std::string, Json>>& members() const { return members_; }

 private:
  friend class JsonReader;
  Kind kind_ = Kind::kNull;
  bool truth_ = false;
  std::string text_;  // a string's text, a number's digits
  std::vector<Json> items_;
  // A vector, not a map: the standard allows a vector of an incomplete type, not a map.
  std::vector<std::pair<std::string, Json>> members_;
};

}  // namespace stages
