// Reading a file mapping without dying when the file shrinks underneath.
//
// Touching a mapped page past the end of a file that another process truncated raises SIGBUS,
// whose default action kills the process. GuardedCall runs a piece of code over a range of a
// mapping and turns that SIGBUS into a `false` return, so a reader of the mapping (the loader's
// mmap method, the verifier) can report "the file shrank" like a short pread. How: a process-wide
// SIGBUS handler (installed on first use, chaining to whatever handler was there before) that,
// when the faulting address lies in the range the current thread guards, siglongjmps back into
// GuardedCall; any other SIGBUS goes to the previous handler (or the default action) exactly as
// without zckpt.
//
// Leaving the guarded code by siglongjmp abandons it half way, so it must be plain code over the
// bytes: no lock taken, nothing allocated, nothing whose destructor has to run (a memcpy, an XXH3
// update, a zero test).
#pragma once

#include <cstddef>

namespace zckpt {

// Runs fn(ctx); false when it touched a page of [begin, begin + n) that raised SIGBUS (fn was
// then abandoned where it stood). Thread-safe.
bool GuardedCall(const void* begin, size_t n, void (*fn)(void*), void* ctx);

// GuardedCall of a callable (see above for what it may do).
template <typename Fn>
bool Guarded(const void* begin, size_t n, Fn& fn) {
  return GuardedCall(begin, n, [](void* f) { (*static_cast<Fn*>(f))(); }, &fn);
}

// Copies n bytes from `src` (inside a file mapping) to `dst`; false when a page of the source
// raised SIGBUS (dst is then partly written).
bool GuardedCopy(void* dst, const void* src, size_t n);

}  // namespace zckpt
