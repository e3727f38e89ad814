// The row store, opened as hot_cold_lookup.open_store opens it: store.json's description, the
// size of rows.bin, its content (chunk CRC-32s in threads and the fingerprint, or an older store's
// SHA-256), then a read-only mapping. Each failure says what the Python definition says.
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
#include <system_error>
#include <thread>

#include "crc32.h"
#include "json.h"
#include "python_values.h"
#include "sha256.h"

namespace stages::embedding {

namespace {

using py::Int;
using py::Value;

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

// A store.json field the Python definition found unusable inside store_columns (its StageError).
class ColumnsError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

[[noreturn]] void Overflow(const std::string& where) {
  throw LoadError(where + ": invalid row store spec (OverflowError: int too large for this reader)");
}

Int Add(Int a, Int b, const std::string& where) {
  Int sum;
  if (__builtin_add_overflow(a, b, &sum)) Overflow(where);
  return sum;
}

Int Multiply(Int a, Int b, const std::string& where) {
  Int product;
  if (__builtin_mul_overflow(a, b, &product)) Overflow(where);
  return product;
}

int64_t ToInt64(Int value, const std::string& where) {
  if (value > INT64_MAX || value < INT64_MIN) Overflow(where);
  return static_cast<int64_t>(value);
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

// Reads store.json's text as Path.read_text() would, or throws open_store's error.
std::string ReadMeta(const std::string& folder, const std::string& meta_path) {
  const int fd = open(meta_path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) throw LoadError("no row store at " + folder + ": " + kMetaFile + " is missing");
    throw LoadError("cannot read " + meta_path + ": " + py::OsErrorText(errno, meta_path));
  }
  const Descriptor owner(fd);
  struct stat status;
  if (fstat(fd, &status) == 0 && S_ISDIR(status.st_mode)) {
    throw LoadError("cannot read " + meta_path + ": " + py::OsErrorText(EISDIR, meta_path));
  }
  std::string text;
  char piece[1 << 16];
  while (true) {
    const ssize_t got = read(fd, piece, sizeof(piece));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) throw LoadError("cannot read " + meta_path + ": " + py::OsErrorText(errno));
    if (got == 0) break;
    text.append(piece, static_cast<size_t>(got));
  }
  if (const std::optional<std::string> error = py::Utf8Error(text)) {
    throw LoadError("cannot read " + meta_path + ": " + *error);
  }
  // Universal newlines, as read_text gives the text: "\r\n" and "\r" read as "\n" (which moves the
  // positions json.loads' errors name).
  std::string lines;
  lines.reserve(text.size());
  for (size_t at = 0; at < text.size(); ++at) {
    if (text[at] != '\r') {
      lines += text[at];
    } else {
      lines += '\n';
      if (at + 1 < text.size() && text[at + 1] == '\n') ++at;
    }
  }
  return lines;
}

// dict(value), as Python builds it: from a dict, or from pairs.
Value DictOf(const Value& value) {
  if (value.kind == Value::Kind::kDict) return value;
  Value out;
  out.kind = Value::Kind::kDict;
  const std::vector<Value> elements = py::Iterate(value);
  for (size_t index = 0; index < elements.size(); ++index) {
    const Value& element = elements[index];
    std::vector<Value> pair;
    try {
      pair = py::Iterate(element);
    } catch (const py::Exception&) {
      throw py::Exception("TypeError", "cannot convert dictionary update sequence element #" +
                                           std::to_string(index) + " to a sequence");
    }
    if (pair.size() != 2) {
      throw py::Exception("ValueError", "dictionary update sequence element #" + std::to_string(index) +
                                            " has length " + std::to_string(pair.size()) + "; 2 is required");
    }
    out.Put(pair[0], pair[1]);
  }
  return out;
}

// `a, b = value`.
std::pair<Value, Value> Unpack2(const Value& value) {
  std::vector<Value> items;
  try {
    items = py::Iterate(value);
  } catch (const py::Exception&) {
    throw py::Exception("TypeError", "cannot unpack non-iterable " + py::TypeName(value) + " object");
  }
  if (items.size() < 2) {
    throw py::Exception("ValueError",
                        "not enough values to unpack (expected 2, got " + std::to_string(items.size()) + ")");
  }
  if (items.size() > 2) throw py::Exception("ValueError", "too many values to unpack (expected 2)");
  return {items[0], items[1]};
}

// hot_cold_lookup.store_columns: the columns of a spec in row order, tiling [0, width).
std::vector<std::pair<Int, Int>> StoreColumns(const Value& spec, Int width) {
  std::vector<std::pair<Int, Int>> columns;
  try {
    // dict(spec.get("columns") or {})
    const Value* named = py::Find(spec, "columns");
    Value empty;
    empty.kind = Value::Kind::kDict;
    const Value mapping = DictOf(named != nullptr && py::Truth(*named) ? *named : empty);
    for (size_t index = 1; index < mapping.items.size(); index += 2) {
      const auto [start, stop] = Unpack2(mapping.items[index]);
      const Int a = py::ToInt(start);
      columns.emplace_back(a, py::ToInt(stop));
    }
  } catch (const py::Exception& error) {
    if (error.type() != "TypeError" && error.type() != "ValueError") throw;
    throw ColumnsError("invalid row store columns (" + error.Described() + ")");
  }
  std::sort(columns.begin(), columns.end());
  if (columns.empty()) return {{0, width}};
  bool tiles = columns.back().second == width;
  for (size_t index = 0; index < columns.size(); ++index) {
    const Int edge = index == 0 ? 0 : columns[index - 1].second;
    tiles = tiles && columns[index].first == edge && columns[index].first < columns[index].second;
  }
  if (!tiles) {
    std::string listed = "[";
    for (size_t index = 0; index < columns.size(); ++index) {
      if (index) listed += ", ";
      listed += "(" + py::FormatInt(columns[index].first) + ", " + py::FormatInt(columns[index].second) + ")";
    }
    throw ColumnsError("row store columns " + listed + "] do not tile a row of " + py::FormatInt(width) +
                       " values");
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
double VerifyChecksums(int fd, const std::string& rows_path, const Value& checksums, int64_t size,
                       int threads) {
  Value kind;
  Int chunk_bytes = 0;
  std::vector<Int> expected;
  try {
    kind = py::Subscript(checksums, "kind");
    chunk_bytes = py::ToInt(py::Subscript(checksums, "chunk_bytes"));
    for (const Value& value : py::Iterate(py::Subscript(checksums, "values")))
      expected.push_back(py::ToInt(value));
  } catch (const py::Exception& error) {
    throw LoadError("invalid checksums for " + rows_path + " (" + error.Described() + ")");
  }
  if (kind.kind != Value::Kind::kStr || kind.text != kChecksumKind || chunk_bytes < 1) {
    throw LoadError("checksums of " + rows_path + " are " + py::Repr(kind) + " per " +
                    py::FormatInt(chunk_bytes) + " bytes; expected " + kChecksumKind);
  }
  const Int chunks = size == 0 ? 0 : (size - 1) / chunk_bytes + 1;
  if (static_cast<Int>(expected.size()) != chunks) {
    throw LoadError(rows_path + ": " + std::to_string(expected.size()) + " checksums recorded, " +
                    std::to_string(size) + " bytes need " + py::FormatInt(chunks) + " (chunks of " +
                    py::FormatInt(chunk_bytes) + " bytes)");
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
      const Int start = static_cast<Int>(index) * chunk_bytes;
      const Int length = std::min<Int>(chunk_bytes, size - start);
      ChunkResult& result = results[index];
      uint32_t crc = 0;
      Int done = 0;
      result.crc = -2;
      while (done < length) {
        const size_t want = static_cast<size_t>(std::min<Int>(kCheckReadBytes, length - done));
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
    if (result.error != 0) throw LoadError(py::OsErrorText(result.error));
    const Int start = static_cast<Int>(failed) * chunk_bytes;
    const Int stop = std::min<Int>(start + chunk_bytes, size) - 1;
    throw LoadError(rows_path + " is damaged: bytes " + py::FormatInt(start) + ".." + py::FormatInt(stop) +
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
    if (got < 0) throw LoadError(py::OsErrorText(errno));
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

// _verify_content: every byte of rows.bin as its description allows.
Content VerifyContent(int fd, const std::string& rows_path, const std::string& meta_path,
                      const Json& meta_json, const Value& meta, int64_t size, int threads) {
  const Value* checksums = py::Find(meta, "checksums");
  if (checksums != nullptr && checksums->kind != Value::Kind::kNone) {
    if (checksums->kind != Value::Kind::kDict) {
      throw LoadError(meta_path + ": 'checksums' is not an object");
    }
    // store_fingerprint: json.dumps({"spec": spec, "checksums": checksums}, sort_keys=True, ...).
    const Json* spec = meta_json.member("spec");
    const std::string canonical =
        "{\"checksums\":" + CanonicalJson(*meta_json.member("checksums")) +
        ",\"spec\":" + (spec != nullptr && spec->is_object() ? CanonicalJson(*spec) : "{}") + "}";
    Content content;
    content.fingerprint = Sha256Hex(canonical);
    const Value* recorded = py::Find(meta, "fingerprint");
    if (recorded != nullptr && recorded->kind != Value::Kind::kNone &&
        !(recorded->kind == Value::Kind::kStr && recorded->text == content.fingerprint)) {
      throw LoadError(meta_path +
                      ": its fingerprint does not match its own spec and checksums (edited by hand?)");
    }
    const double seconds = VerifyChecksums(fd, rows_path, *checksums, size, threads);
    content.verified = true;
    content.check = "CRC-32 of " + std::to_string(py::Iterate(py::Subscript(*checksums, "values")).size()) +
                    " chunk(s) verified (" + Rate(size, seconds) + ")";
    return content;
  }
  const Value* sha256 = py::Find(meta, "sha256");
  if (sha256 != nullptr && py::Truth(*sha256)) {
    const double seconds = VerifySha256(fd, rows_path, py::Str(*sha256), size);
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
  const std::string folder = py::PathText(dir);
  const std::string meta_path = py::JoinPath(folder, kMetaFile);
  const std::string rows_path = py::JoinPath(folder, kRowsFile);
  const std::string text = ReadMeta(folder, meta_path);
  std::string why;
  const std::optional<Json> meta_json = Json::Parse(text, &why);
  if (!meta_json) {
    // json.loads' words where it refuses the text too (it reads NaN and Infinity, which this reader
    // refuses: the reader's words then).
    throw LoadError("cannot read " + meta_path + ": " + py::JsonLoadsError(text).value_or(why));
  }
  const Value meta = py::FromJson(*meta_json);
  const Value* format = py::Find(meta, "format");
  if (meta.kind != Value::Kind::kDict || format == nullptr || !py::Equal(*format, Value::Str(kFormat))) {
    throw LoadError(meta_path + " is not a row store description");
  }
  const Value* version = py::Find(meta, "version");
  if (version == nullptr || !py::Equal(*version, Value::Integer(kFormatVersion))) {
    throw LoadError(meta_path + " has row store format version " +
                    py::Repr(version ? *version : Value::None()) + "; this stage reads version " +
                    std::to_string(kFormatVersion));
  }

  auto store = std::make_unique<Store>();
  store->path = dir;
  std::vector<Int> sizes;
  Int width = 0;
  std::vector<std::pair<Int, Int>> columns;
  try {
    const Value& spec = py::Subscript(meta, "spec");
    for (const Value& size : py::Iterate(py::Subscript(spec, "table_sizes")))
      sizes.push_back(py::ToInt(size));
    width = py::ToInt(py::Subscript(spec, "width"));
    const std::string dtype = py::Str(py::Subscript(spec, "dtype"));
    if (dtype == "float32") {
      store->dtype = StoreDtype::kFloat32;
    } else if (dtype == "float16") {
      store->dtype = StoreDtype::kFloat16;
    } else if (dtype == "int8") {
      store->dtype = StoreDtype::kInt8;
    } else {
      throw py::Exception("ValueError",
                          "dtype " + py::ReprText(dtype) + " is not one of float32, float16, int8");
    }
    columns = StoreColumns(spec, width);
  } catch (const ColumnsError& error) {
    throw LoadError(meta_path + ": " + error.what());
  } catch (const py::Exception& error) {
    throw LoadError(meta_path + ": invalid row store spec (" + error.Described() + ")");
  }

  Int rows = 0;
  for (const Int size : sizes) rows = Add(rows, size, meta_path);
  const bool int8 = store->dtype == StoreDtype::kInt8;
  const Int row_items =
      int8 ? Add(width, Multiply(kInt8ParamBytes, static_cast<Int>(columns.size()), meta_path), meta_path)
           : width;
  const Int item_bytes = int8 ? 1 : store->dtype == StoreDtype::kFloat32 ? 4 : 2;
  const Int expected = Multiply(Multiply(rows, row_items, meta_path), item_bytes, meta_path);

  const int fd = open(rows_path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw LoadError("cannot open " + rows_path + ": " + std::strerror(errno));
  const Descriptor owner(fd);
  struct stat status;
  if (fstat(fd, &status) != 0) throw LoadError(py::OsErrorText(errno));
  const int64_t size = status.st_size;
  const Value* file_bytes = py::Find(meta, "file_bytes");
  if (size != expected || file_bytes == nullptr || !py::Equal(*file_bytes, Value::Integer(expected))) {
    throw LoadError(rows_path + " has " + std::to_string(size) + " bytes, " + kMetaFile + " says " +
                    py::Str(file_bytes ? *file_bytes : Value::None()) + " and its spec needs " +
                    py::FormatInt(expected) + " (truncated, or from another store)");
  }
  store->check = "content not checked";
  if (verify) {
    Content content = VerifyContent(fd, rows_path, meta_path, *meta_json, meta, size, threads);
    store->fingerprint = std::move(content.fingerprint);
    store->verified = content.verified;
    store->check = std::move(content.check);
  }
  if (size == 0) throw LoadError("cannot mmap an empty file");
  // The Python definition reshapes the mapping into rows of row_items: negative counts that multiplied
  // to the file's size fail there.
  if (rows < 0 || row_items < 0) {
    throw LoadError("cannot reshape " + std::to_string(size) + " bytes into " + py::FormatInt(rows) +
                    " rows of " + py::FormatInt(row_items) + " items");
  }
  for (const Int table_size : sizes) store->table_sizes.push_back(ToInt64(table_size, meta_path));
  store->rows = ToInt64(rows, meta_path);
  store->width = ToInt64(width, meta_path);
  for (const auto& [start, stop] : columns) {
    store->columns.emplace_back(ToInt64(start, meta_path), ToInt64(stop, meta_path));
  }
  store->row_bytes = static_cast<size_t>(row_items * item_bytes);
  void* mapped = mmap(nullptr, static_cast<size_t>(size), PROT_READ, MAP_SHARED, fd, 0);
  if (mapped == MAP_FAILED) throw LoadError(py::OsErrorText(errno));
  store->data = static_cast<const uint8_t*>(mapped);
  store->size = static_cast<size_t>(size);
  // A cold lookup then reads one page, not the kernel's read-ahead window.
  madvise(mapped, store->size, MADV_RANDOM);
  return store;
}

}  // namespace stages::embedding
