#include "tools/cli/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <utility>

#include <spdlog/spdlog.h>

namespace memsim::cli {

namespace {
constexpr double kQuietSeconds = 1.0;  // work shorter than this shows no progress
}

Progress::Progress(std::string what, std::string unit)
    : what_(std::move(what)),
      unit_(std::move(unit)),
      tty_(isatty(fileno(stderr)) != 0),
      verbose_(spdlog::should_log(spdlog::level::info)),
      start_(std::chrono::steady_clock::now()) {}

void Progress::operator()(size_t done, size_t total) {
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const int percent = static_cast<int>(100 * done / std::max<size_t>(total, 1));
  if (tty_) {
    if (seconds < kQuietSeconds && !shown_) return;
    if (percent == last_ && done != total) return;
    const int filled = percent * 30 / 100;
    std::fprintf(stderr, "\r%s [%s%s] %3d%% (%zu/%zu %s, %.0f s)", what_.c_str(),
                 std::string(static_cast<size_t>(filled), '#').c_str(),
                 std::string(static_cast<size_t>(30 - filled), ' ').c_str(), percent, done, total,
                 unit_.c_str(), seconds);
    if (done == total) std::fputc('\n', stderr);
    std::fflush(stderr);
    last_ = percent;
    shown_ = true;
    return;
  }
  // Off a terminal: a line per 10%, from the start with -v (the log), else once the work
  // has run a second.
  if (!verbose_ && seconds < kQuietSeconds && !shown_) return;
  if (percent / 10 == last_) return;
  last_ = percent / 10;
  shown_ = true;
  if (verbose_) {
    spdlog::info("{}: {}% ({}/{})", what_, percent, done, total);
  } else {
    std::fprintf(stderr, "memsim: %s: %d%% (%zu/%zu %s, %.1f s)\n", what_.c_str(), percent, done,
                 total, unit_.c_str(), seconds);
    std::fflush(stderr);
  }
}

}  // namespace memsim::cli
