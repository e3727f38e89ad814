// The stage's memory tier of cold rows (see row_cache.h).
#include "row_cache.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>

#include "store.h"
#include "uring.h"

namespace stages::embedding {

namespace {

constexpr int64_t kEmpty = -1;  // keys are store rows, never negative
constexpr size_t kMaxShards = 64;

uint64_t Hash(int64_t key) { return static_cast<uint64_t>(key) * 0x9e3779b97f4a7c15ull; }

// The number in the first line of `path` (a cgroup's limit), or 0: absent, "max", or not a number.
uint64_t LimitIn(const char* path) {
  std::ifstream file(path);
  std::string text;
  if (!file || !std::getline(file, text) || text.empty()) return 0;
  uint64_t value = 0;
  for (const char digit : text) {
    if (digit < '0' || digit > '9' || value > (UINT64_MAX - 9) / 10) return 0;
    value = value * 10 + static_cast<uint64_t>(digit - '0');
  }
  return value;
}

}  // namespace

uint64_t MemoryLimitBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGESIZE);
  uint64_t memory = pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : 0;
  for (const char* path : {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    const uint64_t limit = LimitIn(path);
    if (limit > 0 && (memory == 0 || limit < memory)) memory = limit;
  }
  return memory;
}

uint64_t DefaultTierBytes(uint64_t store_bytes, uint64_t memory) {
  return std::min(store_bytes, memory / kDefaultTierShareDivisor);
}

// One lock's share of the rows: `slots` rows of bytes, each slot's key and CLOCK bit, and an
// open-addressing index (linear probing, at most half full) from key to slot.
class RowCache::Shard {
 public:
  Shard(size_t slots, size_t row_bytes)
      : row_bytes_(row_bytes),
        slots_(slots),
        // Uninitialised: the kernel gives a page of it when a row is first written there.
        rows_(new uint8_t[slots * row_bytes]),
        slot_keys_(slots, kEmpty),
        used_bits_(slots, 0) {
    size_t capacity = 16;
    while (capacity < 2 * slots) capacity *= 2;
    index_keys_.assign(capacity, kEmpty);
    index_slots_.assign(capacity, 0);
    mask_ = capacity - 1;
  }

  bool Get(int64_t key, uint64_t hash, uint8_t* out) {
    std::lock_guard<std::mutex> lock(mutex_);
    const size_t position = Find(key, hash);
    if (index_keys_[position] != key) return false;
    const size_t slot = index_slots_[position];
    used_bits_[slot] = 1;
    std::memcpy(out, rows_.get() + slot * row_bytes_, row_bytes_);
    return true;
  }

  void Put(int64_t key, uint64_t hash, const uint8_t* row) {
    std::lock_guard<std::mutex> lock(mutex_);
    size_t position = Find(key, hash);
    if (index_keys_[position] == key) {
      used_bits_[index_slots_[position]] = 1;
      return;
    }
    size_t slot = 0;
    if (held_ < slots_) {
      slot = held_++;
    } else {
      // CLOCK: the hand clears the bit of every used row it passes and stops at one unused.
      while (used_bits_[hand_] != 0) {
        used_bits_[hand_] = 0;
        hand_ = hand_ + 1 == slots_ ? 0 : hand_ + 1;
      }
      slot = hand_;
      hand_ = hand_ + 1 == slots_ ? 0 : hand_ + 1;
      const int64_t victim = slot_keys_[slot];
      Erase(Find(victim, Hash(victim)));
      position = Find(key, hash);  // the erase may have moved the key's place
    }
    index_keys_[position] = key;
    index_slots_[position] = slot;
    slot_keys_[slot] = key;
    used_bits_[slot] = 0;  // a row earns its second chance by a hit
    std::memcpy(rows_.get() + slot * row_bytes_, row, row_bytes_);
  }

  size_t held() {
    std::lock_guard<std::mutex> lock(mutex_);
    return held_;
  }

 private:
  size_t Home(uint64_t hash) const { return static_cast<size_t>(hash >> 16) & mask_; }

  // The key's place in the index, or the empty place where it would go.
  size_t Find(int64_t key, uint64_t hash) const {
    size_t position = Home(hash);
    while (index_keys_[position] != kEmpty && index_keys_[position] != key) position = (position + 1) & mask_;
    return position;
  }

  // Empties `position` and moves back each entry after it whose home allows, so that no search
  // stops early at the hole (deletion without tombstones).
  void Erase(size_t position) {
    size_t hole = position;
    size_t next = (hole + 1) & mask_;
    while (index_keys_[next] != kEmpty) {
      const size_t home = Home(Hash(index_keys_[next]));
      // The entry at `next` may fill the hole unless its home lies cyclically in (hole, next].
      const bool stays = hole <= next ? (home > hole && home <= next) : (home > hole || home <= next);
      if (!stays) {
        index_keys_[hole] = index_keys_[next];
        index_slots_[hole] = index_slots_[next];
        hole = next;
      }
      next = (next + 1) & mask_;
    }
    index_keys_[hole] = kEmpty;
  }

  std::mutex mutex_;
  size_t row_bytes_;
  size_t slots_;
  size_t held_ = 0;
  size_t hand_ = 0;
  std::unique_ptr<uint8_t[]> rows_;
  std::vector<int64_t> slot_keys_;
  std::vector<uint8_t> used_bits_;
  std::vector<int64_t> index_keys_;
  std::vector<uint32_t> index_slots_;
  size_t mask_ = 0;
};

RowCache::RowCache(uint64_t bytes, size_t row_bytes, uint64_t store_rows)
    : row_bytes_(row_bytes), store_rows_(store_rows) {
  const uint64_t rows = row_bytes == 0 ? 0 : bytes / row_bytes;
  if (rows == 0) {
    throw LoadError("a cold row cache of " + std::to_string(bytes) + " bytes holds no row of " +
                    std::to_string(row_bytes) + " bytes");
  }
  if (rows >= store_rows && store_rows > 0) {
    // Whole: every row its place. The mapping's pages are the kernel's zero page until written.
    whole_bytes_ = static_cast<size_t>(store_rows) * row_bytes;
    void* mapped = mmap(nullptr, whole_bytes_, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (mapped == MAP_FAILED) {
      throw LoadError("cannot map " + std::to_string(whole_bytes_) +
                      " bytes for the cold rows: " + ErrnoText(errno));
    }
    whole_rows_ = static_cast<uint8_t*>(mapped);
    // Huge pages where the kernel gives them (transparent huge pages in `madvise` mode, the usual
    // default): a lookup lands anywhere in the tier, and 4 KiB pages would cost most of them a
    // TLB miss. Without them (a refusal), the tier works the same, slower.
    madvise(mapped, whole_bytes_, MADV_HUGEPAGE);
    states_.reset(new std::atomic<uint8_t>[static_cast<size_t>(store_rows)]());
    capacity_rows_ = static_cast<size_t>(store_rows);
    return;
  }
  // An index of 32-bit slots: at most 2^31 rows a shard.
  size_t shards = 1;
  while (shards < kMaxShards && shards * 2 <= rows) shards *= 2;
  if (rows / shards >= (uint64_t{1} << 31)) {
    throw LoadError("a cold row cache of " + std::to_string(bytes) + " bytes is too large");
  }
  capacity_rows_ = static_cast<size_t>(rows);
  unsigned bits = 0;
  while ((size_t{1} << bits) < shards) ++bits;
  shift_ = 64 - bits;
  // The rows dealt out: the first rows % shards shards hold one more.
  for (size_t index = 0; index < shards; ++index) {
    const size_t slots = capacity_rows_ / shards + (index < capacity_rows_ % shards ? 1 : 0);
    shards_.push_back(std::make_unique<Shard>(slots, row_bytes));
  }
}

RowCache::~RowCache() {
  if (whole_rows_ != nullptr) munmap(whole_rows_, whole_bytes_);
}

bool RowCache::Get(int64_t key, uint8_t* out) {
  if (whole()) {
    const uint8_t* row = Find(key);
    if (row == nullptr) return false;
    std::memcpy(out, row, row_bytes_);
    return true;
  }
  const uint64_t hash = Hash(key);
  return ShardOf(hash).Get(key, hash, out);
}

void RowCache::Put(int64_t key, const uint8_t* row) {
  if (whole()) {
    if (key < 0 || static_cast<uint64_t>(key) >= store_rows_) return;
    std::atomic<uint8_t>& state = states_[static_cast<size_t>(key)];
    uint8_t expected = kAbsent;
    if (!state.compare_exchange_strong(expected, kWriting, std::memory_order_acquire)) return;
    std::memcpy(whole_rows_ + static_cast<size_t>(key) * row_bytes_, row, row_bytes_);
    state.store(kPresent, std::memory_order_release);
    whole_held_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  const uint64_t hash = Hash(key);
  ShardOf(hash).Put(key, hash, row);
}

size_t RowCache::size() {
  if (whole()) return whole_held_.load(std::memory_order_relaxed);
  size_t held = 0;
  for (auto& shard : shards_) held += shard->held();
  return held;
}

}  // namespace stages::embedding
