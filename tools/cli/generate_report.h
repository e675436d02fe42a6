// The generate section of `memsim run`'s reports (issue #17 item 1; sim/step/generate.h):
// JSON key "generate" {prompt_len, new_tokens, cache, logits_to_keep, weights_bytes,
// kv_cache_bytes_end, kv_cache_tokens_end, kv_cache_bytes_per_token} and the text summary's
// "generate" line. Bytes are what the simulated run's cache held (GenerateFacts), not a
// formula; kv_cache_bytes_per_token is 2 x layers x kv_heads x head_dim x dtype bytes for
// the whole batch (the 2 x L x B x d x bytes).
#pragma once

#include <string>

#include "scenario/scenario.h"
#include "sim/step/generate.h"
#include "tools/cli/json_report.h"

namespace memsim::cli {

Json generate_json(const Scenario& scenario, const GenerateFacts& facts);
std::string generate_fact(const Scenario& scenario, const GenerateFacts& facts);

}  // namespace memsim::cli
