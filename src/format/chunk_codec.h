// Codec 1 (zstd) of spec §5.2 for one chunk: compress with a raw fallback, and the streaming
// decoder every check of a zstd chunk runs (through format/chunk_check.h).
//
// Every decode insists on what the spec makes a chunk: exactly one zstd frame spanning all of
// stored_bytes, whose header declares raw_bytes as its content size and which decodes to
// exactly that many bytes. Loading (into the destination) and verifying (through a small
// window) run the same streaming decoder with the same parameters, so a frame one accepts the
// other accepts: any window size zstd can express
// (windowLogMax 31; the header's content size, checked equal to raw_bytes <= chunk_bytes <= 2^30
// before a byte is decoded, bounds what the decoder allocates), and the output never runs past
// raw_bytes. Callers pass stored bytes they own (copied out of the file), never the shared
// mapping: the header that was checked is the header that is decoded.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace zckpt::format::internal {

// Compresses [src, src+n) at `level` into *out. Returns false (and leaves *out unspecified) when
// the frame would not be strictly smaller than n: the caller stores the chunk raw. Uses a
// per-thread compression context.
bool CompressChunk(const uint8_t* src, size_t n, int level, std::vector<uint8_t>* out);

// XXH3-64 over bytes fed in pieces; the state is freed however the scope ends (a read that
// throws half way included). Update allocates nothing (safe under the SIGBUS guard).
class Xxh3Stream {
 public:
  Xxh3Stream();
  ~Xxh3Stream();
  Xxh3Stream(const Xxh3Stream&) = delete;
  Xxh3Stream& operator=(const Xxh3Stream&) = delete;
  void Reset();
  void Update(const void* p, size_t n);
  uint64_t Digest() const;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

// "<what> checksum mismatch (index says 0123..., bytes hash to 4567...)".
std::string ChecksumMismatch(const char* what, uint64_t expected, uint64_t got);

// Why a chunk's bytes are refused: one kind per failure, with its data.
struct ChunkFault {
  enum class Kind {
    kStoredChecksum,  // the stored bytes hash to `got`, the record says `expected`
    kRawChecksum,     // a zstd chunk's decoded bytes hash to `got`, the record says `expected`
    kFrame,           // the stored bytes are not one zstd frame decoding to raw_bytes: `frame` says how
  };
  Kind kind = Kind::kFrame;
  uint64_t expected = 0, got = 0;  // the checksum kinds
  std::string frame;               // kFrame
  // "stored checksum mismatch (index says ..., bytes hash to ...)", or the frame's fault.
  std::string Describe() const;
};

// Decodes a zstd chunk fed in pieces, either straight into a destination or through a small
// window whose output it hashes, so checking a chunk needs memory independent of its size.
// (format/chunk_check.h's ChunkChecker drives it; nothing else should.)
class ZstdChunkChecker {
 public:
  ZstdChunkChecker();
  ~ZstdChunkChecker();
  ZstdChunkChecker(const ZstdChunkChecker&) = delete;
  ZstdChunkChecker& operator=(const ZstdChunkChecker&) = delete;

  // Starts a chunk of `stored_bytes` that must decode to `raw_bytes`. With `dst`, decoded bytes
  // land in dst[0, raw_bytes) and are not hashed; without, they pass through a small window and
  // are hashed.
  void Begin(uint64_t stored_bytes, uint64_t raw_bytes, uint8_t* dst = nullptr);
  // Feeds the next piece of the stored range, in order, in pieces of any size: the frame header
  // is gathered and checked before anything is decoded.
  void Feed(const uint8_t* piece, size_t n);
  // Nothing when the frame ended exactly at the last stored byte and decoded to raw_bytes bytes
  // (whose XXH3 is raw_checksum, in window mode), else the fault.
  std::optional<ChunkFault> Finish(uint64_t raw_checksum = 0);

 private:
  void Decode(const uint8_t* piece, size_t n);
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace zckpt::format::internal
