// The four ways of reading cold rows, and their decoding (see cold_reads.h).
#include "cold_reads.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace stages::embedding {

const char* ColdReadName(ColdReadWay way) {
  switch (way) {
    case ColdReadWay::kUring:
      return "io_uring";
    case ColdReadWay::kPrefetch:
      return "prefetch";
    case ColdReadWay::kThreads:
      return "threads";
    case ColdReadWay::kFault:
      return "fault";
  }
  return "io_uring";
}

std::string CacheWayProblem(ColdReadWay way) {
  return way == ColdReadWay::kFault ? "needs cold_reads io_uring, prefetch or threads: 'fault' maps the store"
                                    : "";
}

std::optional<ColdReadWay> ParseColdReadWay(std::string_view name) {
  for (ColdReadWay way : kColdReadWays) {
    if (name == ColdReadName(way)) return way;
  }
  return std::nullopt;
}

uint32_t HalfToFloatBits(uint16_t half) {
  const uint32_t sign = static_cast<uint32_t>(half & 0x8000u) << 16;
  const uint32_t exponent = (half >> 10) & 0x1fu;
  uint32_t mantissa = half & 0x3ffu;
  if (exponent == 0x1fu) return sign | 0x7f800000u | (mantissa << 13);            // inf, NaN (payload kept)
  if (exponent != 0) return sign | ((exponent + 112u) << 23) | (mantissa << 13);  // 127 - 15 = 112
  if (mantissa == 0) return sign;                                                 // a signed zero
  // A subnormal, mantissa * 2^-24: shift its leading one up to the implicit bit's place; each
  // shift lowers the float32 exponent by one from that of 2^-14 (113 biased).
  uint32_t biased = 113;
  while ((mantissa & 0x400u) == 0) {
    mantissa <<= 1;
    --biased;
  }
  return sign | (biased << 23) | ((mantissa & 0x3ffu) << 13);
}

namespace {

// O_DIRECT reads start and end on this boundary, and land in memory aligned to it: the page size,
// a multiple of every block device's logical block here.
constexpr uint64_t kDirectAlign = 4096;
// The most one O_DIRECT read takes when the rows it covers lie side by side.
constexpr uint64_t kMaxDirectBytes = 1 << 20;

// Every float16 pattern's float32 bits (256 KiB, built once, then only read).
const uint32_t* HalfTable() {
  static const std::array<uint32_t, 1 << 16> table = [] {
    std::array<uint32_t, 1 << 16> values{};
    for (uint32_t half = 0; half < values.size(); ++half) {
      values[half] = HalfToFloatBits(static_cast<uint16_t>(half));
    }
    return values;
  }();
  return table.data();
}

}  // namespace

RowDecoder::RowDecoder(const Store& store) : dtype_(store.dtype), width_(static_cast<size_t>(store.width)) {
  for (const auto& [start, stop] : store.columns) {
    columns_.emplace_back(static_cast<size_t>(start), static_cast<size_t>(stop));
  }
  if (columns_.empty()) columns_.emplace_back(0, width_);
  if (dtype_ == StoreDtype::kFloat16) half_ = HalfTable();
}

void RowDecoder::Decode(const uint8_t* raw, float* out) const {
  switch (dtype_) {
    case StoreDtype::kFloat32:
      std::memcpy(out, raw, width_ * sizeof(float));
      return;
    case StoreDtype::kFloat16:
      for (size_t index = 0; index < width_; ++index) {
        uint16_t half = 0;
        std::memcpy(&half, raw + 2 * index, sizeof(half));
        std::memcpy(out + index, &half_[half], sizeof(float));
      }
      return;
    case StoreDtype::kInt8: {
      // The codes, then each column's scale and bias (little-endian float32). numpy computes
      // `values *= scale` then `values += bias`: two roundings, never a fused multiply-add
      // (this file is compiled with -ffp-contract=off).
      const uint8_t* params = raw + width_;
      for (size_t column = 0; column < columns_.size(); ++column) {
        float scale = 0;
        float bias = 0;
        std::memcpy(&scale, params + 8 * column, sizeof(float));
        std::memcpy(&bias, params + 8 * column + 4, sizeof(float));
        for (size_t index = columns_[column].first; index < columns_[column].second; ++index) {
          const float scaled = static_cast<float>(raw[index]) * scale;
          out[index] = scaled + bias;
        }
      }
      return;
    }
  }
}

// A fixed pool of threads that run the shares of one request at a time.
class ReadPool {
 public:
  explicit ReadPool(size_t threads) {
    try {
      for (size_t index = 0; index < threads; ++index) threads_.emplace_back([this] { Work(); });
    } catch (...) {
      Stop();
      throw;
    }
  }
  ~ReadPool() { Stop(); }

  // Runs task(i) for every i < count on the pool's threads and the calling one; returns when all
  // are done, rethrowing the first failure.
  void Run(size_t count, const std::function<void(size_t)>& task) {
    if (count == 0) return;
    std::unique_lock<std::mutex> lock(mutex_);
    task_ = &task;
    next_ = 0;
    finished_ = 0;
    count_ = count;
    failure_ = nullptr;
    wake_.notify_all();
    while (next_ < count_) RunOne(lock);
    done_.wait(lock, [this] { return finished_ == count_; });
    count_ = next_ = finished_ = 0;
    task_ = nullptr;
    if (failure_) std::rethrow_exception(std::exchange(failure_, nullptr));
  }

 private:
  void Work() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      wake_.wait(lock, [this] { return stop_ || next_ < count_; });
      if (stop_) return;
      RunOne(lock);
    }
  }

  // Takes the next task and runs it with the lock released (held on entry and on return).
  void RunOne(std::unique_lock<std::mutex>& lock) {
    const size_t index = next_++;
    const std::function<void(size_t)>* task = task_;
    lock.unlock();
    std::exception_ptr failure;
    try {
      (*task)(index);
    } catch (...) {
      failure = std::current_exception();
    }
    lock.lock();
    if (failure && !failure_) failure_ = failure;
    if (++finished_ == count_) done_.notify_all();
  }

  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    for (std::thread& thread : threads_) thread.join();
    threads_.clear();
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  const std::function<void(size_t)>* task_ = nullptr;
  size_t next_ = 0;
  size_t count_ = 0;
  size_t finished_ = 0;
  std::exception_ptr failure_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

void ColdReads::FreeBuffer::operator()(uint8_t* buffer) const { std::free(buffer); }

ColdReads::ColdReads(const Store& store, ColdReadWay way, int64_t threads, int64_t hint_rows,
                     unsigned ring_entries, RowCache* cache, int64_t copy_threads)
    : store_(store), way_(way), threads_(threads), hint_rows_(hint_rows), decoder_(store), cache_(cache) {
  if (threads < 1) throw LoadError("cold read threads must be >= 1, got " + std::to_string(threads));
  if (copy_threads < 1)
    throw LoadError("tier copy threads must be >= 1, got " + std::to_string(copy_threads));
  if (hint_rows < 0) throw LoadError("cold read hint rows must be >= 0, got " + std::to_string(hint_rows));
  if (cache != nullptr && !CacheWayProblem(way).empty())
    throw LoadError("a cold row cache " + CacheWayProblem(way));
  if (cache != nullptr && cache->row_bytes() != store.row_bytes) {
    throw LoadError("a cold row cache of rows of " + std::to_string(cache->row_bytes()) +
                    " bytes cannot hold this store's rows of " + std::to_string(store.row_bytes));
  }
  const long page = sysconf(_SC_PAGESIZE);
  page_bytes_ = page > 0 ? static_cast<size_t>(page) : 4096;
  if (way == ColdReadWay::kUring) {
    try {
      ring_ = std::make_unique<Ring>(ring_entries);
    } catch (const RingUnavailable& error) {
      fallback_ = std::string(error.what()) + "; cold rows are read the 'prefetch' way";
    }
  }
  if (way != ColdReadWay::kFault) {
    const std::string rows_path = store.path + "/rows.bin";
    fd_ = open(rows_path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) throw LoadError("cannot open " + rows_path + ": " + ErrnoText(errno));
    // A read that finds its page uncached (its hint not yet acted on) reads that page, not the
    // kernel's read-ahead window around it.
    posix_fadvise(fd_, 0, 0, POSIX_FADV_RANDOM);
    if (cache != nullptr) OpenDirect(rows_path);
  }
  if (cache != nullptr && cache->whole() && copy_threads > 1) {
    try {
      copy_pool_ = std::make_unique<ReadPool>(static_cast<size_t>(copy_threads - 1));
    } catch (const std::exception& error) {
      if (fd_ >= 0) close(fd_);
      if (direct_fd_ >= 0) close(direct_fd_);
      throw LoadError("cannot start " + std::to_string(copy_threads - 1) +
                      " tier copy threads: " + error.what());
    }
    copy_shares_ = static_cast<size_t>(copy_threads);
    share_misses_.resize(copy_shares_);
    share_places_.resize(copy_shares_);
  }
  if (way == ColdReadWay::kThreads) {
    try {
      pool_ = std::make_unique<ReadPool>(static_cast<size_t>(threads));
    } catch (const std::exception& error) {
      close(fd_);
      throw LoadError("cannot start " + std::to_string(threads) + " cold read threads: " + error.what());
    }
  }
}

ColdReads::~ColdReads() {
  copy_pool_.reset();
  pool_.reset();
  ring_.reset();
  if (fd_ >= 0) close(fd_);
  if (direct_fd_ >= 0) close(direct_fd_);
}

void ColdReads::OpenDirect(const std::string& rows_path) {
  if (ring_ == nullptr) {
    direct_ = "through the page cache (O_DIRECT reads go through io_uring, and the way is " +
              std::string(way_ == ColdReadWay::kUring ? "prefetch" : ColdReadName(way_)) + ")";
    return;
  }
  const int fd = open(rows_path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
  if (fd < 0) {
    direct_ = "through the page cache (the file system refuses O_DIRECT: " + ErrnoText(errno) + ")";
    return;
  }
  // A file system may take the flag and refuse the reads (or want another alignment): one
  // aligned read of the first block tells.
  direct_buffer_.reset(static_cast<uint8_t*>(std::aligned_alloc(kDirectAlign, kDirectAlign)));
  if (!direct_buffer_) throw LoadError("cannot allocate an aligned buffer for O_DIRECT reads");
  direct_capacity_ = kDirectAlign;
  const ssize_t got = pread(fd, direct_buffer_.get(), kDirectAlign, 0);
  if (got < 0) {
    direct_ = "through the page cache (an O_DIRECT read failed: " + ErrnoText(errno) + ")";
    close(fd);
    return;
  }
  direct_fd_ = fd;
  direct_ = "with O_DIRECT";
}

void ColdReads::Distinct(const int64_t* keys, size_t count) {
  // Each key's first place in an open-addressing table (twice the keys' slots, a power of two),
  // then only the distinct keys sorted: a request's lookups repeat rows far more often than not.
  size_t capacity = 16;
  while (capacity < 2 * count) capacity *= 2;
  const size_t mask = capacity - 1;
  table_keys_.assign(capacity, -1);  // keys are store rows, never negative
  table_slots_.resize(capacity);
  inverse_.resize(count);
  distinct_.clear();
  for (size_t index = 0; index < count; ++index) {
    const int64_t key = keys[index];
    // Fibonacci hashing: adjacent rows spread over the table.
    size_t slot = static_cast<size_t>((static_cast<uint64_t>(key) * 0x9e3779b97f4a7c15ull) >> 20) & mask;
    while (table_keys_[slot] != -1 && table_keys_[slot] != key) slot = (slot + 1) & mask;
    if (table_keys_[slot] == -1) {
      table_keys_[slot] = key;
      table_slots_[slot] = distinct_.size();
      distinct_.push_back(key);
    }
    inverse_[index] = table_slots_[slot];
  }
  // Ascending: the distinct keys sorted, and each key's place renumbered.
  order_.resize(distinct_.size());
  for (size_t index = 0; index < distinct_.size(); ++index) order_[index] = {distinct_[index], index};
  std::sort(order_.begin(), order_.end());
  renumber_.resize(order_.size());
  for (size_t rank = 0; rank < order_.size(); ++rank) {
    distinct_[rank] = order_[rank].first;
    renumber_[order_[rank].second] = rank;
  }
  for (size_t index = 0; index < count; ++index) inverse_[index] = renumber_[inverse_[index]];
}

size_t ColdReads::Hint(const std::vector<int64_t>& keys) {
  // Runs of whole pages the distinct rows (ascending) lie on: a row across a page boundary takes
  // both pages, and rows on the same or adjacent pages share a run (hot_cold_lookup.page_runs).
  const size_t row_bytes = store_.row_bytes;
  size_t hints = 0;
  size_t run_first = 0;
  size_t run_last = 0;
  for (size_t index = 0; index < keys.size(); ++index) {
    const size_t start = static_cast<size_t>(keys[index]) * row_bytes;
    const size_t first = start / page_bytes_;
    const size_t last = (start + row_bytes - 1) / page_bytes_;
    if (index > 0 && first <= run_last + 1) {
      run_last = std::max(run_last, last);
      continue;
    }
    if (index > 0) {
      posix_fadvise(fd_, static_cast<off_t>(run_first * page_bytes_),
                    static_cast<off_t>((run_last - run_first + 1) * page_bytes_), POSIX_FADV_WILLNEED);
      ++hints;
    }
    run_first = first;
    run_last = last;
  }
  if (!keys.empty()) {
    posix_fadvise(fd_, static_cast<off_t>(run_first * page_bytes_),
                  static_cast<off_t>((run_last - run_first + 1) * page_bytes_), POSIX_FADV_WILLNEED);
    ++hints;
  }
  return hints;
}

void ColdReads::MakeSpans(const std::vector<int64_t>& keys) {
  spans_.clear();
  for (size_t index = 0; index < keys.size(); ++index) {
    if (!spans_.empty() && keys[index] == keys[index - 1] + 1) {
      ++spans_.back().count;
    } else {
      spans_.push_back({index, static_cast<uint64_t>(keys[index]) * store_.row_bytes, 1});
    }
  }
}

void ColdReads::ReadSpans(size_t first, size_t last, uint8_t* rows) {
  const size_t row_bytes = store_.row_bytes;
  for (size_t span = first; span < last; ++span) {
    const Span& read = spans_[span];
    const size_t want = read.count * row_bytes;
    uint8_t* out = rows + read.index * row_bytes;
    size_t got = 0;
    int error = 0;
    while (got < want) {
      const ssize_t step = pread(fd_, out + got, want - got, static_cast<off_t>(read.offset + got));
      if (step < 0 && errno == EINTR) continue;
      if (step < 0) error = errno;
      if (step <= 0) break;
      got += static_cast<size_t>(step);
    }
    if (got != want) {
      throw ReadError("short read of the row store: " + std::to_string(got) + " of " + std::to_string(want) +
                      " bytes at offset " + std::to_string(read.offset) +
                      (error != 0 ? " (" + ErrnoText(error) + ")" : ""));
    }
  }
}

size_t ColdReads::ReadKeys(const std::vector<int64_t>& keys, uint8_t* out) {
  const size_t row_bytes = store_.row_bytes;
  if (direct_fd_ >= 0) return ReadDirect(keys, out);
  if (way_ == ColdReadWay::kThreads) {
    MakeSpans(keys);
    const size_t shares = std::min(static_cast<size_t>(threads_), spans_.size());
    bounds_.resize(shares + 1);
    for (size_t share = 0; share <= shares; ++share) bounds_[share] = share * spans_.size() / shares;
    pool_->Run(shares, [this, out](size_t share) { ReadSpans(bounds_[share], bounds_[share + 1], out); });
    return spans_.size();
  }
  if (ring_ != nullptr) {
    const size_t hints = keys.size() <= static_cast<uint64_t>(hint_rows_) ? Hint(keys) : 0;
    ring_->ReadRows(fd_, keys.data(), keys.size(), row_bytes, out);
    return hints + (keys.size() + ring_->entries() - 1) / ring_->entries();
  }
  const size_t hints = Hint(keys);
  MakeSpans(keys);
  ReadSpans(0, spans_.size(), out);
  return hints + spans_.size();
}

size_t ColdReads::ReadDirect(const std::vector<int64_t>& keys, uint8_t* out) {
  // Each row's aligned blocks; rows whose blocks touch or overlap share one read.
  const uint64_t row_bytes = store_.row_bytes;
  block_offsets_.clear();
  block_lengths_.clear();
  key_blocks_.resize(keys.size());
  for (size_t index = 0; index < keys.size(); ++index) {
    const uint64_t start = static_cast<uint64_t>(keys[index]) * row_bytes;
    const uint64_t first = start / kDirectAlign * kDirectAlign;
    const uint64_t end = (start + row_bytes + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
    const uint64_t last_end = block_offsets_.empty() ? 0 : block_offsets_.back() + block_lengths_.back();
    if (!block_offsets_.empty() && first <= last_end && end - block_offsets_.back() <= kMaxDirectBytes) {
      block_lengths_.back() = static_cast<uint32_t>(std::max(last_end, end) - block_offsets_.back());
    } else {
      block_offsets_.push_back(first);
      block_lengths_.push_back(static_cast<uint32_t>(end - first));
    }
    key_blocks_[index] = block_offsets_.size() - 1;
  }
  uint64_t total = 0;
  for (const uint32_t length : block_lengths_) total += length;
  if (total > direct_capacity_) {
    direct_buffer_.reset(static_cast<uint8_t*>(std::aligned_alloc(kDirectAlign, total)));
    direct_capacity_ = direct_buffer_ ? total : 0;
    if (!direct_buffer_)
      throw ReadError("cannot allocate " + std::to_string(total) + " bytes for O_DIRECT reads");
  }
  const size_t count = block_offsets_.size();
  block_addresses_.resize(count);
  block_results_.resize(count);
  uint8_t* address = direct_buffer_.get();
  for (size_t index = 0; index < count; ++index) {
    block_addresses_[index] = address;
    address += block_lengths_[index];
  }
  ring_->Read(direct_fd_, block_offsets_.data(), block_addresses_.data(), block_lengths_.data(), count,
              block_results_.data());
  for (size_t index = 0; index < keys.size(); ++index) {
    const size_t block = key_blocks_[index];
    const uint64_t start = static_cast<uint64_t>(keys[index]) * row_bytes;
    const int64_t got = block_results_[block];
    if (got < 0) {
      throw ReadError(ErrnoText(static_cast<int>(-got)) + " (an O_DIRECT read of " +
                      std::to_string(block_lengths_[block]) + " bytes at offset " +
                      std::to_string(block_offsets_[block]) + ")");
    }
    // Short only at the file's end: a store cut shorter than its rows.
    if (static_cast<uint64_t>(got) < start + row_bytes - block_offsets_[block]) {
      throw ReadError("short read: " + std::to_string(got) + " of " + std::to_string(block_lengths_[block]) +
                      " bytes at offset " + std::to_string(block_offsets_[block]) + " (end of file?)");
    }
    std::memcpy(out + index * row_bytes, block_addresses_[block] + (start - block_offsets_[block]),
                row_bytes);
  }
  return (count + ring_->entries() - 1) / ring_->entries();
}

void ColdReads::Read(const int64_t* keys, size_t count, float* out) {
  last_rows_ = last_reads_ = last_hits_ = last_misses_ = 0;
  if (count == 0) return;
  const size_t width = decoder_.width();
  const size_t row_bytes = store_.row_bytes;
  for (size_t index = 0; index < count; ++index) {
    if (keys[index] < 0 || keys[index] >= store_.rows) {
      throw ReadError("row " + std::to_string(keys[index]) + " is outside the row store (0.." +
                      std::to_string(store_.rows - 1) + ")");
    }
  }
  if (way_ == ColdReadWay::kFault) {
    // Rows in memory: one gather in request order.
    for (size_t index = 0; index < count; ++index) {
      decoder_.Decode(store_.data + static_cast<size_t>(keys[index]) * row_bytes, out + index * width);
    }
    Distinct(keys, count);
    last_rows_ = distinct_.size();
    return;
  }
  if (cache_ != nullptr) {
    ReadThroughTier(keys, count, out);
    return;
  }
  Distinct(keys, count);
  raw_.resize(distinct_.size() * row_bytes);
  last_rows_ = distinct_.size();
  last_reads_ = ReadKeys(distinct_, raw_.data());
  for (size_t index = 0; index < count; ++index) {
    decoder_.Decode(raw_.data() + inverse_[index] * row_bytes, out + index * width);
  }
}

void ColdReads::CopyFromTier(const int64_t* keys, size_t first, size_t last, float* out,
                             std::vector<int64_t>* misses, std::vector<size_t>* places) const {
  const size_t width = decoder_.width();
  // The rows asked for a few lookups ahead: their loads from memory overlap.
  constexpr size_t kAhead = 8;
  for (size_t index = first; index < std::min(last, first + kAhead); ++index) cache_->Prefetch(keys[index]);
  for (size_t index = first; index < last; ++index) {
    if (index + kAhead < last) cache_->Prefetch(keys[index + kAhead]);
    if (const uint8_t* row = cache_->Find(keys[index])) {
      decoder_.Decode(row, out + index * width);
      continue;
    }
    misses->push_back(keys[index]);
    places->push_back(index);
  }
}

void ColdReads::ReadThroughTier(const int64_t* keys, size_t count, float* out) {
  const size_t width = decoder_.width();
  const size_t row_bytes = store_.row_bytes;
  // Each lookup the tier holds straight into its place in `out` (float32 rows are their values:
  // copied, not decoded); the others noted, then read together.
  misses_.clear();
  miss_places_.clear();
  const bool copies = decoder_.copies();
  scratch_row_.resize(row_bytes);
  if (cache_->whole() && copy_pool_ != nullptr && count >= kParallelTierLookups) {
    // A large request in contiguous shares, one a thread; the misses joined in the keys' order.
    const size_t shares = copy_shares_;
    copy_pool_->Run(shares, [&](size_t share) {
      share_misses_[share].clear();
      share_places_[share].clear();
      CopyFromTier(keys, share * count / shares, (share + 1) * count / shares, out, &share_misses_[share],
                   &share_places_[share]);
    });
    for (size_t share = 0; share < shares; ++share) {
      misses_.insert(misses_.end(), share_misses_[share].begin(), share_misses_[share].end());
      miss_places_.insert(miss_places_.end(), share_places_[share].begin(), share_places_[share].end());
    }
  } else if (cache_->whole()) {
    CopyFromTier(keys, 0, count, out, &misses_, &miss_places_);
  } else {
    for (size_t index = 0; index < count; ++index) {
      float* place = out + index * width;
      if (copies) {
        if (cache_->Get(keys[index], reinterpret_cast<uint8_t*>(place))) continue;
      } else if (cache_->Get(keys[index], scratch_row_.data())) {
        decoder_.Decode(scratch_row_.data(), place);
        continue;
      }
      misses_.push_back(keys[index]);
      miss_places_.push_back(index);
    }
  }
  last_hits_ = count - misses_.size();
  last_misses_ = misses_.size();
  if (misses_.empty()) return;
  // The misses' distinct rows, ascending, read at once, kept, then decoded into their places.
  Distinct(misses_.data(), misses_.size());
  miss_raw_.resize(distinct_.size() * row_bytes);
  last_rows_ = distinct_.size();
  last_reads_ = ReadKeys(distinct_, miss_raw_.data());
  for (size_t row = 0; row < distinct_.size(); ++row)
    cache_->Put(distinct_[row], miss_raw_.data() + row * row_bytes);
  for (size_t miss = 0; miss < misses_.size(); ++miss) {
    decoder_.Decode(miss_raw_.data() + inverse_[miss] * row_bytes, out + miss_places_[miss] * width);
  }
}

}  // namespace stages::embedding
