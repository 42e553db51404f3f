// zckpt_forge: rewrites a container with some of its records changed, through ContainerWriter,
// so every checksum of the result is right: the hostile containers of the end-to-end tests
// (an object pickle that disagrees with the index or names a forbidden global, metadata naming
// unsafe records) that `zckpt convert` would never write. A test tool, not installed.
//
//   zckpt_forge SRC.zckpt DST.zckpt [EDIT]...
//     --blob NAME=FILE            add or replace blob NAME with FILE's bytes
//     --drop-blob NAME            leave blob NAME out
//     --metadata KEY=VALUE        add or replace a metadata entry
//     --metadata-file KEY=FILE    the same, the value read from FILE (NUL bytes included)
//     --drop-metadata KEY         leave a metadata entry out
//     --tensor NAME:FIELD=VALUE   change tensor NAME: offset=N, shape=A,B,..., stride=A,B,...,
//                                 storage=KEY, dtype=NAME, flags=N, name=NEW
// Exit 0 written; 1 a bad edit, or the writer refused the result; 2 the source could not be read.
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "test_util.h"
#include "zckpt/container.h"
#include "zckpt/container_writer.h"
#include "zckpt/error.h"

namespace {

using namespace zckpt;

std::pair<std::string, std::string> Split(const std::string& s, char sep) {
  size_t at = s.find(sep);
  if (at == std::string::npos) throw Error(ErrorKind::kInvalidArgument, "expected '" + std::string(1, sep) + "' in " + s);
  return {s.substr(0, at), s.substr(at + 1)};
}

std::vector<int64_t> Ints(const std::string& s) {
  std::vector<int64_t> out;
  size_t start = 0;
  while (start < s.size()) {
    size_t end = s.find(',', start);
    if (end == std::string::npos) end = s.size();
    out.push_back(std::stoll(s.substr(start, end - start)));
    start = end + 1;
  }
  return out;
}

std::string FileText(const std::string& path) {
  std::vector<uint8_t> b = testing::ReadFileBytes(path);
  return std::string(b.begin(), b.end());
}

int Run(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: zckpt_forge SRC.zckpt DST.zckpt [EDIT]...\n");
    return 2;
  }
  std::map<std::string, std::string> blobs, metadata;
  std::set<std::string> drop_blobs, drop_metadata;
  std::map<std::string, std::vector<std::pair<std::string, std::string>>> tensor_edits;
  for (int i = 3; i < argc; ++i) {
    std::string opt = argv[i];
    if (i + 1 >= argc) throw Error(ErrorKind::kInvalidArgument, opt + " needs a value");
    std::string value = argv[++i];
    if (opt == "--blob") {
      auto [name, file] = Split(value, '=');
      blobs[name] = FileText(file);
    } else if (opt == "--drop-blob") {
      drop_blobs.insert(value);
    } else if (opt == "--metadata") {
      auto [k, v] = Split(value, '=');
      metadata[k] = v;
    } else if (opt == "--metadata-file") {
      auto [k, file] = Split(value, '=');
      metadata[k] = FileText(file);
    } else if (opt == "--drop-metadata") {
      drop_metadata.insert(value);
    } else if (opt == "--tensor") {
      auto [name, edit] = Split(value, ':');
      tensor_edits[name].push_back(Split(edit, '='));
    } else {
      throw Error(ErrorKind::kInvalidArgument, "unknown option " + opt);
    }
  }

  auto c = Container::Open(argv[1]);
  WriterOptions o;
  o.chunk_bytes = c->superblock().chunk_bytes;
  o.large_alignment = c->superblock().large_alignment;
  o.small_alignment = c->superblock().small_alignment;
  o.large_threshold = c->superblock().large_threshold;
  ContainerWriter w(argv[2], o);
  std::vector<uint8_t> chunk;
  for (uint32_t s = 0; s < c->storage_count(); ++s) {
    StorageInfo info = c->storage(s);
    NewStorage ns{std::string(info.key), std::string(info.location), info.dtype,
                  (info.flags & format::kStorageUntyped) != 0};
    w.BeginStorage(ns, info.raw_bytes);
    for (uint64_t k = 0; k < info.chunk_count; ++k) {
      chunk.resize(c->chunk(info.first_chunk + k).raw_bytes);
      c->ReadChunk(info.first_chunk + k, chunk.data(), true);
      w.AppendStorage(chunk);
    }
    w.EndStorage();
  }
  for (uint32_t i = 0; i < c->tensor_count(); ++i) {
    TensorInfo t = c->tensor(i);
    NewTensor nt{std::string(t.name), t.storage, t.dtype, t.shape, t.stride, t.storage_offset, t.flags, std::string(t.extra)};
    for (const auto& [field, value] : tensor_edits[nt.name]) {
      if (field == "offset") nt.storage_offset = std::stoull(value);
      else if (field == "shape") nt.shape = Ints(value);
      else if (field == "stride") nt.stride = Ints(value);
      else if (field == "flags") nt.flags = static_cast<uint32_t>(std::stoul(value));
      else if (field == "name") nt.name = value;
      else if (field == "storage") {
        auto s = c->FindStorage(value);
        if (!s) throw Error(ErrorKind::kInvalidArgument, "no storage " + value);
        nt.storage = *s;
      } else if (field == "dtype") {
        auto d = DTypeFromName(value);
        if (!d) throw Error(ErrorKind::kInvalidArgument, "no dtype " + value);
        nt.dtype = *d;
      } else {
        throw Error(ErrorKind::kInvalidArgument, "unknown tensor field " + field);
      }
    }
    w.AddTensor(nt);
  }
  for (uint32_t i = 0; i < c->blob_count(); ++i) {
    BlobInfo b = c->blob(i);
    std::string name(b.name);
    if (drop_blobs.count(name) || blobs.count(name)) continue;
    w.AddBlob(name, c->CheckedBlobBytes(b));
  }
  for (const auto& [name, bytes] : blobs)
    w.AddBlob(name, std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()));
  for (uint32_t i = 0; i < c->metadata_count(); ++i) {
    auto [k, v] = c->metadata(i);
    std::string key(k);
    if (!drop_metadata.count(key) && !metadata.count(key)) w.SetMetadata(key, std::string(v));
  }
  for (const auto& [k, v] : metadata) w.SetMetadata(k, v);
  w.Commit();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return Run(argc, argv);
  } catch (const zckpt::Error& e) {
    std::fprintf(stderr, "zckpt_forge: %s\n", e.what());
    return e.kind() == zckpt::ErrorKind::kInvalidArgument ? 1 : 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zckpt_forge: %s\n", e.what());
    return 2;
  }
}
