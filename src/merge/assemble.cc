#include "merge/assemble.h"

#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "common/shape.h"
#include "checkpoint/storage_stream.h"
#include "zckpt/container.h"
#include "zckpt/error.h"

namespace zckpt::merge {

std::string Dims(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

namespace {

std::string Box(const Piece& p) { return p.view.what + " at " + Dims(p.offsets) + " size " + Dims(p.view.shape); }

uint64_t Numel(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t s : shape)
    if (s < 0 || __builtin_mul_overflow(n, static_cast<uint64_t>(s), &n))
      throw Error(ErrorKind::kCorrupt, "shape " + Dims(shape) + " is negative or too large");
  return n;
}

bool Overlap(const Piece& a, const Piece& b) {
  for (size_t d = 0; d < a.offsets.size(); ++d) {
    if (a.offsets[d] + a.view.shape[d] <= b.offsets[d] || b.offsets[d] + b.view.shape[d] <= a.offsets[d]) return false;
  }
  return true;
}

bool Contiguous(const SavedView& v) {
  int64_t expected = 1;
  for (size_t i = v.shape.size(); i-- > 0;) {
    if (v.shape[i] != 1 && v.stride[i] != expected) return false;
    expected *= v.shape[i];
  }
  return true;
}

// Where the elements of a contiguous box land in the row-major full tensor: `count` runs of
// `run` elements each, run r starting at element Start(r).
class Runs {
 public:
  Runs(const std::vector<int64_t>& full, const std::vector<int64_t>& offsets, const std::vector<int64_t>& sizes)
      : offsets_(offsets), sizes_(sizes), gstride_(ContiguousStrides(full)) {
    size_t n = full.size();
    k_ = n;  // dims [k_, n) of the box span the whole tensor
    while (k_ > 0 && sizes[k_ - 1] == full[k_ - 1] && offsets[k_ - 1] == 0) --k_;
    run_ = 1;
    for (size_t d = k_; d < n; ++d) run_ *= full[d];
    if (k_ > 0) run_ *= sizes[k_ - 1];  // a run also spans the box along the last partial dim
  }
  uint64_t run() const { return static_cast<uint64_t>(run_); }
  int64_t Start(uint64_t r) const {
    if (k_ == 0) return 0;
    int64_t start = offsets_[k_ - 1] * gstride_[k_ - 1];
    for (size_t d = k_ - 1; d-- > 0;) {
      int64_t i = static_cast<int64_t>(r % static_cast<uint64_t>(sizes_[d]));
      r /= static_cast<uint64_t>(sizes_[d]);
      start += (offsets_[d] + i) * gstride_[d];
    }
    return start;
  }

 private:
  std::vector<int64_t> offsets_, sizes_, gstride_;
  size_t k_ = 0;
  int64_t run_ = 1;
};

}  // namespace

uint64_t FullTensor::bytes() const { return Numel(shape) * DTypeSize(dtype); }

bool SelectName(const std::string& keys, std::string* name) {
  if (keys.empty()) return true;
  if (name->size() <= keys.size() || name->compare(0, keys.size(), keys) != 0) return false;
  name->erase(0, keys.size());
  return true;
}

void Tile(FullTensor& t) {
  const std::vector<int64_t>& shape = t.tiled();
  const std::string what = "tensor '" + t.name + "' " + Dims(t.shape);
  uint64_t total = Numel(shape);
  if (total != Numel(t.shape)) throw Error(ErrorKind::kCorrupt, what + ": tiled as " + Dims(shape) + ", another size");
  (void)t.bytes();
  std::vector<Piece> kept;
  for (Piece& p : t.pieces) {
    if (p.view.dtype != t.dtype)
      throw Error(ErrorKind::kCorrupt, what + ": " + p.view.what + " holds " + std::string(DTypeName(p.view.dtype)) +
                                           ", another piece " + std::string(DTypeName(t.dtype)));
    if (p.offsets.size() != shape.size() || p.view.shape.size() != shape.size())
      throw Error(ErrorKind::kCorrupt, what + ": " + Box(p) + " has another number of dimensions");
    for (size_t d = 0; d < shape.size(); ++d)
      if (p.offsets[d] < 0 || p.view.shape[d] < 0 || p.offsets[d] > shape[d] || p.view.shape[d] > shape[d] - p.offsets[d])
        throw Error(ErrorKind::kCorrupt, what + ": " + Box(p) + " lies outside the tensor");
    if (Numel(p.view.shape) == 0) continue;
    // Identical boxes are replicas: kept once, the others compared with it when read.
    auto same = std::find_if(kept.begin(), kept.end(),
                             [&](const Piece& k) { return k.offsets == p.offsets && k.view.shape == p.view.shape; });
    if (same != kept.end()) same->replicas.push_back(std::move(p.view));
    else kept.push_back(std::move(p));
  }
  std::sort(kept.begin(), kept.end(), [](const Piece& a, const Piece& b) { return a.offsets < b.offsets; });
  uint64_t covered = 0;
  for (size_t i = 0; i < kept.size(); ++i) {
    covered += Numel(kept[i].view.shape);
    // Sorted by offsets: only pieces starting before this one ends along dim 0 can overlap it.
    for (size_t j = i + 1; j < kept.size(); ++j) {
      if (!shape.empty() && kept[j].offsets[0] >= kept[i].offsets[0] + kept[i].view.shape[0]) break;
      if (Overlap(kept[i], kept[j]))
        throw Error(ErrorKind::kCorrupt, what + ": " + Box(kept[i]) + " overlaps " + Box(kept[j]) +
                                             ": pieces that neither tile the tensor nor are replicas of one box");
    }
  }
  if (covered != total)
    throw Error(ErrorKind::kCorrupt, what + ": its " + std::to_string(kept.size()) + " pieces cover " +
                                         std::to_string(covered) + " of its " + std::to_string(total) +
                                         " elements (missing ranks or shards?)");
  t.pieces = std::move(kept);
}

void Assembler::Stream(const SavedView& v, uint64_t begin, uint64_t end, uint8_t* dst_base,
                       const std::vector<int64_t>& full_shape, const std::vector<int64_t>& offsets) {
  const uint64_t item = DTypeSize(v.dtype);
  Runs runs(full_shape, offsets, v.shape);
  const uint64_t run_bytes = runs.run() * item;
  auto sink = [&](uint64_t at, std::span<const uint8_t> piece) {
    uint64_t rel = at - begin;
    const uint8_t* src = piece.data();
    uint64_t left = piece.size();
    while (left > 0) {
      uint64_t r = rel / run_bytes, within = rel % run_bytes;
      uint64_t n = std::min(left, run_bytes - within);
      std::memcpy(dst_base + static_cast<uint64_t>(runs.Start(r)) * item + within, src, n);
      src += n;
      rel += n;
      left -= n;
    }
  };
  if (v.container) {
    if (end > v.container->storage(v.storage).raw_bytes)
      throw Error(ErrorKind::kCorrupt, v.what + ": its bytes end past its storage");
    uint64_t at = begin;  // the stream's pieces are consecutive
    checkpoint::StreamStorageRange(*v.container, v.storage, begin, end, [&](std::span<const uint8_t> piece) {
      sink(at, piece);
      at += piece.size();
    });
    return;
  }
  if (end > v.bytes_size) throw Error(ErrorKind::kCorrupt, v.what + ": its bytes end past its storage");
  // A file's bytes are read with pread into a buffer of ours (MappedFile::ReadView): a file that
  // shrinks is Error(kIo) naming it, never SIGBUS, and mapped pages never count in RSS. When the
  // CRC-32 is checked over the same pass that copies (the view is its whole storage), the bytes
  // copied are the bytes checked; otherwise the CRC pass reads the storage once before.
  constexpr uint64_t kStep = 16ull << 20;
  std::vector<uint8_t> buffer;
  auto read = [&](uint64_t off, uint64_t n) -> const uint8_t* {
    if (!v.file) return v.bytes + off;  // memory of the caller's (tests)
    buffer.resize(std::max<uint64_t>(buffer.size(), n));
    v.file->ReadView({v.bytes + off, n}, buffer.data());
    return buffer.data();
  };
  const bool check_crc = v.crc32 != 0 && crc_checked_.insert(v.bytes).second;
  const bool one_pass = begin == 0 && end == v.bytes_size;
  uLong crc = crc32(0L, Z_NULL, 0);
  auto crc_failed = [&] { return static_cast<uint32_t>(crc) != v.crc32; };
  if (check_crc && !one_pass) {
    for (uint64_t off = 0; off < v.bytes_size; off += kStep) {
      uint64_t n = std::min(kStep, v.bytes_size - off);
      crc = crc32(crc, read(off, n), static_cast<uInt>(n));
    }
    if (crc_failed()) throw Error(ErrorKind::kCorrupt, v.what + ": its storage's bytes fail their zip CRC-32");
  }
  for (uint64_t off = begin; off < end; off += kStep) {
    uint64_t n = std::min(kStep, end - off);
    const uint8_t* bytes = read(off, n);
    if (check_crc && one_pass) crc = crc32(crc, bytes, static_cast<uInt>(n));
    sink(off, std::span<const uint8_t>(bytes, n));
  }
  // Nothing assembled is written before Assemble returns: a failure here discards the copy.
  if (check_crc && one_pass && crc_failed())
    throw Error(ErrorKind::kCorrupt, v.what + ": its storage's bytes fail their zip CRC-32");
}

// A piece saved more than once: every copy read whole and compared before the box is filled.
void Assembler::Place(const FullTensor& t, const Piece& p, uint8_t* dst) {
  const uint64_t item = DTypeSize(t.dtype);
  const uint64_t bytes = Numel(p.view.shape) * item;
  std::vector<uint8_t> first(bytes), other(bytes);
  Read(p.view, first.data());
  for (const SavedView& r : p.replicas) {
    Read(r, other.data());
    auto [a, b] = std::mismatch(first.begin(), first.end(), other.begin());
    if (a != first.end())
      throw Error(ErrorKind::kCorrupt, "tensor '" + t.name + "' " + Dims(t.shape) + ": " + p.view.what + " and " + r.what +
                                           " hold the same box at " + Dims(p.offsets) + " size " + Dims(p.view.shape) +
                                           " but differ (first at element " + std::to_string((a - first.begin()) / item) +
                                           "): pieces that neither tile the tensor nor are equal replicas");
  }
  Runs runs(t.tiled(), p.offsets, p.view.shape);
  const uint64_t run_bytes = runs.run() * item;
  for (uint64_t r = 0, at = 0; at < bytes; ++r, at += run_bytes)
    std::memcpy(dst + static_cast<uint64_t>(runs.Start(r)) * item, first.data() + at, run_bytes);
}

void Assembler::Assemble(const FullTensor& t, uint8_t* dst) {
  const uint64_t item = DTypeSize(t.dtype);
  const std::vector<int64_t>& shape = t.tiled();
  for (const Piece& p : t.pieces) {
    const SavedView& v = p.view;
    uint64_t numel = Numel(v.shape);
    if (numel == 0) continue;
    if (!p.replicas.empty()) {
      Place(t, p, dst);
      continue;
    }
    if (Contiguous(v)) {
      uint64_t begin = v.storage_offset * item;
      Stream(v, begin, begin + numel * item, dst, shape, p.offsets);
      continue;
    }
    // A strided view: its byte extent into a buffer, then element by element.
    int64_t last = 0;
    for (size_t d = 0; d < v.shape.size(); ++d) last += (v.shape[d] - 1) * v.stride[d];
    uint64_t begin = v.storage_offset * item, end = (v.storage_offset + static_cast<uint64_t>(last) + 1) * item;
    std::vector<uint8_t> extent(end - begin);
    SavedView flat = v;
    flat.shape = {static_cast<int64_t>((end - begin) / item)};
    flat.stride = {1};
    Stream(flat, begin, end, extent.data(), flat.shape, {0});
    std::vector<int64_t> gstride = ContiguousStrides(shape), idx(v.shape.size(), 0);
    for (uint64_t e = 0; e < numel; ++e) {
      int64_t src = 0, dst_el = 0;
      for (size_t d = 0; d < idx.size(); ++d) {
        src += idx[d] * v.stride[d];
        dst_el += (p.offsets[d] + idx[d]) * gstride[d];
      }
      std::memcpy(dst + static_cast<uint64_t>(dst_el) * item, extent.data() + static_cast<uint64_t>(src) * item, item);
      for (size_t d = idx.size(); d-- > 0;) {
        if (++idx[d] < v.shape[d]) break;
        idx[d] = 0;
      }
    }
  }
}

void Assembler::Read(const SavedView& v, uint8_t* dst) {
  FullTensor one;
  one.name = v.what;
  one.dtype = v.dtype;
  one.shape = v.shape;
  one.pieces.push_back(Piece{v, std::vector<int64_t>(v.shape.size(), 0), {}});
  Assemble(one, dst);
}

}  // namespace zckpt::merge
