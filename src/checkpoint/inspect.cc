// include/zckpt/inspect.h: what `zckpt ls` shows beyond the index, and the not-a-container hint.
#include "zckpt/inspect.h"

#include "checkpoint/source_kind.h"
#include "pickle/safety.h"
#include "pickle/torch_model.h"
#include "pickle/unpickler.h"
#include "zckpt/format.h"

namespace zckpt {

PickleSummary SummarizeObjectPickle(const Container& c) {
  PickleSummary out;
  auto blob = c.FindBlob(format::kObjectPickleBlob);
  if (!blob) return out;
  out.present = true;
  try {
    pickle::UnpickleOptions describe;
    describe.globals = pickle::GlobalPolicy::kDenyListOnly;
    pickle::UnpickleResult tree = pickle::Unpickle(c.CheckedBlobBytes(*blob), describe);
    const pickle::GlobalVetter allowlist(pickle::GlobalPolicy::kAllowList, {});
    for (const pickle::GlobalRef& g : tree.globals)
      if (allowlist.Refusal(g.module, g.name)) out.off_allowlist.push_back(g.module + "." + g.name);
    pickle::TorchPickle model = pickle::InterpretTorchPickle(tree);
    for (const pickle::OpaqueGlobal& g : model.opaque_globals) out.opaque_globals.push_back({g.name, g.count});
    for (const pickle::NumpyValue& v : model.numpy) out.numpy.push_back({v.path, v.dtype, v.shape, v.scalar});
  } catch (const Error& e) {
    out.error = e.what();
  }
  return out;
}

Error WithNotAContainerHint(const Error& e, const std::string& path) { return checkpoint::WithNotAContainerHint(e, path); }

}  // namespace zckpt
