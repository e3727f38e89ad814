#include "npz.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string_view>

#include "crc32.h"
#include "python_values.h"

namespace stages::embedding::npz {

namespace {

using py::Int;
using py::Value;

constexpr char kNpyMagic[] = "\x93NUMPY";
constexpr size_t kNpyMagicBytes = 6;
// numpy's format: the longest header it parses (_MAX_HEADER_SIZE) and its read size (BUFFER_SIZE).
constexpr size_t kMaxHeaderChars = 10000;
constexpr Int kReadBufferBytes = 1 << 18;

// Code points of the bytes 0x80..0xFF in code page 437 (zipfile's name encoding without the
// UTF-8 flag); 0x00..0x7F are ASCII.
constexpr uint16_t kCp437[128] = {
    0x00c7, 0x00fc, 0x00e9, 0x00e2, 0x00e4, 0x00e0, 0x00e5, 0x00e7, 0x00ea, 0x00eb, 0x00e8, 0x00ef, 0x00ee,
    0x00ec, 0x00c4, 0x00c5, 0x00c9, 0x00e6, 0x00c6, 0x00f4, 0x00f6, 0x00f2, 0x00fb, 0x00f9, 0x00ff, 0x00d6,
    0x00dc, 0x00a2, 0x00a3, 0x00a5, 0x20a7, 0x0192, 0x00e1, 0x00ed, 0x00f3, 0x00fa, 0x00f1, 0x00d1, 0x00aa,
    0x00ba, 0x00bf, 0x2310, 0x00ac, 0x00bd, 0x00bc, 0x00a1, 0x00ab, 0x00bb, 0x2591, 0x2592, 0x2593, 0x2502,
    0x2524, 0x2561, 0x2562, 0x2556, 0x2555, 0x2563, 0x2551, 0x2557, 0x255d, 0x255c, 0x255b, 0x2510, 0x2514,
    0x2534, 0x252c, 0x251c, 0x2500, 0x253c, 0x255e, 0x255f, 0x255a, 0x2554, 0x2569, 0x2566, 0x2560, 0x2550,
    0x256c, 0x2567, 0x2568, 0x2564, 0x2565, 0x2559, 0x2558, 0x2552, 0x2553, 0x256b, 0x256a, 0x2518, 0x250c,
    0x2588, 0x2584, 0x258c, 0x2590, 0x2580, 0x03b1, 0x00df, 0x0393, 0x03c0, 0x03a3, 0x03c3, 0x00b5, 0x03c4,
    0x03a6, 0x0398, 0x03a9, 0x03b4, 0x221e, 0x03c6, 0x03b5, 0x2229, 0x2261, 0x00b1, 0x2265, 0x2264, 0x2320,
    0x2321, 0x00f7, 0x2248, 0x00b0, 0x2219, 0x00b7, 0x221a, 0x207f, 0x00b2, 0x25a0, 0x00a0,
};

uint64_t Little(std::string_view bytes, size_t at, size_t width) {
  uint64_t value = 0;
  for (size_t index = 0; index < width; ++index) {
    value |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[at + index])) << (8 * index);
  }
  return value;
}

// An open file: its bytes at any offset, as far as it has them.
class File {
 public:
  File(int fd, int64_t size) : fd_(fd), size_(size) {}

  int64_t size() const { return size_; }

  // Python's seek to `offset` before a read there: refused as lseek refuses it.
  void Seek(Int offset) const {
    if (offset > INT64_MAX || offset < INT64_MIN)
      throw Error("cannot fit 'int' into an offset-sized integer");
    if (offset < 0) throw Error(py::OsErrorText(EINVAL));
    if (lseek(fd_, static_cast<off_t>(offset), SEEK_SET) < 0) throw Error(py::OsErrorText(errno));
  }

  // The bytes [offset, offset + count) that lie in the file (fewer near its end, none outside).
  std::string Read(Int offset, Int count) const {
    if (offset < 0 || offset >= size_ || count <= 0) return "";
    const auto take = static_cast<size_t>(std::min<Int>(count, size_ - offset));
    std::string out(take, '\0');
    for (size_t done = 0; done < take;) {
      const ssize_t got = pread(fd_, out.data() + done, take - done, static_cast<off_t>(offset + done));
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) throw Error(py::OsErrorText(errno));
      if (got == 0) {
        out.resize(done);  // the file shrank while being read
        break;
      }
      done += static_cast<size_t>(got);
    }
    return out;
  }

 private:
  int fd_;
  int64_t size_;
};

// A member name as zipfile decodes it: UTF-8 where the flag says so (an error as
// bytes.decode("utf-8") raises it), else code page 437.
std::string DecodeName(std::string_view raw, bool utf8) {
  if (utf8) {
    if (const std::optional<std::string> error = py::Utf8Error(raw)) throw Error(*error);
    return std::string(raw);
  }
  std::string out;
  for (const char character : raw) {
    const auto byte = static_cast<unsigned char>(character);
    py::AppendUtf8(byte < 0x80 ? byte : kCp437[byte - 0x80], &out);
  }
  return out;
}

}  // namespace

// One entry of the central directory (zipfile's ZipInfo).
struct Archive::Entry {
  std::string name;       // ZipInfo.filename: the decoded name, cut at a NUL
  std::string full_name;  // ZipInfo.orig_filename
  uint16_t flags = 0;
  uint16_t method = 0;
  uint32_t crc = 0;
  uint64_t compress_size = 0;
  uint64_t file_size = 0;
  Int header_offset = 0;
};

namespace {

// ZipInfo._decodeExtra: the ZIP64 sizes and offset of an entry whose 32-bit fields are full.
void DecodeExtra(std::string_view extra, Archive::Entry* entry) {
  while (extra.size() >= 4) {
    const auto kind = static_cast<unsigned>(Little(extra, 0, 2));
    const auto length = static_cast<size_t>(Little(extra, 2, 2));
    if (length + 4 > extra.size()) {
      char text[64];
      std::snprintf(text, sizeof(text), "Corrupt extra field %04x (size=%zu)", kind, length);
      throw Error(text);
    }
    if (kind == 0x0001) {
      std::string_view data = extra.substr(4, length);
      const auto take = [&](const char* field) {
        if (data.size() < 8) throw Error(std::string("Corrupt zip64 extra field. ") + field + " not found.");
        const uint64_t value = Little(data, 0, 8);
        data.remove_prefix(8);
        return value;
      };
      if (entry->file_size == 0xFFFFFFFFFFFFFFFFull || entry->file_size == 0xFFFFFFFFull) {
        entry->file_size = take("File size");
      }
      if (entry->compress_size == 0xFFFFFFFFull) entry->compress_size = take("Compress size");
      if (entry->header_offset == 0xFFFFFFFF) entry->header_offset = take("Header offset");
    }
    extra.remove_prefix(length + 4);
  }
}

// The end of central directory record (zipfile's _EndRecData, with _EndRecData64).
struct EndRecord {
  bool zip64 = false;
  uint64_t directory_bytes = 0;
  uint64_t directory_offset = 0;
  Int location = 0;  // where the record lies in the file
};

// _EndRecData64: the ZIP64 record just before the end record at `offset` (from the file's end).
void ReadZip64End(const File& file, Int offset, EndRecord* record) {
  const Int locator_at = file.size() + offset - 20;
  if (locator_at < 0) return;
  const std::string locator = file.Read(locator_at, 20);
  if (locator.size() != 20 || locator.compare(0, 4, "PK\x06\x07") != 0) return;
  if (Little(locator, 4, 4) != 0 || Little(locator, 16, 4) > 1) {
    throw Error("zipfiles that span multiple disks are not supported");
  }
  const Int end64_at = locator_at - 56;
  if (end64_at < 0) throw Error("File is not a zip file");  // zipfile's seek fails there
  const std::string end64 = file.Read(end64_at, 56);
  if (end64.size() != 56 || end64.compare(0, 4, "PK\x06\x06") != 0) return;
  record->zip64 = true;
  record->directory_bytes = Little(end64, 40, 8);
  record->directory_offset = Little(end64, 48, 8);
}

EndRecord FindEndRecord(const File& file) {
  constexpr Int kEndBytes = 22;
  const auto parse = [](std::string_view bytes, Int location) {
    EndRecord record;
    record.directory_bytes = Little(bytes, 12, 4);
    record.directory_offset = Little(bytes, 16, 4);
    record.location = location;
    return record;
  };
  if (file.size() < kEndBytes) throw Error("File is not a zip file");
  // An archive without a comment ends with the record.
  const std::string tail = file.Read(file.size() - kEndBytes, kEndBytes);
  if (tail.size() == kEndBytes && tail.compare(0, 4, "PK\x05\x06") == 0 && tail[20] == 0 && tail[21] == 0) {
    EndRecord record = parse(tail, file.size() - kEndBytes);
    ReadZip64End(file, -kEndBytes, &record);
    return record;
  }
  // Else the last record signature within the longest comment's reach.
  const Int search_from = std::max<Int>(file.size() - (1 << 16) - kEndBytes, 0);
  const std::string data = file.Read(search_from, file.size() - search_from);
  const size_t start = data.rfind("PK\x05\x06");
  if (start == std::string::npos || data.size() - start < kEndBytes) throw Error("File is not a zip file");
  EndRecord record =
      parse(std::string_view(data).substr(start, kEndBytes), search_from + static_cast<Int>(start));
  ReadZip64End(file, record.location - file.size(), &record);
  return record;
}

// ZipFile._RealGetContents: the entries of the central directory, in order.
std::vector<Archive::Entry> ReadDirectory(const File& file) {
  const EndRecord end = FindEndRecord(file);
  // Non-zero where the archive was appended to other bytes: every offset moves by it.
  Int concat = end.location - static_cast<Int>(end.directory_bytes) - static_cast<Int>(end.directory_offset);
  if (end.zip64) concat -= 56 + 20;
  const Int start = static_cast<Int>(end.directory_offset) + concat;
  if (start < 0) throw Error("Bad offset for central directory");
  const std::string directory = file.Read(start, static_cast<Int>(end.directory_bytes));
  std::string_view rest = directory;
  const auto take = [&](size_t count) {
    const std::string_view part = rest.substr(0, std::min(count, rest.size()));
    rest.remove_prefix(part.size());
    return part;
  };
  std::vector<Archive::Entry> entries;
  for (Int total = 0; total < static_cast<Int>(end.directory_bytes);) {
    if (rest.size() < 46) throw Error("Truncated central directory");
    const std::string_view fixed = take(46);
    if (fixed.substr(0, 4) != std::string_view("PK\x01\x02", 4)) {
      throw Error("Bad magic number for central directory");
    }
    Archive::Entry entry;
    const auto extract_version = static_cast<unsigned>(Little(fixed, 6, 1));
    entry.flags = static_cast<uint16_t>(Little(fixed, 8, 2));
    entry.method = static_cast<uint16_t>(Little(fixed, 10, 2));
    entry.crc = static_cast<uint32_t>(Little(fixed, 16, 4));
    entry.compress_size = Little(fixed, 20, 4);
    entry.file_size = Little(fixed, 24, 4);
    const size_t name_bytes = Little(fixed, 28, 2), extra_bytes = Little(fixed, 30, 2);
    const size_t comment_bytes = Little(fixed, 32, 2);
    entry.header_offset = Little(fixed, 42, 4);
    entry.full_name = DecodeName(take(name_bytes), entry.flags & 0x800);
    entry.name = entry.full_name.substr(0, entry.full_name.find('\0'));
    const std::string_view extra = take(extra_bytes);
    take(comment_bytes);
    if (extract_version > 63) {
      char text[64];
      std::snprintf(text, sizeof(text), "zip file version %.1f", extract_version / 10.0);
      throw Error(text);
    }
    DecodeExtra(extra, &entry);
    entry.header_offset += concat;
    entries.push_back(std::move(entry));
    total += 46 + static_cast<Int>(name_bytes + extra_bytes + comment_bytes);
  }
  return entries;
}

// ZipFile.open(name).read(): a member's bytes, after zipfile's checks of its local header and
// with its CRC-32 checked.
std::string ReadMember(const File& file, const Archive::Entry& entry, const std::string& name) {
  file.Seek(entry.header_offset);  // as zipfile does first
  const std::string header = file.Read(entry.header_offset, 30);
  if (header.size() != 30) throw Error("Truncated file header");
  if (header.compare(0, 4, "PK\x03\x04") != 0) throw Error("Bad magic number for file header");
  const auto local_flags = static_cast<uint16_t>(Little(header, 6, 2));
  const Int name_bytes = static_cast<Int>(Little(header, 26, 2));
  const Int extra_bytes = static_cast<Int>(Little(header, 28, 2));
  const std::string local_name = file.Read(entry.header_offset + 30, name_bytes);
  if (entry.flags & 0x20) throw Error("compressed patched data (flag bit 5)");
  if (entry.flags & 0x40) throw Error("strong encryption (flag bit 6)");
  if (DecodeName(local_name, local_flags & 0x800) != entry.full_name) {
    throw Error("File name in directory " + py::ReprText(entry.full_name) + " and header " +
                py::ReprBytes(local_name) + " differ.");
  }
  if (entry.flags & 0x1)
    throw Error("File " + py::ReprText(name) + " is encrypted, password required for extraction");
  if (entry.method == 8 || entry.method == 12 || entry.method == 14) {
    // numpy's savez stores its members; savez_compressed's (deflate) are not read here.
    throw Error("member " + py::ReprText(entry.name) + " is compressed (method " +
                std::to_string(entry.method) + "); only stored members are read");
  }
  if (entry.method != 0) throw Error("That compression method is not supported");
  const Int length = static_cast<Int>(std::min(entry.compress_size, entry.file_size));
  const std::string data = file.Read(entry.header_offset + 30 + name_bytes + extra_bytes, length);
  if (static_cast<Int>(data.size()) < length)
    throw Error("the file ends inside member " + py::ReprText(entry.name));
  if (Crc32(data.data(), data.size()) != entry.crc)
    throw Error("Bad CRC-32 for file " + py::ReprText(entry.name));
  return data;
}

// The dtype numpy makes of a descr string (numpy.dtype(descr)), or nothing where it is none that is
// read here.
std::optional<Dtype> ParseDescr(const std::string& descr) {
  static const std::pair<const char*, const char*> kNames[] = {
      {"bool", "b1"},    {"int8", "i1"},      {"int16", "i2"},       {"int32", "i4"},  {"int64", "i8"},
      {"uint8", "u1"},   {"uint16", "u2"},    {"uint32", "u4"},      {"uint64", "u8"}, {"float16", "f2"},
      {"float32", "f4"}, {"float64", "f8"},   {"b", "i1"},           {"B", "u1"},      {"h", "i2"},
      {"H", "u2"},       {"i", "i4"},         {"I", "u4"},           {"l", "i8"},      {"L", "u8"},
      {"q", "i8"},       {"Q", "u8"},         {"p", "i8"},           {"P", "u8"},      {"e", "f2"},
      {"f", "f4"},       {"d", "f8"},         {"?", "b1"},           {"O", "O8"},      {"object", "O8"},
      {"int", "i8"},     {"float", "f8"},     {"g", "f16"},          {"F", "c8"},      {"D", "c16"},
      {"G", "c32"},      {"complex64", "c8"}, {"complex128", "c16"},
  };
  std::string text = descr;
  Dtype dtype;
  const auto byte_order = [&]() {
    if (!text.empty() && text[0] != '\0' && std::strchr("<>|=", text[0]) != nullptr) {
      dtype.big_endian = text[0] == '>';
      text.erase(0, 1);
    }
  };
  byte_order();
  // A count before the type makes each item that many values (numpy's subarray).
  const size_t digits_end = text.find_first_not_of("0123456789");
  if (digits_end != 0 && digits_end != std::string::npos) {
    if (text[0] == '0' && digits_end > 1) return std::nullopt;
    dtype.repeat = std::strtoull(text.substr(0, digits_end).c_str(), nullptr, 10);
    if (dtype.repeat > (1u << 20)) return std::nullopt;
    text.erase(0, digits_end);
    byte_order();
  }
  for (const auto& [name, code] : kNames) {
    if (text == name) {
      text = code;
      break;
    }
  }
  if (text.empty()) return std::nullopt;
  const char kind = text[0];
  const std::string digits = text.substr(1);
  if (!digits.empty() && digits.find_first_not_of("0123456789") != std::string::npos) {
    // Sized string, void and datetime types read as "other"; anything else is no dtype.
    if ((kind == 'M' || kind == 'm') && digits.rfind("8[", 0) == 0 && digits.back() == ']') {
      dtype.kind = 'i', dtype.itemsize = 8;  // datetimes read as their int64 counts
      return dtype;
    }
    return std::nullopt;
  }
  const size_t size = digits.empty() ? 0 : std::strtoull(digits.c_str(), nullptr, 10);
  switch (kind) {
    case 'b':
      if (size != 1) return std::nullopt;
      dtype.kind = 'b', dtype.itemsize = 1;
      return dtype;
    case 'i':
    case 'u':
      if (size != 1 && size != 2 && size != 4 && size != 8) return std::nullopt;
      dtype.kind = kind, dtype.itemsize = size;
      return dtype;
    case 'f':
      if (size != 2 && size != 4 && size != 8 && size != 16) return std::nullopt;
      dtype.kind = size == 16 ? '?' : 'f', dtype.itemsize = size;
      return dtype;
    case 'c':
      if (size != 8 && size != 16 && size != 32) return std::nullopt;
      dtype.kind = '?', dtype.itemsize = size;
      return dtype;
    case 'O':
      if (size != 0 && size != 8) return std::nullopt;
      dtype.kind = 'O', dtype.itemsize = 8;
      return dtype;
    case 'S':
    case 'a':
    case 'V':
      dtype.kind = '?', dtype.itemsize = size;
      return dtype;
    case 'U':
      dtype.kind = '?', dtype.itemsize = 4 * size;
      return dtype;
    case 'M':
    case 'm':
      if (size != 8 || digits.empty()) return std::nullopt;
      dtype.kind = 'i', dtype.itemsize = 8;
      return dtype;
    default:
      return std::nullopt;
  }
}

// numpy's shape as its reshape errors write it: (2,), (1,2), ().
std::string ShapeText(const std::vector<int64_t>& dims) {
  std::string text = "(";
  for (size_t index = 0; index < dims.size(); ++index)
    text += (index ? "," : "") + std::to_string(dims[index]);
  return text + (dims.size() == 1 ? ",)" : ")");
}

// format.read_array over `content` (a member's bytes, or a whole .npy file where `whole_file`),
// which starts with the .npy magic.
Array ReadArray(std::string_view content, bool whole_file) {
  const auto eof = [](const char* what, size_t expected, size_t got) {
    return Error(std::string("EOF: reading ") + what + ", expected " + std::to_string(expected) +
                 " bytes got " + std::to_string(got));
  };
  if (content.size() < 8) throw eof("magic string", 8, content.size());
  const unsigned major = static_cast<unsigned char>(content[6]),
                 minor = static_cast<unsigned char>(content[7]);
  if (!((major == 1 || major == 2 || major == 3) && minor == 0)) {
    throw Error("we only support format version (1,0), (2,0), and (3,0), not (" + std::to_string(major) +
                ", " + std::to_string(minor) + ")");
  }
  const size_t length_bytes = major == 1 ? 2 : 4;
  std::string_view rest = content.substr(8);
  if (rest.size() < length_bytes) throw eof("array header length", length_bytes, rest.size());
  const uint64_t header_bytes = Little(rest, 0, length_bytes);
  rest.remove_prefix(length_bytes);
  if (rest.size() < header_bytes) throw eof("array header", header_bytes, rest.size());
  const std::string_view raw = rest.substr(0, header_bytes);
  rest.remove_prefix(header_bytes);
  // Versions 1 and 2 are latin-1, version 3 UTF-8.
  std::vector<uint32_t> points;
  if (major == 3) {
    if (const std::optional<std::string> error = py::Utf8Error(raw)) throw Error(*error);
    points = py::CodePoints(raw);
  } else {
    for (const char c : raw) points.push_back(static_cast<unsigned char>(c));
  }
  if (points.size() > kMaxHeaderChars) {
    throw Error(
        "Header info length (" + std::to_string(points.size()) +
        ") is large and may not be safe to load securely.\nTo allow loading, adjust `max_header_size` or "
        "fully trust the `.npy` file using `allow_pickle=True`.\nFor safety against large resource use or "
        "crashes, sandboxing may be necessary.");
  }
  std::string header;
  for (const uint32_t point : points) py::AppendUtf8(point, &header);
  std::optional<Value> parsed;
  try {
    parsed = py::LiteralEval(points);
  } catch (const py::Exception& error) {
    throw Error(error.text());
  }
  if (!parsed) throw Error("Cannot parse header: " + py::ReprText(header));
  const Value& d = *parsed;
  if (d.kind != Value::Kind::kDict) throw Error("Header is not a dictionary: " + py::Repr(d));
  std::vector<Value> keys = py::Iterate(d);
  const bool exact =
      keys.size() == 3 && py::Find(d, "descr") && py::Find(d, "fortran_order") && py::Find(d, "shape");
  if (!exact) {
    try {
      py::Sort(&keys);
    } catch (const py::Exception& error) {
      throw Error(error.text());  // keys of types that do not compare: sorted()'s TypeError
    }
    Value listed;
    listed.kind = Value::Kind::kList;
    listed.items = std::move(keys);
    throw Error("Header does not contain the correct keys: " + py::Repr(listed));
  }
  const Value& shape = *py::Find(d, "shape");
  bool valid = shape.kind == Value::Kind::kTuple;
  for (const Value& dim : shape.items)
    valid = valid && (dim.kind == Value::Kind::kInt || dim.kind == Value::Kind::kBool);
  if (!valid) throw Error("shape is not valid: " + py::Repr(shape));
  const Value& fortran = *py::Find(d, "fortran_order");
  if (fortran.kind != Value::Kind::kBool)
    throw Error("fortran_order is not a valid bool: " + py::Repr(fortran));
  const Value& descr = *py::Find(d, "descr");
  const std::optional<Dtype> dtype = descr.kind == Value::Kind::kStr ? ParseDescr(descr.text) : std::nullopt;
  if (!dtype) throw Error("descr is not a valid dtype descriptor: " + py::Repr(descr));

  Array array;
  array.dtype = *dtype;
  array.descr = descr.text;
  // numpy multiplies the dims as int64 (wrapping); ndarray(count) refuses a negative count.
  uint64_t product = 1;
  for (const Value& dim : shape.items) {
    const Int value = dim.kind == Value::Kind::kBool ? (dim.truth ? 1 : 0) : dim.integer;
    if (dim.huge || value > INT64_MAX || value < INT64_MIN)
      throw Error("Python int too large to convert to C long");
    array.shape.push_back(static_cast<int64_t>(value));
    product *= static_cast<uint64_t>(static_cast<int64_t>(value));
  }
  const auto count = static_cast<int64_t>(product);
  if (array.dtype.kind == 'O') throw Error("Object arrays cannot be loaded when allow_pickle=False");
  if (count < 0) throw Error("negative dimensions are not allowed");
  const Int item_bytes = static_cast<Int>(array.dtype.itemsize * array.dtype.repeat);
  Int total = 0;
  if (__builtin_mul_overflow(static_cast<Int>(count), item_bytes, &total) || total > INT64_MAX) {
    throw Error(
        "array is too big; `arr.size * arr.dtype.itemsize` is larger than the maximum possible size.");
  }
  // numpy gives the array its shape after reading its data: the dims it refuses there.
  std::vector<int64_t> dims = array.shape;
  if (fortran.truth) std::reverse(dims.begin(), dims.end());
  const auto reshape = [&](Int size) {
    for (const Value& dim : shape.items) {
      if (dim.kind == Value::Kind::kBool) return Error("an integer is required");
    }
    if (std::any_of(dims.begin(), dims.end(), [](int64_t dim) { return dim < 0; })) {
      return Error("negative dimensions are not allowed");
    }
    return Error("cannot reshape array of size " + py::FormatInt(size) + " into shape " + ShapeText(dims));
  };
  if (total > static_cast<Int>(rest.size())) {
    // A file is read with numpy.fromfile (as much as there is, then the shape fails); a member
    // BUFFER_SIZE bytes' worth of items at a time (the error names the read that ran out).
    if (whole_file)
      throw reshape(static_cast<Int>(rest.size()) / item_bytes * static_cast<Int>(array.dtype.repeat));
    const Int per_read = kReadBufferBytes / std::min<Int>(kReadBufferBytes, item_bytes);
    const Int read_bytes = per_read * item_bytes;
    const Int reads_done = static_cast<Int>(rest.size()) / read_bytes;
    const Int wanted = std::min<Int>(per_read, count - reads_done * per_read) * item_bytes;
    throw eof("array data", static_cast<size_t>(wanted),
              rest.size() - static_cast<size_t>(reads_done * read_bytes));
  }
  // The items' values of a subarray dtype make an extra dimension the shape leaves no room for.
  const Int size = static_cast<Int>(count) * static_cast<Int>(array.dtype.repeat);
  const bool bool_dim = std::any_of(shape.items.begin(), shape.items.end(),
                                    [](const Value& dim) { return dim.kind == Value::Kind::kBool; });
  if (bool_dim || size != count ||
      std::any_of(dims.begin(), dims.end(), [](int64_t dim) { return dim < 0; })) {
    throw reshape(size);
  }
  array.count = static_cast<size_t>(count);
  array.data_offset = content.size() - rest.size();
  return array;
}

}  // namespace

namespace {

// The bits of item `index` of `array`, whose data lie in `bytes`, as an unsigned number.
uint64_t ItemBits(const Array& array, const std::string& bytes, size_t index) {
  const size_t width = array.dtype.itemsize;
  const size_t at = array.data_offset + index * width;
  uint64_t bits = 0;
  for (size_t byte = 0; byte < width; ++byte) {
    const size_t from = array.dtype.big_endian ? width - 1 - byte : byte;
    bits |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[at + from])) << (8 * byte);
  }
  return bits;
}

}  // namespace

int64_t Member::IntegerItem(size_t index) const {
  uint64_t bits = ItemBits(*array, bytes, index);
  const size_t width = array->dtype.itemsize;
  if (array->dtype.kind == 'b') return bits != 0;
  if (array->dtype.kind == 'i' && width < 8 && (bits >> (8 * width - 1)) != 0) bits |= ~0ull << (8 * width);
  return static_cast<int64_t>(bits);
}

double Member::FloatItem(size_t index) const {
  const uint64_t bits = ItemBits(*array, bytes, index);
  const size_t width = array->dtype.itemsize;
  if (width == 8) {
    double value;
    std::memcpy(&value, &bits, 8);
    return value;
  }
  if (width == 4) {
    float value;
    const auto word = static_cast<uint32_t>(bits);
    std::memcpy(&value, &word, 4);
    return value;
  }
  // IEEE half: sign, 5 exponent bits, 10 fraction bits.
  const int exponent = static_cast<int>((bits >> 10) & 0x1F);
  const double fraction = static_cast<double>(bits & 0x3FF);
  double value = exponent == 0    ? std::ldexp(fraction, -24)
                 : exponent == 31 ? (fraction == 0 ? HUGE_VAL : NAN)
                                  : std::ldexp(1024 + fraction, exponent - 25);
  return (bits & 0x8000) ? -value : value;
}

Archive::Archive(const std::string& path, const std::string& shown) {
  fd_ = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw Error(py::OsErrorText(errno, shown));
  struct stat status;
  size_ = fstat(fd_, &status) == 0 ? status.st_size : 0;
  try {
    const File file(fd_, size_);
    // np.load tells an archive, a .npy file and a pickle apart by their first bytes.
    const std::string magic = file.Read(0, kNpyMagicBytes);
    if (magic.empty()) throw Error("No data left in file");
    if (magic.rfind("PK\x03\x04", 0) != 0 && magic.rfind("PK\x05\x06", 0) != 0) {
      if (magic != std::string_view(kNpyMagic, kNpyMagicBytes)) {
        throw Error("Cannot load file containing pickled data when allow_pickle=False");
      }
      ReadArray(file.Read(0, size_), true);
      // numpy reads the array; read_hot_ids cannot use it as an archive.
      throw Error("'numpy.ndarray' object does not support the context manager protocol");
    }
    entries_ = ReadDirectory(file);
  } catch (...) {
    close(fd_);
    throw;
  }
}

Archive::~Archive() { close(fd_); }

Member Archive::Get(const std::string& key) const {
  const auto has = [&](const std::string& name) {
    return std::any_of(entries_.begin(), entries_.end(),
                       [&](const Entry& entry) { return entry.name == name; });
  };
  std::string name = key;
  if (!has(key)) {
    name = key + ".npy";
    if (!has(name)) throw Error(py::ReprText(key + " is not a file in the archive"));  // str(KeyError)
  }
  // The last entry of a repeated name, as zipfile's name index keeps it.
  const Entry* entry = nullptr;
  for (const Entry& candidate : entries_) {
    if (candidate.name == name) entry = &candidate;
  }
  Member member;
  member.bytes = ReadMember(File(fd_, size_), *entry, name);
  if (member.bytes.compare(0, kNpyMagicBytes, kNpyMagic) == 0) member.array = ReadArray(member.bytes, false);
  return member;
}

}  // namespace stages::embedding::npz
