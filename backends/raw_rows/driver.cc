// A test driver for the raw-row parse: reads cases from stdin, writes one line per case.
//
// A case (little-endian integers):
//   'P' labeled('0' | '1' | '?') expected(int64, -1: any) size(uint64) text
//       criteo.rows.parse_rows(text, labeled, expected)
//   'S' count(uint64) then count x (size(uint64) row)
//       the raw-row stage on one request of `count` rows
// An answer line:
//   E <row> <column or -> <message as hex>
//   K <rows> <labeled 0|1> <dense> <counts> <missing> <ids> <labels>   (each as hex, - if empty)
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

#include "parse.h"

namespace {

bool ReadExactly(std::string* into, size_t size) {
  into->resize(size);
  return size == 0 || std::fread(into->data(), 1, size, stdin) == size;
}

template <typename T>
bool ReadValue(T* value) {
  return std::fread(value, sizeof(T), 1, stdin) == 1;
}

template <typename T>
std::string Hex(const std::vector<T>& values) {
  if (values.empty()) return "-";
  static constexpr char kDigits[] = "0123456789abcdef";
  const auto* bytes = reinterpret_cast<const unsigned char*>(values.data());
  std::string out;
  out.reserve(values.size() * sizeof(T) * 2);
  for (size_t index = 0; index < values.size() * sizeof(T); ++index) {
    out += kDigits[bytes[index] >> 4];
    out += kDigits[bytes[index] & 0x0f];
  }
  return out;
}

std::string HexText(const std::string& text) {
  return Hex(std::vector<unsigned char>(text.begin(), text.end()));
}

void Answer(std::string_view data, raw_rows::Labeled labeled, std::optional<size_t> expected) {
  raw_rows::Layout layout;
  std::optional<raw_rows::RowError> error = raw_rows::Scan(data, labeled, expected, &layout);
  std::vector<float> dense, labels;
  std::vector<int64_t> counts, ids;
  std::vector<uint8_t> missing;
  if (!error) {
    dense.resize(layout.rows * raw_rows::kNumDense);
    counts.resize(layout.rows * raw_rows::kNumDense);
    missing.resize(layout.rows * raw_rows::kNumDense);
    ids.resize(layout.rows * raw_rows::kNumCategorical);
    labels.resize(layout.labeled ? layout.rows : 0);
    raw_rows::Outputs out{dense.data(), counts.data(), missing.data(), ids.data(), labels.data()};
    error = raw_rows::Parse(data, layout, out);
  }
  if (error) {
    std::cout << "E " << error->row << ' ' << (error->column.empty() ? "-" : error->column) << ' '
              << HexText(error->message()) << '\n';
    return;
  }
  std::cout << "K " << layout.rows << ' ' << (layout.labeled ? 1 : 0) << ' ' << Hex(dense) << ' '
            << Hex(counts) << ' ' << Hex(missing) << ' ' << Hex(ids) << ' ' << Hex(labels) << '\n';
}

int Run() {
  int mode;
  std::string text;
  std::string joined;
  while ((mode = std::fgetc(stdin)) != EOF) {
    if (mode == 'P') {
      const int flag = std::fgetc(stdin);
      int64_t expected = 0;
      uint64_t size = 0;
      if (flag == EOF || !ReadValue(&expected) || !ReadValue(&size) || !ReadExactly(&text, size)) {
        std::cerr << "driver: a truncated 'P' case\n";
        return 2;
      }
      const raw_rows::Labeled labeled =
          flag == '1' ? raw_rows::Labeled::kYes
                      : (flag == '0' ? raw_rows::Labeled::kNo : raw_rows::Labeled::kDetect);
      Answer(text, labeled, expected < 0 ? std::nullopt : std::optional<size_t>(expected));
    } else if (mode == 'S') {
      uint64_t count = 0;
      if (!ReadValue(&count)) {
        std::cerr << "driver: a truncated 'S' case\n";
        return 2;
      }
      std::vector<std::string> rows(count);
      for (std::string& row : rows) {
        uint64_t size = 0;
        if (!ReadValue(&size) || !ReadExactly(&row, size)) {
          std::cerr << "driver: a truncated 'S' case\n";
          return 2;
        }
      }
      std::vector<std::string_view> views(rows.begin(), rows.end());
      raw_rows::JoinRows(views, &joined);
      Answer(joined, raw_rows::Labeled::kNo, static_cast<size_t>(count));
    } else {
      std::cerr << "driver: unknown case kind " << mode << '\n';
      return 2;
    }
  }
  std::cout.flush();
  return std::cout ? 0 : 1;
}

}  // namespace

int main() {
  try {
    return Run();
  } catch (const std::exception& exc) {
    std::cerr << "driver: " << exc.what() << '\n';
    return 1;
  }
}
