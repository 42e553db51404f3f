#include "torch_pickle.h"

namespace zckpt::testing {

namespace {

void Unicode(std::string& out, const std::string& s) {
  out += 'X';
  for (int i = 0; i < 4; ++i) out += static_cast<char>((s.size() >> (8 * i)) & 0xFF);
  out += s;
}

// LONG1: little-endian two's complement, as short as it goes.
void Int(std::string& out, int64_t v) {
  std::string bytes;
  for (int i = 0; i < 8; ++i) bytes += static_cast<char>((static_cast<uint64_t>(v) >> (8 * i)) & 0xFF);
  while (bytes.size() > 1) {
    char last = bytes.back(), prev = bytes[bytes.size() - 2];
    bool redundant = (last == 0 && !(prev & 0x80)) || (last == static_cast<char>(0xFF) && (prev & 0x80));
    if (!redundant) break;
    bytes.pop_back();
  }
  out += '\x8a';
  out += static_cast<char>(bytes.size());
  out += bytes;
}

void IntTuple(std::string& out, const std::vector<int64_t>& v) {
  out += '(';
  for (int64_t x : v) Int(out, x);
  out += 't';
}

}  // namespace

std::string TorchStateDictPickle(const std::vector<PickledStorage>& storages, const std::vector<PickledTensor>& tensors) {
  std::string out = "\x80\x02}(";
  for (const PickledTensor& t : tensors) {
    const PickledStorage& s = storages.at(t.storage);
    Unicode(out, t.name);
    out += "ctorch._utils\n_rebuild_tensor_v2\n(";
    out += '(';
    Unicode(out, "storage");
    out += "ctorch\n" + s.storage_class + "\n";
    Unicode(out, s.key);
    Unicode(out, s.location);
    Int(out, static_cast<int64_t>(s.numel));
    out += "tQ";  // TUPLE, BINPERSID
    Int(out, t.storage_offset);
    IntTuple(out, t.shape);
    IntTuple(out, t.stride);
    out += t.requires_grad ? '\x88' : '\x89';
    out += "ccollections\nOrderedDict\n)R";
    out += "tR";  // the args tuple, REDUCE
  }
  out += "u.";
  return out;
}

}  // namespace zckpt::testing
