// What every compiled stage does with Triton's requests around its own work: an execution's loop
// (each request answered, its statistics reported, released; the batch's statistics after), one
// request's response (created, filled or given the error, sent), its input's properties and CPU
// buffers, and an output's CPU buffer. A stage supplies only what it computes.
#pragma once

#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "stage_texts.h"
#include "triton_api.h"
#include "triton_support.h"

namespace stages {

// When one request's work ran: what Triton's statistics call compute; and when its response was
// complete, handed to Triton: the request's execution end. As Triton's own backends (onnxruntime,
// openvino) take it, that is before the send: the hand-off to the next step or to the client's
// connection is the server's time around the model, not the model's.
struct ComputeTimes {
  uint64_t start = 0;
  uint64_t end = 0;
  uint64_t handed = 0;  // 0: not reached (no response); the execution ends when answer() returns
};

// Answers and releases every request of an execution: `answer(request, &times)` answers one
// (true where it succeeded) and says when its compute ran and its response was handed over; each
// request's statistics are reported and it is released, whatever happened to another. `batch_size`
// is what the batch's statistics count (requests, or rows) once all are answered. Never throws: once a
// request is released an error returned to Triton would hand it back a second time.
template <typename Answer>
void AnswerAll(TRITONBACKEND_ModelInstance* instance, const std::string& model,
               TRITONBACKEND_Request** requests, uint32_t count, Answer&& answer,
               const uint64_t* batch_size = nullptr) noexcept {
  const uint64_t exec_start = NowNs();
  uint64_t exec_end = exec_start;
  for (uint32_t index = 0; index < count; ++index) {
    TRITONBACKEND_Request* request = requests[index];
    ComputeTimes times;
    times.start = NowNs();
    times.end = times.start;
    const bool success = answer(request, &times);
    const uint64_t end = times.handed != 0 ? times.handed : NowNs();
    exec_end = end;
    ErrorPtr ignored(TRITONBACKEND_ModelInstanceReportStatistics(instance, request, success, exec_start,
                                                                 times.start, times.end, end));
    ErrorPtr released(TRITONBACKEND_RequestRelease(request, TRITONSERVER_REQUEST_RELEASE_ALL));
    if (released) {
      STAGE_LOG(TRITONSERVER_LOG_ERROR,
                "model '" + model + "': releasing a request: " + TRITONSERVER_ErrorMessage(released.get()));
    }
  }
  ErrorPtr ignored(TRITONBACKEND_ModelInstanceReportBatchStatistics(
      instance, batch_size != nullptr ? *batch_size : count, exec_start, exec_start, exec_end, exec_end));
}

// One request's response: created, `fill(response)` run, and sent with the error it threw, if any
// (a refused request, INVALID_ARG, logged as a warning; any other failure as an error).
// `before_send(failed)` runs between the two (a stage's counters, read by a client after its
// answer); `times` gets the compute's end right before it and the hand-over right after it, before
// the send. Whether the request was answered without an error. Never throws.
template <typename Fill, typename BeforeSend>
bool Respond(TRITONBACKEND_Request* request, const std::string& model, Fill&& fill, BeforeSend&& before_send,
             ComputeTimes* times) noexcept {
  TRITONBACKEND_Response* response = nullptr;
  ErrorPtr created(TRITONBACKEND_ResponseNew(&response, request));
  if (created) {
    STAGE_LOG(TRITONSERVER_LOG_ERROR, "model '" + model + "': no response for a request: " +
                                          TRITONSERVER_ErrorMessage(created.get()));
    return false;
  }
  ErrorPtr error;
  try {
    fill(response);
  } catch (...) {
    error.reset(ToError(std::current_exception()));
    const bool refused = TRITONSERVER_ErrorCode(error.get()) == TRITONSERVER_ERROR_INVALID_ARG;
    STAGE_LOG(refused ? TRITONSERVER_LOG_WARN : TRITONSERVER_LOG_ERROR,
              "model '" + model + "': " + TRITONSERVER_ErrorMessage(error.get()));
  }
  times->end = NowNs();
  before_send(error != nullptr);
  times->handed = NowNs();
  ErrorPtr sent(TRITONBACKEND_ResponseSend(response, TRITONSERVER_RESPONSE_COMPLETE_FINAL, error.get()));
  if (sent) {
    STAGE_LOG(TRITONSERVER_LOG_ERROR,
              "model '" + model + "': sending a response: " + TRITONSERVER_ErrorMessage(sent.get()));
    return false;
  }
  return !error;
}

// A request's refusal: its response carries the error (INVALID_ARG), the server goes on.
inline StageError Refusal(const std::string& message) {
  return StageError(TRITONSERVER_ERROR_INVALID_ARG, message);
}

// A request's input as Triton hands it over.
struct RequestInput {
  TRITONBACKEND_Input* input = nullptr;
  TRITONSERVER_DataType type = TRITONSERVER_TYPE_INVALID;
  const int64_t* shape = nullptr;
  uint32_t dims = 0;
  uint64_t byte_size = 0;
  uint32_t buffers = 0;

  std::vector<int64_t> Shape() const { return std::vector<int64_t>(shape, shape + dims); }

  // Buffer `index`: its bytes, in CPU memory (a refusal naming `name` where it is not).
  const void* Buffer(uint32_t index, const std::string& name, uint64_t* size) const {
    const void* buffer = nullptr;
    TRITONSERVER_MemoryType memory = TRITONSERVER_MEMORY_CPU;
    int64_t memory_id = 0;
    Check(TRITONBACKEND_InputBuffer(input, index, &buffer, size, &memory, &memory_id), "reading the input");
    if (memory == TRITONSERVER_MEMORY_GPU) throw Refusal("input '" + name + "' is not in CPU memory");
    return buffer;
  }
};

// The input `name` of `request` and its properties; a refusal that says `missing` where the
// request has none.
inline RequestInput InputOf(TRITONBACKEND_Request* request, const std::string& name,
                            const std::string& missing) {
  RequestInput found;
  ErrorPtr absent(TRITONBACKEND_RequestInput(request, name.c_str(), &found.input));
  if (absent || found.input == nullptr) throw Refusal(missing);
  Check(TRITONBACKEND_InputProperties(found.input, nullptr, &found.type, &found.shape, &found.dims,
                                      &found.byte_size, &found.buffers),
        "reading the input");
  return found;
}

// The buffer of `bytes` of the output `name` (of `dims` dims at `shape`) of `response`, in CPU
// memory.
inline void* OutputBuffer(TRITONBACKEND_Response* response, const std::string& name,
                          TRITONSERVER_DataType type, const int64_t* shape, uint32_t dims, uint64_t bytes) {
  TRITONBACKEND_Output* output = nullptr;
  Check(TRITONBACKEND_ResponseOutput(response, &output, name.c_str(), type, shape, dims),
        "creating an output");
  void* buffer = nullptr;
  TRITONSERVER_MemoryType memory = TRITONSERVER_MEMORY_CPU;
  int64_t memory_id = 0;
  Check(TRITONBACKEND_OutputBuffer(output, &buffer, bytes, &memory, &memory_id), "allocating an output");
  if (memory == TRITONSERVER_MEMORY_GPU) {
    throw StageError(TRITONSERVER_ERROR_UNSUPPORTED, "output '" + name + "' is not in CPU memory");
  }
  if (bytes > 0 && buffer == nullptr)
    throw StageError(TRITONSERVER_ERROR_INTERNAL, "output '" + name + "' got no buffer");
  return buffer;
}

}  // namespace stages
