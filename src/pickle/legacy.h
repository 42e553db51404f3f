// The legacy torch.save format (torch < 1.6, or _use_new_zipfile_serialization=False):
//   pickle 1: the magic number 0x1950a86a20f9469cfc6c
//   pickle 2: the protocol version, 1001
//   pickle 3: sys_info {'protocol_version', 'little_endian', 'type_sizes'}
//   pickle 4: the object pickle (storage persistent ids have a sixth element: a view or None)
//   pickle 5: the list of storage keys
//   data:     per key, in that order: int64 LE element count, then count * element size bytes
// Parsed without running anything; every span is checked against the file. The layout keeps
// the spans a writer needs to re-emit a byte-identical file.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/mapped_file.h"
#include "pickle/torch_model.h"
#include "pickle/unpickler.h"

namespace zckpt::pickle {

struct LegacyStorage {
  std::string key;           // as in the keys list
  std::string storage_type;  // "torch.FloatStorage", ...
  DType dtype = DType::kInvalid;
  std::string location;      // "cpu", "cuda:0": recorded only
  uint64_t numel = 0;        // elements (the data section's count)
  uint64_t count_offset = 0; // file offset of the int64 count
  uint64_t data_offset = 0;  // file offset of the first data byte
  uint64_t nbytes = 0;       // numel * element size
};

struct LegacyLayout {
  uint64_t object_pickle_offset = 0;  // pickle 4: [offset, offset + size)
  uint64_t object_pickle_size = 0;
  uint64_t keys_pickle_offset = 0;    // pickle 5
  uint64_t keys_pickle_size = 0;
  uint64_t header_end = 0;            // where the data section starts
  uint64_t data_end = 0;              // after the last storage's bytes (a file may go on)
  std::vector<LegacyStorage> storages;  // data-section order
  UnpickleResult objects;  // the object pickle's tree (offsets relative to object_pickle_offset)
  TorchPickle model;       // what it describes; model.storages[i] is storages[i]
};

// True when `file` starts with a pickle of the legacy magic number (protocol 2 writes it as
// 80 02 8a 0a 6c fc 9c 46 f9 20 6a a8 50 19 2e; other pickle protocols frame it differently).
bool IsLegacyTorchFile(std::span<const uint8_t> file);

// Errors: kNotContainer without the magic, kUnsupported for another protocol version or a
// big-endian writer, kCorrupt for anything malformed (messages give the file offset), kUnsafe
// for a refused global (every pickle of the file is read under `options`).
LegacyLayout ParseLegacy(std::span<const uint8_t> file, const UnpickleOptions& options = {});

// ParseLegacy of the file `file`, read into private memory (MappedFile::ReadAt) rather than from
// its mapping: its front until the header pickles parse (at most 1 GiB), then each storage's
// element count. A file truncated while it is parsed is Error(kIo) naming it, never SIGBUS.
LegacyLayout ReadLegacy(const MappedFile& file, const UnpickleOptions& options = {});

// The five pickles only (what precedes the data section): `storages` stays empty and `data_end`
// 0, `model.storages` is in key-list order. For a header kept apart from its data (export).
LegacyLayout ParseLegacyHeader(std::span<const uint8_t> file, const UnpickleOptions& options = {});

}  // namespace zckpt::pickle
