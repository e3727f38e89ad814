// io_uring by its two system calls and the uapi layouts (see uring.h).
#include "uring.h"

#include <fcntl.h>
#include <linux/io_uring.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

namespace stages::embedding {
namespace {

// GNU strerror_r answers a char*, the XSI one an int: both are taken.
[[maybe_unused]] const char* StrerrorResult(int result, const char* buffer) {
  return result == 0 ? buffer : "Unknown error";
}
[[maybe_unused]] const char* StrerrorResult(const char* result, const char* /*buffer*/) { return result; }

// The kernel reads and writes the ring's head and tail words on other CPUs (its workers): each
// side publishes with a release store and reads with an acquire load.
uint32_t LoadAcquire(const uint32_t* word) { return __atomic_load_n(word, __ATOMIC_ACQUIRE); }
void StoreRelease(uint32_t* word, uint32_t value) { __atomic_store_n(word, value, __ATOMIC_RELEASE); }

void* MapRing(int fd, size_t bytes, off_t offset) {
  void* mapped = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, offset);
  return mapped == MAP_FAILED ? nullptr : mapped;
}

// Reads `length` bytes at `offset` with pread, resuming after short reads; the bytes read.
size_t ReadFully(int fd, uint8_t* out, size_t length, uint64_t offset, int* error) {
  size_t done = 0;
  *error = 0;
  while (done < length) {
    const ssize_t got = pread(fd, out + done, length - done, static_cast<off_t>(offset + done));
    if (got < 0) {
      if (errno == EINTR) continue;
      *error = errno;
      break;
    }
    if (got == 0) break;
    done += static_cast<size_t>(got);
  }
  return done;
}

}  // namespace

std::string ErrnoText(int code) {
  char buffer[256] = {0};
  return StrerrorResult(strerror_r(code, buffer, sizeof(buffer)), buffer);
}

Ring::Ring(unsigned entries) {
  io_uring_params params;
  std::memset(&params, 0, sizeof(params));
  const long fd = syscall(__NR_io_uring_setup, entries, &params);
  if (fd < 0) {
    const int code = errno;
    throw RingUnavailable(code, "io_uring_setup refused: " + ErrnoText(code));
  }
  fd_ = static_cast<int>(fd);
  try {
    entries_ = params.sq_entries;
    sq_map_bytes_ = params.sq_off.array + params.sq_entries * sizeof(uint32_t);
    cq_map_bytes_ = params.cq_off.cqes + params.cq_entries * sizeof(io_uring_cqe);
    sqe_map_bytes_ = params.sq_entries * sizeof(io_uring_sqe);
    sq_map_ = MapRing(fd_, sq_map_bytes_, static_cast<off_t>(IORING_OFF_SQ_RING));
    cq_map_ = MapRing(fd_, cq_map_bytes_, static_cast<off_t>(IORING_OFF_CQ_RING));
    sqe_map_ = MapRing(fd_, sqe_map_bytes_, static_cast<off_t>(IORING_OFF_SQES));
    if (sq_map_ == nullptr || cq_map_ == nullptr || sqe_map_ == nullptr) {
      const int code = errno;
      throw RingUnavailable(code, "io_uring rings cannot be mapped: " + ErrnoText(code));
    }
    auto* sq = static_cast<uint8_t*>(sq_map_);
    auto* cq = static_cast<uint8_t*>(cq_map_);
    sq_tail_ = reinterpret_cast<uint32_t*>(sq + params.sq_off.tail);
    sq_mask_ = *reinterpret_cast<uint32_t*>(sq + params.sq_off.ring_mask);
    sq_array_ = reinterpret_cast<uint32_t*>(sq + params.sq_off.array);
    cq_head_ = reinterpret_cast<uint32_t*>(cq + params.cq_off.head);
    cq_tail_ = reinterpret_cast<uint32_t*>(cq + params.cq_off.tail);
    cq_mask_ = *reinterpret_cast<uint32_t*>(cq + params.cq_off.ring_mask);
    cqes_ = reinterpret_cast<io_uring_cqe*>(cq + params.cq_off.cqes);
    sqes_ = static_cast<io_uring_sqe*>(sqe_map_);
    // Slot i of the submission array names entry i, once for all.
    for (uint32_t index = 0; index < params.sq_entries; ++index) sq_array_[index] = index;
    batch_offsets_.resize(entries_);
    batch_addresses_.resize(entries_);
    batch_lengths_.resize(entries_);
    batch_results_.resize(entries_);
    // A kernel before IORING_OP_READ answers a read of 0 bytes with EINVAL.
    const int zero = open("/dev/zero", O_RDONLY | O_CLOEXEC);
    if (zero < 0) {
      const int code = errno;
      throw RingUnavailable(code, "io_uring cannot be probed: /dev/zero: " + ErrnoText(code));
    }
    uint8_t byte = 0;
    uint64_t offset = 0;
    uint8_t* address = &byte;
    uint32_t length = 0;
    int64_t result = 0;
    try {
      Submit(zero, &offset, &address, &length, 1, &result);
    } catch (const ReadError& error) {
      close(zero);
      throw RingUnavailable(EIO, std::string("io_uring cannot read files here: ") + error.what());
    }
    close(zero);
    if (result < 0) {
      const int code = static_cast<int>(-result);
      throw RingUnavailable(code, "io_uring cannot read files here: " + ErrnoText(code));
    }
  } catch (...) {
    Close();
    throw;
  }
}

Ring::~Ring() { Close(); }

void Ring::Close() {
  if (sqe_map_ != nullptr) munmap(sqe_map_, sqe_map_bytes_);
  if (cq_map_ != nullptr) munmap(cq_map_, cq_map_bytes_);
  if (sq_map_ != nullptr) munmap(sq_map_, sq_map_bytes_);
  sqe_map_ = cq_map_ = sq_map_ = nullptr;
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

void Ring::ReadRows(int fd, const int64_t* rows, size_t count, size_t row_bytes, uint8_t* out) {
  if (row_bytes > std::numeric_limits<uint32_t>::max()) {
    throw ReadError("a row of " + std::to_string(row_bytes) + " bytes is too long for one io_uring read");
  }
  const auto length = static_cast<uint32_t>(row_bytes);
  for (size_t start = 0; start < count; start += entries_) {
    const size_t n = std::min<size_t>(entries_, count - start);
    for (size_t index = 0; index < n; ++index) {
      batch_offsets_[index] = static_cast<uint64_t>(rows[start + index]) * row_bytes;
      batch_addresses_[index] = out + (start + index) * row_bytes;
      batch_lengths_[index] = length;
    }
    Submit(fd, batch_offsets_.data(), batch_addresses_.data(), batch_lengths_.data(), n,
           batch_results_.data());
    for (size_t index = 0; index < n; ++index) {
      const int64_t got = batch_results_[index];
      if (got == static_cast<int64_t>(length)) continue;
      const uint64_t offset = batch_offsets_[index];
      if (got < 0) {
        throw ReadError(ErrnoText(static_cast<int>(-got)) + " (a read of " + std::to_string(length) +
                        " bytes at offset " + std::to_string(offset) + ")");
      }
      // A short read (a signal, the end of the file): the rest read directly.
      int error = 0;
      const size_t done = static_cast<size_t>(got);
      const size_t more = ReadFully(fd, batch_addresses_[index] + done, length - done, offset + done, &error);
      if (done + more != length) {
        throw ReadError("short read: " + std::to_string(done + more) + " of " + std::to_string(length) +
                        " bytes at offset " + std::to_string(offset) +
                        (error != 0 ? " (" + ErrnoText(error) + ")" : " (end of file?)"));
      }
    }
  }
}

void Ring::Read(int fd, const uint64_t* offsets, uint8_t* const* addresses, const uint32_t* lengths,
                size_t count, int64_t* results) {
  for (size_t start = 0; start < count; start += entries_) {
    const size_t n = std::min<size_t>(entries_, count - start);
    Submit(fd, offsets + start, addresses + start, lengths + start, n, results + start);
  }
}

void Ring::Submit(int fd, const uint64_t* offsets, uint8_t* const* addresses, const uint32_t* lengths,
                  size_t n, int64_t* results) {
  const uint32_t tail = *sq_tail_;  // only this thread writes the tail
  const uint32_t first = tail & sq_mask_;
  for (size_t index = 0; index < n; ++index) {
    const uint32_t slot = (tail + static_cast<uint32_t>(index)) & sq_mask_;
    io_uring_sqe* entry = &sqes_[slot];
    std::memset(entry, 0, sizeof(*entry));
    entry->opcode = IORING_OP_READ;
    entry->fd = fd;
    entry->off = offsets[index];
    entry->addr = reinterpret_cast<uint64_t>(addresses[index]);
    entry->len = lengths[index];
    entry->user_data = slot;
  }
  StoreRelease(sq_tail_, tail + static_cast<uint32_t>(n));
  size_t submitted = 0;
  size_t done = 0;
  while (done < n) {
    const size_t to_submit = n - submitted;
    const uint32_t ready = LoadAcquire(cq_tail_) - *cq_head_;
    const bool wait = ready < n - done;
    if (to_submit > 0 || wait) {
      const long entered = syscall(__NR_io_uring_enter, fd_, static_cast<unsigned>(to_submit),
                                   static_cast<unsigned>(wait ? n - done : 0),
                                   static_cast<unsigned>(wait ? IORING_ENTER_GETEVENTS : 0), nullptr, 0);
      if (entered < 0) {
        const int code = errno;
        if (code == EINTR || code == EAGAIN || code == EBUSY) continue;
        throw ReadError("io_uring_enter: " + ErrnoText(code));
      }
      submitted += static_cast<size_t>(entered);
    }
    done += Reap(results, first);
  }
}

size_t Ring::Reap(int64_t* results, uint32_t first) {
  uint32_t head = *cq_head_;  // only this thread writes the head
  const uint32_t tail = LoadAcquire(cq_tail_);
  const uint32_t ready = tail - head;
  for (; head != tail; ++head) {
    const io_uring_cqe& done = cqes_[head & cq_mask_];
    // user_data is the entry's slot: its read's place after `first`.
    results[(static_cast<uint32_t>(done.user_data) - first) & sq_mask_] = done.res;
  }
  StoreRelease(cq_head_, head);
  return ready;
}

}  // namespace stages::embedding
