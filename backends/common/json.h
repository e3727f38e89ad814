// A small JSON reader for the model configs tritonserver hands a backend (as JSON text), and the
// canonical JSON text Python's json.dumps writes of what it read (the row store's fingerprint).
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

// What Python's json.dumps(value, sort_keys=True, separators=(",", ":")) writes of the value that
// json.loads read from the same text as `value`: members sorted by name (by code point; of a
// repeated name the last), no spaces, strings ASCII-only (see JsonString), an integer as its digits
// ("-0" as 0) and any other number as Python's repr of the float it reads as (PythonFloatRepr;
// "Infinity" where it overflows).
std::string CanonicalJson(const Json& value);

// `text` (UTF-8) as json.dumps writes a string (ensure_ascii): quoted; \" \\ \b \f \n \r \t escaped;
// any other character outside ' '..'~' as \uxxxx (lowercase hex), one above U+FFFF as its
// surrogate pair. A byte that is not part of valid UTF-8 is written as the code point of its value
// (\u00XX); a surrogate encoded on its own (as the reader keeps a lone \uD8XX) as itself.
std::string JsonString(std::string_view text);

// Whether `text` is UTF-8 as RFC 3629 defines it: no overlong form, no surrogate, nothing above
// U+10FFFF.
bool ValidUtf8(std::string_view text);

// Python's repr() of a float: the shortest digits that read back as `value` (the nearest such, where
// several are as short), in fixed notation from 1e-4 up to 1e16 ("0.0001", "1e+16", "2.0", "-0.0",
// "1.5e-05"), "inf", "-inf" or "nan".
std::string PythonFloatRepr(double value);

}  // namespace stages
