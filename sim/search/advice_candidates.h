// The changes `memsim run --advise` tries (issue #19 item 2): each one a set of scenario
// overrides, as `--set KEY=VALUE` would give them, that memsim can simulate itself.
//
// Contract: advice_candidates(scenario) looks only at the loaded scenario (its family,
// step kind, optimizer, loss, checkpointing, parallelism and allocator settings) and
// lists, in this order, the changes that differ from what it already does:
//   - optimizer: torch.optim Adam/AdamW `foreach` or `for-loop` -> `fused`; Adam/AdamW ->
//     bitsandbytes 8-bit (`adam8bit` / `adamw8bit`), not for megatron;
//   - activation checkpointing (steps with a backward): `full`, `selective`, torchtitan's
//     `sac-op` (hf-* families);
//   - micro-batch divided by its smallest prime factor p with grad_accum times p (the same
//     global batch; a `train` step with micro_batch >= 2);
//   - loss (hf-* families, a step with a loss): torchtune's `chunked:8` (the N its
//     recipes use) and Liger's fused linear cross-entropy;
//   - `allocator.expandable_segments: true`;
//   - FSDP / FSDP2 built on the GPU: `parallel.fsdp_init: cpu` (the setup's cached
//     segments, tools/cli/setup_cache_report.h);
//   - offload: saved activations to the host (`checkpoint.offload_activations`), FSDP's
//     CPUOffload with FSDP / FSDP2, DeepSpeed's `offload_optimizer: cpu` with ZeRO 2/3;
//   - more GPUs with sharding: `parallel.data` x2, x4, x8 with the scenario's sharding
//     (FSDP FULL_SHARD built on the CPU, `parallel.sharding: fsdp` with `parallel.fsdp_init:
//     cpu`, when it has none; megatron: its
//     distributed optimizer, `parallel.zero: 1`), keeping the per-GPU micro-batch (the
//     global batch grows with the GPUs); with plain DDP over D > 1 GPUs also FSDP over
//     the same D.
// It does not check that memsim accepts a change: the caller simulates each one and
// skips those the scenario loader or the Program builder refuses (a refused change is
// reported as skipped, never approximated). Adding a candidate here is all it takes for
// `--advise` to try it.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "scenario/scenario.h"

namespace memsim {

struct AdviceCandidate {
  std::string change;  // what it does, in words ("fused AdamW (optimizer.impl fused)")
  std::vector<std::pair<std::string, std::string>> sets;  // the --set KEY=VALUE overrides
};

std::vector<AdviceCandidate> advice_candidates(const Scenario& scenario);

}  // namespace memsim
