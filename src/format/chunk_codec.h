// Codec 1 (zstd) of spec §5.2 for one chunk: compress with a raw fallback, decode into a
// caller's buffer, and a streaming check for the verifier.
//
// Every decode insists on what the spec makes a chunk: exactly one zstd frame spanning all of
// stored_bytes, whose header declares raw_bytes as its content size and which decodes to
// exactly that many bytes. Loading (DecodeChunk, into the destination) and verifying
// (ZstdChunkChecker, through a small window) run the same streaming decoder with the same
// parameters, so a frame one accepts the other accepts: any window size zstd can express
// (windowLogMax 31; the header's content size, checked equal to raw_bytes <= chunk_bytes <= 2^30
// before a byte is decoded, bounds what the decoder allocates), and the output never runs past
// raw_bytes. Callers pass stored bytes they own (copied out of the file), never the shared
// mapping: the header that was checked is the header that is decoded.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace zckpt::format::internal {

// Compresses [src, src+n) at `level` into *out. Returns false (and leaves *out unspecified) when
// the frame would not be strictly smaller than n: the caller stores the chunk raw. Uses a
// per-thread compression context.
bool CompressChunk(const uint8_t* src, size_t n, int level, std::vector<uint8_t>* out);

// Decodes a stored zstd chunk into dst (raw_bytes). Returns "" on success, else why the frame
// is bad. Uses a per-thread ZstdChunkChecker writing straight into dst (no window copy).
std::string DecodeChunk(const uint8_t* stored, uint64_t stored_bytes, uint8_t* dst, uint64_t raw_bytes);

// XXH3-64 over bytes fed in pieces; the state is freed however the scope ends (a read that
// throws half way included).
class Xxh3Stream {
 public:
  Xxh3Stream();
  ~Xxh3Stream();
  Xxh3Stream(const Xxh3Stream&) = delete;
  Xxh3Stream& operator=(const Xxh3Stream&) = delete;
  void Update(const void* p, size_t n);
  uint64_t Digest() const;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

// Decodes a zstd chunk fed in pieces through a small window, hashing the output, so checking a
// chunk needs memory independent of its size.
// "<what> checksum mismatch (index says 0123..., bytes hash to 4567...)".
std::string ChecksumMismatch(const char* what, uint64_t expected, uint64_t got);

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
  // "" when the frame ended exactly at the last stored byte and decoded to raw_bytes bytes
  // (whose XXH3 is raw_checksum, in window mode), else why not.
  std::string Finish(uint64_t raw_checksum = 0);

 private:
  void Decode(const uint8_t* piece, size_t n);
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace zckpt::format::internal
