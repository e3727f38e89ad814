// SHA-256 (FIPS 180-4), as Python's hashlib.sha256 computes it: the row store's fingerprint and
// the whole-file digest of an older store.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace stages {

// A SHA-256 fed in pieces of any size: Update() as often as needed, then HexDigest() once.
class Sha256 {
 public:
  Sha256();
  void Update(const void* data, size_t size);
  // The digest of everything fed, as 64 lowercase hex digits (hashlib's hexdigest()). Ends the
  // hash: feed nothing after it.
  std::string HexDigest();

 private:
  // `count` 64-byte blocks into the state: with the CPU's SHA instructions where it has them.
  void Blocks(const uint8_t* data, size_t count);
  // One block, portably.
  void Block(const uint8_t* block);

  std::array<uint32_t, 8> state_;
  std::array<uint8_t, 64> pending_{};
  size_t pending_size_ = 0;
  uint64_t total_bytes_ = 0;
};

// The SHA-256 of `text` as 64 lowercase hex digits.
std::string Sha256Hex(std::string_view text);

}  // namespace stages
