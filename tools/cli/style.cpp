#include "tools/cli/style.h"

#include <cstdlib>

#include <unistd.h>

namespace memsim::cli {

Style Style::for_stream(std::FILE* out) {
  Style s;
  const char* no_color = std::getenv("NO_COLOR");
  const bool opted_out = no_color != nullptr && no_color[0] != '\0';
  s.color = !opted_out && out != nullptr && isatty(fileno(out)) == 1;
  return s;
}

}  // namespace memsim::cli
