// S3-compatible object storage over libcurl: configuration as the AWS tools read it, signed
// requests with retries, objects read as a ByteSource, multipart uploads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/byte_source.h"
#include "common/byte_store.h"
#include "zckpt/object_store.h"

namespace zckpt::remote {

// Reader threads a loader runs for an object (each hands its batches' reads to the request
// pool, which keeps the requests in flight): at most S3Config::connections.
inline constexpr unsigned kObjectReaderThreads = 8;

// True for "s3://..." (the only scheme so far).
bool IsObjectUrl(std::string_view path);

struct ObjectLocation {
  std::string bucket, key;
};
// "s3://bucket/rest" -> {bucket, rest} (rest may be empty); Error(kInvalidArgument) without a bucket.
ObjectLocation SplitObjectUrl(const std::string& url);
// "s3://bucket/key" -> {bucket, key}; Error(kInvalidArgument) when either is empty.
ObjectLocation ParseObjectUrl(const std::string& url);

struct S3Config {
  std::string endpoint;  // "http://127.0.0.1:9000" (custom: path-style) or "" (AWS: virtual-host)
  std::string region = "us-east-1";
  std::string access_key, secret_key, session_token;  // empty access_key: unsigned requests
  bool path_style = false;
  unsigned attempts = 5;        // tries per request (transient failures), and per chunk re-fetch
  double backoff_s = 0.2;       // first wait; doubled each retry, capped at 5 s, with jitter
  long timeout_s = 30;          // no byte for this long: the attempt fails (a stalled server)
  long connect_timeout_s = 10;
  // Requests in flight at most (ZCKPT_S3_CONNECTIONS): the cap the request pool grows toward
  // while throughput grows (remote/s3_pool.h), for reads and uploads alike.
  unsigned connections = 64;
  uint64_t get_bytes = 4 << 20;  // a read is split into ranged GETs of about this (ZCKPT_S3_GET_MB)
  unsigned uploads = 24;         // parts of one upload in flight at most (ZCKPT_S3_UPLOADS)
  // An upload's parts start at this (ZCKPT_S3_PART_MB; at least 5 MiB, S3's least): small, since
  // the parts in flight are held in memory and the last ones finish one by one at a connection's
  // speed (s3_writer.cc doubles it every 2000 parts, for S3's 10000).
  uint64_t part_bytes = 5 << 20;
  // A writer that committed aborts the unfinished multipart uploads of its key begun at least
  // this long ago: those of writers killed before they could abort their own (6 h: longer
  // than any live upload; S3 keeps and bills their parts until aborted).
  long stale_upload_s = 6 * 3600;
};

// From the environment and the shared files, as the AWS CLI/SDKs read them:
// AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL (or endpoint_url in the profile of ~/.aws/config),
// AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN (else the profile's keys in
// ~/.aws/credentials, AWS_SHARED_CREDENTIALS_FILE), AWS_REGION / AWS_DEFAULT_REGION (else the
// profile's region in ~/.aws/config, AWS_CONFIG_FILE), AWS_PROFILE (default "default").
// zckpt's own: ZCKPT_S3_ADDRESSING=path|virtual, ZCKPT_S3_ATTEMPTS, ZCKPT_S3_BACKOFF (seconds),
// ZCKPT_S3_TIMEOUT (seconds without progress), ZCKPT_S3_CONNECTIONS, ZCKPT_S3_GET_MB,
// ZCKPT_S3_UPLOADS, ZCKPT_S3_PART_MB, ZCKPT_S3_STALE_UPLOAD_S.
S3Config LoadS3Config();

// "s3://bucket/prefix" taken as a folder: {bucket, "prefix/"} (a '/' added where missing;
// key "" for the bucket's root, "s3://bucket" or "s3://bucket/").
ObjectLocation ParseFolderUrl(const std::string& url);

// Every object whose key starts with the folder's prefix (ListObjectsV2, page after page), its
// name relative to the folder ("a/b.zckpt"), sorted by name. An empty folder: an empty list.
std::vector<ObjectEntry> ListFolder(const std::string& url);

// The whole object (HEAD, then GETs pinned to its ETag); Error(kIo) when it is larger than
// max_bytes (a metadata file is small: this is not how containers are read).
std::string ReadWholeObject(const std::string& url, uint64_t max_bytes);

// Writes the object in one piece (one PUT, or a multipart upload when large): it appears whole
// or not at all, replacing what the key held.
void PutObject(const std::string& url, const void* data, size_t n);

// The object's first n bytes (fewer when it is shorter) in one ranged GET, no HEAD: what a
// folder scan reads to tell a container by its magic. Error(kIo) when refused.
std::string ReadObjectStart(const std::string& url, uint64_t n);

// HEAD: true for 2xx, false for 404, Error(kIo) otherwise.
bool ObjectExists(const std::string& url);

// Opens the object at `url` (HEAD): its size and ETag are pinned; every read is a ranged GET
// with If-Match on that ETag, retried with backoff on 5xx/429, resets, stalls and short bodies.
// A replaced object is Error(kIo) saying so. Errors name the URL and the byte range.
std::unique_ptr<ByteSource> OpenObject(const std::string& url);

// The size of an upload's part `number` (2 and on; part 1 is 5 MiB, held to Commit): `base`
// (S3Config::part_bytes, at least S3's 5 MiB) doubled every 2000 parts, so 10000 parts, S3's
// most, hold 310 GiB at the 5 MiB default.
uint64_t UploadPartBytes(uint64_t base, int number);

// Writes an object with a multipart upload: parts are sent as they fill (several at once); the
// object appears only at Commit (CompleteMultipartUpload). Destroyed or aborted before Commit,
// the upload is aborted and whatever the key held before is untouched.
// The s3:// store's ByteSink (common/byte_store.h).
class ObjectWriter final : public ByteSink {
 public:
  explicit ObjectWriter(const std::string& url);
  ~ObjectWriter() override;
  ObjectWriter(const ObjectWriter&) = delete;
  ObjectWriter& operator=(const ObjectWriter&) = delete;

  void Write(const void* data, size_t n) override;
  // Overwrites [offset, offset + n) of what was written; must lie in the first part (kept in
  // memory until Commit for that): the container's superblock, rewritten at the end.
  void WriteAt(uint64_t offset, const void* data, size_t n) override;
  uint64_t position() const override;
  void Commit() override;
  void Abort() override;
  const std::string& url() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zckpt::remote
