// What a tool that lists or explains checkpoints needs beyond the index (container.h): what the
// kept object pickle holds besides tensors, and the hint for a file that is not a container.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "zckpt/container.h"
#include "zckpt/error.h"

namespace zckpt {

// What the kept object pickle holds besides tensors: globals outside torch (kept as opaque
// objects, never run), numpy values, and the globals off zckpt's allowlist (which convert,
// export and every load refuse unless allowed by name).
struct PickleSummary {
  bool present = false;  // the container keeps an object pickle
  std::string error;     // not readable by zckpt's interpreter (then the lists may be partial)
  struct Opaque {
    std::string name;    // "module.name"
    uint64_t count = 0;  // objects built by it (or bare references to it)
  };
  std::vector<Opaque> opaque_globals;  // in order of first use
  struct Numpy {
    std::string path;            // where in the object, named as tensors are
    std::string dtype;           // numpy's dtype.str: "<u4", "|b1", ...
    std::vector<int64_t> shape;  // empty for a scalar
    bool scalar = false;         // a numpy scalar rather than an ndarray
  };
  std::vector<Numpy> numpy;
  std::vector<std::string> off_allowlist;  // "module.name", in order of first use
};

// Reads `c`'s object pickle with the restricted interpreter, judged by the deny list only (the
// pickle is handed to nothing); a pickle it refuses is reported in `error`, never thrown.
PickleSummary SummarizeObjectPickle(const Container& c);

// For an Error met opening `path` as a container (zckpt load x.pt): the same error, its message
// followed by what the file is and the `zckpt convert` to run when zckpt converts its format.
Error WithNotAContainerHint(const Error& e, const std::string& path);

}  // namespace zckpt
