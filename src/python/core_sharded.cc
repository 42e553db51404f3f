// The JSON calls sharded checkpoints stand on, torch-free. For torch.distributed.checkpoint's
// storage layer (zckpt/dcp.py, which writes through the typed container writer of
// core_abi_bytes.cc): `.metadata` and BytesIO vetting by zckpt's interpreter, and the
// object-pickle check a region load makes (zckpt/_regions.py reads the boxes
// through load_ranges). For zckpt/reshard.py: MergeCheckpoint and the FSDP1 flat-optimizer layout.
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/dcp_layout.h"
#include "checkpoint/object_pickle.h"
#include "checkpoint/storage_stream.h"
#include "pickle/dcp_metadata.h"
#include "python/core_calls.h"
#include "zckpt/container.h"
#include "zckpt/error.h"
#include "zckpt/load_ranges.h"
#include "zckpt/merge.h"

namespace zckpt::python {
namespace {

using Strings = std::vector<std::string>;

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
  calls["check_dcp_metadata"] = CheckDcpMetadata;
  calls["read_dcp_blobs"] = ReadDcpBlobs;
  calls["check_object_pickle"] = CheckObjectPickleCall;
  calls["merge"] = Merge;
  calls["fsdp1_layout"] = Fsdp1Layout;
}

}  // namespace zckpt::python
