// Progress of a sweep or a search on stderr (stdout carries the results), shown only once
// the work has run for a second, so quick runs print nothing:
//  - stderr a terminal: one bar redrawn in place ("\r"), finished with a newline;
//  - otherwise (a log file, CI): a plain line at every 10% ("memsim: sweep: 40% (4/10
//    points, 2.1 s)"), no carriage returns; with -v these are log lines ("memsim: info:
//    sweep: 40% (4/10)") from the start.
// operator() is called serialized (run_parallel's contract) with (done, total).
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

namespace memsim::cli {

class Progress {
 public:
  explicit Progress(std::string what, std::string unit = "points");
  void operator()(size_t done, size_t total);

 private:
  std::string what_;
  std::string unit_;
  bool tty_;
  bool verbose_;
  std::chrono::steady_clock::time_point start_;
  int last_ = -1;       // last percent drawn (terminal) or tenth printed (log)
  bool shown_ = false;  // anything printed yet
};

}  // namespace memsim::cli
