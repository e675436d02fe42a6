// Terminal styling: ANSI colour only when stdout is a terminal and the user has not
// opted out (https://no-color.org: NO_COLOR set to a non-empty value disables colour).
#pragma once

#include <cstdio>
#include <string>

namespace memsim::cli {

struct Style {
  bool color = false;

  // Whether `out` should get colour (isatty and NO_COLOR).
  static Style for_stream(std::FILE* out);

  std::string bold(const std::string& s) const { return wrap("1", s); }
  std::string dim(const std::string& s) const { return wrap("2", s); }
  std::string good(const std::string& s) const { return wrap("1;32", s); }
  std::string bad(const std::string& s) const { return wrap("1;31", s); }
  std::string warn(const std::string& s) const { return wrap("33", s); }

 private:
  std::string wrap(const char* code, const std::string& s) const {
    return color ? "\033[" + std::string(code) + "m" + s + "\033[0m" : s;
  }
};

}  // namespace memsim::cli
