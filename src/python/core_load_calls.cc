// The JSON calls of loads and saves: a whole file's chunks checked (verify_chunks), the CUDA
// runtime in use, zckpt.save's writes, AsyncSaver's pickle check and host copies. Host buffers,
// byte ranges and mapped storages are typed calls (core_abi_bytes.cc). The Python layer allocates
// each storage or tensor and passes addresses; the CUDA runtime is the one torch loaded (common/cudart_loader.h).
#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <thread>
#include <vector>

#include "common/cudart_loader.h"
#include "loader/host_load.h"
#include "python/core_calls.h"
#include "save/save_pickled.h"
#include "zckpt/container.h"
#include "zckpt/load_options.h"
#include "zckpt/load_ranges.h"

namespace zckpt::python {
namespace {

// Every chunk of the open file checked (Container::Verify), for a weight iterator that must not
// hand out a first tensor from a file that is damaged further on: its problems in file order
// (empty when good), each ProblemJson naming file, storage, tensors, chunk and byte ranges, for
// the caller to raise with each one's place.
Json VerifyChunks(const Json& args, Reply&) {
  std::shared_ptr<Container> c = HeldContainer(args);
  VerifyOptions options;
  options.threads = Optional<unsigned>(args, "threads");
  Json problems = Json::array();
  for (const VerifyProblem& p : c->Verify(options).problems) problems.push_back(ProblemJson(p.kind, p.message, p.place));
  return problems;
}

// [path, version] of the CUDA runtime CUDA loads use (loaded now if it is not yet): torch's
// libcudart when torch loaded one; version as cudaRuntimeGetVersion gives it (12080: 12.8).
Json CudaRuntimeCall(const Json&, Reply&) {
  const CudaRuntime& rt = Cuda();
  int version = 0;
  (void)rt.RuntimeGetVersion(&version);
  return Json::array({rt.path, version});
}

// zckpt.save: the pickle torch's pickler made, each storage by [key, address, bytes, device: -1
// for host memory, else a CUDA device index] (the caller keeps them alive for the call), the
// archive's other records as torch's zip writer made them (zckpt/_save.py). CUDA storages go
// through the pinned ring of save/device_reader.h, its copies waiting for "streams"' stream on
// their device ([device, cudaStream_t address] pairs; the caller holds torch's device guard).
// "allow_globals": the "module.name" globals the pickle may name besides the allowlist.
Json SavePickled(const Json& args, Reply&) {
  auto path = args.at("path").get<std::string>();
  save::PickledBytes checkpoint;
  checkpoint.pickle = std::string(ArgBytes(args.at("pickle")));
  for (const Json& s : args.at("storages"))
    checkpoint.storages[s.at(0).get<std::string>()] = {reinterpret_cast<const uint8_t*>(s.at(1).get<uint64_t>()),
                                                       s.at(2).get<uint64_t>(), s.at(3).get<int>()};
  checkpoint.records_before = args.at("records_before").get<std::vector<std::string>>();
  checkpoint.records_after = args.at("records_after").get<std::vector<std::string>>();
  for (const auto& [name, bytes] : args.at("record_bytes").items())
    checkpoint.record_bytes[name] = std::string(ArgBytes(bytes));
  checkpoint.prefix = args.at("prefix").get<std::string>();
  for (const auto& [key, value] : args.at("metadata").items()) checkpoint.metadata[key] = value.get<std::string>();
  checkpoint.allow_globals = args.at("allow_globals").get<std::vector<std::string>>();
  std::map<int, CUstream_st*> streams;
  for (const Json& s : args.at("streams"))
    streams[s.at(0).get<int>()] = reinterpret_cast<CUstream_st*>(s.at(1).get<uint64_t>());
  SaveOptions options;
  if (auto chunk = args.at("chunk_bytes").get<uint64_t>()) options.writer.chunk_bytes = chunk;
  options.writer.zstd_level = args.at("zstd_level").get<int>();
  options.writer.threads = args.at("threads").get<unsigned>();
  SaveStats s = save::SavePickledBytes(path, checkpoint, options, [&] {
    return save::MakeCudaReader(options.cuda_slots, options.cuda_slot_bytes, [&streams](int device) {
      auto it = streams.find(device);
      return it == streams.end() ? nullptr : it->second;
    });
  });
  return SaveStatsJson(path, s);
}

// AsyncSaver's check of a pickle before its snapshot: "pickle" read as zckpt.save reads it, an
// UnsafeError naming a global neither on the allowlist nor in "allow_globals" (save::ReadPickle),
// so that a refused object is refused by the call that hands it over, before anything is copied.
Json VetPickle(const Json& args, Reply&) {
  save::ReadPickle(std::string(ArgBytes(args.at("pickle"))), args.at("allow_globals").get<std::vector<std::string>>());
  return nullptr;
}

// AsyncSaver's snapshot of CPU storages: [dst address, src address, bytes] triples copied with
// plain memcpy (torch's copy_ of uint8 runs a TensorIterator over OpenMP threads, measured ~3x
// slower than one memcpy on a busy machine), in pieces of 16 MiB spread over "threads" threads
// (0: one per core, at most 8). The caller keeps both sides alive for the call.
Json CopyHostBytes(const Json& args, Reply&) {
  struct Piece {
    uint8_t* dst;
    const uint8_t* src;
    size_t n;
  };
  constexpr size_t kPiece = 16u << 20;
  constexpr unsigned kMaxCopyThreads = 8;
  std::vector<Piece> pieces;
  for (const Json& c : args.at("copies")) {
    auto* dst = reinterpret_cast<uint8_t*>(c.at(0).get<uint64_t>());
    const auto* src = reinterpret_cast<const uint8_t*>(c.at(1).get<uint64_t>());
    auto n = c.at(2).get<uint64_t>();
    for (size_t off = 0; off < n; off += kPiece) pieces.push_back({dst + off, src + off, std::min<size_t>(kPiece, n - off)});
  }
  auto threads = args.at("threads").get<unsigned>();
  unsigned n = threads ? threads : std::min(kMaxCopyThreads, std::max(1u, std::thread::hardware_concurrency()));
  n = static_cast<unsigned>(std::min<size_t>(n, pieces.size()));
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < pieces.size();) std::memcpy(pieces[i].dst, pieces[i].src, pieces[i].n);
  };
  std::vector<std::thread> helpers;
  for (unsigned t = 1; t < n; ++t) helpers.emplace_back(work);
  work();
  for (auto& h : helpers) h.join();
  return nullptr;
}

}  // namespace

Json SaveStatsJson(const std::string& path, const SaveStats& s) {
  return Json{{"destination", path},
              {"storages", s.storages},
              {"tensors", s.tensors},
              {"raw_bytes", s.written.raw_bytes},
              {"file_bytes", s.written.file_bytes},
              {"chunks", s.written.chunks},
              {"compressed_chunks", s.written.compressed_chunks},
              {"cuda_bytes", s.cuda_bytes},
              {"cuda_ring_bytes", s.cuda_ring_bytes},
              {"seconds", s.seconds}};
}

void AddLoadCalls(CallTable& calls) {
  calls["verify_chunks"] = VerifyChunks;
  calls["cuda_runtime"] = CudaRuntimeCall;
  calls["save_pickled"] = SavePickled;
  calls["copy_host_bytes"] = CopyHostBytes;
  calls["vet_pickle"] = VetPickle;
}

}  // namespace zckpt::python
