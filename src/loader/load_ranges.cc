// zckpt/load_ranges.h's loads: byte ranges into memory the caller owns, the object pickle check
// every load by name makes first, and a local container's storages mapped in place.
#include "zckpt/load_ranges.h"

#include <algorithm>
#include <utility>

#include "checkpoint/object_pickle.h"
#include "loader/host_load.h"
#include "loader/map_verify.h"
#include "loader/mapping.h"
#include "zckpt/container.h"

namespace zckpt {

LoadStats LoadRanges(const Container& c, const std::vector<LoadTarget>& targets, const LoadOptions& options) {
  std::vector<loader::CudaDevice> devices;  // each named device once, its legacy default stream
  for (const LoadTarget& t : targets)
    if (t.device >= 0 && std::none_of(devices.begin(), devices.end(),
                                      [&](const loader::CudaDevice& d) { return d.index == t.device; }))
      devices.push_back({t.device, nullptr});
  return loader::LoadRanges(c, targets, options, devices);
}

void CheckObjectPickle(const Container& c, const std::vector<std::string>& allow_globals) {
  checkpoint::PickleReadOptions read;
  read.allow_globals = allow_globals;
  (void)checkpoint::ReadObjectPickle(c, read);
}

struct MappedStorages::State {
  std::shared_ptr<loader::Mapping> mapping;
  std::vector<uint8_t*> data;                         // per storage
  std::vector<std::shared_ptr<const void>> keepers;   // per storage: the mapping or its own buffer
  uint64_t mapped_bytes = 0;
  uint64_t decoded_bytes = 0;
};

MappedStorages::MappedStorages(const Container& c, bool verify, unsigned threads) : state_(std::make_unique<State>()) {
  State& s = *state_;
  s.mapping = std::make_shared<loader::Mapping>(c);
  const uint64_t chunk_bytes = c.superblock().chunk_bytes;
  std::vector<uint64_t> to_verify;
  for (uint32_t i = 0; i < c.storage_count(); ++i) {
    StorageInfo info = c.storage(i);
    if (info.raw_bytes == 0 || info.contiguous) {
      s.data.push_back(s.mapping->data() + info.data_offset);
      s.keepers.push_back(s.mapping);
      s.mapped_bytes += info.raw_bytes;
      if (verify)
        for (uint64_t k = 0; k < info.chunk_count; ++k) to_verify.push_back(info.first_chunk + k);
      continue;
    }
    // zstd chunks cannot alias the file: decoded (and checked) into memory of their own.
    auto buffer = std::make_shared<LoadBuffer>(info.raw_bytes);
    for (uint64_t k = 0; k < info.chunk_count; ++k) c.ReadChunk(info.first_chunk + k, buffer->data() + k * chunk_bytes, true);
    s.data.push_back(buffer->data());
    s.decoded_bytes += info.raw_bytes;
    s.keepers.push_back(std::move(buffer));
  }
  if (!to_verify.empty()) loader::VerifyMapped(c, s.mapping->data(), to_verify, threads);
}

MappedStorages::~MappedStorages() = default;

uint8_t* MappedStorages::data(uint32_t storage) const { return state_->data.at(storage); }
std::shared_ptr<const void> MappedStorages::keeper(uint32_t storage) const { return state_->keepers.at(storage); }
uint64_t MappedStorages::mapped_bytes() const { return state_->mapped_bytes; }
uint64_t MappedStorages::decoded_bytes() const { return state_->decoded_bytes; }

}  // namespace zckpt
