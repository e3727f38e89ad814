// Batched file reads through Linux's io_uring, with the two raw system calls and the kernel's uapi
// header alone (no liburing): the C++ side of export/stage/uring.py.
//
// A request's cold rows are hundreds of small reads at scattered offsets of the row store. One
// pread each costs the same CPU whether the row is cached or not; a ring takes every read of a
// request in one io_uring_enter, which returns when all are done (the cached ones copied at once,
// the others read by the disk in parallel). Only what the stage needs is here: IORING_OP_READ
// (Linux 5.6) of a file into memory the caller owns, submitted and waited for by one thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

// The kernel's layouts (linux/io_uring.h), included by uring.cc only.
struct io_uring_sqe;
struct io_uring_cqe;

namespace stages::embedding {

// The kernel offers no io_uring here (older than 5.6, kernel.io_uring_disabled, a seccomp profile
// such as Docker's default): the text says why, as uring.RingUnavailable's strerror does.
class RingUnavailable : public std::runtime_error {
 public:
  RingUnavailable(int code, const std::string& message) : std::runtime_error(message), code_(code) {}
  int code() const { return code_; }

 private:
  int code_;
};

// A read of the row store that failed or came back short: an INTERNAL error of its request.
class ReadError : public std::runtime_error {
 public:
  explicit ReadError(const std::string& message) : std::runtime_error(message) {}
};

// The text of an errno value (strerror's, thread-safe).
std::string ErrnoText(int code);

// One io_uring of `entries` submission entries (the most reads one io_uring_enter takes; a larger
// batch goes in turns). Owns the ring's descriptor and its three mappings.
class Ring {
 public:
  static constexpr unsigned kDefaultEntries = 1024;

  // Throws RingUnavailable: io_uring_setup refused, the rings cannot be mapped, or the kernel has
  // no IORING_OP_READ (probed with a read of 0 bytes of /dev/zero).
  explicit Ring(unsigned entries = kDefaultEntries);
  ~Ring();
  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;

  unsigned entries() const { return entries_; }

  // Reads `row_bytes` bytes at byte rows[i] * row_bytes of `fd` into out + i * row_bytes, for
  // each i < count; all in flight together (entries() at a time), all done on return. A read
  // that comes back short is finished with pread. Throws ReadError: a read failed (its error),
  // or the file ends before a row does. `row_bytes` must fit 32 bits.
  void ReadRows(int fd, const int64_t* rows, size_t count, size_t row_bytes, uint8_t* out);

  // Reads lengths[i] bytes at offsets[i] of `fd` into addresses[i], for each i < count, entries()
  // at a time; results[i] is read i's result (bytes read, or a negative errno). A short read is
  // the caller's to judge: an O_DIRECT read's rest must be read aligned, or is past the file's end.
  void Read(int fd, const uint64_t* offsets, uint8_t* const* addresses, const uint32_t* lengths, size_t count,
            int64_t* results);

 private:
  // Queues n <= entries reads, submits them and waits for all; results[i] is read i's result.
  void Submit(int fd, const uint64_t* offsets, uint8_t* const* addresses, const uint32_t* lengths, size_t n,
              int64_t* results);
  size_t Reap(int64_t* results, uint32_t first);
  void Close();

  int fd_ = -1;
  unsigned entries_ = 0;
  void* sq_map_ = nullptr;
  size_t sq_map_bytes_ = 0;
  void* cq_map_ = nullptr;
  size_t cq_map_bytes_ = 0;
  void* sqe_map_ = nullptr;
  size_t sqe_map_bytes_ = 0;
  uint32_t* sq_tail_ = nullptr;
  uint32_t sq_mask_ = 0;
  uint32_t* sq_array_ = nullptr;
  uint32_t* cq_head_ = nullptr;
  uint32_t* cq_tail_ = nullptr;
  uint32_t cq_mask_ = 0;
  ::io_uring_cqe* cqes_ = nullptr;
  ::io_uring_sqe* sqes_ = nullptr;
  // One batch's reads, sized entries() once at construction: nothing allocated per request.
  std::vector<uint64_t> batch_offsets_;
  std::vector<uint8_t*> batch_addresses_;
  std::vector<uint32_t> batch_lengths_;
  std::vector<int64_t> batch_results_;
};

}  // namespace stages::embedding
