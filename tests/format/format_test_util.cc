#include "format_test_util.h"

#include <cstring>

#include "test_util.h"

namespace zckpt::testing {

namespace {

void Store(uint8_t* p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint64_t Load(const uint8_t* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

}  // namespace

std::vector<uint8_t> BuildContainer(const std::function<void(ContainerWriter&)>& fill, const WriterOptions& options) {
  TempDir dir;
  std::string path = dir.File("c.zckpt");
  {
    ContainerWriter w(path, options);
    fill(w);
    w.Commit();
  }
  return ReadFileBytes(path);
}

NewTensor Tensor(std::string name, uint32_t storage, DType dtype, std::vector<int64_t> shape,
                 std::vector<int64_t> stride, uint64_t storage_offset, uint32_t flags, std::string extra) {
  NewTensor t;
  t.name = std::move(name);
  t.storage = storage;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.stride = std::move(stride);
  t.storage_offset = storage_offset;
  t.flags = flags;
  t.extra = std::move(extra);
  return t;
}

std::vector<uint8_t> RandomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

std::vector<uint8_t> PatternBytes(size_t n, uint64_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>((i / 16 + seed) % 7);
  return v;
}

std::vector<uint8_t> SmallContainer() {
  WriterOptions o;
  o.chunk_bytes = 4096;
  o.zstd_level = 3;
  o.threads = 1;
  return BuildContainer(
      [](ContainerWriter& w) {
        w.AddStorage({"0", "cpu", DType::kFloat32}, PatternBytes(4096));  // one zstd chunk
        w.AddStorage({"1", "cuda:0", DType::kUInt8}, RandomBytes(200, 1));  // raw, then padding
        w.AddStorage({"2", "cpu", DType::kFloat32}, {});                  // no chunks
        w.AddStorage({"3", "cpu", DType::kInt64, false}, PatternBytes(24));
        w.AddTensor(Tensor("w", 0, DType::kFloat32, {32, 32}, {32, 1}));
        w.AddTensor(Tensor("w.T", 0, DType::kFloat32, {32, 32}, {1, 32}, 0, format::kTensorParameter));
        w.AddTensor(Tensor("bytes", 1, DType::kUInt8, {10, 20}, {20, 1}));
        w.AddTensor(Tensor("odd", 1, DType::kUInt8, {5}, {2}, 3, 0, "{\"k\":1}"));
        w.AddTensor(Tensor("empty", 2, DType::kFloat32, {0, 4}, {4, 1}));
        w.AddTensor(Tensor("scalar", 3, DType::kInt64, {}, {}, 2));
        std::vector<uint8_t> pickle(37, 0x80);
        w.AddBlob("data.pkl", pickle);
        w.AddBlob("empty", {});
        w.SetMetadata("zckpt.source.format", "zip");
        w.SetMetadata("note", "");
      },
      o);
}

uint64_t Forger::index_offset() const { return Load(bytes_.data() + bytes_.size() - format::kFooterBytes, 8); }
uint8_t* Forger::index() { return bytes_.data() + index_offset(); }
uint8_t* Forger::descriptor(uint32_t i) {
  return index() + format::kIndexHeaderBytes + format::kTableDescriptorBytes * i;
}

uint8_t* Forger::record(format::TableId table, uint64_t i) {
  format::TableDescriptor d = Descriptor(static_cast<uint32_t>(table) - 1);
  return index() + d.offset + i * d.record_bytes;
}

void Forger::Set16(uint8_t* p, uint16_t v) { Store(p, v, 2); }
void Forger::Set32(uint8_t* p, uint32_t v) { Store(p, v, 4); }
void Forger::Set64(uint8_t* p, uint64_t v) { Store(p, v, 8); }

std::vector<uint8_t>& Forger::Reseal() {
  Set64(superblock() + format::kSuperblockChecksumOffset,
        format::Checksum(superblock(), format::kSuperblockChecksumOffset));
  uint64_t index_bytes = Load(footer() + 8, 8);
  if (index_offset() <= bytes_.size() && index_bytes <= bytes_.size() - index_offset())
    Set64(footer() + 16, format::Checksum(index(), index_bytes));
  Set64(footer() + format::kFooterChecksumOffset, format::Checksum(footer(), format::kFooterChecksumOffset));
  return bytes_;
}

std::vector<uint8_t> ReadStorage(const Container& c, uint32_t s) {
  StorageInfo info = c.storage(s);
  std::vector<uint8_t> out(info.raw_bytes);
  uint64_t at = 0;
  for (uint64_t k = 0; k < info.chunk_count; ++k) {
    c.ReadChunk(info.first_chunk + k, out.data() + at);
    at += c.chunk(info.first_chunk + k).raw_bytes;
  }
  return out;
}

OpenResult OpenAndVerify(const std::vector<uint8_t>& bytes, unsigned threads) {
  OpenResult r;
  try {
    auto c = Container::OpenMemory(bytes.data(), bytes.size(), "mem.zckpt");
    r.opened = true;
    VerifyOptions o;
    o.threads = threads;
    r.report = c->Verify(o);
  } catch (const Error& e) {
    r.kind = e.kind();
    r.message = e.what();
  }
  return r;
}

}  // namespace zckpt::testing
