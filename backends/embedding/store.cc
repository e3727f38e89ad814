// The row store: store.json's description checked field by field, the size of rows.bin, its content
// (chunk CRC-32s in threads and the fingerprint, or an older store's SHA-256), then a read-only
// mapping. Each failure is one line naming the file, the field, the value found and what the
// format expects; the stage's Python definition (export/stage/hot_cold_lookup.py, read_store_meta
// and open_store) checks the same fields in the same order and says the same lines.
#include "store.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <optional>
#include <system_error>
#include <thread>

#include "crc32.h"
#include "json.h"
#include "sha256.h"

namespace stages::embedding {

namespace {

constexpr char kRowsFile[] = "rows.bin";
constexpr char kMetaFile[] = "store.json";
constexpr char kFormat[] = "criteo-row-store";
constexpr int kFormatVersion = 1;
constexpr char kChecksumKind[] = "crc32";
// Bytes of one column's scale and bias in an int8 row (two float32).
constexpr int kInt8ParamBytes = 8;
// Read size of the checksum pass: small enough that the bytes read are still in cache when hashed.
constexpr size_t kCheckReadBytes = 1 << 20;
// Read size of the SHA-256 pass over a store written before the chunk checksums.
constexpr size_t kSha256ReadBytes = 16 << 20;
// Threads of the checksum pass at most, where the caller names none.
constexpr int kMaxCheckThreads = 8;

// A file descriptor this code owns.
class Descriptor {
 public:
  explicit Descriptor(int fd) : fd_(fd) {}
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  ~Descriptor() {
    if (fd_ >= 0) close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

// The most characters of a store.json value an error line shows (its compact JSON), "..." after.
constexpr size_t kShownChars = 60;

using Wide = unsigned __int128;

// A value as an error line shows it: compact JSON, keys sorted, ASCII only (as Python's
// json.dumps(value, sort_keys=True, separators=(",", ":")) writes it, so that the stage's Python
// definition says the same line), at most kShownChars characters; "nothing" for an absent field.
std::string Shown(const Json* value) {
  if (value == nullptr) return "nothing";
  const std::string text = CanonicalJson(*value);
  return text.size() <= kShownChars ? text : text.substr(0, kShownChars - 3) + "...";
}

std::string Truncated(const std::string& text) {
  return text.size() <= kShownChars ? text : text.substr(0, kShownChars - 3) + "...";
}

// A JSON integer (a number without a fraction or exponent, not a bool) that fits an int64.
std::optional<int64_t> IntegerOf(const Json* value) {
  if (value == nullptr || value->kind() != Json::Kind::kNumber) return std::nullopt;
  return value->integer();
}

bool IsNull(const Json* value) { return value != nullptr && value->kind() == Json::Kind::kNull; }

std::string Digits(Wide value) {
  std::string digits;
  do {
    digits.insert(digits.begin(), static_cast<char>('0' + static_cast<int>(value % 10)));
    value /= 10;
  } while (value != 0);
  return digits;
}

// "<store.json>: <field> must be <expected>, got <value>".
[[noreturn]] void FieldError(const std::string& meta_path, const std::string& field, const Json* value,
                             const std::string& expected) {
  throw LoadError(meta_path + ": " + field + " must be " + expected + ", got " + Shown(value));
}

// `folder`/`name`, the folder's trailing slashes dropped.
std::string JoinPath(std::string folder, const char* name) {
  while (folder.size() > 1 && folder.back() == '/') folder.pop_back();
  if (folder.empty()) folder = ".";
  return (folder == "/" ? folder : folder + "/") + name;
}

// The CPUs this process may run on (len(os.sched_getaffinity(0))), 1 where that is unknown.
int UsableCpus() {
  for (int cpus = 1024; cpus <= (1 << 20); cpus *= 4) {
    cpu_set_t* set = CPU_ALLOC(cpus);
    if (set == nullptr) return 1;
    const size_t bytes = CPU_ALLOC_SIZE(cpus);
    CPU_ZERO_S(bytes, set);
    const int got = sched_getaffinity(0, bytes, set);
    const int count = got == 0 ? CPU_COUNT_S(bytes, set) : 0;
    CPU_FREE(set);
    if (got == 0) return std::max(count, 1);
    if (errno != EINVAL) return 1;  // EINVAL: the set is too small for this machine
  }
  return 1;
}

// store.json's bytes, or the load error that says why they cannot be read.
std::string ReadMeta(const std::string& folder, const std::string& meta_path) {
  const int fd = open(meta_path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) throw LoadError("no row store at " + folder + ": " + kMetaFile + " is missing");
    throw LoadError("cannot read " + meta_path + ": " + std::strerror(errno));
  }
  const Descriptor owner(fd);
  std::string text;
  char piece[1 << 16];
  while (true) {
    const ssize_t got = read(fd, piece, sizeof(piece));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) throw LoadError("cannot read " + meta_path + ": " + std::strerror(errno));
    if (got == 0) break;
    text.append(piece, static_cast<size_t>(got));
  }
  if (!ValidUtf8(text)) throw LoadError("cannot read " + meta_path + ": not UTF-8 text");
  return text;
}

// The columns of a spec in row order, tiling [0, width): "columns" absent, null or an object of
// [start, stop] pairs of integers (one column, the whole row, where it names none).
std::vector<std::pair<int64_t, int64_t>> StoreColumns(const std::string& meta_path, const Json& spec,
                                                      int64_t width) {
  const Json* named = spec.member("columns");
  if (named == nullptr || IsNull(named)) return {{0, width}};
  std::vector<std::pair<int64_t, int64_t>> columns;
  bool valid = named->is_object();
  std::vector<std::string> seen;
  for (const auto& [name, ignored] : named->members()) {
    if (!valid) break;
    if (std::find(seen.begin(), seen.end(), name) != seen.end()) continue;
    seen.push_back(name);
    const Json& pair = *named->member(name);  // a repeated name's last value
    const std::optional<int64_t> start =
        pair.is_array() && pair.items().size() == 2 ? IntegerOf(&pair.items()[0]) : std::nullopt;
    const std::optional<int64_t> stop = start ? IntegerOf(&pair.items()[1]) : std::nullopt;
    valid = start && stop;
    if (valid) columns.emplace_back(*start, *stop);
  }
  if (!valid) FieldError(meta_path, "spec.columns", named, "an object of [start, stop] pairs of integers");
  std::sort(columns.begin(), columns.end());
  if (columns.empty()) return {{0, width}};
  bool tiles = columns.back().second == width;
  for (size_t index = 0; index < columns.size(); ++index) {
    const int64_t edge = index == 0 ? 0 : columns[index - 1].second;
    tiles = tiles && columns[index].first == edge && columns[index].first < columns[index].second;
  }
  if (!tiles) {
    std::string listed = "[";
    for (size_t index = 0; index < columns.size(); ++index) {
      listed += (index ? ",[" : "[") + std::to_string(columns[index].first) + "," +
                std::to_string(columns[index].second) + "]";
    }
    throw LoadError(meta_path + ": spec.columns " + Truncated(listed + "]") + " do not tile a row of " +
                    std::to_string(width) + " values");
  }
  return columns;
}

// _rate: "0.27 GB in 0.13 s, 2.1 GB/s".
std::string Rate(int64_t size, double seconds) {
  char text[128];
  std::snprintf(text, sizeof(text), "%.2f GB in %.2f s", static_cast<double>(size) / 1e9, seconds);
  std::string out = text;
  if (seconds > 0) {
    std::snprintf(text, sizeof(text), ", %.1f GB/s", static_cast<double>(size) / seconds / 1e9);
    out += text;
  }
  return out;
}

double SecondsSince(std::chrono::steady_clock::time_point started) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
}

// How a chunk's check ended.
struct ChunkResult {
  bool failed = false;
  int64_t crc = 0;  // its CRC-32; -1: the file ended before it (as the Python definition counts it)
  int error = 0;    // a read's errno, where one failed
};

// hot_cold_lookup.verify_checksums over the open rows.bin: each chunk's CRC-32 against
// `checksums` ({"kind": "crc32", "chunk_bytes": n, "values": [...]}), in threads. Returns the
// seconds it took.
double VerifyChecksums(int fd, const std::string& rows_path, const std::string& meta_path,
                       const Json& checksums, int64_t size, int threads) {
  const Json* kind = checksums.member("kind");
  if (kind == nullptr || !kind->is_string() || kind->text() != kChecksumKind) {
    FieldError(meta_path, "checksums.kind", kind, std::string("\"") + kChecksumKind + "\"");
  }
  const std::optional<int64_t> chunk_bytes = IntegerOf(checksums.member("chunk_bytes"));
  if (!chunk_bytes || *chunk_bytes < 1) {
    FieldError(meta_path, "checksums.chunk_bytes", checksums.member("chunk_bytes"), "an integer >= 1");
  }
  const Json* values = checksums.member("values");
  std::vector<int64_t> expected;
  bool valid = values != nullptr && values->is_array();
  for (size_t index = 0; valid && index < values->items().size(); ++index) {
    const std::optional<int64_t> value = IntegerOf(&values->items()[index]);
    valid = value && *value >= 0 && *value <= 0xFFFFFFFFll;
    if (valid) expected.push_back(*value);
  }
  if (!valid)
    FieldError(meta_path, "checksums.values", values, "a list of CRC-32s (integers 0 to 4294967295)");
  const int64_t chunk = *chunk_bytes;
  const int64_t chunks = size == 0 ? 0 : (size - 1) / chunk + 1;
  if (static_cast<int64_t>(expected.size()) != chunks) {
    throw LoadError(rows_path + ": " + std::to_string(expected.size()) + " checksums recorded, " +
                    std::to_string(size) + " bytes need " + std::to_string(chunks) + " (chunks of " +
                    std::to_string(chunk) + " bytes)");
  }
  const auto started = std::chrono::steady_clock::now();
  const size_t count = expected.size();
  if (threads <= 0) threads = std::min(kMaxCheckThreads, UsableCpus());
  std::vector<ChunkResult> results(count);
  std::atomic<size_t> next{0};
  // The first chunk that failed: chunks after it are not started (the Python definition drops them too).
  std::atomic<size_t> first_failure{count};
  const size_t wanted = std::min(static_cast<size_t>(threads), count);
  // Each thread's read buffer, allocated here: a failure to allocate one fails this call, not a thread.
  std::vector<std::vector<uint8_t>> buffers(std::max<size_t>(wanted, 1),
                                            std::vector<uint8_t>(kCheckReadBytes));
  const auto check = [&](std::vector<uint8_t>& buffer) {
    while (true) {
      const size_t index = next.fetch_add(1);
      if (index >= count || index > first_failure.load()) return;
      const int64_t start = static_cast<int64_t>(index) * chunk;
      const int64_t length = std::min<int64_t>(chunk, size - start);
      ChunkResult& result = results[index];
      uint32_t crc = 0;
      int64_t done = 0;
      result.crc = -2;
      while (done < length) {
        const size_t want = static_cast<size_t>(std::min<int64_t>(kCheckReadBytes, length - done));
        const ssize_t got = pread(fd, buffer.data(), want, static_cast<off_t>(start + done));
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) {
          result.error = errno;
          break;
        }
        if (got == 0) {
          result.crc = -1;
          break;
        }
        crc = Crc32(buffer.data(), static_cast<size_t>(got), crc);
        done += got;
      }
      if (result.error == 0 && result.crc != -1) result.crc = crc;
      result.failed = result.error != 0 || result.crc != expected[index];
      if (result.failed) {
        size_t seen = first_failure.load();
        while (index < seen && !first_failure.compare_exchange_weak(seen, index)) {
        }
      }
    }
  };
  std::vector<std::thread> workers;
  try {
    for (size_t worker = 1; worker < wanted; ++worker) workers.emplace_back(check, std::ref(buffers[worker]));
  } catch (const std::system_error&) {
    // No more threads to be had: the ones started (and this one) check every chunk all the same.
  }
  check(buffers[0]);
  for (std::thread& worker : workers) worker.join();
  const size_t failed = first_failure.load();
  if (failed < count) {
    const ChunkResult& result = results[failed];
    if (result.error != 0) throw LoadError("cannot read " + rows_path + ": " + std::strerror(result.error));
    const int64_t start = static_cast<int64_t>(failed) * chunk;
    const int64_t stop = std::min<int64_t>(start + chunk, size) - 1;
    throw LoadError(rows_path + " is damaged: bytes " + std::to_string(start) + ".." + std::to_string(stop) +
                    " (chunk " + std::to_string(failed + 1) + " of " + std::to_string(count) +
                    ") do not match " + kMetaFile + " (" +
                    (result.crc < 0 ? "the file ends before it" : "their CRC-32 differs") + ")");
  }
  return SecondsSince(started);
}

// _verify_sha256 over the open rows.bin.
double VerifySha256(int fd, const std::string& rows_path, const std::string& expected, int64_t size) {
  const auto started = std::chrono::steady_clock::now();
  Sha256 digest;
  std::vector<uint8_t> buffer(static_cast<size_t>(std::min<int64_t>(size, kSha256ReadBytes)));
  for (int64_t offset = 0; offset < size;) {
    const size_t want = static_cast<size_t>(std::min<int64_t>(kSha256ReadBytes, size - offset));
    const ssize_t got = pread(fd, buffer.data(), want, offset);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) throw LoadError("cannot read " + rows_path + ": " + std::strerror(errno));
    if (got == 0) break;
    digest.Update(buffer.data(), static_cast<size_t>(got));
    offset += got;
  }
  if (digest.HexDigest() != expected) {
    throw LoadError(rows_path + " is damaged: it does not match the SHA-256 in " + kMetaFile);
  }
  return SecondsSince(started);
}

struct Content {
  std::string fingerprint;
  bool verified = false;
  std::string check;
};

// Every byte of rows.bin as its description allows: against its chunk checksums (and its
// fingerprint recomputed), an older store's SHA-256, or none (loaded unverified, and said so).
Content VerifyContent(int fd, const std::string& rows_path, const std::string& meta_path, const Json& meta,
                      int64_t size, int threads) {
  const Json* checksums = meta.member("checksums");
  if (checksums != nullptr && !IsNull(checksums)) {
    if (!checksums->is_object()) FieldError(meta_path, "checksums", checksums, "an object");
    // The fingerprint: SHA-256 of {"checksums": ..., "spec": ...} as canonical JSON.
    const std::string canonical = "{\"checksums\":" + CanonicalJson(*checksums) +
                                  ",\"spec\":" + CanonicalJson(*meta.member("spec")) + "}";
    Content content;
    content.fingerprint = Sha256Hex(canonical);
    const Json* recorded = meta.member("fingerprint");
    if (recorded != nullptr && !IsNull(recorded) &&
        !(recorded->is_string() && recorded->text() == content.fingerprint)) {
      throw LoadError(meta_path +
                      ": its fingerprint does not match its own spec and checksums (edited by hand?)");
    }
    const double seconds = VerifyChecksums(fd, rows_path, meta_path, *checksums, size, threads);
    content.verified = true;
    content.check = "CRC-32 of " + std::to_string(checksums->member("values")->items().size()) +
                    " chunk(s) verified (" + Rate(size, seconds) + ")";
    return content;
  }
  const Json* sha256 = meta.member("sha256");
  if (sha256 != nullptr && !IsNull(sha256) && !sha256->is_string()) {
    FieldError(meta_path, "sha256", sha256, "a string");
  }
  if (sha256 != nullptr && sha256->is_string() && !sha256->text().empty()) {
    const double seconds = VerifySha256(fd, rows_path, sha256->text(), size);
    return {"", true, "SHA-256 verified, no chunk checksums (older store; " + Rate(size, seconds) + ")"};
  }
  return {"", false,
          std::string("UNVERIFIED: ") + kMetaFile +
              " has no checksums (written by an older bundle without a digest); a damaged rows.bin would be "
              "served: rewrite the store"};
}

}  // namespace

Store::~Store() {
  if (data != nullptr) munmap(const_cast<uint8_t*>(data), size);
}

std::unique_ptr<Store> OpenStore(const std::string& dir, bool verify, int threads) {
  const std::string meta_path = JoinPath(dir, kMetaFile);
  const std::string rows_path = JoinPath(dir, kRowsFile);
  std::string folder = dir;
  while (folder.size() > 1 && folder.back() == '/') folder.pop_back();
  const std::string text = ReadMeta(folder.empty() ? "." : folder, meta_path);
  std::string why;
  const std::optional<Json> parsed = Json::Parse(text, &why);
  if (!parsed) throw LoadError("cannot read " + meta_path + ": not JSON (" + why + ")");
  const Json& meta = *parsed;
  const Json* format = meta.member("format");
  if (!meta.is_object() || format == nullptr || !format->is_string() || format->text() != kFormat) {
    throw LoadError(meta_path + " is not a row store description");
  }
  const Json* version = meta.member("version");
  if (IntegerOf(version) != kFormatVersion) {
    throw LoadError(meta_path + " has row store format version " + Shown(version) +
                    "; this stage reads version " + std::to_string(kFormatVersion));
  }
  const Json* spec = meta.member("spec");
  if (spec == nullptr || !spec->is_object()) FieldError(meta_path, "spec", spec, "an object");

  auto store = std::make_unique<Store>();
  store->path = dir;
  const Json* sizes = spec->member("table_sizes");
  bool valid = sizes != nullptr && sizes->is_array() && !sizes->items().empty();
  for (size_t index = 0; valid && index < sizes->items().size(); ++index) {
    const std::optional<int64_t> size = IntegerOf(&sizes->items()[index]);
    valid = size && *size >= 1;
    if (valid) store->table_sizes.push_back(*size);
  }
  if (!valid) FieldError(meta_path, "spec.table_sizes", sizes, "a list of integers >= 1");
  const std::optional<int64_t> width = IntegerOf(spec->member("width"));
  if (!width || *width < 1) FieldError(meta_path, "spec.width", spec->member("width"), "an integer >= 1");
  store->width = *width;
  const Json* dtype = spec->member("dtype");
  const std::string dtype_name = dtype != nullptr && dtype->is_string() ? dtype->text() : "";
  if (dtype_name == "float32") {
    store->dtype = StoreDtype::kFloat32;
  } else if (dtype_name == "float16") {
    store->dtype = StoreDtype::kFloat16;
  } else if (dtype_name == "int8") {
    store->dtype = StoreDtype::kInt8;
  } else {
    FieldError(meta_path, "spec.dtype", dtype, "one of float32, float16, int8");
  }
  store->columns = StoreColumns(meta_path, *spec, store->width);

  // Sizes in 128 bits: a spec that needs more than a file can hold is an error, not an overflow.
  Wide rows = 0;
  for (const int64_t size : store->table_sizes) rows += static_cast<Wide>(size);
  const bool int8 = store->dtype == StoreDtype::kInt8;
  const Wide item_bytes = int8 ? 1 : store->dtype == StoreDtype::kFloat32 ? 4 : 2;
  const Wide row_bytes = (static_cast<Wide>(store->width) +
                          (int8 ? static_cast<Wide>(kInt8ParamBytes) * store->columns.size() : 0)) *
                         item_bytes;
  const bool huge = row_bytes != 0 && rows > (~Wide{0}) / row_bytes;
  const Wide needed = huge ? 0 : rows * row_bytes;
  if (huge || needed > static_cast<Wide>(INT64_MAX)) {
    throw LoadError(meta_path + ": its spec needs " +
                    (huge ? std::string("more than 2**128") : Digits(needed)) +
                    " bytes, more than a file can hold");
  }
  const auto expected = static_cast<int64_t>(needed);
  const Json* file_bytes = meta.member("file_bytes");
  if (IntegerOf(file_bytes) != expected) {
    throw LoadError(meta_path + ": file_bytes is " + Shown(file_bytes) + ", its spec needs " +
                    std::to_string(expected));
  }

  const int fd = open(rows_path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw LoadError("cannot open " + rows_path + ": " + std::strerror(errno));
  const Descriptor owner(fd);
  struct stat status;
  if (fstat(fd, &status) != 0) throw LoadError("cannot read " + rows_path + ": " + std::strerror(errno));
  const int64_t size = status.st_size;
  if (size != expected) {
    throw LoadError(rows_path + " has " + std::to_string(size) + " bytes, " + kMetaFile + " says " +
                    std::to_string(expected) + " (truncated, or from another store)");
  }
  store->check = "content not checked";
  if (verify) {
    Content content = VerifyContent(fd, rows_path, meta_path, meta, size, threads);
    store->fingerprint = std::move(content.fingerprint);
    store->verified = content.verified;
    store->check = std::move(content.check);
  }
  store->rows = static_cast<int64_t>(rows);
  store->row_bytes = static_cast<size_t>(row_bytes);
  void* mapped = mmap(nullptr, static_cast<size_t>(size), PROT_READ, MAP_SHARED, fd, 0);
  if (mapped == MAP_FAILED) throw LoadError("cannot map " + rows_path + ": " + std::strerror(errno));
  store->data = static_cast<const uint8_t*>(mapped);
  store->size = static_cast<size_t>(size);
  // A cold lookup then reads one page, not the kernel's read-ahead window.
  madvise(mapped, store->size, MADV_RANDOM);
  return store;
}

}  // namespace stages::embedding
