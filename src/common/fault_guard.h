// Copying out of a file mapping without dying when the file shrinks underneath.
//
// Touching a mapped page past the end of a file that another process truncated raises SIGBUS,
// whose default action kills the process. GuardedCopy is a memcpy from a mapping that turns that
// SIGBUS into a `false` return, so a reader that must use the mapping (the loader's mmap method)
// can report "the file shrank" like a short pread. How: a process-wide SIGBUS handler (installed
// on first use, chaining to whatever handler was there before) that, when the faulting address
// lies in the range the current thread is copying, siglongjmps back into GuardedCopy; any other
// SIGBUS goes to the previous handler (or the default action) exactly as without zckpt.
//
// Only plain memcpy runs under the guard (nothing that takes a lock or allocates), which is what
// makes leaving it by siglongjmp safe.
#pragma once

#include <cstddef>

namespace zckpt {

// Copies n bytes from `src` (inside a file mapping) to `dst`; false when a page of the source
// raised SIGBUS (dst is then partly written). Thread-safe.
bool GuardedCopy(void* dst, const void* src, size_t n);

}  // namespace zckpt
