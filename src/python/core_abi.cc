// The C interface of libzckpt_core.so (include/zckpt/zckpt.h): its version, statuses and errors,
// and zckpt_call, which runs any JSON call of core_calls.h by name for the answers that are
// documents. The typed calls that move bytes are core_abi_bytes.cc. zckpt/_core.py loads it with
// ctypes, so one build serves every Python 3 (no Python header, no extension module) and every
// torch. ctypes lets go of the GIL for each call, so a long load or an object-store request never
// stops the caller's other threads.
#include "python/core_abi.h"

#include <string>

struct zckpt_result {
  std::string json;
  zckpt::python::Reply reply;
};

namespace zckpt::python {

zckpt_status StatusOf(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kIo: return ZCKPT_ERROR_IO;
    case ErrorKind::kNotContainer: return ZCKPT_ERROR_NOT_A_CONTAINER;
    case ErrorKind::kCorrupt: return ZCKPT_ERROR_CORRUPT;
    case ErrorKind::kUnsupported: return ZCKPT_ERROR_UNSUPPORTED;
    case ErrorKind::kUnsafe: return ZCKPT_ERROR_UNSAFE;
    case ErrorKind::kInvalidArgument: return ZCKPT_ERROR_INVALID_ARGUMENT;
    case ErrorKind::kCancelled: return ZCKPT_ERROR_CANCELLED;
    case ErrorKind::kOutOfMemory: return ZCKPT_ERROR_OUT_OF_MEMORY;
  }
  return ZCKPT_ERROR_INTERNAL;
}

zckpt_status Fail(zckpt_error** error, zckpt_status status, const char* message, const ErrorPlace* place) noexcept {
  if (!error) return status;
  *error = nullptr;
  try {
    const Json where = place ? PlaceJson(*place) : Json::object();
    *error = new zckpt_error{status, message, where.dump(-1, ' ', false, Json::error_handler_t::replace)};
  } catch (...) {
  }
  return status;
}

namespace {

void SetError(zckpt_result& r, const char* kind, const std::string& message, Json place = Json::object()) {
  place["kind"] = kind;
  place["message"] = message;
  r.reply = {};
  r.json = Json{{"error", place}}.dump(-1, ' ', false, Json::error_handler_t::replace);
}

}  // namespace
}  // namespace zckpt::python

using zckpt::python::Json;

#define ZCKPT_EXPORT extern "C" __attribute__((visibility("default")))

ZCKPT_EXPORT uint32_t zckpt_abi_version(void) { return ZCKPT_ABI_VERSION; }

ZCKPT_EXPORT const char* zckpt_status_name(int status) {
  switch (status) {
    case ZCKPT_OK: return "ok";
    case ZCKPT_ERROR_HOST_MEMORY: return "memory";
    case ZCKPT_ERROR_INTERNAL: return "internal";
    default: break;
  }
  using zckpt::ErrorKind;
  for (ErrorKind kind : {ErrorKind::kIo, ErrorKind::kNotContainer, ErrorKind::kCorrupt, ErrorKind::kUnsupported,
                         ErrorKind::kUnsafe, ErrorKind::kInvalidArgument, ErrorKind::kCancelled, ErrorKind::kOutOfMemory})
    if (zckpt::python::StatusOf(kind) == status) return zckpt::ErrorKindName(kind);
  return "unknown";
}

ZCKPT_EXPORT zckpt_status zckpt_error_status(const zckpt_error* error) { return error->status; }
ZCKPT_EXPORT const char* zckpt_error_message(const zckpt_error* error) { return error->message.c_str(); }
ZCKPT_EXPORT const char* zckpt_error_place(const zckpt_error* error) { return error->place.c_str(); }
ZCKPT_EXPORT void zckpt_error_free(zckpt_error* error) { delete error; }

ZCKPT_EXPORT zckpt_result* zckpt_call(const char* request, size_t length) {
  auto* r = new (std::nothrow) zckpt_result;
  if (!r) return nullptr;
  using zckpt::python::SetError;
  try {
    Json q = Json::parse(request, request + length);
    Json value = zckpt::python::RunCall(q.at("call").get<std::string>(), q.at("args"), r->reply);
    r->json = Json{{"value", std::move(value)}}.dump(-1, ' ', false, Json::error_handler_t::replace);
  } catch (const zckpt::Error& e) {
    SetError(*r, zckpt::ErrorKindName(e.kind()), e.what(), zckpt::python::PlaceJson(e.place()));
  } catch (const std::bad_alloc&) {
    SetError(*r, "memory", "out of host memory");
  } catch (const Json::exception& e) {  // not JSON, or an argument missing or of the wrong type
    SetError(*r, "invalid-argument", std::string("zckpt's core: a malformed request: ") + e.what());
  } catch (const std::exception& e) {
    SetError(*r, "internal", e.what());
  }
  return r;
}

ZCKPT_EXPORT const char* zckpt_result_json(const zckpt_result* r, size_t* length) {
  *length = r->json.size();
  return r->json.data();
}

ZCKPT_EXPORT const char* zckpt_result_bytes(const zckpt_result* r, size_t i, size_t* length) {
  if (i >= r->reply.bytes().size()) {
    *length = 0;
    return nullptr;
  }
  const std::string& b = r->reply.bytes()[i];
  *length = b.size();
  return b.data();
}

ZCKPT_EXPORT void zckpt_result_free(zckpt_result* r) { delete r; }
