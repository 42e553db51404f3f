// The one check of a chunk's bytes (spec §5.2, §7): every reader calls it, as LevelDB's readers
// all call ReadBlock. Container::ReadChunk, Container::Verify, the loader's span and object
// readers and its mapped verify feed it the stored bytes as they arrive; it hashes them and,
// for a zstd chunk, decodes them, and judges the whole chunk at Finish.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>

#include "format/chunk_codec.h"
#include "zckpt/format.h"

namespace zckpt::format::internal {

// Bytes are read and hashed in pieces this size, each right after it lands while still in L2
// (one pass over memory, not a read pass and a hash pass); a multiple of 4 KiB, for O_DIRECT.
inline constexpr uint64_t kHashPiece = 512 << 10;

class ChunkChecker {
 public:
  ChunkChecker();
  ~ChunkChecker();
  ChunkChecker(const ChunkChecker&) = delete;
  ChunkChecker& operator=(const ChunkChecker&) = delete;

  // Starts chunk `rec` (a record of a validated index). With `verify` false nothing is hashed
  // and a raw chunk always passes; a zstd frame is still decoded and its frame rules checked.
  // A zstd chunk decodes into decode_into[0, rec.raw_bytes) when given (its raw checksum then
  // taken over decode_into at Finish), else through a small window hashed as it comes.
  void Begin(const ChunkRecord& rec, uint8_t* decode_into = nullptr, bool verify = true);
  // The next stored bytes, in order, in pieces of any size. For a raw chunk this only hashes:
  // it allocates nothing, so it may run under the SIGBUS guard (common/fault_guard.h).
  void Feed(const uint8_t* piece, size_t n);
  // The verdict once every stored byte was fed: nothing when the chunk is good, else its fault.
  // A stored-checksum mismatch is the fault reported when there is one (it explains any other).
  std::optional<ChunkFault> Finish();

  // Begin, one Feed of the whole stored range, Finish.
  std::optional<ChunkFault> Check(const ChunkRecord& rec, const uint8_t* stored, uint8_t* decode_into = nullptr,
                                  bool verify = true);

 private:
  ChunkRecord rec_{};
  uint8_t* decode_into_ = nullptr;
  bool verify_ = true;
  bool zstd_ = false;
  Xxh3Stream stored_hash_;
  std::unique_ptr<ZstdChunkChecker> decoder_;  // made at the first zstd chunk
};

}  // namespace zckpt::format::internal
