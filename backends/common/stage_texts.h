// What both compiled stages write into their error texts and statistics: a config value, a list of
// dims and a tensor's data type, each shown one way in every message.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "json.h"
#include "triton_api.h"

namespace stages {

// The steady clock in nanoseconds, as Triton's statistics take their timestamps.
inline uint64_t NowNs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

// A config value a check quotes: a string as itself, anything else (absent, or not a string) as
// "(none)".
inline std::string ConfigText(const Json* value) {
  return value != nullptr && value->is_string() ? value->text() : "(none)";
}

// A value of the user's in double quotes ("abc"), a quote or backslash in it escaped.
inline std::string Quoted(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

// A list of ints: [1, 2, 3].
inline std::string ListText(const std::vector<int64_t>& values) {
  std::string out = "[";
  for (size_t index = 0; index < values.size(); ++index) {
    if (index) out += ", ";
    out += std::to_string(values[index]);
  }
  return out + "]";
}

// numpy's name of a tensor's data type (what a client's array of that type is called).
inline const char* NumpyName(TRITONSERVER_DataType type) {
  switch (type) {
    case TRITONSERVER_TYPE_BOOL:
      return "bool";
    case TRITONSERVER_TYPE_UINT8:
      return "uint8";
    case TRITONSERVER_TYPE_UINT16:
      return "uint16";
    case TRITONSERVER_TYPE_UINT32:
      return "uint32";
    case TRITONSERVER_TYPE_UINT64:
      return "uint64";
    case TRITONSERVER_TYPE_INT8:
      return "int8";
    case TRITONSERVER_TYPE_INT16:
      return "int16";
    case TRITONSERVER_TYPE_INT32:
      return "int32";
    case TRITONSERVER_TYPE_INT64:
      return "int64";
    case TRITONSERVER_TYPE_FP16:
      return "float16";
    case TRITONSERVER_TYPE_FP32:
      return "float32";
    case TRITONSERVER_TYPE_FP64:
      return "float64";
    case TRITONSERVER_TYPE_BYTES:
      return "object";
    case TRITONSERVER_TYPE_BF16:
      return "bfloat16";
    default:
      return "invalid";
  }
}

}  // namespace stages
