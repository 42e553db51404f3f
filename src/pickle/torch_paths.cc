#include "pickle/torch_paths.h"

#include <algorithm>

#include "pickle/text_codec.h"

namespace zckpt::pickle {

namespace {

// Longest bytes key shown as text in a path; longer ones read "<N bytes>".
constexpr size_t kMaxBytesKey = 256;
constexpr size_t kDisplayBytes = 200;

}  // namespace

PathTable::PathTable() { nodes_.push_back({kRoot, nullptr, -1, {}}); }

PathTable::Id PathTable::Key(Id parent, const Value* key) {
  nodes_.push_back({parent, key, -1, {}});
  return static_cast<Id>(nodes_.size() - 1);
}

PathTable::Id PathTable::Index(Id parent, size_t index) {
  nodes_.push_back({parent, nullptr, static_cast<int64_t>(index), {}});
  return static_cast<Id>(nodes_.size() - 1);
}

PathTable::Id PathTable::Literal(Id parent, std::string segment) {
  if (segment.empty()) return parent;
  nodes_.push_back({parent, nullptr, -1, std::move(segment)});
  return static_cast<Id>(nodes_.size() - 1);
}

std::string PathTable::Segment(const Node& n) const {
  if (n.index >= 0) return std::to_string(n.index);
  if (!n.key) return n.literal;
  switch (n.key->kind) {
    case Kind::kString: return n.key->text;
    case Kind::kInt: return std::to_string(n.key->integer);
    default: break;
  }
  auto [it, inserted] = rendered_keys_.try_emplace(n.key);
  if (!inserted) return it->second;
  if (n.key->kind != Kind::kBytes) it->second = Render(n.key, 4, 64);  // tuples, floats, None, big ints: bounded
  else if (n.key->text.size() <= kMaxBytesKey) it->second = Latin1ToUtf8(n.key->text);
  else it->second = std::string(1, '<').append(std::to_string(n.key->text.size())).append(" bytes>");
  return it->second;
}

size_t PathTable::SegmentLength(const Node& n) const {
  // Cheap for the kinds that can be long; the rest are short by construction.
  if (n.key && n.key->kind == Kind::kString) return n.key->text.size();
  if (!n.key && n.index < 0) return n.literal.size();
  return Segment(n).size();
}

std::optional<std::string> PathTable::Text(Id id, size_t max_bytes) const {
  size_t total = 0;
  std::vector<const Node*> chain;
  for (Id at = id; at != kRoot; at = nodes_[at].parent) {
    const Node& n = nodes_[at];
    total += SegmentLength(n) + (chain.empty() ? 0 : 1);
    if (total > max_bytes) return std::nullopt;
    chain.push_back(&n);
  }
  std::string out;
  out.reserve(total);
  for (size_t i = chain.size(); i-- > 0;) {
    std::string seg = Segment(*chain[i]);
    if (seg.empty()) continue;  // an empty key adds nothing, as in the old dotted joins
    if (!out.empty()) out.push_back('.');
    out += seg;
  }
  return out;
}

std::string PathTable::Display(Id id) const {
  if (auto full = Text(id, kDisplayBytes)) return *full;
  // Last segments first, until about kDisplayBytes are collected.
  std::string tail;
  for (Id at = id; at != kRoot && tail.size() < kDisplayBytes; at = nodes_[at].parent) {
    const Node& n = nodes_[at];
    std::string seg = n.key && n.key->kind == Kind::kString && n.key->text.size() > kDisplayBytes
                          ? n.key->text.substr(n.key->text.size() - kDisplayBytes)
                          : Segment(n);
    if (!tail.empty()) seg.push_back('.');
    tail.insert(0, seg);
  }
  size_t cut = tail.size() > kDisplayBytes ? tail.size() - kDisplayBytes : 0;
  while (cut < tail.size() && (static_cast<uint8_t>(tail[cut]) & 0xC0) == 0x80) ++cut;  // UTF-8 boundary
  std::string out = "...";
  return out.append(tail, cut);
}

}  // namespace zckpt::pickle
