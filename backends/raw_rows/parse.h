// Criteo rows to model inputs: the rules of the bundle's criteo/rows.py, in C++.
//
// A row is a Criteo TSV line: (a label,) 13 integer counts I1..I13 and 26 categorical ids
// C1..C26 in hex, separated by tabs. A count is an optional '-' and 1 to 18 decimal digits (a
// missing one is 0, a negative one is clamped to 0, then log1p as float32); an id is 1 to 16 hex
// digits of either case (a missing one is 0; one of 2^63 or more keeps its 64 bits as an
// int64); a label is 0 or 1. The first row that breaks a rule, in the order criteo/rows.py
// checks them, is refused with the same text, naming the row and the field.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace raw_rows {

inline constexpr size_t kNumDense = 13;
inline constexpr size_t kNumCategorical = 26;
inline constexpr size_t kNumFeatures = kNumDense + kNumCategorical;
inline constexpr int64_t kMissingId = 0;
inline constexpr size_t kMaxCountDigits = 18;
inline constexpr size_t kMaxIdDigits = 16;

// A row that breaks a rule. `column` is "label", "I1".. or "C1"..; empty for a wrong row or
// field count. message() is the python reader's str(RowError): "row <row>: <detail>".
struct RowError {
  size_t row = 0;
  std::string column;
  std::string detail;
  std::string message() const;
};

enum class Labeled { kNo, kYes, kDetect };

// Where the parse writes, row-major, each pointer for `rows` rows (null: not wanted).
//   dense:   B x 13 float32, log1p of the clamped counts (the model's input)
//   counts:  B x 13 int64 as parsed (a missing count is -1), missing: B x 13 (1 where missing)
//   ids:     B x 26 int64
//   labels:  B float32 (labeled rows only)
struct Outputs {
  float* dense = nullptr;
  int64_t* counts = nullptr;
  uint8_t* missing = nullptr;
  int64_t* ids = nullptr;
  float* labels = nullptr;
};

// The layout of parsed text: how many rows, whether labeled.
struct Layout {
  size_t rows = 0;
  bool labeled = false;
};

// Pass one of criteo.rows.parse_rows: the rows of `data` (separated by "\n" or "\r\n", one after
// the last row optional), checked for their count (`expected`, when given) and their field
// counts. Returns the error, or nothing with `layout` set.
std::optional<RowError> Scan(std::string_view data, Labeled labeled, std::optional<size_t> expected,
                             Layout* layout);

// Pass two: parse the rows that Scan laid out into `out` (every pointer set sized for
// layout.rows). Returns the first row (in criteo.rows.parse_rows's order) that breaks a rule.
std::optional<RowError> Parse(std::string_view data, const Layout& layout, const Outputs& out);

// The raw-row stage's rows, one per tensor element, as one text: joined by "\n"; where a row
// carries its own line end ("\n", or "\r\n"), every row loses its own first (as the python
// stage does). Written into `joined`, whose capacity is reused.
void JoinRows(const std::vector<std::string_view>& rows, std::string* joined);

// Python's repr() of bytes decoded as latin-1, encoded as UTF-8: how an error quotes a field.
std::string PythonRepr(std::string_view bytes);

// Bytes of a bad field an error quotes at most (criteo/rows.py's QUOTED_BYTES).
inline constexpr size_t kQuotedBytes = 64;

// A bad field as an error quotes it (criteo/rows.py's quoted): PythonRepr of its first
// kQuotedBytes bytes, then "... (N bytes)" where it is longer.
std::string QuotedField(std::string_view field);

}  // namespace raw_rows
