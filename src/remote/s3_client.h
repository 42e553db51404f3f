// One signed S3 request over libcurl (a per-thread easy handle, so connections are reused), and
// the retry loop every caller shares. Internal to src/remote.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "remote/s3.h"

namespace zckpt::remote {

struct Request {
  std::string method = "GET";  // GET, HEAD, PUT, POST, DELETE
  std::string bucket, key;
  std::string query;  // "uploadId=...&partNumber=1" (already encoded), or ""
  std::vector<std::string> headers;
  const uint8_t* upload = nullptr;  // body of PUT/POST
  uint64_t upload_bytes = 0;
  uint8_t* sink = nullptr;  // a 2xx body goes here (at most sink_bytes), else into Response::body
  uint64_t sink_bytes = 0;
  // Or scattered: body bytes [at, at + n) of each piece (sorted, apart) to its dst, the bytes
  // between dropped; sink_bytes is then the whole body's length.
  struct Piece {
    uint64_t at, n;
    uint8_t* dst;
  };
  std::vector<Piece> scatter;
  uint64_t max_body = 64 << 10;  // non-sink bodies kept (a listing page wants more than an error)
};

struct Response {
  int curl_code = 0;        // CURLE_OK or why the transfer failed
  std::string curl_error;   // its text
  long status = 0;          // HTTP status
  std::string body;         // non-sink body (errors, XML replies), capped
  std::string etag;
  uint64_t received = 0;    // bytes written to the sink
  int64_t content_length = -1;  // the Content-Length header (HEAD: the object's size)
  int64_t object_size = -1;     // the size in a ranged GET's Content-Range ("bytes 0-9/SIZE")
  bool transient() const;   // worth another attempt: transfer failed, 5xx, 429/503 SlowDown
  std::string Describe() const;  // "HTTP 403 AccessDenied: ..." / "connection reset: ..."
};

class S3Client {
 public:
  explicit S3Client(S3Config config);
  const S3Config& config() const { return config_; }
  std::string Url(const std::string& bucket, const std::string& key, const std::string& query) const;
  Response Perform(const Request& r) const;
  // Perform, again after a backoff while the response is transient (or `ok` says it is short),
  // at most config().attempts times; returns the last response.
  Response PerformRetrying(const Request& r, const std::function<bool(const Response&)>& ok) const;
  void Backoff(unsigned retry) const;

 private:
  S3Config config_;
};

// One ranged GET of into.size() bytes of the object at `offset` (pinned to `etag` unless empty)
// into `into`, retried; `into` cut to what came (an object ending sooner).
Response FetchRange(const S3Client& client, const ObjectLocation& loc, uint64_t offset, std::string& into,
                    const std::string& etag);

// Percent-encoding as S3 and SigV4 want it: all but unreserved characters (and '/' in a key
// path, keep_slash). A query built of such values in name order is already canonical, which is
// what libcurl signs.
std::string PercentEncode(const std::string& v, bool keep_slash);

// What to check after an error no retry mends (" (check AWS_ACCESS_KEY_ID, ...)"), or "".
std::string Advice(const Response& r);

// XML text with its entities decoded (keys may hold '&', '<'); Error(kIo) on a bad entity.
std::string XmlUnescape(const std::string& s);

// "<Tag>value</Tag>" from an XML reply, or "".
std::string XmlValue(const std::string& xml, const std::string& tag);

}  // namespace zckpt::remote
