// ObjectWriter: a multipart upload. The first part (5 MiB) stays in memory until Commit (so
// the bytes at its start can still be rewritten: a container's superblock); later parts are
// uploaded as they fill, S3Config::uploads at once on the request pool (s3_pool.h). An object
// that fits in the first part is one PUT at Commit. The upload's last parts finish one by one
// at a connection's speed, so parts are small (the tail is short) and grow only where S3's
// 10000 parts would not hold the object otherwise (UploadPartBytes).
#include <curl/curl.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <deque>
#include <future>
#include <map>
#include <memory>
#include <vector>

#include "remote/s3.h"
#include "remote/s3_client.h"
#include "remote/s3_pool.h"
#include "zckpt/error.h"

namespace zckpt::remote {

namespace {

// S3 wants parts of at least this (all but the last), and at most 10000 of them.
constexpr uint64_t kMinPartBytes = 5 << 20;
// Parts of one size before the size doubles: with S3Config::part_bytes 5 MiB, the first 10 GiB
// go in 5 MiB parts, the next 20 GiB in 10 MiB, ...
constexpr int kPartsPerSize = 2000;

// "2026-12-02T06:10:00.000Z" (S3's Initiated) as seconds since the epoch; -1 if unreadable.
long long IsoSeconds(const std::string& s) {
  std::tm tm{};
  if (std::sscanf(s.c_str(), "%d-%d-%dT%d:%d:%d", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour, &tm.tm_min,
                  &tm.tm_sec) != 6)
    return -1;
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  return static_cast<long long>(timegm(&tm));
}

}  // namespace

uint64_t UploadPartBytes(uint64_t base, int number) {
  return std::max(base, kMinPartBytes) << std::min(std::max(number - 2, 0) / kPartsPerSize, 16);
}

struct ObjectWriter::Impl {
  // The first part is the smallest S3 takes: it is held until Commit and then sent alone while
  // the last parts finish, so its size is the upload's tail.
  Impl(const std::string& u)
      : url(u), loc(ParseObjectUrl(u)), client(LoadS3Config()), first_bytes(kMinPartBytes) {
    first.reserve(first_bytes);
  }

  std::string Where() const { return url; }

  [[noreturn]] void Fail(const std::string& what, const Response& r) const {
    throw Error(ErrorKind::kIo, "cannot write " + url + ": " + what + ": " + r.Describe() +
                                    Advice(r));
  }

  bool Ok(const Response& r) const { return r.curl_code == CURLE_OK && r.status / 100 == 2 && r.body.find("<Error>") == std::string::npos; }

  void Start() {
    Request r;
    r.method = "POST";
    r.bucket = loc.bucket;
    r.key = loc.key;
    r.query = "uploads=";
    Response resp = client.PerformRetrying(r, {});
    if (!Ok(resp)) Fail("CreateMultipartUpload", resp);
    upload_id = XmlValue(resp.body, "UploadId");
    if (upload_id.empty()) throw Error(ErrorKind::kIo, "cannot write " + url + ": CreateMultipartUpload gave no UploadId");
  }

  std::string SendPart(int number, const std::vector<uint8_t>& bytes) const {
    Request r;
    r.method = "PUT";
    r.bucket = loc.bucket;
    r.key = loc.key;
    r.query = "partNumber=" + std::to_string(number) + "&uploadId=" + PercentEncode(upload_id, false);
    r.upload = bytes.data();
    r.upload_bytes = bytes.size();
    Response resp = client.PerformRetrying(r, {});
    if (!Ok(resp)) Fail("part " + std::to_string(number), resp);
    if (resp.etag.empty()) throw Error(ErrorKind::kIo, "cannot write " + url + ": part " + std::to_string(number) + " got no ETag");
    return resp.etag;
  }

  void Reap(size_t keep) {
    while (in_flight.size() > keep) {
      InFlight part = std::move(in_flight.front());
      in_flight.pop_front();
      part.sent.get();
      etags[part.number] = *part.etag;
    }
  }

  // Part `number` sent on the request pool (its bytes kept by the task until it has run).
  void Send(int number, std::shared_ptr<const std::vector<uint8_t>> bytes, bool front = false) {
    auto etag = std::make_shared<std::string>();
    std::future<void> sent = RequestPool::Instance().Start(
        [this, number, bytes, etag] { *etag = SendPart(number, *bytes); }, client.config().connections);
    InFlight part{number, etag, std::move(sent)};
    if (front) in_flight.push_front(std::move(part));
    else in_flight.push_back(std::move(part));
  }

  void QueuePart(std::vector<uint8_t> bytes) {
    if (upload_id.empty()) Start();
    int number = next_part++;
    Reap(client.config().uploads - 1);
    Send(number, std::make_shared<const std::vector<uint8_t>>(std::move(bytes)));
  }

  // The size of the part `current` fills (part next_part).
  uint64_t NextPartBytes() const { return UploadPartBytes(client.config().part_bytes, next_part); }

  void Write(const uint8_t* p, size_t n) {
    while (n > 0) {
      std::vector<uint8_t>& into = first.size() < first_bytes && next_part == 2 && current.empty() ? first : current;
      const uint64_t part_bytes = NextPartBytes();
      size_t take = std::min<uint64_t>(n, (&into == &first ? first_bytes : part_bytes) - into.size());
      into.insert(into.end(), p, p + take);
      p += take;
      n -= take;
      position += take;
      if (&into == &current && current.size() == part_bytes) {
        QueuePart(std::move(current));
        current = {};
        current.reserve(NextPartBytes());
      }
    }
  }

  // Commits, then aborts what StaleUploads finds: its listing runs beside the last parts
  // (it asks only for uploads begun stale_upload_s ago, never this one), not after them.
  void CommitAndSweep() {
    std::future<std::vector<std::string>> stale = std::async(std::launch::async, [this] { return StaleUploads(); });
    try {
      Commit();
    } catch (...) {
      stale.wait();
      throw;
    }
    for (const std::string& id : stale.get()) {
      try {
        AbortUpload(id);
      } catch (...) {  // best effort: the object is already committed
      }
    }
  }

  void Commit() {
    if (upload_id.empty() && current.empty()) {  // one part: a single PUT
      Request r;
      r.method = "PUT";
      r.bucket = loc.bucket;
      r.key = loc.key;
      r.upload = first.data();
      r.upload_bytes = first.size();
      Response resp = client.PerformRetrying(r, {});
      if (!Ok(resp)) Fail("PUT", resp);
      done = true;
      return;
    }
    if (!current.empty()) QueuePart(std::move(current));
    if (upload_id.empty()) Start();
    Send(1, std::shared_ptr<const std::vector<uint8_t>>(&first, [](const std::vector<uint8_t>*) {}), /*front=*/true);
    Reap(0);
    std::string xml = "<CompleteMultipartUpload>";
    for (auto& [number, etag] : etags)
      xml += "<Part><PartNumber>" + std::to_string(number) + "</PartNumber><ETag>" + etag + "</ETag></Part>";
    xml += "</CompleteMultipartUpload>";
    Request r;
    r.method = "POST";
    r.bucket = loc.bucket;
    r.key = loc.key;
    r.query = "uploadId=" + PercentEncode(upload_id, false);
    r.upload = reinterpret_cast<const uint8_t*>(xml.data());
    r.upload_bytes = xml.size();
    r.headers = {"Content-Type: application/xml"};
    Response resp = client.PerformRetrying(r, {});
    if (!Ok(resp)) Fail("CompleteMultipartUpload", resp);
    done = true;
  }

  // The unfinished uploads of this key that a killed writer left (only a live process can
  // abort its own), begun stale_upload_s or more ago, aborted by the next writer to commit:
  // what the sweep of stale temporaries does for a local folder. Best effort (the object is
  // already committed): a failure here is silent, an empty list.
  std::vector<std::string> StaleUploads() const noexcept {
    std::vector<std::string> ids;
    try {
      Request list;
      list.bucket = loc.bucket;
      list.query = "prefix=" + PercentEncode(loc.key, false) + "&uploads=";
      list.max_body = 16u << 20;
      Response resp = client.PerformRetrying(list, {});
      if (!Ok(resp)) return ids;
      const long long now = static_cast<long long>(std::time(nullptr));
      for (size_t at = resp.body.find("<Upload>"); at != std::string::npos; at = resp.body.find("<Upload>", at + 1)) {
        std::string one = resp.body.substr(at, resp.body.find("</Upload>", at) - at);
        std::string id = XmlUnescape(XmlValue(one, "UploadId"));
        long long began = IsoSeconds(XmlValue(one, "Initiated"));
        if (XmlUnescape(XmlValue(one, "Key")) != loc.key || id.empty() || began < 0 ||
            now - began < client.config().stale_upload_s)
          continue;
        ids.push_back(id);
      }
    } catch (...) {
    }
    return ids;
  }

  void Abort() noexcept {
    try {
      for (InFlight& f : in_flight) f.sent.wait();
    } catch (...) {
    }
    in_flight.clear();
    if (done || upload_id.empty()) return;
    try {
      AbortUpload(upload_id);
    } catch (...) {
    }
    upload_id.clear();
  }

  // AbortMultipartUpload (its answer unused: an upload that is gone is as good as aborted).
  void AbortUpload(const std::string& id) const {
    Request r;
    r.method = "DELETE";
    r.bucket = loc.bucket;
    r.key = loc.key;
    r.query = "uploadId=" + PercentEncode(id, false);
    (void)client.PerformRetrying(r, {});
  }

  std::string url;
  ObjectLocation loc;
  S3Client client;
  uint64_t first_bytes;
  std::vector<uint8_t> first, current;
  uint64_t position = 0;
  int next_part = 2;
  std::string upload_id;
  struct InFlight {
    int number;
    std::shared_ptr<std::string> etag;  // set by the task
    std::future<void> sent;
  };
  std::deque<InFlight> in_flight;
  std::map<int, std::string> etags;
  bool done = false;
};

ObjectWriter::ObjectWriter(const std::string& url) : impl_(std::make_unique<Impl>(url)) {}
ObjectWriter::~ObjectWriter() { impl_->Abort(); }

void ObjectWriter::Write(const void* data, size_t n) {
  if (impl_->done) throw Error(ErrorKind::kInvalidArgument, impl_->url + ": written after commit");
  try {
    impl_->Write(static_cast<const uint8_t*>(data), n);
  } catch (...) {
    impl_->Abort();
    throw;
  }
}

void ObjectWriter::WriteAt(uint64_t offset, const void* data, size_t n) {
  if (offset + n > impl_->first.size())
    throw Error(ErrorKind::kInvalidArgument, impl_->url + ": a rewrite past the first part of an upload");
  std::memcpy(impl_->first.data() + offset, data, n);
}

uint64_t ObjectWriter::position() const { return impl_->position; }

void ObjectWriter::Commit() {
  try {
    impl_->CommitAndSweep();
  } catch (...) {
    impl_->Abort();
    throw;
  }
}

void ObjectWriter::Abort() { impl_->Abort(); }
const std::string& ObjectWriter::url() const { return impl_->url; }

}  // namespace zckpt::remote
