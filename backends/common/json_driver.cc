// A test driver for the JSON reader: parses stdin, prints one line in a canonical form, or
// "E <why>" where the text is not JSON.
//   null n, true t, false f, a number #<its text>, a string s<its bytes as hex>,
//   an array [a,b], an object {<name as hex>:value,...} (members in order, repeats kept)
#include <cstdio>
#include <iostream>
#include <iterator>
#include <string>

#include "json.h"

namespace {

std::string Hex(const std::string& text) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (const char c : text) {
    out += kDigits[static_cast<unsigned char>(c) >> 4];
    out += kDigits[static_cast<unsigned char>(c) & 0x0f];
  }
  return out;
}

std::string Canonical(const stages::Json& value) {
  switch (value.kind()) {
    case stages::Json::Kind::kNull:
      return "n";
    case stages::Json::Kind::kBool:
      return value.truth() ? "t" : "f";
    case stages::Json::Kind::kNumber:
      return "#" + value.text();
    case stages::Json::Kind::kString:
      return "s" + Hex(value.text());
    case stages::Json::Kind::kArray: {
      std::string out = "[";
      for (size_t index = 0; index < value.items().size(); ++index) {
        if (index) out += ",";
        out += Canonical(value.items()[index]);
      }
      return out + "]";
    }
    case stages::Json::Kind::kObject: {
      std::string out = "{";
      for (size_t index = 0; index < value.members().size(); ++index) {
        if (index) out += ",";
        out += Hex(value.members()[index].first) + ":" + Canonical(value.members()[index].second);
      }
      return out + "}";
    }
  }
  return "?";
}

}  // namespace

int main() {
  try {
    const std::string text((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
    std::string why;
    const std::optional<stages::Json> value = stages::Json::Parse(text, &why);
    std::cout << (value ? Canonical(*value) : "E " + why) << '\n';
    return 0;
  } catch (const std::exception& exc) {
    std::cerr << "json_driver: " << exc.what() << '\n';
    return 1;
  }
}
