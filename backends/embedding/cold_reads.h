// How the embedding stage reads a request's cold rows from the row store, and turns them into
// float32 values: the C++ side of hot_cold_lookup.ColdReads, with its four ways and its bytes.
//
// - io_uring (the default): the request's distinct rows, ascending, one read each, all given to
//   the kernel by io_uring_enter (uring.h); a request of at most `hint_rows` distinct rows first
//   hints each run of pages (posix_fadvise WILLNEED). Where the kernel refuses a ring, the
//   prefetch way, and fallback() says why.
// - prefetch: a hint per run of pages, then one pread per span of adjacent rows, in file order.
// - threads: the spans of adjacent rows read by a fixed pool of `threads` threads, each a
//   contiguous share.
// - fault: a gather from the mapping in request order (page faults do the reading).
//
// All give the same values: the rows of the keys, in the keys' order, as float32; a row asked for
// twice in one request is read once. A read that fails or comes back short throws ReadError (an
// INTERNAL error of that request), never anything worse.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "row_cache.h"
#include "store.h"
#include "uring.h"

namespace stages::embedding {

enum class ColdReadWay { kUring, kPrefetch, kThreads, kFault };

// The config's names of the ways, in hot_cold_lookup.COLD_READS's order.
inline constexpr ColdReadWay kColdReadWays[] = {ColdReadWay::kUring, ColdReadWay::kPrefetch,
                                                ColdReadWay::kThreads, ColdReadWay::kFault};
const char* ColdReadName(ColdReadWay way);
std::optional<ColdReadWay> ParseColdReadWay(std::string_view name);
// Why a cache of cold rows cannot go with `way`, for the end of a sentence about the cache ("" : it
// can): the fault way maps the store, which is its own cache.
std::string CacheWayProblem(ColdReadWay way);

inline constexpr int64_t kDefaultColdReadThreads = 8;
// Threads that copy a large request's rows out of a whole memory tier (the instance's own thread
// one of them): the rows lie anywhere in memory, and one thread waits on each load in turn where
// several overlap theirs. Only a request of at least kParallelTierLookups lookups is shared out.
inline constexpr int64_t kDefaultTierCopyThreads = 2;
inline constexpr size_t kParallelTierLookups = 4096;
// Measured by `python -m lab cold-reads` (hot_cold_lookup.DEFAULT_COLD_READ_HINT_ROWS).
inline constexpr int64_t kDefaultColdReadHintRows = 256;

// The float32 bits of a float16 value as numpy's astype gives them: exact, subnormals included,
// infinities kept, and a NaN's sign and payload kept (a signaling NaN stays signaling).
uint32_t HalfToFloatBits(uint16_t half);

// Store rows (float32, float16 or int8 bytes) as float32 values, bit for bit as
// hot_cold_lookup.StoreRows.decode: a copy, numpy's float16 cast, or dequantize_rows's
// `code * scale + bias` per column (a float32 product rounded, then a float32 sum rounded).
class RowDecoder {
 public:
  explicit RowDecoder(const Store& store);
  size_t width() const { return width_; }
  // One row of store bytes into `width()` values.
  void Decode(const uint8_t* raw, float* out) const;
  // Whether a row's bytes are its values (float32): decoding is a copy.
  bool copies() const { return dtype_ == StoreDtype::kFloat32; }

 private:
  StoreDtype dtype_;
  size_t width_;
  std::vector<std::pair<size_t, size_t>> columns_;
  const uint32_t* half_ = nullptr;  // every float16 pattern's float32 bits
};

class ReadPool;

class ColdReads {
 public:
  // Opens rows.bin of `store` (with POSIX_FADV_RANDOM) for every way but fault, the ring for
  // io_uring (or the fallback), the threads for threads. Throws LoadError: the file cannot be
  // opened, fewer than one thread, a negative hint_rows, or threads that cannot start.
  // `ring_entries`: the ring's size (tests take a small ring through its turns, or one the kernel
  // refuses, to see the fallback). `cache`: the model's cache of cold rows (null: none), which
  // every instance shares and which outlives them; with it the io_uring way reads the rows it
  // misses with O_DIRECT, past the page cache, where the file system allows (direct() says).
  // Throws LoadError also for a cache with the fault way (the mapping is its own cache).
  // `copy_threads`: kDefaultTierCopyThreads's threads for a whole tier (1: the instance's alone).
  ColdReads(const Store& store, ColdReadWay way, int64_t threads = kDefaultColdReadThreads,
            int64_t hint_rows = kDefaultColdReadHintRows, unsigned ring_entries = Ring::kDefaultEntries,
            RowCache* cache = nullptr, int64_t copy_threads = kDefaultTierCopyThreads);
  ~ColdReads();
  ColdReads(const ColdReads&) = delete;
  ColdReads& operator=(const ColdReads&) = delete;

  // Why io_uring reads the prefetch way here ("" : it does not).
  const std::string& fallback() const { return fallback_; }
  // How the rows a cache misses are read, in words ("" : no cache): with O_DIRECT, or through
  // the page cache and why.
  const std::string& direct() const { return direct_; }
  size_t width() const { return decoder_.width(); }

  // The rows `keys[0..count)` (store rows, any order, repeats allowed) as `count x width()`
  // float32 into `out`, in the keys' order. Not thread-safe: one instance's thread calls it.
  // Throws ReadError.
  void Read(const int64_t* keys, size_t count, float* out);

  // What the last Read did, as hot_cold_lookup.PendingRows counts it: distinct rows read from
  // the store, and system calls issued (hints and preads, hints and io_uring_enter calls, 0 for
  // fault); and with a memory tier, the lookups whose rows it held (copied, no system call) and
  // those whose rows were read from the store (hits + misses: every cold lookup).
  size_t last_rows() const { return last_rows_; }
  size_t last_reads() const { return last_reads_; }
  size_t last_hits() const { return last_hits_; }
  size_t last_misses() const { return last_misses_; }

 private:
  // One read of `count` adjacent rows at byte `offset`, into the distinct rows from `index`.
  struct Span {
    size_t index;
    uint64_t offset;
    size_t count;
  };
  size_t Hint(const std::vector<int64_t>& keys);
  void MakeSpans(const std::vector<int64_t>& keys);
  void ReadSpans(size_t first, size_t last, uint8_t* out);
  void Distinct(const int64_t* keys, size_t count);
  // Read with a memory tier: its rows copied, the rest read (the way's reads of the distinct
  // misses) and kept.
  void ReadThroughTier(const int64_t* keys, size_t count, float* out);
  // The whole tier's rows of keys[first..last) into their places in `out`; the others noted in
  // `misses` and `places` (their indices).
  void CopyFromTier(const int64_t* keys, size_t first, size_t last, float* out, std::vector<int64_t>* misses,
                    std::vector<size_t>* places) const;
  // The rows `keys` (distinct, ascending) into out (row_bytes each), the way's reads; the
  // system calls they took.
  size_t ReadKeys(const std::vector<int64_t>& keys, uint8_t* out);
  size_t ReadDirect(const std::vector<int64_t>& keys, uint8_t* out);
  void OpenDirect(const std::string& rows_path);

  const Store& store_;
  ColdReadWay way_;
  int64_t threads_;
  int64_t hint_rows_;
  RowDecoder decoder_;
  size_t page_bytes_;
  int fd_ = -1;
  std::unique_ptr<Ring> ring_;
  std::unique_ptr<ReadPool> pool_;
  // The threads besides the instance's that copy a large request from a whole tier (null: none).
  std::unique_ptr<ReadPool> copy_pool_;
  size_t copy_shares_ = 1;
  std::string fallback_;
  RowCache* cache_ = nullptr;
  int direct_fd_ = -1;
  std::string direct_;
  size_t last_rows_ = 0;
  size_t last_reads_ = 0;
  size_t last_hits_ = 0;
  size_t last_misses_ = 0;
  // Scratch reused by every request.
  std::vector<int64_t> table_keys_;
  std::vector<size_t> table_slots_;
  std::vector<std::pair<int64_t, size_t>> order_;
  std::vector<size_t> renumber_;
  std::vector<int64_t> distinct_;
  std::vector<size_t> inverse_;
  std::vector<uint8_t> raw_;
  std::vector<Span> spans_;
  std::vector<size_t> bounds_;
  std::vector<int64_t> misses_;
  std::vector<size_t> miss_places_;
  std::vector<std::vector<int64_t>> share_misses_;
  std::vector<std::vector<size_t>> share_places_;
  std::vector<uint8_t> miss_raw_;
  std::vector<uint8_t> scratch_row_;
  // The O_DIRECT reads of a request: aligned byte ranges, each covering one or more rows.
  std::vector<size_t> key_blocks_;
  std::vector<uint64_t> block_offsets_;
  std::vector<uint8_t*> block_addresses_;
  std::vector<uint32_t> block_lengths_;
  std::vector<int64_t> block_results_;
  struct FreeBuffer {
    void operator()(uint8_t* buffer) const;
  };
  std::unique_ptr<uint8_t, FreeBuffer> direct_buffer_;
  size_t direct_capacity_ = 0;
};

}  // namespace stages::embedding
