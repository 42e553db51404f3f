#include "loader/plan.h"

#include <algorithm>

#include "zckpt/container.h"
#include "zckpt/format.h"

namespace zckpt::loader {

namespace {

uint64_t AlignDown(uint64_t x, uint64_t a) { return x / a * a; }
uint64_t AlignUp(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

// A chunk goes straight to its destination when one host piece takes all of it and its storage
// is large: consecutive chunks of a storage are read as one span, so that costs no extra reads.
bool GoesIntoDestination(const format::ChunkRecord& r, uint64_t storage_bytes, std::span<const Piece> pieces,
                const PlanOptions& o) {
  if (!o.read_into_destination || pieces.size() != 1 || storage_bytes < kMinDirectStorage) return false;
  const Piece& p = pieces[0];
  return p.device < 0 && p.staged < 0 && p.chunk_offset == 0 && p.bytes == r.raw_bytes;
}

enum class Kind { kIntoDestination, kSlotRaw, kSlotZstd };

}  // namespace

Destinations::Destinations(uint64_t chunk_count, std::vector<std::pair<uint64_t, Piece>> pieces)
    : begin_(chunk_count + 1, 0) {
  std::stable_sort(pieces.begin(), pieces.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  pieces_.reserve(pieces.size());
  for (const auto& [chunk, piece] : pieces) Add(chunk, piece);
  Finish();
}

void Destinations::Add(uint64_t chunk, const Piece& piece) {
  while (next_ <= chunk) begin_[next_++] = pieces_.size();
  pieces_.push_back(piece);
}

void Destinations::Finish() {
  while (next_ < begin_.size()) begin_[next_++] = pieces_.size();
}

Plan MakePlan(const Container& c, const Destinations& d, const PlanOptions& o) {
  Plan plan;
  plan.slot_offset.assign(c.chunk_count(), 0);
  Batch cur;
  bool open = false;
  Kind kind = Kind::kIntoDestination;
  uint64_t prev_end = 0;  // file end of the last needed chunk in `cur`
  uint32_t storage = UINT32_MAX;
  uint64_t storage_bytes = 0;
  auto close = [&] {
    if (!open) return;
    if (cur.in_slot) ++plan.slot_batches;
    plan.batches.push_back(cur);
    open = false;
  };
  for (uint64_t i = 0; i < c.chunk_count(); ++i) {
    if (!d.needed(i)) continue;
    format::ChunkRecord r = c.chunk(i);
    if (r.storage != storage) storage_bytes = c.storage(storage = r.storage).raw_bytes;
    Kind k = GoesIntoDestination(r, storage_bytes, d.of(i), o) ? Kind::kIntoDestination : IsZstd(r) ? Kind::kSlotZstd : Kind::kSlotRaw;
    uint64_t end = r.offset + r.stored_bytes;
    bool fits = false;
    if (open && k == kind) {
      switch (k) {
        case Kind::kIntoDestination:
          fits = cur.raw_bytes + r.raw_bytes <= o.batch_bytes;
          break;
        case Kind::kSlotZstd:
          fits = cur.raw_bytes + r.raw_bytes <= o.slot_capacity;
          break;
        case Kind::kSlotRaw: {
          uint64_t span_end = o.align_spans ? AlignUp(end, kDirectIoAlign) : end;
          fits = r.offset - prev_end <= kMaxSpanGap && span_end - cur.file_begin <= o.slot_capacity;
          break;
        }
      }
    }
    if (!fits) {
      close();
      cur = Batch{};
      cur.first = i;
      cur.in_slot = k != Kind::kIntoDestination;
      cur.zstd = k == Kind::kSlotZstd;
      cur.file_begin = o.align_spans ? AlignDown(r.offset, kDirectIoAlign) : r.offset;
      kind = k;
      open = true;
    }
    if (k == Kind::kSlotRaw) plan.slot_offset[i] = r.offset - cur.file_begin;
    if (k == Kind::kSlotZstd) plan.slot_offset[i] = cur.raw_bytes;
    if (k == Kind::kIntoDestination) ++plan.destination_chunks;
    cur.last = i + 1;
    cur.file_end = o.align_spans && k == Kind::kSlotRaw ? AlignUp(end, kDirectIoAlign) : end;
    cur.raw_bytes += r.raw_bytes;
    cur.stored_bytes += r.stored_bytes;
    plan.raw_bytes += r.raw_bytes;
    plan.stored_bytes += r.stored_bytes;
    ++plan.chunks;
    prev_end = end;
  }
  close();
  return plan;
}

}  // namespace zckpt::loader
