// The calls sharded checkpoints stand on, torch-free. For torch.distributed.checkpoint's storage
// layer (zckpt/dcp.py): a container writer fed host bytes by address (zckpt/_writer.py copies
// device and non-contiguous tensors out in pieces), `.metadata` and BytesIO vetting by zckpt's
// interpreter, and the object-pickle check a region load makes (zckpt/_regions.py reads the boxes
// through load_ranges). For zckpt/reshard.py: MergeCheckpoint and the FSDP1 flat-optimizer layout.
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/dcp_layout.h"
#include "checkpoint/object_pickle.h"
#include "checkpoint/storage_stream.h"
#include "common/shape.h"
#include "pickle/dcp_metadata.h"
#include "python/core_calls.h"
#include "zckpt/container.h"
#include "zckpt/container_writer.h"
#include "zckpt/dtype.h"
#include "zckpt/error.h"
#include "zckpt/load_ranges.h"
#include "zckpt/merge.h"

namespace zckpt::python {
namespace {

// Host memory the caller owns and keeps alive for the call ("address", "bytes"), as a byte span.
std::span<const uint8_t> HostBytes(const Json& args) {
  std::string_view v = AddressBytes(args.at("address").get<uint64_t>(), args.at("bytes").get<uint64_t>());
  return {reinterpret_cast<const uint8_t*>(v.data()), v.size()};
}

using Strings = std::vector<std::string>;

// A ContainerWriter driven from Python with host bytes, one call at a time. A tensor is one
// storage "key" holding its elements in row-major order and a record "name" viewing all of it;
// "dtype" is zckpt's name of it (torch's, zckpt/_writer.py), "location" the device it was saved
// from. {"writer": handle}.
Json WriterOpen(const Json& args, Reply&) {
  WriterOptions o;
  if (auto chunk = args.at("chunk_bytes").get<uint64_t>()) o.chunk_bytes = chunk;
  o.zstd_level = args.at("zstd_level").get<int>();
  o.threads = args.at("threads").get<unsigned>();
  return TheHandles().Keep(std::make_shared<ContainerWriter>(args.at("path").get<std::string>(), o));
}

std::shared_ptr<ContainerWriter> Writer(const Json& args) { return TheHandles().Get<ContainerWriter>(args.at("writer")); }

// The record of a contiguous tensor; its byte count must be the shape's (a caller's slip would
// otherwise surface only at Commit).
NewTensor Record(const Json& args) {
  auto name = args.at("name").get<std::string>();
  auto dtype = args.at("dtype").get<std::string>();
  auto shape = args.at("shape").get<std::vector<int64_t>>();
  auto bytes = args.at("bytes").get<uint64_t>();
  std::optional<DType> code = DTypeFromName(dtype);
  if (!code) throw Error(ErrorKind::kUnsupported, "dtype " + dtype + " has no zckpt dtype code");
  uint64_t numel = 1;
  for (int64_t d : shape) {
    if (d < 0) throw Error(ErrorKind::kInvalidArgument, "tensor '" + name + "': a negative dimension");
    numel *= static_cast<uint64_t>(d);
  }
  if (numel * DTypeSize(*code) != bytes)
    throw Error(ErrorKind::kInvalidArgument, "tensor '" + name + "': " + std::to_string(bytes) + " bytes for " +
                                                 std::to_string(numel) + " elements of " + dtype);
  NewTensor t;
  t.name = name;
  t.dtype = *code;
  t.shape = shape;
  t.stride = ContiguousStrides(shape);
  t.extra = args.at("extra").get<std::string>();
  return t;
}

NewStorage Storage(const Json& args, DType dtype) {
  return NewStorage{args.at("key").get<std::string>(), args.at("location").get<std::string>(), dtype, false};
}

// A contiguous host tensor whole: "bytes" at "address".
Json WriterAddTensor(const Json& args, Reply&) {
  auto writer = Writer(args);
  NewTensor t = Record(args);
  t.storage = writer->AddStorage(Storage(args, t.dtype), HostBytes(args));
  writer->AddTensor(t);
  return nullptr;
}

// A tensor in pieces: writer_begin_tensor, writer_append_bytes until "bytes" are given,
// writer_end_tensor. One at a time, no blob in between (ContainerWriter::BeginStorage).
Json WriterBeginTensor(const Json& args, Reply&) {
  auto writer = Writer(args);
  NewTensor t = Record(args);
  t.storage = writer->BeginStorage(Storage(args, t.dtype), args.at("bytes").get<uint64_t>());
  writer->AddTensor(t);
  return nullptr;
}

Json WriterAppendBytes(const Json& args, Reply&) {
  Writer(args)->AppendStorage(HostBytes(args));
  return nullptr;
}

Json WriterEndTensor(const Json& args, Reply&) {
  Writer(args)->EndStorage();
  return nullptr;
}

Json WriterAddBlob(const Json& args, Reply&) {
  std::string_view data = ArgBytes(args.at("data"));
  Writer(args)->AddBlob(args.at("name").get<std::string>(), {reinterpret_cast<const uint8_t*>(data.data()), data.size()});
  return nullptr;
}

Json WriterSetMetadata(const Json& args, Reply&) {
  Writer(args)->SetMetadata(args.at("key").get<std::string>(), args.at("value").get<std::string>());
  return nullptr;
}

Json WriterCommit(const Json& args, Reply&) {
  WriterStats s = Writer(args)->Commit();
  return Json{{"storages", s.storages}, {"chunks", s.chunks}, {"raw_bytes", s.raw_bytes}, {"file_bytes", s.file_bytes}};
}

// Reads `.metadata` bytes with zckpt's interpreter (nothing runs): kUnsafe for a global outside
// DCP's metadata classes, kCorrupt when it is not DCP metadata. Returns [items, storage entries].
Json CheckDcpMetadata(const Json& args, Reply&) {
  std::string_view v = ArgBytes(args.at("data"));
  pickle::DcpMetadata md = pickle::ReadDcpMetadata({reinterpret_cast<const uint8_t*>(v.data()), v.size()},
                                                   args.at("what").get<std::string>());
  return Json::array({md.items.size(), md.storage.size()});
}

// The blobs "names" of a container, each checked against its XXH3 and vetted as a torch.save
// archive by zckpt's interpreter (DCP's planner unpickles them with weights_only=False).
Json ReadDcpBlobs(const Json& args, Reply& reply) {
  auto path = args.at("path").get<std::string>();
  checkpoint::PickleReadOptions read;  // DCP's planner unpickles them next: the allowlist
  read.allow_globals = args.at("allow_globals").get<Strings>();
  auto c = Container::Open(path);
  Json out = Json::array();
  for (const auto& name : args.at("names").get<Strings>()) {
    auto bytes = checkpoint::CheckedBlob(*c, name, "the folder's .metadata");
    dcp::VetTorchSaveBytes(bytes, path + " blob '" + name + "'", read);
    out.push_back(reply.Bytes(std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size())));
  }
  return out;
}

// A region load reads raw bytes only, yet a container with an object pickle must hold one that
// zckpt's interpreter accepts and that agrees with the index, as for every other load (none in
// DCP's own containers: nothing to check there): zckpt::CheckObjectPickle (load_ranges.h).
Json CheckObjectPickleCall(const Json& args, Reply&) {
  CheckObjectPickle(*HeldContainer(args), args.at("allow_globals").get<Strings>());
  return nullptr;
}

Json Merge(const Json& args, Reply&) {
  MergeOptions o;
  o.files = args.at("files").get<std::string>();
  o.keys = args.at("keys").get<std::string>();
  MergeStats s = MergeCheckpoint(args.at("dir").get<std::string>(), args.at("out").get<std::string>(), o);
  return Json{{"layout", s.layout}, {"tensors", s.tensors}, {"bytes", s.bytes}, {"largest_tensor", s.largest_tensor},
              {"written", s.written}};
}

// FSDP1 flat optimizer files' FlatParameter layout as JSON text ("" when they are not such files).
Json Fsdp1Layout(const Json& args, Reply&) {
  MergeOptions o;
  o.files = args.at("files").get<std::string>();
  return Fsdp1OptimLayout(args.at("dir").get<std::string>(), o);
}

}  // namespace

void AddShardedCalls(CallTable& calls) {
  calls["writer_open"] = WriterOpen;
  calls["writer_add_tensor"] = WriterAddTensor;
  calls["writer_begin_tensor"] = WriterBeginTensor;
  calls["writer_append_bytes"] = WriterAppendBytes;
  calls["writer_end_tensor"] = WriterEndTensor;
  calls["writer_add_blob"] = WriterAddBlob;
  calls["writer_set_metadata"] = WriterSetMetadata;
  calls["writer_commit"] = WriterCommit;
  calls["check_dcp_metadata"] = CheckDcpMetadata;
  calls["read_dcp_blobs"] = ReadDcpBlobs;
  calls["check_object_pickle"] = CheckObjectPickleCall;
  calls["merge"] = Merge;
  calls["fsdp1_layout"] = Fsdp1Layout;
}

}  // namespace zckpt::python
