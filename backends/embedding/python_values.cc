#include "python_values.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>

namespace stages::embedding::py {

namespace {

constexpr Int kIntMax = static_cast<Int>((static_cast<unsigned __int128>(1) << 127) - 1);

// Where an int leaves the 128 bits this file keeps (Python would go on).
[[noreturn]] void TooLarge() {
  throw Exception("OverflowError", "int too large for this reader (more than 128 bits)");
}

// The zero of each run of ten decimal digits Unicode knows (str.isdecimal()), which int() reads
// as 0..9 as it reads '0'..'9' (Unicode 14, CPython 3.11).
constexpr uint32_t kDecimalZeros[] = {
    0x30,    0x660,   0x6f0,   0x7c0,   0x966,   0x9e6,   0xa66,   0xae6,   0xb66,   0xbe6,   0xc66,
    0xce6,   0xd66,   0xde6,   0xe50,   0xed0,   0xf20,   0x1040,  0x1090,  0x17e0,  0x1810,  0x1946,
    0x19d0,  0x1a80,  0x1a90,  0x1b50,  0x1bb0,  0x1c40,  0x1c50,  0xa620,  0xa8d0,  0xa900,  0xa9d0,
    0xa9f0,  0xaa50,  0xabf0,  0xff10,  0x104a0, 0x10d30, 0x11066, 0x110f0, 0x11136, 0x111d0, 0x112f0,
    0x11450, 0x114d0, 0x11650, 0x116c0, 0x11730, 0x118e0, 0x11950, 0x11c50, 0x11d50, 0x11da0, 0x16a60,
    0x16ac0, 0x16b50, 0x1d7ce, 0x1d7d8, 0x1d7e2, 0x1d7ec, 0x1d7f6, 0x1e140, 0x1e2f0, 0x1e950, 0x1fbf0,
};

// The decimal digit `point` stands for, or -1.
int DecimalDigit(uint32_t point) {
  for (const uint32_t zero : kDecimalZeros) {
    if (point >= zero && point < zero + 10) return static_cast<int>(point - zero);
  }
  return -1;
}

// The characters int() takes as spaces around the digits.
bool IntSpace(uint32_t point) {
  return (point >= 0x9 && point <= 0xd) || point == 0x20 || point == 0x85 || point == 0xa0 ||
         point == 0x1680 || (point >= 0x2000 && point <= 0x200a) || point == 0x2028 || point == 0x2029 ||
         point == 0x202f || point == 0x205f || point == 0x3000;
}

// str.isprintable() of one character: false for controls, separators other than ' ', format
// characters, surrogates, private use and noncharacters. (Python also says false for the code
// points Unicode leaves unassigned; those are taken as printable here.)
bool Printable(uint32_t point) {
  if (point < 0x20 || point == 0x7f) return false;
  if (point < 0x7f) return true;
  if (point <= 0xa0 || point == 0xad) return false;
  if ((point >= 0xd800 && point <= 0xf8ff) || point >= 0xf0000) return false;
  if ((point & 0xfffe) == 0xfffe || (point >= 0xfdd0 && point <= 0xfdef)) return false;
  static constexpr uint32_t kHidden[][2] = {
      {0x600, 0x605},     {0x61c, 0x61c},     {0x6dd, 0x6dd},     {0x70f, 0x70f},     {0x890, 0x891},
      {0x8e2, 0x8e2},     {0x180e, 0x180e},   {0x1680, 0x1680},   {0x2000, 0x200f},   {0x2028, 0x202f},
      {0x205f, 0x2064},   {0x2066, 0x206f},   {0x3000, 0x3000},   {0xfeff, 0xfeff},   {0xfff9, 0xfffb},
      {0x110bd, 0x110bd}, {0x110cd, 0x110cd}, {0x13430, 0x1343f}, {0x1bca0, 0x1bca3}, {0x1d173, 0x1d17a},
      {0xe0001, 0xe0001}, {0xe0020, 0xe007f},
  };
  for (const auto& range : kHidden) {
    if (point >= range[0] && point <= range[1]) return false;
  }
  return true;
}

void AppendHex(uint32_t value, int digits, std::string* out) {
  static constexpr char kDigits[] = "0123456789abcdef";
  for (int shift = 4 * (digits - 1); shift >= 0; shift -= 4) *out += kDigits[(value >> shift) & 0xFu];
}

// The quote repr() puts around a text: ' unless it holds a ' and no ".
char QuoteFor(bool has_single, bool has_double) { return has_single && !has_double ? '"' : '\''; }

// int(text) in base 10 over code points, as CPython reads it: spaces around, one sign, digits
// (any script's) with single underscores between them. Nothing where it is no int.
std::optional<Int> ParseDecimal(const std::vector<uint32_t>& points) {
  size_t at = 0;
  const size_t end = points.size();
  while (at < end && IntSpace(points[at])) ++at;
  bool negative = false;
  if (at < end && (points[at] == '+' || points[at] == '-')) negative = points[at++] == '-';
  Int magnitude = 0;
  bool any = false, underscore = false, overflow = false;
  for (; at < end; ++at) {
    if (points[at] == '_') {
      if (!any || underscore) return std::nullopt;
      underscore = true;
      continue;
    }
    const int digit = DecimalDigit(points[at]);
    if (digit < 0) break;
    underscore = false;
    any = true;
    if (magnitude > (kIntMax - digit) / 10) overflow = true;
    if (!overflow) magnitude = magnitude * 10 + digit;
  }
  if (!any || underscore) return std::nullopt;
  while (at < end && IntSpace(points[at])) ++at;
  if (at != end) return std::nullopt;
  if (overflow) TooLarge();
  return negative ? -magnitude : magnitude;
}

bool Numeric(const Value& value) {
  return value.kind == Value::Kind::kBool || value.kind == Value::Kind::kInt ||
         value.kind == Value::Kind::kFloat;
}

Int IntOf(const Value& value) {
  return value.kind == Value::Kind::kBool ? (value.truth ? 1 : 0) : value.integer;
}

bool NumbersEqual(const Value& a, const Value& b) {
  const bool a_float = a.kind == Value::Kind::kFloat, b_float = b.kind == Value::Kind::kFloat;
  if (a_float && b_float) return a.real == b.real;
  if (!a_float && !b_float) {
    if (a.huge || b.huge) return a.huge && b.huge && a.text == b.text;
    return IntOf(a) == IntOf(b);
  }
  const Value& real = a_float ? a : b;
  const Value& whole = a_float ? b : a;
  // Python compares an int and a float exactly.
  if (whole.huge || !std::isfinite(real.real) || std::trunc(real.real) != real.real) return false;
  if (std::fabs(real.real) >= 1.7014118346046923e38) return false;  // 2**127: beyond any Int
  return static_cast<Int>(real.real) == IntOf(whole);
}

}  // namespace

Value Value::Bool(bool value) {
  Value out;
  out.kind = Kind::kBool;
  out.truth = value;
  return out;
}

Value Value::Integer(Int value) {
  Value out;
  out.kind = Kind::kInt;
  out.integer = value;
  return out;
}

Value Value::Float(double value) {
  Value out;
  out.kind = Kind::kFloat;
  out.real = value;
  return out;
}

Value Value::Complex(double real, double imag) {
  Value out;
  out.kind = Kind::kComplex;
  out.real = real;
  out.imag = imag;
  return out;
}

Value Value::Str(std::string utf8) {
  Value out;
  out.kind = Kind::kStr;
  out.text = std::move(utf8);
  return out;
}

Value Value::Bytes(std::string bytes) {
  Value out;
  out.kind = Kind::kBytes;
  out.text = std::move(bytes);
  return out;
}

void Value::Put(Value key, Value value) {
  if (key.kind == Kind::kList || key.kind == Kind::kDict || key.kind == Kind::kSet) {
    throw Exception("TypeError", "unhashable type: '" + TypeName(key) + "'");
  }
  for (size_t index = 0; index + 1 < items.size(); index += 2) {
    if (Equal(items[index], key)) {
      items[index + 1] = std::move(value);
      return;
    }
  }
  items.push_back(std::move(key));
  items.push_back(std::move(value));
}

Value FromJson(const Json& value) {
  switch (value.kind()) {
    case Json::Kind::kNull:
      return Value::None();
    case Json::Kind::kBool:
      return Value::Bool(value.truth());
    case Json::Kind::kNumber: {
      const std::string& token = value.text();
      if (token.find_first_of(".eE") != std::string::npos) {
        return Value::Float(std::strtod(token.c_str(), nullptr));  // 1e400: inf, as Python reads it
      }
      const bool negative = !token.empty() && token[0] == '-';
      Int magnitude = 0;
      for (size_t at = negative ? 1 : 0; at < token.size(); ++at) {
        const int digit = token[at] - '0';
        if (magnitude > (kIntMax - digit) / 10) {
          Value huge = Value::Integer(0);
          huge.huge = true;
          huge.text = token;
          return huge;
        }
        magnitude = magnitude * 10 + digit;
      }
      return Value::Integer(negative ? -magnitude : magnitude);
    }
    case Json::Kind::kString:
      return Value::Str(value.text());
    case Json::Kind::kArray: {
      Value out;
      out.kind = Value::Kind::kList;
      for (const Json& item : value.items()) out.items.push_back(FromJson(item));
      return out;
    }
    case Json::Kind::kObject: {
      // Names are strs: equal where their text is, so an index of them finds a repeated one.
      Value out;
      out.kind = Value::Kind::kDict;
      std::map<std::string_view, size_t> places;
      for (const auto& [name, member] : value.members()) {
        const auto [place, added] = places.emplace(name, out.items.size());
        if (added) {
          out.items.push_back(Value::Str(name));
          out.items.push_back(FromJson(member));
        } else {
          out.items[place->second + 1] = FromJson(member);
        }
      }
      return out;
    }
  }
  return Value::None();
}

std::string TypeName(const Value& value) {
  switch (value.kind) {
    case Value::Kind::kNone:
      return "NoneType";
    case Value::Kind::kBool:
      return "bool";
    case Value::Kind::kInt:
      return "int";
    case Value::Kind::kFloat:
      return "float";
    case Value::Kind::kComplex:
      return "complex";
    case Value::Kind::kStr:
      return "str";
    case Value::Kind::kBytes:
      return "bytes";
    case Value::Kind::kList:
      return "list";
    case Value::Kind::kTuple:
      return "tuple";
    case Value::Kind::kDict:
      return "dict";
    case Value::Kind::kSet:
      return "set";
  }
  return "object";
}

std::string FormatInt(Int value) {
  if (value == 0) return "0";
  const bool negative = value < 0;
  // Digits of the magnitude, taken unsigned so that the smallest Int has one too.
  auto magnitude =
      negative ? static_cast<unsigned __int128>(-(value + 1)) + 1 : static_cast<unsigned __int128>(value);
  std::string digits;
  for (; magnitude > 0; magnitude /= 10)
    digits.insert(digits.begin(), static_cast<char>('0' + magnitude % 10));
  return negative ? "-" + digits : digits;
}

std::string Repr(const Value& value) {
  switch (value.kind) {
    case Value::Kind::kNone:
      return "None";
    case Value::Kind::kBool:
      return value.truth ? "True" : "False";
    case Value::Kind::kInt:
      return value.huge ? value.text : FormatInt(value.integer);
    case Value::Kind::kFloat:
      return PythonFloatRepr(value.real);
    case Value::Kind::kComplex: {
      // Each part as repr() writes a float, without the ".0" of a whole number: 2j, (1-2.5j).
      const auto part = [](double number) {
        std::string text = PythonFloatRepr(number);
        if (text.size() > 2 && text.compare(text.size() - 2, 2, ".0") == 0) text.resize(text.size() - 2);
        return text;
      };
      if (value.real == 0 && !std::signbit(value.real)) return part(value.imag) + "j";
      const std::string imag = part(value.imag);
      return "(" + part(value.real) + (imag[0] == '-' ? "" : "+") + imag + "j)";
    }
    case Value::Kind::kStr:
      return ReprText(value.text);
    case Value::Kind::kBytes:
      return ReprBytes(value.text);
    case Value::Kind::kList:
    case Value::Kind::kTuple:
    case Value::Kind::kSet: {
      if (value.kind == Value::Kind::kSet && value.items.empty()) return "set()";
      const bool tuple = value.kind == Value::Kind::kTuple;
      std::string out = tuple ? "(" : value.kind == Value::Kind::kList ? "[" : "{";
      for (size_t index = 0; index < value.items.size(); ++index) {
        if (index) out += ", ";
        out += Repr(value.items[index]);
      }
      if (tuple && value.items.size() == 1) out += ",";
      return out + (tuple ? ")" : value.kind == Value::Kind::kList ? "]" : "}");
    }
    case Value::Kind::kDict: {
      std::string out = "{";
      for (size_t index = 0; index + 1 < value.items.size(); index += 2) {
        if (index) out += ", ";
        out += Repr(value.items[index]) + ": " + Repr(value.items[index + 1]);
      }
      return out + "}";
    }
  }
  return "?";
}

std::string Str(const Value& value) { return value.kind == Value::Kind::kStr ? value.text : Repr(value); }

bool Truth(const Value& value) {
  switch (value.kind) {
    case Value::Kind::kNone:
      return false;
    case Value::Kind::kBool:
      return value.truth;
    case Value::Kind::kInt:
      return value.huge || value.integer != 0;
    case Value::Kind::kFloat:
      return value.real != 0;
    case Value::Kind::kComplex:
      return value.real != 0 || value.imag != 0;
    case Value::Kind::kStr:
    case Value::Kind::kBytes:
      return !value.text.empty();
    case Value::Kind::kList:
    case Value::Kind::kTuple:
    case Value::Kind::kDict:
    case Value::Kind::kSet:
      return !value.items.empty();
  }
  return false;
}

bool Equal(const Value& value, const Value& other) {
  if (value.kind == Value::Kind::kComplex || other.kind == Value::Kind::kComplex) {
    // A complex number equals a number where its imaginary part is 0.
    const Value& complex = value.kind == Value::Kind::kComplex ? value : other;
    const Value& rest = value.kind == Value::Kind::kComplex ? other : value;
    if (rest.kind == Value::Kind::kComplex) return complex.real == rest.real && complex.imag == rest.imag;
    return Numeric(rest) && complex.imag == 0 && NumbersEqual(Value::Float(complex.real), rest);
  }
  if (Numeric(value) && Numeric(other)) return NumbersEqual(value, other);
  if (value.kind != other.kind) return false;
  switch (value.kind) {
    case Value::Kind::kNone:
      return true;
    case Value::Kind::kStr:
    case Value::Kind::kBytes:
      return value.text == other.text;
    case Value::Kind::kList:
    case Value::Kind::kTuple: {
      if (value.items.size() != other.items.size()) return false;
      for (size_t index = 0; index < value.items.size(); ++index) {
        if (!Equal(value.items[index], other.items[index])) return false;
      }
      return true;
    }
    case Value::Kind::kSet: {
      if (value.items.size() != other.items.size()) return false;
      for (const Value& item : value.items) {
        bool found = false;
        for (const Value& candidate : other.items) found = found || Equal(item, candidate);
        if (!found) return false;
      }
      return true;
    }
    case Value::Kind::kDict: {
      if (value.items.size() != other.items.size()) return false;
      for (size_t index = 0; index + 1 < value.items.size(); index += 2) {
        bool found = false;
        for (size_t at = 0; at + 1 < other.items.size() && !found; at += 2) {
          found = Equal(value.items[index], other.items[at]) &&
                  Equal(value.items[index + 1], other.items[at + 1]);
        }
        if (!found) return false;
      }
      return true;
    }
    default:
      return false;
  }
}

bool Less(const Value& value, const Value& other) {
  if (Numeric(value) && Numeric(other)) {
    const bool value_float = value.kind == Value::Kind::kFloat,
               other_float = other.kind == Value::Kind::kFloat;
    if (!value_float && !other_float && !value.huge && !other.huge) return IntOf(value) < IntOf(other);
    // Beyond 128 bits or against a float: near enough in long double (a header's numbers are small).
    const auto number = [](const Value& v) -> long double {
      if (v.kind == Value::Kind::kFloat) return v.real;
      if (v.huge) return std::strtold(v.text.c_str(), nullptr);
      return static_cast<long double>(IntOf(v));
    };
    return number(value) < number(other);
  }
  if (value.kind == other.kind && (value.kind == Value::Kind::kStr || value.kind == Value::Kind::kBytes)) {
    return value.text < other.text;  // UTF-8's byte order is the code points' order
  }
  if (value.kind == other.kind && (value.kind == Value::Kind::kTuple || value.kind == Value::Kind::kList)) {
    const size_t common = std::min(value.items.size(), other.items.size());
    for (size_t index = 0; index < common; ++index) {
      if (!Equal(value.items[index], other.items[index])) return Less(value.items[index], other.items[index]);
    }
    return value.items.size() < other.items.size();
  }
  throw Exception("TypeError", "'<' not supported between instances of '" + TypeName(value) + "' and '" +
                                   TypeName(other) + "'");
}

void Sort(std::vector<Value>* values) {
  std::vector<Value>& items = *values;
  const size_t count = items.size();
  if (count < 2) return;
  // The run at the start (count_run): strictly descending runs are reversed.
  size_t run = 2;
  if (Less(items[1], items[0])) {
    while (run < count && Less(items[run], items[run - 1])) ++run;
    std::reverse(items.begin(), items.begin() + static_cast<std::ptrdiff_t>(run));
  } else {
    while (run < count && !Less(items[run], items[run - 1])) ++run;
  }
  // Binary insertion of the rest (binarysort).
  for (size_t start = run; start < count; ++start) {
    size_t low = 0, high = start;
    while (low < high) {
      const size_t middle = low + ((high - low) >> 1);
      if (Less(items[start], items[middle])) {
        high = middle;
      } else {
        low = middle + 1;
      }
    }
    std::rotate(items.begin() + static_cast<std::ptrdiff_t>(low),
                items.begin() + static_cast<std::ptrdiff_t>(start),
                items.begin() + static_cast<std::ptrdiff_t>(start) + 1);
  }
}

Int ToInt(const Value& value) {
  switch (value.kind) {
    case Value::Kind::kBool:
      return value.truth ? 1 : 0;
    case Value::Kind::kInt:
      if (value.huge) TooLarge();
      return value.integer;
    case Value::Kind::kFloat: {
      if (std::isnan(value.real)) throw Exception("ValueError", "cannot convert float NaN to integer");
      if (std::isinf(value.real))
        throw Exception("OverflowError", "cannot convert float infinity to integer");
      const double whole = std::trunc(value.real);
      if (std::fabs(whole) >= 1.7014118346046923e38) TooLarge();
      return static_cast<Int>(whole);
    }
    case Value::Kind::kStr:
    case Value::Kind::kBytes: {
      std::vector<uint32_t> points;
      if (value.kind == Value::Kind::kStr) {
        points = CodePoints(value.text);
      } else {
        for (const char byte : value.text) points.push_back(static_cast<unsigned char>(byte));
      }
      if (const std::optional<Int> parsed = ParseDecimal(points)) return *parsed;
      throw Exception("ValueError", "invalid literal for int() with base 10: " + Repr(value));
    }
    default:
      throw Exception("TypeError",
                      "int() argument must be a string, a bytes-like object or a real number, not '" +
                          TypeName(value) + "'");
  }
}

std::vector<Value> Iterate(const Value& value) {
  switch (value.kind) {
    case Value::Kind::kList:
    case Value::Kind::kTuple:
    case Value::Kind::kSet:
      return value.items;
    case Value::Kind::kDict: {
      std::vector<Value> keys;
      for (size_t index = 0; index < value.items.size(); index += 2) keys.push_back(value.items[index]);
      return keys;
    }
    case Value::Kind::kStr: {
      std::vector<Value> characters;
      for (const uint32_t point : CodePoints(value.text)) {
        std::string one;
        AppendUtf8(point, &one);
        characters.push_back(Value::Str(std::move(one)));
      }
      return characters;
    }
    case Value::Kind::kBytes: {
      std::vector<Value> numbers;
      for (const char byte : value.text) numbers.push_back(Value::Integer(static_cast<unsigned char>(byte)));
      return numbers;
    }
    default:
      throw Exception("TypeError", "'" + TypeName(value) + "' object is not iterable");
  }
}

const Value& Subscript(const Value& value, std::string_view key) {
  switch (value.kind) {
    case Value::Kind::kDict:
      if (const Value* found = Find(value, key)) return *found;
      throw Exception("KeyError", ReprText(key));
    case Value::Kind::kList:
      throw Exception("TypeError", "list indices must be integers or slices, not str");
    case Value::Kind::kTuple:
      throw Exception("TypeError", "tuple indices must be integers or slices, not str");
    case Value::Kind::kStr:
      throw Exception("TypeError", "string indices must be integers, not 'str'");
    case Value::Kind::kBytes:
      throw Exception("TypeError", "byte indices must be integers or slices, not str");
    default:
      throw Exception("TypeError", "'" + TypeName(value) + "' object is not subscriptable");
  }
}

const Value* Find(const Value& value, std::string_view key) {
  if (value.kind != Value::Kind::kDict) return nullptr;
  for (size_t index = 0; index + 1 < value.items.size(); index += 2) {
    const Value& name = value.items[index];
    if (name.kind == Value::Kind::kStr && name.text == key) return &value.items[index + 1];
  }
  return nullptr;
}

void AppendUtf8(uint32_t point, std::string* out) {
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

std::vector<uint32_t> CodePoints(std::string_view text) {
  std::vector<uint32_t> points;
  points.reserve(text.size());
  const auto byte = [&](size_t index) { return static_cast<unsigned char>(text[index]); };
  for (size_t at = 0; at < text.size();) {
    const unsigned char lead = byte(at);
    int length = 0;
    uint32_t point = 0, smallest = 0;
    if (lead < 0x80) {
      points.push_back(lead);
      ++at;
      continue;
    }
    if (lead >= 0xC2 && lead <= 0xDF) {
      length = 2, point = lead & 0x1Fu, smallest = 0x80;
    } else if (lead >= 0xE0 && lead <= 0xEF) {
      length = 3, point = lead & 0x0Fu, smallest = 0x800;
    } else if (lead >= 0xF0 && lead <= 0xF4) {
      length = 4, point = lead & 0x07u, smallest = 0x10000;
    }
    bool valid = length > 0 && text.size() - at >= static_cast<size_t>(length);
    for (int index = 1; valid && index < length; ++index) {
      valid = (byte(at + index) & 0xC0u) == 0x80u;
      point = (point << 6) | (byte(at + index) & 0x3Fu);
    }
    if (valid && point >= smallest && point <= 0x10FFFF) {
      points.push_back(point);
      at += length;
    } else {
      points.push_back(0xDC00u + lead);  // surrogateescape
      ++at;
    }
  }
  return points;
}

std::string ReprText(std::string_view utf8) {
  const std::vector<uint32_t> points = CodePoints(utf8);
  bool has_single = false, has_double = false;
  for (const uint32_t point : points) {
    has_single = has_single || point == '\'';
    has_double = has_double || point == '"';
  }
  const char quote = QuoteFor(has_single, has_double);
  std::string out(1, quote);
  for (const uint32_t point : points) {
    if (point == static_cast<uint32_t>(quote) || point == '\\') {
      out += '\\';
      out += static_cast<char>(point);
    } else if (point == '\t') {
      out += "\\t";
    } else if (point == '\n') {
      out += "\\n";
    } else if (point == '\r') {
      out += "\\r";
    } else if (Printable(point)) {
      AppendUtf8(point, &out);
    } else if (point <= 0xff) {
      out += "\\x";
      AppendHex(point, 2, &out);
    } else if (point <= 0xffff) {
      out += "\\u";
      AppendHex(point, 4, &out);
    } else {
      out += "\\U";
      AppendHex(point, 8, &out);
    }
  }
  return out + quote;
}

std::string ReprBytes(std::string_view bytes) {
  const bool has_single = bytes.find('\'') != std::string_view::npos;
  const bool has_double = bytes.find('"') != std::string_view::npos;
  const char quote = QuoteFor(has_single, has_double);
  std::string out = "b";
  out += quote;
  for (const char character : bytes) {
    const auto byte = static_cast<unsigned char>(character);
    if (byte == static_cast<unsigned char>(quote) || byte == '\\') {
      out += '\\';
      out += character;
    } else if (byte == '\t') {
      out += "\\t";
    } else if (byte == '\n') {
      out += "\\n";
    } else if (byte == '\r') {
      out += "\\r";
    } else if (byte < 0x20 || byte >= 0x7f) {
      out += "\\x";
      AppendHex(byte, 2, &out);
    } else {
      out += character;
    }
  }
  return out + quote;
}

std::optional<std::string> Utf8Error(std::string_view bytes) {
  const auto byte = [&](size_t index) { return static_cast<unsigned char>(bytes[index]); };
  const auto error = [&](size_t start, size_t end, const char* reason) {
    char text[160];
    if (end - start == 1) {
      std::snprintf(text, sizeof(text), "'utf-8' codec can't decode byte 0x%02x in position %zu: %s",
                    byte(start), start, reason);
    } else {
      std::snprintf(text, sizeof(text), "'utf-8' codec can't decode bytes in position %zu-%zu: %s", start,
                    end - 1, reason);
    }
    return std::string(text);
  };
  for (size_t at = 0; at < bytes.size();) {
    const unsigned char lead = byte(at);
    if (lead < 0x80) {
      ++at;
      continue;
    }
    size_t need = 0;
    unsigned char low = 0x80, high = 0xBF;  // the second byte's range
    if (lead >= 0xC2 && lead <= 0xDF) {
      need = 1;
    } else if (lead >= 0xE0 && lead <= 0xEF) {
      need = 2;
      if (lead == 0xE0) low = 0xA0;
      if (lead == 0xED) high = 0x9F;  // no surrogates
    } else if (lead >= 0xF0 && lead <= 0xF4) {
      need = 3;
      if (lead == 0xF0) low = 0x90;
      if (lead == 0xF4) high = 0x8F;  // nothing above U+10FFFF
    } else {
      return error(at, at + 1, "invalid start byte");
    }
    for (size_t index = 1; index <= need; ++index) {
      if (at + index >= bytes.size()) return error(at, bytes.size(), "unexpected end of data");
      const unsigned char next = byte(at + index);
      const bool fits = index == 1 ? next >= low && next <= high : next >= 0x80 && next <= 0xBF;
      if (!fits) return error(at, at + index, "invalid continuation byte");
    }
    at += need + 1;
  }
  return std::nullopt;
}

namespace {

// json.loads' scanner (CPython's _json), walked only to find where and why it stops.
class JsonScan {
 public:
  explicit JsonScan(std::vector<uint32_t> text) : text_(std::move(text)) {}

  std::optional<std::string> Error() {
    if (!text_.empty() && text_[0] == 0xFEFF)
      return Message("Unexpected UTF-8 BOM (decode using utf-8-sig)", 0);
    size_t at = SkipSpace(0);
    if (!Value(&at, 0)) return error_;
    at = SkipSpace(at);
    if (at != text_.size()) return Message("Extra data", at);
    return std::nullopt;
  }

 private:
  static bool Space(uint32_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
  static bool Digit(uint32_t c) { return c >= '0' && c <= '9'; }
  static bool Hex(uint32_t c) { return Digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

  // The four hex digits after the 'u' at `u` as a number; nothing where one is no hex digit.
  std::optional<uint32_t> Unit(size_t u) const {
    uint32_t unit = 0;
    for (size_t digit = u + 1; digit <= u + 4; ++digit) {
      const uint32_t c = text_[digit];
      if (!Hex(c)) return std::nullopt;
      unit = (unit << 4) | (Digit(c) ? c - '0' : (c | 0x20) - 'a' + 10);
    }
    return unit;
  }

  size_t SkipSpace(size_t at) const {
    while (at < text_.size() && Space(text_[at])) ++at;
    return at;
  }

  // "<what>: line L column C (char P)", as JSONDecodeError words it.
  std::string Message(const std::string& what, size_t at) const {
    size_t line = 1, last_newline = 0;
    bool newline = false;
    for (size_t index = 0; index < at && index < text_.size(); ++index) {
      if (text_[index] == '\n') ++line, last_newline = index, newline = true;
    }
    const size_t column = newline ? at - last_newline : at + 1;
    return what + ": line " + std::to_string(line) + " column " + std::to_string(column) + " (char " +
           std::to_string(at) + ")";
  }

  bool Fail(const std::string& what, size_t at) {
    error_ = Message(what, at);
    return false;
  }

  bool Matches(size_t at, const char* word) const {
    for (size_t index = 0; word[index] != 0; ++index) {
      if (at + index >= text_.size() || text_[at + index] != static_cast<unsigned char>(word[index]))
        return false;
    }
    return true;
  }

  bool Value(size_t* at, int depth) {
    const size_t start = *at;
    if (start >= text_.size()) return Fail("Expecting value", start);
    if (depth >= 990) {
      error_ = "maximum recursion depth exceeded while decoding a JSON document";
      return false;
    }
    const uint32_t c = text_[start];
    if (c == '"') return String(at);
    if (c == '{') return Object(at, depth + 1);
    if (c == '[') return Array(at, depth + 1);
    for (const char* word : {"null", "true", "false", "NaN", "Infinity", "-Infinity"}) {
      if (Matches(start, word)) {
        *at = start + std::strlen(word);
        return true;
      }
    }
    // A number: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][-+]?[0-9]+)?, the longest part that fits.
    size_t index = start;
    if (text_[index] == '-' && ++index >= text_.size()) return Fail("Expecting value", start);
    if (text_[index] >= '1' && text_[index] <= '9') {
      while (index < text_.size() && Digit(text_[index])) ++index;
    } else if (text_[index] == '0') {
      ++index;
    } else {
      return Fail("Expecting value", start);
    }
    if (index + 1 < text_.size() && text_[index] == '.' && Digit(text_[index + 1])) {
      index += 2;
      while (index < text_.size() && Digit(text_[index])) ++index;
    }
    if (index + 1 < text_.size() && (text_[index] == 'e' || text_[index] == 'E')) {
      size_t exponent = index + 1;
      if (exponent + 1 < text_.size() && (text_[exponent] == '-' || text_[exponent] == '+')) ++exponent;
      const size_t digits = exponent;
      while (exponent < text_.size() && Digit(text_[exponent])) ++exponent;
      if (exponent > digits) index = exponent;
    }
    *at = index;
    return true;
  }

  bool String(size_t* at) {
    const size_t begin = *at;
    size_t index = begin + 1;
    while (true) {
      while (index < text_.size() && text_[index] != '"' && text_[index] != '\\') {
        if (text_[index] <= 0x1f) return Fail("Invalid control character at", index);
        ++index;
      }
      if (index >= text_.size()) return Fail("Unterminated string starting at", begin);
      if (text_[index] == '"') {
        *at = index + 1;
        return true;
      }
      ++index;  // the backslash
      if (index >= text_.size()) return Fail("Unterminated string starting at", begin);
      const uint32_t escape = text_[index];
      if (escape != 'u') {
        const bool known = escape == '"' || escape == '\\' || escape == '/' || escape == 'b' ||
                           escape == 'f' || escape == 'n' || escape == 'r' || escape == 't';
        if (!known) return Fail("Invalid \\escape", index - 1);
        ++index;
        continue;
      }
      const size_t u = index;
      if (u + 5 >= text_.size()) return Fail("Invalid \\uXXXX escape", u);  // no room for a closing quote
      std::optional<uint32_t> unit = Unit(u);
      if (!unit) return Fail("Invalid \\uXXXX escape", u);
      index = u + 5;
      // A high surrogate takes the \uXXXX after it where one follows (with room after it).
      if (*unit >= 0xD800 && *unit <= 0xDBFF && index + 6 < text_.size() && text_[index] == '\\' &&
          text_[index + 1] == 'u') {
        const std::optional<uint32_t> low = Unit(index + 1);
        if (!low) return Fail("Invalid \\uXXXX escape", index + 1);
        if (*low >= 0xDC00 && *low <= 0xDFFF) index += 6;
      }
    }
  }

  bool Object(size_t* at, int depth) {
    size_t index = SkipSpace(*at + 1);
    if (index < text_.size() && text_[index] == '}') {
      *at = index + 1;
      return true;
    }
    while (true) {
      if (index >= text_.size() || text_[index] != '"') {
        return Fail("Expecting property name enclosed in double quotes", index);
      }
      if (!String(&index)) return false;
      index = SkipSpace(index);
      if (index >= text_.size() || text_[index] != ':') return Fail("Expecting ':' delimiter", index);
      index = SkipSpace(index + 1);
      if (!Value(&index, depth)) return false;
      index = SkipSpace(index);
      if (index < text_.size() && text_[index] == '}') {
        *at = index + 1;
        return true;
      }
      if (index >= text_.size() || text_[index] != ',') return Fail("Expecting ',' delimiter", index);
      index = SkipSpace(index + 1);
    }
  }

  bool Array(size_t* at, int depth) {
    size_t index = SkipSpace(*at + 1);
    if (index < text_.size() && text_[index] == ']') {
      *at = index + 1;
      return true;
    }
    while (true) {
      if (!Value(&index, depth)) return false;
      index = SkipSpace(index);
      if (index < text_.size() && text_[index] == ']') {
        *at = index + 1;
        return true;
      }
      if (index >= text_.size() || text_[index] != ',') return Fail("Expecting ',' delimiter", index);
      index = SkipSpace(index + 1);
    }
  }

  std::vector<uint32_t> text_;
  std::string error_;
};

}  // namespace

std::optional<std::string> JsonLoadsError(std::string_view utf8) {
  return JsonScan(CodePoints(utf8)).Error();
}

std::string PathText(std::string_view path) {
  std::string root;
  size_t at = 0;
  while (at < path.size() && path[at] == '/') ++at;
  // POSIX leaves a path that starts with exactly two slashes to the system; pathlib keeps them.
  if (at > 0) root = at == 2 ? "//" : "/";
  std::string out = root;
  while (at < path.size()) {
    const size_t end = std::min(path.find('/', at), path.size());
    const std::string_view part = path.substr(at, end - at);
    if (!part.empty() && part != ".") {
      if (out.size() > root.size()) out += '/';
      out += part;
    }
    at = end + 1;
  }
  return out.empty() ? "." : out;
}

std::string JoinPath(const std::string& folder, std::string_view name) {
  if (folder == ".") return std::string(name);
  if (!folder.empty() && folder.back() == '/') return folder + std::string(name);
  return folder + "/" + std::string(name);
}

std::string OsErrorText(int code, const std::optional<std::string>& filename) {
  std::string text = "[Errno " + std::to_string(code) + "] " + std::strerror(code);
  if (filename) text += ": " + ReprText(*filename);
  return text;
}

}  // namespace stages::embedding::py
