#include "safetensors/header.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <unordered_set>

#include "zckpt/error.h"

namespace zckpt::safetensors {

namespace {

constexpr std::string_view kMetadataKey = "__metadata__";
constexpr size_t kMaxDims = 64;  // what a container's tensor record holds (and torch's limit)

// A name or key from the file as a message may show it: control bytes escaped, long ones cut.
std::string Printable(std::string_view s) {
  std::string out;
  for (unsigned char c : s.substr(0, 200)) {
    if (c < 0x20 || c == 0x7f || c == '\\') {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  if (s.size() > 200) out += "...";
  return out;
}

// Offset of the first byte that is not part of well-formed UTF-8 (RFC 3629: no overlongs, no
// surrogates, nothing above U+10FFFF), or nullopt when all of `s` is.
std::optional<size_t> FirstInvalidUtf8(std::span<const uint8_t> s) {
  size_t i = 0;
  while (i < s.size()) {
    uint8_t c = s[i];
    size_t n;
    uint32_t min;
    if (c < 0x80) { ++i; continue; }
    if (c >= 0xc2 && c <= 0xdf) n = 1, min = 0x80;
    else if (c >= 0xe0 && c <= 0xef) n = 2, min = 0x800;
    else if (c >= 0xf0 && c <= 0xf4) n = 3, min = 0x10000;
    else return i;
    if (s.size() - i <= n) return i;
    uint32_t cp = c & (0x3f >> n);
    for (size_t k = 1; k <= n; ++k) {
      if ((s[i + k] & 0xc0) != 0x80) return i;
      cp = (cp << 6) | (s[i + k] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return i;
    i += n + 1;
  }
  return std::nullopt;
}

// Builds the header from nlohmann's SAX events, checking the schema as it goes, so a hostile
// header is refused at its first wrong token and no DOM of a 100 MB header is ever built.
// Nesting deeper than the schema's three levels is refused when it opens.
class HeaderSax {
 public:
  using json = nlohmann::json;

  bool null() { return Scalar("null"); }
  bool boolean(bool) { return Scalar("a boolean"); }
  bool number_integer(json::number_integer_t v) {
    if (InArray()) return Fail(Field() + " holds " + std::to_string(v) + ", not a non-negative integer");
    return Scalar("a number");
  }
  bool number_unsigned(json::number_unsigned_t v) {
    if (!InArray()) return Scalar("a number");
    auto& t = tensors_.back();
    if (ctx_.back() == Ctx::kShape) {
      if (t.shape.size() == kMaxDims)
        return Fail(Field() + " has more than " + std::to_string(kMaxDims) + " dimensions", ErrorKind::kUnsupported);
      t.shape.push_back(v);
    } else {
      if (offsets_ == 2) return Fail("data_offsets of tensor '" + Printable(t.name) + "' holds more than two numbers");
      (offsets_++ == 0 ? t.begin : t.end) = v;
    }
    return true;
  }
  bool number_float(json::number_float_t, const json::string_t& text) {
    if (InArray()) return Fail(Field() + " holds " + Printable(text) + ", not a non-negative integer");
    return Scalar("a number");
  }
  bool string(json::string_t& s) {
    if (ctx_.back() == Ctx::kMetadata) {
      metadata_.emplace_back(key_, s);
      return true;
    }
    if (ctx_.back() == Ctx::kTensor && field_ == "dtype") {
      auto d = FindDType(s);
      if (!d) return Fail("tensor '" + Printable(tensors_.back().name) + "' has dtype '" + Printable(s) +
                          "', which safetensors does not define", ErrorKind::kUnsupported);
      if (d->dtype == DType::kInvalid)
        return Fail("tensor '" + Printable(tensors_.back().name) + "' has dtype " + std::string(d->name) +
                    ", which torch has no type for", ErrorKind::kUnsupported);
      dtype_ = *d;
      return true;
    }
    return Scalar("a string");
  }
  bool binary(json::binary_t&) { return Scalar("binary data"); }

  bool start_object(std::size_t) {
    switch (ctx_.back()) {
      case Ctx::kTop: ctx_.push_back(Ctx::kRoot); return true;
      case Ctx::kRoot:
        if (key_ == kMetadataKey) {
          has_metadata_ = true;
          ctx_.push_back(Ctx::kMetadata);
          metadata_keys_.clear();
          return true;
        }
        tensors_.emplace_back();
        tensors_.back().name = key_;
        fields_ = 0;
        ctx_.push_back(Ctx::kTensor);
        return true;
      default: return Scalar("an object");
    }
  }
  bool key(json::string_t& k) {
    switch (ctx_.back()) {
      case Ctx::kRoot:
        if (!root_keys_.insert(k).second) return Fail("key '" + Printable(k) + "' appears twice");
        key_ = k;
        return true;
      case Ctx::kMetadata:
        if (!metadata_keys_.insert(k).second) return Fail("__metadata__ key '" + Printable(k) + "' appears twice");
        key_ = k;
        return true;
      case Ctx::kTensor: {
        unsigned bit = k == "dtype" ? 1u : k == "shape" ? 2u : k == "data_offsets" ? 4u : 0u;
        if (!bit)
          return Fail("tensor '" + Printable(tensors_.back().name) + "' has a field '" + Printable(k) +
                      "' that safetensors does not define", ErrorKind::kUnsupported);
        if (fields_ & bit) return Fail("tensor '" + Printable(tensors_.back().name) + "' has '" + k + "' twice");
        fields_ |= bit;
        field_ = k;
        return true;
      }
      default: return Fail("unexpected key");
    }
  }
  bool end_object() {
    Ctx c = ctx_.back();
    ctx_.pop_back();
    if (c == Ctx::kTensor) {
      TensorEntry& t = tensors_.back();
      if (fields_ != 7) {
        const char* missing = !(fields_ & 1) ? "dtype" : !(fields_ & 2) ? "shape" : "data_offsets";
        return Fail("tensor '" + Printable(t.name) + "' has no '" + missing + "'");
      }
      t.dtype = dtype_;
    }
    return true;
  }
  bool start_array(std::size_t) {
    if (ctx_.back() == Ctx::kTensor && field_ == "shape") {
      ctx_.push_back(Ctx::kShape);
      return true;
    }
    if (ctx_.back() == Ctx::kTensor && field_ == "data_offsets") {
      ctx_.push_back(Ctx::kOffsets);
      offsets_ = 0;
      return true;
    }
    return Scalar("an array");
  }
  bool end_array() {
    if (ctx_.back() == Ctx::kOffsets && offsets_ != 2)
      return Fail("data_offsets of tensor '" + Printable(tensors_.back().name) + "' holds " +
                  std::to_string(offsets_) + " numbers, not two");
    ctx_.pop_back();
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) {
    return Fail(std::string("not valid JSON: ") + e.what());
  }

  const std::string& error() const { return error_; }
  ErrorKind error_kind() const { return error_kind_; }
  std::vector<TensorEntry> TakeTensors() { return std::move(tensors_); }
  bool has_metadata() const { return has_metadata_; }
  std::vector<std::pair<std::string, std::string>> TakeMetadata() { return std::move(metadata_); }

 private:
  enum class Ctx { kTop, kRoot, kMetadata, kTensor, kShape, kOffsets };

  bool InArray() const { return ctx_.back() == Ctx::kShape || ctx_.back() == Ctx::kOffsets; }
  std::string Field() const {
    return std::string(ctx_.back() == Ctx::kShape ? "shape" : "data_offsets") + " of tensor '" +
           Printable(tensors_.back().name) + "'";
  }
  // A value the schema has no place for here: say where it is and what was found.
  bool Scalar(const char* what) {
    switch (ctx_.back()) {
      case Ctx::kTop: return Fail(std::string("the header is ") + what + ", not a JSON object");
      case Ctx::kRoot:
        if (key_ == kMetadataKey && std::string_view(what) == "null") return true;  // as safetensors reads it: absent
        if (key_ == kMetadataKey) return Fail(std::string("__metadata__ is ") + what + ", not an object of strings");
        return Fail("the entry of tensor '" + Printable(key_) + "' is " + what + ", not an object");
      case Ctx::kMetadata:
        return Fail("__metadata__ '" + Printable(key_) + "' is " + what + ", not a string");
      case Ctx::kTensor:
        return Fail("'" + field_ + "' of tensor '" + Printable(tensors_.back().name) + "' is " + what);
      case Ctx::kShape:
      case Ctx::kOffsets: return Fail(Field() + " holds " + what + ", not a non-negative integer");
    }
    return Fail("unexpected value");
  }
  bool Fail(const std::string& message, ErrorKind kind = ErrorKind::kCorrupt) {
    if (error_.empty()) {
      error_ = message;
      error_kind_ = kind;
    }
    return false;
  }

  std::vector<Ctx> ctx_{Ctx::kTop};
  std::string key_, field_;
  unsigned fields_ = 0;
  int offsets_ = 0;
  DTypeInfo dtype_{};
  std::unordered_set<std::string> root_keys_, metadata_keys_;
  std::vector<TensorEntry> tensors_;
  bool has_metadata_ = false;
  std::vector<std::pair<std::string, std::string>> metadata_;
  std::string error_;
  ErrorKind error_kind_ = ErrorKind::kCorrupt;
};

[[noreturn]] void Throw(ErrorKind kind, const std::string& path, const std::string& message) {
  throw Error(kind, path + ": safetensors header: " + message);
}

// A tensor's sizes against its dtype, shape and offsets (overflow-safe).
void CheckSizes(const TensorEntry& t, const std::string& path) {
  const std::string what = "tensor '" + Printable(t.name) + "' (" + std::string(t.dtype.name) + " " + FormatShape(t.shape) + ")";
  if (t.end < t.begin)
    Throw(ErrorKind::kCorrupt, path, what + " has data_offsets [" + std::to_string(t.begin) + ", " +
                                         std::to_string(t.end) + "]: END before BEGIN");
  uint64_t numel = 1;
  bool overflow = false;
  for (uint64_t d : t.shape) {
    overflow |= d != 0 && numel > std::numeric_limits<uint64_t>::max() / d;
    if (!overflow) numel *= d;
  }
  if (overflow || numel > std::numeric_limits<uint64_t>::max() / t.dtype.bits)
    Throw(ErrorKind::kCorrupt, path, what + ": dtype x shape overflows 64 bits");
  uint64_t bits = numel * t.dtype.bits;
  if (bits % 8 != 0) Throw(ErrorKind::kCorrupt, path, what + ": " + std::to_string(bits) + " bits, not a whole number of bytes");
  if (t.bytes() != bits / 8)
    Throw(ErrorKind::kCorrupt, path, what + " has data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
                                         "] (" + std::to_string(t.bytes()) + " bytes), but " + std::string(t.dtype.name) +
                                         " x " + FormatShape(t.shape) + " is " + std::to_string(bits / 8) + " bytes");
}

// A valid entry torch cannot represent (checked once the file is known to be well-formed).
void CheckTorchShape(const TensorEntry& t, const std::string& path) {
  const std::string what = "tensor '" + Printable(t.name) + "' (" + std::string(t.dtype.name) + " " + FormatShape(t.shape) + ")";
  // Sizes, and contiguous strides (which multiply the non-zero sizes), must fit torch's int64.
  uint64_t span = 1;
  for (uint64_t d : t.shape) {
    if (d > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      Throw(ErrorKind::kUnsupported, path, what + ": dimension " + std::to_string(d) + " is beyond what torch holds");
    uint64_t m = std::max<uint64_t>(d, 1);
    if (span > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / m)
      Throw(ErrorKind::kUnsupported, path, what + ": its strides overflow torch's int64");
    span *= m;
  }
  if (t.dtype.dtype == DType::kFloat4_e2m1fn_x2 && (t.shape.empty() || t.shape.back() % 2 != 0))
    Throw(ErrorKind::kUnsupported, path, what + ": torch's float4_e2m1fn_x2 packs two F4 values a byte, so the last "
                                                "dimension must be even");
}

}  // namespace

std::vector<int64_t> TensorEntry::TorchShape() const {
  std::vector<int64_t> out(shape.begin(), shape.end());
  if (dtype.dtype == DType::kFloat4_e2m1fn_x2 && !out.empty()) out.back() /= 2;
  return out;
}

Header ParseHeaderJson(std::span<const uint8_t> json, std::optional<uint64_t> data_bytes, const std::string& path) {
  Header h;
  h.header_bytes = json.size();
  h.data_offset = 8 + json.size();
  if (auto bad = FirstInvalidUtf8(json))
    Throw(ErrorKind::kCorrupt, path, "not UTF-8 (byte " + std::to_string(*bad) + " of the header, file byte " +
                                         std::to_string(8 + *bad) + ")");
  // JSON text never holds a raw NUL (a string must escape it), and nlohmann's lexer would take
  // one for the end of the input, leaving the bytes after it unread.
  // (An empty header is the private copy of nothing: its data() may be null, which memchr must
  // not see; it is refused below.)
  const uint8_t* nul = json.empty() ? nullptr : static_cast<const uint8_t*>(std::memchr(json.data(), 0, json.size()));
  if (nul != nullptr)
    Throw(ErrorKind::kCorrupt, path, "not valid JSON: a NUL byte (byte " + std::to_string(nul - json.data()) +
                                         " of the header, file byte " + std::to_string(8 + (nul - json.data())) + ")");
  if (json.empty() || json[0] != '{')
    Throw(ErrorKind::kCorrupt, path, "does not start with '{' (file byte 8)");
  HeaderSax sax;
  // Read as chars: nlohmann's input adapter over unsigned chars needs std::char_traits<unsigned
  // char>, which libc++ (the wheel's toolchain) no longer has.
  const char* text = reinterpret_cast<const char*>(json.data());
  bool ok = nlohmann::json::sax_parse(text, text + json.size(), &sax, nlohmann::json::input_format_t::json, /*strict=*/true);
  if (!ok) Throw(sax.error().empty() ? ErrorKind::kCorrupt : sax.error_kind(), path, sax.error().empty() ? "malformed" : sax.error());
  h.tensors = sax.TakeTensors();
  h.has_metadata = sax.has_metadata();
  h.metadata = sax.TakeMetadata();

  for (const TensorEntry& t : h.tensors) CheckSizes(t, path);
  // The byte buffer is covered exactly, in offset order: no gap (a polyglot file), no overlap.
  std::stable_sort(h.tensors.begin(), h.tensors.end(), [](const TensorEntry& a, const TensorEntry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t at = 0;
  const TensorEntry* prev = nullptr;
  for (const TensorEntry& t : h.tensors) {
    if (t.begin != at) {
      std::string range = "data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) + "] (file bytes " +
                          std::to_string(h.data_offset + t.begin) + "..)";
      std::string before = prev ? "the previous tensor '" + Printable(prev->name) + "' ends at " + std::to_string(at)
                                : "the byte buffer starts at 0";
      Throw(ErrorKind::kCorrupt, path, "tensor '" + Printable(t.name) + "' has " + range + ", but " + before +
                                           (t.begin < at ? ": the tensors overlap" : ": a gap no tensor covers"));
    }
    at = t.end;
    prev = &t;
  }
  if (data_bytes && at != *data_bytes) {
    Throw(ErrorKind::kCorrupt, path,
          "the tensors cover " + std::to_string(at) + " bytes of data but the file holds " + std::to_string(*data_bytes) +
              (at > *data_bytes ? (prev ? " (tensor '" + Printable(prev->name) + "' runs past the end of the file)" : "")
                               : " (bytes after the last tensor that no tensor covers)"));
  }
  h.data_bytes = at;
  for (const TensorEntry& t : h.tensors) CheckTorchShape(t, path);
  return h;
}

namespace {

// The header length from a file's first 8 bytes (`head`, of a file of `file_bytes`), checked to
// fit the file and safetensors' limit.
uint64_t HeaderLength(std::span<const uint8_t> head, uint64_t file_bytes, const std::string& path) {
  if (file_bytes < 8)
    throw Error(ErrorKind::kNotContainer, path + ": " + std::to_string(file_bytes) +
                                              " bytes, too short to be a safetensors file (8-byte header length)");
  uint64_t n = 0;
  for (int b = 7; b >= 0; --b) n = (n << 8) | head[b];
  if (n > kMaxHeaderBytes)
    Throw(ErrorKind::kCorrupt, path, "length " + std::to_string(n) + " exceeds safetensors' limit of " +
                                         std::to_string(kMaxHeaderBytes) + " bytes");
  if (n > file_bytes - 8)
    Throw(ErrorKind::kCorrupt, path, "length " + std::to_string(n) + " runs past the end of the file (" +
                                         std::to_string(file_bytes) + " bytes)");
  return n;
}

}  // namespace

Header ParseFile(std::span<const uint8_t> file, const std::string& path) {
  const uint64_t n = HeaderLength(file, file.size(), path);
  return ParseHeaderJson(file.subspan(8, n), file.size() - 8 - n, path);
}

Header ReadFileHeader(const MappedFile& file, std::vector<uint8_t>* json) {
  uint8_t head[8] = {};
  if (file.size() >= 8) file.ReadAt(0, 8, head);
  const uint64_t n = HeaderLength(head, file.size(), file.path());
  json->resize(n);
  file.ReadAt(8, n, json->data());
  return ParseHeaderJson(*json, file.size() - 8 - n, file.path());
}

bool LooksLikeSafetensors(std::span<const uint8_t> head, uint64_t file_bytes) {
  if (head.size() < 9 || file_bytes < 9) return false;
  uint64_t n = 0;
  for (int b = 7; b >= 0; --b) n = (n << 8) | head[b];
  return n >= 2 && n <= kMaxHeaderBytes && n <= file_bytes - 8 && head[8] == '{';
}

}  // namespace zckpt::safetensors
