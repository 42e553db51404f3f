// fuzz_container's custom mutator: mutations that get past the checksum layer.
//
// A random byte mutation of a container almost always breaks a checksum first (the superblock's,
// the index's, a chunk's, a blob's), so a fuzzer that only flips bytes spends its time on the
// checksum check. Here a mutation is (mostly) followed by recomputing every checksum that can be
// located in the mutant, the data ones included, and half the mutations are structured: one field
// of one record (or of the superblock, or a byte of the string pool) set to a boundary value, the
// kind of edit that finds missing range checks. Everything reads the mutant leniently: offsets
// and counts are bounded before use, whatever the mutant says.
#include <zstd.h>

#include <algorithm>
#include <cstring>
#include <iterator>
#include <random>
#include <vector>

#include "fuzz_target.h"
#include "zckpt/format.h"

namespace zckpt::fuzz {

namespace {

uint64_t Load(const uint8_t* p, int width) {
  uint64_t v = 0;
  for (int i = width - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

void Store(uint8_t* p, uint64_t v, int width) {
  for (int i = 0; i < width; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

// Zstd frames are decoded for their raw checksum only up to this size (the mutator runs for
// every input, so it must stay fast), and only this many bytes are hashed in all.
constexpr uint64_t kMaxRawDecode = 1 << 20;
constexpr uint64_t kMaxHashed = 64ull << 20;

// Where the tables of a (possibly mutated) index are: each table's records inside the index and
// inside the input, or absent.
struct Tables {
  uint8_t* index = nullptr;
  uint64_t index_offset = 0;
  struct Table {
    uint8_t* records = nullptr;
    uint64_t count = 0;
    uint32_t record_bytes = 0;
  } t[format::kTableCount];
};

bool Locate(uint8_t* data, size_t size, Tables* out) {
  if (size < format::kSuperblockBytes + format::kFooterBytes) return false;
  const uint8_t* footer = data + size - format::kFooterBytes;
  uint64_t offset = Load(footer, 8), bytes = Load(footer + 8, 8);
  const uint64_t limit = size - format::kFooterBytes;
  if (offset > limit || bytes > limit - offset || bytes < format::kIndexHeaderBytes) return false;
  out->index = data + offset;
  out->index_offset = offset;
  uint64_t tables = std::min<uint64_t>(Load(out->index + 4, 4), (bytes - format::kIndexHeaderBytes) / format::kTableDescriptorBytes);
  for (uint64_t i = 0; i < std::min<uint64_t>(tables, format::kTableCount); ++i) {
    const uint8_t* d = out->index + format::kIndexHeaderBytes + format::kTableDescriptorBytes * i;
    uint32_t record_bytes = static_cast<uint32_t>(Load(d + 4, 4));
    uint64_t count = Load(d + 8, 8), table_offset = Load(d + 16, 8), table_bytes;
    if (record_bytes < format::kRecordBytes[i] || __builtin_mul_overflow(count, record_bytes, &table_bytes) ||
        table_offset > bytes || table_bytes > bytes - table_offset)
      continue;
    out->t[i] = {out->index + table_offset, count, record_bytes};
  }
  return true;
}

// XXH3 of what a zstd frame decodes to, when it decodes to exactly raw_bytes (bounded) bytes.
bool DecodedChecksum(const uint8_t* frame, uint64_t n, uint64_t raw_bytes, uint64_t* checksum) {
  if (raw_bytes == 0 || raw_bytes > kMaxRawDecode) return false;
  struct DCtx {
    ZSTD_DCtx* ctx = ZSTD_createDCtx();
    ~DCtx() { ZSTD_freeDCtx(ctx); }
  };
  thread_local DCtx dctx;
  thread_local std::vector<uint8_t> raw;
  raw.resize(raw_bytes);
  size_t got = ZSTD_decompressDCtx(dctx.ctx, raw.data(), raw.size(), frame, n);
  if (ZSTD_isError(got) || got != raw_bytes) return false;
  *checksum = format::Checksum(raw.data(), raw_bytes);
  return true;
}

// The fields of each record table (offset, width), so a structured mutation hits a whole value.
struct Field {
  uint8_t offset, width;
};
const std::vector<Field> kFields[format::kTableCount] = {
    {{0, 8}, {8, 8}, {16, 8}, {24, 4}, {28, 4}, {32, 4}, {36, 4}, {40, 2}, {42, 2}},             // storages
    {{0, 8}, {8, 8}, {16, 8}, {24, 8}, {32, 8}, {40, 4}, {44, 1}},                               // chunks
    {{0, 4}, {4, 4}, {8, 4}, {12, 2}, {14, 2}, {16, 8}, {24, 8}, {32, 4}, {40, 4}, {44, 4}},     // tensors
    {{0, 8}},                                                                                    // dims
    {{0, 4}, {4, 4}, {8, 8}, {16, 8}, {24, 8}},                                                  // blobs
    {{0, 4}, {4, 4}, {8, 4}, {12, 4}},                                                           // metadata
    {{0, 1}},                                                                                    // strings
};
const Field kSuperblockFields[] = {{10, 2}, {12, 4}, {16, 8}, {24, 4}, {28, 4}, {32, 8}};

uint64_t BoundaryValue(std::mt19937_64& rng, uint64_t old, uint64_t other, size_t size, uint64_t index_offset) {
  static const uint64_t kValues[] = {0, 1, 2, 3, 4, 7, 8, 64, 4095, 4096, 65536, 1ull << 30, (1ull << 30) + 1,
                                     0x7fffffff, 0x80000000, 0xffffffff, 1ull << 32, 1ull << 61, (1ull << 63) - 1,
                                     1ull << 63, ~0ull, ~0ull - 1};
  switch (rng() % 8) {
    case 0: return old + 1;
    case 1: return old - 1;
    case 2: return old * 2;
    case 3: return old / 2;
    case 4: return other;  // the same field of another record
    case 5: return rng() % 2 ? size : index_offset;
    case 6: return rng();
    default: return kValues[rng() % std::size(kValues)];
  }
}

}  // namespace

void ResealContainer(uint8_t* data, size_t size) {
  if (size < format::kSuperblockBytes + format::kFooterBytes) return;
  Store(data + format::kSuperblockChecksumOffset, format::Checksum(data, format::kSuperblockChecksumOffset), 8);
  uint8_t* footer = data + size - format::kFooterBytes;
  Store(footer + 24, size, 8);
  uint64_t index_offset = Load(footer, 8), index_bytes = Load(footer + 8, 8);
  if (index_offset <= size && index_bytes <= size - index_offset)
    Store(footer + 16, format::Checksum(data + index_offset, index_bytes), 8);
  Store(footer + format::kFooterChecksumOffset, format::Checksum(footer, format::kFooterChecksumOffset), 8);
}

void ResealContainerData(uint8_t* data, size_t size) {
  Tables tables;
  if (!Locate(data, size, &tables)) return ResealContainer(data, size);
  uint64_t hashed = 0;
  const auto& chunks = tables.t[static_cast<int>(format::TableId::kChunks) - 1];
  for (uint64_t i = 0; i < chunks.count && hashed < kMaxHashed; ++i) {
    uint8_t* r = chunks.records + i * chunks.record_bytes;
    uint64_t offset = Load(r, 8), stored = Load(r + 8, 8), raw = Load(r + 16, 8);
    if (offset > size || stored > size - offset) continue;
    hashed += stored;
    uint64_t sum = format::Checksum(data + offset, stored), raw_sum = sum;
    Store(r + 24, sum, 8);
    if (r[44] == static_cast<uint8_t>(format::Codec::kZstd) && !DecodedChecksum(data + offset, stored, raw, &raw_sum))
      continue;  // a frame that does not decode keeps its raw checksum
    Store(r + 32, raw_sum, 8);
  }
  const auto& blobs = tables.t[static_cast<int>(format::TableId::kBlobs) - 1];
  for (uint64_t i = 0; i < blobs.count && hashed < kMaxHashed; ++i) {
    uint8_t* r = blobs.records + i * blobs.record_bytes;
    uint64_t offset = Load(r + 8, 8), bytes = Load(r + 16, 8);
    if (offset > size || bytes > size - offset) continue;
    hashed += bytes;
    Store(r + 24, format::Checksum(data + offset, bytes), 8);
  }
  ResealContainer(data, size);
}

bool MutateContainerField(uint8_t* data, size_t size, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Tables tables;
  if (!Locate(data, size, &tables)) return false;
  if (rng() % 16 == 0) {
    const Field& f = kSuperblockFields[rng() % std::size(kSuperblockFields)];
    uint64_t old = Load(data + f.offset, f.width);
    Store(data + f.offset, BoundaryValue(rng, old, old, size, tables.index_offset), f.width);
    return true;
  }
  uint32_t candidates[format::kTableCount];
  uint32_t n = 0;
  for (uint32_t i = 0; i < format::kTableCount; ++i)
    if (tables.t[i].count > 0) candidates[n++] = i;
  if (n == 0) return false;
  const uint32_t table = candidates[rng() % n];
  const auto& t = tables.t[table];
  uint8_t* record = t.records + (rng() % t.count) * t.record_bytes;
  if (table + 1 == static_cast<uint32_t>(format::TableId::kStrings)) {
    static const uint8_t kBytes[] = {'\0', '\n', '\x1b', '\\', '"', 0x80, 0xC0, 0xED, 0xFF};
    *record = kBytes[rng() % std::size(kBytes)];
    return true;
  }
  const Field& f = kFields[table][rng() % kFields[table].size()];
  uint64_t old = Load(record + f.offset, f.width);
  uint64_t other = Load(t.records + (rng() % t.count) * t.record_bytes + f.offset, f.width);
  Store(record + f.offset, BoundaryValue(rng, old, other, size, tables.index_offset), f.width);
  return true;
}

size_t MutateContainer(uint8_t* data, size_t size, size_t max_size, unsigned seed,
                       size_t (*mutate_bytes)(uint8_t*, size_t, size_t)) {
  const unsigned kind = seed % 16;
  if (kind == 0) return mutate_bytes(data, size, max_size);  // the checksum paths stay fuzzed too
  if (kind < 7 || !MutateContainerField(data, size, seed)) size = mutate_bytes(data, size, max_size);
  if (kind == 15) size = mutate_bytes(data, size, max_size);  // a field and a byte mutation
  ResealContainerData(data, size);
  return size;
}

}  // namespace zckpt::fuzz
