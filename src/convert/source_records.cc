#include "convert/source_records.h"

namespace zckpt::convert {

std::string JoinRecords(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) {
    if (i) out += '\n';
    out += names[i];
  }
  return out;
}

std::vector<std::string> SplitRecords(std::string_view joined) {
  std::vector<std::string> out;
  if (joined.empty()) return out;
  size_t start = 0;
  while (true) {
    size_t nl = joined.find('\n', start);
    out.emplace_back(joined.substr(start, nl == std::string_view::npos ? std::string_view::npos : nl - start));
    if (nl == std::string_view::npos) break;
    start = nl + 1;
  }
  return out;
}

}  // namespace zckpt::convert
