// Shape and options of a Hugging Face decoder (graph/models/decoder.h): the run's dimensions and
// the architecture row (graph/models/decoder_spec.h).
#pragma once

#include <cstdint>

#include "graph/models/decoder_spec.h"
#include "graph/models/float8_spec.h"

namespace memsim::graph {

enum class HfAttention : uint8_t { eager, flash, mem_efficient, cudnn };  // cudnn: graph/ops/ops_sdpa_cudnn.h

// PEFT LoRA on the decoder layers' linear modules (graph/models/lora.h). rank 0 = no LoRA.
struct HfLora {
  int64_t rank = 0;
  uint32_t targets = 0;        // bit i: the family's i-th linear module (graph/models/lora.h)
  uint64_t adapter_elem = 4;   // lora_A / lora_B dtype
  double dropout = 0.0;        // lora_dropout (0: nn.Identity)
  bool nf4 = false;            // base linears are bitsandbytes Linear4bit (QLoRA)
  // nf4 only (graph/models/lora.h; 0: elem). quant_elem: QuantState.dtype, the dtype the
  // weights were loaded in and dequantize_4bit writes; compute_elem: Linear4bit's
  // compute_dtype (its input is cast to it, its output back to the input's dtype).
  uint64_t quant_elem = 0, compute_elem = 0;
  // prepare_model_for_kbit_training over a 16-bit load: every parameter that is not a
  // Params4bit was built in this dtype, then cast to elem (fp32) before get_peft_model. 0: none.
  uint64_t upcast_from_elem = 0;
  // PEFT's enable_input_require_grads hook: the frozen embedding's output is made a leaf
  // that requires grad (Runtime::requires_grad_), so reentrant checkpoints get grads.
  bool input_require_grads = false;
};

struct HfShape {
  int64_t layers = 0, d_model = 0, heads = 0, kv_heads = 0, d_ff = 0, vocab = 0;
  int64_t context_length = 0;  // n_positions (GPT-2 wpe and causal `bias` buffer)
  int64_t batch = 1, seq = 1;
  uint64_t elem = 4;           // parameter / activation element size
  double dropout = 0.0;        // attn/resid/embd pdrop (GPT-2), attention_dropout (LLaMA)
  bool tied = false;           // lm_head.weight is the token embedding (GPT-2: true)
  HfAttention attention = HfAttention::eager;
  HfLora lora;
  // torchao float8 training (precision.float8): every decoder-layer projection is a
  // Float8Linear (graph/ops/ops_float8.h, ops_float8_rowwise.h); the lm_head stays nn.Linear.
  Float8Kind float8 = Float8Kind::none;
  DecoderArch arch;            // which shared modules the layers use (graph/models/decoder.h)
  // --- generation (issue #17; graph/models/kv_cache.h, sim/step/generate.h): one forward of
  // HF generate. keys: the key length the attention sees (past + seq with a DynamicCache,
  // max_cache_len with a StaticCache); 0 = seq (training). pos_batch: rows of position_ids
  // (1 in training: cache_position.unsqueeze(0); batch in generate: the attention mask's
  // cumsum), which sizes the RoPE tables.
  int64_t keys = 0;
  int64_t pos_batch = 1;
  // Context parallelism (parallel.context; graph/ops/ops_ring.h): seq is this rank's S/cp
  // and the SDPA call runs as torch's ring attention; cp_rank is the rank modelled.
  int64_t cp = 1;
  uint32_t cp_rank = 0;
  bool cp_alltoall = false;

  uint64_t rows() const { return static_cast<uint64_t>(batch * seq); }
  uint64_t key_len() const { return static_cast<uint64_t>(keys > 0 ? keys : seq); }
  uint64_t head_dim() const {
    return static_cast<uint64_t>(arch.head_dim > 0 ? arch.head_dim : d_model / heads);
  }
  // Width of the attention's q (and o_proj's input): heads x head_dim.
  uint64_t q_dim() const { return static_cast<uint64_t>(heads) * head_dim(); }
  uint64_t kv_dim() const { return static_cast<uint64_t>(kv_heads) * head_dim(); }
  uint64_t rotary_dim() const {
    return arch.rotary_dim > 0 ? static_cast<uint64_t>(arch.rotary_dim) : head_dim();
  }
};

}  // namespace memsim::graph
