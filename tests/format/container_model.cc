#include "container_model.h"

#include <zstd.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "format/bytes.h"
#include "format/container_file.h"
#include "format/record_codec.h"
#include "format/layout.h"
#include "zckpt/container.h"

namespace zckpt::testing {

using format::internal::AlignUp;
using format::internal::ContainerFile;
using format::internal::Load64;
using format::internal::Store64;

ContainerModel ContainerModel::Parse(const std::vector<uint8_t>& file) {
  auto c = Container::OpenMemory(file.data(), file.size(), "model.zckpt");
  ContainerModel m;
  m.superblock = c->superblock();
  m.footer_major = c->footer().major;
  m.footer_minor = c->footer().minor;
  std::span<const uint8_t> index = ContainerFile::Index(*c);
  auto table = [&](format::TableId id) {
    return format::DecodeTableDescriptor(index.data() + format::kIndexHeaderBytes +
                                         format::kTableDescriptorBytes * (static_cast<uint32_t>(id) - 1));
  };
  auto records = [&](format::TableId id, auto decode, auto& out) {
    format::TableDescriptor d = table(id);
    for (uint64_t i = 0; i < d.count; ++i) out.push_back(decode(index.data() + d.offset + i * d.record_bytes));
  };
  records(format::TableId::kStorages, format::DecodeStorageRecord, m.storages);
  records(format::TableId::kChunks, format::DecodeChunkRecord, m.chunks);
  records(format::TableId::kTensors, format::DecodeTensorRecord, m.tensors);
  records(format::TableId::kDims, [](const uint8_t* p) { return Load64(p); }, m.dims);
  records(format::TableId::kBlobs, format::DecodeBlobRecord, m.blobs);
  records(format::TableId::kMetadata, format::DecodeMetadataRecord, m.metadata);
  format::TableDescriptor pool = table(format::TableId::kStrings);
  m.strings.assign(index.data() + pool.offset, index.data() + pool.offset + pool.count);
  for (const auto& ch : m.chunks) m.chunk_data.emplace_back(file.begin() + ch.offset, file.begin() + ch.offset + ch.stored_bytes);
  for (const auto& b : m.blobs) m.blob_data.emplace_back(file.begin() + b.offset, file.begin() + b.offset + b.bytes);
  return m;
}

format::StringRef ContainerModel::AddString(std::string_view s) {
  if (s.empty()) return {};
  format::StringRef ref{static_cast<uint32_t>(strings.size()), static_cast<uint32_t>(s.size())};
  strings.insert(strings.end(), s.begin(), s.end());
  return ref;
}

std::string_view ContainerModel::String(format::StringRef ref) const {
  if (ref.length == 0) return {};
  return {reinterpret_cast<const char*>(strings.data()) + ref.offset, ref.length};
}

void ContainerModel::SetChunkData(uint64_t i, std::vector<uint8_t> stored, format::Codec codec, uint64_t raw_bytes) {
  chunks[i].codec = static_cast<uint8_t>(codec);
  chunks[i].stored_bytes = stored.size();
  chunks[i].raw_bytes = raw_bytes;
  chunk_data[i] = std::move(stored);
}

namespace {

// XXH3 of what a zstd frame decodes to (up to raw_bytes), or `fallback` when it does not decode
// or claims more than any chunk may hold (a forged 8 GiB is not allocated here either).
uint64_t DecodedChecksum(const std::vector<uint8_t>& frame, uint64_t raw_bytes, uint64_t fallback) {
  if (raw_bytes > format::kMaxChunkBytes) return fallback;
  std::vector<uint8_t> raw(raw_bytes);
  ZSTD_DCtx* d = ZSTD_createDCtx();
  ZSTD_DCtx_setParameter(d, ZSTD_d_windowLogMax, 31);
  ZSTD_outBuffer out = {raw.data(), raw.size(), 0};
  ZSTD_inBuffer in = {frame.data(), frame.size(), 0};
  size_t r = 1;
  while (in.pos < in.size && out.pos < out.size && !ZSTD_isError(r) && r != 0) r = ZSTD_decompressStream(d, &out, &in);
  ZSTD_freeDCtx(d);
  if (ZSTD_isError(r)) return fallback;
  return format::Checksum(raw.data(), out.pos);
}

}  // namespace

std::vector<uint8_t> ContainerModel::Build(const BuildOptions& o) const {
  ContainerModel m = *this;
  const format::Superblock& sb = m.superblock;
  uint64_t end = format::kSuperblockBytes;
  if (o.layout) {
    for (size_t i = 0; i < m.chunks.size(); ++i) {
      format::ChunkRecord& ch = m.chunks[i];
      uint64_t raw = ch.storage < m.storages.size() ? m.storages[ch.storage].raw_bytes : 0;
      ch.offset = AlignUp(end, format::internal::StorageAlignment(sb, raw));
      ch.stored_bytes = m.chunk_data[i].size();
      end = ch.offset + ch.stored_bytes;
    }
    for (size_t i = 0; i < m.blobs.size(); ++i) {
      m.blobs[i].bytes = m.blob_data[i].size();
      m.blobs[i].offset = m.blob_data[i].empty() ? 0 : AlignUp(end, sb.small_alignment);
      if (!m.blob_data[i].empty()) end = m.blobs[i].offset + m.blobs[i].bytes;
    }
  } else {
    for (size_t i = 0; i < m.chunks.size(); ++i) end = std::max(end, m.chunks[i].offset + m.chunk_data[i].size());
    for (size_t i = 0; i < m.blobs.size(); ++i) end = std::max(end, m.blobs[i].offset + m.blob_data[i].size());
  }
  if (o.data_checksums) {
    for (size_t i = 0; i < m.chunks.size(); ++i) {
      format::ChunkRecord& ch = m.chunks[i];
      ch.stored_checksum = format::Checksum(m.chunk_data[i].data(), m.chunk_data[i].size());
      ch.raw_checksum = ch.codec == static_cast<uint8_t>(format::Codec::kZstd)
                            ? DecodedChecksum(m.chunk_data[i], ch.raw_bytes, ch.raw_checksum)
                            : ch.stored_checksum;
    }
    for (size_t i = 0; i < m.blobs.size(); ++i)
      m.blobs[i].checksum = format::Checksum(m.blob_data[i].data(), m.blob_data[i].size());
  }
  const uint64_t index_offset = AlignUp(end, sb.small_alignment);
  if (o.after_layout) o.after_layout(m);

  // The index: header, seven descriptors, the tables at 8-byte-aligned offsets (spec §5).
  std::vector<uint8_t> tables[format::kTableCount];
  auto append = [&](format::TableId id) {
    auto& t = tables[static_cast<uint32_t>(id) - 1];
    t.resize(t.size() + format::kRecordBytes[static_cast<uint32_t>(id) - 1]);
    return t.data() + t.size() - format::kRecordBytes[static_cast<uint32_t>(id) - 1];
  };
  for (const auto& r : m.storages) format::EncodeStorageRecord(r, append(format::TableId::kStorages));
  for (const auto& r : m.chunks) format::EncodeChunkRecord(r, append(format::TableId::kChunks));
  for (const auto& r : m.tensors) format::EncodeTensorRecord(r, append(format::TableId::kTensors));
  for (uint64_t d : m.dims) Store64(append(format::TableId::kDims), d);
  for (const auto& r : m.blobs) format::EncodeBlobRecord(r, append(format::TableId::kBlobs));
  for (const auto& r : m.metadata) format::EncodeMetadataRecord(r, append(format::TableId::kMetadata));
  tables[format::kTableCount - 1] = m.strings;
  std::vector<uint8_t> index(format::kIndexHeaderBytes + format::kTableDescriptorBytes * format::kTableCount);
  format::EncodeIndexHeader({format::kTableCount}, index.data());
  for (uint32_t i = 0; i < format::kTableCount; ++i) {
    uint64_t offset = AlignUp(index.size(), 8);
    format::TableDescriptor d{i + 1, format::kRecordBytes[i], tables[i].size() / format::kRecordBytes[i], offset,
                              tables[i].size()};
    format::EncodeTableDescriptor(d, index.data() + format::kIndexHeaderBytes + format::kTableDescriptorBytes * i);
    index.resize(offset + tables[i].size());
    if (!tables[i].empty()) std::memcpy(index.data() + offset, tables[i].data(), tables[i].size());
  }

  const uint64_t footer_at = AlignUp(index_offset + index.size(), 64);
  std::vector<uint8_t> file(footer_at + format::kFooterBytes, 0);
  format::EncodeSuperblock(sb, file.data());
  for (size_t i = 0; i < m.chunks.size(); ++i) {
    const auto& data = m.chunk_data[i];
    uint64_t at = m.chunks[i].offset;
    if (at < file.size()) std::memcpy(file.data() + at, data.data(), std::min<uint64_t>(data.size(), file.size() - at));
  }
  for (size_t i = 0; i < m.blobs.size(); ++i) {
    const auto& data = m.blob_data[i];
    uint64_t at = m.blobs[i].offset;
    if (!data.empty() && at < file.size())
      std::memcpy(file.data() + at, data.data(), std::min<uint64_t>(data.size(), file.size() - at));
  }
  std::memcpy(file.data() + index_offset, index.data(), index.size());
  format::Footer ft;
  ft.index_offset = index_offset;
  ft.index_bytes = index.size();
  ft.index_checksum = format::Checksum(index.data(), index.size());
  ft.file_bytes = file.size();
  ft.major = m.footer_major;
  ft.minor = m.footer_minor;
  format::EncodeFooter(ft, file.data() + footer_at);
  return file;
}

std::vector<uint8_t> ZstdFrame(const std::vector<uint8_t>& raw, int level, int window_log) {
  std::vector<uint8_t> out(ZSTD_compressBound(raw.size()));
  ZSTD_CCtx* c = ZSTD_createCCtx();
  ZSTD_CCtx_setParameter(c, ZSTD_c_compressionLevel, level);
  ZSTD_CCtx_setParameter(c, ZSTD_c_contentSizeFlag, 1);
  if (window_log) ZSTD_CCtx_setParameter(c, ZSTD_c_windowLog, window_log);
  size_t n = ZSTD_compress2(c, out.data(), out.size(), raw.data(), raw.size());
  ZSTD_freeCCtx(c);
  if (ZSTD_isError(n)) throw std::runtime_error(ZSTD_getErrorName(n));
  out.resize(n);
  return out;
}

}  // namespace zckpt::testing
