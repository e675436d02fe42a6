// The terminal summary printed after `run` / `replay` (stdout, human units).
#pragma once

#include <cstdio>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "sim/analysis/analysis.h"
#include "tools/cli/style.h"

namespace memsim::cli {

// What the summary says about the job, beyond the Analysis.
struct SummaryHeader {
  std::string title;                                      // scenario name / trace file
  std::vector<std::pair<std::string, std::string>> facts;  // ("model", "cs336-xl ..."), ...
  std::optional<uint64_t> capacity;  // bytes the allocator may use; nullopt = unlimited
  // What to say about the capacity when `capacity` is nullopt.
  std::string capacity_text = "unlimited capacity";
  // First event of the measured step (the Program's "measured_step_begin" mark, executed
  // or not); 0 = the whole run is measured. Labels then say which part an event is in
  // ("setup", "warm-up", "measured step"): warm-up and measured steps run the same ops.
  size_t measured_from = 0;
  int64_t warmup_steps = 0;  // training steps run before the measured one
  // --- issue #19 item 2 (tools/cli/headroom_report.h): the verdict's distance to the
  // limit. A FITS run with warnings prints "FITS (warning: SHORT; SHORT)" and one line per
  // warning; an OOM prints `needed` ("needs X reserved, Y over the Z usable") under it.
  std::vector<std::pair<std::string, std::string>> warnings;  // (short text, message)
  std::string needed;
};

// Prints: title and facts, the FITS / OUT OF MEMORY verdict, peak allocated / reserved
// and where the peak is, the breakdown at the peak (aligned table), the largest live
// tensors there, the other distinct peaks, the phase marks, FLOPs, and for an OOM the
// failing request with PyTorch's message.
void print_summary(std::FILE* out, const SummaryHeader& header, const Analysis& analysis,
                   const Style& style);

// "1.23 TFLOP"-style count for FLOPs.
std::string human_flops(double flops);

}  // namespace memsim::cli
