// The --json report: an Analysis as the JSON object design.md specifies (key names are
// public interface; bytes are integers; a layer outside any transformer layer is null).
// Objects keep insertion order (nlohmann::ordered_json) so the file reads top-down:
// verdict and peaks first, details and raw statistics last.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "allocator/memory_stats.h"
#include "program/program.h"
#include "program/rank_info.h"
#include "scenario/scenario.h"
#include "sim/analysis/analysis.h"

namespace memsim::cli {

using Json = nlohmann::ordered_json;

// The keys every summary shares (run, replay; later compare/sweep per point):
//   fits, peak_allocated_bytes, peak_reserved_bytes, peak_requested_bytes,
//   peak_event {index, op, phase, layer, allocated_bytes, reserved_bytes,
//               requested_bytes} | null,
//   breakdown_at_peak {parameters, gradients, optimizer_state, activations, temporaries,
//                      other},
//   live_at_peak {tensor_count, bytes, by_kind {<each TensorKind>}, by_layer [{layer,
//                 bytes, tensors}], by_op [{op, bytes, tensors}],
//                 tensors [{name, count, bytes, bytes_each, kind, layer, first_layer,
//                           last_layer, op}] (every live tensor, repeats collapsed;
//                           program/tensor_names.h)},
//   top_peaks [{index, op, phase, layer, allocated_bytes, reserved_bytes,
//               requested_bytes}],
//   top_tensors [{name, kind, bytes, op, phase, layer, alloc_event}],
//   marks {forward_end, backward_end, optimizer_end: {index, allocated, reserved} | null},
//   oom null | {index, op, phase, layer, kind, tensor, requested_bytes, allocated_bytes,
//               reserved_bytes, capacity_bytes, free_bytes, message,
//               breakdown {parameters, ...: allocated when the request failed}},
//   flops {forward, backward, recompute},
//   events, events_executed, measured_from_event
Json analysis_json(const Analysis& analysis);

// torch.cuda.memory_stats()-style flat object ("allocated_bytes.all.peak": N, ...).
Json memory_stats_json(const MemoryStats& stats);

// Which rank of a distributed job the report is for (program/rank_info.h); a single-GPU run
// gives world_size 1.
Json rank_json(const RankInfo& rank);
// DeepSpeed offload's host memory (program.host, sim/parallel/deepspeed_zero.h):
//   {pinned_bytes, pageable_bytes, per_rank_bytes, ranks_per_node, per_node_bytes,
//    nvme_bytes, counts}
Json host_memory_json(const HostMemory& host);

// The simulated model (sim/analysis/parameter_count.h): {family, architecture (the Hugging Face
// model_type whose knobs are used; null for cs336 and megatron), parameter_count (the
// whole model), trainable_parameter_count (those with gradients: the LoRA adapters when
// lora is on), parameter_count_per_rank (what the simulated rank holds: its FSDP shard,
// its Megatron tensor/pipeline shard, else the whole model)}.
Json model_json(const Scenario& scenario, const RankInfo& rank);

// The text written for --json: indented, newline-terminated; bytes that are not UTF-8
// (op names from a foreign trace) are replaced rather than throwing.
std::string dump_json(const Json& j);

// Layer as JSON: null for -1 ("not in a layer").
Json layer_json(int32_t layer);

}  // namespace memsim::cli
