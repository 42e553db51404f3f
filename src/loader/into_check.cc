#include "loader/into_check.h"

#include <optional>

#include "zckpt/dtype.h"
#include "zckpt/error.h"
#include "zckpt/format.h"

namespace zckpt::loader {

namespace {

// "[2, 3]": shapes in messages, as Python prints a list.
std::string Dims(const std::vector<int64_t>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  return out + "]";
}

std::string Quoted(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "\"" : ", \"") + n + "\"";
  return out;
}

}  // namespace

std::string TargetProblem(const TargetFacts& target) {
  const std::string& name = target.name;
  if (!target.strided) return "target '" + name + "' is not a dense (strided) tensor";
  if (target.device.rfind("cpu", 0) != 0 && target.device.rfind("cuda", 0) != 0)
    return "target '" + name + "' is on " + target.device + ": only cpu and cuda targets are supported";
  // Wrapper subclasses (DTensor) have no storage of their own: writing through their address
  // would write to nothing. Their local tensor is the target.
  if (!target.has_storage)
    return "target '" + name + "' has no storage of its own (a tensor subclass such as DTensor: pass its local tensor)";
  return "";
}

std::string DTypeProblem(const TensorInfo& t, const TargetFacts& target) {
  const std::string saved(DTypeName(t.dtype));
  if ((t.flags & format::kTensorQuantized) || saved.rfind('q', 0) == 0)
    return "'" + target.name + "' is quantized: not supported here (a load rebuilds it through the pickle)";
  if (saved != target.dtype)
    return "dtype mismatch for '" + target.name + "': the file has " + saved + ", the target has " + target.dtype;
  return "";
}

IntoMatch CheckInto(const Container& c, const std::vector<TargetFacts>& targets, bool strict) {
  IntoMatch match;
  std::vector<bool> wanted(c.tensor_count(), false);
  std::vector<std::string> problems;
  for (size_t i = 0; i < targets.size(); ++i) {
    const TargetFacts& target = targets[i];
    std::optional<uint32_t> found = c.FindTensor(target.name);
    if (!found) {
      match.missing.push_back(target.name);
      continue;
    }
    wanted[*found] = true;
    TensorInfo t = c.tensor(*found);
    std::string why = TargetProblem(target);
    if (why.empty()) why = DTypeProblem(t, target);
    if (why.empty() && t.shape != target.shape)
      why = "size mismatch for '" + target.name + "': the file has shape " + Dims(t.shape) +
            ", the target has shape " + Dims(target.shape);
    if (!why.empty()) problems.push_back(why);
    match.matched.emplace_back(i, *found);
  }
  // Internal tensors (a DTensor's DeviceMesh) are not state entries: never "unexpected".
  for (uint32_t i = 0; i < c.tensor_count(); ++i)
    if (!wanted[i] && !(c.tensor(i).flags & format::kTensorInternal)) match.unexpected.emplace_back(c.tensor(i).name);
  if (strict && (!match.missing.empty() || !match.unexpected.empty())) {
    std::string keys;
    if (!match.missing.empty()) keys = "Missing key(s): " + Quoted(match.missing);
    if (!match.unexpected.empty()) keys += (keys.empty() ? "" : "; ") + ("Unexpected key(s): " + Quoted(match.unexpected));
    problems.push_back(keys);
  }
  if (!problems.empty()) {
    std::string msg = "cannot load " + c.path() + " into the given tensors:";
    for (const auto& p : problems) msg += "\n  " + p;
    throw Error(ErrorKind::kInvalidArgument, msg);
  }
  return match;
}

}  // namespace zckpt::loader
