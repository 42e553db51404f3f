// fuzz_container: the .zckpt reader on arbitrary bytes.
//
// Container::OpenMemory (spec §7 steps 1-4), then Verify, every accessor of every record, the
// lookups, and ReadChunk of every chunk into a buffer, with and without checksum checks.
// Besides crashes and sanitizer reports it checks what a reader promises once a file opened:
// every string lies inside the reader's private copy of the index, names and keys are unique (each lookup finds its own
// record), tensor extents fit their storage, chunks are in file order inside the data region,
// and a file Verify calls good decodes chunk by chunk without a checksum error.
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "format/container_file.h"
#include "fuzz_target.h"
#include "zckpt/container.h"
#include "zckpt/error.h"
#include "zckpt/format.h"

namespace zckpt::fuzz {

using format::internal::ContainerFile;

namespace {

bool Inside(const uint8_t* base, size_t size, const uint8_t* p, uint64_t n) {
  if (n == 0) return true;
  if (p < base) return false;
  uint64_t off = static_cast<uint64_t>(p - base);
  return off <= size && n <= size - off;
}

}  // namespace

void FuzzContainer(const uint8_t* data, size_t size) {
  std::unique_ptr<Container> c;
  try {
    c = Container::OpenMemory(data, size, "fuzz.zckpt");
  } catch (const Error&) {
    return;
  }
  ZCKPT_FUZZ_CHECK(ContainerFile::Data(*c) == data && c->file_bytes() == size);
  const std::span<const uint8_t> index = ContainerFile::Index(*c);  // every string points into this copy
  auto in_index = [&](std::string_view v) {
    return Inside(index.data(), index.size(), reinterpret_cast<const uint8_t*>(v.data()), v.size());
  };
  const uint64_t index_offset = c->footer().index_offset;
  ZCKPT_FUZZ_CHECK(index_offset >= format::kSuperblockBytes && index_offset <= size);

  VerifyOptions vo;
  vo.threads = 2;
  uint64_t last_progress = 0;
  vo.progress = [&](uint64_t done, uint64_t total) {
    ZCKPT_FUZZ_CHECK(total == size && done <= total);
    last_progress = done;
  };
  VerifyReport report = c->Verify(vo);  // throws only kCancelled: nothing to catch here
  ZCKPT_FUZZ_CHECK(last_progress == size);
  const bool good = report.ok();
  for (const VerifyProblem& p : report.problems) {
    ZCKPT_FUZZ_CHECK(!p.message.empty());
    ZCKPT_FUZZ_CHECK(p.place.chunk < 0 || static_cast<uint64_t>(p.place.chunk) < c->chunk_count());
  }

  // Storages: chunk ranges tile the chunk table, keys are unique, views stay in the input.
  uint64_t next_chunk = 0;
  for (uint32_t s = 0; s < c->storage_count(); ++s) {
    StorageInfo si = c->storage(s);
    ZCKPT_FUZZ_CHECK(si.index == s);
    ZCKPT_FUZZ_CHECK(si.first_chunk == next_chunk);
    ZCKPT_FUZZ_CHECK(si.chunk_count <= c->chunk_count() - si.first_chunk);
    next_chunk += si.chunk_count;
    ZCKPT_FUZZ_CHECK(in_index(si.key) && in_index(si.location));
    auto found = c->FindStorage(si.key);
    ZCKPT_FUZZ_CHECK(found && *found == s);
    if (si.contiguous && si.raw_bytes > 0)
      ZCKPT_FUZZ_CHECK(si.data_offset <= index_offset && si.raw_bytes <= index_offset - si.data_offset);
    for (uint32_t t : c->TensorsOfStorage(s)) {
      ZCKPT_FUZZ_CHECK(t < c->tensor_count());
      ZCKPT_FUZZ_CHECK(c->tensor(t).storage == s);
    }
  }
  ZCKPT_FUZZ_CHECK(next_chunk == c->chunk_count());

  // Chunks: in file order inside the data region; each decodes (a file Verify calls good must
  // decode without error).
  uint64_t prev_end = format::kSuperblockBytes;
  std::vector<uint8_t> buf;
  for (uint64_t i = 0; i < c->chunk_count(); ++i) {
    format::ChunkRecord ch = c->chunk(i);
    ZCKPT_FUZZ_CHECK(ch.storage < c->storage_count());
    ZCKPT_FUZZ_CHECK(ch.offset >= prev_end);
    ZCKPT_FUZZ_CHECK(ch.offset <= index_offset && ch.stored_bytes <= index_offset - ch.offset);
    prev_end = ch.offset + ch.stored_bytes;
    ZCKPT_FUZZ_CHECK(ch.raw_bytes > 0 && ch.raw_bytes <= c->superblock().chunk_bytes);
    const uint8_t* stored = data + ch.offset;
    ZCKPT_FUZZ_CHECK(!c->DescribeChunk(i).empty());
    if (ch.raw_bytes > kMaxDecodeBytes) continue;
    buf.assign(ch.raw_bytes, 0xA5);
    try {
      c->ReadChunk(i, buf.data(), /*check=*/true);
      if (ch.codec == 0) ZCKPT_FUZZ_CHECK(std::memcmp(buf.data(), stored, ch.raw_bytes) == 0);
    } catch (const Error& e) {
      ZCKPT_FUZZ_CHECK(e.kind() == ErrorKind::kCorrupt);
      ZCKPT_FUZZ_CHECK(!good);  // Verify said the file is good, so no chunk may fail
    }
    try {
      c->ReadChunk(i, buf.data(), /*check=*/false);
    } catch (const Error& e) {
      ZCKPT_FUZZ_CHECK(e.kind() == ErrorKind::kCorrupt);
      ZCKPT_FUZZ_CHECK(!good);
    }
  }

  // Tensors: storage in range, extent inside it, names unique.
  for (uint32_t t = 0; t < c->tensor_count(); ++t) {
    TensorInfo ti = c->tensor(t);
    ZCKPT_FUZZ_CHECK(ti.index == t && ti.storage < c->storage_count());
    ZCKPT_FUZZ_CHECK(ti.shape.size() == ti.stride.size() && ti.shape.size() <= format::kMaxTensorDims);
    ZCKPT_FUZZ_CHECK(ti.byte_begin <= ti.byte_end);
    ZCKPT_FUZZ_CHECK(ti.byte_end <= c->storage(ti.storage).raw_bytes);
    for (size_t d = 0; d < ti.shape.size(); ++d) ZCKPT_FUZZ_CHECK(ti.shape[d] >= 0 && ti.stride[d] >= 0);
    ZCKPT_FUZZ_CHECK(in_index(ti.name) && in_index(ti.extra));
    auto found = c->FindTensor(ti.name);
    ZCKPT_FUZZ_CHECK(found && *found == t);
  }

  // Blobs: inside the data region, names unique, checksums hold on a good file.
  for (uint32_t b = 0; b < c->blob_count(); ++b) {
    BlobInfo bi = c->blob(b);
    ZCKPT_FUZZ_CHECK(in_index(bi.name));
    if (bi.bytes) {
      ZCKPT_FUZZ_CHECK(bi.offset >= format::kSuperblockBytes && bi.offset <= index_offset);
      ZCKPT_FUZZ_CHECK(bi.bytes <= index_offset - bi.offset);
    }
    if (bi.bytes <= kMaxDecodeBytes) {
      try {
        std::vector<uint8_t> bytes = c->CheckedBlobBytes(bi);
        ZCKPT_FUZZ_CHECK(bytes.size() == bi.bytes && (bytes.empty() || std::memcmp(bytes.data(), data + bi.offset, bi.bytes) == 0));
      } catch (const Error& e) {
        ZCKPT_FUZZ_CHECK(e.kind() == ErrorKind::kCorrupt && !good);
      }
    }
    auto found = c->FindBlob(bi.name);
    ZCKPT_FUZZ_CHECK(found && found->offset == bi.offset && found->bytes == bi.bytes);
  }

  // Metadata: keys unique.
  for (uint32_t m = 0; m < c->metadata_count(); ++m) {
    auto [key, value] = c->metadata(m);
    ZCKPT_FUZZ_CHECK(in_index(key) && in_index(value));
    auto found = c->FindMetadata(key);
    ZCKPT_FUZZ_CHECK(found && found->data() == value.data() && found->size() == value.size());
  }

  // Lookups of a name that is (almost certainly) not there: a hit must really be that name.
  static const std::string kAbsent = "\xff\xfe zckpt-fuzz absent name";
  if (auto t = c->FindTensor(kAbsent)) ZCKPT_FUZZ_CHECK(c->tensor(*t).name == kAbsent);
  if (auto s = c->FindStorage(kAbsent)) ZCKPT_FUZZ_CHECK(c->storage(*s).key == kAbsent);
  if (auto b = c->FindBlob(kAbsent)) ZCKPT_FUZZ_CHECK(b->name == kAbsent);
  (void)c->FindMetadata(kAbsent);
}

}  // namespace zckpt::fuzz

ZCKPT_FUZZ_ENTRY(zckpt::fuzz::FuzzContainer)

#ifndef ZCKPT_FUZZ_NO_ENTRY
extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

// Mutations that reach past the checksums (container_mutator.cc).
extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size, unsigned int seed) {
  return zckpt::fuzz::MutateContainer(data, size, max_size, seed, LLVMFuzzerMutate);
}
#endif
