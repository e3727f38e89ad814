// Hot/cold placement of a request's lookups (see lookup.h).
#include "lookup.h"

#include <algorithm>
#include <limits>
#include <utility>

namespace stages::embedding {

HotColdLookup::HotColdLookup(std::vector<int64_t> table_sizes,
                             const std::vector<std::vector<int64_t>>& hot_ids, int64_t store_rows,
                             std::vector<int64_t> hotness, uint64_t slot_map_max_bytes)
    : sizes_(std::move(table_sizes)), hotness_(std::move(hotness)) {
  int64_t total = 0;
  bool valid = !sizes_.empty();
  for (int64_t size : sizes_) {
    if (size < 1 || size > std::numeric_limits<int64_t>::max() - total) {
      valid = false;
      break;
    }
    total += size;
  }
  if (!valid) throw LoadError("table sizes must be one or more ints >= 1, got " + ListText(sizes_));
  if (hot_ids.size() != sizes_.size()) {
    throw LoadError("hot ids for " + std::to_string(hot_ids.size()) + " tables, the stage has " +
                    std::to_string(sizes_.size()));
  }
  if (store_rows != total) {
    throw LoadError("the store has " + std::to_string(store_rows) + " rows, the tables need " +
                    std::to_string(total) + " rows");
  }
  std::vector<int64_t> counts = hotness_.empty() ? std::vector<int64_t>(sizes_.size(), 1) : hotness_;
  // Positions per request row, their sum, must fit an int64 too.
  bool counts_valid = counts.size() == sizes_.size();
  for (int64_t count = 0, sum = 0; counts_valid && count < static_cast<int64_t>(counts.size()); ++count) {
    const int64_t value = counts[static_cast<size_t>(count)];
    counts_valid = value >= 1 && value <= std::numeric_limits<int64_t>::max() - sum;
    sum += counts_valid ? value : 0;
  }
  if (!counts_valid) {
    throw LoadError("hotness must be " + std::to_string(sizes_.size()) + " counts >= 1, got " +
                    ListText(counts));
  }
  std::vector<int64_t> offsets(sizes_.size());
  for (size_t table = 0, offset = 0; table < sizes_.size(); ++table) {
    offsets[table] = static_cast<int64_t>(offset);
    offset += static_cast<size_t>(sizes_[table]);
    for (int64_t copy = 0; copy < counts[table]; ++copy) {
      position_sizes_.push_back(sizes_[table]);
      position_offsets_.push_back(offsets[table]);
    }
  }
  // Each table's keys ascend and the tables are stacked in order: all keys ascend.
  std::vector<std::pair<int64_t, int64_t>> table_keys;
  for (size_t table = 0; table < sizes_.size(); ++table) {
    const std::vector<int64_t>& ids = hot_ids[table];
    table_keys.clear();
    for (size_t index = 0; index < ids.size(); ++index) {
      if (ids[index] < 0 || ids[index] >= sizes_[table]) {
        throw LoadError("table " + std::to_string(table) + ": hot ids must be distinct and lie in [0, " +
                        std::to_string(sizes_[table]) + ")");
      }
      table_keys.emplace_back(offsets[table] + ids[index], static_cast<int64_t>(index) + 1);
    }
    std::sort(table_keys.begin(), table_keys.end());
    for (size_t index = 0; index < table_keys.size(); ++index) {
      if (index > 0 && table_keys[index].first == table_keys[index - 1].first) {
        throw LoadError("table " + std::to_string(table) + ": hot ids must be distinct and lie in [0, " +
                        std::to_string(sizes_[table]) + ")");
      }
      keys_.push_back(table_keys[index].first);
      slots_.push_back(table_keys[index].second);
    }
  }
  const int64_t top_slot = slots_.empty() ? 0 : *std::max_element(slots_.begin(), slots_.end());
  if (!slots_.empty() && static_cast<uint64_t>(total) <= slot_map_max_bytes / 4 &&
      top_slot <= std::numeric_limits<uint32_t>::max()) {
    slot_map_.assign(static_cast<size_t>(total), 0);
    for (size_t index = 0; index < keys_.size(); ++index) {
      slot_map_[static_cast<size_t>(keys_[index])] = static_cast<uint32_t>(slots_[index]);
    }
  }
  // A bit a row, 1 where it is hot: a 32nd of the slot map, so it stays in the CPU's caches where
  // the map and the rows do not, and a cold lookup (the many, where the hot set is small) never
  // reads the map or searches the keys.
  if (!slots_.empty() && static_cast<uint64_t>(total) / 8 <= slot_map_max_bytes) {
    hot_bits_.assign((static_cast<size_t>(total) + 63) / 64, 0);
    for (int64_t key : keys_) hot_bits_[static_cast<size_t>(key) >> 6] |= uint64_t{1} << (key & 63);
  }
}

void HotColdLookup::Place(const int64_t* ids, size_t batch, int64_t* hot_slots,
                          std::vector<int64_t>* cold_positions, std::vector<int64_t>* cold_keys) const {
  cold_positions->clear();
  cold_keys->clear();
  const size_t width = position_sizes_.size();
  const int64_t* sizes = position_sizes_.data();
  const int64_t* offsets = position_offsets_.data();
  const uint32_t* slot_map = slot_map_.empty() ? nullptr : slot_map_.data();
  const uint64_t* bits = hot_bits_.empty() ? nullptr : hot_bits_.data();
  size_t position = 0;
  for (size_t row = 0; row < batch; ++row) {
    // Each of the row's keys first, held in its slot's place meanwhile (a hot one as ~key, < 0),
    // a hot key's slot-map entry asked for ahead: the row's lookups of the map then overlap
    // instead of waiting on memory in turn.
    const size_t first = position;
    for (size_t column = 0; column < width; ++column, ++position) {
      // numpy's mod: the remainder takes the divisor's sign (sizes are >= 1, so never -1).
      const int64_t id = ids[position];
      int64_t reduced = id;
      if (static_cast<uint64_t>(id) >= static_cast<uint64_t>(sizes[column])) {  // not in [0, size)
        reduced = id % sizes[column];
        if (reduced < 0) reduced += sizes[column];
      }
      const int64_t key = reduced + offsets[column];
      const bool hot = bits == nullptr || ((bits[static_cast<size_t>(key) >> 6] >> (key & 63)) & 1) != 0;
      hot_slots[position] = hot ? ~key : key;
      if (hot && slot_map != nullptr) __builtin_prefetch(slot_map + key);
    }
    for (size_t at = first; at < position; ++at) {
      int64_t key = hot_slots[at];
      int64_t slot = 0;
      if (key < 0) {
        key = ~key;
        if (slot_map != nullptr) {
          slot = slot_map[key];
        } else if (!keys_.empty()) {
          const auto found = std::lower_bound(keys_.begin(), keys_.end(), key);
          if (found != keys_.end() && *found == key)
            slot = slots_[static_cast<size_t>(found - keys_.begin())];
        }
      }
      hot_slots[at] = slot;
      if (slot == 0) {
        cold_positions->push_back(static_cast<int64_t>(at));
        cold_keys->push_back(key);
      }
    }
  }
}

OpenedLookup OpenLookup(const std::string& store_dir, const std::string& hot_set,
                        const std::vector<int64_t>& table_sizes, const std::string& fingerprint,
                        const std::vector<int64_t>& hotness, int verify_threads) {
  OpenedLookup opened;
  opened.store = OpenStore(store_dir, true, verify_threads);
  const Store& store = *opened.store;
  const std::string rows_path = store_dir + "/rows.bin";
  if (store.table_sizes != table_sizes) {
    throw LoadError("row store " + rows_path + " has table sizes " + ListText(store.table_sizes) + ", not " +
                    ListText(table_sizes));
  }
  if (!fingerprint.empty() && store.fingerprint != fingerprint) {
    const std::string found =
        store.fingerprint.empty() ? "none (no checksums)" : store.fingerprint.substr(0, 16);
    throw LoadError("row store " + rows_path + " does not match this stage's hot set: its fingerprint is " +
                    found + ", the stage was exported against " + fingerprint.substr(0, 16) +
                    " (another store under the same path?)");
  }
  HotSet hot = ReadHotSet(hot_set, table_sizes.size());
  if (hot.table_sizes != table_sizes) {
    throw LoadError("hot set " + hot_set + " has table sizes " + ListText(hot.table_sizes) + ", not " +
                    ListText(table_sizes));
  }
  opened.lookup = std::make_unique<HotColdLookup>(table_sizes, hot.ids, store.rows, hotness);
  return opened;
}

}  // namespace stages::embedding
