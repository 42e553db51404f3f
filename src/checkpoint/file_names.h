// Small helpers on file names shared by the converter and the source classifier.
#pragma once

#include <string>
#include <string_view>

namespace zckpt::checkpoint {

// The part after the last '/'.
std::string BaseName(const std::string& path);
// ASCII lower case (extensions are compared case-insensitively: MODEL.PT is a .pt).
std::string AsciiLower(std::string s);
bool EndsWith(std::string_view s, std::string_view tail);

}  // namespace zckpt::checkpoint
