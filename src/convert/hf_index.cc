#include "convert/hf_index.h"

#include <nlohmann/json.hpp>

#include "zckpt/convert.h"
#include "zckpt/error.h"

namespace zckpt::convert {

namespace {

constexpr std::string_view kSuffix = ".index.json";
constexpr int kMaxDepth = 64;  // an index is three levels deep; a deeper file is not one

}  // namespace

bool IsShardIndexName(const std::string& name) {
  if (name.size() <= kSuffix.size() || name.compare(name.size() - kSuffix.size(), kSuffix.size(), kSuffix) != 0)
    return false;
  return IsCheckpointName(name.substr(0, name.size() - kSuffix.size()));
}

std::string RewriteShardIndex(std::string_view json, const std::function<std::optional<std::string>(const std::string&)>& rename,
                              const std::string& path) {
  using Json = nlohmann::ordered_json;
  Json index;
  try {
    index = Json::parse(json.begin(), json.end(), [](int depth, Json::parse_event_t, Json&) {
      if (depth > kMaxDepth) throw Error(ErrorKind::kCorrupt, "nested deeper than " + std::to_string(kMaxDepth) + " levels");
      return true;
    });
  } catch (const Json::exception& e) {
    throw Error(ErrorKind::kCorrupt, path + ": not a shard index: not valid JSON: " + e.what());
  } catch (const Error& e) {
    throw Error(ErrorKind::kCorrupt, path + ": not a shard index: " + e.what());
  }
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
    throw Error(ErrorKind::kCorrupt, path + ": not a shard index: no \"weight_map\" object");
  for (auto& [tensor, shard] : index["weight_map"].items()) {
    if (!shard.is_string())
      throw Error(ErrorKind::kCorrupt, path + ": weight_map entry '" + tensor + "' is not a file name");
    if (auto renamed = rename(shard.get<std::string>())) shard = *renamed;
  }
  return index.dump(2) + "\n";
}

}  // namespace zckpt::convert
