// The FITS warning "setup_cache" (docs/moe.md "Reserved much larger than allocated",
// docs/advice.md): most of a run's reserved memory is the cache its setup left behind.
//
// Why: FSDP or FSDP2 over a model built whole on the GPU (parallel.fsdp_init: gpu,
// `FSDP(model.cuda())` / `fully_shard` of a GPU model) frees each unsharded parameter once
// its shard exists, and PyTorch's caching allocator keeps those segments reserved: only
// torch.cuda.empty_cache() or an out-of-memory retry (release_cached_blocks) returns them,
// and the step reuses a cached block only when a request on the same stream fits in it
// (blocks of two segments never merge). A model with large 3-D expert weights leaves
// segments the step's requests barely use: Qwen3-30B-A3B over 8 GPUs keeps 54 GiB of
// 768 / 384 MiB expert segments reserved beside an 11 GiB step. memsim's allocator shows
// this byte for byte; the warning says where it comes from and what the alternative
// reserves, simulated (tools/reserved_report.py breaks a --snapshot down by segment).
//
// Contract: setup_cache_warning(scenario, analysis) is nullopt unless the run fits, shards
// with fsdp or fsdp2 built on the GPU (!parallel.fsdp_init_on_cpu) and its peak reserved
// is at least kSetupCacheRatio x its peak allocated. Then it runs the same scenario with
// only parallel.fsdp_init: cpu (and, when expandable segments are off, once more with
// allocator.expandable_segments: true as well), streamed as `memsim run` runs it, and
// returns the warning (kind "setup_cache") only when the first of those fits and its peak
// reserved is at least kSetupCacheSaving of the original's lower. The message gives the
// ratio and both simulated peaks; no estimate is made without simulating.
#pragma once

#include <optional>

#include "scenario/scenario.h"
#include "sim/analysis/analysis.h"
#include "sim/analysis/headroom.h"

namespace memsim::cli {

// Peak reserved / peak allocated from which the alternatives are simulated.
inline constexpr double kSetupCacheRatio = 1.5;
// The share of the peak reserved the cpu-built run must save for the warning.
inline constexpr double kSetupCacheSaving = 0.10;

std::optional<FitsWarning> setup_cache_warning(const Scenario& scenario, const Analysis& analysis);

}  // namespace memsim::cli
