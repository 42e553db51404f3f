// The calls that move bytes between a checkpoint and memory: host buffers a load fills, byte
// ranges of storages loaded by address (host or CUDA, loader::LoadRanges), mapped storages
// (mmap=True), zckpt.save's writes and AsyncSaver's host copies. The Python layer allocates each
// storage or tensor (a host buffer, or torch's own memory on the CPU or a CUDA device) and passes
// addresses; the CUDA runtime is the one torch loaded (common/cudart_loader.h).
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

// Host memory a load fills, owned by Python through its handle (zckpt/load_ranges.h's LoadBuffer:
// 4 KiB-aligned, so bytes not in the page cache go straight from the disk into it). Zero-filled
// is not promised: a load overwrites it. {"buffer": handle, "address"}.
Json HostBuffer(const Json& args, Reply&) {
  auto buffer = std::make_shared<LoadBuffer>(args.at("bytes").get<uint64_t>());
  auto address = reinterpret_cast<uintptr_t>(buffer->data());
  return Json{{"buffer", TheHandles().Keep(std::move(buffer))}, {"address", address}};
}

// LoadStats' figures of a load.
Json LoadStatsJson(const LoadStats& s) {
  return Json{{"raw_bytes", s.raw_bytes}, {"stored_bytes", s.stored_bytes}, {"chunks", s.chunks},
              {"uncached_bytes", s.uncached_bytes}, {"threads", s.threads}, {"verified", s.verified},
              {"storages", s.storages}, {"seconds", s.seconds}};
}

LoadOptions RingOptions(const Json& args) {
  LoadOptions o;
  o.verify = args.at("verify").get<bool>();
  o.threads = Optional<unsigned>(args, "threads");
  o.slots = Optional<unsigned>(args, "slots");
  o.slot_bytes = Optional<uint64_t>(args, "slot_bytes");
  return o;
}

// "targets": [storage index, begin, end, address, device] per byte range, device -1 for host
// memory, else a CUDA device index whose stream the copies wait for is in "streams" ([device,
// cudaStream_t address] pairs: torch's current stream there, 0 for the legacy default stream).
// The Python layer allocates with torch and holds torch's device guard.
Json LoadRanges(const Json& args, Reply&) {
  std::shared_ptr<Container> c = HeldContainer(args);
  std::vector<LoadTarget> ranges;
  for (const Json& t : args.at("targets"))
    ranges.push_back({t.at(0).get<uint32_t>(), t.at(1).get<uint64_t>(), t.at(2).get<uint64_t>(),
                      reinterpret_cast<uint8_t*>(t.at(3).get<uint64_t>()), t.at(4).get<int32_t>()});
  std::vector<loader::CudaDevice> devices;
  for (const Json& s : args.at("streams"))
    devices.push_back({s.at(0).get<int>(), reinterpret_cast<CUstream_st*>(s.at(1).get<uint64_t>())});
  return LoadStatsJson(loader::LoadRanges(*c, ranges, RingOptions(args), devices));
}

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

// MappedStorages (raw chunks laid end to end alias the file, zstd chunks are decoded and checked;
// with verify, every mapped chunk is hashed where it lies first, on "threads" threads):
// [[key, address, bytes, keeper handle]] per storage in file order. A storage's bytes stay while
// its keeper is held (the file's mapping, or the storage's own decoded buffer): the Python side's
// views of each storage hold its keeper, as torch.load(mmap=True)'s tensors hold the file.
Json MapStorages(const Json& args, Reply&) {
  std::shared_ptr<Container> c = HeldContainer(args);
  auto threads = Optional<unsigned>(args, "threads");
  MappedStorages mapped(*c, args.at("verify").get<bool>(), threads.value_or(DefaultReaderThreads()));
  Json storages = Json::array();
  for (uint32_t s = 0; s < c->storage_count(); ++s) {
    StorageInfo info = c->storage(s);
    storages.push_back(Json::array({std::string(info.key), reinterpret_cast<uintptr_t>(mapped.data(s)), info.raw_bytes,
                                    TheHandles().Keep(mapped.keeper(s))}));
  }
  return storages;
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
  calls["host_buffer"] = HostBuffer;
  calls["load_ranges"] = LoadRanges;
  calls["verify_chunks"] = VerifyChunks;
  calls["map_storages"] = MapStorages;
  calls["cuda_runtime"] = CudaRuntimeCall;
  calls["save_pickled"] = SavePickled;
  calls["copy_host_bytes"] = CopyHostBytes;
}

}  // namespace zckpt::python
