#include "pickle/dcp_metadata.h"

#include <algorithm>
#include <array>
#include <map>
#include <utility>

#include "pickle/torch_values.h"
#include "pickle/unpickler.h"
#include "zckpt/error.h"

namespace zckpt::pickle {

namespace {

constexpr std::string_view kMeta = "torch.distributed.checkpoint.metadata";

constexpr std::array<std::pair<std::string_view, std::string_view>, 19> kAllowed = {{
    {kMeta, "Metadata"},
    {kMeta, "TensorStorageMetadata"},
    {kMeta, "BytesStorageMetadata"},
    {kMeta, "ChunkStorageMetadata"},
    {kMeta, "TensorProperties"},
    {kMeta, "MetadataIndex"},
    {kMeta, "StorageMeta"},
    {kMeta, "_MEM_FORMAT_ENCODING"},
    // Its members, as torch 2.4 and 2.9 pickle them (a global by qualified name, not a call).
    {kMeta, "_MEM_FORMAT_ENCODING.TORCH_CONTIGUOUS_FORMAT"},
    {kMeta, "_MEM_FORMAT_ENCODING.TORCH_CHANNELS_LAST"},
    {kMeta, "_MEM_FORMAT_ENCODING.TORCH_PRESERVE_FORMAT"},
    {"torch.distributed.checkpoint.filesystem", "_StorageInfo"},
    {"torch", "Size"},
    {"torch.serialization", "_get_layout"},
    {"collections", "OrderedDict"},
    {"pathlib", "PosixPath"},
    {"pathlib", "PurePosixPath"},
    {"pathlib", "WindowsPath"},
    {"pathlib", "PureWindowsPath"},
}};

// Globals of the DCP metadata classes, by class name; "" for anything else.
std::string_view MetaClass(const Value* obj) {
  const Value* g = ObjectGlobal(obj);
  if (!g) return "";
  if (g->text == kMeta || g->text == "torch.distributed.checkpoint.filesystem") return g->name;
  return "";
}

class Reader {
 public:
  explicit Reader(const std::string& what) : what_(what) {}

  [[noreturn]] void Fail(const Value* at, const std::string& why) const {
    std::string where = at ? " (pickle byte offset " + std::to_string(at->offset) + ")" : "";
    throw Error(ErrorKind::kCorrupt, what_ + ": not DCP metadata: " + why + where);
  }

  // An attribute of a dataclass object, from its BUILD state.
  const Value* Attr(const Value* obj, std::string_view name) const { return StateAttribute(obj->state, name); }

  std::vector<int64_t> Ints(const Value* v, const std::string& what) const {
    auto ints = AsIntList(v);
    if (!ints) Fail(v, what + " is not a list of ints");
    return *ints;
  }

  std::string Text(const Value* v, const std::string& what) const {
    auto s = AsText(v);
    if (!s) Fail(v, what + " is not a string");
    return *s;
  }

  // Entries of a dict, or of an OrderedDict object built with SETITEMs.
  const std::vector<std::pair<Value*, Value*>>& Entries(const Value* v, const std::string& what) const {
    if (!v || (v->kind != Kind::kDict && !(v->kind == Kind::kObject && ObjectGlobal(v) &&
                                           GlobalPath(ObjectGlobal(v)) == "collections.OrderedDict")))
      Fail(v, what + " is not a dict");
    return v->entries;
  }

  DType Dtype(const Value* props) const {
    // TensorProperties.__getstate__ gives (dtype, layout, requires_grad, memory_format, pin_memory
    // [, strides]); a release without it pickles the attribute dict.
    const Value* d = nullptr;
    if (const std::vector<Value*>* t = Sequence(props->state); t && !t->empty()) d = (*t)[0];
    if (!d) d = Attr(props, "dtype");
    if (!d || d->kind != Kind::kGlobal || d->text != "torch") Fail(props, "TensorProperties without a torch dtype");
    auto dt = DTypeFromName(d->name);
    if (!dt) Fail(d, "unknown dtype torch." + d->name);
    return *dt;
  }

  DcpItem Item(const std::string& fqn, const Value* v) const {
    DcpItem item;
    item.fqn = fqn;
    std::string_view cls = MetaClass(v);
    if (cls == "BytesStorageMetadata") return item;
    if (cls != "TensorStorageMetadata") Fail(v, "entry '" + fqn + "' is neither TensorStorageMetadata nor BytesStorageMetadata");
    item.is_tensor = true;
    const Value* props = Attr(v, "properties");
    if (MetaClass(props) != "TensorProperties") Fail(v, "entry '" + fqn + "' has no TensorProperties");
    item.dtype = Dtype(props);
    item.size = Ints(Attr(v, "size"), "size of '" + fqn + "'");
    const std::vector<Value*>* chunks = Sequence(Attr(v, "chunks"));
    if (!chunks) Fail(v, "chunks of '" + fqn + "' is not a list");
    for (const Value* c : *chunks) {
      if (MetaClass(c) != "ChunkStorageMetadata") Fail(c, "a chunk of '" + fqn + "' is not ChunkStorageMetadata");
      DcpChunk chunk{Ints(Attr(c, "offsets"), "chunk offsets of '" + fqn + "'"),
                     Ints(Attr(c, "sizes"), "chunk sizes of '" + fqn + "'")};
      if (chunk.offsets.size() != item.size.size() || chunk.sizes.size() != item.size.size())
        Fail(c, "a chunk of '" + fqn + "' has another rank than the tensor");
      for (size_t i = 0; i < item.size.size(); ++i) {
        if (chunk.offsets[i] < 0 || chunk.sizes[i] < 0 || chunk.offsets[i] > item.size[i] ||
            chunk.sizes[i] > item.size[i] - chunk.offsets[i])
          Fail(c, "a chunk of '" + fqn + "' lies outside the tensor");
      }
      item.chunks.push_back(std::move(chunk));
    }
    for (int64_t s : item.size)
      if (s < 0) Fail(v, "negative size of '" + fqn + "'");
    return item;
  }

  DcpStorage Storage(const Value* key, const Value* value) const {
    DcpStorage s;
    if (MetaClass(key) != "MetadataIndex") Fail(key, "a storage_data key is not a MetadataIndex");
    s.fqn = Text(Attr(key, "fqn"), "MetadataIndex.fqn");
    if (const Value* off = Attr(key, "offset"); off && off->kind != Kind::kNone)
      s.offset = Ints(off, "MetadataIndex.offset of '" + s.fqn + "'");
    if (MetaClass(value) == "_StorageInfo") {
      s.file_slice = true;
      s.relative_path = Text(Attr(value, "relative_path"), "_StorageInfo.relative_path");
      auto offset = AsInt(Attr(value, "offset"));
      auto length = AsInt(Attr(value, "length"));
      if (!offset || !length || *offset < 0 || *length < 0) Fail(value, "_StorageInfo of '" + s.fqn + "' has no valid offset/length");
      s.file_offset = static_cast<uint64_t>(*offset);
      s.length = static_cast<uint64_t>(*length);
      const Value* t = Attr(value, "transform_descriptors");
      const std::vector<Value*>* ts = Sequence(t);
      s.transformed = ts && !ts->empty();
    } else if (const std::vector<Value*>* tuple = Sequence(value); tuple && tuple->size() == 2) {
      s.relative_path = Text((*tuple)[0], "storage path of '" + s.fqn + "'");
      s.name = Text((*tuple)[1], "storage name of '" + s.fqn + "'");
    } else {
      Fail(value, "the storage entry of '" + s.fqn + "' is neither FileSystemWriter's _StorageInfo nor zckpt's (path, name)");
    }
    if (s.relative_path.empty() || s.relative_path.find('/') != std::string::npos || s.relative_path == "." ||
        s.relative_path == "..")
      Fail(value, "the storage entry of '" + s.fqn + "' names file '" + s.relative_path + "', not a file of the folder");
    return s;
  }

  DcpMetadata Read(const Value* root) const {
    if (MetaClass(root) != "Metadata") Fail(root, "the pickle is not a torch.distributed.checkpoint Metadata object");
    DcpMetadata md;
    for (const auto& [k, v] : Entries(Attr(root, "state_dict_metadata"), "state_dict_metadata"))
      md.items.push_back(Item(Text(k, "a state_dict_metadata key"), v));
    const Value* storage = Attr(root, "storage_data");
    if (storage && storage->kind != Kind::kNone)
      for (const auto& [k, v] : Entries(storage, "storage_data")) md.storage.push_back(Storage(k, v));
    if (const Value* version = Attr(root, "version"); version && version->kind != Kind::kNone)
      md.version = Text(version, "version");
    // A dict pickled by Python has unique keys; a repeated one is a crafted file.
    for (size_t i = 0; i < md.items.size(); ++i)
      if (!md.item_index.emplace(md.items[i].fqn, i).second) Fail(nullptr, "state_dict_metadata repeats '" + md.items[i].fqn + "'");
    for (size_t i = 0; i < md.storage.size(); ++i)
      if (!md.storage_index.emplace(std::make_pair(md.storage[i].fqn, md.storage[i].offset), i).second)
        Fail(nullptr, "storage_data repeats an entry of '" + md.storage[i].fqn + "'");
    return md;
  }

 private:
  std::string what_;
};

}  // namespace

bool IsDcpMetadataGlobal(std::string_view module, std::string_view name) {
  for (const auto& [m, n] : kAllowed)
    if (m == module && n == name) return true;
  return module == "torch" && DTypeFromName(name).has_value() && name.find('.') == std::string_view::npos;
}

const DcpItem* DcpMetadata::FindItem(const std::string& fqn) const {
  auto it = item_index.find(fqn);
  return it == item_index.end() ? nullptr : &items[it->second];
}

const DcpStorage* DcpMetadata::FindStorage(const std::string& fqn, const std::vector<int64_t>& offsets) const {
  auto it = storage_index.find({fqn, offsets});
  return it == storage_index.end() ? nullptr : &storage[it->second];
}

DcpMetadata ReadDcpMetadata(std::span<const uint8_t> pickle, const std::string& what) {
  UnpickleResult tree;
  try {
    // Judged below by a stricter list than the general allowlist: DCP's metadata classes only.
    UnpickleOptions options;
    options.globals = GlobalPolicy::kDenyListOnly;
    tree = Unpickle(pickle, options);
  } catch (const Error& e) {
    throw Error(e.kind(), what + ": " + e.what());
  }
  for (const GlobalRef& g : tree.globals) {
    if (!IsDcpMetadataGlobal(g.module, g.name))
      throw Error(ErrorKind::kUnsafe, what + ": refused global '" + g.module + "." + g.name + "' at pickle byte offset " +
                                          std::to_string(g.offset) + ": not one of the classes DCP metadata is made of");
  }
  return Reader(what).Read(tree.root);
}

}  // namespace zckpt::pickle
