#include "zckpt/error.h"

namespace zckpt {

const char* ErrorKindName(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kIo: return "io";
    case ErrorKind::kNotContainer: return "not-a-container";
    case ErrorKind::kCorrupt: return "corrupt";
    case ErrorKind::kUnsupported: return "unsupported";
    case ErrorKind::kUnsafe: return "unsafe";
    case ErrorKind::kInvalidArgument: return "invalid-argument";
    case ErrorKind::kCancelled: return "cancelled";
    case ErrorKind::kOutOfMemory: return "out-of-memory";
  }
  return "unknown";
}

}  // namespace zckpt
