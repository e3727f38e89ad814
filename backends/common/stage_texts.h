// What both compiled stages write into their error texts and statistics: the texts are those of
// the python stages they replaced, word for word, so values are quoted as Python's str() and
// list() and numpy's dtype names show them.
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

// How str() shows a config value a check quotes: a string as itself, anything else (absent) as None.
inline std::string PythonText(const Json* value) {
  return value != nullptr && value->is_string() ? value->text() : "None";
}

// How str() shows a list of ints: [1, 2, 3].
inline std::string PythonList(const std::vector<int64_t>& values) {
  std::string out = "[";
  for (size_t index = 0; index < values.size(); ++index) {
    if (index) out += ", ";
    out += std::to_string(values[index]);
  }
  return out + "]";
}

// numpy's name of a tensor's data type, as the python stages' errors quoted it.
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
