// The raw-row stage as a Triton backend: `raw_rows` (B x 1 BYTES, one unlabeled Criteo TSV row
// per element) in, `dense_features` (B x 13 float32) and `categorical_ids` (B x 26 int64) out,
// by the rules of parse.h (criteo/rows.py's, in C++). It keeps the contract of the python stage it
// replaced: the same config check at load, the same error texts, and a row that breaks a rule fails its own
// request with INVALID_ARGUMENT while the other requests of the batch are answered.
//
// Three lifetimes, as the C API defines them: the backend (nothing of its own), the model (its
// config read and checked once: the tensor names) and the model instance (scratch reused by
// every execution). No exception leaves an entry point.
#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "json.h"
#include "parse.h"
#include "stage_texts.h"
#include "triton_api.h"
#include "triton_support.h"

namespace raw_rows {
namespace {

using stages::Check;
using stages::ErrorPtr;
using stages::Json;
using stages::MessagePtr;
using stages::NowNs;
using stages::NumpyName;
using stages::PythonList;
using stages::PythonText;
using stages::StageError;

// The outputs the stage answers, in config order: data type and width.
struct ExpectedOutput {
  const char* data_type;
  size_t width;
};
constexpr ExpectedOutput kExpectedOutputs[] = {{"TYPE_FP32", kNumDense}, {"TYPE_INT64", kNumCategorical}};
constexpr size_t kOutputCount = sizeof(kExpectedOutputs) / sizeof(kExpectedOutputs[0]);

// The model: its name and the tensor names its config gives, checked once at load.
class ModelState {
 public:
  static std::unique_ptr<ModelState> Create(TRITONBACKEND_Model* model) {
    const char* name = nullptr;
    Check(TRITONBACKEND_ModelName(model, &name), "reading the model's name");
    TRITONSERVER_Message* raw = nullptr;
    Check(TRITONBACKEND_ModelConfig(model, 1, &raw), "reading the model's config");
    MessagePtr message(raw);
    const char* base = nullptr;
    size_t size = 0;
    Check(TRITONSERVER_MessageSerializeToJson(message.get(), &base, &size), "reading the model's config");
    std::string why;
    const std::optional<Json> config = Json::Parse(std::string_view(base, size), &why);
    if (!config || !config->is_object()) {
      throw StageError(TRITONSERVER_ERROR_INTERNAL,
                       "model '" + std::string(name) + "': unreadable config: " + why);
    }
    auto state = std::make_unique<ModelState>(name);
    state->ReadConfig(*config);
    return state;
  }

  explicit ModelState(std::string name) : name_(std::move(name)) {}

  const std::string& name() const { return name_; }
  const std::string& input() const { return input_; }
  const std::string& dense() const { return outputs_[0]; }
  const std::string& ids() const { return outputs_[1]; }

 private:
  static const std::vector<Json>& Items(const Json& config, const std::string& key) {
    static const std::vector<Json> kNone;
    const Json* found = config.member(key);
    return found != nullptr && found->is_array() ? found->items() : kNone;
  }

  // The config check, problem by problem, in the replaced python stage's words.
  void ReadConfig(const Json& config) {
    const std::vector<Json>& inputs = Items(config, "input");
    const std::vector<Json>& outputs = Items(config, "output");
    std::vector<std::string> problems;
    if (inputs.size() != 1 || PythonText(inputs[0].member("data_type")) != "TYPE_STRING") {
      problems.emplace_back("one TYPE_STRING input expected");
    }
    if (outputs.size() != kOutputCount) {
      problems.push_back(std::to_string(kOutputCount) + " outputs expected, got " +
                         std::to_string(outputs.size()));
    }
    for (size_t index = 0; index < std::min(outputs.size(), kOutputCount); ++index) {
      const Json& entry = outputs[index];
      const ExpectedOutput& expected = kExpectedOutputs[index];
      std::vector<int64_t> dims;
      if (const Json* found = entry.member("dims"); found != nullptr) {
        for (const Json& dim : found->items()) dims.push_back(dim.integer().value_or(0));
      }
      const std::string type = PythonText(entry.member("data_type"));
      if (type != expected.data_type || dims != std::vector<int64_t>{static_cast<int64_t>(expected.width)}) {
        problems.push_back("output '" + PythonText(entry.member("name")) + "' must be " + expected.data_type +
                           " [" + std::to_string(expected.width) + "], got " + type + " " + PythonList(dims));
      }
    }
    if (!problems.empty()) {
      std::string message = "model '" + name_ + "': config.pbtxt does not match the stage: ";
      for (size_t index = 0; index < problems.size(); ++index) {
        if (index) message += "; ";
        message += problems[index];
      }
      throw StageError(TRITONSERVER_ERROR_INVALID_ARG, message);
    }
    input_ = PythonText(inputs[0].member("name"));
    for (size_t index = 0; index < kOutputCount; ++index) {
      outputs_[index] = PythonText(outputs[index].member("name"));
    }
  }

  std::string name_;
  std::string input_;
  std::string outputs_[kOutputCount];
};

// One request that cannot be answered: its response carries the error.
StageError Refused(const std::string& message) { return StageError(TRITONSERVER_ERROR_INVALID_ARG, message); }

// The model instance: the scratch one execution reuses for the next.
class InstanceState {
 public:
  InstanceState(const ModelState& model, TRITONBACKEND_ModelInstance* instance)
      : model_(model), instance_(instance) {}

  // Answers and releases every request; noexcept, because once one is released an error
  // returned to Triton would hand the requests back a second time.
  void Execute(TRITONBACKEND_Request** requests, uint32_t count) noexcept {
    const uint64_t exec_start = NowNs();
    size_t batch_rows = 0;
    for (uint32_t index = 0; index < count; ++index) {
      TRITONBACKEND_Request* request = requests[index];
      const uint64_t compute_start = NowNs();
      const bool success = Answer(request, &batch_rows);
      const uint64_t end = NowNs();
      ErrorPtr ignored(TRITONBACKEND_ModelInstanceReportStatistics(instance_, request, success, exec_start,
                                                                   compute_start, end, end));
      ErrorPtr released(TRITONBACKEND_RequestRelease(request, TRITONSERVER_REQUEST_RELEASE_ALL));
      if (released) {
        STAGE_LOG(TRITONSERVER_LOG_ERROR, "model '" + model_.name() + "': releasing a request: " +
                                              TRITONSERVER_ErrorMessage(released.get()));
      }
    }
    const uint64_t exec_end = NowNs();
    ErrorPtr ignored(TRITONBACKEND_ModelInstanceReportBatchStatistics(instance_, batch_rows, exec_start,
                                                                      exec_start, exec_end, exec_end));
  }

 private:
  // Answers one request (its outputs, or its error); whether it succeeded.
  bool Answer(TRITONBACKEND_Request* request, size_t* batch_rows) noexcept {
    TRITONBACKEND_Response* response = nullptr;
    ErrorPtr created(TRITONBACKEND_ResponseNew(&response, request));
    if (created) {
      STAGE_LOG(TRITONSERVER_LOG_ERROR, "model '" + model_.name() + "': no response for a request: " +
                                            TRITONSERVER_ErrorMessage(created.get()));
      return false;
    }
    ErrorPtr error;
    try {
      *batch_rows += Fill(request, response);
    } catch (...) {
      error.reset(stages::ToError(std::current_exception()));
      if (TRITONSERVER_ErrorCode(error.get()) == TRITONSERVER_ERROR_INVALID_ARG) {
        STAGE_LOG(TRITONSERVER_LOG_WARN,
                  "model '" + model_.name() + "': " + TRITONSERVER_ErrorMessage(error.get()));
      } else {
        STAGE_LOG(TRITONSERVER_LOG_ERROR,
                  "model '" + model_.name() + "': " + TRITONSERVER_ErrorMessage(error.get()));
      }
    }
    ErrorPtr sent(TRITONBACKEND_ResponseSend(response, TRITONSERVER_RESPONSE_COMPLETE_FINAL, error.get()));
    if (sent) {
      STAGE_LOG(TRITONSERVER_LOG_ERROR, "model '" + model_.name() + "': sending a response: " +
                                            TRITONSERVER_ErrorMessage(sent.get()));
      return false;
    }
    return !error;
  }

  // The request's rows, one view per element, into rows_ (views into Triton's buffers or gathered_).
  // The python backend checks a BYTES input's framing before its stage sees the input, so that
  // comes first here too (in its words), then the checks of shape and type.
  void ReadRows(TRITONBACKEND_Request* request) {
    const std::string& name = model_.input();
    TRITONBACKEND_Input* input = nullptr;
    ErrorPtr missing(TRITONBACKEND_RequestInput(request, name.c_str(), &input));
    if (missing || input == nullptr) throw Refused("input '" + name + "' is missing");
    TRITONSERVER_DataType type = TRITONSERVER_TYPE_INVALID;
    const int64_t* shape = nullptr;
    uint32_t dims = 0;
    uint64_t byte_size = 0;
    uint32_t buffers = 0;
    Check(TRITONBACKEND_InputProperties(input, nullptr, &type, &shape, &dims, &byte_size, &buffers),
          "reading the input");
    std::string_view data;
    gathered_.clear();
    for (uint32_t index = 0; index < buffers; ++index) {
      const void* buffer = nullptr;
      uint64_t size = 0;
      TRITONSERVER_MemoryType memory = TRITONSERVER_MEMORY_CPU;
      int64_t memory_id = 0;
      Check(TRITONBACKEND_InputBuffer(input, index, &buffer, &size, &memory, &memory_id),
            "reading the input");
      if (memory == TRITONSERVER_MEMORY_GPU) throw Refused("input '" + name + "' is not in CPU memory");
      if (size == 0) continue;
      if (buffers == 1) {
        data = std::string_view(static_cast<const char*>(buffer), size);
      } else {
        gathered_.append(static_cast<const char*>(buffer), size);
      }
    }
    if (buffers != 1) data = gathered_;
    rows_.clear();
    if (type == TRITONSERVER_TYPE_BYTES) SplitElements(name, ElementCount(shape, dims), data);
    if (dims != 2 || shape[1] != 1 || shape[0] < 1) {
      throw Refused("input '" + name + "' must be B x 1 (one row per element, B >= 1), got " +
                    PythonList(std::vector<int64_t>(shape, shape + dims)));
    }
    if (type != TRITONSERVER_TYPE_BYTES) {
      throw Refused("input '" + name + "' must be BYTES, got " + NumpyName(type));
    }
  }

  // The elements a shape holds, as the python backend counts them: the product of the dims,
  // wrapping as its int64 product does (Triton's own checks leave the dims far below that).
  static uint64_t ElementCount(const int64_t* shape, uint32_t dims) {
    uint64_t count = 1;
    for (uint32_t index = 0; index < dims; ++index) count *= static_cast<uint64_t>(shape[index]);
    return count;
  }

  // BYTES: each element a 4-byte little-endian length, then its bytes; one view per element into
  // rows_. Checked as the python backend checks them (Triton's backend_common ValidateStringBuffer),
  // in its order and words: Triton's own check lets a last element longer than the data through.
  void SplitElements(const std::string& name, uint64_t expected, std::string_view data) {
    // Every element takes 4 bytes at least: `data` bounds the reservation, not the shape.
    rows_.reserve(static_cast<size_t>(std::min<uint64_t>(expected, data.size() / 4)));
    size_t position = 0;
    while (data.size() - position >= 4) {
      if (rows_.size() >= expected) {
        throw Refused("unexpected number of string elements " + std::to_string(rows_.size() + 1) +
                      " for inference input '" + name + "', expecting " + std::to_string(expected));
      }
      const auto* bytes = reinterpret_cast<const unsigned char*>(data.data() + position);
      const size_t length = static_cast<size_t>(bytes[0]) | (static_cast<size_t>(bytes[1]) << 8) |
                            (static_cast<size_t>(bytes[2]) << 16) | (static_cast<size_t>(bytes[3]) << 24);
      position += 4;
      const size_t remaining = data.size() - position;
      if (remaining < length) {
        throw Refused("incomplete string data for inference input '" + name +
                      "', expecting string of length " + std::to_string(length) + " but only " +
                      std::to_string(remaining) + " bytes available");
      }
      rows_.push_back(data.substr(position, length));
      position += length;
    }
    if (rows_.size() != expected) {
      // INTERNAL, as the python backend answers it.
      throw StageError(TRITONSERVER_ERROR_INTERNAL, "expected " + std::to_string(expected) +
                                                        " strings for inference input '" + name + "', got " +
                                                        std::to_string(rows_.size()));
    }
  }

  // A requested output's buffer, `width` values of `T` per row, in CPU memory.
  template <typename T>
  T* OutputBuffer(TRITONBACKEND_Response* response, const std::string& name, TRITONSERVER_DataType type,
                  size_t rows, size_t width) {
    const int64_t shape[2] = {static_cast<int64_t>(rows), static_cast<int64_t>(width)};
    TRITONBACKEND_Output* output = nullptr;
    Check(TRITONBACKEND_ResponseOutput(response, &output, name.c_str(), type, shape, 2),
          "creating an output");
    // rows <= the input's bytes / 4 (each element takes 4 at least) and width <= 26: the
    // product cannot overflow.
    const uint64_t size = static_cast<uint64_t>(rows) * width * sizeof(T);
    void* buffer = nullptr;
    TRITONSERVER_MemoryType memory = TRITONSERVER_MEMORY_CPU;
    int64_t memory_id = 0;
    Check(TRITONBACKEND_OutputBuffer(output, &buffer, size, &memory, &memory_id), "allocating an output");
    if (memory == TRITONSERVER_MEMORY_GPU) {
      throw StageError(TRITONSERVER_ERROR_UNSUPPORTED, "output '" + name + "' is not in CPU memory");
    }
    return static_cast<T*>(buffer);
  }

  // Parses the request's rows into the requested outputs of `response`; its row count.
  size_t Fill(TRITONBACKEND_Request* request, TRITONBACKEND_Response* response) {
    ReadRows(request);
    JoinRows(rows_, &joined_);
    Layout layout;
    if (std::optional<RowError> error = Scan(joined_, Labeled::kNo, rows_.size(), &layout)) {
      throw Refused(error->message());
    }
    uint32_t requested = 0;
    Check(TRITONBACKEND_RequestOutputCount(request, &requested), "reading the requested outputs");
    Outputs out;
    for (uint32_t index = 0; index < requested; ++index) {
      const char* name = nullptr;
      Check(TRITONBACKEND_RequestOutputName(request, index, &name), "reading the requested outputs");
      if (name == model_.dense() && out.dense == nullptr) {
        out.dense =
            OutputBuffer<float>(response, model_.dense(), TRITONSERVER_TYPE_FP32, layout.rows, kNumDense);
      } else if (name == model_.ids() && out.ids == nullptr) {
        out.ids = OutputBuffer<int64_t>(response, model_.ids(), TRITONSERVER_TYPE_INT64, layout.rows,
                                        kNumCategorical);
      }
    }
    if (std::optional<RowError> error = Parse(joined_, layout, out)) throw Refused(error->message());
    return layout.rows;
  }

  const ModelState& model_;
  TRITONBACKEND_ModelInstance* instance_;
  std::string gathered_;
  std::string joined_;
  std::vector<std::string_view> rows_;
};

}  // namespace
}  // namespace raw_rows

extern "C" {

TRITONSERVER_Error* TRITONBACKEND_Initialize(TRITONBACKEND_Backend* /*backend*/) {
  return stages::CheckApiVersion("raw_rows");
}

}  // extern "C"

STAGES_MODEL_ENTRY_POINTS(raw_rows::ModelState, raw_rows::InstanceState)
