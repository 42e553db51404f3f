// `zckpt ls FILE [--json]`: what a container holds.
#include <cstdio>
#include <memory>
#include <string>

#include "cli.h"
#include "commands.h"
#include "json_writer.h"
#include "printable.h"
#include "progress.h"
#include "zckpt/container.h"
#include "zckpt/inspect.h"

namespace zckpt::cli {

namespace {

constexpr const char* kHelp =
    "usage: zckpt ls [--json] [--storages] FILE\n\n"
    "Lists the container's format version, tensors (name, dtype, shape, bytes), storages,\n"
    "chunk and compression statistics, blobs and metadata, and what the kept object pickle holds\n"
    "besides tensors: other objects (never run), numpy values, and the globals off zckpt's\n"
    "allowlist that convert, export and load refuse unless given --allow-global. Reads the index\n"
    "and the pickle only (no data).\n"
    "--storages also lists every storage. Exit codes as for verify.\n\n"
    "Names, keys and values are the file's bytes, shown so that none can forge a line or drive\n"
    "the terminal: text output escapes newlines and tabs (\\n \\t), other control characters and\n"
    "bytes that are not UTF-8 (\\xNN), C1 and bidirectional controls (\\uXXXX), and a backslash\n"
    "(\\\\). --json output is valid JSON whatever the bytes: a byte that is not UTF-8 is written as\n"
    "the escape \\udcXX (U+DC00 + the byte, Python's \"surrogateescape\": in Python,\n"
    "s.encode('utf-8', 'surrogateescape') gives the bytes back).\n";

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

uint64_t TensorBytes(const TensorInfo& t) {
  uint64_t n = DTypeSize(t.dtype);
  for (int64_t d : t.shape) n *= static_cast<uint64_t>(d);
  return n;
}

struct Stats {
  uint64_t raw = 0, stored = 0, chunks = 0, zstd_chunks = 0;
};

Stats ChunkStats(const Container& c) {
  Stats s;
  for (uint64_t i = 0; i < c.chunk_count(); ++i) {
    auto ch = c.chunk(i);
    s.raw += ch.raw_bytes;
    s.stored += ch.stored_bytes;
    s.chunks++;
    if (ch.codec == static_cast<uint8_t>(format::Codec::kZstd)) s.zstd_chunks++;
  }
  return s;
}

std::string FlagsString(uint32_t f) {
  std::string s;
  auto add = [&](uint32_t bit, const char* name) {
    if (f & bit) s += (s.empty() ? "" : ",") + std::string(name);
  };
  add(format::kTensorParameter, "param");
  add(format::kTensorRequiresGrad, "grad");
  add(format::kTensorConj, "conj");
  add(format::kTensorNeg, "neg");
  add(format::kTensorDTensorLocal, "dtensor");
  add(format::kTensorShardedLocal, "sharded");
  add(format::kTensorQuantized, "quantized");
  return s;
}

void PrintJson(const Container& c, const Stats& st, const PickleSummary& ps) {
  JsonWriter j;
  j.BeginObject();
  j.Key("file").String(c.path()).Key("bytes").UInt(c.file_bytes());
  j.Key("version").String(std::to_string(c.superblock().major) + "." + std::to_string(c.superblock().minor));
  j.Key("chunk_bytes").UInt(c.superblock().chunk_bytes);
  j.Key("large_alignment").UInt(c.superblock().large_alignment);
  j.Key("small_alignment").UInt(c.superblock().small_alignment);
  j.Key("large_threshold").UInt(c.superblock().large_threshold);
  j.Key("chunks").BeginObject().Key("count").UInt(st.chunks).Key("zstd").UInt(st.zstd_chunks)
      .Key("raw_bytes").UInt(st.raw).Key("stored_bytes").UInt(st.stored).EndObject();
  j.Key("tensors").BeginArray();
  for (uint32_t i = 0; i < c.tensor_count(); ++i) {
    TensorInfo t = c.tensor(i);
    j.BeginObject().Key("name").String(t.name).Key("dtype").String(DTypeName(t.dtype));
    j.Key("shape").BeginArray();
    for (int64_t d : t.shape) j.Int(d);
    j.EndArray().Key("stride").BeginArray();
    for (int64_t d : t.stride) j.Int(d);
    j.EndArray().Key("storage").UInt(t.storage).Key("storage_offset").UInt(t.storage_offset);
    j.Key("bytes").UInt(TensorBytes(t)).Key("flags").String(FlagsString(t.flags));
    // `extra` is JSON when zckpt wrote it; a forged file may hold anything there, which then
    // goes out as a string, never spliced into the document.
    if (!t.extra.empty()) {
      if (IsJson(t.extra)) j.Key("extra").Raw(t.extra);
      else j.Key("extra").String(t.extra);
    }
    j.EndObject();
  }
  j.EndArray().Key("storages").BeginArray();
  for (uint32_t i = 0; i < c.storage_count(); ++i) {
    StorageInfo s = c.storage(i);
    j.BeginObject().Key("key").String(s.key).Key("location").String(s.location).Key("dtype").String(DTypeName(s.dtype));
    j.Key("bytes").UInt(s.raw_bytes).Key("chunks").UInt(s.chunk_count).Key("offset").UInt(s.data_offset)
        .Key("contiguous").Bool(s.contiguous).EndObject();
  }
  j.EndArray().Key("blobs").BeginArray();
  for (uint32_t i = 0; i < c.blob_count(); ++i) {
    BlobInfo b = c.blob(i);
    j.BeginObject().Key("name").String(b.name).Key("bytes").UInt(b.bytes).Key("offset").UInt(b.offset).EndObject();
  }
  j.EndArray();
  if (ps.present) {
    j.Key("pickle").BeginObject();
    if (!ps.error.empty()) j.Key("error").String(ps.error);
    j.Key("opaque_globals").BeginArray();
    for (const auto& g : ps.opaque_globals) j.BeginObject().Key("name").String(g.name).Key("count").UInt(g.count).EndObject();
    j.EndArray().Key("numpy").BeginArray();
    for (const auto& v : ps.numpy) {
      j.BeginObject().Key("path").String(v.path).Key("dtype").String(v.dtype).Key("scalar").Bool(v.scalar).Key("shape").BeginArray();
      for (int64_t d : v.shape) j.Int(d);
      j.EndArray().EndObject();
    }
    j.EndArray().Key("off_allowlist").BeginArray();
    for (const auto& g : ps.off_allowlist) j.String(g);
    j.EndArray().EndObject();
  }
  j.Key("metadata").BeginObject();
  for (uint32_t i = 0; i < c.metadata_count(); ++i) {
    auto [k, v] = c.metadata(i);
    j.Key(k).String(v);
  }
  j.EndObject().EndObject();
  std::printf("%s\n", j.str().c_str());
}

// A name for a fixed-width column: escaped (Printable), then padded to `width` columns.
std::string Column(std::string_view s, size_t width) {
  std::string out = Printable(s);
  if (out.size() < width) out.append(width - out.size(), ' ');
  return out;
}

// A metadata value for one line: NUL-separated lists (zckpt.source.records) joined by ", ",
// every part escaped.
std::string MetadataValue(std::string_view v) {
  std::string out;
  size_t start = 0;
  while (start < v.size()) {
    size_t nul = v.find('\0', start);
    size_t end = nul == std::string_view::npos ? v.size() : nul;
    out += (out.empty() ? "" : ", ") + Printable(v.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

void PrintText(const Container& c, const Stats& st, bool storages, const PickleSummary& ps) {
  const auto& sb = c.superblock();
  std::printf("%s: zckpt %u.%u, %s, chunk %s, alignment %u B (>= %s: %u B)\n", Printable(c.path()).c_str(), sb.major, sb.minor,
              FormatBytes(c.file_bytes()).c_str(), FormatBytes(sb.chunk_bytes).c_str(), sb.small_alignment,
              FormatBytes(sb.large_threshold).c_str(), sb.large_alignment);
  double ratio = st.stored ? static_cast<double>(st.raw) / static_cast<double>(st.stored) : 1.0;
  std::printf("%u tensors, %u storages (%s), %llu chunks (%llu zstd, ratio %.3f), %u blobs\n", c.tensor_count(),
              c.storage_count(), FormatBytes(st.raw).c_str(), static_cast<unsigned long long>(st.chunks),
              static_cast<unsigned long long>(st.zstd_chunks), ratio, c.blob_count());
  std::printf("\n%-48s %-16s %-20s %12s  %s\n", "TENSOR", "DTYPE", "SHAPE", "BYTES", "FLAGS");
  for (uint32_t i = 0; i < c.tensor_count(); ++i) {
    TensorInfo t = c.tensor(i);
    std::printf("%s %-16s %-20s %12llu  %s\n", Column(t.name, 48).c_str(),
                std::string(DTypeName(t.dtype)).c_str(), ShapeString(t.shape).c_str(),
                static_cast<unsigned long long>(TensorBytes(t)), FlagsString(t.flags).c_str());
  }
  if (storages) {
    std::printf("\n%-12s %-10s %-10s %14s %8s %14s\n", "STORAGE", "LOCATION", "DTYPE", "BYTES", "CHUNKS", "OFFSET");
    for (uint32_t i = 0; i < c.storage_count(); ++i) {
      StorageInfo s = c.storage(i);
      std::printf("%s %s %-10s %14llu %8llu %14llu\n", Column(s.key, 12).c_str(), Column(s.location, 10).c_str(),
                  std::string(DTypeName(s.dtype)).c_str(),
                  static_cast<unsigned long long>(s.raw_bytes), static_cast<unsigned long long>(s.chunk_count),
                  static_cast<unsigned long long>(s.data_offset));
    }
  }
  if (c.blob_count()) {
    std::printf("\nBLOBS\n");
    for (uint32_t i = 0; i < c.blob_count(); ++i) {
      BlobInfo b = c.blob(i);
      std::printf("  %s %llu B\n", Column(b.name, 40).c_str(), static_cast<unsigned long long>(b.bytes));
    }
  }
  if (!ps.error.empty())
    std::printf("\nOBJECT PICKLE: not readable by zckpt's interpreter: %s\n", Printable(ps.error).c_str());
  if (!ps.opaque_globals.empty() || !ps.numpy.empty()) {
    std::printf("\nOTHER OBJECTS (kept in the pickle, never executed)\n");
    for (const auto& g : ps.opaque_globals)
      std::printf("  %s x%llu\n", Column(g.name, 48).c_str(), static_cast<unsigned long long>(g.count));
    for (const auto& v : ps.numpy)
      std::printf("  %s numpy %s %s\n", Column(v.path, 48).c_str(), v.scalar ? "scalar" : "array",
                  Printable(v.dtype + (v.scalar ? "" : " " + ShapeString(v.shape))).c_str());
  }
  if (!ps.off_allowlist.empty()) {
    std::printf("\nGLOBALS OFF THE ALLOWLIST (convert, export and load need --allow-global for each)\n");
    for (const auto& g : ps.off_allowlist) std::printf("  %s\n", Printable(g).c_str());
  }
  if (c.metadata_count()) {
    std::printf("\nMETADATA\n");
    for (uint32_t i = 0; i < c.metadata_count(); ++i) {
      auto [k, v] = c.metadata(i);
      std::printf("  %s = %s\n", Printable(k).c_str(), MetadataValue(v).c_str());  // one line per entry
    }
  }
}

}  // namespace

int RunLs(const Argv& argv) {
  Args args(argv, {"help", "json", "storages"}, {}, {{"h", "help"}});
  if (!args.ok()) return UsageError("ls", args.error());
  if (args.Has("help")) {
    std::fputs(kHelp, stdout);
    return kExitOk;
  }
  if (args.positional().size() != 1) return UsageError("ls", "expected exactly one FILE");
  const std::string& path = args.positional()[0];
  std::unique_ptr<Container> c;
  try {
    c = Container::Open(path);
  } catch (const Error& caught) {
    Error e = WithNotAContainerHint(caught, path);  // `zckpt ls x.pt`: convert it first
    if (!args.Has("json")) throw e;
    return PrintJsonError("ls", path, e);  // the shape load and verify print
  }
  Stats st = ChunkStats(*c);
  PickleSummary ps = SummarizeObjectPickle(*c);
  if (args.Has("json")) PrintJson(*c, st, ps);
  else PrintText(*c, st, args.Has("storages"), ps);
  return kExitOk;
}

}  // namespace zckpt::cli
