#include "checkpoint/dcp_layout.h"

#include "checkpoint/folder.h"
#include "common/mapped_file.h"
#include "pickle/json_writer.h"
#include "pickle/unpickler.h"
#include "pt/pt_archive.h"
#include "zckpt/container.h"
#include "zckpt/error.h"

namespace zckpt::dcp {

std::string Dims(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

const pickle::DcpChunk* ChunkAt(const pickle::DcpItem& item, const std::vector<int64_t>& offsets) {
  for (const pickle::DcpChunk& c : item.chunks)
    if (c.offsets == offsets) return &c;
  return nullptr;
}

std::optional<std::string> PieceMismatch(const pickle::DcpItem& item, const pickle::DcpStorage& s, DType dtype,
                                         const std::vector<int64_t>& shape) {
  const pickle::DcpChunk* chunk = ChunkAt(item, s.offset);
  std::string piece = "the piece of '" + item.fqn + "' at " + Dims(s.offset);
  if (!chunk) return piece + " is not one of the chunks the metadata lists for it";
  if (dtype != item.dtype)
    return piece + " holds " + std::string(DTypeName(dtype)) + ", the metadata says " + std::string(DTypeName(item.dtype));
  if (shape != chunk->sizes) return piece + " has shape " + Dims(shape) + ", the metadata says " + Dims(chunk->sizes);
  return std::nullopt;
}

std::string PieceName(const std::string& fqn, const std::vector<int64_t>& offsets) {
  bool origin = true;
  for (int64_t o : offsets) origin = origin && o == 0;
  if (origin) return fqn;
  std::string name = fqn + "@";
  for (size_t i = 0; i < offsets.size(); ++i) {
    if (i) name += ',';
    name += std::to_string(offsets[i]);
  }
  return name;
}

std::string PieceExtra(const std::string& fqn, const std::vector<int64_t>& global_shape,
                       const std::vector<int64_t>& offsets, const std::vector<int64_t>& sizes) {
  pickle::JsonObject json;
  json.String("fqn", fqn);
  json.IntList("global_shape", global_shape);
  json.IntList("shard_offsets", offsets);
  json.IntList("shard_sizes", sizes);
  json.String("class", kPieceClass);
  return json.str();
}

pickle::DcpMetadata ReadFolderMetadata(const std::string& dir) {
  std::string path = checkpoint::InFolder(dir, std::string(kMetadataName));
  std::string text = checkpoint::ReadWholeFile(path);  // read once, privately (a FIFO is refused)
  return pickle::ReadDcpMetadata({reinterpret_cast<const uint8_t*>(text.data()), text.size()}, path);
}

DistcpTensor ReadDistcpTensor(const std::shared_ptr<const MappedFile>& file, uint64_t offset, uint64_t length) {
  std::string what = file->path() + " bytes [" + std::to_string(offset) + ", " + std::to_string(offset + length) + ")";
  if (offset > file->size() || length > file->size() - offset)
    throw Error(ErrorKind::kCorrupt, what + ": past the end of the " + std::to_string(file->size()) + "-byte file");
  try {
    auto slice = std::make_shared<const MappedFile>(file->data() + offset, length, what);
    pt::TorchArchive archive(slice);
    pickle::UnpickleResult tree = pickle::Unpickle(archive.RecordCopy("data.pkl"));
    pickle::TorchPickle model = pickle::InterpretTorchPickle(tree);
    if (model.tensors.size() != 1 || model.storages.size() != 1)
      throw Error(ErrorKind::kCorrupt, "holds " + std::to_string(model.tensors.size()) + " tensors over " +
                                           std::to_string(model.storages.size()) + " storages, not one tensor");
    DistcpTensor t;
    t.view = model.tensors[0];
    t.storage = model.storages[0];
    const pt::TorchRecord* record = archive.FindRecord("data/" + t.storage.key);
    if (!record) throw Error(ErrorKind::kCorrupt, "no record data/" + t.storage.key);
    std::span<const uint8_t> bytes = archive.Record(record->name);
    if (bytes.size() != t.storage.nbytes)
      throw Error(ErrorKind::kCorrupt, "record data/" + t.storage.key + " holds " + std::to_string(bytes.size()) +
                                           " bytes, the pickle says " + std::to_string(t.storage.nbytes));
    t.storage_begin = offset + record->entry->data_offset;
    t.storage_end = t.storage_begin + bytes.size();
    t.crc32 = record->entry->crc32;
    return t;
  } catch (const Error& e) {
    std::string msg = e.what();
    if (msg.find(what) == std::string::npos) msg = what + ": " + msg;
    throw Error(e.kind(), msg);
  }
}

void VetTorchSaveBytes(std::span<const uint8_t> bytes, const std::string& what, const checkpoint::PickleReadOptions& read) {
  try {
    auto slice = std::make_shared<const MappedFile>(bytes.data(), bytes.size(), what);
    pt::TorchArchive archive(slice);
    pickle::UnpickleResult tree = pickle::Unpickle(archive.RecordCopy("data.pkl"), read.Unpickle());
    (void)pickle::InterpretTorchPickle(tree);
  } catch (const Error& e) {
    std::string msg = e.what();
    if (msg.find(what) == std::string::npos) msg = what + ": " + msg;
    throw Error(e.kind() == ErrorKind::kNotContainer ? ErrorKind::kCorrupt : e.kind(), msg);
  }
}

std::optional<std::string> ConvertedContainer(const std::string& dir, const pickle::DcpStorage& s) {
  std::string stem = EndsWith(s.relative_path, kDistcpSuffix)
                         ? s.relative_path.substr(0, s.relative_path.size() - kDistcpSuffix.size())
                         : s.relative_path;
  std::string converted = checkpoint::InFolder(dir, stem + std::string(kContainerSuffix));
  if (!checkpoint::FileExists(converted)) return std::nullopt;
  return converted;
}

PieceLocation LocatePiece(const std::string& dir, const pickle::DcpStorage& s,
                          const std::function<const Container&(const std::string&)>& open) {
  PieceLocation loc;
  if (!s.file_slice) {
    loc.file = checkpoint::InFolder(dir, s.relative_path);
    loc.container = true;
    loc.tensor = s.name;
    return loc;
  }
  if (s.transformed)
    throw Error(ErrorKind::kUnsupported, dir + ": the piece of '" + s.fqn + "' in " + s.relative_path +
                                             " was written through DCP stream transforms (an extension such as "
                                             "compression): not supported");
  if (std::optional<std::string> converted = ConvertedContainer(dir, s)) {
    const Container& c = open(*converted);
    auto storage = c.FindStorage(std::to_string(s.file_offset));
    std::vector<uint32_t> tensors = storage ? c.TensorsOfStorage(*storage) : std::vector<uint32_t>{};
    if (tensors.empty())
      throw Error(ErrorKind::kCorrupt, *converted + ": no piece at byte offset " + std::to_string(s.file_offset) +
                                           " of " + s.relative_path + " (the piece of '" + s.fqn + "')");
    loc.file = *converted;
    loc.container = true;
    loc.tensor = std::string(c.tensor(tensors[0]).name);
    return loc;
  }
  loc.file = checkpoint::InFolder(dir, s.relative_path);
  loc.offset = s.file_offset;
  loc.length = s.length;
  return loc;
}

}  // namespace zckpt::dcp
