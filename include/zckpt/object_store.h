// Containers in S3-compatible object storage: `s3://BUCKET/KEY` is taken wherever a container
// path is (Container::Open, Load, LoadInto, Verify, `zckpt ls/verify/load`) and as a destination
// (ContainerWriter: zckpt.save, `zckpt convert -o`), configured from the AWS environment
// variables and shared files (src/remote/README.md).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace zckpt {

// True for an object URL ("s3://...").
bool IsObjectUrl(std::string_view path);
// True when the object exists (HEAD answers 2xx), false when it does not (404); Error(kIo)
// naming the URL for anything else (wrong credentials, unreachable endpoint).
bool ObjectExists(const std::string& url);

// Folders: the objects whose keys start with "PREFIX/" of s3://BUCKET/PREFIX (a converted
// checkpoint folder, a DCP checkpoint, a verl checkpoint uploaded as a tree).
struct ObjectEntry {
  std::string name;   // relative to the folder: "model-00001-of-00002.zckpt", "actor/.metadata"
  uint64_t size = 0;
};
// Every object under the folder, sorted by name, however many listing pages that takes.
std::vector<ObjectEntry> ListObjects(const std::string& folder_url);
// True when `url` is to be taken as a folder: it ends in '/', or no object has that key and
// objects exist under it + '/'.
bool IsObjectFolder(const std::string& url);
// A small object whole (metadata, an index): Error(kIo) naming it when larger than max_bytes.
std::string ReadObject(const std::string& url, uint64_t max_bytes = uint64_t{1} << 30);
// Puts `bytes` at `url` in one piece: the object appears whole or not at all.
void WriteObject(const std::string& url, std::string_view bytes);

}  // namespace zckpt
