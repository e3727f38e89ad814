// CRC-32 as zlib's crc32() computes it (IEEE 802.3: reflected polynomial 0xEDB88320, initial and
// final value inverted), so a value recorded by Python's zlib.crc32 checks here.
#pragma once

#include <cstddef>
#include <cstdint>

namespace stages {

// The CRC-32 of `size` bytes at `data`, continuing `crc` (the CRC of the bytes before them; 0 to
// start): Crc32(b, n, Crc32(a, m)) is the CRC of a then b, as zlib.crc32(b, zlib.crc32(a)).
uint32_t Crc32(const void* data, size_t size, uint32_t crc = 0);

}  // namespace stages
