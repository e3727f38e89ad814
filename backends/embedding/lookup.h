// The embedding stage's placement: each lookup of a request hot (a slot of the dense model's hot
// rows) or cold (a row of the row store), as hot_cold_lookup.HotColdLookup.place computes it.
//
// For `B x H` raw int64 ids (H = 26, or the sum of the bags' sizes for a multi-hot model):
// - hot_slots       B x H int64: 0 where lookup (b, p) is cold, s >= 1 where it is hot: row s - 1
//                   of its table's hot rows (the hot set's order);
// - cold_positions  N int64: b * H + p of each cold lookup, ascending;
// - cold keys       N int64: the store row of each cold lookup (its table's first row + id),
//                   which ColdReads turns into the N x W cold rows.
// Each id is first reduced into its table, non-negative (numpy's mod: -1 -> size - 1, INT64_MIN
// too), so no id is out of range.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "stage_texts.h"
#include "store.h"

namespace stages::embedding {

// The largest slot map (4 bytes per row of all tables) a stage builds; above it, a binary search
// over the sorted hot keys (hot_cold_lookup.SLOT_MAP_MAX_BYTES).
inline constexpr uint64_t kSlotMapMaxBytes = uint64_t{1} << 30;

class HotColdLookup {
 public:
  // Throws LoadError with HotColdLookup's texts: sizes not >= 1, hot ids for another number of
  // tables, hot ids not distinct or out of [0, size), store rows that are not the tables', a
  // hotness that is not one count >= 1 per table. `hotness` empty: one id per table.
  // `slot_map_max_bytes`: the slot map's limit (tests force the binary search with 0).
  HotColdLookup(std::vector<int64_t> table_sizes, const std::vector<std::vector<int64_t>>& hot_ids,
                int64_t store_rows, std::vector<int64_t> hotness = {},
                uint64_t slot_map_max_bytes = kSlotMapMaxBytes);

  size_t num_tables() const { return sizes_.size(); }
  // Ids per request row: T, or H = sum(hotness).
  size_t positions() const { return position_sizes_.size(); }
  // Hot rows of all tables.
  size_t hot_rows() const { return keys_.size(); }
  const std::vector<int64_t>& table_sizes() const { return sizes_; }
  const std::vector<int64_t>& hotness() const { return hotness_; }
  bool uses_slot_map() const { return !slot_map_.empty(); }
  // Whether a bit a store row says which are hot (where it fits: slot_map_max_bytes / 8).
  bool uses_hot_bits() const { return !hot_bits_.empty(); }

  // Places `batch x positions()` ids: writes `hot_slots` (batch x positions()) and replaces
  // `cold_positions` and `cold_keys` by the cold lookups, ascending by position. Thread-safe
  // (const): every instance of a model places with one lookup.
  void Place(const int64_t* ids, size_t batch, int64_t* hot_slots, std::vector<int64_t>* cold_positions,
             std::vector<int64_t>* cold_keys) const;

 private:
  std::vector<int64_t> sizes_;
  std::vector<int64_t> hotness_;           // as given (empty: one id per table)
  std::vector<int64_t> position_sizes_;    // each id position's table size
  std::vector<int64_t> position_offsets_;  // and its table's first row in the store
  std::vector<int64_t> keys_;              // hot keys (table offset + id), ascending
  std::vector<int64_t> slots_;             // their slots
  std::vector<uint32_t> slot_map_;         // slot of every store row (0: cold), where it fits
  std::vector<uint64_t> hot_bits_;         // a bit a store row: hot, where it fits (as slot_map_ / 8)
};

// What hot_cold_lookup.HotColdLookup.open checks and builds: the store (opened and verified by
// OpenStore), the hot set, and the lookup over them.
struct OpenedLookup {
  std::unique_ptr<Store> store;
  std::unique_ptr<HotColdLookup> lookup;
};

// Opens the store in `store_dir` and the hot set `hot_set`, checks both against `table_sizes`
// and the store against `fingerprint` ("" : not compared). Throws LoadError with
// HotColdLookup.open's texts (the store's and the hot set's own from OpenStore / ReadHotSet).
OpenedLookup OpenLookup(const std::string& store_dir, const std::string& hot_set,
                        const std::vector<int64_t>& table_sizes, const std::string& fingerprint,
                        const std::vector<int64_t>& hotness = {}, int verify_threads = 0);

}  // namespace stages::embedding
