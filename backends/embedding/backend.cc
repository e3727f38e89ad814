// The hot/cold embedding stage as a Triton backend (`embedding`): for a request's `B x H` int64
// raw ids (`categorical_ids`), `hot_slots` (B x H int64), `cold_positions` (N int64) and
// `cold_rows` (N x W float32), as lookup.h and cold_reads.h compute them, by the stage's definition
// in Python (export/stage/hot_cold_lookup.py, which the differential tests hold it to): its config
// parameters and its checks at load; an error per request in one line; its counters on the
// metrics page.
//
// Three lifetimes, as the C API defines them: the backend (the metric family that every model's
// counters belong to), the model (its config read and checked once, the store opened and verified
// once, the hot set indexed once: read-only afterwards, shared by its instances) and the model
// instance (its own file descriptor, io_uring or threads, counters and scratch: Triton may run
// the instances of a model at once, each on its own thread). No exception leaves an entry point.
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cold_reads.h"
#include "json.h"
#include "lookup.h"
#include "request_io.h"
#include "store.h"
#include "triton_api.h"
#include "triton_support.h"

namespace stages::embedding {
namespace {

using stages::Check;
using stages::ErrorPtr;
using stages::Json;
using stages::MessagePtr;
using stages::StageError;

// The config parameters (hot_cold_lookup.PARAM_*), as export.tables.ensemble writes them.
constexpr const char* kParamRowStore = "row_store";
constexpr const char* kParamHotSet = "hot_set";
constexpr const char* kParamTableSizes = "table_sizes";
constexpr const char* kParamFingerprint = "row_store_fingerprint";
constexpr const char* kParamColdReads = "cold_reads";
constexpr const char* kParamColdReadThreads = "cold_read_threads";
constexpr const char* kParamHintRows = "cold_read_hint_rows";
constexpr const char* kParamHotness = "hotness";
constexpr const char* kParamColdCacheBytes = "cold_cache_bytes";
constexpr const char* kParamTierCopyThreads = "tier_copy_threads";
// The most threads the `threads` way starts (the Python definition's pool starts them lazily; this one
// starts all at load, so an absurd count fails the load instead of the machine).
constexpr int64_t kMaxColdReadThreads = 1024;

// The counter family of lookups by tier (the dashboards and alerts of deploy/ read it).
constexpr const char* kMetricFamily = "ctr_embedding_lookups_total";
constexpr const char* kMetricHelp =
    "Embedding lookups of hot/cold models, by tier: hot rows in the dense model, cold rows read from the row "
    "store";
// And the cold lookups by where the stage found their rows: the hit rate of a model's memory tier
// of cold rows (cold_cache_bytes).
constexpr const char* kRowsFamily = "ctr_embedding_cold_rows_total";
constexpr const char* kRowsHelp =
    "Cold lookups of hot/cold models, by where their rows came from: the stage's memory tier of cold rows "
    "(cache), or reads of the row store (store)";

// ---------------------------------------------------------------------------------------------
// The config's parameters: strings, their integers read one way.

bool Space(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

// `text` without the ASCII whitespace around it.
std::string_view Strip(std::string_view text) {
  while (!text.empty() && Space(text.front())) text.remove_prefix(1);
  while (!text.empty() && Space(text.back())) text.remove_suffix(1);
  return text;
}

// A decimal integer, a sign allowed, whitespace around it ignored; nothing where `text` is no
// integer or one beyond 64 bits.
std::optional<int64_t> ParseInt(std::string_view text) {
  text = Strip(text);
  const bool negative = !text.empty() && text.front() == '-';
  if (!text.empty() && (text.front() == '-' || text.front() == '+')) text.remove_prefix(1);
  if (text.empty() || text.find_first_not_of("0123456789") != std::string_view::npos) return std::nullopt;
  uint64_t value = 0;
  for (const char digit : text) {
    const auto next = static_cast<uint64_t>(digit - '0');
    if (value > (UINT64_MAX - next) / 10) return std::nullopt;
    value = value * 10 + next;
  }
  const uint64_t limit = negative ? uint64_t{1} << 63 : static_cast<uint64_t>(INT64_MAX);
  if (value > limit) return std::nullopt;
  return negative ? static_cast<int64_t>(0 - value) : static_cast<int64_t>(value);
}

std::vector<std::string_view> Split(std::string_view text, char separator) {
  std::vector<std::string_view> parts;
  for (size_t start = 0;;) {
    const size_t end = text.find(separator, start);
    parts.push_back(text.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start));
    if (end == std::string_view::npos) return parts;
    start = end + 1;
  }
}

// ---------------------------------------------------------------------------------------------
// Paths: parameters are resolved against the version folder, so that a load error names the file
// as it lies on disk.

// os.path.realpath(path, strict=False): absolute, symbolic links resolved where they exist, `.`
// and `..` taken out, and the part that does not exist kept as written.
std::string ResolvePath(const std::string& path) {
  std::vector<std::string> pending;  // components still to walk, the next one last
  auto push = [&pending](const std::string& text) {
    std::vector<std::string> parts;
    for (std::string_view part : Split(text, '/')) parts.emplace_back(part);
    for (auto part = parts.rbegin(); part != parts.rend(); ++part) pending.push_back(*part);
  };
  std::string resolved;  // "" stands for "/"
  if (path.empty() || path[0] != '/') {
    char cwd[PATH_MAX];
    if (getcwd(cwd, sizeof(cwd)) != nullptr) push(cwd);
  }
  push(path);
  int links = 0;
  while (!pending.empty()) {
    const std::string part = pending.back();
    pending.pop_back();
    if (part.empty() || part == ".") continue;
    if (part == "..") {
      resolved.resize(resolved.rfind('/') == std::string::npos ? 0 : resolved.rfind('/'));
      continue;
    }
    const std::string candidate = resolved + "/" + part;
    struct stat info;
    if (links < 40 && lstat(candidate.c_str(), &info) == 0 && S_ISLNK(info.st_mode)) {
      std::string target(PATH_MAX, '\0');
      const ssize_t length = readlink(candidate.c_str(), target.data(), target.size());
      if (length > 0) {
        ++links;
        target.resize(static_cast<size_t>(length));
        if (target[0] == '/') resolved.clear();
        push(target);
        continue;
      }
    }
    resolved = candidate;
  }
  return resolved.empty() ? "/" : resolved;
}

// `base / path` as pathlib joins them: an absolute path stands alone.
std::string JoinPath(const std::string& base, const std::string& path) {
  return !path.empty() && path[0] == '/' ? path : base + "/" + path;
}

// ---------------------------------------------------------------------------------------------
// The backend: the counter family every model's instances count in.

class BackendState {
 public:
  enum Which : size_t { kLookups = 0, kColdRows = 1 };

  ~BackendState() {
    for (TRITONSERVER_MetricFamily* family : families_) {
      if (family != nullptr) ErrorPtr ignored(TRITONSERVER_MetricFamilyDelete(family));
    }
  }

  // A family, created at its first call; nullptr where the metrics API refuses it (said once, for
  // the model that asked first).
  TRITONSERVER_MetricFamily* Family(const std::string& model, Which which = kLookups) {
    static constexpr const char* kNames[] = {kMetricFamily, kRowsFamily};
    static constexpr const char* kHelps[] = {kMetricHelp, kRowsHelp};
    std::lock_guard<std::mutex> lock(mutex_);
    if (families_[which] == nullptr && !refused_[which]) {
      ErrorPtr error(TRITONSERVER_MetricFamilyNew(&families_[which], TRITONSERVER_METRIC_KIND_COUNTER,
                                                  kNames[which], kHelps[which]));
      if (error) {
        families_[which] = nullptr;
        refused_[which] = true;
        STAGE_LOG(TRITONSERVER_LOG_WARN, "model '" + model + "': counters " + kNames[which] +
                                             " are off: " + TRITONSERVER_ErrorMessage(error.get()));
      }
    }
    return families_[which];
  }

 private:
  std::mutex mutex_;
  TRITONSERVER_MetricFamily* families_[2] = {nullptr, nullptr};
  bool refused_[2] = {false, false};
};

struct ParameterDeleter {
  void operator()(TRITONSERVER_Parameter* parameter) const { TRITONSERVER_ParameterDelete(parameter); }
};
using ParameterPtr = std::unique_ptr<TRITONSERVER_Parameter, ParameterDeleter>;

struct MetricDeleter {
  void operator()(TRITONSERVER_Metric* metric) const { ErrorPtr ignored(TRITONSERVER_MetricDelete(metric)); }
};
using MetricPtr = std::unique_ptr<TRITONSERVER_Metric, MetricDeleter>;

// One instance's hot and cold counters, labelled model, version, tier and stub (the instance's
// name and the server's pid); with a memory tier of cold rows, its cold lookups by source (cache,
// store) too. Two instances of the same labels
// (a version loaded again while it serves) share one counter: the family counts its holders, so
// the first to go does not free the other's.
class LookupCounters {
 public:
  LookupCounters(BackendState& backend, const std::string& model, const std::string& version,
                 const std::string& stub, bool cached) {
    CreatePair(backend.Family(model), model, version, "tier", "hot", "cold", stub, "hot/cold lookup counters",
               &hot_, &cold_);
    if (cached) {
      CreatePair(backend.Family(model, BackendState::kColdRows), model, version, "source", "cache", "store",
                 stub, "cold row counters", &from_cache_, &from_store_);
    }
  }

  // Counts `hot` and `cold` lookups (one call per request, before its response is sent).
  void Add(uint64_t hot, uint64_t cold) {
    Increment(hot_.get(), hot);
    Increment(cold_.get(), cold);
  }

  // Counts a request's cold lookups: `hits` from the memory tier, `read` from the store.
  void AddRows(uint64_t hits, uint64_t read) {
    Increment(from_cache_.get(), hits);
    Increment(from_store_.get(), read);
  }

 private:
  // The two counters of `family` (null: refused) whose label `key` is `first` and `second`: both,
  // or neither and a warning that `what` are off.
  static void CreatePair(TRITONSERVER_MetricFamily* family, const std::string& model,
                         const std::string& version, const char* key, const char* first, const char* second,
                         const std::string& stub, const char* what, MetricPtr* first_metric,
                         MetricPtr* second_metric) {
    if (family == nullptr) return;
    try {
      *first_metric = Create(family, model, version, key, first, stub);
      *second_metric = Create(family, model, version, key, second, stub);
    } catch (const StageError& error) {
      first_metric->reset();
      second_metric->reset();
      STAGE_LOG(TRITONSERVER_LOG_WARN, "model '" + model + "': " + what + " are off: " + error.what());
    }
  }

  static void Increment(TRITONSERVER_Metric* metric, uint64_t count) {
    if (metric != nullptr && count > 0) {
      ErrorPtr ignored(TRITONSERVER_MetricIncrement(metric, static_cast<double>(count)));
    }
  }

  static MetricPtr Create(TRITONSERVER_MetricFamily* family, const std::string& model,
                          const std::string& version, const char* key, const char* value,
                          const std::string& stub) {
    const std::pair<const char*, const char*> pairs[] = {
        {"model", model.c_str()}, {"version", version.c_str()}, {key, value}, {"stub", stub.c_str()}};
    std::vector<ParameterPtr> owned;
    std::vector<const TRITONSERVER_Parameter*> labels;
    for (const auto& [key, value] : pairs) {
      owned.emplace_back(TRITONSERVER_ParameterNew(key, TRITONSERVER_PARAMETER_STRING, value));
      if (!owned.back()) throw StageError(TRITONSERVER_ERROR_INTERNAL, "cannot create a metric label");
      labels.push_back(owned.back().get());
    }
    TRITONSERVER_Metric* metric = nullptr;
    Check(TRITONSERVER_MetricNew(&metric, family, labels.data(), labels.size()), "creating a counter");
    return MetricPtr(metric);
  }

  MetricPtr hot_;
  MetricPtr cold_;
  MetricPtr from_cache_;
  MetricPtr from_store_;
};

// ---------------------------------------------------------------------------------------------
// The model: its config checked, its store and hot set opened once.

StageError LoadFailure(const std::string& model, const std::string& message) {
  return StageError(TRITONSERVER_ERROR_INVALID_ARG, "model '" + model + "': " + message);
}

class ModelState {
 public:
  static std::unique_ptr<ModelState> Create(TRITONBACKEND_Model* model) {
    const char* name = nullptr;
    Check(TRITONBACKEND_ModelName(model, &name), "reading the model's name");
    uint64_t version = 0;
    Check(TRITONBACKEND_ModelVersion(model, &version), "reading the model's version");
    TRITONBACKEND_ArtifactType artifacts = TRITONBACKEND_ARTIFACT_FILESYSTEM;
    const char* location = nullptr;
    Check(TRITONBACKEND_ModelRepository(model, &artifacts, &location), "reading the model's folder");
    if (artifacts != TRITONBACKEND_ARTIFACT_FILESYSTEM || location == nullptr) {
      throw LoadFailure(name, "the embedding stage reads its files from a model folder on a file system");
    }
    TRITONBACKEND_Backend* backend = nullptr;
    Check(TRITONBACKEND_ModelBackend(model, &backend), "reading the model's backend");
    void* backend_state = nullptr;
    Check(TRITONBACKEND_BackendState(backend, &backend_state), "reading the backend's state");
    if (backend_state == nullptr) {
      throw StageError(TRITONSERVER_ERROR_INTERNAL, "the embedding backend has no state");
    }
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
    auto state = std::make_unique<ModelState>(name, version, *static_cast<BackendState*>(backend_state));
    state->Load(*config, location);
    return state;
  }

  ModelState(std::string name, uint64_t version, BackendState& backend)
      : name_(std::move(name)), version_(version), backend_(backend) {}

  const std::string& name() const { return name_; }
  std::string version() const { return std::to_string(version_); }
  BackendState& backend() const { return backend_; }
  const Store& store() const { return *opened_.store; }
  const HotColdLookup& lookup() const { return *opened_.lookup; }
  ColdReadWay way() const { return way_; }
  int64_t threads() const { return threads_; }
  int64_t hint_rows() const { return hint_rows_; }
  int64_t copy_threads() const { return copy_threads_; }
  // The memory tier of cold rows every instance shares (null: none).
  RowCache* cache() const { return cache_.get(); }
  const std::string& input() const { return input_; }
  const std::string& output(size_t index) const { return outputs_[index]; }

  // The load line of an instance: the store, the hot rows, how cold rows are read and kept.
  std::string LoadLine(const std::string& instance, const std::string& direct) const {
    const Store& store = *opened_.store;
    std::string line = instance + ": row store " + store_path_ + " (" + std::to_string(store.rows) +
                       " rows x " + std::to_string(store.width) + "; " + store.check + "), " +
                       std::to_string(lookup().hot_rows()) + " hot rows from " + hot_set_path_ +
                       "; cold reads: " + ColdReadName(way_);
    if (way_ == ColdReadWay::kThreads) line += " (" + std::to_string(threads_) + " threads)";
    if (cache_) {
      const uint64_t bytes = static_cast<uint64_t>(cache_->capacity_rows()) * cache_->row_bytes();
      line += "; a memory tier of " + std::string(cache_->whole() ? "the whole store, " : "") +
              std::to_string(cache_->capacity_rows()) + " cold rows (" + std::to_string(bytes) + " bytes, " +
              tier_reason_ + "), its misses read " + direct;
      if (cache_->whole() && copy_threads_ > 1) {
        line += "; a request of " + std::to_string(kParallelTierLookups) + " lookups or more copied by " +
                std::to_string(copy_threads_) + " threads";
      }
    } else {
      line += "; no memory tier of cold rows (" + tier_reason_ + ")";
    }
    if (!hotness_.empty()) line += "; bags of " + std::to_string(lookup().positions()) + " ids a row";
    return line;
  }

 private:
  // A parameter's string_value, stripped ("" where absent).
  static std::string Parameter(const Json& config, const char* key) {
    const Json* parameters = config.member("parameters");
    const Json* entry = parameters != nullptr ? parameters->member(key) : nullptr;
    const Json* value = entry != nullptr ? entry->member("string_value") : nullptr;
    return value != nullptr && value->is_string() ? std::string(Strip(value->text())) : std::string();
  }

  std::string Required(const Json& config, const char* key) const {
    std::string value = Parameter(config, key);
    if (value.empty()) throw LoadFailure(name_, std::string("config parameter '") + key + "' is missing");
    return value;
  }

  std::vector<int64_t> TableSizes(const std::string& raw) const {
    std::vector<int64_t> sizes;
    for (std::string_view part : Split(raw, ',')) {
      const std::optional<int64_t> size = ParseInt(part);
      if (!size) {
        throw LoadFailure(name_, std::string("parameter '") + kParamTableSizes +
                                     "' must be comma-separated integers, got " + Quoted(raw));
      }
      sizes.push_back(*size);
    }
    for (int64_t size : sizes) {
      if (size < 1) {
        throw LoadFailure(name_, std::string("every table needs at least 1 row, got ") + kParamTableSizes +
                                     "=" + Quoted(raw));
      }
    }
    return sizes;
  }

  int64_t IntParameter(const Json& config, const char* key, int64_t fallback, int64_t minimum) const {
    const std::string raw = Parameter(config, key);
    std::optional<int64_t> value = raw.empty() ? std::optional<int64_t>(fallback) : ParseInt(raw);
    if (!value || *value < minimum) {
      throw LoadFailure(name_, std::string("parameter '") + key + "' must be an integer >= " +
                                   std::to_string(minimum) + ", got " + Quoted(raw));
    }
    return *value;
  }

  std::vector<int64_t> Hotness(const Json& config, size_t tables) const {
    const std::string raw = Parameter(config, kParamHotness);
    if (raw.empty()) return {};
    std::vector<int64_t> counts;
    for (std::string_view part : Split(raw, ',')) {
      const std::optional<int64_t> count = ParseInt(part);
      if (!count) {
        counts.clear();
        break;
      }
      counts.push_back(*count);
    }
    bool valid = counts.size() == tables;
    for (int64_t count : counts) valid = valid && count >= 1;
    if (!valid) {
      throw LoadFailure(name_, std::string("parameter '") + kParamHotness + "' must be " +
                                   std::to_string(tables) + " comma-separated counts >= 1, got " +
                                   Quoted(raw));
    }
    return counts;
  }

  static const std::vector<Json>& Items(const Json& config, const char* key) {
    static const std::vector<Json> kNone;
    const Json* found = config.member(key);
    return found != nullptr && found->is_array() ? found->items() : kNone;
  }

  // model._check_tensors: problems of the config's tensors against what the stage answers.
  std::vector<std::string> TensorProblems(const Json& config, int64_t positions, int64_t width) const {
    const std::vector<Json>& inputs = Items(config, "input");
    const std::vector<Json>& outputs = Items(config, "output");
    if (inputs.size() != 1 || outputs.size() != 3) {
      return {"1 input and 3 outputs expected, the config has " + std::to_string(inputs.size()) + " and " +
              std::to_string(outputs.size())};
    }
    struct Expected {
      const Json* entry;
      const char* data_type;
      std::vector<int64_t> dims;
    };
    const Expected expected[] = {
        {&inputs[0], "TYPE_INT64", {-1, positions}},
        {&outputs[0], "TYPE_INT64", {-1, positions}},
        {&outputs[1], "TYPE_INT64", {-1}},
        {&outputs[2], "TYPE_FP32", {-1, width}},
    };
    std::vector<std::string> problems;
    for (const Expected& tensor : expected) {
      std::vector<int64_t> dims;
      if (const Json* found = tensor.entry->member("dims"); found != nullptr) {
        for (const Json& dim : found->items()) dims.push_back(dim.integer().value_or(0));
      }
      const std::string type = ConfigText(tensor.entry->member("data_type"));
      if (type != tensor.data_type || dims != tensor.dims) {
        problems.push_back("'" + ConfigText(tensor.entry->member("name")) + "' is " + type + " " +
                           ListText(dims) + ", the stage answers " + tensor.data_type + " " +
                           ListText(tensor.dims));
      }
    }
    return problems;
  }

  // The model's load: the config's checks, then the store and the hot set opened, then the tier.
  void Load(const Json& config, const std::string& location) {
    const std::optional<int64_t> batch =
        config.member("max_batch_size") != nullptr ? config.member("max_batch_size")->integer() : int64_t{0};
    if (batch.value_or(1) != 0) {
      throw LoadFailure(name_,
                        "the embedding stage needs max_batch_size 0 (its outputs have no batch dimension)");
    }
    const std::string version_dir = location + "/" + std::to_string(version_);
    // Resolved, so a load failure names the file as it lies on disk.
    store_path_ = ResolvePath(JoinPath(version_dir, Required(config, kParamRowStore)));
    hot_set_path_ = ResolvePath(JoinPath(version_dir, Required(config, kParamHotSet)));
    const std::vector<int64_t> sizes = TableSizes(Required(config, kParamTableSizes));
    const std::string fingerprint = Parameter(config, kParamFingerprint);
    const std::string how = Parameter(config, kParamColdReads);
    const std::optional<ColdReadWay> way = ParseColdReadWay(how.empty() ? "io_uring" : how);
    if (!way) {
      throw LoadFailure(name_, std::string("parameter '") + kParamColdReads +
                                   "' must be one of io_uring, prefetch, threads, fault, got " + Quoted(how));
    }
    way_ = *way;
    threads_ = IntParameter(config, kParamColdReadThreads, kDefaultColdReadThreads, 1);
    hint_rows_ = IntParameter(config, kParamHintRows, kDefaultColdReadHintRows, 0);
    copy_threads_ = IntParameter(config, kParamTierCopyThreads, kDefaultTierCopyThreads, 1);
    if (copy_threads_ > kMaxColdReadThreads) {
      throw LoadFailure(name_, std::string("parameter '") + kParamTierCopyThreads + "' must be at most " +
                                   std::to_string(kMaxColdReadThreads) + ", got " +
                                   std::to_string(copy_threads_));
    }
    const bool tier_given = !Parameter(config, kParamColdCacheBytes).empty();
    const int64_t cache_bytes = IntParameter(config, kParamColdCacheBytes, 0, 0);
    hotness_ = Hotness(config, sizes.size());
    if (way_ == ColdReadWay::kThreads && threads_ > kMaxColdReadThreads) {
      throw LoadFailure(name_, std::string("parameter '") + kParamColdReadThreads + "' must be at most " +
                                   std::to_string(kMaxColdReadThreads) + ", got " + std::to_string(threads_));
    }
    try {
      opened_ = OpenLookup(store_path_, hot_set_path_, sizes, fingerprint, hotness_);
    } catch (const LoadError& error) {
      throw LoadFailure(name_, error.what());
    }
    // The memory tier: as the config gives it, or by default the whole store where it fits in a
    // quarter of the memory this process may use, else that quarter (none with the fault way,
    // whose mapping of the store is its own cache).
    const Store& store = *opened_.store;
    const uint64_t store_bytes = static_cast<uint64_t>(store.rows) * store.row_bytes;
    uint64_t tier_bytes = static_cast<uint64_t>(cache_bytes);
    if (tier_given) {
      tier_reason_ = std::string(kParamColdCacheBytes) + " " + std::to_string(cache_bytes);
    } else if (!CacheWayProblem(way_).empty()) {
      tier_bytes = 0;
      tier_reason_ = "cold_reads fault maps the store";
    } else {
      const uint64_t memory = MemoryLimitBytes();
      tier_bytes = DefaultTierBytes(store_bytes, memory);
      tier_reason_ = "by default: " +
                     std::string(tier_bytes >= store_bytes ? "the store fits" : "the store is larger than") +
                     " a quarter of the " + std::to_string(memory) + " bytes of memory this server may use";
      if (memory == 0) tier_reason_ = "by default none: the memory this server may use is unknown";
    }
    if (tier_bytes > 0) {
      const std::string problem = CacheWayProblem(way_);
      if (!problem.empty()) {
        throw LoadFailure(name_, std::string("parameter '") + kParamColdCacheBytes + "' " + problem);
      }
      try {
        cache_ = std::make_unique<RowCache>(tier_bytes, store.row_bytes, static_cast<uint64_t>(store.rows));
      } catch (const LoadError& error) {
        throw LoadFailure(name_, std::string("parameter '") + kParamColdCacheBytes + "': " + error.what());
      }
    }
    if (!opened_.store->verified) {
      STAGE_LOG(TRITONSERVER_LOG_WARN,
                "model '" + name_ + "': row store " + store_path_ + ": " + opened_.store->check);
    }
    if (fingerprint.empty()) {
      STAGE_LOG(TRITONSERVER_LOG_WARN,
                "model '" + name_ + "': config parameter '" + kParamFingerprint +
                    "' is absent: a different store under the same path would not be noticed");
    }
    const std::vector<std::string> problems =
        TensorProblems(config, static_cast<int64_t>(lookup().positions()), opened_.store->width);
    if (!problems.empty()) {
      std::string text = "config.pbtxt does not match the stage: ";
      for (size_t index = 0; index < problems.size(); ++index) text += (index ? "; " : "") + problems[index];
      throw LoadFailure(name_, text);
    }
    input_ = ConfigText(Items(config, "input")[0].member("name"));
    for (size_t index = 0; index < 3; ++index) {
      outputs_[index] = ConfigText(Items(config, "output")[index].member("name"));
    }
  }

  std::string name_;
  uint64_t version_;
  BackendState& backend_;
  std::string store_path_;
  std::string hot_set_path_;
  ColdReadWay way_ = ColdReadWay::kUring;
  int64_t threads_ = kDefaultColdReadThreads;
  int64_t hint_rows_ = kDefaultColdReadHintRows;
  int64_t copy_threads_ = kDefaultTierCopyThreads;
  std::vector<int64_t> hotness_;
  OpenedLookup opened_;
  std::unique_ptr<RowCache> cache_;
  std::string tier_reason_;  // why the tier is what it is, for the load line
  std::string input_;
  std::string outputs_[3];
};

// `buffer` as a T* where it is aligned for T (and not null); else null.
template <typename T>
T* Aligned(void* buffer) {
  return buffer != nullptr && reinterpret_cast<uintptr_t>(buffer) % alignof(T) == 0 ? static_cast<T*>(buffer)
                                                                                    : nullptr;
}

// One request that cannot be answered: its response carries the error.
StageError Refused(const std::string& message) { return StageError(TRITONSERVER_ERROR_INVALID_ARG, message); }

// The outputs, in config order.
enum Output : size_t { kHotSlots = 0, kColdPositions = 1, kColdRows = 2 };

// ---------------------------------------------------------------------------------------------
// The model instance: its reads, counters and scratch.

class InstanceState {
 public:
  InstanceState(const ModelState& model, TRITONBACKEND_ModelInstance* instance)
      : model_(model), instance_(instance) {
    const char* name = nullptr;
    Check(TRITONBACKEND_ModelInstanceName(instance, &name), "reading the instance's name");
    try {
      reads_ = std::make_unique<ColdReads>(model.store(), model.way(), model.threads(), model.hint_rows(),
                                           Ring::kDefaultEntries, model.cache(), model.copy_threads());
    } catch (const LoadError& error) {
      throw LoadFailure(model.name(), error.what());
    }
    if (!reads_->fallback().empty()) {
      STAGE_LOG(TRITONSERVER_LOG_WARN,
                "model '" + model.name() + "': io_uring is unavailable (" + reads_->fallback() + ")");
    }
    counters_ = std::make_unique<LookupCounters>(model.backend(), model.name(), model.version(),
                                                 std::string(name) + "/" + std::to_string(getpid()),
                                                 model.cache() != nullptr);
    STAGE_LOG(TRITONSERVER_LOG_INFO, model.LoadLine(name, reads_->direct()));
  }

  // Answers and releases every request. Compute is the placement and the reads; output, the
  // counters; the execution ends as the complete response is handed to Triton, before its send (as
  // Triton's own backends count it). A request's lookups are counted before its response is sent,
  // so a client that reads the counters after its answer sees them.
  void Execute(TRITONBACKEND_Request** requests, uint32_t count) noexcept {
    stages::AnswerAll(instance_, model_.name(), requests, count,
                      [this](TRITONBACKEND_Request* request, stages::ComputeTimes* times) {
                        uint64_t hot = 0;
                        uint64_t cold = 0;
                        return stages::Respond(
                            request, model_.name(),
                            [&](TRITONBACKEND_Response* response) { Fill(request, response, &hot, &cold); },
                            [&](bool failed) {
                              counters_->Add(hot, cold);
                              if (!failed && cold > 0)
                                counters_->AddRows(reads_->last_hits(), reads_->last_misses());
                            },
                            times);
                      });
  }

 private:
  // The request's ids (hot_cold_lookup.check_ids's checks and texts) at ids_in_: Triton's own
  // buffer where it is one, in CPU memory and aligned for int64, else a copy in ids_; its rows B.
  size_t ReadIds(TRITONBACKEND_Request* request) {
    const std::string& name = model_.input();
    const stages::RequestInput input = stages::InputOf(
        request, name, "input '" + name + "' is missing; model '" + model_.name() + "' expects it");
    const TRITONSERVER_DataType type = input.type;
    const int64_t* shape = input.shape;
    const uint32_t dims = input.dims;
    const uint64_t byte_size = input.byte_size;
    const uint32_t buffers = input.buffers;
    const std::vector<int64_t> got(shape, shape + dims);
    if (type != TRITONSERVER_TYPE_INT64) {
      throw Refused("input '" + name + "' has data type " + NumpyName(type) + ", expected INT64 (int64)");
    }
    const auto positions = static_cast<int64_t>(model_.lookup().positions());
    if (dims != 2 || shape[1] != positions) {
      throw Refused("input '" + name + "' has shape " + ListText(got) + ", expected [-1, " +
                    std::to_string(positions) + "]");
    }
    if (shape[0] < 1) throw Refused("input '" + name + "' is an empty batch (shape " + ListText(got) + ")");
    const auto rows = static_cast<uint64_t>(shape[0]);
    const uint64_t row_bytes = static_cast<uint64_t>(positions) * sizeof(int64_t);
    // tritonserver's own size check multiplies in 64 bits and may wrap: a shape whose bytes pass
    // 2**64 reaches the stage with a few bytes, and is refused here in words that say so.
    if (rows > UINT64_MAX / row_bytes) {
      throw Refused("input '" + name + "' holds " + std::to_string(byte_size) + " bytes, its shape " +
                    ListText(got) + " needs more than 2**64");
    }
    if (byte_size != rows * row_bytes) {
      throw Refused("input '" + name + "' holds " + std::to_string(byte_size) + " bytes, its shape " +
                    ListText(got) + " needs " + std::to_string(rows * row_bytes));
    }
    ids_count_ = static_cast<size_t>(byte_size / sizeof(int64_t));
    if (buffers == 1) {
      uint64_t size = 0;
      const void* buffer = input.Buffer(0, name, &size);
      if (size == byte_size && buffer != nullptr &&
          reinterpret_cast<uintptr_t>(buffer) % alignof(int64_t) == 0) {
        ids_in_ = static_cast<const int64_t*>(buffer);
        return static_cast<size_t>(rows);
      }
    }
    ids_.resize(ids_count_);
    ids_in_ = ids_.data();
    auto* out = reinterpret_cast<uint8_t*>(ids_.data());
    uint64_t filled = 0;
    for (uint32_t index = 0; index < buffers; ++index) {
      uint64_t size = 0;
      const void* buffer = input.Buffer(index, name, &size);
      if (size > byte_size - filled) {
        throw Refused("input '" + name + "' holds more bytes than its shape needs");
      }
      if (size > 0) std::memcpy(out + filled, buffer, size);
      filled += size;
    }
    if (filled != byte_size) throw Refused("input '" + name + "' holds fewer bytes than its shape needs");
    return static_cast<size_t>(rows);
  }

  // A requested output's buffer of `bytes`, in CPU memory.
  void* OutputBuffer(TRITONBACKEND_Response* response, size_t which, TRITONSERVER_DataType type,
                     const std::vector<int64_t>& shape, uint64_t bytes) {
    return stages::OutputBuffer(response, model_.output(which), type, shape.data(),
                                static_cast<uint32_t>(shape.size()), bytes);
  }

  // Places the request's lookups, reads its cold rows and writes the requested outputs.
  void Fill(TRITONBACKEND_Request* request, TRITONBACKEND_Response* response, uint64_t* hot, uint64_t* cold) {
    const size_t rows = ReadIds(request);
    const size_t count = ids_count_;
    const size_t width = reads_->width();
    bool requested[3] = {false, false, false};
    uint32_t names = 0;
    Check(TRITONBACKEND_RequestOutputCount(request, &names), "reading the requested outputs");
    for (uint32_t index = 0; index < names; ++index) {
      const char* name = nullptr;
      Check(TRITONBACKEND_RequestOutputName(request, index, &name), "reading the requested outputs");
      for (size_t which = 0; which < 3; ++which) {
        requested[which] = requested[which] || model_.output(which) == name;
      }
    }
    // Each output straight into Triton's buffer where it is aligned for its type, else via scratch
    // and a copy (Triton's allocators do not promise alignment).
    void* slots_buffer = nullptr;
    if (requested[kHotSlots]) {
      slots_buffer =
          OutputBuffer(response, kHotSlots, TRITONSERVER_TYPE_INT64,
                       {static_cast<int64_t>(rows), static_cast<int64_t>(model_.lookup().positions())},
                       count * sizeof(int64_t));
    }
    int64_t* slots_out = Aligned<int64_t>(slots_buffer);
    if (slots_out == nullptr) {
      slots_.resize(count);
      slots_out = slots_.data();
    }
    model_.lookup().Place(ids_in_, rows, slots_out, &cold_positions_, &cold_keys_);
    if (slots_buffer != nullptr && slots_out != slots_buffer) {
      std::memcpy(slots_buffer, slots_out, count * sizeof(int64_t));
    }
    const size_t cold_count = cold_keys_.size();
    uint64_t cold_bytes = 0;
    if (__builtin_mul_overflow(static_cast<uint64_t>(cold_count),
                               static_cast<uint64_t>(width) * sizeof(float), &cold_bytes)) {
      throw StageError(TRITONSERVER_ERROR_INTERNAL, "the cold rows of this request are too large");
    }
    void* rows_buffer = nullptr;
    if (requested[kColdRows]) {
      rows_buffer = OutputBuffer(response, kColdRows, TRITONSERVER_TYPE_FP32,
                                 {static_cast<int64_t>(cold_count), static_cast<int64_t>(width)}, cold_bytes);
    }
    float* rows_out = Aligned<float>(rows_buffer);
    if (rows_out == nullptr && cold_count > 0) {
      cold_rows_.resize(cold_count * width);
      rows_out = cold_rows_.data();
    }
    reads_->Read(cold_keys_.data(), cold_count, rows_out);
    if (rows_buffer != nullptr && rows_out != rows_buffer && cold_bytes > 0) {
      std::memcpy(rows_buffer, rows_out, cold_bytes);
    }
    if (requested[kColdPositions]) {
      void* buffer = OutputBuffer(response, kColdPositions, TRITONSERVER_TYPE_INT64,
                                  {static_cast<int64_t>(cold_count)}, cold_count * sizeof(int64_t));
      if (cold_count > 0) std::memcpy(buffer, cold_positions_.data(), cold_count * sizeof(int64_t));
    }
    *hot += count - cold_count;
    *cold += cold_count;
  }

  const ModelState& model_;
  TRITONBACKEND_ModelInstance* instance_;
  std::unique_ptr<ColdReads> reads_;
  std::unique_ptr<LookupCounters> counters_;
  // Scratch reused by every request.
  std::vector<int64_t> ids_;
  const int64_t* ids_in_ = nullptr;  // the request's ids: Triton's buffer, or ids_
  size_t ids_count_ = 0;
  std::vector<int64_t> slots_;
  std::vector<int64_t> cold_positions_;
  std::vector<int64_t> cold_keys_;
  std::vector<float> cold_rows_;
};

}  // namespace
}  // namespace stages::embedding

namespace embedding = stages::embedding;

extern "C" {

TRITONSERVER_Error* TRITONBACKEND_Initialize(TRITONBACKEND_Backend* backend) {
  if (TRITONSERVER_Error* refused = stages::CheckApiVersion("embedding")) return refused;
  try {
    auto state = std::make_unique<embedding::BackendState>();
    stages::Check(TRITONBACKEND_BackendSetState(backend, state.get()), "keeping the backend's state");
    state.release();  // owned by the backend now; Finalize deletes it
    return nullptr;
  } catch (...) {
    return stages::ToError(std::current_exception());
  }
}

TRITONSERVER_Error* TRITONBACKEND_Finalize(TRITONBACKEND_Backend* backend) {
  try {
    std::unique_ptr<embedding::BackendState> state(
        stages::StateOf<embedding::BackendState>(backend, TRITONBACKEND_BackendState));
    return nullptr;
  } catch (...) {
    return stages::ToError(std::current_exception());
  }
}

}  // extern "C"

STAGES_MODEL_ENTRY_POINTS(embedding::ModelState, embedding::InstanceState)
