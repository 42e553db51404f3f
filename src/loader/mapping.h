// The read-write private mapping of a container's file that mapped storages alias (Map, and the
// Python module's torch-free `_core`): unmapped when the last holder lets go. Made from the
// container's own descriptor: the file whose index was validated, whatever the path names by now.
//
// Like torch.load(mmap=True), views of it read the file when touched: bytes another process
// rewrites later show through (until a page is written: copy on write), and touching a page after
// another process truncated the file raises SIGBUS (include/zckpt/loader.h, Map).
#pragma once

#include <cstddef>
#include <cstdint>

namespace zckpt {
class Container;
}

namespace zckpt::loader {

class Mapping {
 public:
  // Error(kInvalidArgument) for a container in object storage or opened from memory; kIo when
  // mmap fails.
  explicit Mapping(const Container& c);
  ~Mapping();
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  uint8_t* data() const { return data_; }

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace zckpt::loader
