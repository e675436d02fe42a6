// PEFT's LoRA Linear forward inside a torch.autocast region (HF Trainer(bf16=True) over fp32
// weights with get_peft_model): LoraModules::add_adapter_path_autocast (graph/models/lora.h).
//
// Modelled from PEFT 0.21.0 src/peft/tuners/lora/layer.py, Linear.forward (vanilla LoRA, no
// variant): `result = self.base_layer(x)`; `torch_result_dtype = result.dtype`; per active
// adapter `x = self._cast_input_dtype(x, lora_A.weight.dtype)` (x.to(dtype) only when the
// dtypes differ), `result = result + lora_B(lora_A(dropout(x))) * scaling`; then
// `result = result.to(torch_result_dtype)`. Under autocast (torch 2.11 autocast_mode.cpp,
// cached_cast):
//  - the base layer is an autocast linear on a FROZEN weight (requires_grad=False): its bf16
//    copy is not cached, it is made at every call and lives as long as mm saves it (for x's
//    grad, when x requires grad): graph/autocast.cpp Autocast::weight;
//  - x is fp32 where it comes from the fp32 residual stream's norms (q/k/v, gate/up), so
//    `_cast_input_dtype` to the fp32 adapter is a no-op; where x is the low-precision output
//    of an autocast op (o_proj's attention output, down_proj's act(gate)*up) it is a real
//    fp32 copy (a `.to`, not an autocast op), the rebound `x`, alive until forward returns;
//  - lora_A(x): autocast casts lora_A (an fp32 leaf that requires grad: cached for the
//    region) and x (a new bf16 copy at every call: not a leaf parameter); mm saves both;
//  - lora_B(h): h is bf16 already, lora_B cast through the cache; mm saves h and the copy;
//  - `* scaling` (a Python float) and `result + ...` are not autocast ops: both operands
//    bf16, so bf16 outputs; `.to(torch_result_dtype)` (bf16 -> bf16) returns result itself.
// Dropout (nn.Identity at lora_dropout 0) is the only kind modelled here: lora.dropout > 0,
// bf16/fp16 adapters and a quantised base under autocast are refused by key
// (sim/step/modelled_features.cpp).
#include "graph/autocast.h"
#include "graph/models/lora.h"
#include "graph/ops/ops.h"
#include "graph/ops/ops_nn.h"

namespace memsim::graph {

Tensor LoraModules::add_adapter_path_autocast(Autocast& ac, const Tensor& x, Tensor result,
                                              const LoraAdapter& ad, uint64_t in, uint64_t out) {
  if (!ad.defined()) return result;
  const uint64_t rows = s_.rows(), r = static_cast<uint64_t>(s_.lora.rank);
  const uint64_t fp32_in = rows * in * 4;
  // x.to(lora_A.weight.dtype): a copy only for a low-precision input; the rebound name keeps
  // it until forward returns.
  Tensor xa = x.bytes == fp32_in ? x : to_copy(rt_, x, fp32_in);
  Tensor sum;
  {
    Tensor h = ac.mm_linear(xa, ad.a, static_cast<int64_t>(rows), static_cast<int64_t>(in),
                            static_cast<int64_t>(r), 2.0 * rows * in * r);
    Tensor y = ac.mm_linear(h, ad.b, static_cast<int64_t>(rows), static_cast<int64_t>(r),
                            static_cast<int64_t>(out), 2.0 * rows * r * out);
    h.reset();
    Tensor ys = mul_scalar(rt_, y);  // * scaling
    y.reset();
    sum = add(rt_, result, ys);      // bf16 + bf16
  }
  result.reset();  // `result = result + ...` drops the base output
  return sum;      // .to(torch_result_dtype): the same dtype, the same tensor
}

}  // namespace memsim::graph
