#include "common/cudart_loader.h"

#include <dlfcn.h>
#include <link.h>

#include <cstdlib>
#include <mutex>
#include <type_traits>

#include "zckpt/error.h"

namespace zckpt {

namespace {

// Fills `rt` from `handle`; false, with `missing` set, when a function is absent.
bool Bind(void* handle, CudaRuntime& rt, std::string& missing) {
  bool ok = true;
  auto get = [&](auto& fn, const char* name) {
    if (!ok) return;
    void* p = dlsym(handle, name);
    if (p == nullptr) {
      ok = false;
      missing = name;
      return;
    }
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
  };
  get(rt.GetDevice, "cudaGetDevice");
  get(rt.SetDevice, "cudaSetDevice");
  get(rt.GetDeviceCount, "cudaGetDeviceCount");
  get(rt.GetLastError, "cudaGetLastError");
  get(rt.GetErrorString, "cudaGetErrorString");
  get(rt.RuntimeGetVersion, "cudaRuntimeGetVersion");
  get(rt.HostAlloc, "cudaHostAlloc");
  get(rt.FreeHost, "cudaFreeHost");
  get(rt.Malloc, "cudaMalloc");
  get(rt.Free, "cudaFree");
  get(rt.Memcpy, "cudaMemcpy");
  get(rt.MemcpyAsync, "cudaMemcpyAsync");
  get(rt.MemGetInfo, "cudaMemGetInfo");
  get(rt.DeviceGetAttribute, "cudaDeviceGetAttribute");
  get(rt.StreamCreateWithFlags, "cudaStreamCreateWithFlags");
  get(rt.StreamDestroy, "cudaStreamDestroy");
  get(rt.StreamSynchronize, "cudaStreamSynchronize");
  get(rt.StreamWaitEvent, "cudaStreamWaitEvent");
  get(rt.EventCreateWithFlags, "cudaEventCreateWithFlags");
  get(rt.EventDestroy, "cudaEventDestroy");
  get(rt.EventRecord, "cudaEventRecord");
  get(rt.EventQuery, "cudaEventQuery");
  get(rt.EventSynchronize, "cudaEventSynchronize");
  return ok;
}

std::string PathOf(void* handle, const std::string& fallback) {
  link_map* map = nullptr;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name != nullptr && *map->l_name)
    return map->l_name;
  return fallback;
}

std::string Join(const std::vector<std::string>& v) {
  std::string s;
  for (const std::string& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

}  // namespace

const CudaRuntime& LoadCudaRuntime(const std::string& forced, const std::vector<std::string>& names,
                                   const std::vector<std::string>& dirs) {
  std::string last_error;
  // Handles are never closed: the table's functions are used for the rest of the process.
  auto table = [&](void* handle, const std::string& what) -> const CudaRuntime& {
    auto* rt = new CudaRuntime;
    std::string missing;
    if (!Bind(handle, *rt, missing)) {
      std::string path = PathOf(handle, what);
      delete rt;
      throw Error(ErrorKind::kUnsupported, "the CUDA runtime " + path + " has no " + missing);
    }
    rt->path = PathOf(handle, what);
    return *rt;
  };
  if (!forced.empty()) {
    void* h = dlopen(forced.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr)
      throw Error(ErrorKind::kUnsupported, std::string("no CUDA runtime could be loaded: ZCKPT_CUDART=") + forced +
                                               " does not load (" + dlerror() + ")");
    return table(h, forced);
  }
  for (const std::string& name : names)
    if (void* h = dlopen(name.c_str(), RTLD_NOW | RTLD_NOLOAD)) return table(h, name);
  for (const std::string& name : names) {
    if (void* h = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL)) return table(h, name);
    last_error = dlerror();
  }
  for (const std::string& dir : dirs)
    for (const std::string& name : names) {
      std::string path = dir + "/" + name;
      if (void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) return table(h, path);
    }
  throw Error(ErrorKind::kUnsupported,
              "no CUDA runtime could be loaded: looked for " + Join(names) +
                  " already in this process, then through the dynamic linker (LD_LIBRARY_PATH, /etc/ld.so.cache, "
                  "the system library folders: " + last_error + "), then in " + Join(dirs) +
                  "; install the CUDA runtime (torch's CUDA builds bring one) or set ZCKPT_CUDART to its file");
}

const CudaRuntime& Cuda() {
  static std::mutex mutex;
  static const CudaRuntime* loaded = nullptr;
  std::lock_guard<std::mutex> lock(mutex);
  if (loaded == nullptr) {
    const char* forced = std::getenv("ZCKPT_CUDART");
    loaded = &LoadCudaRuntime(forced ? forced : "", kCudaRuntimeNames, kCudaLibraryDirs);
  }
  return *loaded;
}

}  // namespace zckpt
