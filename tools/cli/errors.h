// Exit statuses of the memsim command line (shared/docs/design.md: public interface) and
// the errors the CLI itself raises. Library errors (ScenarioError, SnapshotError,
// ConfigError) are caught in tools/memsim.cpp and mapped to kExitBadInput too.
#pragma once

#include <stdexcept>

namespace memsim::cli {

inline constexpr int kExitFits = 0;      // done, and it fits
inline constexpr int kExitBadInput = 1;  // unreadable / invalid input, unwritable output
inline constexpr int kExitUsage = 2;     // the command line itself is wrong
inline constexpr int kExitOom = 3;       // done, and it runs out of memory
inline constexpr int kExitCheckFailed = 4;  // memsim check: a numeric check failed

// Bad input the CLI detects (a file it cannot read or write). Exit status 1.
class InputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A command line that parses but makes no sense (--set without '='). Exit status 2.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace memsim::cli
