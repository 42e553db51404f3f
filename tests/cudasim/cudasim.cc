// The simulated CUDA runtime (see cudasim.h). One lock guards all of its state; stream workers
// and waiting host threads meet on one condition variable, notified whenever any operation
// completes. Objects (streams, events) live until Reset, so a call on a destroyed one is caught
// instead of touching freed memory.
#include "cudasim.h"

#include <cuda_runtime_api.h>
#include <xxhash.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <thread>

struct CUstream_st;
struct CUevent_st;

namespace {

constexpr uint64_t kPage = 2ull << 20;  // device allocations are counted in 2 MiB pages

struct Op {
  enum Kind { kCopy, kMemset, kHostFunc, kWait, kMarker } kind = kMarker;
  void* dst = nullptr;
  const void* src = nullptr;
  uint64_t bytes = 0;
  int value = 0;
  bool checked = false;     // an async host-to-device copy: source checked when it runs
  bool pageable = false;    // ... from pageable memory (Config::pageable_access): no allocation to track
  bool to_host = false;     // an async device-to-host copy: src_alloc a device allocation, dst_alloc a pinned one
  uint64_t src_alloc = 0;   // id of the pinned allocation holding the source
  uint64_t src_hash = 0;    // its bytes when the copy was queued
  uint64_t dst_alloc = 0;   // id of the device allocation holding the destination
  cudaHostFn_t fn = nullptr;
  void* fn_data = nullptr;
  CUstream_st* wait_stream = nullptr;  // kWait: until that stream has executed `ticket` ops
  uint64_t ticket = 0;
};

}  // namespace

struct CUstream_st {
  int device = 0;
  bool legacy = false;
  bool blocking = true;    // synchronizes with the legacy default stream
  bool destroyed = false;
  uint64_t serial = 0;
  std::deque<Op> queue;
  uint64_t enqueued = 0;   // ops ever queued
  uint64_t executed = 0;   // ops done (in order)
  std::thread worker;
};

struct CUevent_st {
  int device = 0;
  bool destroyed = false;
  CUstream_st* stream = nullptr;  // of the last record; nullptr: never recorded
  uint64_t ticket = 0;
};

namespace {

struct Allocation {
  uint64_t bytes = 0;
  uint64_t id = 0;
  int device = -1;  // -1: pinned host memory
};

struct Device {
  cudasim::DeviceCounters counters;
  CUstream_st* legacy = nullptr;
};

struct State {
  std::mutex m;
  std::condition_variable cv;
  cudasim::Config config;
  uint64_t generation = 1;  // bumped by Reset: every thread's current device goes back to 0
  std::vector<Device> devices;
  std::vector<std::unique_ptr<CUstream_st>> streams;
  std::vector<std::unique_ptr<CUevent_st>> events;
  std::map<uintptr_t, Allocation> pinned, device_memory;
  uint64_t next_id = 1;
  cudasim::Counters counters;
  std::vector<std::string> violations;

  // A process that never calls Reset (a Python test through ctypes) asks for a device that reads
  // pageable memory with ZCKPT_SIM_PAGEABLE_ACCESS=1.
  State() {
    devices.resize(1);
    const char* env = std::getenv("ZCKPT_SIM_PAGEABLE_ACCESS");
    config.pageable_access = env != nullptr && std::string(env) == "1";
  }
};

State& S() {
  static State* s = new State;  // never destroyed: workers may outlive static destruction
  return *s;
}

struct ThreadDevice {
  uint64_t generation = 0;
  int device = 0;
};
thread_local ThreadDevice tls_device;
thread_local cudaError_t tls_last_error = cudaSuccess;

int CurrentDevice(State& s) {
  if (tls_device.generation != s.generation) tls_device = {s.generation, 0};
  return tls_device.device;
}

cudaError_t Fail(cudaError_t e) {
  if (e != cudaSuccess && e != cudaErrorNotReady) tls_last_error = e;
  return e;
}

// Lock held.
void Violation(State& s, const std::string& what) {
  std::fprintf(stderr, "cudasim: VIOLATION: %s\n", what.c_str());
  s.violations.push_back(what);
}

void EnsureContext(State& s, int device) {
  auto& c = s.devices[static_cast<size_t>(device)].counters;
  if (!c.context) {
    c.context = true;
    ++c.contexts_created;
  }
}

// The allocation of `map` holding [p, p + bytes), or nullptr.
const std::pair<const uintptr_t, Allocation>* Find(const std::map<uintptr_t, Allocation>& map, const void* p,
                                                   uint64_t bytes) {
  auto a = reinterpret_cast<uintptr_t>(p);
  auto it = map.upper_bound(a);
  if (it == map.begin()) return nullptr;
  --it;
  if (a < it->first || a + bytes > it->first + it->second.bytes) return nullptr;
  return &*it;
}

bool Live(const std::map<uintptr_t, Allocation>& map, uint64_t id) {
  for (const auto& [p, a] : map)
    if (a.id == id) return true;
  return false;
}

std::string Hex(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", p);
  return buf;
}

void Execute(State& s, CUstream_st* st, Op& op, std::unique_lock<std::mutex>& lock) {
  switch (op.kind) {
    case Op::kCopy: {
      bool src_live = op.to_host ? Live(s.device_memory, op.src_alloc)
                                 : !op.checked || op.pageable || Live(s.pinned, op.src_alloc);
      bool dst_live = op.to_host ? Live(s.pinned, op.dst_alloc) : op.dst_alloc == 0 || Live(s.device_memory, op.dst_alloc);
      lock.unlock();
      if (!src_live) {
        lock.lock();
        Violation(s, "cudaMemcpyAsync on device " + std::to_string(st->device) + ": its source " + Hex(op.src) +
                         " was freed before the copy ran");
        return;
      }
      if (op.checked && XXH3_64bits(op.src, op.bytes) != op.src_hash) {
        lock.lock();
        Violation(s, "cudaMemcpyAsync on device " + std::to_string(st->device) + ": source " + Hex(op.src) + " (" +
                         std::to_string(op.bytes) + " bytes) was rewritten between enqueue and execution "
                         "(a ring slot reused before its copy completed)");
        lock.unlock();
      }
      if (dst_live) std::memcpy(op.dst, op.src, op.bytes);
      lock.lock();
      if (!dst_live) Violation(s, "cudaMemcpyAsync: destination " + Hex(op.dst) + " was freed before the copy ran");
      if (op.checked) {
        auto& c = s.devices[static_cast<size_t>(st->device)].counters;
        ++c.copies;
        c.copy_bytes += op.bytes;
        if (op.pageable) c.pageable_copy_bytes += op.bytes;
      }
      return;
    }
    case Op::kMemset:
      lock.unlock();
      std::memset(op.dst, op.value, op.bytes);
      lock.lock();
      return;
    case Op::kHostFunc:
      lock.unlock();
      op.fn(op.fn_data);
      lock.lock();
      return;
    case Op::kWait:
    case Op::kMarker:
      return;
  }
}

void WorkerMain(CUstream_st* st) {
  State& s = S();
  std::mt19937_64 rng(s.config.seed * 1000003 + st->serial);
  std::unique_lock<std::mutex> lock(s.m);
  for (;;) {
    s.cv.wait(lock, [&] {
      if (st->queue.empty()) return st->destroyed;
      const Op& op = st->queue.front();
      return op.kind != Op::kWait || op.wait_stream->executed >= op.ticket;
    });
    if (st->queue.empty()) return;  // destroyed and drained
    Op op = st->queue.front();
    st->queue.pop_front();
    if (op.kind != Op::kWait && op.kind != Op::kMarker && s.config.max_delay_us > 0) {
      auto us = std::uniform_int_distribution<unsigned>(0, s.config.max_delay_us)(rng);
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::microseconds(us));
      lock.lock();
    }
    Execute(s, st, op, lock);
    ++st->executed;
    s.cv.notify_all();
  }
}

CUstream_st* NewStream(State& s, int device, bool legacy, bool blocking) {
  auto st = std::make_unique<CUstream_st>();
  st->device = device;
  st->legacy = legacy;
  st->blocking = blocking;
  st->serial = s.streams.size() + 1;
  CUstream_st* p = st.get();
  s.streams.push_back(std::move(st));
  p->worker = std::thread(WorkerMain, p);
  if (!legacy) ++s.devices[static_cast<size_t>(device)].counters.streams_alive;
  return p;
}

CUstream_st* Legacy(State& s, int device) {
  Device& d = s.devices[static_cast<size_t>(device)];
  if (d.legacy == nullptr) d.legacy = NewStream(s, device, true, true);
  return d.legacy;
}

// The stream a handle names (0 and cudaStreamLegacy: the current device's legacy default
// stream), or nullptr for a destroyed or unsupported one.
CUstream_st* Resolve(State& s, cudaStream_t handle) {
  if (handle == nullptr || handle == cudaStreamLegacy) {
    int device = CurrentDevice(s);
    EnsureContext(s, device);
    return Legacy(s, device);
  }
  if (handle == cudaStreamPerThread) return nullptr;
  return handle->destroyed ? nullptr : handle;
}

void Push(CUstream_st* st, Op op) {
  st->queue.push_back(op);
  ++st->enqueued;
}

// Queues `op` on `st` with the legacy default stream's implicit ordering: the legacy stream
// waits for the blocking streams of its device, and they wait for it. Returns op's ticket.
uint64_t Enqueue(State& s, CUstream_st* st, const Op& op) {
  if (st->legacy) {
    for (const auto& other : s.streams)
      if (other.get() != st && other->device == st->device && other->blocking && !other->legacy &&
          other->executed < other->enqueued)
        Push(st, Op{.kind = Op::kWait, .wait_stream = other.get(), .ticket = other->enqueued});
  } else if (st->blocking) {
    CUstream_st* legacy = s.devices[static_cast<size_t>(st->device)].legacy;
    if (legacy != nullptr && legacy->executed < legacy->enqueued)
      Push(st, Op{.kind = Op::kWait, .wait_stream = legacy, .ticket = legacy->enqueued});
  }
  Push(st, op);
  s.cv.notify_all();
  return st->enqueued;
}

void WaitFor(State& s, std::unique_lock<std::mutex>& lock, CUstream_st* st, uint64_t ticket) {
  s.cv.wait(lock, [&] { return st->executed >= ticket; });
}

// Every operation queued so far on the streams of `device` (-1: of every device). The list is
// taken first: waiting releases the lock, and other threads may create streams meanwhile.
void WaitForDevice(State& s, std::unique_lock<std::mutex>& lock, int device) {
  std::vector<std::pair<CUstream_st*, uint64_t>> tickets;
  for (const auto& st : s.streams)
    if (device < 0 || st->device == device) tickets.emplace_back(st.get(), st->enqueued);
  for (const auto& [st, ticket] : tickets) WaitFor(s, lock, st, ticket);
}

// What page-locking, cudaFreeHost and cudaFree impose: every device waits.
void SynchronizeAll(State& s, std::unique_lock<std::mutex>& lock) {
  ++s.counters.implicit_syncs;
  WaitForDevice(s, lock, -1);
}

bool ValidDevice(const State& s, int device) { return device >= 0 && device < s.config.devices; }

uint64_t Pages(uint64_t bytes) { return (bytes + kPage - 1) / kPage * kPage; }

}  // namespace

namespace cudasim {

bool Reset(const Config& config) {
  State& s = S();
  std::unique_lock<std::mutex> lock(s.m);
  bool clean = true;
  for (const auto& st : s.streams)
    if (!st->legacy && !st->destroyed) clean = false;
  for (const auto& e : s.events)
    if (!e->destroyed) clean = false;
  if (!clean || !s.pinned.empty() || !s.device_memory.empty()) {
    Violation(s, "Reset with streams, events or allocations still alive (" + std::to_string(s.pinned.size()) +
                     " pinned, " + std::to_string(s.device_memory.size()) + " device allocations)");
    return false;
  }
  for (const auto& st : s.streams) st->destroyed = true;
  s.cv.notify_all();
  std::vector<std::unique_ptr<CUstream_st>> streams = std::move(s.streams);
  s.streams.clear();
  lock.unlock();
  for (auto& st : streams) st->worker.join();
  lock.lock();
  s.events.clear();
  s.config = config;
  s.devices.assign(static_cast<size_t>(std::max(config.devices, 1)), Device{});
  s.counters = Counters{};
  ++s.generation;
  return true;
}

Counters Read() {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.m);
  Counters c = s.counters;
  for (const Device& d : s.devices) c.devices.push_back(d.counters);
  return c;
}

std::vector<std::string> TakeViolations() {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.m);
  std::vector<std::string> out = std::move(s.violations);
  s.violations.clear();
  return out;
}

}  // namespace cudasim

// --- the runtime API -------------------------------------------------------------------------

extern "C" {

cudaError_t cudaGetDeviceCount(int* count) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.m);
  *count = s.config.devices;
  return cudaSuccess;
}

// The simulator answers as a CUDA 12.8 runtime.
cudaError_t cudaRuntimeGetVersion(int* version) {
  *version = 12080;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.m);
  *device = CurrentDevice(s);
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.m);
  if (!ValidDevice(s, device)) return Fail(cudaErrorInvalidDevice);
  CurrentDevice(s);
  tls_device.device = device;
  EnsureContext(s, device);  // CUDA 12+: cudaSetDevice initializes the primary context
  return cudaSuccess;
}

cudaError_t cudaGetLastError(void) {
  cudaError_t e = tls_last_error;
  tls_last_error = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError(void) { return tls_last_error; }

const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorNotSupported: return "cudaErrorNotSupported";
    default: return "cudaErrorUnknown";
  }
}

const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorNotSupported: return "operation not supported";
    default: return "unknown error";
  }
}

cudaError_t cudaDeviceGetAttribute(int* value, enum cudaDeviceAttr attr, int device) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.m);
  if (value == nullptr || device < 0 || device >= static_cast<int>(s.devices.size())) return Fail(cudaErrorInvalidDevice);
  // The attributes the engine asks about; any other is 0 (a device without the feature).
  *value = (attr == cudaDevAttrPageableMemoryAccess || attr == cudaDevAttrPageableMemoryAccessUsesHostPageTables) &&
           s.config.pageable_access;
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.m);
  int device = CurrentDevice(s);
  EnsureContext(s, device);
  *total = s.config.device_bytes;
  *free = s.config.device_bytes - s.devices[static_cast<size_t>(device)].counters.used_bytes;
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.m);
  int device = CurrentDevice(s);
  EnsureContext(s, device);
  *stream = NewStream(s, device, false, (flags & cudaStreamNonBlocking) == 0);
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* stream) { return cudaStreamCreateWithFlags(stream, cudaStreamDefault); }

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.m);
  CUstream_st* st = Resolve(s, stream);
  if (st == nullptr || st->legacy) return Fail(cudaErrorInvalidResourceHandle);
  st->destroyed = true;  // queued work still runs to the end, as in CUDA
  --s.devices[static_cast<size_t>(st->device)].counters.streams_alive;
  s.cv.notify_all();
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  State& s = S();
  std::unique_lock<std::mutex> lock(s.m);
  CUstream_st* st = Resolve(s, stream);
  if (st == nullptr) return Fail(cudaErrorInvalidResourceHandle);
  uint64_t ticket = st->legacy ? Enqueue(s, st, Op{}) : st->enqueued;
  WaitFor(s, lock, st, ticket);
  return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.m);
  CUstream_st* st = Resolve(s, stream);
  if (st == nullptr) return Fail(cudaErrorInvalidResourceHandle);
  return st->executed >= st->enqueued ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaDeviceSynchronize(void) {
  State& s = S();
  std::unique_lock<std::mutex> lock(s.m);
  int device = CurrentDevice(s);
  EnsureContext(s, device);
  WaitForDevice(s, lock, device);
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.m);
  int device = CurrentDevice(s);
  EnsureContext(s, device);
  auto e = std::make_unique<CUevent_st>();
  e->device = device;
  *event = e.get();
  s.events.push_back(std::move(e));
  ++s.devices[static_cast<size_t>(device)].counters.events_alive;
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, cudaEventDefault); }

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.m);
  if (event == nullptr || event->destroyed) return Fail(cudaErrorInvalidResourceHandle);
  event->destroyed = true;
  --s.devices[static_cast<size_t>(event->device)].counters.events_alive;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.m);
  CUstream_st* st = Resolve(s, stream);
  if (event == nullptr || event->destroyed || st == nullptr) return Fail(cudaErrorInvalidResourceHandle);
  if (event->device != st->device) {
    Violation(s, "cudaEventRecord: an event of device " + std::to_string(event->device) + " recorded on a stream of device " +
                     std::to_string(st->device));
    return Fail(cudaErrorInvalidResourceHandle);
  }
  event->ticket = Enqueue(s, st, Op{});
  event->stream = st;
  return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.m);
  CUstream_st* st = Resolve(s, stream);
  if (event == nullptr || event->destroyed || st == nullptr) return Fail(cudaErrorInvalidResourceHandle);
  if (event->stream == nullptr) return cudaSuccess;  // never recorded: nothing to wait for
  Enqueue(s, st, Op{.kind = Op::kWait, .wait_stream = event->stream, .ticket = event->ticket});
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.m);
  if (event == nullptr || event->destroyed) return Fail(cudaErrorInvalidResourceHandle);
  if (event->stream == nullptr || event->stream->executed >= event->ticket) return cudaSuccess;
  return cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  State& s = S();
  std::unique_lock<std::mutex> lock(s.m);
  if (event == nullptr || event->destroyed) return Fail(cudaErrorInvalidResourceHandle);
  if (event->stream != nullptr) WaitFor(s, lock, event->stream, event->ticket);
  return cudaSuccess;
}

cudaError_t cudaHostAlloc(void** ptr, size_t size, unsigned int) {
  State& s = S();
  std::unique_lock<std::mutex> lock(s.m);
  EnsureContext(s, CurrentDevice(s));
  SynchronizeAll(s, lock);  // page-locking synchronizes the device
  if (s.config.pinned_bytes != 0 && s.counters.pinned_live_bytes + size > s.config.pinned_bytes)
    return Fail(cudaErrorMemoryAllocation);
  void* p = std::aligned_alloc(4096, (size + 4095) / 4096 * 4096 + 4096);
  if (p == nullptr) return Fail(cudaErrorMemoryAllocation);
  std::memset(p, 0xA5, size);
  s.pinned[reinterpret_cast<uintptr_t>(p)] = Allocation{size, s.next_id++, -1};
  ++s.counters.pinned_allocs;
  s.counters.pinned_live_bytes += size;
  *ptr = p;
  return cudaSuccess;
}

cudaError_t cudaMallocHost(void** ptr, size_t size) { return cudaHostAlloc(ptr, size, cudaHostAllocDefault); }

cudaError_t cudaFreeHost(void* ptr) {
  State& s = S();
  std::unique_lock<std::mutex> lock(s.m);
  auto it = s.pinned.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == s.pinned.end()) {
    Violation(s, "cudaFreeHost of " + Hex(ptr) + ", which cudaHostAlloc did not return");
    return Fail(cudaErrorInvalidValue);
  }
  SynchronizeAll(s, lock);  // cudaFreeHost synchronizes the device
  s.counters.pinned_live_bytes -= it->second.bytes;
  s.pinned.erase(it);
  ++s.counters.pinned_frees;
  std::free(ptr);
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** ptr, size_t size) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.m);
  int device = CurrentDevice(s);
  EnsureContext(s, device);
  auto& c = s.devices[static_cast<size_t>(device)].counters;
  if (c.used_bytes + Pages(size) > s.config.device_bytes) return Fail(cudaErrorMemoryAllocation);
  void* p = std::aligned_alloc(256, (size + 255) / 256 * 256 + 256);
  if (p == nullptr) return Fail(cudaErrorMemoryAllocation);
  std::memset(p, 0xCD, size);  // never zeros: unwritten bytes show
  s.device_memory[reinterpret_cast<uintptr_t>(p)] = Allocation{size, s.next_id++, device};
  c.used_bytes += Pages(size);
  *ptr = p;
  return cudaSuccess;
}

cudaError_t cudaFree(void* ptr) {
  if (ptr == nullptr) return cudaSuccess;
  State& s = S();
  std::unique_lock<std::mutex> lock(s.m);
  auto it = s.device_memory.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == s.device_memory.end()) {
    Violation(s, "cudaFree of " + Hex(ptr) + ", which cudaMalloc did not return");
    return Fail(cudaErrorInvalidValue);
  }
  SynchronizeAll(s, lock);  // cudaFree synchronizes
  s.devices[static_cast<size_t>(it->second.device)].counters.used_bytes -= Pages(it->second.bytes);
  s.device_memory.erase(it);
  std::free(ptr);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind, cudaStream_t stream) {
  if (kind != cudaMemcpyHostToDevice && kind != cudaMemcpyDeviceToHost && kind != cudaMemcpyDefault)
    return Fail(cudaErrorNotSupported);
  State& s = S();
  std::unique_lock<std::mutex> lock(s.m);
  CUstream_st* st = Resolve(s, stream);
  if (st == nullptr) return Fail(cudaErrorInvalidResourceHandle);
  if (kind == cudaMemcpyDeviceToHost) {
    // Device memory of the stream's device into pinned memory (a save's ring slot): the bytes land
    // when the copy runs, so a reader of the slot that did not wait for it sees old bytes.
    const auto* from = Find(s.device_memory, src, count);
    const auto* into = Find(s.pinned, dst, count);
    if (from == nullptr || from->second.device != st->device) {
      Violation(s, "cudaMemcpyAsync from " + Hex(src) + " (" + std::to_string(count) + " bytes) on a stream of device " +
                       std::to_string(st->device) + ": not inside a live allocation of that device");
      return Fail(cudaErrorInvalidValue);
    }
    if (into == nullptr) {
      Violation(s, "cudaMemcpyAsync to " + Hex(dst) + ": not pinned memory (the copy would be synchronous)");
      return Fail(cudaErrorInvalidValue);
    }
    Enqueue(s, st, Op{.kind = Op::kCopy, .dst = dst, .src = src, .bytes = count, .to_host = true,
                      .src_alloc = from->second.id, .dst_alloc = into->second.id});
    return cudaSuccess;
  }
  const auto* source = Find(s.pinned, src, count);
  const auto* target = Find(s.device_memory, dst, count);
  if (target == nullptr || target->second.device != st->device) {
    Violation(s, "cudaMemcpyAsync to " + Hex(dst) + " (" + std::to_string(count) + " bytes) on a stream of device " +
                     std::to_string(st->device) + ": not inside a live allocation of that device");
    return Fail(cudaErrorInvalidValue);
  }
  if (source == nullptr && !s.config.pageable_access) {
    Violation(s, "cudaMemcpyAsync from " + Hex(src) + ": not pinned memory (the copy would be synchronous)");
    return Fail(cudaErrorInvalidValue);
  }
  Op op{.kind = Op::kCopy, .dst = dst, .src = src, .bytes = count, .checked = true, .pageable = source == nullptr,
        .src_alloc = source == nullptr ? 0 : source->second.id, .dst_alloc = target->second.id};
  lock.unlock();
  op.src_hash = XXH3_64bits(src, count);  // the caller owns the slot until this call returns
  lock.lock();
  Enqueue(s, st, op);
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* dst, int value, size_t count, cudaStream_t stream) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.m);
  CUstream_st* st = Resolve(s, stream);
  if (st == nullptr) return Fail(cudaErrorInvalidResourceHandle);
  const auto* target = Find(s.device_memory, dst, count);
  if (target == nullptr) return Fail(cudaErrorInvalidValue);
  Enqueue(s, st, Op{.kind = Op::kMemset, .dst = dst, .bytes = count, .value = value, .dst_alloc = target->second.id});
  return cudaSuccess;
}

cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* userData) {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.m);
  CUstream_st* st = Resolve(s, stream);
  if (st == nullptr) return Fail(cudaErrorInvalidResourceHandle);
  Enqueue(s, st, Op{.kind = Op::kHostFunc, .fn = fn, .fn_data = userData});
  return cudaSuccess;
}

// Synchronous copies, on the legacy default stream of the current device (tests read device
// memory back with these): any pointers, no checks beyond bounds of device memory.
cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind) {
  State& s = S();
  std::unique_lock<std::mutex> lock(s.m);
  bool src_device = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  bool dst_device = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  if ((src_device && Find(s.device_memory, src, count) == nullptr) || (dst_device && Find(s.device_memory, dst, count) == nullptr))
    return Fail(cudaErrorInvalidValue);
  CUstream_st* st = Resolve(s, nullptr);
  uint64_t ticket = Enqueue(s, st, Op{.kind = Op::kCopy, .dst = dst, .src = src, .bytes = count});
  WaitFor(s, lock, st, ticket);
  return cudaSuccess;
}

}  // extern "C"

extern "C" uint64_t cudasim_copy_bytes(int device) {
  cudasim::Counters c = cudasim::Read();
  return device >= 0 && static_cast<size_t>(device) < c.devices.size() ? c.devices[device].copy_bytes : 0;
}

extern "C" uint64_t cudasim_pageable_copy_bytes(int device) {
  cudasim::Counters c = cudasim::Read();
  return device >= 0 && static_cast<size_t>(device) < c.devices.size() ? c.devices[device].pageable_copy_bytes : 0;
}

extern "C" uint64_t cudasim_pinned_allocs() { return cudasim::Read().pinned_allocs; }

extern "C" uint64_t cudasim_violation_count() {
  State& s = S();
  std::lock_guard<std::mutex> lock(s.m);
  return s.violations.size();
}
