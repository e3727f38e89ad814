// The four ways of reading cold rows, and their decoding (see cold_reads.h).
#include "cold_reads.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace stages::embedding {

const char* ColdReadName(ColdReadWay way) {
  switch (way) {
    case ColdReadWay::kUring: return "io_uring";
    case ColdReadWay::kPrefetch: return "prefetch";
    case ColdReadWay::kThreads: return "threads";
    case ColdReadWay::kFault: return "fault";
  }
  return "io_uring";
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
    case StoreDtype::kFloat32: std::memcpy(out, raw, width_ * sizeof(float)); return;
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

  // Runs task(i) for every i < count on the pool's threads; returns when all are done, rethrowing
  // the first failure.
  void Run(size_t count, const std::function<void(size_t)>& task) {
    if (count == 0) return;
    std::unique_lock<std::mutex> lock(mutex_);
    task_ = &task;
    next_ = 0;
    finished_ = 0;
    count_ = count;
    failure_ = nullptr;
    wake_.notify_all();
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

ColdReads::ColdReads(const Store& store, ColdReadWay way, int64_t threads, int64_t hint_rows,
                     unsigned ring_entries)
    : store_(store), way_(way), threads_(threads), hint_rows_(hint_rows), decoder_(store) {
  if (threads < 1) throw LoadError("cold read threads must be >= 1, got " + std::to_string(threads));
  if (hint_rows < 0) throw LoadError("cold read hint rows must be >= 0, got " + std::to_string(hint_rows));
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
  pool_.reset();
  ring_.reset();
  if (fd_ >= 0) close(fd_);
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

size_t ColdReads::Hint() {
  // Runs of whole pages the distinct rows (ascending) lie on: a row across a page boundary takes
  // both pages, and rows on the same or adjacent pages share a run (hot_cold_lookup.page_runs).
  const size_t row_bytes = store_.row_bytes;
  size_t hints = 0;
  size_t run_first = 0;
  size_t run_last = 0;
  for (size_t index = 0; index < distinct_.size(); ++index) {
    const size_t start = static_cast<size_t>(distinct_[index]) * row_bytes;
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
  if (!distinct_.empty()) {
    posix_fadvise(fd_, static_cast<off_t>(run_first * page_bytes_),
                  static_cast<off_t>((run_last - run_first + 1) * page_bytes_), POSIX_FADV_WILLNEED);
    ++hints;
  }
  return hints;
}

void ColdReads::MakeSpans() {
  spans_.clear();
  for (size_t index = 0; index < distinct_.size(); ++index) {
    if (!spans_.empty() && distinct_[index] == distinct_[index - 1] + 1) {
      ++spans_.back().count;
    } else {
      spans_.push_back({index, static_cast<uint64_t>(distinct_[index]) * store_.row_bytes, 1});
    }
  }
}

void ColdReads::ReadSpans(size_t first, size_t last) {
  const size_t row_bytes = store_.row_bytes;
  for (size_t span = first; span < last; ++span) {
    const Span& read = spans_[span];
    const size_t want = read.count * row_bytes;
    uint8_t* out = raw_.data() + read.index * row_bytes;
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

void ColdReads::Read(const int64_t* keys, size_t count, float* out) {
  last_rows_ = last_reads_ = 0;
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
  Distinct(keys, count);
  raw_.resize(distinct_.size() * row_bytes);
  last_rows_ = distinct_.size();
  if (way_ == ColdReadWay::kThreads) {
    MakeSpans();
    const size_t shares = std::min(static_cast<size_t>(threads_), spans_.size());
    bounds_.resize(shares + 1);
    for (size_t share = 0; share <= shares; ++share) bounds_[share] = share * spans_.size() / shares;
    pool_->Run(shares, [this](size_t share) { ReadSpans(bounds_[share], bounds_[share + 1]); });
    last_reads_ = spans_.size();
  } else if (ring_ != nullptr) {
    const size_t hints = distinct_.size() <= static_cast<uint64_t>(hint_rows_) ? Hint() : 0;
    ring_->ReadRows(fd_, distinct_.data(), distinct_.size(), row_bytes, raw_.data());
    last_reads_ = hints + (distinct_.size() + ring_->entries() - 1) / ring_->entries();
  } else {
    const size_t hints = Hint();
    MakeSpans();
    ReadSpans(0, spans_.size());
    last_reads_ = hints + spans_.size();
  }
  for (size_t index = 0; index < count; ++index) {
    decoder_.Decode(raw_.data() + inverse_[index] * row_bytes, out + index * width);
  }
}

}  // namespace stages::embedding
