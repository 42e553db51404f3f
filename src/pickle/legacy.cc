#include "pickle/legacy.h"

#include <algorithm>
#include <string_view>
#include <unordered_map>

#include "pickle/byte_reader.h"
#include "pickle/torch_values.h"
#include "zckpt/error.h"

namespace zckpt::pickle {

namespace {

// The magic number 0x1950a86a20f9469cfc6c as a LONG1 payload (little-endian two's complement).
constexpr char kMagic[] = "\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19";
constexpr int64_t kLegacyProtocol = 1001;

[[noreturn]] void Corrupt(const std::string& what) { throw Error(ErrorKind::kCorrupt, "legacy torch file: " + what); }

// Reads the pickle at `*pos`, moving past it; errors say which pickle and where it starts.
UnpickleResult ReadPickle(std::span<const uint8_t> file, uint64_t* pos, const char* what,
                          const UnpickleOptions& options) {
  try {
    UnpickleResult r = Unpickle(file.subspan(*pos), options);
    *pos += r.end_offset;
    return r;
  } catch (const Error& e) {
    throw Error(e.kind(), std::string("legacy torch file: ") + what + " pickle at file offset " +
                              std::to_string(*pos) + ": " + e.what());
  }
}

void CheckSysInfo(const Value* info) {
  if (!info || info->kind != Kind::kDict) Corrupt("sys_info is not a dict");
  auto little = AsBool(DictGet(info, "little_endian"));
  if (!little) Corrupt("sys_info has no little_endian flag");
  if (!*little) throw Error(ErrorKind::kUnsupported, "legacy torch file written on a big-endian machine");
}

std::vector<std::string> ReadKeys(const Value* keys) {
  const std::vector<Value*>* items = Sequence(keys);
  if (!items) Corrupt("the storage key list is not a list");
  std::vector<std::string> out;
  for (const Value* k : *items) {
    auto s = AsShortText(k);
    if (!s) Corrupt("a storage key is not a string of at most " + std::to_string(kMaxShortText) + " bytes");
    out.push_back(*s);
  }
  return out;
}

// Puts the model's storages in data-section order so storages[i] line up.
void AlignModel(TorchPickle& model, const std::vector<std::string>& keys) {
  std::unordered_map<std::string, size_t> old_index;
  for (size_t i = 0; i < model.storages.size(); ++i) old_index.emplace(model.storages[i].key, i);
  std::vector<size_t> new_index(model.storages.size(), SIZE_MAX);
  std::vector<TorchStorage> ordered;
  for (const std::string& key : keys) {
    auto it = old_index.find(key);
    if (it == old_index.end()) Corrupt("storage key '" + key + "' is not referenced by the object pickle");
    if (new_index[it->second] != SIZE_MAX) Corrupt("storage key '" + key + "' listed twice");
    new_index[it->second] = ordered.size();
    ordered.push_back(std::move(model.storages[it->second]));
  }
  for (size_t i = 0; i < new_index.size(); ++i)
    if (new_index[i] == SIZE_MAX) Corrupt("storage '" + model.storages[i].key + "' has no data in the file");
  model.storages = std::move(ordered);
  for (TorchTensor& t : model.tensors) t.storage = new_index[t.storage];
}

}  // namespace

bool IsLegacyTorchFile(std::span<const uint8_t> file) {
  // The first pickle is tiny; tight limits keep a look at an arbitrary file cheap.
  UnpickleOptions tiny;
  tiny.max_nodes = 8;
  tiny.max_total_bytes = 64;
  tiny.max_depth = 4;
  try {
    UnpickleResult r = Unpickle(file.subspan(0, std::min<size_t>(file.size(), 64)), tiny);
    return r.root->kind == Kind::kBigInt && r.root->text == std::string_view(kMagic, sizeof kMagic - 1);
  } catch (const Error&) {
    return false;
  }
}

LegacyLayout ParseLegacyHeader(std::span<const uint8_t> file, const UnpickleOptions& options) {
  if (!IsLegacyTorchFile(file)) throw Error(ErrorKind::kNotContainer, "not a legacy torch file (no magic number)");
  LegacyLayout layout;
  uint64_t pos = 0;
  ReadPickle(file, &pos, "magic number", options);
  UnpickleResult protocol = ReadPickle(file, &pos, "protocol version", options);
  if (protocol.root->kind != Kind::kInt || protocol.root->integer != kLegacyProtocol)
    throw Error(ErrorKind::kUnsupported, "legacy torch file protocol " + Render(protocol.root, 4, 64) + " (expected 1001)");
  CheckSysInfo(ReadPickle(file, &pos, "sys_info", options).root);

  layout.object_pickle_offset = pos;
  layout.objects = ReadPickle(file, &pos, "object", options);
  layout.object_pickle_size = pos - layout.object_pickle_offset;
  layout.keys_pickle_offset = pos;
  std::vector<std::string> keys = ReadKeys(ReadPickle(file, &pos, "storage keys", options).root);
  layout.keys_pickle_size = pos - layout.keys_pickle_offset;
  layout.header_end = pos;

  try {
    layout.model = InterpretTorchPickle(layout.objects);
  } catch (const Error& e) {
    throw Error(e.kind(), "legacy torch file: object pickle at file offset " +
                              std::to_string(layout.object_pickle_offset) + ": " + e.what());
  }
  AlignModel(layout.model, keys);
  return layout;
}

namespace {

// The data section after the header: each storage's 8-byte element count, then its bytes, in
// key-list order. `read_count(offset)` reads the count at a file offset (8 bytes there exist).
template <typename ReadCount>
void LocateStorages(LegacyLayout& layout, uint64_t file_size, ReadCount&& read_count) {
  uint64_t pos = layout.header_end;
  for (const TorchStorage& s : layout.model.storages) {
    LegacyStorage ls;
    ls.key = s.key;
    ls.storage_type = s.storage_type;
    ls.dtype = s.dtype;
    ls.location = s.location;
    ls.count_offset = pos;
    if (file_size - pos < 8) Corrupt("file ends inside the element count of storage '" + s.key + "' at offset " + std::to_string(ls.count_offset));
    const uint64_t count = read_count(pos);
    if (static_cast<int64_t>(count) < 0) Corrupt("negative element count for storage '" + s.key + "'");
    if (count != s.numel)
      Corrupt("storage '" + s.key + "' has " + std::to_string(count) + " elements in the data section but " +
              std::to_string(s.numel) + " in the object pickle");
    ls.numel = count;
    ls.nbytes = s.nbytes;
    ls.data_offset = pos + 8;
    if (ls.nbytes > file_size - ls.data_offset)
      Corrupt("storage '" + s.key + "' needs " + std::to_string(ls.nbytes) + " bytes at offset " +
              std::to_string(ls.data_offset) + " but the file has " + std::to_string(file_size - ls.data_offset));
    pos = ls.data_offset + ls.nbytes;
    layout.storages.push_back(std::move(ls));
  }
  layout.data_end = pos;
}

uint64_t LittleEndian64(const uint8_t* p) {
  uint64_t v = 0;
  for (int b = 7; b >= 0; --b) v = (v << 8) | p[b];
  return v;
}

// How much of a legacy file's front ReadLegacy copies at most to find its header pickles.
constexpr uint64_t kMaxLegacyHeaderBytes = uint64_t{1} << 30;

}  // namespace

LegacyLayout ParseLegacy(std::span<const uint8_t> file, const UnpickleOptions& options) {
  LegacyLayout layout = ParseLegacyHeader(file, options);
  LocateStorages(layout, file.size(), [&](uint64_t offset) { return LittleEndian64(file.data() + offset); });
  return layout;
}

LegacyLayout ReadLegacy(const MappedFile& file, const UnpickleOptions& options) {
  // The header's length is known only once its pickles are parsed: parse a private copy of the
  // file's front, four times longer each time the pickles do not fit (a short header costs one
  // read of 1 MiB).
  const uint64_t limit = std::min<uint64_t>(file.size(), kMaxLegacyHeaderBytes);
  std::vector<uint8_t> front;
  LegacyLayout layout;
  for (uint64_t n = std::min<uint64_t>(limit, uint64_t{1} << 20);; n = std::min(limit, n * 4)) {
    front.resize(n);
    file.ReadAt(0, n, front.data());
    try {
      layout = ParseLegacyHeader(front, options);
      break;
    } catch (const Error& e) {
      // Pickles cut off by the copy's end read as malformed; any other refusal is final.
      if (e.kind() != ErrorKind::kCorrupt) throw;
      if (n == limit && limit < file.size())
        throw Error(e.kind(), std::string(e.what()) + " (zckpt reads at most the first " +
                                  std::to_string(kMaxLegacyHeaderBytes) + " bytes for a legacy file's pickles)");
      if (n == limit) throw;
    }
  }
  LocateStorages(layout, file.size(), [&](uint64_t offset) {
    uint8_t bytes[8];
    file.ReadAt(offset, 8, bytes);
    return LittleEndian64(bytes);
  });
  return layout;
}

}  // namespace zckpt::pickle
