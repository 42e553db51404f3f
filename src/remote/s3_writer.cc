// ObjectWriter: a multipart upload. The first part stays in memory until Commit (so the bytes
// at its start can still be rewritten: a container's superblock); later parts are uploaded as
// they fill, `connections` at once. An object that fits in one part is one PUT at Commit.
#include <curl/curl.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <future>
#include <map>
#include <vector>

#include "remote/s3.h"
#include "remote/s3_client.h"
#include "zckpt/error.h"

namespace zckpt::remote {

namespace {

uint64_t PartBytes() {
  // S3 wants parts of at least 5 MiB (all but the last) and at most 10000 of them.
  const char* v = std::getenv("ZCKPT_S3_PART_MB");
  uint64_t mb = v ? std::strtoull(v, nullptr, 10) : 16;
  return std::max<uint64_t>(mb, 5) << 20;
}

}  // namespace

struct ObjectWriter::Impl {
  Impl(const std::string& u) : url(u), loc(ParseObjectUrl(u)), client(LoadS3Config()), part_bytes(PartBytes()) {
    first.reserve(part_bytes);
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
    r.query = "partNumber=" + std::to_string(number) + "&uploadId=" + upload_id;
    r.upload = bytes.data();
    r.upload_bytes = bytes.size();
    Response resp = client.PerformRetrying(r, {});
    if (!Ok(resp)) Fail("part " + std::to_string(number), resp);
    if (resp.etag.empty()) throw Error(ErrorKind::kIo, "cannot write " + url + ": part " + std::to_string(number) + " got no ETag");
    return resp.etag;
  }

  void Reap(size_t keep) {
    while (in_flight.size() > keep) {
      auto [number, fut] = std::move(in_flight.front());
      in_flight.pop_front();
      etags[number] = fut.get();
    }
  }

  void QueuePart(std::vector<uint8_t> bytes) {
    if (upload_id.empty()) Start();
    int number = next_part++;
    Reap(client.config().connections - 1);
    in_flight.emplace_back(number, std::async(std::launch::async, [this, number, b = std::move(bytes)] {
                             return SendPart(number, b);
                           }));
  }

  void Write(const uint8_t* p, size_t n) {
    while (n > 0) {
      std::vector<uint8_t>& into = first.size() < part_bytes && next_part == 2 && current.empty() ? first : current;
      size_t take = std::min<uint64_t>(n, part_bytes - into.size());
      into.insert(into.end(), p, p + take);
      p += take;
      n -= take;
      position += take;
      if (&into == &current && current.size() == part_bytes) {
        QueuePart(std::move(current));
        current = {};
        current.reserve(part_bytes);
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
    in_flight.emplace_front(1, std::async(std::launch::async, [this] { return SendPart(1, first); }));
    Reap(0);
    std::string xml = "<CompleteMultipartUpload>";
    for (auto& [number, etag] : etags)
      xml += "<Part><PartNumber>" + std::to_string(number) + "</PartNumber><ETag>" + etag + "</ETag></Part>";
    xml += "</CompleteMultipartUpload>";
    Request r;
    r.method = "POST";
    r.bucket = loc.bucket;
    r.key = loc.key;
    r.query = "uploadId=" + upload_id;
    r.upload = reinterpret_cast<const uint8_t*>(xml.data());
    r.upload_bytes = xml.size();
    r.headers = {"Content-Type: application/xml"};
    Response resp = client.PerformRetrying(r, {});
    if (!Ok(resp)) Fail("CompleteMultipartUpload", resp);
    done = true;
  }

  void Abort() noexcept {
    try {
      for (auto& f : in_flight) f.second.wait();
    } catch (...) {
    }
    in_flight.clear();
    if (done || upload_id.empty()) return;
    try {
      Request r;
      r.method = "DELETE";
      r.bucket = loc.bucket;
      r.key = loc.key;
      r.query = "uploadId=" + upload_id;
      (void)client.PerformRetrying(r, {});
    } catch (...) {
    }
    upload_id.clear();
  }

  std::string url;
  ObjectLocation loc;
  S3Client client;
  uint64_t part_bytes;
  std::vector<uint8_t> first, current;
  uint64_t position = 0;
  int next_part = 2;
  std::string upload_id;
  std::deque<std::pair<int, std::future<std::string>>> in_flight;
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
    impl_->Commit();
  } catch (...) {
    impl_->Abort();
    throw;
  }
}

void ObjectWriter::Abort() { impl_->Abort(); }
const std::string& ObjectWriter::url() const { return impl_->url; }

}  // namespace zckpt::remote
