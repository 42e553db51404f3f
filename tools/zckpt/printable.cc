#include "printable.h"

#include <cstdint>
#include <cstdio>

#include "zckpt/text.h"

namespace zckpt::cli {

namespace {

// Code points that change how the text around them is shown.
bool Invisible(uint32_t cp) {
  return (cp >= 0x80 && cp <= 0x9F) ||                     // C1 controls (CSI is U+009B)
         cp == 0x061C || cp == 0x200E || cp == 0x200F ||    // bidirectional marks
         (cp >= 0x202A && cp <= 0x202E) ||                  // embeddings and overrides
         (cp >= 0x2066 && cp <= 0x2069) ||                  // isolates
         cp == 0x2028 || cp == 0x2029;                      // line and paragraph separators
}

}  // namespace

std::string Printable(std::string_view s, bool message) {
  std::string out;
  out.reserve(s.size());
  char buf[16];
  ForEachUtf8(
      s,
      [&](uint32_t cp, std::string_view bytes) {
        if (cp == '\\') out += message ? "\\" : "\\\\";
        else if (cp == '\n') out += message ? "\n" : "\\n";
        else if (cp == '\r') out += "\\r";
        else if (cp == '\t') out += "\\t";
        else if (cp < 0x20 || cp == 0x7F) {
          std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(cp));
          out += buf;
        } else if (Invisible(cp)) {
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(cp));
          out += buf;
        } else {
          out.append(bytes);
        }
      },
      [&](uint8_t byte) {
        std::snprintf(buf, sizeof buf, "\\x%02x", byte);
        out += buf;
      });
  return out;
}

}  // namespace zckpt::cli
