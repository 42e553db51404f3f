#include "format/index_builder.h"

#include <cstring>

#include "format/bytes.h"
#include "format/record_codec.h"
#include "zckpt/error.h"

namespace zckpt::format::internal {

StringRef IndexBuilder::Intern(std::string_view s) {
  if (s.empty()) return {};  // the spec's empty string: offset 0, length 0
  auto it = interned_.find(std::string(s));
  if (it != interned_.end()) return it->second;
  if (s.size() > UINT32_MAX - pool_.size())
    throw Error(ErrorKind::kInvalidArgument, "the index's strings pass 4 GiB, the most a StringRef can address");
  StringRef ref{static_cast<uint32_t>(pool_.size()), static_cast<uint32_t>(s.size())};
  pool_.append(s);
  interned_.emplace(std::string(s), ref);
  return ref;
}

uint8_t* IndexBuilder::Append(TableId table) {
  auto& t = tables_[static_cast<uint32_t>(table) - 1];
  size_t at = t.size();
  t.resize(at + kRecordBytes[static_cast<uint32_t>(table) - 1]);
  return t.data() + at;
}

void IndexBuilder::AddStorage(const StorageRecord& r) { EncodeStorageRecord(r, Append(TableId::kStorages)); }
void IndexBuilder::AddChunk(const ChunkRecord& r) { EncodeChunkRecord(r, Append(TableId::kChunks)); }
void IndexBuilder::AddBlob(const BlobRecord& r) { EncodeBlobRecord(r, Append(TableId::kBlobs)); }
void IndexBuilder::AddMetadata(const MetadataRecord& r) { EncodeMetadataRecord(r, Append(TableId::kMetadata)); }

void IndexBuilder::AddTensor(TensorRecord r, std::span<const int64_t> sizes, std::span<const int64_t> strides) {
  r.dims = tables_[uint32_t(TableId::kDims) - 1].size() / 8;
  for (auto dims : {sizes, strides})
    for (int64_t d : dims) Store64(Append(TableId::kDims), static_cast<uint64_t>(d));
  EncodeTensorRecord(r, Append(TableId::kTensors));
}

std::vector<uint8_t> IndexBuilder::Finish() const {
  std::vector<uint8_t> out(kIndexHeaderBytes + kTableDescriptorBytes * kTableCount);
  EncodeIndexHeader({kTableCount}, out.data());
  for (uint32_t i = 0; i < kTableCount; ++i) {
    const uint8_t* bytes = i + 1 == kTableCount ? reinterpret_cast<const uint8_t*>(pool_.data()) : tables_[i].data();
    uint64_t size = i + 1 == kTableCount ? pool_.size() : tables_[i].size();
    uint64_t offset = AlignUp(out.size(), 8);
    TableDescriptor d{i + 1, kRecordBytes[i], size / kRecordBytes[i], offset, size};
    EncodeTableDescriptor(d, out.data() + kIndexHeaderBytes + kTableDescriptorBytes * i);
    out.resize(offset + size);  // zero padding, then the table
    if (size) std::memcpy(out.data() + offset, bytes, size);
  }
  return out;
}

}  // namespace zckpt::format::internal
