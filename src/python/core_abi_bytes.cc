// The typed calls of include/zckpt/zckpt.h, the ones that move bytes: open and close, host
// buffers, byte ranges loaded by address (host or CUDA, loader::LoadRanges), mapped storages and
// the container writer. Arguments arrive as plain numbers and structs (10,000 ranges are one
// array, read in place), objects as handles checked for their kind (core_calls.h's Handles).
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/shape.h"
#include "loader/host_load.h"
#include "python/core_abi.h"
#include "zckpt/container.h"
#include "zckpt/container_writer.h"
#include "zckpt/dtype.h"
#include "zckpt/load_options.h"
#include "zckpt/load_ranges.h"

namespace zckpt::python {
namespace {

static_assert(sizeof(zckpt_range) == 40, "zckpt_range: five 8-byte fields, no padding (zckpt/_core.py packs them)");
static_assert(sizeof(zckpt_device_stream) == 16, "zckpt_device_stream: two 8-byte fields");

void Require(bool ok, const char* message) {
  if (!ok) throw Error(ErrorKind::kInvalidArgument, message);
}

// A C string argument; null is the caller's mistake, named.
std::string Text(const char* s, const char* what) {
  if (!s) throw Error(ErrorKind::kInvalidArgument, std::string("a null pointer for ") + what);
  return s;
}

std::span<const uint8_t> Bytes(const void* data, uint64_t bytes) {
  std::string_view v = AddressBytes(reinterpret_cast<uintptr_t>(data), bytes);
  return {reinterpret_cast<const uint8_t*>(v.data()), v.size()};
}

template <class T>
std::optional<T> UnlessZero(T v) {
  return v == 0 ? std::nullopt : std::optional<T>(v);
}

std::shared_ptr<Container> Checkpoint(zckpt_checkpoint c) { return TheHandles().Get<Container>(c.id, kCheckpointHandle); }
std::shared_ptr<ContainerWriter> Writer(zckpt_writer w) { return TheHandles().Get<ContainerWriter>(w.id, kWriterHandle); }

// The record of a contiguous tensor; its byte count must be the shape's (a caller's slip would
// otherwise surface only at commit).
NewTensor Record(const zckpt_tensor_spec* spec, uint64_t bytes) {
  Require(spec != nullptr, "a null tensor spec");
  Require(spec->ndim == 0 || spec->shape != nullptr, "a null shape with dimensions");
  std::string name = Text(spec->name, "the tensor's name");
  std::string dtype = Text(spec->dtype, "the tensor's dtype");
  std::optional<DType> code = DTypeFromName(dtype);
  if (!code) throw Error(ErrorKind::kUnsupported, "dtype " + dtype + " has no zckpt dtype code");
  std::vector<int64_t> shape(spec->shape, spec->shape + spec->ndim);
  uint64_t numel = 1;
  for (int64_t d : shape) {
    if (d < 0) throw Error(ErrorKind::kInvalidArgument, "tensor '" + name + "': a negative dimension");
    numel *= static_cast<uint64_t>(d);
  }
  if (numel * DTypeSize(*code) != bytes)
    throw Error(ErrorKind::kInvalidArgument, "tensor '" + name + "': " + std::to_string(bytes) + " bytes for " +
                                                 std::to_string(numel) + " elements of " + dtype);
  NewTensor t;
  t.name = name;
  t.dtype = *code;
  t.stride = ContiguousStrides(shape);
  t.shape = std::move(shape);
  t.extra = spec->extra ? spec->extra : "";
  return t;
}

NewStorage Storage(const zckpt_tensor_spec* spec, DType dtype) {
  return NewStorage{Text(spec->key, "the tensor's storage key"), spec->location ? spec->location : "cpu", dtype, false};
}

}  // namespace
}  // namespace zckpt::python

using namespace zckpt;          // NOLINT: the exported functions below are the interface's, in C
using namespace zckpt::python;  // NOLINT

#define ZCKPT_EXPORT extern "C" __attribute__((visibility("default")))

ZCKPT_EXPORT zckpt_status zckpt_open(const char* path, zckpt_checkpoint* checkpoint, zckpt_error** error) {
  return Guarded(error, [&] {
    Require(checkpoint != nullptr, "a null zckpt_checkpoint* to open into");
    std::shared_ptr<Container> c = OpenContainer(Text(path, "the path"));
    checkpoint->id = TheHandles().Keep(std::move(c));
  });
}

ZCKPT_EXPORT zckpt_status zckpt_close(zckpt_checkpoint checkpoint, zckpt_error** error) {
  return Guarded(error, [&] { TheHandles().Release<Container>(checkpoint.id, kCheckpointHandle); });
}

ZCKPT_EXPORT zckpt_status zckpt_storage_count(zckpt_checkpoint checkpoint, uint64_t* count, zckpt_error** error) {
  return Guarded(error, [&] {
    Require(count != nullptr, "a null count");
    *count = Checkpoint(checkpoint)->storage_count();
  });
}

ZCKPT_EXPORT zckpt_status zckpt_host_buffer_new(uint64_t bytes, zckpt_host_buffer* buffer, void** address,
                                                zckpt_error** error) {
  return Guarded(error, [&] {
    Require(buffer != nullptr && address != nullptr, "a null zckpt_host_buffer* or address");
    auto made = std::make_shared<LoadBuffer>(bytes);
    *address = made->data();
    buffer->id = TheHandles().Keep(std::move(made));
  });
}

ZCKPT_EXPORT zckpt_status zckpt_host_buffer_free(zckpt_host_buffer buffer, zckpt_error** error) {
  return Guarded(error, [&] { TheHandles().Release<LoadBuffer>(buffer.id, kHostBufferHandle); });
}

ZCKPT_EXPORT zckpt_status zckpt_load_ranges(zckpt_checkpoint checkpoint, const zckpt_range* ranges, size_t range_count,
                                            const zckpt_device_stream* streams, size_t stream_count,
                                            const zckpt_load_options* options, zckpt_load_stats* stats,
                                            zckpt_error** error) {
  return Guarded(error, [&] {
    Require(range_count == 0 || ranges != nullptr, "a null range array");
    Require(stream_count == 0 || streams != nullptr, "a null stream array");
    std::shared_ptr<Container> c = Checkpoint(checkpoint);
    std::vector<LoadTarget> targets(range_count);
    for (size_t i = 0; i < range_count; ++i) {
      const zckpt_range& r = ranges[i];
      // The loader refuses an index past the file's storages; one past 32 bits would wrap first.
      uint32_t storage = r.storage > UINT32_MAX ? UINT32_MAX : static_cast<uint32_t>(r.storage);
      targets[i] = {storage, r.begin, r.end, static_cast<uint8_t*>(r.address),
                    static_cast<int32_t>(r.device)};
    }
    std::vector<loader::CudaDevice> devices(stream_count);
    for (size_t i = 0; i < stream_count; ++i)
      devices[i] = {static_cast<int>(streams[i].device), static_cast<CUstream_st*>(streams[i].stream)};
    LoadOptions o;  // verify on unless the options say otherwise
    if (options) {
      o.verify = options->verify != 0;
      o.threads = UnlessZero(options->threads);
      o.slots = UnlessZero(options->slots);
      o.slot_bytes = UnlessZero(options->slot_bytes);
    }
    LoadStats s = loader::LoadRanges(*c, targets, o, devices);
    if (stats)
      *stats = {s.raw_bytes, s.stored_bytes, s.chunks, s.uncached_bytes, s.storages, s.threads, s.verified ? 1u : 0u,
                s.seconds};
  });
}

ZCKPT_EXPORT zckpt_status zckpt_map_storages(zckpt_checkpoint checkpoint, uint32_t verify, uint32_t threads,
                                             zckpt_mapped_storage* storages, size_t count, zckpt_error** error) {
  return Guarded(error, [&] {
    std::shared_ptr<Container> c = Checkpoint(checkpoint);
    if (count != c->storage_count())
      throw Error(ErrorKind::kInvalidArgument, c->path() + ": room for " + std::to_string(count) + " mapped storages, " +
                                                   "the file holds " + std::to_string(c->storage_count()));
    Require(count == 0 || storages != nullptr, "a null storage array");
    MappedStorages mapped(*c, verify != 0, threads ? threads : DefaultReaderThreads());
    std::vector<uint64_t> kept;  // released again if a later one fails: nothing leaks
    try {
      for (uint32_t s = 0; s < count; ++s) {
        kept.push_back(TheHandles().Keep(mapped.keeper(s)));
        storages[s] = {mapped.data(s), c->storage(s).raw_bytes, {kept.back()}};
      }
    } catch (...) {
      for (uint64_t id : kept) TheHandles().Release<const void>(id, kMappedHandle);
      throw;
    }
  });
}

ZCKPT_EXPORT zckpt_status zckpt_mapped_release(zckpt_mapped keeper, zckpt_error** error) {
  return Guarded(error, [&] { TheHandles().Release<const void>(keeper.id, kMappedHandle); });
}

ZCKPT_EXPORT zckpt_status zckpt_writer_open(const char* path, const zckpt_writer_options* options, zckpt_writer* writer,
                                            zckpt_error** error) {
  return Guarded(error, [&] {
    Require(writer != nullptr, "a null zckpt_writer* to open into");
    WriterOptions o;
    if (options) {
      if (options->chunk_bytes) o.chunk_bytes = options->chunk_bytes;
      o.zstd_level = options->zstd_level;
      o.threads = options->threads;
    }
    writer->id = TheHandles().Keep(std::make_shared<ContainerWriter>(Text(path, "the path"), o));
  });
}

ZCKPT_EXPORT zckpt_status zckpt_writer_add_tensor(zckpt_writer writer, const zckpt_tensor_spec* tensor,
                                                  const void* data, uint64_t bytes, zckpt_error** error) {
  return Guarded(error, [&] {
    auto w = Writer(writer);
    NewTensor t = Record(tensor, bytes);
    t.storage = w->AddStorage(Storage(tensor, t.dtype), Bytes(data, bytes));
    w->AddTensor(t);
  });
}

ZCKPT_EXPORT zckpt_status zckpt_writer_begin_tensor(zckpt_writer writer, const zckpt_tensor_spec* tensor,
                                                    uint64_t bytes, zckpt_error** error) {
  return Guarded(error, [&] {
    auto w = Writer(writer);
    NewTensor t = Record(tensor, bytes);
    t.storage = w->BeginStorage(Storage(tensor, t.dtype), bytes);
    w->AddTensor(t);
  });
}

ZCKPT_EXPORT zckpt_status zckpt_writer_append(zckpt_writer writer, const void* data, uint64_t bytes,
                                              zckpt_error** error) {
  return Guarded(error, [&] { Writer(writer)->AppendStorage(Bytes(data, bytes)); });
}

ZCKPT_EXPORT zckpt_status zckpt_writer_end_tensor(zckpt_writer writer, zckpt_error** error) {
  return Guarded(error, [&] { Writer(writer)->EndStorage(); });
}

ZCKPT_EXPORT zckpt_status zckpt_writer_add_blob(zckpt_writer writer, const char* name, const void* data,
                                                uint64_t bytes, zckpt_error** error) {
  return Guarded(error, [&] { Writer(writer)->AddBlob(Text(name, "the blob's name"), Bytes(data, bytes)); });
}

ZCKPT_EXPORT zckpt_status zckpt_writer_set_metadata(zckpt_writer writer, const char* key, const char* value,
                                                    zckpt_error** error) {
  return Guarded(error, [&] { Writer(writer)->SetMetadata(Text(key, "the metadata key"), Text(value, "its value")); });
}

ZCKPT_EXPORT zckpt_status zckpt_writer_commit(zckpt_writer writer, zckpt_write_stats* stats, zckpt_error** error) {
  return Guarded(error, [&] {
    WriterStats s = Writer(writer)->Commit();
    if (stats) *stats = {s.storages, s.chunks, s.raw_bytes, s.file_bytes};
  });
}

ZCKPT_EXPORT zckpt_status zckpt_writer_close(zckpt_writer writer, zckpt_error** error) {
  return Guarded(error, [&] { TheHandles().Release<ContainerWriter>(writer.id, kWriterHandle); });
}
