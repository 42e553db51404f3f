#include "pickle/torch_save_pickle.h"

#include <limits>
#include <map>
#include <string_view>

#include "common/shape.h"
#include "zckpt/error.h"

namespace zckpt::pickle {

namespace {

// torch.storage._dtype_to_storage_type_map (less the quantized types): these dtypes are saved
// through a typed storage class with _rebuild_tensor_v2; every other one (torch.storage.
// _new_dtypes: uint16-64, float8, float4, complex32, bits, bcomplex32) through UntypedStorage
// with _rebuild_tensor_v3.
const char* TypedStorageClass(DType d) {
  switch (d) {
    case DType::kFloat64: return "DoubleStorage";
    case DType::kFloat32: return "FloatStorage";
    case DType::kFloat16: return "HalfStorage";
    case DType::kInt64: return "LongStorage";
    case DType::kInt32: return "IntStorage";
    case DType::kInt16: return "ShortStorage";
    case DType::kInt8: return "CharStorage";
    case DType::kUInt8: return "ByteStorage";
    case DType::kBool: return "BoolStorage";
    case DType::kBFloat16: return "BFloat16Storage";
    case DType::kComplex128: return "ComplexDoubleStorage";
    case DType::kComplex64: return "ComplexFloatStorage";
    default: return nullptr;
  }
}

bool SavedAsUntyped(DType d) {
  switch (d) {
    case DType::kUInt16: case DType::kUInt32: case DType::kUInt64:
    case DType::kFloat8_e4m3fn: case DType::kFloat8_e5m2: case DType::kFloat8_e4m3fnuz:
    case DType::kFloat8_e5m2fnuz: case DType::kFloat8_e8m0fnu: case DType::kFloat4_e2m1fn_x2:
    case DType::kComplex32: case DType::kBComplex32:
    case DType::kBits1x8: case DType::kBits2x4: case DType::kBits4x2: case DType::kBits8: case DType::kBits16:
      return true;
    default: return false;
  }
}

// Python's pickle.Pickler at protocol 2, for the few object kinds torch.save's output for a
// dict of tensors holds. The memo follows Python's: every str, global, tuple (but the empty one)
// and reduced object is memoized when written; an object written again (the same Python object,
// which here means the 'storage' and 'cpu' constants, the rebuild functions, storage classes,
// dtypes and the OrderedDict class) is fetched with BINGET.
class Writer {
 public:
  Writer() { out_ = "\x80\x02"; }

  void EmptyDict() { out_ += '}'; Put(); }
  void Mark() { out_ += '('; }
  void SetItems() { out_ += 'u'; }
  void SetItem() { out_ += 's'; }
  void Stop() { out_ += '.'; }
  void False() { out_ += '\x89'; }
  void EmptyTuple() { out_ += ')'; }
  void Reduce() { out_ += 'R'; Put(); }
  void BinPersId() { out_ += 'Q'; }

  // A fresh str object.
  void String(std::string_view s) {
    out_ += 'X';
    AppendU32(static_cast<uint32_t>(s.size()));
    out_ += s;
    Put();
  }
  // A str (or global) that is one Python object however often it is written.
  void SharedString(std::string_view s) { Shared("str:" + std::string(s), [&] { String(s); }); }
  void Global(std::string_view module, std::string_view name) {
    Shared("global:" + std::string(module) + " " + std::string(name), [&] {
      out_ += 'c';
      out_ += module;
      out_ += '\n';
      out_ += name;
      out_ += '\n';
      Put();
    });
  }
  void Int(int64_t v) {
    if (v >= 0 && v <= 0xff) {
      out_ += 'K';
      out_ += static_cast<char>(v);
    } else if (v >= 0 && v <= 0xffff) {
      out_ += 'M';
      out_ += static_cast<char>(v & 0xff);
      out_ += static_cast<char>(v >> 8);
    } else if (v >= -0x80000000ll && v <= 0x7fffffffll) {
      out_ += 'J';
      AppendU32(static_cast<uint32_t>(static_cast<int32_t>(v)));
    } else {  // LONG1: minimal little-endian two's complement, as pickle.encode_long
      std::string bytes;
      uint64_t u = static_cast<uint64_t>(v);
      for (int i = 0; i < 8; ++i) bytes += static_cast<char>((u >> (8 * i)) & 0xff);
      while (bytes.size() > 1) {
        uint8_t last = static_cast<uint8_t>(bytes.back()), prev = static_cast<uint8_t>(bytes[bytes.size() - 2]);
        if ((last == 0x00 && !(prev & 0x80)) || (last == 0xff && (prev & 0x80))) bytes.pop_back();
        else break;
      }
      out_ += '\x8a';
      out_ += static_cast<char>(bytes.size());
      out_ += bytes;
    }
  }
  // A tuple of ints (sizes, strides): TUPLE1-3 up to three members, MARK ... TUPLE beyond.
  void IntTuple(const std::vector<int64_t>& v) {
    if (v.empty()) return EmptyTuple();
    if (v.size() > 3) Mark();
    for (int64_t x : v) Int(x);
    EndTuple(v.size());
  }
  // Closes a tuple whose members were written (after a Mark() when it has more than three).
  void EndTuple(size_t n) {
    static const char kSmall[] = {0, '\x85', '\x86', '\x87'};
    out_ += n <= 3 ? kSmall[n] : 't';
    Put();
  }

  std::string Take() { return std::move(out_); }

 private:
  template <typename F>
  void Shared(const std::string& identity, F&& write) {
    auto it = shared_.find(identity);
    if (it != shared_.end()) return Get(it->second);
    write();
    shared_.emplace(identity, next_ - 1);
  }
  void Put() {
    uint32_t i = next_++;
    if (i < 256) {
      out_ += 'q';
      out_ += static_cast<char>(i);
    } else {
      out_ += 'r';
      AppendU32(i);
    }
  }
  void Get(uint32_t i) {
    if (i < 256) {
      out_ += 'h';
      out_ += static_cast<char>(i);
    } else {
      out_ += 'j';
      AppendU32(i);
    }
  }
  void AppendU32(uint32_t v) {
    for (int b = 0; b < 4; ++b) out_ += static_cast<char>((v >> (8 * b)) & 0xff);
  }

  std::string out_;
  uint32_t next_ = 0;
  std::map<std::string, uint32_t> shared_;
};

uint64_t Numel(const DictTensor& t) {
  uint64_t n = 1;
  for (int64_t d : t.shape) {
    if (d < 0) throw Error(ErrorKind::kInvalidArgument, "tensor '" + t.name + "': negative size");
    if (d != 0 && n > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / static_cast<uint64_t>(d))
      throw Error(ErrorKind::kInvalidArgument, "tensor '" + t.name + "': element count overflows");
    n *= static_cast<uint64_t>(d);
  }
  return n;
}

void WriteTensor(Writer& w, const DictTensor& t) {
  const char* typed = TypedStorageClass(t.dtype);
  if (!typed && !SavedAsUntyped(t.dtype))
    throw Error(ErrorKind::kInvalidArgument, "tensor '" + t.name + "': torch.save has no storage for dtype " +
                                                 std::string(DTypeName(t.dtype)));
  uint64_t numel = Numel(t);
  w.Global("torch._utils", typed ? "_rebuild_tensor_v2" : "_rebuild_tensor_v3");
  w.Mark();  // the rebuild call's arguments
  // The storage, as a persistent id: ('storage', class, key, location, numel), numel counting
  // elements of a typed storage and bytes of an UntypedStorage.
  w.Mark();
  w.SharedString("storage");
  if (typed) w.Global("torch", typed);
  else w.Global("torch.storage", "UntypedStorage");
  w.String(t.storage_key);
  w.SharedString("cpu");
  w.Int(static_cast<int64_t>(typed ? numel : numel * DTypeSize(t.dtype)));
  w.EndTuple(5);
  w.BinPersId();
  w.Int(0);  // storage_offset
  w.IntTuple(t.shape);
  w.IntTuple(ContiguousStrides(t.shape));
  w.False();  // requires_grad
  w.Global("collections", "OrderedDict");  // backward hooks: OrderedDict()
  w.EmptyTuple();
  w.Reduce();
  if (!typed) w.Global("torch", DTypeName(t.dtype));
  w.EndTuple(typed ? 6 : 7);
  w.Reduce();
}

}  // namespace

std::string TorchSavePickleOfTensorDict(const std::vector<DictTensor>& tensors) {
  Writer w;
  w.EmptyDict();
  // Python's _batch_setitems: batches of 1000, MARK ... SETITEMS for a batch of two or more,
  // a lone pair with SETITEM.
  constexpr size_t kBatch = 1000;
  for (size_t start = 0; start < tensors.size(); start += kBatch) {
    size_t n = std::min(kBatch, tensors.size() - start);
    if (n > 1) w.Mark();
    for (size_t i = start; i < start + n; ++i) {
      w.String(tensors[i].name);
      WriteTensor(w, tensors[i]);
    }
    if (n > 1) w.SetItems();
    else w.SetItem();
  }
  w.Stop();
  return w.Take();
}

}  // namespace zckpt::pickle
