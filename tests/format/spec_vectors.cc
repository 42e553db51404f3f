#include "spec_vectors.h"

#include <cstdio>
#include <cstring>

#include "format_test_util.h"

namespace zckpt::testing {

namespace {

// Just enough JSON for the vectors: objects, arrays, strings, unsigned numbers, one key per line
// at the top level so that diffs of committed vectors stay readable.
class Json {
 public:
  Json& Key(const std::string& k) {
    Str(k);
    out_ += ": ";
    after_key_ = true;
    return *this;
  }
  Json& Open(char c) {
    Item();
    out_ += c;
    has_items_.push_back(false);
    return *this;
  }
  Json& Close(char c) {
    has_items_.pop_back();
    if (has_items_.empty()) out_ += '\n';
    out_ += c;
    return *this;
  }
  Json& Str(const std::string& s) {
    Item();
    out_ += '"';
    for (unsigned char ch : s) {
      if (ch == '"' || ch == '\\') {
        out_ += '\\';
        out_ += static_cast<char>(ch);
      } else if (ch < 0x20 || ch >= 0x7F) {
        char buf[8];
        std::snprintf(buf, sizeof buf, "\\u%04x", ch);
        out_ += buf;
      } else {
        out_ += static_cast<char>(ch);
      }
    }
    out_ += '"';
    return *this;
  }
  Json& Num(uint64_t v) {
    Item();
    out_ += std::to_string(v);
    return *this;
  }
  Json& Int(int64_t v) {
    Item();
    out_ += std::to_string(v);
    return *this;
  }
  Json& Hex64(uint64_t v) {
    char buf[24];
    std::snprintf(buf, sizeof buf, "0x%016llx", static_cast<unsigned long long>(v));
    return Str(buf);
  }
  std::string str() const { return out_ + "\n"; }

 private:
  // Separator before a key or a value that does not follow a key.
  void Item() {
    if (after_key_) {
      after_key_ = false;
      return;
    }
    if (has_items_.empty()) return;
    bool top = has_items_.size() == 1;
    if (has_items_.back()) out_ += top ? ",\n  " : ", ";
    else if (top) out_ += "\n  ";
    has_items_.back() = true;
  }
  std::string out_;
  std::vector<bool> has_items_;  // one per open object/array
  bool after_key_ = false;
};

std::string Hex(const uint8_t* p, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    s += digits[p[i] >> 4];
    s += digits[p[i] & 15];
  }
  return s;
}

// The tensor's elements in row-major logical order.
std::vector<uint8_t> TensorValues(const Container& c, const TensorInfo& t) {
  std::vector<uint8_t> storage = ReadStorage(c, t.storage), out;
  uint64_t item = DTypeSize(t.dtype), numel = 1;
  for (int64_t d : t.shape) numel *= static_cast<uint64_t>(d);
  std::vector<int64_t> idx(t.shape.size(), 0);
  for (uint64_t n = 0; n < numel; ++n) {
    uint64_t e = t.storage_offset;
    for (size_t d = 0; d < idx.size(); ++d) e += static_cast<uint64_t>(idx[d] * t.stride[d]);
    out.insert(out.end(), storage.begin() + static_cast<long>(e * item), storage.begin() + static_cast<long>((e + 1) * item));
    for (size_t d = idx.size(); d-- > 0;) {
      if (++idx[d] < t.shape[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

// Bytes shown in full up to this size, by XXH3 beyond.
constexpr size_t kMaxHexBytes = 256;

void BytesField(Json& j, const std::string& key, const std::vector<uint8_t>& v) {
  if (v.size() <= kMaxHexBytes)
    j.Key(key + "_hex").Str(Hex(v.data(), v.size()));
  else
    j.Key(key + "_xxh3").Hex64(format::Checksum(v.data(), v.size()));
}

std::string RefusalJson(const std::string& stage, ErrorKind kind, const std::string& reason, const std::string& why) {
  Json j;
  j.Open('{');
  j.Key("refused").Open('{').Key("stage").Str(stage).Key("kind").Str(ErrorKindName(kind)).Key("reason").Str(reason);
  j.Close('}');
  j.Key("damage").Str(why);
  j.Close('}');
  return j.str();
}

}  // namespace

std::string DescribeContainerJson(const Container& c) {
  Json j;
  j.Open('{');
  j.Key("file_bytes").Num(c.file_bytes());
  const auto& sb = c.superblock();
  j.Key("superblock").Open('{').Key("major").Num(sb.major).Key("minor").Num(sb.minor).Key("flags").Num(sb.flags);
  j.Key("chunk_bytes").Num(sb.chunk_bytes).Key("large_alignment").Num(sb.large_alignment);
  j.Key("small_alignment").Num(sb.small_alignment).Key("large_threshold").Num(sb.large_threshold).Close('}');
  const auto& f = c.footer();
  j.Key("footer").Open('{').Key("index_offset").Num(f.index_offset).Key("index_bytes").Num(f.index_bytes);
  j.Key("index_checksum").Hex64(f.index_checksum).Key("file_bytes").Num(f.file_bytes).Close('}');
  j.Key("storages").Open('[');
  for (uint32_t s = 0; s < c.storage_count(); ++s) {
    StorageInfo info = c.storage(s);
    j.Open('{').Key("key").Str(std::string(info.key)).Key("location").Str(std::string(info.location));
    j.Key("dtype").Str(std::string(DTypeName(info.dtype))).Key("flags").Num(info.flags);
    j.Key("raw_bytes").Num(info.raw_bytes).Key("first_chunk").Num(info.first_chunk).Key("chunk_count").Num(info.chunk_count);
    BytesField(j, "raw", ReadStorage(c, s));
    j.Close('}');
  }
  j.Close(']');
  j.Key("chunks").Open('[');
  for (uint64_t i = 0; i < c.chunk_count(); ++i) {
    format::ChunkRecord ch = c.chunk(i);
    j.Open('{').Key("offset").Num(ch.offset).Key("stored_bytes").Num(ch.stored_bytes).Key("raw_bytes").Num(ch.raw_bytes);
    j.Key("stored_checksum").Hex64(ch.stored_checksum).Key("raw_checksum").Hex64(ch.raw_checksum);
    j.Key("storage").Num(ch.storage).Key("codec").Str(ch.codec == 0 ? "none" : "zstd").Close('}');
  }
  j.Close(']');
  j.Key("tensors").Open('[');
  for (uint32_t t = 0; t < c.tensor_count(); ++t) {
    TensorInfo info = c.tensor(t);
    j.Open('{').Key("name").Str(std::string(info.name)).Key("storage").Num(info.storage);
    j.Key("dtype").Str(std::string(DTypeName(info.dtype))).Key("shape").Open('[');
    for (int64_t d : info.shape) j.Int(d);
    j.Close(']').Key("stride").Open('[');
    for (int64_t d : info.stride) j.Int(d);
    j.Close(']').Key("storage_offset").Num(info.storage_offset).Key("flags").Num(info.flags);
    j.Key("extra").Str(std::string(info.extra));
    BytesField(j, "values", TensorValues(c, info));
    j.Close('}');
  }
  j.Close(']');
  j.Key("blobs").Open('[');
  for (uint32_t b = 0; b < c.blob_count(); ++b) {
    BlobInfo info = c.blob(b);
    auto bytes = c.CheckedBlobBytes(info);
    j.Open('{').Key("name").Str(std::string(info.name)).Key("offset").Num(info.offset).Key("bytes").Num(info.bytes);
    j.Key("checksum").Hex64(info.checksum);
    BytesField(j, "data", bytes);
    j.Close('}');
  }
  j.Close(']');
  j.Key("metadata").Open('[');
  for (uint32_t m = 0; m < c.metadata_count(); ++m) {
    auto [k, v] = c.metadata(m);
    j.Open('[').Str(std::string(k)).Str(std::string(v)).Close(']');
  }
  j.Close(']');
  j.Close('}');
  return j.str();
}

std::vector<SpecVector> MakeSpecVectors() {
  WriterOptions o;
  o.chunk_bytes = 4096;
  o.threads = 1;
  auto good = [&](const std::string& name, const std::function<void(ContainerWriter&)>& fill, int zstd = 0) {
    WriterOptions opt = o;
    opt.zstd_level = zstd;
    SpecVector v{name, BuildContainer(fill, opt), "", zstd > 0};
    auto c = Container::OpenMemory(v.bytes.data(), v.bytes.size(), name + ".zckpt");
    v.json = DescribeContainerJson(*c);
    return v;
  };
  const float values[6] = {1.0f, -2.0f, 0.5f, 3.25f, 100.0f, -0.125f};
  std::vector<uint8_t> f32(24);
  std::memcpy(f32.data(), values, sizeof values);  // little-endian hosts only, like the format
  auto f32_2x3 = [&](ContainerWriter& w) {
    w.AddStorage({"0", "cpu", DType::kFloat32}, f32);
    w.AddTensor(Tensor("weight", 0, DType::kFloat32, {2, 3}, {3, 1}));
  };

  std::vector<SpecVector> out;
  out.push_back(good("empty", [](ContainerWriter&) {}));
  out.push_back(good("f32-2x3", f32_2x3));
  out.push_back(good(
      "zstd",
      [](ContainerWriter& w) {
        std::vector<uint8_t> counts(4096 + 8);
        for (size_t i = 0; i < counts.size() / 4; ++i) counts[4 * i] = static_cast<uint8_t>(i % 16);
        w.AddStorage({"0", "cpu", DType::kInt32}, counts);
        w.AddTensor(Tensor("counts", 0, DType::kInt32, {1026}, {1}));
      },
      3));
  out.push_back(good("view", [&](ContainerWriter& w) {
    w.AddStorage({"0", "cpu", DType::kFloat32}, f32);
    w.AddTensor(Tensor("a", 0, DType::kFloat32, {2, 3}, {3, 1}, 0, format::kTensorParameter));
    w.AddTensor(Tensor("a.T", 0, DType::kFloat32, {3, 2}, {1, 3}));
    w.AddTensor(Tensor("row1", 0, DType::kFloat32, {3}, {1}, 3));
    w.AddTensor(Tensor("last", 0, DType::kFloat32, {}, {}, 5));
    w.AddBlob("data.pkl", std::vector<uint8_t>{0x80, 0x02, 0x7d, 0x71, 0x00, 0x2e});  // pickle of {}
    w.SetMetadata("zckpt.source.format", "zip");
  }));
  // Format 1.1: a bcomplex32 view of untyped bytes, as torch 2.15 saves one. The pairs are
  // bfloat16 (real, imag): 1+2j, -0.5+0j.
  out.push_back(good("bcomplex32", [](ContainerWriter& w) {
    w.AddStorage({"0", "cpu", DType::kUInt8, true}, std::vector<uint8_t>{0x80, 0x3f, 0x00, 0x40, 0x00, 0xbf, 0x00, 0x00});
    w.AddTensor(Tensor("z", 0, DType::kBComplex32, {2}, {1}));
  }));

  std::vector<uint8_t> base = BuildContainer(f32_2x3, o);
  {
    Forger f(base);
    f.bytes()[64 + 13] ^= 0x01;  // a bit of the second float
    out.push_back({"bad-chunk-checksum", f.bytes(),
                   RefusalJson("verify", ErrorKind::kCorrupt, "chunk 0, file bytes [64, 88), storage bytes [0, 24): stored checksum mismatch",
                               "bit 0 of byte 77 (in the only chunk) flipped"),
                   false});
  }
  {
    Forger f(base);
    f.Set64(f.record(format::TableId::kTensors, 0) + 16, 1);  // storage_offset 1
    out.push_back({"bad-tensor-extent", f.Reseal(),
                   RefusalJson("open", ErrorKind::kCorrupt, "tensor record 0: extent [4, 28) is past the end of storage 0 (24 bytes)",
                               "tensor 0's storage_offset set to 1, checksums recomputed"),
                   false});
  }
  {
    Forger f(base);
    f.Set16(f.superblock() + 8, 2);
    f.Set16(f.footer() + 32, 2);
    out.push_back({"bad-major", f.Reseal(),
                   RefusalJson("open", ErrorKind::kUnsupported, "format version 2.0",
                               "major version 2 in superblock and footer, checksums recomputed"),
                   false});
  }
  return out;
}

}  // namespace zckpt::testing
