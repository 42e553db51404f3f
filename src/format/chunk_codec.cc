#include "format/chunk_codec.h"

#include <xxhash.h>
#include <zstd.h>

#include <cstdio>
#include <new>

namespace zckpt::format::internal {

namespace {

// Contexts are reused per thread: creating one costs more than compressing a small chunk.
struct CCtxHolder {
  ZSTD_CCtx* ctx = ZSTD_createCCtx();
  ~CCtxHolder() { ZSTD_freeCCtx(ctx); }
};
struct DCtxHolder {
  ZSTD_DCtx* ctx = ZSTD_createDCtx();
  ~DCtxHolder() { ZSTD_freeDCtx(ctx); }
};

ZSTD_CCtx* ThreadCCtx() {
  thread_local CCtxHolder h;
  if (h.ctx == nullptr) throw std::bad_alloc();
  return h.ctx;
}

ZSTD_DCtx* ThreadDCtx() {
  thread_local DCtxHolder h;
  if (h.ctx == nullptr) throw std::bad_alloc();
  return h.ctx;
}

// The frame-level rules that can be read from the header alone.
std::string CheckFrameHeader(const uint8_t* stored, uint64_t stored_bytes, uint64_t raw_bytes) {
  unsigned long long content = ZSTD_getFrameContentSize(stored, stored_bytes);
  if (content == ZSTD_CONTENTSIZE_ERROR) return "not a zstd frame";
  if (content == ZSTD_CONTENTSIZE_UNKNOWN) return "zstd frame does not declare its content size";
  if (content != raw_bytes)
    return "zstd frame declares " + std::to_string(content) + " bytes, chunk has " + std::to_string(raw_bytes);
  return "";
}

}  // namespace

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

std::string DecodeChunk(const uint8_t* stored, uint64_t stored_bytes, uint8_t* dst, uint64_t raw_bytes) {
  std::string why = CheckFrameHeader(stored, stored_bytes, raw_bytes);
  if (!why.empty()) return why;
  size_t frame = ZSTD_findFrameCompressedSize(stored, stored_bytes);
  if (ZSTD_isError(frame)) return std::string("bad zstd frame: ") + ZSTD_getErrorName(frame);
  if (frame != stored_bytes) return "zstd frame ends before the chunk's stored bytes";
  size_t r = ZSTD_decompressDCtx(ThreadDCtx(), dst, raw_bytes, stored, stored_bytes);
  if (ZSTD_isError(r)) return std::string("bad zstd frame: ") + ZSTD_getErrorName(r);
  if (r != raw_bytes) return "zstd frame decodes to " + std::to_string(r) + " bytes, chunk has " + std::to_string(raw_bytes);
  return "";
}

struct ZstdChunkChecker::State {
  ZSTD_DStream* ds = ZSTD_createDStream();
  XXH3_state_t* hash = XXH3_createState();
  std::vector<uint8_t> window = std::vector<uint8_t>(ZSTD_DStreamOutSize());
  uint64_t raw_bytes = 0, produced = 0;
  bool frame_done = false;
  std::string error;
  ~State() {
    ZSTD_freeDStream(ds);
    XXH3_freeState(hash);
  }
};

ZstdChunkChecker::ZstdChunkChecker() : s_(std::make_unique<State>()) {
  if (s_->ds == nullptr || s_->hash == nullptr) throw std::bad_alloc();
}
ZstdChunkChecker::~ZstdChunkChecker() = default;

void ZstdChunkChecker::Begin(const uint8_t* stored, uint64_t stored_bytes, uint64_t raw_bytes) {
  ZSTD_DCtx_reset(s_->ds, ZSTD_reset_session_only);
  XXH3_64bits_reset(s_->hash);
  s_->raw_bytes = raw_bytes;
  s_->produced = 0;
  s_->frame_done = false;
  s_->error = CheckFrameHeader(stored, stored_bytes, raw_bytes);
}

void ZstdChunkChecker::Feed(const uint8_t* piece, size_t n) {
  State& s = *s_;
  ZSTD_inBuffer in = {piece, n, 0};
  // Loop while input remains, or while the last call filled the window (zstd may then still
  // hold decoded bytes of the input it has consumed).
  bool window_full = false;
  while (s.error.empty() && (in.pos < in.size || (window_full && !s.frame_done))) {
    if (s.frame_done) {
      s.error = "data after the end of the zstd frame";
      return;
    }
    ZSTD_outBuffer out = {s.window.data(), s.window.size(), 0};
    size_t r = ZSTD_decompressStream(s.ds, &out, &in);
    if (ZSTD_isError(r)) {
      s.error = std::string("bad zstd frame: ") + ZSTD_getErrorName(r);
      return;
    }
    s.produced += out.pos;
    if (s.produced > s.raw_bytes) {
      s.error = "zstd frame decodes to more than the chunk's " + std::to_string(s.raw_bytes) + " bytes";
      return;
    }
    XXH3_64bits_update(s.hash, s.window.data(), out.pos);
    window_full = out.pos == out.size;
    if (r == 0) s.frame_done = true;
  }
}

std::string ZstdChunkChecker::Finish(uint64_t raw_checksum) {
  State& s = *s_;
  if (!s.error.empty()) return s.error;
  if (!s.frame_done) return "zstd frame is cut short by the end of the chunk";
  if (s.produced != s.raw_bytes)
    return "zstd frame decodes to " + std::to_string(s.produced) + " bytes, chunk has " + std::to_string(s.raw_bytes);
  uint64_t got = XXH3_64bits_digest(s.hash);
  if (got != raw_checksum) return ChecksumMismatch("raw", raw_checksum, got);
  return "";
}

}  // namespace zckpt::format::internal
