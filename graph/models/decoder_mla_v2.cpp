// DeepSeek-V2's RoPE table (graph/models/decoder.h; docs/deepseek.md "DeepSeek-V2"):
// DeepseekV2RotaryEmbedding as transformers 5.17.0 writes it
// (transformers/models/deepseek_v2/modeling_deepseek_v2.py of the 5.17.0 wheel). The model's
// rotary module returns one complex64 table, freqs_cis (1, S, rope/2):
// position_ids[:, None, :].float(), inv_freq @ positions (a matmul), torch.polar(
// ones_like(freqs), freqs), `freqs_cis * attention_scaling` (a new table: the polar result
// dies at the rebinding), under no_grad; S*rope*4 bytes whatever the model dtype (no
// .to(dtype)); it is passed to every layer and saved by each rotation's MulBackward0. The
// attention itself (apply_rotary_emb on this table, expand_kv) is decoder_mla.cpp's, shared
// with DeepSeek-V3.
#include "graph/checkpoint.h"
#include "graph/models/decoder.h"
#include "graph/ops/ops_mla.h"
#include "graph/ops/ops_nn.h"

namespace memsim::graph {

Tensor DecoderModel::rope_table_complex() {
  const uint64_t S = s_.seq * static_cast<uint64_t>(s_.pos_batch), rd = s_.rotary_dim();
  const bool was = rt_.grad_enabled;
  rt_.grad_enabled = false;
  // inv_freq[None, :, None].float().expand(...): the fp32 buffer itself (a view).
  Tensor pos = new_tensor(rt_, S * 4, OpKind::to_copy, TensorKind::temporary);  // position_ids.float()
  Tensor freqs = new_tensor(rt_, rd / 2 * S * 4, OpKind::bmm, TensorKind::temporary);
  rt_.note_gemm();  // inv_freq @ positions: the step's first cuBLAS call (as rope_tables)
  Tensor table;
  {
    Tensor polar;
    {
      Tensor ones = new_tensor(rt_, rd / 2 * S * 4, OpKind::fill, TensorKind::temporary);  // ones_like
      polar = new_tensor(rt_, S * rd * 4, OpKind::other);  // torch.polar: complex64 (S, rd/2)
    }
    table = new_tensor(rt_, S * rd * 4, OpKind::mul_scalar);  // freqs_cis * attention_scaling
  }
  // The frame's locals die in declaration order: position_ids_expanded, freqs.
  pos.reset();
  freqs.reset();
  rt_.grad_enabled = was;
  return table;
}

}  // namespace memsim::graph
