// transformers 5.x's mask preamble of the training forward (docs/transformers5-mask.md):
// position ids and masking_utils.create_causal_mask / create_sliding_window_causal_mask with
// no 2-D attention mask, no cache and no position ids passed in (a plain
// `model(input_ids=..., labels=...)` training call, use_cache False). Internal to
// graph/models (decoder.cpp's forward_hidden and layer()).
//
// Which rows: transformers 5.x's code, i.e. the rows with 5.x's layout
// (scenario/transformers_version.cpp apply_v5_layout: model.transformers: 5 and the MoE /
// DeepSeek rows), marked by DecoderArch::masking_utils; a v4 row keeps v4's mask code.
#pragma once

#include "graph/models/hf_shape.h"
#include "graph/ops/ops.h"

namespace memsim::graph {

inline bool uses_masking_utils(const DecoderArch& a) { return a.masking_utils; }

// position_ids = torch.arange(S) + past_seen_tokens (0): S*8 bytes, kept by the caller.
Tensor v5_position_ids(Runtime& rt, const HfShape& s);

// The forward's masks as 5.x builds them: `mask` is what every layer takes unless it slides
// and `sliding` is defined (Gemma-2 and Qwen2-MoE build the dict of both). Both stay
// undefined for SDPA / flash (sdpa_mask returns None; the packed-sequence check still runs).
void v5_masks(Runtime& rt, const HfShape& s, Tensor& mask, Tensor& sliding);

}  // namespace memsim::graph
