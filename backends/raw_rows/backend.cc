// The raw-row stage as a Triton backend: `raw_rows` (B x 1 BYTES, one unlabeled Criteo TSV row
// per element) in, `dense_features` (B x 13 float32) and `categorical_ids` (B x 26 int64) out,
// by the rules of parse.h (criteo/rows.py's, in C++): its config checked at load, one error line per
// bad request, and a row that breaks a rule fails its own request with INVALID_ARGUMENT while the
// other requests of the batch are answered.
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
#include "request_io.h"
#include "stage_texts.h"
#include "triton_api.h"
#include "triton_support.h"

namespace raw_rows {
namespace {

using stages::Check;
using stages::ConfigText;
using stages::ErrorPtr;
using stages::Json;
using stages::ListText;
using stages::MessagePtr;
using stages::NumpyName;
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

  // The config check: every problem found, each in one line.
  void ReadConfig(const Json& config) {
    const std::vector<Json>& inputs = Items(config, "input");
    const std::vector<Json>& outputs = Items(config, "output");
    std::vector<std::string> problems;
    if (inputs.size() != 1 || ConfigText(inputs[0].member("data_type")) != "TYPE_STRING") {
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
      const std::string type = ConfigText(entry.member("data_type"));
      if (type != expected.data_type || dims != std::vector<int64_t>{static_cast<int64_t>(expected.width)}) {
        problems.push_back("output '" + ConfigText(entry.member("name")) + "' must be " + expected.data_type +
                           " [" + std::to_string(expected.width) + "], got " + type + " " + ListText(dims));
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
    input_ = ConfigText(inputs[0].member("name"));
    for (size_t index = 0; index < kOutputCount; ++index) {
      outputs_[index] = ConfigText(outputs[index].member("name"));
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

  // Answers and releases every request; the batch's statistics count its rows.
  void Execute(TRITONBACKEND_Request** requests, uint32_t count) noexcept {
    uint64_t batch_rows = 0;
    stages::AnswerAll(
        instance_, model_.name(), requests, count,
        [this, &batch_rows](TRITONBACKEND_Request* request, stages::ComputeTimes* times) {
          return stages::Respond(
              request, model_.name(),
              [&](TRITONBACKEND_Response* response) { batch_rows += Fill(request, response); }, [](bool) {},
              times);
        },
        &batch_rows);
  }

 private:
  // The request's rows, one view per element, into rows_ (views into Triton's buffers or gathered_).
  // A BYTES input's framing is checked first (a wrong framing makes every other check moot), then
  // its shape and type.
  void ReadRows(TRITONBACKEND_Request* request) {
    const std::string& name = model_.input();
    const stages::RequestInput input = stages::InputOf(request, name, "input '" + name + "' is missing");
    const TRITONSERVER_DataType type = input.type;
    const int64_t* shape = input.shape;
    const uint32_t dims = input.dims;
    const uint32_t buffers = input.buffers;
    std::string_view data;
    gathered_.clear();
    for (uint32_t index = 0; index < buffers; ++index) {
      uint64_t size = 0;
      const void* buffer = input.Buffer(index, name, &size);
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
                    ListText(std::vector<int64_t>(shape, shape + dims)));
    }
    if (type != TRITONSERVER_TYPE_BYTES) {
      throw Refused("input '" + name + "' must be BYTES, got " + NumpyName(type));
    }
  }

  // The elements a shape holds: the product of the dims, wrapping as an int64 product does
  // (Triton's own checks leave the dims far below that).
  static uint64_t ElementCount(const int64_t* shape, uint32_t dims) {
    uint64_t count = 1;
    for (uint32_t index = 0; index < dims; ++index) count *= static_cast<uint64_t>(shape[index]);
    return count;
  }

  // BYTES: each element a 4-byte little-endian length, then its bytes; one view per element into
  // rows_. Every length is checked against the data left (Triton's backend_common
  // ValidateStringBuffer checks the same; Triton's own check lets a last element longer than the
  // data through).
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
      // INTERNAL: Triton's framing gave fewer elements than the shape, not the client.
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
    // rows <= the input's bytes / 4 (each element takes 4 at least) and width <= 26: the
    // product cannot overflow.
    const uint64_t size = static_cast<uint64_t>(rows) * width * sizeof(T);
    return static_cast<T*>(stages::OutputBuffer(response, name, type, shape, 2, size));
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
