#include "loader/ring.h"

#include "loader/copy_engine.h"

namespace zckpt::loader {

Ring::Ring(CopyEngine& engine, unsigned slots, uint64_t capacity) : engine_(engine), capacity_(capacity) {
  buffers_.reserve(slots);
  try {
    for (unsigned i = 0; i < slots; ++i) {
      buffers_.push_back(engine_.AllocateHost(capacity));
      free_.Push(i);
    }
  } catch (...) {
    for (uint8_t* p : buffers_) engine_.FreeHost(p);
    throw;
  }
}

Ring::~Ring() {
  for (uint8_t* p : buffers_) engine_.FreeHost(p);
}

}  // namespace zckpt::loader
