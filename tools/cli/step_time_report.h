// The time model's estimate in the reports (issue #18 item 1; sim/analysis/step_time.h):
// the `estimated_step_seconds` JSON object of `run` and of each `compare` policy, and the
// TIME line of the text summaries.
//
// JSON (estimated):  {"total": s, "forward": s, "backward": s, "recompute": s,
//                     "optimizer": s, "communication": s, "transfer": s, "mfu": f,
//                     "mfu_dtype": "bf16", "model_flops": F, "recompute_flops": F}
// JSON (refused):    {"total": null, "refused": "KEY: why"}
// The FLOPs here are the measured step's (the top-level "flops" count the whole run).
#pragma once

#include <cstdio>
#include <string>

#include "sim/analysis/step_time.h"
#include "tools/cli/json_report.h"
#include "tools/cli/style.h"

namespace memsim::cli {

Json step_time_json(const StepTime& t);
// "1.234 s (forward 0.3 s, ...); MFU 41.2% of the bf16 peak" or "not estimated: why".
std::string step_time_text(const StepTime& t);
// Seconds as a short human string ("812 ms", "1.23 s").
std::string human_seconds(double s);
// `qualifier` goes before the estimate ("with unlimited memory: " for an OOM run).
void print_step_time(std::FILE* out, const StepTime& t, const Style& style,
                     const std::string& qualifier = "");

}  // namespace memsim::cli
