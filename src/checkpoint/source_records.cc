#include "checkpoint/source_records.h"

namespace zckpt::checkpoint {

std::string JoinRecords(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& name : names) {
    out += name;
    out += '\0';
  }
  return out;
}

bool IsPlainArchivePath(std::string_view name) {
  if (name.empty() || name.front() == '/') return false;
  for (char ch : name)
    if (ch == '\0' || ch == '\\') return false;
  size_t start = 0;
  while (start <= name.size()) {
    size_t end = name.find('/', start);
    if (end == std::string_view::npos) end = name.size();
    std::string_view part = name.substr(start, end - start);
    if (part.empty() || part == "." || part == "..") return false;
    start = end + 1;
  }
  return true;
}

bool HasVersionRecord(const std::vector<std::string>& names) {
  for (const std::string& n : names)
    if (n == "version" || n == ".data/version") return true;
  return false;
}

std::vector<std::string> SplitRecords(std::string_view joined) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start < joined.size()) {
    size_t end = joined.find('\0', start);
    if (end == std::string_view::npos) end = joined.size();  // an unterminated last name: still a name
    out.emplace_back(joined.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

}  // namespace zckpt::checkpoint
