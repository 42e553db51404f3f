// Errors raised by every zckpt layer.
//
// One exception type with a kind, so the command-line tool can map kinds to exit codes
// (IsFinding -> 1, everything that stops it from running -> 2) and the Python module to
// exception classes, without parsing messages. An error about bytes of a checkpoint also carries
// where they are (ErrorPlace) as fields, which the message says in words.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace zckpt {

enum class ErrorKind {
  kIo,           // open/read/write/mmap/fsync failed (errno text in the message)
  kNotContainer, // not a .zckpt / not a .pt at all (wrong magic, too short to hold one)
  kCorrupt,      // structurally invalid or failed a checksum: the file is damaged or forged
  kUnsupported,  // valid but uses a version/feature this build does not implement
  kUnsafe,       // a pickle names a global that could run code, or one not known to be data; refused
  kInvalidArgument,  // caller error (bad option, shape mismatch in load_into, ...)
  kCancelled,    // stopped on request
  kOutOfMemory,  // a device or host allocation failed (torch's allocator, pinned memory): the
                 // Python package raises zckpt.OutOfMemoryError, a torch.OutOfMemoryError
};

const char* ErrorKindName(ErrorKind kind);

// The one verdict rule: an error of this kind is a finding about the checkpoint (damaged, forged,
// or refused as unsafe: `zckpt verify` exit 1, a problem in zckpt.verify's list), every other
// kind a failure to check it (exit 2, raised).
constexpr bool IsFinding(ErrorKind kind) { return kind == ErrorKind::kCorrupt || kind == ErrorKind::kUnsafe; }

// A half-open byte range [begin, end).
struct ByteRange {
  uint64_t begin = 0;
  uint64_t end = 0;
  bool operator==(const ByteRange&) const = default;
};

// Where in a checkpoint a problem lies; each field is unset when the problem is not about it.
// The Python package gives these to every ZckptError as attributes (file, storage, tensors, chunk,
// file_bytes, storage_bytes), whose class is that of its kind (zckpt/_errors.py).
struct ErrorPlace {
  std::string file;                    // the file (or object URL) holding the bytes
  std::string storage;                 // storage key
  std::vector<std::string> tensors;    // tensors viewing that storage, or the tensor concerned
  int64_t chunk = -1;                  // index in the chunk table, -1 when not about a chunk
  std::optional<ByteRange> file_bytes;     // the bytes of the file concerned
  std::optional<ByteRange> storage_bytes;  // the same bytes within the storage
};

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  Error(ErrorKind kind, const std::string& message, ErrorPlace place)
      : std::runtime_error(message), kind_(kind), place_(std::move(place)) {}
  ErrorKind kind() const { return kind_; }
  const ErrorPlace& place() const { return place_; }

 private:
  ErrorKind kind_;
  ErrorPlace place_;
};

}  // namespace zckpt
