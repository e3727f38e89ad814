// A test driver for the embedding stage's load: opens a row store and a hot set as the stage does
// and prints, as one JSON line on stdout, what it found, or {"error": <the load error's text>}
// with exit code 1 (tests/unit/test_embedding_native_store.py).
//
//   embedding_store_driver [--store DIR] [--no-verify] [--threads N] [--hot-set FILE --tables N]
//
// Found: {"store": {"table_sizes", "rows", "width", "dtype", "columns", "row_bytes", "size",
// "fingerprint", "verified", "check", "data_crc32"}, "hot_set": {"table_sizes", "ids"}}, each
// where asked for; data_crc32 is the CRC-32 of every mapped byte.
#include <cstdlib>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "crc32.h"
#include "json.h"
#include "store.h"

namespace {

using stages::JsonString;
using stages::embedding::HotSet;
using stages::embedding::Store;
using stages::embedding::StoreDtype;

struct Options {
  std::optional<std::string> store;
  bool verify = true;
  int threads = 0;
  std::optional<std::string> hot_set;
  size_t tables = 26;
};

std::string Numbers(const std::vector<int64_t>& values) {
  std::string out = "[";
  for (size_t index = 0; index < values.size(); ++index) {
    if (index) out += ",";
    out += std::to_string(values[index]);
  }
  return out + "]";
}

std::string Describe(const Store& store) {
  const char* dtype = store.dtype == StoreDtype::kFloat32   ? "float32"
                      : store.dtype == StoreDtype::kFloat16 ? "float16"
                                                            : "int8";
  std::string columns = "[";
  for (size_t index = 0; index < store.columns.size(); ++index) {
    if (index) columns += ",";
    columns += "[" + std::to_string(store.columns[index].first) + "," +
               std::to_string(store.columns[index].second) + "]";
  }
  columns += "]";
  return "{\"table_sizes\":" + Numbers(store.table_sizes) + ",\"rows\":" + std::to_string(store.rows) +
         ",\"width\":" + std::to_string(store.width) + ",\"dtype\":\"" + dtype + "\",\"columns\":" + columns +
         ",\"row_bytes\":" + std::to_string(store.row_bytes) + ",\"size\":" + std::to_string(store.size) +
         ",\"fingerprint\":" + JsonString(store.fingerprint) +
         ",\"verified\":" + (store.verified ? "true" : "false") + ",\"check\":" + JsonString(store.check) +
         ",\"data_crc32\":" + std::to_string(stages::Crc32(store.data, store.size)) + "}";
}

std::string Describe(const HotSet& hot_set) {
  std::string ids = "[";
  for (size_t index = 0; index < hot_set.ids.size(); ++index) {
    if (index) ids += ",";
    ids += Numbers(hot_set.ids[index]);
  }
  return "{\"table_sizes\":" + Numbers(hot_set.table_sizes) + ",\"ids\":" + ids + "]}";
}

[[noreturn]] void Usage(const std::string& why) {
  std::cerr << "embedding_store_driver: " << why
            << "\nusage: embedding_store_driver [--store DIR] [--no-verify] [--threads N] [--hot-set FILE "
               "--tables N]\n";
  std::exit(2);
}

Options Parse(int argc, char** argv) {
  Options options;
  for (int index = 1; index < argc; ++index) {
    const std::string option = argv[index];
    const auto value = [&]() -> std::string {
      if (index + 1 >= argc) Usage(option + " needs a value");
      return argv[++index];
    };
    if (option == "--store") {
      options.store = value();
    } else if (option == "--no-verify") {
      options.verify = false;
    } else if (option == "--threads") {
      options.threads = std::atoi(value().c_str());
    } else if (option == "--hot-set") {
      options.hot_set = value();
    } else if (option == "--tables") {
      const long tables = std::atol(value().c_str());
      if (tables < 0) Usage("--tables must be >= 0");
      options.tables = static_cast<size_t>(tables);
    } else {
      Usage("unknown option " + option);
    }
  }
  if (!options.store && !options.hot_set) Usage("give --store, --hot-set or both");
  return options;
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = Parse(argc, argv);
  try {
    std::string out = "{";
    if (options.store) {
      const std::unique_ptr<Store> store =
          stages::embedding::OpenStore(*options.store, options.verify, options.threads);
      out += "\"store\":" + Describe(*store);
    }
    if (options.hot_set) {
      const HotSet hot_set = stages::embedding::ReadHotSet(*options.hot_set, options.tables);
      out += std::string(options.store ? "," : "") + "\"hot_set\":" + Describe(hot_set);
    }
    std::cout << out << "}\n";
    return 0;
  } catch (const stages::embedding::LoadError& error) {
    std::cout << "{\"error\":" << JsonString(error.what()) << "}\n";
    return 1;
  } catch (const std::exception& error) {
    std::cout << "{\"crash\":" << JsonString(error.what()) << "}\n";
    return 3;
  }
}
