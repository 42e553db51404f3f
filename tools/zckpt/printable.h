// Names, keys and messages taken from a file, made safe to print on a terminal.
//
// A tensor name is whatever bytes the file holds: a newline in it would forge a row of `zckpt ls`,
// an escape sequence would drive the terminal (move the cursor, rewrite earlier lines, set the
// window title), a bidirectional override would reorder what is shown. Printable() shows every
// such byte as an escape instead, so one name is always one visible, unambiguous run of text.
#pragma once

#include <string>
#include <string_view>

namespace zckpt::cli {

// `s` with these escaped: backslash as "\\"; newline, carriage return, tab as \n \r \t; other
// C0 controls and DEL as \xNN; bytes that are not UTF-8 as \xNN; C1 controls, line/paragraph
// separators and bidirectional controls as \uXXXX. With `message` (an error message, several
// lines on purpose, read by a person): '\n' and backslashes pass through, everything else is
// escaped as above, so no name quoted in it can drive the terminal.
std::string Printable(std::string_view s, bool message = false);

}  // namespace zckpt::cli
