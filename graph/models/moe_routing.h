// The routing assumption of a mixture-of-experts run (model.moe.routing, docs/moe.md): how
// many of a layer's tokens x top_k slots each expert receives. The router's choice is
// data-dependent, so memsim never guesses it: the scenario names one of these rules, and
// every size in the expert loop follows from the counts it gives.
//
// Contract: routed_tokens returns `experts` counts that sum to tokens * top_k, each at most
// `tokens` (a token picks an expert once), or throws std::invalid_argument naming what is
// wrong (the scenario reader checks counts first, so that is a programming error).
//  - balanced:   floor(T*K / E) each; the first (T*K mod E) experts get one more.
//  - worst_case: experts 0..K-1 get every token (T each), the others none.
//  - skew ALPHA: expert e's share is (e+1)^-ALPHA / sum_j (j+1)^-ALPHA of T*K (Zipf-like;
//                ALPHA 0 is balanced). Shares above T are capped at T and the excess
//                re-spread over the uncapped experts by the same weights, until none exceeds
//                T; then largest-remainder rounding (ties to the lower expert) makes them
//                integers.
//  - counts:     the given list: E entries for every MoE layer, or (MoE layers x E)
//                entries, layer `moe_layer` taking its own row.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "graph/models/decoder_spec.h"

namespace memsim::graph {

std::vector<int64_t> routed_tokens(const MoeSpec& m, int64_t tokens, int64_t moe_layer);

// "balanced", "worst-case", "skew:1.2", "counts:[...]" (the report's spelling).
std::string describe_routing(const MoeSpec& m);

}  // namespace memsim::graph
