// Errors raised by every zckpt layer.
//
// One exception type with a kind, so the command-line tool can map kinds to exit codes
// (kCorrupt -> 1, everything that stops it from running -> 2) and the Python module to
// exception classes, without parsing messages.
#pragma once

#include <stdexcept>
#include <string>

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

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

}  // namespace zckpt
