// PEFT LoRA and QLoRA on the Hugging Face families' linear modules (graph/models/decoder*.cpp),
// written against graph::Runtime.
//
// Mirrors PEFT (0.10-0.13, tuners/lora/layer.py Linear.forward) and bitsandbytes
// (0.41-0.43, nn.Linear4bit / functional.quantize_4bit):
//  - get_peft_model freezes every base parameter (requires_grad=False: no .grad, no
//    optimizer state) and adds, per targeted module, lora_A (r x in) and lora_B
//    (out x r) without bias, in lora.adapter_dtype (PEFT >= 0.12 upcasts adapters of a
//    16-bit base to fp32 by default: autocast_adapter_dtype=True).
//  - forward: result = base_layer(x); x = x.to(lora_A.weight.dtype) (a copy when the
//    dtypes differ); result = result + lora_B(lora_A(dropout(x))) * scaling (dropout:
//    nn.Dropout = native_dropout with its bool mask, or nn.Identity when lora_dropout is
//    0); result.to(the base result's dtype) (a copy when they differ). Saved for backward:
//    dropout's mask, lora_A's input (the dropout output, or x itself), lora_B's input
//    (x @ A^T, rows x r); the base matmul saves nothing, its weight having no grad.
//  - QLoRA (lora.base_dtype nf4): the decoder layers' linear weights are Params4bit:
//    NF4 codes packed two per byte (ceil(n/2) bytes), blocksize 64, double quantisation
//    (compress_statistics=True): absmax quantised to uint8 (one byte per 64 values) with
//    an fp32 absmax per 256 of those blocks, an fp32 offset (0-d) and the 16-entry fp32
//    NF4 code per weight, and the 256-entry fp32 dynamic map shared by all weights.
//    Embeddings, norms and lm_head stay in precision.params (transformers keeps lm_head
//    unquantised), and so do parameters that are not nn.Linear weights: transformers 5.x's
//    replace_with_bnb_linear swaps nn.Linear / Conv1D modules only, so a mixture-of-experts
//    model's routers and 3-D routed experts stay in precision.params (docs/moe.md "QLoRA").
//    Forward and backward dequantise per call (graph/ops/ops_lora.h).
//  - bitsandbytes' dtypes (bitsandbytes 0.49.2 f0e6ca31 nn/modules.py Linear4bit.forward):
//    `inp_dtype = x.dtype; x = x.to(compute_dtype)` (a copy when they differ, a local until
//    forward returns), bnb.matmul_4bit dequantises the weight in quant_state.dtype (the load
//    dtype, HfLora::quant_elem) and copies it to the compute dtype (HfLora::compute_elem)
//    when they differ, and the output is cast back: `.to(inp_dtype)` (the compute-dtype
//    output a temporary of the expression). The casts' backward is a cast of the grad.
//  - prepare_model_for_kbit_training over a 16-bit load (HfLora::upcast_from_elem): the
//    model is built in the load dtype, then every parameter that is not a Params4bit is
//    cast to fp32 in registration order (`param.data = param.data.to(torch.float32)`: the
//    fp32 copy allocated, the 16-bit storage freed), then empty_cache(); the model's dtype
//    (elem: activations, logits) is fp32 from there (prepare_kbit_upcast).
//  - PEFT's adapter on a Linear4bit is lora.bnb.Linear4bit (PEFT 5d602fdb, 0.20.1.dev0,
//    src/peft/tuners/lora/bnb.py), whose forward differs from Linear's: the base output is
//    cloned first ("defensively", the base output then dies), x goes to the adapters'
//    dtype, the adapter path's scaled output is cast back to the base result's dtype
//    before the add (a copy when they differ), and the add is in the base dtype
//    (add_adapter_path_4bit).
// Not modelled: the transients of quantising at load time (an fp16 copy per weight on
// the GPU before training starts), the engine's dtype cast of the add's grad when the
// adapter and base dtypes differ, Linear4bit's bias cast (`bias.data =
// bias.data.to(x.dtype)`: refused by scenario/lora_compute_dtype_key.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "graph/models/hf_shape.h"
#include "graph/ops/linear_input.h"
#include "graph/runtime.h"

namespace memsim::graph {

class Autocast;  // graph/autocast.h

// Linear module indices per family (bits of HfLora::targets).
enum LlamaLinear : uint32_t { kQProj, kKProj, kVProj, kOProj, kGateProj, kUpProj, kDownProj, kLlamaLinears };
enum Gpt2Linear : uint32_t { kCAttn, kAttnCProj, kCFc, kMlpCProj, kGpt2Linears };
// Multi-head latent attention's own projections (DeepSeek-V2 / V3, graph/models/decoder_mla.cpp;
// q_proj and o_proj are kQProj / kOProj). Bits 7-8 are lora.target_parameters'
// (graph/models/moe_param_lora.h); each value is both the HfLora::targets bit and the
// LayerParams::ad slot.
enum MlaLinear : uint32_t { kQAProj = 9, kQBProj, kKvAProj, kKvBProj, kLoraSlots };

struct LoraAdapter {
  int32_t a = -1, b = -1;  // parameter ids; -1: the module has no adapter
  bool defined() const { return a >= 0; }
};

// PEFT's lora_A (rank x in) and lora_B (out x rank) of `module`, `elem` bytes per element,
// registered as parameters (rank is r, or r * E for a ParamWrapper over E experts).
LoraAdapter add_lora_parameters(Runtime& rt, uint64_t rank, uint64_t out, uint64_t in, uint64_t elem,
                                const std::string& module);

// The persistent storages of one NF4 weight besides its packed codes.
struct Nf4State {
  Tensor absmax_q, absmax2, offset, code;
};

// Bytes of the packed NF4 codes of an n-element weight.
inline uint64_t nf4_packed_bytes(uint64_t n) { return (n + 1) / 2; }
inline uint64_t nf4_blocks(uint64_t n) { return (n + 63) / 64; }

class LoraModules {
 public:
  LoraModules(Runtime& rt, const HfShape& s) : rt_(rt), s_(s) {}
  bool enabled() const { return s_.lora.rank > 0; }
  bool targets(uint32_t module) const { return enabled() && (s_.lora.targets >> module) & 1u; }
  bool quantized() const { return enabled() && s_.lora.nf4; }

  // A decoder-layer linear weight: NF4-packed under QLoRA, else elem bytes. Stored
  // (out, in) as nn.Linear, or (in, out) as GPT-2's Conv1D (`conv1d_layout`); the
  // parameter's rows are set accordingly.
  int32_t add_base_weight(uint64_t out, uint64_t in, const std::string& name,
                          bool conv1d_layout = false);
  // get_peft_model: freezes every parameter added so far.
  void freeze_all();
  // prepare_model_for_kbit_training's cast loop over a model built in the load dtype
  // (s_.lora.upcast_from_elem; no-op when 0): each parameter added so far that is not a
  // Params4bit takes a new fp32 storage (s_.elem) and its 16-bit one is freed, in
  // registration order; then torch.cuda.empty_cache(). Setup phase.
  void prepare_kbit_upcast();
  LoraAdapter add_adapter(uint64_t out, uint64_t in, const std::string& module_name);

  // torchtune's LoRALinear (graph/models/lora_tune.cpp): `module_name`.lora_a.weight and
  // .lora_b.weight, registered right after the module's frozen base weight. LitGPT's
  // LoRALinear (graph/models/decoder_litgpt.cpp) names them `module_name`.lora_A and
  // .lora_B (a_suffix, b_suffix); its forward is the same sequence (tune_adapter_path).
  LoraAdapter add_tune_adapter(uint64_t out, uint64_t in, const std::string& module_name,
                               const char* a_suffix = ".lora_a.weight",
                               const char* b_suffix = ".lora_b.weight");
  // set_trainable_params(model, get_adapter_params(model)): every parameter but the
  // adapters added by add_tune_adapter is frozen.
  void freeze_all_but_tune_adapters();
  // LoRALinear.forward's adapter path added to `out` (F.linear(x, W), the base output).
  // Returns out as is when the adapter is undefined.
  Tensor tune_adapter_path(const Tensor& x, Tensor out, const LoraAdapter& ad, uint64_t in,
                           uint64_t out_dim);

  // base_layer(x) for a weight from add_base_weight, without bias (LLaMA). `input`: what
  // x is (graph/ops/linear_input.h; the NF4 matmul ignores it).
  Tensor base_linear(const Tensor& x, int32_t w, uint64_t in, uint64_t out,
                     LinearInput input = LinearInput::folded);
  // The adapter path added to `result` (the base layer's output). Returns result as is
  // when the adapter is undefined. `input`: what x is, for lora_A's matmul when it reads
  // x itself (no dropout, no dtype copy).
  Tensor add_adapter_path(const Tensor& x, Tensor result, const LoraAdapter& ad, uint64_t in,
                          uint64_t out, LinearInput input = LinearInput::folded);
  // lora.bnb.Linear4bit.forward's adapter path (QLoRA): `result = result.clone()`, then
  // lora_B(lora_A(dropout(x.to(A dtype)))) * scaling, .to(result dtype), result + that.
  Tensor add_adapter_path_4bit(const Tensor& x, Tensor result, const LoraAdapter& ad, uint64_t in,
                               uint64_t out, LinearInput input = LinearInput::folded);
  // The same inside a torch.autocast region over fp32 adapters (graph/models/lora_autocast.cpp):
  // `result` is the base layer's low-precision output, x the layer's input (fp32 or low).
  Tensor add_adapter_path_autocast(Autocast& ac, const Tensor& x, Tensor result,
                                   const LoraAdapter& ad, uint64_t in, uint64_t out);

 private:
  Runtime& rt_;
  const HfShape& s_;
  std::vector<Nf4State> nf4_;
  std::vector<int32_t> nf4_ids_;  // parameter ids of the Params4bit weights (ascending)
  Tensor dynamic_map_;  // bitsandbytes' shared 256-entry map (double quantisation code)
  std::vector<int32_t> tune_adapters_;  // parameter ids of add_tune_adapter's lora_a/lora_b
};

}  // namespace memsim::graph
