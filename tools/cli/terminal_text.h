// Text from input files (a scenario's name, a file name, an error message quoting a
// value) made safe for a terminal (issue #20 item 4, hardening helper): a name holding
// ESC [ 2 J would otherwise clear the user's screen, or rewrite earlier lines.
//
// Contract: printable() returns `text` with every C0 control byte (0x00-0x1f), DEL (0x7f)
// and UTF-8-encoded C1 control (U+0080-U+009F, bytes C2 80..C2 9F) written as \xNN (the
// C1 ones as \u00NN); with keep_newlines, '\n' and '\t' stay as they are (multi-line
// error messages). Other bytes, UTF-8 letters included, are unchanged, so printable text
// (every shipped scenario's name) comes out byte-identical.
#pragma once

#include <string>
#include <string_view>

namespace memsim::cli {

std::string printable(std::string_view text, bool keep_newlines = false);

}  // namespace memsim::cli
