#include "format/chunk_codec.h"

#include "format/xxh3.h"
#define ZSTD_STATIC_LINKING_ONLY  // ZSTD_d_stableOutBuffer (a parameter value; no static-only symbols)
#include <zstd.h>

#include <algorithm>
#include <cstdio>
#include <new>

namespace zckpt::format::internal {

namespace {

// Contexts are reused per thread: creating one costs more than compressing a small chunk.
struct CCtxHolder {
  ZSTD_CCtx* ctx = ZSTD_createCCtx();
  ~CCtxHolder() { ZSTD_freeCCtx(ctx); }
};

ZSTD_CCtx* ThreadCCtx() {
  thread_local CCtxHolder h;
  if (h.ctx == nullptr) throw std::bad_alloc();
  return h.ctx;
}

// Any frame window zstd can express is accepted (the content size bounds memory, see the header).
constexpr int kWindowLogMax = ZSTD_WINDOWLOG_MAX_64;

// The frame-level rules that can be read from the header alone: what breaks one, if any does.
std::optional<std::string> FrameHeaderFault(const uint8_t* stored, uint64_t stored_bytes, uint64_t raw_bytes) {
  unsigned long long content = ZSTD_getFrameContentSize(stored, stored_bytes);
  if (content == ZSTD_CONTENTSIZE_ERROR) return "not a zstd frame";
  if (content == ZSTD_CONTENTSIZE_UNKNOWN) return "zstd frame does not declare its content size";
  if (content != raw_bytes)
    return "zstd frame declares " + std::to_string(content) + " bytes, chunk has " + std::to_string(raw_bytes);
  return std::nullopt;
}

}  // namespace

struct Xxh3Stream::State {
  XXH3_state_t* state = XXH3_createState();
  ~State() { XXH3_freeState(state); }
};

Xxh3Stream::Xxh3Stream() : s_(std::make_unique<State>()) {
  if (s_->state == nullptr) throw std::bad_alloc();
  XXH3_64bits_reset(s_->state);
}
Xxh3Stream::~Xxh3Stream() = default;
void Xxh3Stream::Reset() { XXH3_64bits_reset(s_->state); }
void Xxh3Stream::Update(const void* p, size_t n) { XXH3_64bits_update(s_->state, p, n); }
uint64_t Xxh3Stream::Digest() const { return XXH3_64bits_digest(s_->state); }

std::string ChecksumMismatch(const char* what, uint64_t expected, uint64_t got) {
  char buf[128];
  std::snprintf(buf, sizeof buf, "%s checksum mismatch (index says %016llx, bytes hash to %016llx)", what,
                static_cast<unsigned long long>(expected), static_cast<unsigned long long>(got));
  return buf;
}

bool CompressChunk(const uint8_t* src, size_t n, int level, std::vector<uint8_t>* out) {
  if (n < 2) return false;
  // A destination one byte short of the input: zstd gives up (dstSize_tooSmall) as soon as the
  // frame cannot pay, and the buffer never exceeds a chunk.
  out->resize(n - 1);
  ZSTD_CCtx* cctx = ThreadCCtx();
  ZSTD_CCtx_reset(cctx, ZSTD_reset_session_and_parameters);
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, level);
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_contentSizeFlag, 1);
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_checksumFlag, 0);  // the chunk record holds XXH3s
  size_t r = ZSTD_compress2(cctx, out->data(), out->size(), src, n);
  if (ZSTD_isError(r) || r >= n) return false;
  out->resize(r);
  return true;
}

std::string ChunkFault::Describe() const {
  switch (kind) {
    case Kind::kStoredChecksum: return ChecksumMismatch("stored", expected, got);
    case Kind::kRawChecksum: return ChecksumMismatch("raw", expected, got);
    case Kind::kFrame: return frame;
  }
  return frame;
}

struct ZstdChunkChecker::State {
  ZSTD_DStream* ds = ZSTD_createDStream();
  XXH3_state_t* hash = XXH3_createState();
  std::vector<uint8_t> window = std::vector<uint8_t>(ZSTD_DStreamOutSize());
  uint8_t* dst = nullptr;  // destination mode: decode into dst[0, raw_bytes)
  int mode = -1;           // what ds is set up for: -1 nothing yet, 0 window, 1 destination
  uint64_t stored_bytes = 0, raw_bytes = 0, produced = 0;
  std::vector<uint8_t> header;  // the frame header, gathered until it can be checked whole
  bool header_checked = false, frame_done = false;
  std::optional<std::string> fault;  // what is wrong with the frame, once something is
  ~State() {
    ZSTD_freeDStream(ds);
    XXH3_freeState(hash);
  }
};

ZstdChunkChecker::ZstdChunkChecker() : s_(std::make_unique<State>()) {
  if (s_->ds == nullptr || s_->hash == nullptr) throw std::bad_alloc();
}
ZstdChunkChecker::~ZstdChunkChecker() = default;

void ZstdChunkChecker::Begin(uint64_t stored_bytes, uint64_t raw_bytes, uint8_t* dst) {
  State& s = *s_;
  ZSTD_DCtx_reset(s.ds, ZSTD_reset_session_only);
  const int mode = dst != nullptr ? 1 : 0;
  if (s.mode != mode) {
    // Parameters change only between sessions; the window limit is set along with them.
    ZSTD_DCtx_reset(s.ds, ZSTD_reset_parameters);
    ZSTD_DCtx_setParameter(s.ds, ZSTD_d_windowLogMax, kWindowLogMax);
    // Destination mode: zstd decodes straight into dst (no window buffer of its own, no copy).
    ZSTD_DCtx_setParameter(s.ds, ZSTD_d_stableOutBuffer, dst != nullptr ? 1 : 0);
    s.mode = mode;
  }
  XXH3_64bits_reset(s.hash);
  s.dst = dst;
  s.stored_bytes = stored_bytes;
  s.raw_bytes = raw_bytes;
  s.produced = 0;
  s.header.clear();
  s.header_checked = false;
  s.frame_done = false;
  s.fault.reset();
}

void ZstdChunkChecker::Feed(const uint8_t* piece, size_t n) {
  State& s = *s_;
  if (!s.header_checked) {
    // The header is checked before zstd parses it, from the very bytes it will parse: a content
    // size other than raw_bytes is refused before any memory is sized by it.
    const size_t want = static_cast<size_t>(std::min<uint64_t>(ZSTD_FRAMEHEADERSIZE_MAX, s.stored_bytes));
    const size_t take = std::min(n, want - s.header.size());
    s.header.insert(s.header.end(), piece, piece + take);
    piece += take;
    n -= take;
    if (s.header.size() < want) return;
    s.header_checked = true;
    if (!s.fault) s.fault = FrameHeaderFault(s.header.data(), s.header.size(), s.raw_bytes);
    Decode(s.header.data(), s.header.size());
  }
  Decode(piece, n);
}

void ZstdChunkChecker::Decode(const uint8_t* piece, size_t n) {
  State& s = *s_;
  ZSTD_inBuffer in = {piece, n, 0};
  // Loop while input remains, or while the last call filled the window (zstd may then still
  // hold decoded bytes of the input it has consumed).
  bool window_full = false;
  while (!s.fault && (in.pos < in.size || (window_full && !s.frame_done))) {
    if (s.frame_done) {
      s.fault = "data after the end of the zstd frame";
      return;
    }
    if (s.dst != nullptr) {
      // The same output buffer on every call (stableOutBuffer), holding exactly raw_bytes: the
      // decoder can never write past it; a frame with more to give fails below.
      ZSTD_outBuffer out = {s.dst, s.raw_bytes, s.produced};
      const size_t in_before = in.pos;
      size_t r = ZSTD_decompressStream(s.ds, &out, &in);
      if (ZSTD_isError(r)) {
        s.fault = std::string("bad zstd frame: ") + ZSTD_getErrorName(r);
        return;
      }
      const bool progress = in.pos != in_before || out.pos != s.produced;
      s.produced = out.pos;
      if (r == 0) {
        s.frame_done = true;
      } else if (!progress) {  // output full, the frame wants room for more
        s.fault = "zstd frame decodes to more than the chunk's " + std::to_string(s.raw_bytes) + " bytes";
        return;
      }
      window_full = false;
      continue;
    }
    ZSTD_outBuffer out = {s.window.data(), s.window.size(), 0};
    size_t r = ZSTD_decompressStream(s.ds, &out, &in);
    if (ZSTD_isError(r)) {
      s.fault = std::string("bad zstd frame: ") + ZSTD_getErrorName(r);
      return;
    }
    s.produced += out.pos;
    if (s.produced > s.raw_bytes) {
      s.fault = "zstd frame decodes to more than the chunk's " + std::to_string(s.raw_bytes) + " bytes";
      return;
    }
    XXH3_64bits_update(s.hash, s.window.data(), out.pos);
    window_full = out.pos == out.size;
    if (r == 0) s.frame_done = true;
  }
}

std::optional<ChunkFault> ZstdChunkChecker::Finish(uint64_t raw_checksum) {
  State& s = *s_;
  auto frame = [](std::string why) { return ChunkFault{ChunkFault::Kind::kFrame, 0, 0, std::move(why)}; };
  if (s.fault) return frame(*s.fault);
  if (!s.header_checked) return frame("not a zstd frame (shorter than a frame header)");
  if (!s.frame_done) return frame("zstd frame is cut short by the end of the chunk");
  if (s.produced != s.raw_bytes)
    return frame("zstd frame decodes to " + std::to_string(s.produced) + " bytes, chunk has " +
                 std::to_string(s.raw_bytes));
  if (s.dst != nullptr) return std::nullopt;
  uint64_t got = XXH3_64bits_digest(s.hash);
  if (got != raw_checksum) return ChunkFault{ChunkFault::Kind::kRawChecksum, raw_checksum, got, {}};
  return std::nullopt;
}

}  // namespace zckpt::format::internal
