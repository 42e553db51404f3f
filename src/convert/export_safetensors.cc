#include "convert/export_safetensors.h"

#include <algorithm>
#include <map>
#include <unordered_map>
#include <vector>

#include "common/atomic_file.h"
#include "checkpoint/object_pickle.h"
#include "checkpoint/source_records.h"
#include "checkpoint/storage_stream.h"
#include "pickle/torch_model.h"
#include "pickle/torch_save_pickle.h"
#include "pickle/unpickler.h"
#include "safetensors/header.h"
#include "safetensors/header_writer.h"
#include "zckpt/error.h"

namespace zckpt::convert {

using checkpoint::CheckedBlob;
using checkpoint::kKeyFormat;
using checkpoint::kSafetensorsHeaderBlob;
using checkpoint::ObjectPickle;
using checkpoint::PickleReadOptions;
using checkpoint::ReadObjectPickle;
using checkpoint::StreamStorageRange;

namespace {

// One tensor of the file to write: its header entry and where its bytes are in the container.
struct Piece {
  safetensors::TensorEntry entry;
  uint32_t storage = 0;
  uint64_t byte_begin = 0, byte_end = 0;
};

void Write(const Container& c, const std::string& destination, const std::string& header, const std::vector<Piece>& pieces) {
  AtomicFile out(destination);
  uint8_t n[8];
  for (int b = 0; b < 8; ++b) n[b] = static_cast<uint8_t>(static_cast<uint64_t>(header.size()) >> (8 * b));
  out.Write(n, sizeof n);
  out.Write(header.data(), header.size());
  for (const Piece& p : pieces) {
    if (p.byte_end == p.byte_begin) continue;
    StreamStorageRange(c, p.storage, p.byte_begin, p.byte_end,
                       [&](std::span<const uint8_t> bytes) { out.Write(bytes.data(), bytes.size()); });
  }
  out.Commit();
}

// torch's Tensor.is_contiguous(): sizes of 1 may have any stride, an empty tensor always is.
bool IsContiguous(const TensorInfo& t) {
  for (int64_t d : t.shape)
    if (d == 0) return true;
  int64_t expected = 1;
  for (size_t i = t.shape.size(); i-- > 0;) {
    if (t.shape[i] == 1) continue;
    if (t.stride[i] != expected) return false;
    expected *= t.shape[i];
  }
  return true;
}

// The file the container came from: the kept header, and each of its tensors matched with the
// container's storage of the same position (keys "0", "1", ... in byte-buffer order, format-spec/source-metadata.md),
// which must hold exactly what the header describes, viewed by one tensor of that dtype and
// shape. (Not by tensor name: names come from the pickle's paths, and a key such as "" is named
// otherwise there.)
void ExportKeptHeader(const Container& c, const std::string& destination) {
  const std::string named_by = "metadata '" + std::string(kKeyFormat) + "' = safetensors";
  std::vector<uint8_t> json = CheckedBlob(c, kSafetensorsHeaderBlob, named_by);
  safetensors::Header h = safetensors::ParseHeaderJson(json, std::nullopt, c.path() + " (kept header)");
  if (h.tensors.size() != c.storage_count() || h.tensors.size() != c.tensor_count())
    throw Error(ErrorKind::kCorrupt, c.path() + ": corrupt: the kept safetensors header names " + std::to_string(h.tensors.size()) +
                                         " tensors, the container holds " + std::to_string(c.storage_count()) + " storages and " +
                                         std::to_string(c.tensor_count()) + " tensors");
  std::vector<Piece> pieces;
  for (size_t i = 0; i < h.tensors.size(); ++i) {
    const safetensors::TensorEntry& e = h.tensors[i];
    auto fail = [&](const std::string& why) {
      throw Error(ErrorKind::kCorrupt, c.path() + ": corrupt: the kept safetensors header says tensor '" + e.name + "' is " +
                                           std::string(e.dtype.name) + " " + safetensors::FormatShape(e.shape) + " (" +
                                           std::to_string(e.bytes()) + " bytes) in storage " + std::to_string(i) + ", but " + why);
    };
    auto s = c.FindStorage(std::to_string(i));
    if (!s) fail("the container has no storage '" + std::to_string(i) + "'");
    if (c.storage(*s).raw_bytes != e.bytes()) fail("that storage holds " + std::to_string(c.storage(*s).raw_bytes) + " bytes");
    std::vector<uint32_t> viewers = c.TensorsOfStorage(*s);
    if (viewers.size() != 1) fail(std::to_string(viewers.size()) + " tensors view that storage");
    TensorInfo t = c.tensor(viewers[0]);
    if (t.dtype != e.dtype.dtype || t.shape != e.TorchShape() || !IsContiguous(t) || t.storage_offset != 0)
      fail("its tensor is " + std::string(DTypeName(t.dtype)) + " " + safetensors::FormatShape(t.shape) +
           (IsContiguous(t) ? "" : ", not contiguous") + (t.storage_offset ? ", at an offset" : ""));
    pieces.push_back({e, *s, 0, e.bytes()});
  }
  Write(c, destination, std::string(json.begin(), json.end()), pieces);
}

[[noreturn]] void Refuse(const Container& c, const std::string& why) {
  throw Error(ErrorKind::kUnsupported, c.path() + ": cannot be written as safetensors: " + why);
}

// A container from a torch.save file: its object must be a dict of tensors.
void ExportFromObject(const Container& c, const std::string& destination, const std::optional<ObjectPickle>& pkl) {
  if (!pkl) Refuse(c, "it holds no object pickle (data.pkl) saying which tensors make up its state");
  const pickle::UnpickleResult& tree = pkl->tree;
  const pickle::TorchPickle& model = pkl->model;
  const pickle::Value* root = tree.root;
  bool is_dict = root && (root->kind == pickle::Kind::kDict ||
                          (root->kind == pickle::Kind::kObject && pickle::IsGlobal(pickle::ObjectGlobal(root), "collections", "OrderedDict")));
  if (!is_dict) Refuse(c, "its object is not a dict of tensors (safetensors holds nothing else)");
  // The tensor each dict value built, by the pickle offset of its node (not by name: the
  // interpreter names a "" key, or one that collides with such a name, otherwise).
  std::unordered_map<uint64_t, const pickle::TorchTensor*> by_node;
  for (const pickle::TorchTensor& t : model.tensors)
    if (!t.internal) by_node.emplace(t.pickle_offset, &t);

  std::vector<Piece> pieces;
  std::map<uint32_t, std::string> storage_owner;  // storage -> the tensor already using it
  for (const auto& [key, value] : root->entries) {
    if (!key || key->kind != pickle::Kind::kString) Refuse(c, "a key of its dict is not a string");
    auto it = value ? by_node.find(value->offset) : by_node.end();
    if (it == by_node.end())
      Refuse(c, "the value of '" + key->text + "' is not a tensor (safetensors holds only tensors)");
    const pickle::TorchTensor& pt = *it->second;
    if (pt.dtensor_local || pt.sharded_local || pt.quantized || pt.conj || pt.neg)
      Refuse(c, "tensor '" + key->text + "' is a " +
                    (pt.dtensor_local ? "DTensor" : pt.sharded_local ? "ShardedTensor shard" : pt.quantized ? "quantized tensor"
                                                                                                          : "tensor with its conj/neg bit set") +
                    ", which safetensors cannot hold");
    auto index = c.FindTensor(pt.name);
    if (!index) throw Error(ErrorKind::kCorrupt, c.path() + ": corrupt: the pickle's tensor '" + pt.name + "' has no record");
    TensorInfo t = c.tensor(*index);
    auto dtype = safetensors::FindTorchDType(t.dtype);
    if (!dtype) Refuse(c, "tensor '" + key->text + "' is " + std::string(DTypeName(t.dtype)) + ", which safetensors has no type for");
    if (!IsContiguous(t)) Refuse(c, "tensor '" + key->text + "' is not contiguous (safetensors stores row-major tensors)");
    if (t.byte_end > t.byte_begin) {
      auto [owner, fresh] = storage_owner.emplace(t.storage, key->text);
      if (!fresh)
        Refuse(c, "tensors '" + owner->second + "' and '" + key->text + "' share memory (safetensors stores each once; "
                  "clone one of them, or use safetensors.torch.save_model)");
    }
    safetensors::TensorEntry e;
    e.name = key->text;
    e.dtype = *dtype;
    e.shape.assign(t.shape.begin(), t.shape.end());
    if (t.dtype == DType::kFloat4_e2m1fn_x2) {  // safetensors counts F4 elements, two a byte
      if (e.shape.empty()) Refuse(c, "tensor '" + key->text + "' is a 0-dim float4_e2m1fn_x2, which F4 cannot shape");
      e.shape.back() *= 2;
    }
    uint64_t begin = t.byte_end > t.byte_begin ? t.byte_begin : 0;
    pieces.push_back({std::move(e), t.storage, begin, t.byte_end > t.byte_begin ? t.byte_end : 0});
  }
  std::stable_sort(pieces.begin(), pieces.end(), [](const Piece& a, const Piece& b) { return safetensors::WriterOrder(a.entry, b.entry); });
  std::vector<safetensors::TensorEntry> entries;
  uint64_t at = 0;
  for (Piece& p : pieces) {
    p.entry.begin = at;
    at += p.byte_end - p.byte_begin;
    p.entry.end = at;
    entries.push_back(p.entry);
  }
  Write(c, destination, safetensors::FormatHeader(entries, false, {}), pieces);
}

}  // namespace

void ExportSafetensors(const Container& c, const std::string& destination, const std::vector<std::string>& allow_globals) {
  // Vetted and held against the index whichever way the file is written: one container, one
  // answer (zckpt.load reads the pickle, this exporter the index).
  PickleReadOptions read;
  read.allow_globals = allow_globals;
  std::optional<ObjectPickle> pkl = ReadObjectPickle(c, read);
  auto fmt = c.FindMetadata(kKeyFormat);
  if (fmt && *fmt == "safetensors") ExportKeptHeader(c, destination);
  else ExportFromObject(c, destination, pkl);
}

}  // namespace zckpt::convert
