#include "npz.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <string_view>

#include "crc32.h"

namespace stages::embedding::npz {

namespace {

constexpr std::string_view kNpyMagic("\x93NUMPY", 6);
constexpr std::string_view kLocalMagic("PK\x03\x04", 4);
constexpr std::string_view kDirectoryMagic("PK\x01\x02", 4);
constexpr std::string_view kEndMagic("PK\x05\x06", 4);
constexpr std::string_view kEnd64Magic("PK\x06\x06", 4);
constexpr std::string_view kLocatorMagic("PK\x06\x07", 4);
constexpr uint64_t kEndBytes = 22;        // the end of central directory record, without its comment
constexpr uint64_t kLocatorBytes = 20;    // the ZIP64 end record's locator
constexpr uint64_t kEnd64Bytes = 56;      // the ZIP64 end record's fixed part
constexpr uint64_t kDirectoryBytes = 46;  // a central directory entry's fixed part
constexpr uint64_t kLocalBytes = 30;      // a local file header's fixed part
constexpr uint64_t kMaxComment = 0xFFFF;
constexpr size_t kShownChars = 80;

uint64_t Little(std::string_view bytes, size_t at, size_t width) {
  uint64_t value = 0;
  for (size_t index = 0; index < width; ++index) {
    value |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[at + index])) << (8 * index);
  }
  return value;
}

// `text` as a message shows it: printable ASCII as itself, any other byte as \xNN, at most
// kShownChars characters of it (a numpy header's dict is shorter).
std::string Shown(std::string_view text) {
  std::string out;
  for (const char character : text.substr(0, kShownChars)) {
    const auto byte = static_cast<unsigned char>(character);
    if (byte >= 0x20 && byte < 0x7F && byte != '\\') {
      out += character;
    } else {
      static const char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[byte >> 4];
      out += kHex[byte & 0xF];
    }
  }
  return text.size() > kShownChars ? out + "..." : out;
}

// The bytes [offset, offset + count) of the file, all of them, or Error saying `what` lies
// outside it.
std::string ReadExactly(int fd, uint64_t size, uint64_t offset, uint64_t count, const std::string& what) {
  if (offset > size || count > size - offset) {
    throw Error(what + " (" + std::to_string(count) + " bytes at " + std::to_string(offset) +
                ") lies outside the file of " + std::to_string(size) + " bytes");
  }
  std::string out(static_cast<size_t>(count), '\0');
  for (size_t done = 0; done < out.size();) {
    const ssize_t got = pread(fd, out.data() + done, out.size() - done, static_cast<off_t>(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) throw Error("cannot read it: " + std::string(std::strerror(errno)));
    if (got == 0) throw Error("the file shrank while it was read");
    done += static_cast<size_t>(got);
  }
  return out;
}

// The central directory's place, from the end record (and the ZIP64 one where there is one).
struct Directory {
  uint64_t offset = 0;
  uint64_t bytes = 0;
  uint64_t entries = 0;
  uint64_t end = 0;  // where the records after it start: nothing of the directory lies past this
};

Directory FindDirectory(int fd, uint64_t size) {
  if (size < kEndBytes) throw Error("no ZIP end record: not a .npz archive");
  const uint64_t reach = std::min(size, kEndBytes + kMaxComment);
  const std::string tail = ReadExactly(fd, size, size - reach, reach, "the archive's end");
  // The last end record whose comment ends where the file does.
  size_t at = tail.size() - kEndBytes + 1;
  std::optional<size_t> found;
  while (at > 0 && !found) {
    at = tail.rfind(kEndMagic, at - 1);
    if (at == std::string::npos) break;
    if (at + kEndBytes + Little(tail, at + 20, 2) == tail.size()) found = at;
  }
  if (!found) throw Error("no ZIP end record: not a .npz archive");
  const std::string_view record = std::string_view(tail).substr(*found, kEndBytes);
  Directory directory;
  directory.end = size - reach + *found;
  if (Little(record, 4, 2) != 0 || Little(record, 6, 2) != 0 ||
      Little(record, 8, 2) != Little(record, 10, 2)) {
    throw Error("its end records describe an archive split over disks (numpy writes one file)");
  }
  directory.entries = Little(record, 10, 2);
  directory.bytes = Little(record, 12, 4);
  directory.offset = Little(record, 16, 4);
  // numpy asks for ZIP64 records: a locator right before the end record points at them.
  if (directory.end >= kLocatorBytes) {
    const std::string locator =
        ReadExactly(fd, size, directory.end - kLocatorBytes, kLocatorBytes, "the ZIP64 locator");
    if (locator.compare(0, 4, kLocatorMagic) == 0) {
      if (Little(locator, 4, 4) != 0 || Little(locator, 16, 4) > 1) {
        throw Error("its end records describe an archive split over disks (numpy writes one file)");
      }
      const uint64_t end64_at = Little(locator, 8, 8);
      const std::string end64 = ReadExactly(fd, size, end64_at, kEnd64Bytes, "the ZIP64 end record");
      if (end64.compare(0, 4, kEnd64Magic) != 0) {
        throw Error("the ZIP64 locator points at " + std::to_string(end64_at) +
                    ", where no ZIP64 end record is");
      }
      // numpy (Python's zipfile) writes the record without extensible data, right before its locator.
      if (Little(end64, 4, 8) != kEnd64Bytes - 12 ||
          end64_at + kEnd64Bytes != directory.end - kLocatorBytes) {
        throw Error("the ZIP64 end record does not end where its locator starts");
      }
      if (Little(end64, 16, 4) != 0 || Little(end64, 20, 4) != 0 ||
          Little(end64, 24, 8) != Little(end64, 32, 8)) {
        throw Error("its end records describe an archive split over disks (numpy writes one file)");
      }
      directory.entries = Little(end64, 32, 8);
      directory.bytes = Little(end64, 40, 8);
      directory.offset = Little(end64, 48, 8);
      directory.end = end64_at;
    }
  }
  // numpy (Python's zipfile) writes the directory right before its end records: one that ends
  // elsewhere means bytes added to the archive, before it or inside it, or a damaged record.
  if (directory.offset > directory.end || directory.bytes != directory.end - directory.offset) {
    throw Error("the central directory (" + std::to_string(directory.bytes) + " bytes at " +
                std::to_string(directory.offset) + ") does not end where the archive's end records start (" +
                std::to_string(directory.end) + "): bytes added to the archive, or a damaged end record");
  }
  return directory;
}

// A shape as Python writes a tuple: (), (3,), (2, 3).
std::string ShapeText(const std::vector<uint64_t>& shape) {
  std::string text = "(";
  for (size_t index = 0; index < shape.size(); ++index)
    text += (index ? ", " : "") + std::to_string(shape[index]);
  return text + (shape.size() == 1 ? ",)" : ")");
}

// numpy's header dict, in the one layout numpy writes it:
// {'descr': '<i8', 'fortran_order': False, 'shape': (26,), } then spaces and a newline.
struct Header {
  std::string descr;
  std::vector<uint64_t> shape;
};

std::optional<Header> ParseHeader(std::string_view text) {
  const auto take = [&text](std::string_view expected) {
    if (text.substr(0, expected.size()) != expected) return false;
    text.remove_prefix(expected.size());
    return true;
  };
  Header header;
  if (!take("{'descr': '")) return std::nullopt;
  const size_t quote = text.find('\'');
  if (quote == std::string_view::npos) return std::nullopt;
  header.descr = std::string(text.substr(0, quote));
  text.remove_prefix(quote + 1);
  if (!take(", 'fortran_order': ") || !(take("False") || take("True")) || !take(", 'shape': (")) {
    return std::nullopt;
  }
  // (), (3,) or (2, 3): the shape as Python writes a tuple of ints, nothing else.
  const size_t close = text.find(')');
  if (close == std::string_view::npos) return std::nullopt;
  const std::string_view inside = text.substr(0, close);
  for (size_t at = 0; at < inside.size();) {
    const size_t digits = inside.find_first_not_of("0123456789", at);
    const size_t stop = digits == std::string_view::npos ? inside.size() : digits;
    if (stop == at || stop - at > 19) return std::nullopt;
    header.shape.push_back(std::stoull(std::string(inside.substr(at, stop - at))));
    at = stop;
    if (at < inside.size() && inside[at] == ',') ++at;
    if (at < inside.size() && inside[at] == ' ') ++at;
  }
  if ("(" + std::string(inside) + ")" != ShapeText(header.shape)) return std::nullopt;
  text.remove_prefix(close);
  if (!take("), }")) return std::nullopt;
  const size_t padding = text.find_first_not_of(' ');
  if (padding == std::string_view::npos || text.substr(padding) != "\n") return std::nullopt;
  return header;
}

// The integer dtype of a descriptor numpy writes ('<i8', '>u4', '|i1'): its bytes, signedness and
// byte order; nothing for any other.
struct IntegerType {
  size_t bytes = 0;
  bool is_signed = true;
  bool big_endian = false;
};

std::optional<IntegerType> ParseDescr(const std::string& descr) {
  if (descr.size() != 3 || (descr[1] != 'i' && descr[1] != 'u')) return std::nullopt;
  IntegerType type;
  type.is_signed = descr[1] == 'i';
  switch (descr[2]) {
    case '1':
    case '2':
    case '4':
    case '8':
      type.bytes = static_cast<size_t>(descr[2] - '0');
      break;
    default:
      return std::nullopt;
  }
  // numpy writes '|' for one byte, '<' or '>' for more.
  if (type.bytes == 1 ? descr[0] != '|' : (descr[0] != '<' && descr[0] != '>')) return std::nullopt;
  type.big_endian = descr[0] == '>';
  return type;
}

// The integers of a .npy member's bytes; `member` names it in errors.
Integers ReadIntegers(std::string_view content, const std::string& member) {
  const std::string where = "member " + member + ": ";
  if (content.substr(0, kNpyMagic.size()) != kNpyMagic) {
    throw Error(where + "not a .npy array (it does not start with numpy's magic \\x93NUMPY)");
  }
  if (content.size() < 10) throw Error(where + "the .npy array ends inside its preamble");
  const auto major = static_cast<unsigned char>(content[6]), minor = static_cast<unsigned char>(content[7]);
  if (major < 1 || major > 3 || minor != 0) {
    throw Error(where + ".npy format version " + std::to_string(major) + "." + std::to_string(minor) +
                " (numpy writes 1.0, 2.0 and 3.0)");
  }
  const size_t length_bytes = major == 1 ? 2 : 4;
  const size_t header_at = 8 + length_bytes;
  if (content.size() < header_at) throw Error(where + "the .npy array ends inside its preamble");
  const uint64_t header_bytes = Little(content, 8, length_bytes);
  if (header_bytes > content.size() - header_at) {
    throw Error(where + "its .npy header of " + std::to_string(header_bytes) +
                " bytes runs past the member's " + std::to_string(content.size()) + " bytes");
  }
  const std::string_view text = content.substr(header_at, static_cast<size_t>(header_bytes));
  const std::optional<Header> header = ParseHeader(text);
  if (!header) throw Error(where + "its .npy header is not one numpy writes: \"" + Shown(text) + "\"");
  const std::optional<IntegerType> type = ParseDescr(header->descr);
  if (!type) {
    throw Error(where + "dtype '" + Shown(header->descr) +
                "', expected integers (a numpy int or uint dtype)");
  }
  if (header->shape.size() != 1) {
    throw Error(where + "shape " + ShapeText(header->shape) + ", expected one dimension");
  }
  const uint64_t count = header->shape[0];
  const uint64_t data_bytes = content.size() - header_at - header_bytes;
  if (count > data_bytes / type->bytes || count * type->bytes != data_bytes) {
    throw Error(where + "its header says " + std::to_string(count) + " values of " +
                std::to_string(type->bytes) + " bytes, its data hold " + std::to_string(data_bytes) +
                " bytes");
  }
  Integers out;
  out.descr = header->descr;
  out.values.resize(static_cast<size_t>(count));
  const std::string_view data = content.substr(header_at + static_cast<size_t>(header_bytes));
  for (size_t index = 0; index < out.values.size(); ++index) {
    uint64_t bits = 0;
    for (size_t byte = 0; byte < type->bytes; ++byte) {
      const size_t from = type->big_endian ? type->bytes - 1 - byte : byte;
      bits |= static_cast<uint64_t>(static_cast<unsigned char>(data[index * type->bytes + from]))
              << (8 * byte);
    }
    const unsigned width = static_cast<unsigned>(8 * type->bytes);
    if (type->is_signed && width < 64 && (bits >> (width - 1)) != 0) bits |= ~uint64_t{0} << width;
    if (!type->is_signed && bits > static_cast<uint64_t>(INT64_MAX)) {
      throw Error(where + "value " + std::to_string(bits) + " at position " + std::to_string(index) +
                  " does not fit an int64");
    }
    out.values[index] = static_cast<int64_t>(bits);
  }
  return out;
}

}  // namespace

// One entry of the central directory.
struct Archive::Entry {
  std::string name;  // the name's bytes
  uint16_t flags = 0;
  uint16_t method = 0;
  uint32_t crc = 0;
  uint64_t compressed_bytes = 0;
  uint64_t bytes = 0;
  uint64_t header_offset = 0;
};

Archive::Archive(const std::string& path) {
  fd_ = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) throw Error("cannot open it: " + std::string(std::strerror(errno)));
  try {
    struct stat status;
    if (fstat(fd_, &status) != 0) throw Error("cannot read it: " + std::string(std::strerror(errno)));
    size_ = static_cast<uint64_t>(status.st_size);
    if (size_ == 0) throw Error("the file is empty");
    const std::string start =
        ReadExactly(fd_, size_, 0, std::min<uint64_t>(size_, kNpyMagic.size()), "its start");
    if (start == kNpyMagic) throw Error("a single .npy array, not the .npz archive numpy.savez writes");
    const Directory directory = FindDirectory(fd_, size_);
    const std::string listing =
        ReadExactly(fd_, size_, directory.offset, directory.bytes, "the central directory");
    std::string_view rest = listing;
    for (uint64_t index = 0; index < directory.entries; ++index) {
      const std::string which = "central directory entry " + std::to_string(index + 1);
      if (rest.size() < kDirectoryBytes || rest.substr(0, 4) != kDirectoryMagic) {
        throw Error(which + " of " + std::to_string(directory.entries) + " is damaged or missing");
      }
      Entry entry;
      // Python's zipfile reads ZIP versions up to 6.3 (numpy's members need 2.0, or 4.5 for ZIP64).
      const uint64_t version = Little(rest, 6, 1);
      if (version > 63) {
        throw Error(which + " needs ZIP version " + std::to_string(version / 10) + "." +
                    std::to_string(version % 10) + " to extract (at most 6.3 is read)");
      }
      entry.flags = static_cast<uint16_t>(Little(rest, 8, 2));
      entry.method = static_cast<uint16_t>(Little(rest, 10, 2));
      entry.crc = static_cast<uint32_t>(Little(rest, 16, 4));
      entry.compressed_bytes = Little(rest, 20, 4);
      entry.bytes = Little(rest, 24, 4);
      const size_t name_bytes = Little(rest, 28, 2), extra_bytes = Little(rest, 30, 2);
      const size_t comment_bytes = Little(rest, 32, 2);
      entry.header_offset = Little(rest, 42, 4);
      if (rest.size() - kDirectoryBytes < name_bytes + extra_bytes + comment_bytes) {
        throw Error(which + " runs past the central directory");
      }
      entry.name = std::string(rest.substr(kDirectoryBytes, name_bytes));
      std::string_view extra = rest.substr(kDirectoryBytes + name_bytes, extra_bytes);
      // The ZIP64 extra field: the 64-bit values of the fields that are full, in this order.
      while (extra.size() >= 4) {
        const uint64_t kind = Little(extra, 0, 2), length = Little(extra, 2, 2);
        if (length > extra.size() - 4) throw Error(which + ": an extra field runs past its entry");
        std::string_view data = extra.substr(4, static_cast<size_t>(length));
        if (kind == 0x0001) {
          for (uint64_t* field : {&entry.bytes, &entry.compressed_bytes, &entry.header_offset}) {
            if (*field != 0xFFFFFFFFu) continue;
            if (data.size() < 8) throw Error(which + ": its ZIP64 field is too short");
            *field = Little(data, 0, 8);
            data.remove_prefix(8);
          }
        }
        extra.remove_prefix(static_cast<size_t>(4 + length));
      }
      entries_.push_back(std::move(entry));
      rest.remove_prefix(kDirectoryBytes + name_bytes + extra_bytes + comment_bytes);
    }
    if (!rest.empty()) {
      throw Error("the central directory holds more than the " + std::to_string(directory.entries) +
                  " entries its end record counts");
    }
  } catch (...) {
    close(fd_);
    throw;
  }
}

Archive::~Archive() { close(fd_); }

Integers Archive::Get(const std::string& name) const {
  // The last entry of a repeated name wins, as Python's zipfile keeps it.
  const Entry* entry = nullptr;
  for (const std::string& candidate : {name + ".npy", name}) {
    for (const Entry& each : entries_) {
      if (each.name == candidate) entry = &each;
    }
    if (entry != nullptr) break;
  }
  if (entry == nullptr) throw Error("no member " + name + ".npy");
  const std::string member = Shown(entry->name);
  if (entry->flags & 0x41) throw Error("member " + member + " is encrypted");
  if (entry->flags & 0x20) throw Error("member " + member + " is patched data");
  if (entry->method != 0) {
    // numpy.savez stores its members; savez_compressed deflates them.
    throw Error("member " + member +
                " is compressed: save the hot set with numpy.savez, not savez_compressed");
  }
  if (entry->compressed_bytes != entry->bytes) {
    throw Error("member " + member + " is stored, but its sizes differ (" +
                std::to_string(entry->compressed_bytes) + " and " + std::to_string(entry->bytes) + " bytes)");
  }
  const std::string header =
      ReadExactly(fd_, size_, entry->header_offset, kLocalBytes, "member " + member + "'s local header");
  if (header.compare(0, 4, kLocalMagic) != 0) {
    throw Error("member " + member + ": no local header at " + std::to_string(entry->header_offset));
  }
  const uint64_t data_at = entry->header_offset + kLocalBytes + Little(header, 26, 2) + Little(header, 28, 2);
  const std::string local_name = ReadExactly(fd_, size_, entry->header_offset + kLocalBytes,
                                             Little(header, 26, 2), "member " + member + "'s name");
  if (local_name != entry->name) {
    throw Error("member " + member + ": its local header names \"" + Shown(local_name) + "\"");
  }
  const std::string content = ReadExactly(fd_, size_, data_at, entry->bytes, "member " + member + "'s data");
  if (Crc32(content.data(), content.size()) != entry->crc) {
    throw Error("member " + member + " is damaged (its CRC-32 differs from the archive's)");
  }
  return ReadIntegers(content, member);
}

}  // namespace stages::embedding::npz
