// The on-disk conventions of torch.distributed.checkpoint (DCP) folders, in both layouts zckpt
// reads (format-spec/folders.md), shared by convert/export/verify of DCP folders
// (dcp_folder.cc) and by `zckpt merge`:
//
//   FileSystemWriter's: `.metadata` (a pickle of DCP's Metadata) + `__R_N.distcp` files holding
//     each tensor piece as a torch.save archive and each BytesIO item raw, at the byte ranges
//     `.metadata`'s storage_data gives (_StorageInfo).
//   zckpt's: the same `.metadata` + one container `__R_N.zckpt` per file. Written by
//     zckpt.dcp.ZckptStorageWriter, storage_data holds (file, name) and a piece is the tensor
//     record `name` (storage key: write order), a BytesIO item the blob `name`. Converted from
//     FileSystemWriter's layout by `zckpt convert`, storage_data still holds _StorageInfo of the
//     `.distcp` file; X.distcp became X.zckpt, a tensor piece is the storage keyed by its byte
//     offset in X.distcp (the archive's other bytes kept as blobs `dcp.head@O` and `dcp.tail@O`),
//     a BytesIO item the blob `dcp.bytes@O`, bytes between items `dcp.gap@O`, so export rebuilds
//     X.distcp byte for byte.
// Every tensor record of a piece carries extra JSON {"fqn", "global_shape", "shard_offsets",
// "shard_sizes", "class": "torch.distributed.checkpoint"}.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "checkpoint/file_names.h"
#include "checkpoint/object_pickle.h"
#include "pickle/dcp_metadata.h"
#include "pickle/torch_model.h"
#include "zckpt/dtype.h"

namespace zckpt {
class Container;
class MappedFile;
}  // namespace zckpt

namespace zckpt::dcp {

inline constexpr std::string_view kMetadataName = ".metadata";
inline constexpr std::string_view kContainerSuffix = ".zckpt";
inline constexpr std::string_view kDistcpSuffix = ".distcp";
inline constexpr std::string_view kPieceClass = "torch.distributed.checkpoint";
// zckpt.dcp.ZckptStorageWriter's blobs of BytesIO items: this prefix + the fqn.
inline constexpr std::string_view kBytesBlobPrefix = "dcp.bytes/";
// Containers converted from a .distcp file: blobs named by a byte offset O in that file.
inline constexpr std::string_view kHeadBlob = "dcp.head@";    // a tensor archive's bytes before its storage
inline constexpr std::string_view kTailBlob = "dcp.tail@";    // ... and after it
inline constexpr std::string_view kBytesAtBlob = "dcp.bytes@";  // a BytesIO item
inline constexpr std::string_view kGapBlob = "dcp.gap@";      // bytes no item covers
inline constexpr std::string_view kKeySourceName = "zckpt.dcp.source.name";   // X.distcp
inline constexpr std::string_view kKeySourceBytes = "zckpt.dcp.source.bytes"; // its size

// The tensor record name of piece (fqn, offsets): fqn, or `fqn@o0,o1,...` off the origin.
std::string PieceName(const std::string& fqn, const std::vector<int64_t>& offsets);
std::string PieceExtra(const std::string& fqn, const std::vector<int64_t>& global_shape,
                       const std::vector<int64_t>& offsets, const std::vector<int64_t>& sizes);

// "[1, 2, 3]": offsets and shapes in messages.
std::string Dims(const std::vector<int64_t>& v);
// The chunk of `item` saved at `offsets`, nullptr when the metadata has none there.
const pickle::DcpChunk* ChunkAt(const pickle::DcpItem& item, const std::vector<int64_t>& offsets);
// Why the saved piece (dtype, shape) does not match the metadata's chunk; nullopt when it does.
std::optional<std::string> PieceMismatch(const pickle::DcpItem& item, const pickle::DcpStorage& s, DType dtype,
                          const std::vector<int64_t>& shape);

using checkpoint::EndsWith;
// Reads and checks `dir/.metadata` (pickle::ReadDcpMetadata).
pickle::DcpMetadata ReadFolderMetadata(const std::string& dir);

// One tensor piece of a FileSystemWriter `.distcp` file: the torch.save archive at
// [offset, offset + length) of `file`, read by zckpt's interpreter (nothing runs).
struct DistcpTensor {
  pickle::TorchTensor view;      // dtype, shape, stride, storage_offset (flags as saved)
  pickle::TorchStorage storage;  // its one storage
  uint64_t storage_begin = 0;    // file offsets of the storage's bytes
  uint64_t storage_end = 0;
  uint32_t crc32 = 0;            // the zip entry's CRC-32 of them (0: not recorded)
};
// Error(kCorrupt) naming the file and the range when it is not one torch.save archive of one
// tensor lying inside the file, or the storage record is not where the archive says.
DistcpTensor ReadDistcpTensor(const std::shared_ptr<const MappedFile>& file, uint64_t offset, uint64_t length);

// A BytesIO item (torch.save of a Python value, which DCP's planner unpickles with
// weights_only=False) read by zckpt's interpreter under `read` (the allowlist plus the caller's
// names before anything hands it on; the deny list only for verify): Error(kUnsafe) for a
// refused global, kCorrupt when it is not a torch.save archive.
void VetTorchSaveBytes(std::span<const uint8_t> bytes, const std::string& what,
                       const checkpoint::PickleReadOptions& read = {});

// The container a converted folder holds for _StorageInfo entry `s` (`dir/X.zckpt` for
// X.distcp); nullopt when the folder has none (FileSystemWriter's own layout).
std::optional<std::string> ConvertedContainer(const std::string& dir, const pickle::DcpStorage& s);

// Where the bytes of a tensor piece of a DCP folder are.
struct PieceLocation {
  std::string file;          // path of the container or .distcp file
  bool container = false;    // a zckpt container (else a .distcp slice)
  std::string tensor;        // container: the tensor record's name
  uint64_t offset = 0, length = 0;  // .distcp: the archive's byte range
};
// Resolves storage entry `s` of the folder `dir`: a (file, name) entry to its container's tensor;
// a _StorageInfo entry to `X.zckpt` when the folder was converted (the tensor viewing storage key
// O), else to the `.distcp` slice. `open` gives the container of a path (cached by the caller).
PieceLocation LocatePiece(const std::string& dir, const pickle::DcpStorage& s,
                          const std::function<const Container&(const std::string&)>& open);

}  // namespace zckpt::dcp
