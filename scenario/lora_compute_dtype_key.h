// lora.compute_dtype (issue #15 item 5): bitsandbytes' Linear4bit compute_dtype, what
// BitsAndBytesConfig(bnb_4bit_compute_dtype=...) sets on every 4-bit linear (internal to the
// scenario loader; documented in docs/scenario-format.md and docs/qlora-prepare.md).
//
// Sources: bitsandbytes 0.49.2 (f0e6ca31) nn/modules.py Linear4bit.forward (`x =
// x.to(self.compute_dtype)`, `bnb.matmul_4bit(...).to(inp_dtype)`) and
// autograd/_functions.py MatMul4Bit (`F.dequantize_4bit(B, quant_state).to(A.dtype)`);
// transformers utils/quantization_config.py BitsAndBytesConfig (bnb_4bit_compute_dtype None
// -> torch.float32).
//
// Contract. bf16 | fp16 | fp32; needs lora.base_dtype nf4 (exit 1 naming the key
// otherwise). Unset: precision.params (the dtype memsim has always computed 4-bit linears
// in, so every scenario without the key is unchanged; note that transformers' own default
// is fp32). The model's dtype (hidden states, logits) is precision.params, or fp32 after
// lora.prepare_kbit over a 16-bit load (scenario/peft_kbit_key.h); where it differs from
// the compute dtype every 4-bit linear casts its input and output (graph/models/lora.h).
// Refused by key: a model whose 4-bit linears have biases (q/k/v, o or MLP biases) when the
// bias's dtype differs from the compute dtype, where Linear4bit.forward rebinds
// `bias.data = bias.data.to(x.dtype)` on its first call (a parameter cast memsim does not
// model); named lora.compute_dtype, or lora.prepare_kbit when the upcast causes it. And
// model.attention flash / cudnn when lora.prepare_kbit upcast a 16-bit load (fp32 q/k/v:
// those kernels take 16-bit inputs; transformers' flash_attention_2 casts them down first,
// not modelled).
#pragma once

#include "scenario/scenario.h"
#include "scenario/scenario_doc.h"

namespace memsim {
// The model's dtype after setup: fp32 when lora.prepare_kbit upcast a 16-bit load, else
// precision.params.
DType kbit_model_dtype(const Scenario& s);
// Linear4bit's compute dtype: lora.compute_dtype, or precision.params.
DType kbit_compute_dtype(const Scenario& s);
}  // namespace memsim

namespace memsim::scenario_detail {
// Reads lora.compute_dtype after lora.* and lora.prepare_kbit were read into s.
void read_lora_compute_dtype(const Doc& d, Scenario& s);
}  // namespace memsim::scenario_detail
