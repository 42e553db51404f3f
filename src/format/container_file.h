// What zckpt's own readers reach of a Container that its public header hides: the file as
// opened and the private copy of the index. Not API: the file's mapping may be rewritten or
// truncated under a reader, so only code that reads it under the SIGBUS guard
// (common/fault_guard.h), or by pread, and never checks a byte then uses it again, may use it
// (the loader's chunk reader, its mmap method and mapped verify, Container::Verify, tests).
#pragma once

#include <cstdint>
#include <span>

#include "common/mapped_file.h"
#include "zckpt/container.h"

namespace zckpt::format::internal {

struct ContainerFile {
  static const MappedFile& Of(const Container& c) { return *c.file_; }
  // The file as mapped at open (no mapping for an object: see MappedFile::remote()).
  static const uint8_t* Data(const Container& c) { return c.file_->data(); }
  // The index copy the accessors decode (index_bytes long, then the padding before the footer).
  static std::span<const uint8_t> Index(const Container& c) { return {c.index_.data(), c.index_.size()}; }
};

}  // namespace zckpt::format::internal
