// Python's view of the values in the embedding stage's files, so that the compiled stage's load
// errors read as the stage's Python definition's (export/stage/hot_cold_lookup.py), word for word.
//
// store.json is read there with json.loads and its fields taken with int(), str(), dict() and
// iteration; a hot set's .npy headers with ast.literal_eval. Where that fails, the message embeds
// Python's exception (`invalid row store spec (KeyError: 'spec')`) or a repr() of a value. This
// file holds those values (Value), their repr() and str(), the operations the Python definition applies
// to them and the exceptions each raises (py::Exception, with CPython 3.11's texts).
//
// Python's ints are unbounded; here an int is 128 bits, and one beyond that raises OverflowError
// where Python would go on (no store or hot set holds such a number).
#pragma once

#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "json.h"

namespace stages::embedding::py {

using Int = __int128;

// A Python exception: its type's name and its text, as `f"{type(exc).__name__}: {exc}"` shows them.
class Exception : public std::exception {
 public:
  Exception(std::string type, std::string text) : type_(std::move(type)), text_(std::move(text)) {}
  const std::string& type() const { return type_; }
  const std::string& text() const { return text_; }
  const char* what() const noexcept override { return text_.c_str(); }
  // "TypeError: 'int' object is not iterable"
  std::string Described() const { return type_ + ": " + text_; }

 private:
  std::string type_;
  std::string text_;
};

struct Value {
  enum class Kind { kNone, kBool, kInt, kFloat, kComplex, kStr, kBytes, kList, kTuple, kDict, kSet };
  Kind kind = Kind::kNone;
  bool truth = false;  // a bool's value
  Int integer = 0;     // an int's value, where not `huge`
  bool huge = false;   // an int beyond 128 bits: its decimal digits are `text`
  double real = 0;     // a float's value, a complex number's real part
  double imag = 0;     // a complex number's imaginary part
  // A str's text as UTF-8 (a lone surrogate as its three bytes), the bytes of bytes.
  std::string text;
  // The items of a list, tuple or set; of a dict, its keys and values alternating, each key once
  // (at its first place, with its last value, as a dict built from repeated keys keeps it).
  std::vector<Value> items;

  static Value None() { return Value(); }
  static Value Bool(bool value);
  static Value Integer(Int value);
  static Value Float(double value);
  static Value Complex(double real, double imag);
  static Value Str(std::string utf8);
  static Value Bytes(std::string bytes);
  // Appends key: value to a dict, replacing the value of an equal key (1, 1.0 and True are one
  // key). Throws TypeError for a key that cannot be hashed (a list, dict or set).
  void Put(Value key, Value value);
};

// What json.loads gives for `value` (an int token as an int, any other number as a float).
Value FromJson(const Json& value);

// Python's type(value).__name__: "NoneType", "bool", "int", "float", "str", "bytes", "list", ...
std::string TypeName(const Value& value);
// repr(value).
std::string Repr(const Value& value);
// str(value): a str's own text, anything else's repr.
std::string Str(const Value& value);
// bool(value).
bool Truth(const Value& value);
// value == other (an int, a float and a bool of one number are equal).
bool Equal(const Value& value, const Value& other);
// value < other, as Python compares: numbers with numbers, str with str, bytes with bytes,
// tuples and lists item by item. Throws TypeError ("'<' not supported between instances of 'str'
// and 'bytes'") for any other pair.
bool Less(const Value& value, const Value& other);
// sorted(values) in place, with the comparisons CPython's list.sort makes on fewer than 64 items
// (so the same pair fails first where the values cannot all be compared); stable.
void Sort(std::vector<Value>* values);
// int(value) (a float truncated, a str parsed in base 10, a bool as 0 or 1). Throws TypeError,
// ValueError or OverflowError with Python's text.
Int ToInt(const Value& value);
// list(value): a list's or tuple's items, a str's characters, a dict's keys, bytes' ints. Throws
// TypeError ("'int' object is not iterable").
std::vector<Value> Iterate(const Value& value);
// value[key] for a str key: throws KeyError (its text the key's repr) or TypeError as Python does.
const Value& Subscript(const Value& value, std::string_view key);
// A dict's value.get(key): null where absent (or `value` is no dict).
const Value* Find(const Value& value, std::string_view key);
// The decimal digits of an int.
std::string FormatInt(Int value);

// repr() of a str given as UTF-8: in single quotes (double where it holds a ' and no "), with
// Python's escapes; a byte that is not UTF-8 as the surrogate Python's file names decode it to.
std::string ReprText(std::string_view utf8);
// repr() of bytes: b'...'.
std::string ReprBytes(std::string_view bytes);
// The text of the UnicodeDecodeError that bytes.decode("utf-8") raises for `bytes`, or nothing
// where they are valid UTF-8 ("'utf-8' codec can't decode byte 0xff in position 3: invalid start
// byte").
std::optional<std::string> Utf8Error(std::string_view bytes);
// ast.literal_eval(text) of `text` given as code points: its value, or nothing where Python's parser
// refuses the text or its value is no literal (numpy's header check then says "Cannot parse
// header"). Not read: \N{name} escapes and the Ellipsis. Throws TypeError for a dict key or set
// item that cannot be hashed.
std::optional<Value> LiteralEval(const std::vector<uint32_t>& text);
// The text of the error json.loads raises for `utf8` (its JSONDecodeError: "Expecting ',' delimiter:
// line 3 column 5 (char 17)", positions in characters), or nothing where json.loads reads it.
std::optional<std::string> JsonLoadsError(std::string_view utf8);
// `code_point` appended to `out` as UTF-8 (a surrogate as its three bytes).
void AppendUtf8(uint32_t code_point, std::string* out);
// The code points of `utf8`; a byte that is not UTF-8 becomes U+DC00 + its value, as Python's
// surrogateescape decodes it (a file name's bytes).
std::vector<uint32_t> CodePoints(std::string_view utf8);

// str(Path(path)): "." for an empty path, "." parts and repeated or trailing slashes dropped
// ("./store//" is "store"); ".." kept.
std::string PathText(std::string_view path);
// str(Path(folder) / name), `folder` already a PathText.
std::string JoinPath(const std::string& folder, std::string_view name);
// str(OSError) of the error number `code`: "[Errno 2] No such file or directory", and with a file
// name ": 'store/rows.bin'" after it.
std::string OsErrorText(int code, const std::optional<std::string>& filename = std::nullopt);

}  // namespace stages::embedding::py
