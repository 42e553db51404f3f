// The C ABI of libzckpt_core.so, the native half of the `zckpt` Python package: zckpt/_core.py
// loads it with ctypes, so one build serves every Python 3 (no Python header, no extension
// module, no interpreter ABI) and every torch. One entry runs any call of core_calls.h by name:
//
//   zckpt_result* zckpt_call(const char* request, size_t length);
//     request: UTF-8 JSON {"call": NAME, "args": {...}}; bytes go in by address
//     ({"$address": a, "$bytes": n}, alive for the call), objects by handle ({"$handle": id}).
//   const char* zckpt_result_json(const zckpt_result*, size_t* length);
//     {"value": V} or {"error": {"kind": ErrorKindName or "memory" or "internal", "message",
//     and PlaceJson's fields}}; V names returned byte strings as {"$bytes": i}.
//   const char* zckpt_result_bytes(const zckpt_result*, size_t i, size_t* length);
//   void zckpt_result_free(zckpt_result*);
//
// Nothing is thrown across it: every failure is an error result. ctypes lets go of the GIL for
// the call, so a long load or an object-store request never stops the caller's other threads.
#include <exception>
#include <new>
#include <string>

#include "python/core_calls.h"

struct zckpt_result {
  std::string json;
  zckpt::python::Reply reply;
};

namespace {

using zckpt::python::Json;

void SetError(zckpt_result& r, const char* kind, const std::string& message, Json place = Json::object()) {
  place["kind"] = kind;
  place["message"] = message;
  r.reply = {};
  r.json = Json{{"error", place}}.dump(-1, ' ', false, Json::error_handler_t::replace);
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) zckpt_result* zckpt_call(const char* request, size_t length) {
  auto* r = new (std::nothrow) zckpt_result;
  if (!r) return nullptr;
  try {
    Json q = Json::parse(request, request + length);
    Json value = zckpt::python::RunCall(q.at("call").get<std::string>(), q.at("args"), r->reply);
    r->json = Json{{"value", std::move(value)}}.dump(-1, ' ', false, Json::error_handler_t::replace);
  } catch (const zckpt::Error& e) {
    SetError(*r, zckpt::ErrorKindName(e.kind()), e.what(), zckpt::python::PlaceJson(e.place()));
  } catch (const std::bad_alloc&) {
    SetError(*r, "memory", "out of host memory");
  } catch (const Json::exception& e) {  // a request zckpt/_core.py should not have made
    SetError(*r, "internal", std::string("zckpt's core: a malformed request: ") + e.what());
  } catch (const std::exception& e) {
    SetError(*r, "internal", e.what());
  }
  return r;
}

__attribute__((visibility("default"))) const char* zckpt_result_json(const zckpt_result* r, size_t* length) {
  *length = r->json.size();
  return r->json.data();
}

__attribute__((visibility("default"))) const char* zckpt_result_bytes(const zckpt_result* r, size_t i,
                                                                      size_t* length) {
  if (i >= r->reply.bytes().size()) {
    *length = 0;
    return nullptr;
  }
  const std::string& b = r->reply.bytes()[i];
  *length = b.size();
  return b.data();
}

__attribute__((visibility("default"))) void zckpt_result_free(zckpt_result* r) { delete r; }

}  // extern "C"
