#include "parse.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

namespace raw_rows {
namespace {

constexpr char kTab = '\t';
constexpr char kNewline = '\n';
constexpr char kReturn = '\r';

std::string Column(char prefix, size_t index) { return std::string(1, prefix) + std::to_string(index + 1); }

RowError Error(size_t row, std::string column, std::string detail) {
  return RowError{row, std::move(column), std::move(detail)};
}

// One line of the text: [begin, end), `end` at its "\n" (or at the text's end, where the
// python reader appends one).
struct Line {
  size_t begin;
  size_t end;
};

// Walks the lines of `data` in order.
class Lines {
 public:
  explicit Lines(std::string_view data) : data_(data) {}
  bool Next(Line* line) {
    if (position_ >= data_.size()) return false;
    const size_t found = data_.find(kNewline, position_);
    const size_t end = found == std::string_view::npos ? data_.size() : found;
    *line = Line{position_, end};
    position_ = end + 1;
    return true;
  }

 private:
  std::string_view data_;
  size_t position_ = 0;
};

// The end of a line's last field: before a "\r" that ends the line.
size_t LastFieldEnd(std::string_view data, const Line& line) {
  return line.end > 0 && data[line.end - 1] == kReturn ? line.end - 1 : line.end;
}

bool IsDecimal(unsigned char byte) { return static_cast<unsigned char>(byte - '0') < 10; }

bool IsHex(unsigned char byte) {
  // `|`, not `||`: both tests are cheap, and a branch between them is not.
  return IsDecimal(byte) | (static_cast<unsigned char>((byte | 0x20) - 'a') < 6);
}

uint64_t HexValue(unsigned char byte) {
  // "0"-"9" are 0x30-0x39, "A"-"F" 0x41-0x46 and "a"-"f" 0x61-0x66: the low four bits, plus 9
  // for a letter (bit 6).
  return (byte & 0x0F) + 9 * (byte >> 6);
}

// A count field: false where it breaks the rule; `value` -1 where missing.
bool ParseCount(std::string_view field, int64_t* value, bool* missing) {
  *missing = field.empty();
  if (*missing) {
    *value = -1;
    return true;
  }
  const bool negative = field.front() == '-';
  const std::string_view digits = field.substr(negative ? 1 : 0);
  if (digits.empty() || digits.size() > kMaxCountDigits) return false;
  // Every byte is judged and added without a branch (a mispredicted one per digit costs more than
  // the digit); at most 18 digits stay below 10^18, and a bad field's sum is thrown away.
  uint64_t total = 0;
  unsigned bad = 0;
  for (const char digit : digits) {
    const auto byte = static_cast<unsigned char>(digit);
    const unsigned value_of_digit = static_cast<unsigned char>(byte - '0');
    bad |= static_cast<unsigned>(value_of_digit >= 10);
    total = total * 10 + value_of_digit;
  }
  if (bad != 0) return false;
  *value = negative ? -static_cast<int64_t>(total) : static_cast<int64_t>(total);
  return true;
}

// An id field: false where it breaks the rule; its 64 bits as an int64.
bool ParseId(std::string_view field, int64_t* value) {
  if (field.size() > kMaxIdDigits) return false;
  // As for counts: no branch per digit. At most 16 hex digits: 64 bits, no overflow.
  uint64_t total = 0;
  unsigned bad = 0;
  for (const char digit : field) {
    const auto byte = static_cast<unsigned char>(digit);
    bad |= static_cast<unsigned>(!IsHex(byte));
    total = (total << 4) | HexValue(byte);
  }
  if (bad != 0) return false;
  *value = field.empty() ? kMissingId : static_cast<int64_t>(total);
  return true;
}

// Splits a line into its fields at the tabs; the last one ends at LastFieldEnd.
class Fields {
 public:
  Fields(std::string_view data, const Line& line)
      : data_(data), next_(line.begin), line_end_(line.end), last_end_(LastFieldEnd(data, line)) {}

  // The next field; called at most as many times as the line has fields.
  std::string_view Next() {
    const size_t begin = next_;
    const size_t left = line_end_ - begin;
    const void* tab = left ? std::memchr(data_.data() + begin, kTab, left) : nullptr;
    if (tab != nullptr) {
      const size_t end = static_cast<size_t>(static_cast<const char*>(tab) - data_.data());
      next_ = end + 1;
      return data_.substr(begin, end - begin);
    }
    next_ = line_end_;
    return data_.substr(begin, std::max(last_end_, begin) - begin);
  }

 private:
  std::string_view data_;
  size_t next_;
  size_t line_end_;
  size_t last_end_;
};

size_t FieldCount(std::string_view data, const Line& line) {
  return 1 + static_cast<size_t>(std::count(data.begin() + line.begin, data.begin() + line.end, kTab));
}

}  // namespace

std::string RowError::message() const { return "row " + std::to_string(row) + ": " + detail; }

std::string QuotedField(std::string_view field) {
  std::string text = PythonRepr(field.substr(0, kQuotedBytes));
  if (field.size() > kQuotedBytes) text += "... (" + std::to_string(field.size()) + " bytes)";
  return text;
}

std::string PythonRepr(std::string_view bytes) {
  const bool single = bytes.find('\'') == std::string_view::npos;
  const bool double_quote = bytes.find('"') == std::string_view::npos;
  const char quote = (!single && double_quote) ? '"' : '\'';
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() + 2);
  out += quote;
  for (const char character : bytes) {
    const auto byte = static_cast<unsigned char>(character);
    if (character == quote || character == '\\') {
      out += '\\';
      out += character;
    } else if (character == '\t') {
      out += "\\t";
    } else if (character == '\n') {
      out += "\\n";
    } else if (character == '\r') {
      out += "\\r";
    } else if (byte < 0x20 || (byte >= 0x7f && byte <= 0xa0) || byte == 0xad) {
      // Not printable as Python sees the code point (controls, no-break space, soft hyphen).
      out += "\\x";
      out += kHex[byte >> 4];
      out += kHex[byte & 0x0f];
    } else if (byte < 0x80) {
      out += character;
    } else {
      // Latin-1 code point U+0080..U+00FF as UTF-8.
      out += static_cast<char>(0xC0 | (byte >> 6));
      out += static_cast<char>(0x80 | (byte & 0x3F));
    }
  }
  out += quote;
  return out;
}

std::optional<RowError> Scan(std::string_view data, Labeled labeled, std::optional<size_t> expected,
                             Layout* layout) {
  size_t count = static_cast<size_t>(std::count(data.begin(), data.end(), kNewline));
  if (!data.empty() && data.back() != kNewline) ++count;
  if (expected && count != *expected) {
    return Error(std::min(count, *expected), "",
                 "expected " + std::to_string(*expected) + " rows, got " + std::to_string(count) +
                     " (a line break inside a row?)");
  }
  Lines lines(data);
  Line line{};
  bool with_label = labeled == Labeled::kYes;
  size_t row = 0;
  while (lines.Next(&line)) {
    const size_t fields = FieldCount(data, line);
    if (row == 0 && labeled == Labeled::kDetect) with_label = fields == kNumFeatures + 1;
    const size_t width = kNumFeatures + (with_label ? 1 : 0);
    if (fields != width) {
      return Error(
          row, "",
          "expected " + std::to_string(width) + " tab-separated fields, got " + std::to_string(fields));
    }
    ++row;
  }
  layout->rows = count;
  layout->labeled = with_label;
  return std::nullopt;
}

std::optional<RowError> Parse(std::string_view data, const Layout& layout, const Outputs& out) {
  Line line{};
  if (layout.labeled) {
    // Every label first: a bad label is reported before any bad count or id.
    Lines lines(data);
    for (size_t row = 0; lines.Next(&line); ++row) {
      const std::string_view label = Fields(data, line).Next();
      if (label != "0" && label != "1") {
        return Error(row, "label", "label must be 0 or 1, got " + QuotedField(label));
      }
      if (out.labels != nullptr) out.labels[row] = label == "1" ? 1.0f : 0.0f;
    }
  }
  Lines lines(data);
  for (size_t row = 0; lines.Next(&line); ++row) {
    Fields fields(data, line);
    if (layout.labeled) fields.Next();
    for (size_t index = 0; index < kNumDense; ++index) {
      const std::string_view field = fields.Next();
      int64_t value = 0;
      bool missing = false;
      if (!ParseCount(field, &value, &missing)) {
        std::string column = Column('I', index);
        std::string detail = column + ": count " + QuotedField(field) + " is not an integer of 1 to " +
                             std::to_string(kMaxCountDigits) + " digits";
        return Error(row, std::move(column), std::move(detail));
      }
      const size_t at = row * kNumDense + index;
      if (out.counts != nullptr) out.counts[at] = value;
      if (out.missing != nullptr) out.missing[at] = missing ? 1 : 0;
      if (out.dense != nullptr) {
        out.dense[at] = missing ? 0.0f : std::log1p(static_cast<float>(std::max<int64_t>(value, 0)));
      }
    }
    for (size_t index = 0; index < kNumCategorical; ++index) {
      const std::string_view field = fields.Next();
      int64_t value = 0;
      if (!ParseId(field, &value)) {
        std::string column = Column('C', index);
        std::string detail = column + ": categorical id " + QuotedField(field) + " is not 1 to " +
                             std::to_string(kMaxIdDigits) + " hex digits";
        return Error(row, std::move(column), std::move(detail));
      }
      if (out.ids != nullptr) out.ids[row * kNumCategorical + index] = value;
    }
  }
  return std::nullopt;
}

void JoinRows(const std::vector<std::string_view>& rows, std::string* joined) {
  joined->clear();
  size_t breaks = 0;
  for (const std::string_view row : rows) {
    breaks += static_cast<size_t>(std::count(row.begin(), row.end(), kNewline));
  }
  // "\n".join(rows) holds len(rows) - 1 line breaks of its own: any more came with the rows.
  const bool trim = breaks != 0;
  for (size_t index = 0; index < rows.size(); ++index) {
    std::string_view row = rows[index];
    if (trim) {
      if (row.size() >= 2 && row.substr(row.size() - 2) == "\r\n") {
        row.remove_suffix(2);
      } else {
        while (!row.empty() && row.back() == kNewline) row.remove_suffix(1);
      }
    }
    if (index) joined->push_back(kNewline);
    joined->append(row);
  }
}

}  // namespace raw_rows
