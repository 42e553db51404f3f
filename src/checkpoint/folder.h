// Checkpoint folders and their files, wherever they live: a local directory, or an object-storage
// prefix (s3://BUCKET/PREFIX/: zckpt/object_store.h). verify, merge and convert list, read and
// write folders through these alone, so an s3:// folder is taken wherever a local one is.
//
// A path is a local path or an s3:// URL. Names inside a folder are relative and '/'-separated
// ("actor/.metadata"). Writes are atomic per file either way: AtomicFile locally (temporary,
// fsync, rename), a multipart upload completed at Commit for an object.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace zckpt {
class AtomicFile;
class MappedFile;
namespace remote {
class ObjectWriter;
}
}  // namespace zckpt

namespace zckpt::checkpoint {

// An s3:// URL (else a local path).
bool IsRemote(std::string_view path);

// A local directory, or an object-storage prefix holding objects (zckpt::IsObjectFolder).
bool IsFolder(const std::string& path);

// `name` inside `folder`, joined with exactly one '/' ("s3://b/p/" + "x" -> "s3://b/p/x").
std::string InFolder(const std::string& folder, const std::string& name);

// `path` without trailing '/' (but "/" stays "/"): the form folders are named by in messages
// and joined from.
std::string WithoutTrailingSlash(std::string path);

struct FolderFile {
  std::string name;  // relative to the folder, '/'-separated
  uint64_t size = 0;
};

// The files of `folder`, sorted by name: its own only, or (`recursive`) every one below it.
// Locally: regular files (symbolic links to files followed, links to folders not walked);
// writers' temporaries (".zckpt-tmp-") are left out. An object folder: every object under the
// prefix (keys ending in '/', console "folder" markers, left out). Error(kIo) naming the folder
// when it cannot be walked or listed.
std::vector<FolderFile> FolderFiles(const std::string& folder, bool recursive);

// A regular file (locally; a FIFO or device is not), or an existing object.
bool FileExists(const std::string& path);

// The file opened for reading (common/mapped_file.h): mapped locally; an object is read through
// ranged GETs (no mapping: data() is nullptr, ReadAt reads it).
std::shared_ptr<const MappedFile> OpenFile(const std::string& path);

// A file that its parser reads through the mapping (a .pt or .distcp file): a local one is
// opened as OpenFile does; an object is Error(kUnsupported) naming it, saying what it is
// (`what`: "a torch.save (.pt) rank file") and to download it or convert it to .zckpt first.
std::shared_ptr<const MappedFile> OpenMappedFile(const std::string& path, const std::string& what);

// A small file whole (metadata, an index, a config): Error(kIo) naming it when larger than max_bytes.
std::string ReadWholeFile(const std::string& path, uint64_t max_bytes = uint64_t{1} << 30);

// A file's first n bytes (fewer when it is shorter): a local regular file read once (a FIFO
// or device is Error(kIo)), an object one ranged GET (no HEAD, no open).
std::string ReadFileStart(const std::string& path, uint64_t n);

// A file written so that its name shows it only whole: AtomicFile locally, an ObjectWriter
// (multipart upload, completed at Commit) for an object. Destroyed before Commit: nothing is
// left at the destination, which keeps what it held.
class OutputFile {
 public:
  explicit OutputFile(const std::string& destination);
  ~OutputFile();
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;
  void Write(const void* data, size_t n);
  void Commit();

 private:
  std::unique_ptr<AtomicFile> file_;
  std::unique_ptr<remote::ObjectWriter> object_;
};

void WriteWholeFile(const std::string& path, std::string_view bytes);

// `from` copied to `to` (either may be an object), the destination appearing only complete; a
// source that shrinks while it is read is an Error(kIo) naming it.
void CopyFileTo(const std::string& from, const std::string& to);

}  // namespace zckpt::checkpoint
