// What every compiled stage needs around the C API: owned errors and messages, logging, and the
// one exception type that becomes a TRITONSERVER_Error at the C boundary.
#pragma once

#include <memory>
#include <stdexcept>
#include <string>

#include "triton_api.h"

namespace stages {

struct ErrorDeleter {
  void operator()(TRITONSERVER_Error* error) const { TRITONSERVER_ErrorDelete(error); }
};
// An error this code owns (and deletes).
using ErrorPtr = std::unique_ptr<TRITONSERVER_Error, ErrorDeleter>;

struct MessageDeleter {
  void operator()(TRITONSERVER_Message* message) const {
    ErrorPtr ignored(TRITONSERVER_MessageDelete(message));
  }
};
using MessagePtr = std::unique_ptr<TRITONSERVER_Message, MessageDeleter>;

// A failure with the code and text its TRITONSERVER_Error (or error response) carries.
class StageError : public std::runtime_error {
 public:
  StageError(TRITONSERVER_Error_Code code, const std::string& message)
      : std::runtime_error(message), code_(code) {}
  TRITONSERVER_Error_Code code() const { return code_; }

 private:
  TRITONSERVER_Error_Code code_;
};

// Throws a call's error as a StageError (the error is deleted), prefixed with what was called.
inline void Check(TRITONSERVER_Error* raw, const char* what) {
  ErrorPtr error(raw);
  if (error) {
    throw StageError(TRITONSERVER_ErrorCode(error.get()),
                     std::string(what) + ": " + TRITONSERVER_ErrorMessage(error.get()));
  }
}

inline void Log(TRITONSERVER_LogLevel level, const std::string& message, const char* file, int line) {
  if (TRITONSERVER_LogIsEnabled(level)) {
    ErrorPtr ignored(TRITONSERVER_LogMessage(level, file, line, message.c_str()));
  }
}

// The error an entry point answers for whatever was thrown; never throws itself.
inline TRITONSERVER_Error* ToError(const std::exception_ptr& thrown) noexcept {
  try {
    std::rethrow_exception(thrown);
  } catch (const StageError& error) {
    return TRITONSERVER_ErrorNew(error.code(), error.what());
  } catch (const std::exception& error) {
    return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL, error.what());
  } catch (...) {
    return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL, "an unknown failure");
  }
}

// A stage's state kept on a Triton handle (its model or its instance), read back.
template <typename State, typename Handle>
State* StateOf(Handle* handle, TRITONSERVER_Error* (*get)(Handle*, void**)) {
  void* state = nullptr;
  Check(get(handle, &state), "reading a stage's state");
  if (state == nullptr) throw StageError(TRITONSERVER_ERROR_INTERNAL, "the stage has no state");
  return static_cast<State*>(state);
}

// The lifecycle entry points every compiled stage shares, for its ModelState (made by
// `ModelState::Create(model)`) and its InstanceState (made from the model's state and the
// instance, with `Execute(requests, count)`). None throws: a failure becomes the error returned.
template <typename ModelState>
TRITONSERVER_Error* InitializeModel(TRITONBACKEND_Model* model) noexcept {
  try {
    std::unique_ptr<ModelState> state = ModelState::Create(model);
    Check(TRITONBACKEND_ModelSetState(model, state.get()), "keeping the model's state");
    state.release();  // owned by the model now; FinalizeModel deletes it
    return nullptr;
  } catch (...) {
    return ToError(std::current_exception());
  }
}

template <typename ModelState>
TRITONSERVER_Error* FinalizeModel(TRITONBACKEND_Model* model) noexcept {
  try {
    std::unique_ptr<ModelState> state(StateOf<ModelState>(model, TRITONBACKEND_ModelState));
    return nullptr;
  } catch (...) {
    return ToError(std::current_exception());
  }
}

template <typename ModelState, typename InstanceState>
TRITONSERVER_Error* InitializeInstance(TRITONBACKEND_ModelInstance* instance) noexcept {
  try {
    TRITONBACKEND_Model* model = nullptr;
    Check(TRITONBACKEND_ModelInstanceModel(instance, &model), "reading the instance's model");
    const auto* model_state = StateOf<ModelState>(model, TRITONBACKEND_ModelState);
    auto state = std::make_unique<InstanceState>(*model_state, instance);
    Check(TRITONBACKEND_ModelInstanceSetState(instance, state.get()), "keeping the instance's state");
    state.release();  // owned by the instance now; FinalizeInstance deletes it
    return nullptr;
  } catch (...) {
    return ToError(std::current_exception());
  }
}

template <typename InstanceState>
TRITONSERVER_Error* FinalizeInstance(TRITONBACKEND_ModelInstance* instance) noexcept {
  try {
    std::unique_ptr<InstanceState> state(StateOf<InstanceState>(instance, TRITONBACKEND_ModelInstanceState));
    return nullptr;
  } catch (...) {
    return ToError(std::current_exception());
  }
}

// Every request is answered and released inside Execute, whatever happens to another; an error
// returned here would tell Triton that none of them was.
template <typename InstanceState>
TRITONSERVER_Error* ExecuteInstance(TRITONBACKEND_ModelInstance* instance, TRITONBACKEND_Request** requests,
                                    uint32_t count) noexcept {
  try {
    StateOf<InstanceState>(instance, TRITONBACKEND_ModelInstanceState)->Execute(requests, count);
    return nullptr;
  } catch (...) {
    return ToError(std::current_exception());
  }
}

// The check every stage's TRITONBACKEND_Initialize makes first: null where the server speaks this
// code's backend API (the same major version, the same or a newer minor), else the error that
// names `backend` and both versions.
inline TRITONSERVER_Error* CheckApiVersion(const char* backend) noexcept {
  try {
    uint32_t major = 0;
    uint32_t minor = 0;
    Check(TRITONBACKEND_ApiVersion(&major, &minor), "reading the backend API version");
    if (major == kBackendApiMajor && minor >= kBackendApiMinor) return nullptr;
    return TRITONSERVER_ErrorNew(
        TRITONSERVER_ERROR_UNSUPPORTED,
        ("the " + std::string(backend) + " backend needs backend API " + std::to_string(kBackendApiMajor) +
         "." + std::to_string(kBackendApiMinor) + " or a newer minor version; this server speaks " +
         std::to_string(major) + "." + std::to_string(minor))
            .c_str());
  } catch (...) {
    return ToError(std::current_exception());
  }
}

}  // namespace stages

// The five model and instance entry points of a stage's library, for its ModelState and
// InstanceState (see InitializeModel and the functions after it); each stage defines its own
// TRITONBACKEND_Initialize (CheckApiVersion first) and, where it keeps a backend state,
// TRITONBACKEND_Finalize.
#define STAGES_MODEL_ENTRY_POINTS(ModelState, InstanceState)                                         \
  extern "C" {                                                                                       \
  TRITONSERVER_Error* TRITONBACKEND_ModelInitialize(TRITONBACKEND_Model* model) {                    \
    return ::stages::InitializeModel<ModelState>(model);                                             \
  }                                                                                                  \
  TRITONSERVER_Error* TRITONBACKEND_ModelFinalize(TRITONBACKEND_Model* model) {                      \
    return ::stages::FinalizeModel<ModelState>(model);                                               \
  }                                                                                                  \
  TRITONSERVER_Error* TRITONBACKEND_ModelInstanceInitialize(TRITONBACKEND_ModelInstance* instance) { \
    return ::stages::InitializeInstance<ModelState, InstanceState>(instance);                        \
  }                                                                                                  \
  TRITONSERVER_Error* TRITONBACKEND_ModelInstanceFinalize(TRITONBACKEND_ModelInstance* instance) {   \
    return ::stages::FinalizeInstance<InstanceState>(instance);                                      \
  }                                                                                                  \
  TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(TRITONBACKEND_ModelInstance* instance,      \
                                                         TRITONBACKEND_Request** requests,           \
                                                         const uint32_t request_count) {             \
    return ::stages::ExecuteInstance<InstanceState>(instance, requests, request_count);              \
  }                                                                                                  \
  }  // extern "C"

// Logs `message` (an expression building the text); a failure to build or log it is dropped, so
// that logging never throws out of a path that must not fail (after a request was released).
#define STAGE_LOG(level, message)                        \
  do {                                                   \
    try {                                                \
      ::stages::Log(level, message, __FILE__, __LINE__); \
    } catch (...) {                                      \
    }                                                    \
  } while (0)
