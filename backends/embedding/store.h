// The embedding stage's files, read at load: the row store (rows.bin + store.json) and the hot
// set (.npz). The format is the one export/stage/hot_cold_lookup.py defines and
// export/tables/row_store.py writes; each load error is one line that names the file and what is
// wrong in it (for store.json, the same line as that module's read_store_meta says).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace stages::embedding {

// The stage cannot load: a missing or inconsistent store, hot-set file or parameter (the
// Python definition's StageError). Its text is the load failure's line.
class LoadError : public std::runtime_error {
 public:
  explicit LoadError(const std::string& message) : std::runtime_error(message) {}
};

enum class StoreDtype { kFloat32, kFloat16, kInt8 };

// A row store mapped read-only (hot_cold_lookup.StoreRows).
struct Store {
  std::string path;                  // the store's folder, as given
  std::vector<int64_t> table_sizes;  // rows of each table
  int64_t rows = 0;                  // sum of table_sizes
  int64_t width = 0;                 // values per row
  StoreDtype dtype = StoreDtype::kFloat32;
  // (start, stop) of each column of a row, in row order, tiling [0, width); one column
  // (0, width) where store.json names none. An int8 row keeps a scale and a bias per column.
  std::vector<std::pair<int64_t, int64_t>> columns;
  size_t row_bytes = 0;               // bytes of one row in rows.bin
  const uint8_t* data = nullptr;      // the mapping of rows.bin: rows * row_bytes bytes
  size_t size = 0;                    // bytes mapped
  std::string fingerprint;            // store.json's fingerprint ("" without checksums)
  bool verified = false;              // every byte was checked against store.json
  std::string check = "not checked";  // how, in words (for the load line)

  Store() = default;
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;
  ~Store();  // unmaps data
};

// Maps the row store in the folder `dir` after checking its description, file size and, where
// `verify`, its content: every byte against store.json's chunk CRC-32s (in up to `threads`
// threads; 0: the CPUs this process may use, at most 8), with its fingerprint recomputed and
// compared; an older store against its whole-file SHA-256; a store with neither loads unverified
// (`verified` false, `check` says so). Throws LoadError.
std::unique_ptr<Store> OpenStore(const std::string& dir, bool verify = true, int threads = 0);

// The table sizes and each table's hot ids (hottest first) of a hot-set .npz
// (export/tables/hot_rows.py's HotSet.save: numpy's savez, entries `table_sizes` and
// `ids_C1`..`ids_C<num_tables>`, each a 1-D integer array: npz.h). Throws LoadError.
struct HotSet {
  std::vector<int64_t> table_sizes;
  std::vector<std::vector<int64_t>> ids;
};
HotSet ReadHotSet(const std::string& path, size_t num_tables);

}  // namespace stages::embedding
