#include "format/chunk_check.h"

namespace zckpt::format::internal {

ChunkChecker::ChunkChecker() = default;
ChunkChecker::~ChunkChecker() = default;

void ChunkChecker::Begin(const ChunkRecord& rec, uint8_t* decode_into, bool verify) {
  rec_ = rec;
  decode_into_ = decode_into;
  verify_ = verify;
  zstd_ = IsZstd(rec);
  if (verify_) stored_hash_.Reset();
  if (!zstd_) return;
  if (!decoder_) decoder_ = std::make_unique<ZstdChunkChecker>();
  decoder_->Begin(rec.stored_bytes, rec.raw_bytes, decode_into);
}

void ChunkChecker::Feed(const uint8_t* piece, size_t n) {
  if (verify_) stored_hash_.Update(piece, n);
  if (zstd_) decoder_->Feed(piece, n);
}

std::optional<ChunkFault> ChunkChecker::Finish() {
  if (verify_) {
    uint64_t got = stored_hash_.Digest();
    if (got != rec_.stored_checksum) return ChunkFault{ChunkFault::Kind::kStoredChecksum, rec_.stored_checksum, got, {}};
  }
  if (!zstd_) return std::nullopt;
  // Through the window (the verifier's mode) the decoder hashes the decoded bytes as they pass
  // and checks the raw checksum itself; into a destination it is taken here, over the bytes
  // the caller gets.
  std::optional<ChunkFault> fault = decoder_->Finish(rec_.raw_checksum);
  if (fault || !verify_ || decode_into_ == nullptr) return fault;
  uint64_t got = Checksum(decode_into_, rec_.raw_bytes);
  if (got != rec_.raw_checksum) return ChunkFault{ChunkFault::Kind::kRawChecksum, rec_.raw_checksum, got, {}};
  return std::nullopt;
}

std::optional<ChunkFault> ChunkChecker::Check(const ChunkRecord& rec, const uint8_t* stored, uint8_t* decode_into,
                                              bool verify) {
  Begin(rec, decode_into, verify);
  Feed(stored, rec.stored_bytes);
  return Finish();
}

}  // namespace zckpt::format::internal
