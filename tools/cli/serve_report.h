// The reports of `memsim serve` (issue #17 item 4; docs/serve.md): the planner's arithmetic
// line by line as a vLLM (or SGLang) start-up log shows it, the JSON object, and a
// self-contained HTML page with the KV budget.
//
// Contract: every number printed comes from the ServePlan; nothing is recomputed here
// except the display conversions (GiB with two decimals, as vLLM logs them). The JSON
// keys weights_bytes, activation_peak_bytes (null for SGLang, which does not profile),
// non_torch_bytes, kv_cache_bytes, num_gpu_blocks, kv_cache_tokens, max_concurrency and
// max_model_len_that_fits are the interface; the rest are extra context. The HTML
// page references no external resource and escapes all text.
#pragma once

#include <cstdio>
#include <optional>
#include <string>

#include "scenario/scenario.h"
#include "sim/serve/serve_plan.h"
#include "tools/cli/json_report.h"

namespace memsim::cli {

// Answers to the inverse flags of `memsim serve`, when asked.
struct ServeInverse {
  std::optional<int64_t> seqs_len;        // --max-seqs LEN
  int64_t seqs_that_fit = 0;
  bool min_tp_asked = false;              // --min-tp [MAX]
  int64_t min_tp_max = 0;
  serve::MinTpResult min_tp;
};

void write_serve_text(std::FILE* out, const Scenario& s, const serve::ServePlan& plan,
                      const ServeInverse& inverse);
Json serve_json(const Scenario& s, const serve::ServePlan& plan, const ServeInverse& inverse);
void write_serve_html(std::FILE* out, const Scenario& s, const serve::ServePlan& plan);

}  // namespace memsim::cli
