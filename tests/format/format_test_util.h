// Helpers shared by the format suites: building containers in memory, the small container the
// corruption tests damage bit by bit, and a forger that edits index fields and re-seals the
// checksums so that only the structural rule under test can catch the change.
#pragma once

#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "format/record_codec.h"
#include "zckpt/container.h"
#include "zckpt/container_writer.h"
#include "zckpt/error.h"
#include "zckpt/format.h"

namespace zckpt::testing {

// Runs `fill` on a writer to a temporary file, commits, and returns the file's bytes.
std::vector<uint8_t> BuildContainer(const std::function<void(ContainerWriter&)>& fill, const WriterOptions& options = {});

// A NewTensor without spelling out every field.
NewTensor Tensor(std::string name, uint32_t storage, DType dtype, std::vector<int64_t> shape,
                 std::vector<int64_t> stride, uint64_t storage_offset = 0, uint32_t flags = 0, std::string extra = "");

// Bytes that zstd cannot shrink / that it shrinks a lot.
std::vector<uint8_t> RandomBytes(size_t n, uint64_t seed);
std::vector<uint8_t> PatternBytes(size_t n, uint64_t seed = 0);

// A container of ~1.5 KB holding a zstd chunk, a raw chunk, an empty storage, a 0-dim and an
// empty tensor, views, a blob, metadata and padding gaps: every kind of byte the format has.
std::vector<uint8_t> SmallContainer();

// Edits a container's bytes in place. Offsets of tables and records come from the current
// (possibly already forged) descriptors; Reseal() recomputes the superblock, index and footer
// checksums.
class Forger {
 public:
  explicit Forger(std::vector<uint8_t> bytes) : bytes_(std::move(bytes)) {}
  std::vector<uint8_t>& bytes() { return bytes_; }
  uint8_t* superblock() { return bytes_.data(); }
  uint8_t* footer() { return bytes_.data() + bytes_.size() - format::kFooterBytes; }
  uint64_t index_offset() const;
  uint8_t* index();
  uint8_t* descriptor(uint32_t i);  // i counts from 0; table id i + 1 in a valid file
  format::TableDescriptor Descriptor(uint32_t i) { return format::DecodeTableDescriptor(descriptor(i)); }
  uint8_t* record(format::TableId table, uint64_t i);

  void Set16(uint8_t* p, uint16_t v);
  void Set32(uint8_t* p, uint32_t v);
  void Set64(uint8_t* p, uint64_t v);

  // Recomputes the superblock checksum, the index checksum in the footer and the footer checksum.
  std::vector<uint8_t>& Reseal();

 private:
  std::vector<uint8_t> bytes_;
};

// A storage's raw bytes, chunk by chunk through ReadChunk (checked).
std::vector<uint8_t> ReadStorage(const Container& c, uint32_t s);

// Opens bytes in memory; on success runs Verify with `threads` threads.
struct OpenResult {
  bool opened = false;
  ErrorKind kind = ErrorKind::kIo;
  std::string message;
  VerifyReport report;
};
OpenResult OpenAndVerify(const std::vector<uint8_t>& bytes, unsigned threads = 1);

}  // namespace zckpt::testing
