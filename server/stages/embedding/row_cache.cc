// The stage's cache of cold rows (see row_cache.h).
#include "row_cache.h"

#include <cstring>
#include <string>

#include "store.h"

namespace stages::embedding {

namespace {

constexpr int64_t kEmpty = -1;  // keys are store rows, never negative
constexpr size_t kMaxShards = 64;

uint64_t Hash(int64_t key) { return static_cast<uint64_t>(key) * 0x9e3779b97f4a7c15ull; }

}  // namespace

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

RowCache::RowCache(uint64_t bytes, size_t row_bytes) : row_bytes_(row_bytes) {
  const uint64_t rows = row_bytes == 0 ? 0 : bytes / row_bytes;
  if (rows == 0) {
    throw LoadError("a cold row cache of " + std::to_string(bytes) + " bytes holds no row of " +
                    std::to_string(row_bytes) + " bytes");
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

RowCache::~RowCache() = default;

bool RowCache::Get(int64_t key, uint8_t* out) {
  const uint64_t hash = Hash(key);
  return ShardOf(hash).Get(key, hash, out);
}

void RowCache::Put(int64_t key, const uint8_t* row) {
  const uint64_t hash = Hash(key);
  ShardOf(hash).Put(key, hash, row);
}

size_t RowCache::size() {
  size_t held = 0;
  for (auto& shard : shards_) held += shard->held();
  return held;
}

}  // namespace stages::embedding
