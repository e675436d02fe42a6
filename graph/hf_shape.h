// Shape and options shared by the Hugging Face families (graph/hf_gpt2.h, hf_llama.h).
#pragma once

#include <cstdint>

namespace memsim::graph {

enum class HfAttention : uint8_t { eager, flash, mem_efficient };

// PEFT LoRA on the decoder layers' linear modules (graph/lora.h). rank 0 = no LoRA.
struct HfLora {
  int64_t rank = 0;
  uint32_t targets = 0;        // bit i: the family's i-th linear module (graph/lora.h)
  uint64_t adapter_elem = 4;   // lora_A / lora_B dtype
  double dropout = 0.0;        // lora_dropout (0: nn.Identity)
  bool nf4 = false;            // base linears are bitsandbytes Linear4bit (QLoRA)
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

  uint64_t rows() const { return static_cast<uint64_t>(batch * seq); }
  uint64_t head_dim() const { return static_cast<uint64_t>(d_model / heads); }
};

}  // namespace memsim::graph
