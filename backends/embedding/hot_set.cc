// The hot set, read as hot_cold_lookup.read_hot_ids reads it: np.load of the .npz (npz.h), then
// int() of each table size and np.asarray(..., dtype=np.int64) of each table's ids.
#include <sys/stat.h>

#include <cerrno>
#include <cmath>
#include <utility>

#include "npz.h"
#include "python_values.h"
#include "store.h"

namespace stages::embedding {

namespace {

using npz::Error;
using npz::Member;

// The largest double below 2**63: beyond it a value is no int64.
constexpr double kInt64Limit = 9.2233720368547758e18;

[[noreturn]] void Unreadable(const npz::Array& array) {
  throw Error("cannot read an array of dtype " + py::ReprText(array.descr) + " as int64 ids");
}

// tuple(int(size) for size in data["table_sizes"]).
std::vector<int64_t> TableSizes(const Member& member) {
  std::vector<int64_t> sizes;
  if (!member.array) {  // a member that is no .npy: its bytes
    for (const char byte : member.bytes) sizes.push_back(static_cast<unsigned char>(byte));
    return sizes;
  }
  const npz::Array& array = *member.array;
  if (array.shape.empty()) throw Error("iteration over a 0-d array");
  // int() takes each item of the outer dimension only where it is one value.
  if (array.shape[0] > 0 && array.count != static_cast<size_t>(array.shape[0])) {
    throw Error("only length-1 arrays can be converted to Python scalars");
  }
  for (size_t index = 0; index < array.count; ++index) {
    const char kind = array.dtype.kind;
    if (kind == 'b' || kind == 'i' || kind == 'u') {
      const int64_t value = member.IntegerItem(index);
      if (kind == 'u' && value < 0) throw Error("a table size of this hot set is too large");
      sizes.push_back(value);
    } else if (kind == 'f') {
      const double value = member.FloatItem(index);
      if (std::isnan(value)) throw Error("cannot convert float NaN to integer");
      if (std::isinf(value)) throw Error("cannot convert float infinity to integer");
      if (std::fabs(value) >= kInt64Limit) throw Error("a table size of this hot set is too large");
      sizes.push_back(static_cast<int64_t>(value));
    } else {
      Unreadable(array);
    }
  }
  return sizes;
}

// np.asarray(data[f"ids_C{t + 1}"], dtype=np.int64), and its shape.
std::pair<std::vector<int64_t>, std::vector<int64_t>> Ids(const Member& member) {
  if (!member.array) {
    // numpy reads the bytes of a member that is no .npy as one int's text: a 0-d array.
    const py::Int value = py::ToInt(py::Value::Bytes(member.bytes));
    if (value > INT64_MAX || value < INT64_MIN) throw Error("Python int too large to convert to C long");
    return {{static_cast<int64_t>(value)}, {}};
  }
  const npz::Array& array = *member.array;
  std::vector<int64_t> ids(array.count);
  for (size_t index = 0; index < array.count; ++index) {
    const char kind = array.dtype.kind;
    if (kind == 'b' || kind == 'i' || kind == 'u') {
      ids[index] = member.IntegerItem(index);
    } else if (kind == 'f') {
      // What numpy's cast gives on x86 for NaN and for values out of range: the smallest int64.
      const double value = member.FloatItem(index);
      ids[index] =
          std::isfinite(value) && std::fabs(value) < kInt64Limit ? static_cast<int64_t>(value) : INT64_MIN;
    } else {
      Unreadable(array);
    }
  }
  // One dimension in Fortran order holds its items in the same order; more are refused later.
  return {std::move(ids), array.shape};
}

std::string ShapeRepr(const std::vector<int64_t>& shape) {
  py::Value tuple;
  tuple.kind = py::Value::Kind::kTuple;
  for (const int64_t dim : shape) tuple.items.push_back(py::Value::Integer(dim));
  return py::Repr(tuple);
}

}  // namespace

HotSet ReadHotSet(const std::string& path, size_t num_tables) {
  const std::string shown = py::PathText(path);
  struct stat status;
  if (stat(path.c_str(), &status) != 0) {
    // Path.is_file() says false for these; it raises any other.
    if (errno == ENOENT || errno == ENOTDIR || errno == EBADF || errno == ELOOP) {
      throw LoadError("no hot-set file: " + shown);
    }
    throw LoadError(py::OsErrorText(errno, shown));
  }
  if (!S_ISREG(status.st_mode)) throw LoadError("no hot-set file: " + shown);
  HotSet hot_set;
  std::vector<std::vector<int64_t>> shapes;
  try {
    const npz::Archive archive(path, shown);
    hot_set.table_sizes = TableSizes(archive.Get("table_sizes"));
    for (size_t table = 0; table < num_tables; ++table) {
      auto [ids, shape] = Ids(archive.Get("ids_C" + std::to_string(table + 1)));
      hot_set.ids.push_back(std::move(ids));
      shapes.push_back(std::move(shape));
    }
  } catch (const Error& error) {
    throw LoadError(shown + ": not a hot-set file (" + error.what() + ")");
  } catch (const py::Exception& error) {
    throw LoadError(shown + ": not a hot-set file (" + error.text() + ")");
  }
  if (hot_set.table_sizes.size() != num_tables) {
    throw LoadError(shown + ": a hot set of " + std::to_string(hot_set.table_sizes.size()) +
                    " tables, the stage has " + std::to_string(num_tables));
  }
  // The Python definition refuses these when it builds its lookup (HotColdLookup), with this text.
  for (size_t table = 0; table < num_tables; ++table) {
    if (shapes[table].size() != 1) {
      throw LoadError("table " + std::to_string(table) + ": hot ids must be 1-D, got shape " +
                      ShapeRepr(shapes[table]));
    }
  }
  return hot_set;
}

}  // namespace stages::embedding
