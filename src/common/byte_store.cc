#include "common/byte_store.h"

#include <mutex>
#include <deque>

namespace zckpt {

namespace {

struct Stores {
  std::mutex mu;
  std::deque<ByteStore> list;  // registered at load, never removed (addresses stay valid)
};

Stores& All() {
  static Stores* stores = new Stores;  // never freed: stores are asked for until exit
  return *stores;
}

}  // namespace

bool RegisterByteStore(const ByteStore& store) {
  Stores& s = All();
  std::lock_guard<std::mutex> lock(s.mu);
  for (ByteStore& known : s.list)
    if (known.scheme == store.scheme) return (known = store), true;
  s.list.push_back(store);
  return true;
}

const ByteStore* ByteStoreFor(std::string_view path) {
  Stores& s = All();
  std::lock_guard<std::mutex> lock(s.mu);
  for (const ByteStore& known : s.list)
    if (path.substr(0, known.scheme.size()) == known.scheme) return &known;
  return nullptr;
}

}  // namespace zckpt
