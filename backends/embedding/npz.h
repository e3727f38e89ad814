// numpy's .npz files as np.load(path, allow_pickle=False) reads them: a ZIP archive (its entries
// found as Python's zipfile finds them, ZIP64 records included) of .npy members (parsed as numpy's
// format.read_array parses them). What the hot set needs of that (hot_set.cc).
//
// Every offset and length comes from the file, so each is checked against what the file holds
// before it is used: a damaged or random file is an Error, never a read out of bounds. A member is
// read whole, and its CRC-32 checked, before it is parsed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace stages::embedding::npz {

// Why np.load failed: the text of the exception it raises (str(exc)), with zipfile's and numpy's
// words. Where Python's own exception has none (an EOFError), what happened.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The dtype numpy makes of a header's descr string, as far as it is read here.
struct Dtype {
  // 'b' bool, 'i' signed, 'u' unsigned, 'f' float (2, 4 or 8 bytes), 'O' object, '?' any other
  // (strings, complex, longdouble): its items are read, not converted.
  char kind = 0;
  size_t itemsize = 0;  // bytes of one value
  bool big_endian = false;
  size_t repeat = 1;  // values per item ("5<i4": an item of five int32, numpy's subarray)
};

// An array of a .npy member (format.read_array): its data lie at `data_offset` of the member's bytes.
struct Array {
  Dtype dtype;
  std::string descr;           // the header's descr, for messages
  std::vector<int64_t> shape;  // as the header says
  size_t count = 0;            // items: the product of the shape
  size_t data_offset = 0;
};

// A member as np.load's archive gives it: an array, or the bytes of a member that is no .npy.
struct Member {
  std::optional<Array> array;
  std::string bytes;  // the member's bytes
  // Item `index` of an array of bool, signed or unsigned items as int64 (numpy's cast: a uint64
  // above 2**63 wraps), or of float items as a double.
  int64_t IntegerItem(size_t index) const;
  double FloatItem(size_t index) const;
};

// np.load(path) of an .npz archive: its entries read at once, a member on each Get.
class Archive {
 public:
  // Opens `path` (`shown` is its name in messages: str(Path(path))). Throws Error where np.load
  // fails, or where it reads no archive: a single .npy array (which read_hot_ids then cannot use as
  // an archive), or anything else (np.load takes it for a pickle, which it refuses).
  Archive(const std::string& path, const std::string& shown);
  Archive(const Archive&) = delete;
  Archive& operator=(const Archive&) = delete;
  ~Archive();

  // archive[key]: the member `key` or `key`.npy (NpzFile.__getitem__). Throws Error.
  Member Get(const std::string& key) const;

  struct Entry;  // one entry of the central directory

 private:
  int fd_ = -1;
  int64_t size_ = 0;
  std::vector<Entry> entries_;
};

}  // namespace stages::embedding::npz
