#include "sha256.h"

#include <algorithm>
#include <cstring>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace stages {

namespace {

// The first 32 bits of the fractional parts of the cube roots of the first 64 primes.
constexpr uint32_t kRound[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

constexpr uint32_t Rotate(uint32_t value, int bits) { return (value >> bits) | (value << (32 - bits)); }

#if defined(__x86_64__)
// The x86 SHA extensions do two rounds an instruction: several times the speed of the rounds
// below (an older store's whole-file digest runs on one thread).
bool HasShaExtensions() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
  const bool ssse3 = c & (1u << 9), sse41 = c & (1u << 19);
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  return ssse3 && sse41 && (b & (1u << 29)) != 0;
}

const bool kHasShaExtensions = HasShaExtensions();

// `blocks` 64-byte blocks into `state` (a..h) with the SHA extensions. The instructions keep the
// state as two registers, ABEF and CDGH (A in the highest lane), and the message words in
// big-endian order; the schedule is four registers of four words, the oldest replaced each time.
__attribute__((target("sha,sse4.1,ssse3"))) void ShaExtensionBlocks(uint32_t* state, const uint8_t* data,
                                                                    size_t blocks) {
  const __m128i byte_swap = _mm_set_epi64x(0x0c0d0e0f08090a0bLL, 0x0405060700010203LL);
  // Lanes named in memory order, lowest first.
  const __m128i badc = _mm_shuffle_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(state)), 0xB1);
  const __m128i hgfe = _mm_shuffle_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(state + 4)), 0x1B);
  __m128i abef = _mm_alignr_epi8(badc, hgfe, 8);     // f e b a
  __m128i cdgh = _mm_blend_epi16(hgfe, badc, 0xF0);  // h g d c
  for (; blocks > 0; --blocks, data += 64) {
    const __m128i abef_before = abef, cdgh_before = cdgh;
    __m128i words[4];
    for (int i = 0; i < 4; ++i) {
      words[i] =
          _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(data + 16 * i)), byte_swap);
    }
    for (int group = 0; group < 16; ++group) {
      __m128i& oldest = words[group % 4];
      if (group >= 4) {
        // W[i] = s1(W[i-2]) + W[i-7] + s0(W[i-15]) + W[i-16], four at a time.
        const __m128i& newest = words[(group + 3) % 4];
        const __m128i sevens = _mm_alignr_epi8(newest, words[(group + 2) % 4], 4);
        oldest = _mm_sha256msg2_epu32(
            _mm_add_epi32(_mm_sha256msg1_epu32(oldest, words[(group + 1) % 4]), sevens), newest);
      }
      __m128i keyed =
          _mm_add_epi32(oldest, _mm_loadu_si128(reinterpret_cast<const __m128i*>(kRound + 4 * group)));
      cdgh = _mm_sha256rnds2_epu32(cdgh, abef, keyed);
      keyed = _mm_shuffle_epi32(keyed, 0x0E);
      abef = _mm_sha256rnds2_epu32(abef, cdgh, keyed);
    }
    abef = _mm_add_epi32(abef, abef_before);
    cdgh = _mm_add_epi32(cdgh, cdgh_before);
  }
  const __m128i abef_in_order = _mm_shuffle_epi32(abef, 0x1B);
  const __m128i ghcd = _mm_shuffle_epi32(cdgh, 0xB1);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(state), _mm_blend_epi16(abef_in_order, ghcd, 0xF0));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(state + 4), _mm_alignr_epi8(ghcd, abef_in_order, 8));
}
#endif

}  // namespace

Sha256::Sha256()
    // The first 32 bits of the fractional parts of the square roots of the first 8 primes.
    : state_{0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19} {
}

void Sha256::Block(const uint8_t* block) {
  uint32_t words[64];
  for (int i = 0; i < 16; ++i) {
    words[i] = (static_cast<uint32_t>(block[4 * i]) << 24) | (static_cast<uint32_t>(block[4 * i + 1]) << 16) |
               (static_cast<uint32_t>(block[4 * i + 2]) << 8) | static_cast<uint32_t>(block[4 * i + 3]);
  }
  for (int i = 16; i < 64; ++i) {
    const uint32_t s0 = Rotate(words[i - 15], 7) ^ Rotate(words[i - 15], 18) ^ (words[i - 15] >> 3);
    const uint32_t s1 = Rotate(words[i - 2], 17) ^ Rotate(words[i - 2], 19) ^ (words[i - 2] >> 10);
    words[i] = words[i - 16] + s0 + words[i - 7] + s1;
  }
  uint32_t a = state_[0], b = state_[1], c = state_[2], d = state_[3];
  uint32_t e = state_[4], f = state_[5], g = state_[6], h = state_[7];
  for (int i = 0; i < 64; ++i) {
    const uint32_t s1 = Rotate(e, 6) ^ Rotate(e, 11) ^ Rotate(e, 25);
    const uint32_t choose = (e & f) ^ (~e & g);
    const uint32_t t1 = h + s1 + choose + kRound[i] + words[i];
    const uint32_t s0 = Rotate(a, 2) ^ Rotate(a, 13) ^ Rotate(a, 22);
    const uint32_t majority = (a & b) ^ (a & c) ^ (b & c);
    const uint32_t t2 = s0 + majority;
    h = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  state_[0] += a;
  state_[1] += b;
  state_[2] += c;
  state_[3] += d;
  state_[4] += e;
  state_[5] += f;
  state_[6] += g;
  state_[7] += h;
}

void Sha256::Blocks(const uint8_t* data, size_t count) {
#if defined(__x86_64__)
  if (kHasShaExtensions) {
    ShaExtensionBlocks(state_.data(), data, count);
    return;
  }
#endif
  for (size_t block = 0; block < count; ++block) Block(data + 64 * block);
}

void Sha256::Update(const void* data, size_t size) {
  const auto* bytes = static_cast<const uint8_t*>(data);
  total_bytes_ += size;
  if (pending_size_ > 0) {
    const size_t take = std::min(size, pending_.size() - pending_size_);
    std::memcpy(pending_.data() + pending_size_, bytes, take);
    pending_size_ += take;
    bytes += take;
    size -= take;
    if (pending_size_ < pending_.size()) return;
    Blocks(pending_.data(), 1);
    pending_size_ = 0;
  }
  const size_t blocks = size / pending_.size();
  Blocks(bytes, blocks);
  bytes += blocks * pending_.size();
  size -= blocks * pending_.size();
  if (size > 0) {
    std::memcpy(pending_.data(), bytes, size);
    pending_size_ = size;
  }
}

std::string Sha256::HexDigest() {
  const uint64_t bits = total_bytes_ * 8;
  // The padding: one 1 bit, zeros up to 8 bytes short of a block, the message length in bits.
  uint8_t tail[72] = {0x80};
  const size_t zeros = (pending_size_ < 56 ? 56 : 120) - pending_size_;
  for (int i = 0; i < 8; ++i) tail[zeros + i] = static_cast<uint8_t>(bits >> (56 - 8 * i));
  Update(tail, zeros + 8);
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(64);
  for (const uint32_t word : state_) {
    for (int shift = 28; shift >= 0; shift -= 4) out += kDigits[(word >> shift) & 0xFu];
  }
  return out;
}

std::string Sha256Hex(std::string_view text) {
  Sha256 hash;
  hash.Update(text.data(), text.size());
  return hash.HexDigest();
}

}  // namespace stages
