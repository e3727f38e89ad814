// The embedding stage's lookup outside Triton, for differential tests against the Python definition
// (tests/unit/test_embedding_native_lookup.py): opens a store and a hot set as the backend does,
// then answers each request of the case with the bytes of its outputs.
//
// The case, on stdin, one `key value` a line (values without spaces but ids):
//   store <dir>                      the row store's folder
//   hot_set <path>                   the hot set (.npz)
//   table_sizes <n,n,...>            as the config's parameter
//   hotness <n,n,...>                optional: ids per bag of each table
//   fingerprint <hex>                optional: the store's expected fingerprint
//   way <io_uring|prefetch|threads|fault>
//   threads <n>                      optional (8)
//   hint_rows <n>                    optional (256)
//   slot_map_max_bytes <n>           optional (1 GiB; 0 forces the binary search)
//   ring_entries <n>                 optional (1024; one the kernel refuses: the fallback)
//   cache_bytes <n|default>          optional (0: no memory tier of cold rows; default: the
//                                    backend's default tier)
//   copy_threads <n>                 optional (2): threads copying a large request from a whole tier
//   ids <B> <H> <B*H decimal int64s> a request; any number of them, answered in order
//   time <n>                         the requests since the last `time` again, in turn, n lookups
//                                    in all, timed
// The lookup is opened at the first `ids` line. The answer, on stdout, one line each:
//   fallback <why>                   where io_uring reads the prefetch way
//   slot_map <0|1>                   whether the lookup indexes a slot map
//   hot_bits <0|1>                   whether it tells hot rows by a bit a row
//   tier <whole|rows> <rows>         with a tier: its form and the rows it holds at most
//   direct <how>                     with a tier: how its misses are read
//   hot_slots <B> <H> <hex>          then, per request: the outputs' bytes (little-endian), as hex
//   cold_positions <N> <hex>
//   cold_rows <N> <W> <hex>
//   hits <lookups>                   with a tier: the cold lookups whose rows it held
//   reads <distinct rows> <system calls>
//   time <lookup ns> <copy ns> <bytes>  per `time`: the medians of the n lookups (placement and
//                                    cold reads) and of n copies of their requests' bytes (ids
//                                    in, the three outputs out) with memcpy, and of those bytes
// or `error load <text>` (and exit 1) where the lookup cannot be opened, or `error request <text>`
// for a request whose reads failed (the next requests are answered). A malformed case: exit 2.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "cold_reads.h"
#include "lookup.h"
#include "store.h"

namespace {

using stages::embedding::ColdReads;
using stages::embedding::ColdReadWay;
using stages::embedding::HotColdLookup;
using stages::embedding::LoadError;
using stages::embedding::OpenedLookup;
using stages::embedding::RowCache;

struct Case {
  std::string store;
  std::string hot_set;
  std::vector<int64_t> table_sizes;
  std::vector<int64_t> hotness;
  std::string fingerprint;
  ColdReadWay way = ColdReadWay::kUring;
  int64_t threads = stages::embedding::kDefaultColdReadThreads;
  int64_t hint_rows = stages::embedding::kDefaultColdReadHintRows;
  uint64_t slot_map_max_bytes = stages::embedding::kSlotMapMaxBytes;
  unsigned ring_entries = stages::embedding::Ring::kDefaultEntries;
  int64_t cache_bytes = 0;
  bool default_cache = false;
  int64_t copy_threads = stages::embedding::kDefaultTierCopyThreads;
};

[[noreturn]] void Malformed(const std::string& why) {
  std::cerr << "malformed case: " << why << "\n";
  std::exit(2);
}

int64_t Integer(const std::string& text) {
  char* end = nullptr;
  errno = 0;
  const long long value = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || errno != 0 || *end != '\0') Malformed("not an int64: " + text);
  return value;
}

std::vector<int64_t> Integers(const std::string& text) {
  std::vector<int64_t> values;
  std::stringstream stream(text);
  for (std::string part; std::getline(stream, part, ',');) values.push_back(Integer(part));
  return values;
}

void Hex(const void* data, size_t bytes) {
  static const char kDigits[] = "0123456789abcdef";
  const auto* byte = static_cast<const unsigned char*>(data);
  std::string out(2 * bytes, '0');
  for (size_t index = 0; index < bytes; ++index) {
    out[2 * index] = kDigits[byte[index] >> 4];
    out[2 * index + 1] = kDigits[byte[index] & 15];
  }
  std::cout << (bytes ? " " : " -") << out;
}

// `time <n>`: the lookups of `requests` (ids and rows each; placement and cold reads, as the
// backend runs them) in turn, n in all, and as many copies of each one's bytes, each timed; the
// medians.
void Time(const HotColdLookup& lookup, ColdReads& reads,
          const std::vector<std::pair<std::vector<int64_t>, size_t>>& requests, int64_t repeats) {
  if (repeats < 1) Malformed("time needs n >= 1");
  using Clock = std::chrono::steady_clock;
  std::vector<int64_t> slots, positions, keys;
  std::vector<float> rows;
  std::vector<int64_t> lookup_ns, copy_ns, moved;
  std::vector<size_t> bytes(requests.size());
  for (int64_t repeat = 0; repeat < repeats; ++repeat) {
    const size_t which = static_cast<size_t>(repeat) % requests.size();
    const auto& [ids, batch] = requests[which];
    slots.resize(ids.size());
    const Clock::time_point start = Clock::now();
    lookup.Place(ids.data(), batch, slots.data(), &positions, &keys);
    // Grown, never shrunk: a resize within the timing would fill the new rows with zeros first.
    if (rows.size() < keys.size() * reads.width()) rows.resize(keys.size() * reads.width());
    reads.Read(keys.data(), keys.size(), rows.data());
    lookup_ns.push_back(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count());
    bytes[which] =
        (2 * ids.size() + positions.size()) * sizeof(int64_t) + keys.size() * reads.width() * sizeof(float);
  }
  // Each request's bytes (its ids in, its outputs out), copied from one buffer to another.
  const size_t most = *std::max_element(bytes.begin(), bytes.end());
  std::vector<unsigned char> source(std::max<size_t>(most, 1), 1), target(source.size());
  unsigned sink = 0;
  for (int64_t repeat = 0; repeat < repeats; ++repeat) {
    const size_t size = bytes[static_cast<size_t>(repeat) % requests.size()];
    const size_t touched = static_cast<size_t>(repeat) % source.size();
    source[touched] = static_cast<unsigned char>(repeat);
    const Clock::time_point start = Clock::now();
    std::memcpy(target.data(), source.data(), size);
    copy_ns.push_back(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count());
    moved.push_back(static_cast<int64_t>(size));
    sink += target[touched];
  }
  const auto median = [](std::vector<int64_t>& values) {
    std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(values.size() / 2),
                     values.end());
    return values[values.size() / 2];
  };
  std::cout << "time " << median(lookup_ns) << " " << median(copy_ns) << " " << median(moved) << std::endl;
  if (sink == 0xffffffffu) std::cerr << "";  // keeps the copies
}

}  // namespace

int main() {
  std::ios::sync_with_stdio(false);
  Case spec;
  OpenedLookup opened;
  std::unique_ptr<HotColdLookup> lookup;
  std::unique_ptr<RowCache> cache;  // outlives the reads that use it
  std::unique_ptr<ColdReads> reads;
  std::vector<int64_t> ids, slots, positions, keys;
  std::vector<float> rows;
  std::vector<std::pair<std::vector<int64_t>, size_t>> seen;  // the requests since the last `time`
  for (std::string line; std::getline(std::cin, line);) {
    std::stringstream stream(line);
    std::string key;
    if (!(stream >> key)) continue;
    if (key != "ids") {
      std::string value;
      std::getline(stream >> std::ws, value);
      if (key == "store") {
        spec.store = value;
      } else if (key == "hot_set") {
        spec.hot_set = value;
      } else if (key == "table_sizes") {
        spec.table_sizes = Integers(value);
      } else if (key == "hotness") {
        spec.hotness = Integers(value);
      } else if (key == "fingerprint") {
        spec.fingerprint = value;
      } else if (key == "threads") {
        spec.threads = Integer(value);
      } else if (key == "hint_rows") {
        spec.hint_rows = Integer(value);
      } else if (key == "cache_bytes") {
        spec.default_cache = value == "default";
        spec.cache_bytes = spec.default_cache ? 0 : Integer(value);
      } else if (key == "copy_threads") {
        spec.copy_threads = Integer(value);
      } else if (key == "ring_entries") {
        spec.ring_entries = static_cast<unsigned>(Integer(value));
      } else if (key == "slot_map_max_bytes") {
        spec.slot_map_max_bytes = static_cast<uint64_t>(Integer(value));
      } else if (key == "time") {
        if (!lookup || seen.empty()) Malformed("time before any request");
        try {
          Time(*lookup, *reads, seen, Integer(value));
        } catch (const stages::embedding::ReadError& error) {
          std::cout << "error request " << error.what() << std::endl;
        }
        seen.clear();
      } else if (key == "way") {
        const auto way = stages::embedding::ParseColdReadWay(value);
        if (!way) Malformed("no such way: " + value);
        spec.way = *way;
      } else {
        Malformed("unknown key: " + key);
      }
      continue;
    }
    if (!lookup) {
      try {
        opened = stages::embedding::OpenLookup(spec.store, spec.hot_set, spec.table_sizes, spec.fingerprint,
                                               spec.hotness);
        // The same lookup again where the case asks for another slot map limit.
        lookup = std::make_unique<HotColdLookup>(
            spec.table_sizes, stages::embedding::ReadHotSet(spec.hot_set, spec.table_sizes.size()).ids,
            opened.store->rows, spec.hotness, spec.slot_map_max_bytes);
        const stages::embedding::Store& store = *opened.store;
        uint64_t cache_bytes = static_cast<uint64_t>(spec.cache_bytes);
        if (spec.default_cache) {
          cache_bytes = stages::embedding::DefaultTierBytes(
              static_cast<uint64_t>(store.rows) * store.row_bytes, stages::embedding::MemoryLimitBytes());
        }
        if (cache_bytes > 0) {
          cache = std::make_unique<RowCache>(cache_bytes, store.row_bytes, static_cast<uint64_t>(store.rows));
        }
        reads = std::make_unique<ColdReads>(*opened.store, spec.way, spec.threads, spec.hint_rows,
                                            spec.ring_entries, cache.get(), spec.copy_threads);
      } catch (const LoadError& error) {
        std::cout << "error load " << error.what() << "\n";
        return 1;
      }
      if (!reads->fallback().empty()) std::cout << "fallback " << reads->fallback() << "\n";
      std::cout << "slot_map " << (lookup->uses_slot_map() ? 1 : 0) << "\n";
      std::cout << "hot_bits " << (lookup->uses_hot_bits() ? 1 : 0) << "\n";
      if (cache) {
        std::cout << "tier " << (cache->whole() ? "whole " : "rows ") << cache->capacity_rows() << "\n";
        std::cout << "direct " << reads->direct() << "\n";
      }
    }
    std::string batch_text, width_text;
    if (!(stream >> batch_text >> width_text)) Malformed("ids needs B and H");

    const int64_t batch = Integer(batch_text);
    const int64_t width = Integer(width_text);
    if (batch < 0 || width != static_cast<int64_t>(lookup->positions())) Malformed("ids of another shape");
    ids.clear();
    for (std::string value; stream >> value;) ids.push_back(Integer(value));
    if (ids.size() != static_cast<size_t>(batch * width)) Malformed("ids: not B x H values");
    seen.emplace_back(ids, static_cast<size_t>(batch));
    slots.resize(ids.size());
    lookup->Place(ids.data(), static_cast<size_t>(batch), slots.data(), &positions, &keys);
    rows.resize(keys.size() * reads->width());
    try {
      reads->Read(keys.data(), keys.size(), rows.data());
    } catch (const stages::embedding::ReadError& error) {
      std::cout << "error request " << error.what() << std::endl;
      continue;
    }
    std::cout << "hot_slots " << batch << " " << width;
    Hex(slots.data(), slots.size() * sizeof(int64_t));
    std::cout << "\ncold_positions " << positions.size();
    Hex(positions.data(), positions.size() * sizeof(int64_t));
    std::cout << "\ncold_rows " << keys.size() << " " << reads->width();
    Hex(rows.data(), rows.size() * sizeof(float));
    // Flushed: a test may answer the next request only after reading this one's.
    if (cache) std::cout << "\nhits " << reads->last_hits();
    std::cout << "\nreads " << reads->last_rows() << " " << reads->last_reads() << std::endl;
  }
  return 0;
}
