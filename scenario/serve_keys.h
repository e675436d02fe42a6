// Reading the `serve:` section (issue #17 items 2-4; internal to the scenario loader). The
// keys are documented in docs/scenario-format.md, the planners they drive in docs/serve.md.
//
// Contract: a scenario with no serve.* key has serve.present == false and every field at
// its default (the other commands are unchanged). Each key is checked where it is read,
// with the engine's own wording where it has one, and the error names FILE:LINE and the
// key: serve.engine (vllm | sglang), serve.gpu_memory_utilization in (0, 1] (vLLM only),
// serve.mem_fraction_static in (0, 1) (SGLang only), serve.max_model_len in
// [1, model.context_length] (vLLM's max_position_embeddings check), serve.block_size one
// of vLLM's 1, 8, 16, 32, 64, 128 (SGLang: any page size >= 1), serve.kv_cache_dtype
// (auto | fp8 | int8; int8 is refused: neither engine has an int8 KV cache on CUDA),
// serve.tensor_parallel >= 1, serve.quantization (none | fp8 | int8 | int4 | nf4),
// serve.nccl_memory (a size), serve.fused_moe_chunk_size >= 1 (vLLM only). Checks
// that need the device (the batch defaults) are made by the planner (sim/serve/).
#pragma once

#include "scenario/scenario.h"
#include "scenario/scenario_doc.h"

namespace memsim::scenario_detail {
// After the model (context length) is built.
void read_serve(const Doc& d, Scenario& s);
}  // namespace memsim::scenario_detail
