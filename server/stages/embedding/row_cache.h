// The stage's own cache of cold rows: the middle tier between the dense model's hot rows and the
// row store on disk, as HugeCTR's HPS keeps one in host memory.
//
// The page cache keeps a whole 4 KiB page for every row of a few hundred bytes it has read, and
// pays for a page's allocation, its LRU and its memory-cgroup charge on every read that misses.
// This cache keeps the rows themselves: the same memory holds 16 times the rows of 256 bytes, a
// miss is read from the store with O_DIRECT (no page allocated), and a hit is a copy in user space,
// no system call. It is shared by the instances of one model; CLOCK picks the row a full cache
// gives up (a second chance for every row read since the hand last passed it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace stages::embedding {

class RowCache {
 public:
  // Holds floor(bytes / row_bytes) rows of `row_bytes`, in shards that lock on their own (its
  // index adds about 24 bytes a row). Memory is taken as rows arrive, not at construction.
  // Throws LoadError: bytes too small for one row.
  RowCache(uint64_t bytes, size_t row_bytes);
  ~RowCache();
  RowCache(const RowCache&) = delete;
  RowCache& operator=(const RowCache&) = delete;

  size_t capacity_rows() const { return capacity_rows_; }
  size_t row_bytes() const { return row_bytes_; }

  // Copies row `key` into `out` (row_bytes()) and marks it used, where the cache holds it.
  // Thread-safe.
  bool Get(int64_t key, uint8_t* out);
  // Keeps row `key` (row_bytes() at `row`); a full shard gives up a row by CLOCK. A key it holds
  // already keeps its bytes (they are the store's, whoever read them). Thread-safe.
  void Put(int64_t key, const uint8_t* row);
  // Rows held now (for tests).
  size_t size();

 private:
  class Shard;
  Shard& ShardOf(uint64_t hash) { return *shards_[shards_.size() == 1 ? 0 : hash >> shift_]; }

  size_t row_bytes_;
  size_t capacity_rows_ = 0;
  unsigned shift_ = 64;
  std::vector<std::unique_ptr<Shard>> shards_;
};

}  // namespace stages::embedding
