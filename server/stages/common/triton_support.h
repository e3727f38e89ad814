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
    throw StageError(
        TRITONSERVER_ErrorCode(error.get()),
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

}  // namespace stages

// Logs `message` (an expression building the text); a failure to build or log it is dropped, so
// that logging never throws out of a path that must not fail (after a request was released).
#define STAGE_LOG(level, message)                              \
  do {                                                         \
    try {                                                      \
      ::stages::Log(level, message, __FILE__, __LINE__);       \
    } catch (...) {                                            \
    }                                                          \
  } while (0)
