// Folders in object storage: a key prefix listed with ListObjectsV2, and small objects read or
// written whole (DCP's .metadata, a converted folder's index).
#include <curl/curl.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>

#include "remote/s3.h"
#include "remote/s3_client.h"
#include "zckpt/error.h"
#include "zckpt/object_store.h"

namespace zckpt::remote {

namespace {

// One page at a time; `limit` > 0 stops after that many entries.
std::vector<ObjectEntry> List(const std::string& url, const ObjectLocation& loc, size_t limit) {
  S3Client client(LoadS3Config());
  // Keys per page: S3's maximum; ZCKPT_S3_LIST_KEYS makes pages small (tests walk the pages).
  const char* env = std::getenv("ZCKPT_S3_LIST_KEYS");
  size_t page = env ? std::clamp<size_t>(std::strtoull(env, nullptr, 10), 1, 1000) : 1000;
  std::vector<ObjectEntry> out;
  std::string token;
  for (;;) {
    Request r;
    r.bucket = loc.bucket;
    // Sorted by name, as SigV4's canonical query wants (libcurl signs the query as given).
    std::string q;
    if (!token.empty()) q += "continuation-token=" + PercentEncode(token, false) + "&";
    q += "list-type=2&max-keys=" + std::to_string(limit ? std::min(limit, page) : page);
    if (!loc.key.empty()) q += "&prefix=" + PercentEncode(loc.key, false);
    r.query = q;
    r.max_body = 64u << 20;
    Response resp = client.PerformRetrying(r, {});
    if (resp.curl_code != CURLE_OK)
      throw Error(ErrorKind::kIo, "cannot list " + url + " after " + std::to_string(client.config().attempts) +
                                      " attempts: " + resp.Describe() + Advice(resp));
    if (resp.status / 100 != 2) throw Error(ErrorKind::kIo, "cannot list " + url + ": " + resp.Describe() + Advice(resp));
    const std::string& xml = resp.body;
    for (size_t at = xml.find("<Contents>"); at != std::string::npos; at = xml.find("<Contents>", at + 1)) {
      size_t end = xml.find("</Contents>", at);
      if (end == std::string::npos) throw Error(ErrorKind::kIo, "cannot list " + url + ": truncated ListObjectsV2 reply");
      std::string one = xml.substr(at, end - at);
      std::string key = XmlUnescape(XmlValue(one, "Key"));
      if (key.size() <= loc.key.size() || key.compare(0, loc.key.size(), loc.key) != 0) continue;
      ObjectEntry e;
      e.name = key.substr(loc.key.size());
      e.size = std::strtoull(XmlValue(one, "Size").c_str(), nullptr, 10);
      out.push_back(std::move(e));
      if (limit && out.size() >= limit) return out;
    }
    if (XmlValue(xml, "IsTruncated") != "true") break;
    token = XmlUnescape(XmlValue(xml, "NextContinuationToken"));
    if (token.empty()) throw Error(ErrorKind::kIo, "cannot list " + url + ": a truncated page without NextContinuationToken");
  }
  std::sort(out.begin(), out.end(), [](const ObjectEntry& a, const ObjectEntry& b) { return a.name < b.name; });
  return out;
}

}  // namespace

ObjectLocation ParseFolderUrl(const std::string& url) {
  ObjectLocation loc = SplitObjectUrl(url);
  if (!loc.key.empty() && loc.key.back() != '/') loc.key += '/';
  return loc;
}

std::vector<ObjectEntry> ListFolder(const std::string& url) { return List(url, ParseFolderUrl(url), 0); }

std::string ReadWholeObject(const std::string& url, uint64_t max_bytes) {
  std::unique_ptr<ByteSource> src = OpenObject(url);
  if (src->size() > max_bytes)
    throw Error(ErrorKind::kIo, url + ": " + std::to_string(src->size()) + " bytes, more than the " +
                                    std::to_string(max_bytes) + " this read takes");
  std::string out(src->size(), '\0');
  src->ReadAt(0, out.size(), out.data());
  return out;
}

void PutObject(const std::string& url, const void* data, size_t n) {
  ObjectWriter w(url);
  w.Write(data, n);
  w.Commit();
}

}  // namespace zckpt::remote

namespace zckpt {

std::vector<ObjectEntry> ListObjects(const std::string& folder_url) { return remote::ListFolder(folder_url); }

bool IsObjectFolder(const std::string& url) {
  if (!url.empty() && url.back() == '/') return true;
  remote::ObjectLocation loc = remote::ParseFolderUrl(url);
  if (loc.key.empty()) return true;  // s3://bucket
  if (ObjectExists(url)) return false;
  return !remote::List(url, loc, 1).empty();
}

std::string ReadObject(const std::string& url, uint64_t max_bytes) { return remote::ReadWholeObject(url, max_bytes); }

void WriteObject(const std::string& url, std::string_view bytes) { remote::PutObject(url, bytes.data(), bytes.size()); }

}  // namespace zckpt
