// `memsim --version`: the project version and, when built from a git checkout, the
// commit ("memsim 0.1 (git 0aa33e3c1d2e+dirty)"). Defined in the build tree's
// generated/version.cpp, which tools/version.cmake rewrites when the text changes.
#pragma once

namespace memsim::cli {

const char* version_text();

}  // namespace memsim::cli
