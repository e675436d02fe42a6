// torchtune's LoRALinear on the torchtune Llama row (model.implementation torchtune,
// graph/models/decoder_impl.cpp; docs/implementations.md "torchtune LoRA").
//
// Modelled on pytorch/torchtune v0.6.1 (a6290a5b40758f13bca61c386bc8756a49ef417e):
//  - torchtune/modules/peft/lora.py LoRALinear.__init__: nn.Linear(in, out, bias=False)
//    whose weight becomes the module's own `weight` parameter, then
//    self.dropout = nn.Dropout(p) if dropout > 0 else nn.Identity(), then lora_a =
//    nn.Linear(in, rank, bias=False) and lora_b = nn.Linear(rank, out, bias=False).
//    Registration order (model.parameters(), the optimizer's order): weight,
//    lora_a.weight, lora_b.weight. No dtype cast anywhere: the recipe builds the whole
//    model under training.set_default_dtype(dtype), so adapters share the base dtype
//    (validate_expected_param_dtype checks it; scenario/torchtune_keys.cpp refuses a
//    different lora.adapter_dtype).
//  - LoRALinear.forward (quantize_base False, not disabled):
//      out = F.linear(x, self.weight, self.bias)
//      lora_out = self.lora_a(self.dropout(x))
//      lora_out = (self.alpha / self.rank) * self.lora_b(lora_out)
//      return out + lora_out
//    Unlike PEFT's Linear.forward (graph/models/lora.cpp add_adapter_path) lora_a's
//    output is a named local: it lives through lora_b and the scaling multiply and dies
//    when `lora_out` is rebound (after the multiply's operand, lora_b's output, is
//    dropped). `out` and the scaled `lora_out` die when forward returns, after the add.
//    Saved for backward: the dropout mask (nn.Dropout = native_dropout), lora_a's input,
//    lora_a's output (lora_b's input), the adapters' weights (parameters, no bytes); the
//    base F.linear saves x only when x requires grad, never its frozen weight's grad
//    inputs (graph/ops/ops_nn.h mm_linear follows requires_grad). The Python-float
//    multiply saves nothing.
//  - recipes/lora_finetune_single_device.py _setup_model: set_trainable_params(model,
//    get_adapter_params(model)) freezes everything else (embeddings, norms, output, base
//    weights): they get no .grad and no optimizer state.
#include "graph/models/lora.h"

#include "graph/ops/ops.h"
#include "graph/ops/ops_nn.h"

namespace memsim::graph {

LoraAdapter LoraModules::add_tune_adapter(uint64_t out, uint64_t in, const std::string& module_name,
                                          const char* a_suffix, const char* b_suffix) {
  const uint64_t r = static_cast<uint64_t>(s_.lora.rank), a = s_.lora.adapter_elem;
  LoraAdapter ad;
  ad.a = rt_.add_parameter(r * in * a, module_name + a_suffix);
  ad.b = rt_.add_parameter(out * r * a, module_name + b_suffix);
  rt_.parameters()[ad.a].rows = r;
  rt_.parameters()[ad.b].rows = out;
  rt_.parameters()[ad.a].elem = static_cast<uint8_t>(a);
  rt_.parameters()[ad.b].elem = static_cast<uint8_t>(a);
  tune_adapters_.push_back(ad.a);
  tune_adapters_.push_back(ad.b);
  return ad;
}

void LoraModules::freeze_all_but_tune_adapters() {
  for (Parameter& p : rt_.parameters()) p.frozen = true;
  for (int32_t id : tune_adapters_) rt_.parameters()[id].frozen = false;
}

Tensor LoraModules::tune_adapter_path(const Tensor& x, Tensor out, const LoraAdapter& ad,
                                      uint64_t in, uint64_t out_dim) {
  if (!ad.defined()) return out;
  const uint64_t rows = s_.rows(), r = static_cast<uint64_t>(s_.lora.rank);
  const uint64_t a = s_.lora.adapter_elem;
  Tensor lora_out;
  {
    // self.lora_a(self.dropout(x)): the dropout output is an argument of the call only.
    Tensor xd = s_.lora.dropout > 0.0 ? native_dropout(rt_, x, a) : x;
    lora_out = mm_linear(rt_, xd, rt_.param(ad.a), rows * r * a, 2.0 * rows * in * r);
  }
  {
    // lora_out = (alpha / rank) * self.lora_b(lora_out)
    Tensor y = mm_linear(rt_, lora_out, rt_.param(ad.b), rows * out_dim * a, 2.0 * rows * r * out_dim);
    Tensor scaled = mul_scalar(rt_, y);
    y.reset();                     // the multiply's operand is dropped first,
    lora_out = std::move(scaled);  // then the rebinding drops lora_a's output
  }
  Tensor sum = add(rt_, out, lora_out);  // return out + lora_out
  lora_out.reset();
  out.reset();
  return sum;
}

}  // namespace memsim::graph
