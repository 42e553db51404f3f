// Objects read as a ByteSource (ranged GETs pinned to the ETag seen at open) and written as
// multipart uploads.
#include <curl/curl.h>

#include <algorithm>
#include <cstring>
#include <future>
#include <deque>
#include <mutex>

#include "remote/s3.h"
#include "remote/s3_client.h"
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

class ObjectSource final : public ByteSource {
 public:
  ObjectSource(std::string url, ObjectLocation loc, S3Client client)
      : url_(std::move(url)), loc_(std::move(loc)), client_(std::move(client)) {
    Response resp = Head(client_, loc_);
    if (resp.curl_code != CURLE_OK || resp.status / 100 != 2)
      throw Error(ErrorKind::kIo, "cannot open " + url_ + ": " + resp.Describe() + Advice(resp));
    etag_ = resp.etag;
    if (resp.content_length < 0) throw Error(ErrorKind::kIo, "cannot open " + url_ + ": HEAD gave no Content-Length");
    size_ = static_cast<uint64_t>(resp.content_length);
  }

  uint64_t size() const override { return size_; }
  const std::string& name() const override { return url_; }
  unsigned refetch_attempts() const override { return client_.config().attempts; }
  unsigned connections() const override { return client_.config().connections; }
  void BackoffBeforeRetry(unsigned attempt) const override { client_.Backoff(attempt); }

  void ReadAt(uint64_t offset, uint64_t n, void* dst) const override {
    if (n == 0) return;
    Request r;
    r.bucket = loc_.bucket;
    r.key = loc_.key;
    r.headers = {"Range: bytes=" + std::to_string(offset) + "-" + std::to_string(offset + n - 1)};
    if (!etag_.empty()) r.headers.push_back("If-Match: " + etag_);
    r.sink = static_cast<uint8_t*>(dst);
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

 private:
  std::string url_;
  ObjectLocation loc_;
  S3Client client_;
  std::string etag_;
  uint64_t size_ = 0;
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

}  // namespace zckpt::remote

namespace zckpt {

bool IsObjectUrl(std::string_view path) { return remote::IsObjectUrl(path); }
bool ObjectExists(const std::string& url) { return remote::ObjectExists(url); }

}  // namespace zckpt
