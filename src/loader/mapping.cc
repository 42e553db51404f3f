#include "loader/mapping.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>

#include "format/container_file.h"
#include "zckpt/container.h"
#include "zckpt/error.h"

namespace zckpt::loader {

using format::internal::ContainerFile;

Mapping::Mapping(const Container& c) : size_(c.file_bytes()) {
  if (ContainerFile::Of(c).remote())
    throw Error(ErrorKind::kInvalidArgument, c.path() + ": an object in object storage cannot be mapped: load it "
                                                        "(zckpt.load without mmap=True), or download it first");
  if (ContainerFile::Of(c).fd() < 0)
    throw Error(ErrorKind::kInvalidArgument, c.path() + ": a container opened from memory cannot be mapped");
  // PROT_WRITE + MAP_PRIVATE: tensors may be written like any CPU tensor; the written pages are
  // copied on write and the file never changes (torch.load(mmap=True) does the same).
  void* p = mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE, ContainerFile::Of(c).fd(), 0);
  if (p == MAP_FAILED) throw Error(ErrorKind::kIo, "cannot mmap " + c.path() + ": " + std::strerror(errno));
  data_ = static_cast<uint8_t*>(p);
}

Mapping::~Mapping() { munmap(data_, size_); }

}  // namespace zckpt::loader
