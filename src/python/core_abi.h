// What the C interface's files share (include/zckpt/zckpt.h; core_abi.cc, core_abi_bytes.cc):
// the error a failed call hands out, and the guard every typed call runs its body under, so that
// nothing is thrown across the interface.
#pragma once

#include <exception>
#include <new>
#include <string>
#include <utility>

#include "python/core_calls.h"
#include "zckpt/zckpt.h"

struct zckpt_error {
  zckpt_status status;
  std::string message;
  std::string place;  // PlaceJson's text
};

namespace zckpt::python {

// The status of an error kind: include/zckpt/zckpt.h pins each ErrorKind's number.
zckpt_status StatusOf(ErrorKind kind);
// Hands `status`, `message` and `place` (none: {}) to the caller through `error` (when not null).
// It allocates nothing before its own try, so it can run in Guarded's handlers: when the error
// cannot be made, *error is null and the status alone says what failed.
zckpt_status Fail(zckpt_error** error, zckpt_status status, const char* message,
                  const ErrorPlace* place = nullptr) noexcept;

// Runs `body` (which returns nothing); any exception becomes the status and error it means.
template <class Body>
zckpt_status Guarded(zckpt_error** error, Body&& body) noexcept {
  try {
    std::forward<Body>(body)();
    return ZCKPT_OK;
  } catch (const Error& e) {
    return Fail(error, StatusOf(e.kind()), e.what(), &e.place());
  } catch (const std::bad_alloc&) {
    return Fail(error, ZCKPT_ERROR_HOST_MEMORY, "out of host memory");
  } catch (const std::exception& e) {
    return Fail(error, ZCKPT_ERROR_INTERNAL, e.what());
  } catch (...) {
    return Fail(error, ZCKPT_ERROR_INTERNAL, "an unknown exception");
  }
}

}  // namespace zckpt::python
