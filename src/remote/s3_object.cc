// Objects read as a ByteSource (ranged GETs pinned to the ETag seen at open) and written as
// multipart uploads.
#include <curl/curl.h>

#include <algorithm>
#include <cstring>
#include <atomic>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <vector>

#include "remote/s3.h"
#include "remote/s3_client.h"
#include "remote/s3_pool.h"
#include "zckpt/error.h"
#include "zckpt/object_store.h"

namespace zckpt::remote {

bool IsObjectUrl(std::string_view path) { return path.substr(0, 5) == "s3://"; }

ObjectLocation SplitObjectUrl(const std::string& url) {
  if (!IsObjectUrl(url)) throw Error(ErrorKind::kInvalidArgument, url + ": not an s3:// URL");
  std::string rest = url.substr(5);
  size_t slash = rest.find('/');
  ObjectLocation loc;
  loc.bucket = rest.substr(0, slash);
  if (slash != std::string::npos) loc.key = rest.substr(slash + 1);
  if (loc.bucket.empty()) throw Error(ErrorKind::kInvalidArgument, url + ": expected s3://BUCKET/KEY");
  return loc;
}

ObjectLocation ParseObjectUrl(const std::string& url) {
  ObjectLocation loc = SplitObjectUrl(url);
  if (loc.key.empty()) throw Error(ErrorKind::kInvalidArgument, url + ": expected s3://BUCKET/KEY");
  return loc;
}

namespace {

std::string Range(uint64_t offset, uint64_t n) {
  std::string s(1, '[');  // (appends, not "[" + ...: GCC 12 warns falsely of the latter)
  s += std::to_string(offset);
  s += ", ";
  s += std::to_string(offset + n);
  s += ')';
  return s;
}

// HEAD of the object. A HEAD's error has no body, so a refusal other than 404 is asked again
// as a one-byte GET, whose body names the reason (InvalidToken, SignatureDoesNotMatch, ...).
Response Head(const S3Client& client, const ObjectLocation& loc) {
  Request r;
  r.method = "HEAD";
  r.bucket = loc.bucket;
  r.key = loc.key;
  Response resp = client.PerformRetrying(r, {});
  if (resp.curl_code != CURLE_OK || resp.status / 100 == 2 || resp.status == 404) return resp;
  Request g;
  g.bucket = loc.bucket;
  g.key = loc.key;
  g.headers = {"Range: bytes=0-0"};
  Response why = client.PerformRetrying(g, {});
  return why.curl_code == CURLE_OK && why.status / 100 != 2 ? why : resp;
}

}  // namespace

Response FetchRange(const S3Client& client, const ObjectLocation& loc, uint64_t offset, std::string& into,
                    const std::string& etag) {
  Request r;
  r.bucket = loc.bucket;
  r.key = loc.key;
  r.headers = {"Range: bytes=" + std::to_string(offset) + "-" + std::to_string(offset + into.size() - 1)};
  if (!etag.empty()) r.headers.push_back("If-Match: " + etag);
  r.sink = reinterpret_cast<uint8_t*>(into.data());
  r.sink_bytes = into.size();
  Response resp = client.PerformRetrying(r, [](const Response& x) {
    return x.content_length >= 0 && x.received == static_cast<uint64_t>(x.content_length);
  });
  into.resize(resp.received);
  return resp;
}

namespace {

// What an open fetches: the object's first kHeadBytes (the superblock; all of a small object)
// and its last kTailBytes, which hold the footer, the index and the blobs before it (the
// pickle) of all but the largest indexes: opening and reading the pickle are two round trips,
// no HEAD.
constexpr uint64_t kHeadBytes = 64 << 10;
constexpr uint64_t kTailBytes = 256 << 10;
// Bytes a reader's read-ahead (ByteSource::Prefetch: iter_tensors) may hold at once.
constexpr uint64_t kReadAheadBytes = 96ull << 20;
// A read is split into at least this many GETs where each still gets kMinGetBytes.
constexpr uint64_t kGetsPerRead = 4;
constexpr uint64_t kMinGetBytes = 1 << 20;
// Extents at most this far apart share a GET (the bytes between, alignment padding, dropped):
// a request's time to first byte costs more than this many bytes on the way.
constexpr uint64_t kMergeGap = 64 << 10;

// Object bytes fetched ahead of their reads (the open's first and last bytes; ranges a reader
// said it will read next, ByteSource::Prefetch), each range served from memory once: a second
// read of the same bytes is a re-fetch (they failed a check) and goes to the server. A part
// whose bytes were all served is freed; read-ahead parts together hold at most
// kReadAheadBytes.
class Prefetched {
 public:
  // A part [offset, offset + size) whose bytes `fill` fetches (in the background, or here when
  // `background` is false); a part that failed to arrive serves nothing (its reads go to the
  // server and fail or succeed there). False when a read-ahead part would pass the budget.
  bool Add(uint64_t offset, uint64_t size, std::function<void(std::string&)> fill, bool background) {
    auto part = std::make_shared<Part>();
    part->offset = offset;
    part->bytes.resize(size);
    if (background) {
      std::lock_guard<std::mutex> lock(mu_);
      if (ahead_ + size > kReadAheadBytes) return false;
      ahead_ += size;
      part->ahead = true;
    }
    // The task holds the part by address, not by shared_ptr: the part holds the task's future,
    // whose shared state keeps the task, and a shared_ptr there would keep the part (and its
    // bytes) alive forever. The part outlives its task: it is freed only after its future is
    // ready (Serve waits before Remove; the destructor waits for every part).
    auto run = [p = part.get(), fill = std::move(fill)] {
      try {
        fill(p->bytes);
      } catch (...) {
        p->failed = true;
      }
    };
    // In the background on a thread of its own, not a pool worker: `fill` waits for the pool's
    // GETs, and a worker waiting for workers could wait forever. Readers find the part only
    // once its future is set.
    part->done = std::async(background ? std::launch::async : std::launch::deferred, run).share();
    if (!background) part->done.wait();
    std::lock_guard<std::mutex> lock(mu_);
    parts_.push_back(part);
    return true;
  }

  // Copies [offset, offset + n) into dst when one part holds it all and none of it was served
  // yet (waiting for the part to arrive).
  bool Serve(uint64_t offset, uint64_t n, void* dst) {
    std::shared_ptr<Part> part;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const std::shared_ptr<Part>& p : parts_) {
        if (offset < p->offset || offset + n > p->offset + p->bytes.size() || Overlaps(*p, offset, n)) continue;
        p->served.emplace_back(offset, offset + n);
        part = p;
        break;
      }
    }
    if (!part) return false;
    part->done.wait();
    const bool failed = part->failed;
    if (!failed) std::memcpy(dst, part->bytes.data() + (offset - part->offset), n);
    std::lock_guard<std::mutex> lock(mu_);
    part->served_bytes += n;
    if (failed || part->served_bytes == part->bytes.size()) Remove(part);  // a failed one serves nothing
    return !failed;
  }

  ~Prefetched() {
    for (const std::shared_ptr<Part>& p : parts_) p->done.wait();  // nothing writes into a freed part
  }

 private:
  struct Part {
    uint64_t offset = 0;
    std::string bytes;
    std::vector<std::pair<uint64_t, uint64_t>> served;
    uint64_t served_bytes = 0;
    bool ahead = false;
    std::atomic<bool> failed{false};
    std::shared_future<void> done;
  };

  static bool Overlaps(const Part& p, uint64_t offset, uint64_t n) {
    for (auto [b, e] : p.served)
      if (offset < e && b < offset + n) return true;
    return false;
  }

  void Remove(const std::shared_ptr<Part>& part) {  // under mu_; a part already removed: nothing
    auto it = std::find(parts_.begin(), parts_.end(), part);
    if (it == parts_.end()) return;
    if (part->ahead) ahead_ -= part->bytes.size();
    parts_.erase(it);
  }

  std::mutex mu_;
  std::vector<std::shared_ptr<Part>> parts_;
  uint64_t ahead_ = 0;  // bytes of read-ahead parts held or in flight (a part never read whole
                        // keeps its share until the source closes: read-ahead then stops)
};

class ObjectSource final : public ByteSource {
 public:
  ObjectSource(std::string url, ObjectLocation loc, S3Client client)
      : url_(std::move(url)), loc_(std::move(loc)), client_(std::move(client)) {
    if (!OpenByGets()) OpenByHead();
  }

  uint64_t size() const override { return size_; }
  const std::string& name() const override { return url_; }
  unsigned refetch_attempts() const override { return client_.config().attempts; }
  unsigned connections() const override { return std::min(client_.config().connections, kObjectReaderThreads); }
  void BackoffBeforeRetry(unsigned attempt) const override { client_.Backoff(attempt); }

  void ReadAt(uint64_t offset, uint64_t n, void* dst) const override { ReadExtents({{offset, n, dst}}); }

  // Each extent served from what the open fetched where it can be; the rest as ranged GETs of
  // at most get_bytes, whatever the chunk size: a large extent split, near neighbours (at most
  // kMergeGap apart) merged into one GET whose body is scattered to them, all GETs in parallel on
  // the request pool.
  void ReadExtents(const std::vector<ByteExtent>& extents) const override {
    std::vector<ByteExtent> rest;
    for (const ByteExtent& e : extents)
      if (e.n > 0 && !prefetched_.Serve(e.offset, e.n, e.dst)) rest.push_back(e);
    Fetch(rest);
  }

  // Fetched now in the background (ranged GETs as ReadExtents makes them) and held until read,
  // within the read-ahead budget.
  bool Prefetch(uint64_t offset, uint64_t n) const override {
    if (n == 0 || offset + n > size_) return true;  // nothing to hold
    return prefetched_.Add(
        offset, n, [this, offset](std::string& into) { Fetch({{offset, into.size(), into.data()}}); }, true);
  }

 private:
  // The extents from the server: GETs of at most get_bytes, near neighbours merged (see
  // ReadExtents), all at once on the request pool.
  void Fetch(const std::vector<ByteExtent>& extents) const {
    struct Group {
      uint64_t begin, end;
      std::vector<Request::Piece> pieces;
    };
    std::vector<Group> groups;
    // A read split into at least kGetsPerRead GETs where its bytes allow (not under kMinGetBytes
    // each): a reader thread then keeps several requests in flight even when its batch is one
    // tensor of a few MiB.
    uint64_t total = 0;
    for (const ByteExtent& e : extents) total += e.n;
    const uint64_t most = std::max<uint64_t>(
        1, std::min<uint64_t>(client_.config().get_bytes, std::max(kMinGetBytes, total / kGetsPerRead)));
    for (const ByteExtent& e : extents) {
      const uint64_t parts = (e.n + most - 1) / most, each = (e.n + parts - 1) / parts;
      for (uint64_t at = 0; at < e.n; at += each) {
        const uint64_t offset = e.offset + at, len = std::min(each, e.n - at);
        uint8_t* dst = static_cast<uint8_t*>(e.dst) + at;
        if (!groups.empty() && offset >= groups.back().end && offset - groups.back().end <= kMergeGap &&
            offset + len - groups.back().begin <= most) {
          groups.back().pieces.push_back({offset - groups.back().begin, len, dst});
          groups.back().end = offset + len;
        } else {
          groups.push_back({offset, offset + len, {{0, len, dst}}});
        }
      }
    }
    std::vector<std::function<void()>> gets;
    gets.reserve(groups.size());
    for (Group& g : groups) gets.push_back([this, &g] { Get(g.begin, g.end - g.begin, g.pieces); });
    RequestPool::Instance().RunAll(gets, client_.config().connections);
  }

  // One ranged GET of [offset, offset + n) pinned to the ETag, its body to `pieces`, retried
  // (PerformRetrying); its failure an Error naming the range.
  void Get(uint64_t offset, uint64_t n, const std::vector<Request::Piece>& pieces) const {
    Request r = RangeRequest("bytes=" + std::to_string(offset) + "-" + std::to_string(offset + n - 1));
    if (!etag_.empty()) r.headers.push_back("If-Match: " + etag_);
    if (pieces.size() == 1 && pieces[0].n == n) r.sink = pieces[0].dst;
    else r.scatter = pieces;
    r.sink_bytes = n;
    Response resp = client_.PerformRetrying(r, [&](const Response& x) { return x.received == n; });
    std::string where = url_ + ": object bytes " + Range(offset, n);
    if (resp.status == 412 || (resp.status / 100 == 2 && !etag_.empty() && !resp.etag.empty() && resp.etag != etag_))
      throw Error(ErrorKind::kIo, where + ": the object was replaced since it was opened (ETag " + etag_ +
                                      " pinned at open" + (resp.etag.empty() ? "" : ", now " + resp.etag) +
                                      "): refusing to mix two versions");
    if (resp.curl_code != CURLE_OK)
      throw Error(ErrorKind::kIo, "cannot read " + where + " after " + std::to_string(client_.config().attempts) +
                                      " attempts: " + resp.Describe());
    if (resp.status / 100 != 2)
      throw Error(ErrorKind::kIo, "cannot read " + where + ": " + resp.Describe() + Advice(resp));
  }

  Request RangeRequest(const std::string& range) const {
    Request r;
    r.bucket = loc_.bucket;
    r.key = loc_.key;
    r.headers = {"Range: " + range};
    return r;
  }

  // The open as ranged GETs, no HEAD: the first kHeadBytes (its Content-Range gives the size, its
  // ETag is pinned), then, for a larger object, its last kTailBytes pinned to that ETag (a 412
  // there: the object changed between them, both are asked again). Their bytes are kept for the
  // reads that follow. False where a GET cannot say (an empty object: 416); Error(kIo) on a
  // refusal.
  bool OpenByGets() {
    for (unsigned attempt = 1;; ++attempt) {
      std::string head(kHeadBytes, '\0');
      Response h = FetchRange(client_, loc_, 0, head, "");
      if (h.curl_code == CURLE_OK && h.status == 416) return false;
      if (h.curl_code != CURLE_OK || h.status / 100 != 2) Refuse(h, 0, kHeadBytes);
      // 200: a server that sends the whole object for a range; its length is the size.
      const int64_t size = h.status == 200 ? h.content_length : h.object_size;
      if (size < 0) throw Error(ErrorKind::kIo, "cannot open " + url_ + ": a ranged GET gave no size (Content-Range)");
      const uint64_t tail_at = std::max<uint64_t>(head.size(), static_cast<uint64_t>(size) > kTailBytes ? size - kTailBytes : 0);
      std::string tail(static_cast<uint64_t>(size) - std::min<uint64_t>(tail_at, size), '\0');
      if (!tail.empty()) {
        Response t = FetchRange(client_, loc_, tail_at, tail, h.etag);
        if (t.curl_code == CURLE_OK && t.status == 412 && attempt < client_.config().attempts) {
          client_.Backoff(attempt);
          continue;
        }
        if (t.curl_code != CURLE_OK || t.status / 100 != 2 || t.received != tail.size()) Refuse(t, tail_at, tail.size());
      }
      etag_ = h.etag;
      size_ = static_cast<uint64_t>(size);
      prefetched_.Add(0, head.size(), [&head](std::string& into) { into.swap(head); }, false);
      if (!tail.empty()) prefetched_.Add(tail_at, tail.size(), [&tail](std::string& into) { into.swap(tail); }, false);
      return true;
    }
  }

  // Error(kIo) for an open's GET of [offset, offset + n) that failed: after every attempt (a
  // transfer that kept failing), or refused (what to check).
  [[noreturn]] void Refuse(const Response& r, uint64_t offset, uint64_t n) const {
    std::string where = "cannot open " + url_ + ": object bytes " + Range(offset, n);
    if (r.curl_code != CURLE_OK)
      throw Error(ErrorKind::kIo, where + " after " + std::to_string(client_.config().attempts) + " attempts: " + r.Describe() + Advice(r));
    throw Error(ErrorKind::kIo, where + ": " + r.Describe() + Advice(r));
  }

  void OpenByHead() {
    Response resp = Head(client_, loc_);
    if (resp.curl_code != CURLE_OK || resp.status / 100 != 2)
      throw Error(ErrorKind::kIo, "cannot open " + url_ + ": " + resp.Describe() + Advice(resp));
    etag_ = resp.etag;
    if (resp.content_length < 0) throw Error(ErrorKind::kIo, "cannot open " + url_ + ": HEAD gave no Content-Length");
    size_ = static_cast<uint64_t>(resp.content_length);
  }

  std::string url_;
  ObjectLocation loc_;
  S3Client client_;
  std::string etag_;
  uint64_t size_ = 0;
  mutable Prefetched prefetched_;
};

}  // namespace

bool ObjectExists(const std::string& url) {
  ObjectLocation loc = ParseObjectUrl(url);
  Response resp = Head(S3Client(LoadS3Config()), loc);
  if (resp.curl_code == CURLE_OK && resp.status == 404) return false;
  if (resp.curl_code == CURLE_OK && resp.status / 100 == 2) return true;
  throw Error(ErrorKind::kIo, "cannot look up " + url + ": " + resp.Describe() + Advice(resp));
}

std::unique_ptr<ByteSource> OpenObject(const std::string& url) {
  ObjectLocation loc = ParseObjectUrl(url);
  return std::make_unique<ObjectSource>(url, std::move(loc), S3Client(LoadS3Config()));
}

std::string ReadObjectStart(const std::string& url, uint64_t n) {
  std::string out(n, '\0');
  if (n == 0) return out;
  Response resp = FetchRange(S3Client(LoadS3Config()), ParseObjectUrl(url), 0, out, "");
  if (resp.curl_code == CURLE_OK && resp.status == 416) return "";  // an empty object
  if (resp.curl_code != CURLE_OK || resp.status / 100 != 2)
    throw Error(ErrorKind::kIo, "cannot read " + url + ": " + resp.Describe() + Advice(resp));
  return out;
}

namespace {

std::unique_ptr<ByteSink> CreateObject(const std::string& url) { return std::make_unique<ObjectWriter>(url); }

// s3:// in the table of byte stores (common/byte_store.h), registered when this file is
// linked: what Container::Open and ContainerWriter read and write an object through, without
// the format knowing S3. Here, beside IsObjectUrl and OpenObject, so every binary that links
// anything of the object layer (libzckpt links it whole; the CLI names IsObjectUrl) has it.
[[maybe_unused]] const bool kRegistered = RegisterByteStore({"s3://", OpenObject, CreateObject});

}  // namespace

}  // namespace zckpt::remote

namespace zckpt {

bool IsObjectUrl(std::string_view path) { return remote::IsObjectUrl(path); }
bool ObjectExists(const std::string& url) { return remote::ObjectExists(url); }

}  // namespace zckpt
