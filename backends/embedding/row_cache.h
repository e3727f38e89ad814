// The stage's memory tier of cold rows: the middle tier between the dense model's hot rows and the
// row store on disk, as HugeCTR's HPS keeps one in host memory. On by default (cold_cache_bytes).
//
// A warm cold row is a copy in user space, with no system call: the page cache costs a read
// (pread or an io_uring entry) per row even where the row is in memory, and keeps a whole 4 KiB
// page for every row of a few hundred bytes. A miss is read from the store with O_DIRECT (no page
// allocated) and kept. The tier is shared by the instances of one model, in one of two forms:
//
// - whole: where its bytes hold every row of the store, each row has its own place, indexed by its
//   store row; a row once in stays. A lookup is one atomic load and a copy, no lock: a row's place
//   is claimed by one instance, written, then published (readers see it only once it is complete).
// - rows: where they do not, a cache of rows in shards that lock on their own; CLOCK picks the row a
//   full shard gives up (a second chance for every row read since the hand last passed it).
//
// Memory is taken as rows arrive, not at construction.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace stages::embedding {

// The share of the machine's memory a model's tier takes by default, where the store is larger.
inline constexpr uint64_t kDefaultTierShareDivisor = 4;

// The memory this process may use: the machine's, or its cgroup's limit where that is lower
// (cgroup v2's memory.max, v1's memory.limit_in_bytes). 0 where neither can be read.
uint64_t MemoryLimitBytes();

// The tier a model keeps when its config names none: the whole store (`store_bytes`) where it
// fits in a quarter of `memory` (MemoryLimitBytes()), else that quarter; 0 where memory is unknown.
uint64_t DefaultTierBytes(uint64_t store_bytes, uint64_t memory);

class RowCache {
 public:
  // A tier of `bytes` for rows of `row_bytes` of a store of `store_rows` rows: whole where `bytes`
  // holds them all (it then takes store_rows x row_bytes and one byte a row, no more), else
  // floor(bytes / row_bytes) rows in shards (the index adds about 24 bytes a row).
  // Throws LoadError: bytes too small for one row, or memory that cannot be mapped.
  RowCache(uint64_t bytes, size_t row_bytes, uint64_t store_rows);
  ~RowCache();
  RowCache(const RowCache&) = delete;
  RowCache& operator=(const RowCache&) = delete;

  size_t capacity_rows() const { return capacity_rows_; }
  size_t row_bytes() const { return row_bytes_; }
  // Whether every row of the store has its place (Find answers; else Get).
  bool whole() const { return whole_rows_ != nullptr; }

  // The whole tier's bytes of row `key` (a store row), or null where it holds them not yet.
  // Thread-safe, lock-free; the bytes stay valid and unchanged for the tier's life.
  const uint8_t* Find(int64_t key) const {
    if (key < 0 || static_cast<uint64_t>(key) >= store_rows_) return nullptr;
    const size_t row = static_cast<size_t>(key);
    return states_[row].load(std::memory_order_acquire) == kPresent ? whole_rows_ + row * row_bytes_
                                                                    : nullptr;
  }
  // Asks the CPU for the whole tier's state and bytes of row `key` ahead of Find (no effect on a
  // cache of rows, or a key outside the store).
  void Prefetch(int64_t key) const {
    if (whole_rows_ == nullptr || key < 0 || static_cast<uint64_t>(key) >= store_rows_) return;
    const size_t row = static_cast<size_t>(key);
    __builtin_prefetch(&states_[row]);
    const uint8_t* bytes = whole_rows_ + row * row_bytes_;
    for (size_t offset = 0; offset < row_bytes_; offset += kCacheLine) __builtin_prefetch(bytes + offset);
  }
  // Copies row `key` into `out` (row_bytes()) where the tier holds it (and marks it used).
  // Thread-safe.
  bool Get(int64_t key, uint8_t* out);
  // Keeps row `key` (row_bytes() at `row`): a whole tier claims its place once (a row there or
  // being written by another instance keeps its bytes: they are the store's, whoever read them);
  // a full shard gives up a row by CLOCK. Thread-safe.
  void Put(int64_t key, const uint8_t* row);
  // Rows held now (for tests).
  size_t size();

 private:
  class Shard;
  Shard& ShardOf(uint64_t hash) { return *shards_[shards_.size() == 1 ? 0 : hash >> shift_]; }

  // A whole tier's row states: absent, being written by the instance that claimed it, present.
  static constexpr uint8_t kAbsent = 0;
  static constexpr uint8_t kWriting = 1;
  static constexpr uint8_t kPresent = 2;
  static constexpr size_t kCacheLine = 64;

  size_t row_bytes_;
  uint64_t store_rows_;
  size_t capacity_rows_ = 0;
  // The whole tier: every row's place (an anonymous mapping, its pages taken as rows are written).
  uint8_t* whole_rows_ = nullptr;
  size_t whole_bytes_ = 0;
  std::unique_ptr<std::atomic<uint8_t>[]> states_;
  std::atomic<size_t> whole_held_{0};
  // The cache of rows.
  unsigned shift_ = 64;
  std::vector<std::unique_ptr<Shard>> shards_;
};

}  // namespace stages::embedding
