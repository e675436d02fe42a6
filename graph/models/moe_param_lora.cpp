#include "graph/models/moe_param_lora.h"

#include "graph/autocast.h"
#include "graph/ops/ops.h"
#include "graph/ops/ops_moe.h"
#include "graph/ops/ops_nn.h"

namespace memsim::graph {

LoraAdapter add_experts_adapter(Runtime& rt, uint64_t experts, uint64_t out, uint64_t in, uint64_t rank,
                                uint64_t adapter_elem, const std::string& module) {
  return add_lora_parameters(rt, rank * experts, out, in, adapter_elem, module);
}

ExpertsParamLora::ExpertsParamLora(Runtime& rt, uint64_t experts, uint64_t rank, uint64_t adapter_elem,
                                   uint64_t param_elem, const Target& gate_up, const Target& down,
                                   Autocast* autocast)
    : rt_(rt), ac_(autocast), experts_(experts), rank_(rank), adapter_elem_(adapter_elem), param_elem_(param_elem) {
  t_[0] = gate_up;
  t_[1] = down;
}

Tensor ExpertsParamLora::delta(const Target& t) {
  const uint64_t a = adapter_elem_, E = experts_, r = rank_;
  Tensor d;
  {
    // A.reshape(E, r, in): a view of the leaf with its own ViewBackward0, which hands the
    // grad on as it came (no copy); B.reshape(out, r, E), permuted to (E, out, r) by the
    // einsum: the grad reaching it is not viewable as (out, r*E), so its backward reshape
    // copies. A's node is made first (get_delta_weight reshapes A, then B), so the engine,
    // which pops the latest node first, runs B's AccumulateGrad before A's: the order torch
    // 1.13's DDP reducer saw the adapters' grads become ready
    // (tests/data/ddp_moe_lora/*.json, rebuilt_per_bucket_param_indices).
    Tensor A = view_with_node(rt_, rt_.param(t.ad.a));
    Tensor B = view(rt_, rt_.param(t.ad.b), /*copy_in_backward=*/true);
    // Autocast: the einsum's wrapper casts its operands in argument order (B, then A).
    const uint64_t e = ac_ != nullptr ? ac_->low_elem() : a;
    if (ac_ != nullptr) {
      B = ac_->cast(B, t.out * r * E * e);
      A = ac_->cast(A, E * r * t.in * e);
    }
    const uint64_t clone = rt_.kernel_scratch ? E * t.out * r * e : 0;  // CUDA's contiguous copy
    Tensor prod = einsum_bmm(rt_, B, A, E * t.out * t.in * e, 2.0 * static_cast<double>(E * t.out * t.in * r),
                             clone);
    d = mul_scalar(rt_, prod);  // * scaling: the einsum's output dies with the expression
  }
  // .to(param.device, param.dtype): a copy when the delta's dtype (the adapters', or
  // autocast's low one) differs (rebinding drops it; ToCopyBackward0 saves nothing).
  if (d.bytes != E * t.out * t.in * param_elem_) d = to_copy(rt_, d, E * t.out * t.in * param_elem_);
  return d;
}

void ExpertsParamLora::enter() {
  for (int slot : {1, 0}) {  // the outer wrapper (down_proj) first
    const Target& t = t_[slot];
    if (!t.ad.defined()) continue;
    delta_[slot] = delta(t);
    // register_parametrization(unsafe=False): ParametrizationList.__init__ evaluates
    // W + delta once for its shape/dtype checks and drops it.
    add(rt_, rt_.param(t.weight), delta_[slot]).reset();
  }
}

Tensor ExpertsParamLora::weight(int slot) {
  const Target& t = t_[slot];
  if (!t.ad.defined()) return rt_.param(t.weight);
  if (!merged_[slot].defined()) {
    merged_[slot] = add(rt_, rt_.param(t.weight), delta_[slot]);  // _LoraParameterProxy: W + delta
    // Named for the reports (once per layer and step): "model.layers.N.mlp.experts.gate_up_proj
    // + lora delta" groups the layers' merged weights as the parameters are grouped.
    rt_.name(merged_[slot].storage, rt_.program().intern(rt_.param_name(t.weight) + " + lora delta (parametrize cache)"));
    order_[reads_++] = slot;
  }
  return merged_[slot];
}

void ExpertsParamLora::exit() {
  const int outer = t_[1].ad.defined() ? 1 : 0;
  if (outer == 1 && t_[0].ad.defined()) delta_[0].reset();  // the inner wrapper's exit
  for (int i = 0; i < reads_; ++i) merged_[order_[i]].reset();  // the outermost cached() exit
  delta_[outer].reset();
}

}  // namespace memsim::graph
