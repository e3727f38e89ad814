// The hot set's file as numpy.savez writes it: a ZIP archive (ZIP64 records included, as numpy
// asks for them) of stored, uncompressed .npy members, each a 1-D array of integers in numpy's
// header format (format versions 1.0 to 3.0, the header dict in the one layout numpy writes).
// Anything else is refused with what was found where: savez_compressed's deflated members, other
// dtypes, more dimensions, a pickle, a damaged archive.
//
// Every offset and length comes from the file, so each is checked against the file's size before
// it is used: a damaged or random file is an Error, never a read out of bounds. A member is read
// whole, and its CRC-32 checked, before it is parsed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace stages::embedding::npz {

// What is wrong with the file, in one line (the caller names the file).
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A member's array: its integers widened to int64, in order.
struct Integers {
  std::vector<int64_t> values;
  std::string descr;  // the header's dtype descriptor ("<i8")
};

class Archive {
 public:
  // Opens and reads `path`'s central directory. Throws Error where it is no ZIP archive.
  explicit Archive(const std::string& path);
  Archive(const Archive&) = delete;
  Archive& operator=(const Archive&) = delete;
  ~Archive();

  // The 1-D integer array of the member `name`.npy (or `name`). Throws Error naming the member.
  Integers Get(const std::string& name) const;

  struct Entry;  // one entry of the central directory

 private:
  int fd_ = -1;
  uint64_t size_ = 0;
  std::vector<Entry> entries_;
};

}  // namespace stages::embedding::npz
