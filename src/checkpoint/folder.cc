#include "checkpoint/folder.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "common/atomic_file.h"
#include "common/mapped_file.h"
#include "common/open_file.h"
#include "common/stale_temps.h"
#include "remote/s3.h"
#include "zckpt/error.h"
#include "zckpt/object_store.h"

namespace zckpt::checkpoint {

namespace fs = std::filesystem;

bool IsRemote(std::string_view path) { return remote::IsObjectUrl(path); }

bool IsFolder(const std::string& path) {
  if (IsRemote(path)) return IsObjectFolder(path);
  std::error_code ec;
  return fs::is_directory(path, ec);
}

std::string WithoutTrailingSlash(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

std::string InFolder(const std::string& folder, const std::string& name) {
  if (folder.empty()) return name;
  return folder.back() == '/' ? folder + name : folder + "/" + name;
}

std::vector<FolderFile> FolderFiles(const std::string& folder, bool recursive) {
  std::vector<FolderFile> out;
  if (IsRemote(folder)) {
    for (ObjectEntry& e : ListObjects(folder)) {
      if (e.name.empty() || e.name.back() == '/') continue;  // a console's "folder" marker
      if (!recursive && e.name.find('/') != std::string::npos) continue;
      out.push_back(FolderFile{std::move(e.name), e.size});
    }
    return out;  // ListObjects sorts
  }
  std::error_code ec;
  auto add = [&](const fs::directory_entry& entry) {
    std::error_code fec;
    if (!entry.is_regular_file(fec)) return;  // follows a link to a file; a FIFO or device is not one
    const std::string name = entry.path().filename().string();
    if (name.find(kTempMarker) != std::string::npos) return;  // a writer's temporary, live or stale
    uint64_t size = entry.file_size(fec);
    // Lexically: a link to a file elsewhere (a Hugging Face cache snapshot) keeps its own name.
    out.push_back(FolderFile{entry.path().lexically_relative(folder).generic_string(), fec ? 0 : size});
  };
  if (recursive) {
    fs::recursive_directory_iterator it(folder, fs::directory_options::none, ec), end;
    for (; !ec && it != end; it.increment(ec)) add(*it);
  } else {
    fs::directory_iterator it(folder, ec), end;
    for (; !ec && it != end; it.increment(ec)) add(*it);
  }
  if (ec) throw Error(ErrorKind::kIo, folder + ": cannot walk the folder: " + ec.message());
  std::sort(out.begin(), out.end(), [](const FolderFile& a, const FolderFile& b) { return a.name < b.name; });
  return out;
}

bool FileExists(const std::string& path) {
  if (IsRemote(path)) return ObjectExists(path);
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::shared_ptr<const MappedFile> OpenFile(const std::string& path) {
  if (IsRemote(path)) return std::make_shared<const MappedFile>(remote::OpenObject(path));
  return std::make_shared<const MappedFile>(path);
}

std::shared_ptr<const MappedFile> OpenMappedFile(const std::string& path, const std::string& what) {
  if (IsRemote(path))
    throw Error(ErrorKind::kUnsupported,
                path + ": " + what + " in object storage is not read in place (its parser reads a local mapping): "
                       "download it, or convert it to a .zckpt container (zckpt convert) and put that beside it");
  return OpenFile(path);
}

std::string ReadWholeFile(const std::string& path, uint64_t max_bytes) {
  if (IsRemote(path)) return ReadObject(path, max_bytes);
  MappedFile in(path);
  if (in.size() > max_bytes)
    throw Error(ErrorKind::kIo, path + ": " + std::to_string(in.size()) + " bytes, more than the " +
                                    std::to_string(max_bytes) + " this read takes");
  std::string text(in.size(), '\0');  // read once, privately (a FIFO was refused by the open)
  in.ReadAt(0, text.size(), text.data());
  return text;
}

std::string ReadFileStart(const std::string& path, uint64_t n) {
  if (IsRemote(path)) return remote::ReadObjectStart(path, n);
  struct stat st;
  FileDescriptor fd = OpenRegularFile(path, &st);  // a FIFO or device node is not opened
  std::string head(n, '\0');
  ssize_t got = ::pread(fd.get(), head.data(), n, 0);
  head.resize(got > 0 ? static_cast<size_t>(got) : 0);
  return head;
}

OutputFile::OutputFile(const std::string& destination) {
  if (IsRemote(destination)) object_ = std::make_unique<remote::ObjectWriter>(destination);
  else file_ = std::make_unique<AtomicFile>(destination);
}

OutputFile::~OutputFile() = default;

void OutputFile::Write(const void* data, size_t n) {
  if (object_) object_->Write(data, n);
  else file_->Write(data, n);
}

void OutputFile::Commit() {
  if (object_) object_->Commit();
  else file_->Commit();
}

void WriteWholeFile(const std::string& path, std::string_view bytes) {
  OutputFile out(path);
  out.Write(bytes.data(), bytes.size());
  out.Commit();
}

void CopyFileTo(const std::string& from, const std::string& to) {
  std::shared_ptr<const MappedFile> in = OpenFile(from);  // only ReadAt: the mapping stays untouched
  OutputFile out(to);
  std::vector<uint8_t> piece;
  constexpr uint64_t kPiece = 4ull << 20;
  for (uint64_t off = 0; off < in->size(); off += kPiece) {
    uint64_t n = std::min<uint64_t>(kPiece, in->size() - off);
    piece.resize(n);
    in->ReadAt(off, n, piece.data());
    out.Write(piece.data(), n);
  }
  out.Commit();
}

}  // namespace zckpt::checkpoint
