// A compile-time check that triton_api.h, the bundle's own declarations of Triton's C API, says
// what Triton's tritonserver.h and tritonbackend.h say. It compiles only where those headers are
// given (-DTRITON_INCLUDE_DIR, as the compose image's build stage does with the image's
// /opt/tritonserver/include), and any difference fails the build there:
//
// 1. Triton's headers come first, then each function the bundle declares is named once: one that
//    Triton does not declare (renamed, removed) is an undeclared identifier.
// 2. triton_api.h follows with STAGES_WITH_TRITON_HEADERS defined. Its function declarations
//    redeclare Triton's, and a C function redeclared with another return or parameter type does
//    not compile ("conflicting declaration of C function"). Its enumerations go into namespace
//    stages_declared; each enumerator is held to Triton's: same enumeration, same value.
// 3. The API versions: the image's major equals the bundle's and its minor is at least the
//    bundle's (tritonserver loads a backend written for an older minor of its major).
//
// The lists below name everything triton_api.h declares: tests/unit/test_stages_api_check.py
// fails when they differ, and compiles this file against stand-in headers with a mismatch of each
// kind to see the build fail.
#include <type_traits>

#include "triton/core/tritonbackend.h"
#include "triton/core/tritonserver.h"

// Each function of the C API that triton_api.h declares: those the stages call and the entry
// points they define.
#define STAGES_TRITON_FUNCTIONS(X)                    \
  X(TRITONSERVER_ErrorNew)                            \
  X(TRITONSERVER_ErrorDelete)                         \
  X(TRITONSERVER_ErrorCode)                           \
  X(TRITONSERVER_ErrorMessage)                        \
  X(TRITONSERVER_MessageSerializeToJson)              \
  X(TRITONSERVER_MessageDelete)                       \
  X(TRITONSERVER_LogIsEnabled)                        \
  X(TRITONSERVER_LogMessage)                          \
  X(TRITONSERVER_ParameterNew)                        \
  X(TRITONSERVER_ParameterDelete)                     \
  X(TRITONSERVER_MetricFamilyNew)                     \
  X(TRITONSERVER_MetricFamilyDelete)                  \
  X(TRITONSERVER_MetricNew)                           \
  X(TRITONSERVER_MetricDelete)                        \
  X(TRITONSERVER_MetricIncrement)                     \
  X(TRITONBACKEND_ApiVersion)                         \
  X(TRITONBACKEND_BackendState)                       \
  X(TRITONBACKEND_BackendSetState)                    \
  X(TRITONBACKEND_ModelBackend)                       \
  X(TRITONBACKEND_ModelVersion)                       \
  X(TRITONBACKEND_ModelRepository)                    \
  X(TRITONBACKEND_ModelName)                          \
  X(TRITONBACKEND_ModelConfig)                        \
  X(TRITONBACKEND_ModelSetState)                      \
  X(TRITONBACKEND_ModelState)                         \
  X(TRITONBACKEND_ModelInstanceModel)                 \
  X(TRITONBACKEND_ModelInstanceName)                  \
  X(TRITONBACKEND_ModelInstanceSetState)              \
  X(TRITONBACKEND_ModelInstanceState)                 \
  X(TRITONBACKEND_ModelInstanceReportStatistics)      \
  X(TRITONBACKEND_ModelInstanceReportBatchStatistics) \
  X(TRITONBACKEND_RequestInput)                       \
  X(TRITONBACKEND_RequestOutputCount)                 \
  X(TRITONBACKEND_RequestOutputName)                  \
  X(TRITONBACKEND_RequestRelease)                     \
  X(TRITONBACKEND_InputProperties)                    \
  X(TRITONBACKEND_InputBuffer)                        \
  X(TRITONBACKEND_ResponseNew)                        \
  X(TRITONBACKEND_ResponseDelete)                     \
  X(TRITONBACKEND_ResponseOutput)                     \
  X(TRITONBACKEND_OutputBuffer)                       \
  X(TRITONBACKEND_ResponseSend)                       \
  X(TRITONBACKEND_Initialize)                         \
  X(TRITONBACKEND_Finalize)                           \
  X(TRITONBACKEND_ModelInitialize)                    \
  X(TRITONBACKEND_ModelFinalize)                      \
  X(TRITONBACKEND_ModelInstanceInitialize)            \
  X(TRITONBACKEND_ModelInstanceFinalize)              \
  X(TRITONBACKEND_ModelInstanceExecute)

// Each enumerator triton_api.h declares, with the enumeration it belongs to.
#define STAGES_TRITON_ENUMERATORS(X)                                         \
  X(TRITONSERVER_Error_Code, TRITONSERVER_ERROR_UNKNOWN)                     \
  X(TRITONSERVER_Error_Code, TRITONSERVER_ERROR_INTERNAL)                    \
  X(TRITONSERVER_Error_Code, TRITONSERVER_ERROR_NOT_FOUND)                   \
  X(TRITONSERVER_Error_Code, TRITONSERVER_ERROR_INVALID_ARG)                 \
  X(TRITONSERVER_Error_Code, TRITONSERVER_ERROR_UNAVAILABLE)                 \
  X(TRITONSERVER_Error_Code, TRITONSERVER_ERROR_UNSUPPORTED)                 \
  X(TRITONSERVER_Error_Code, TRITONSERVER_ERROR_ALREADY_EXISTS)              \
  X(TRITONSERVER_Error_Code, TRITONSERVER_ERROR_CANCELLED)                   \
  X(TRITONSERVER_DataType, TRITONSERVER_TYPE_INVALID)                        \
  X(TRITONSERVER_DataType, TRITONSERVER_TYPE_BOOL)                           \
  X(TRITONSERVER_DataType, TRITONSERVER_TYPE_UINT8)                          \
  X(TRITONSERVER_DataType, TRITONSERVER_TYPE_UINT16)                         \
  X(TRITONSERVER_DataType, TRITONSERVER_TYPE_UINT32)                         \
  X(TRITONSERVER_DataType, TRITONSERVER_TYPE_UINT64)                         \
  X(TRITONSERVER_DataType, TRITONSERVER_TYPE_INT8)                           \
  X(TRITONSERVER_DataType, TRITONSERVER_TYPE_INT16)                          \
  X(TRITONSERVER_DataType, TRITONSERVER_TYPE_INT32)                          \
  X(TRITONSERVER_DataType, TRITONSERVER_TYPE_INT64)                          \
  X(TRITONSERVER_DataType, TRITONSERVER_TYPE_FP16)                           \
  X(TRITONSERVER_DataType, TRITONSERVER_TYPE_FP32)                           \
  X(TRITONSERVER_DataType, TRITONSERVER_TYPE_FP64)                           \
  X(TRITONSERVER_DataType, TRITONSERVER_TYPE_BYTES)                          \
  X(TRITONSERVER_DataType, TRITONSERVER_TYPE_BF16)                           \
  X(TRITONSERVER_MemoryType, TRITONSERVER_MEMORY_CPU)                        \
  X(TRITONSERVER_MemoryType, TRITONSERVER_MEMORY_CPU_PINNED)                 \
  X(TRITONSERVER_MemoryType, TRITONSERVER_MEMORY_GPU)                        \
  X(TRITONSERVER_LogLevel, TRITONSERVER_LOG_INFO)                            \
  X(TRITONSERVER_LogLevel, TRITONSERVER_LOG_WARN)                            \
  X(TRITONSERVER_LogLevel, TRITONSERVER_LOG_ERROR)                           \
  X(TRITONSERVER_LogLevel, TRITONSERVER_LOG_VERBOSE)                         \
  X(TRITONSERVER_ResponseCompleteFlag, TRITONSERVER_RESPONSE_COMPLETE_FINAL) \
  X(TRITONSERVER_RequestReleaseFlag, TRITONSERVER_REQUEST_RELEASE_ALL)       \
  X(TRITONSERVER_ParameterType, TRITONSERVER_PARAMETER_STRING)               \
  X(TRITONSERVER_ParameterType, TRITONSERVER_PARAMETER_INT)                  \
  X(TRITONSERVER_ParameterType, TRITONSERVER_PARAMETER_BOOL)                 \
  X(TRITONSERVER_ParameterType, TRITONSERVER_PARAMETER_DOUBLE)               \
  X(TRITONSERVER_ParameterType, TRITONSERVER_PARAMETER_BYTES)                \
  X(TRITONSERVER_MetricKind, TRITONSERVER_METRIC_KIND_COUNTER)               \
  X(TRITONSERVER_MetricKind, TRITONSERVER_METRIC_KIND_GAUGE)                 \
  X(TRITONSERVER_MetricKind, TRITONSERVER_METRIC_KIND_HISTOGRAM)             \
  X(TRITONBACKEND_ArtifactType, TRITONBACKEND_ARTIFACT_FILESYSTEM)

// 1. Declared by Triton, before the bundle's declarations can stand in for it.
#define STAGES_DECLARED_BY_TRITON(name) using name##_in_triton = decltype(::name);
STAGES_TRITON_FUNCTIONS(STAGES_DECLARED_BY_TRITON)
#undef STAGES_DECLARED_BY_TRITON

// 2. The bundle's declarations over Triton's: a different signature stops the compiler here.
#define STAGES_WITH_TRITON_HEADERS
#include "triton_api.h"

#define STAGES_SAME_ENUMERATOR(type, name)                                                       \
  static_assert(std::is_same_v<decltype(::name), ::type> &&                                      \
                    std::is_same_v<decltype(stages_declared::name), stages_declared::type>,      \
                #name " belongs to another enumeration in Triton's headers than " #type);        \
  static_assert(static_cast<long long>(::name) == static_cast<long long>(stages_declared::name), \
                #name " has another value in Triton's headers than in triton_api.h");
STAGES_TRITON_ENUMERATORS(STAGES_SAME_ENUMERATOR)
#undef STAGES_SAME_ENUMERATOR

// 3. API versions.
static_assert(TRITONBACKEND_API_VERSION_MAJOR == kBackendApiMajor,
              "Triton's backend API major version differs from triton_api.h's kBackendApiMajor");
static_assert(TRITONBACKEND_API_VERSION_MINOR >= kBackendApiMinor,
              "Triton's backend API is older than triton_api.h's kBackendApiMinor");
static_assert(TRITONSERVER_API_VERSION_MAJOR == kServerApiMajor,
              "Triton's server API major version differs from triton_api.h's kServerApiMajor");
static_assert(TRITONSERVER_API_VERSION_MINOR >= kServerApiMinor,
              "Triton's server API is older than triton_api.h's kServerApiMinor");
