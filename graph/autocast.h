// torch.autocast (CUDA, bf16 or fp16) for the op-by-op model families: which ops run in
// the low precision, which are cast up to fp32, the weight-cast cache, and what autograd
// saves in the new dtypes (cs336-model.md §5; checked against the real bf16 snapshots
// listed in tests/support/real_runs.cpp).
//
// Contract:
//  - An Autocast object is one `with torch.autocast(...)` region at a time: enter() opens
//    it, exit() closes it and drops the weight-cast cache. Outside a region active() is
//    false and the model emits its fp32 graph unchanged.
//  - Lower-precision ops (einsum/bmm/matmul/linear): every operand that is not already in
//    the low dtype gets a _to_copy (ToCopyBackward0, saves nothing). Activations are cast
//    at every use; a weight (a leaf Parameter with requires_grad) is cast once per region
//    and the copy is kept by the cache until exit(), under no_grad too. Under
//    inference_mode nothing is cached: each cast dies with its op (x cast, then W cast).
//  - fp32-list ops (exp, log, pow, rsqrt, sum, softmax, log_softmax, cross_entropy...)
//    cast a low-precision input to fp32 first (a temporary of the op).
//  - Mixed-dtype elementwise ops promote to fp32; in backward the engine casts the fp32
//    grad back to the low-precision input's dtype (validate_outputs): widen() records it.
//  - Element sizes: fp16 and bf16 are both 2 bytes, so they emit the same memory events.
//  - The cache's rule (at::autocast::cached_cast, torch 1.13 and 2.x): a cast is cached
//    only if its argument is an fp32 leaf that requires grad and is not a view, and the
//    cache is enabled (a frozen parameter, Parameter::frozen, is never cached). set_cache_enabled(false) is torch.autocast(cache_enabled=False):
//    nothing is cached. set_params_are_views(true) is FSDP: the modules' weights are
//    non-leaf views of the gathered FlatParameter (torch.split(flat_param, numels)[i]
//    .view(shape), set on the module at every forward), so no weight cast is cached,
//    each use casts anew and the copy lives only as long as an op saves it; a reentrant
//    recompute's detached inputs are still leaves (cached while the cache is enabled).
#pragma once

#include <cstdint>
#include <vector>

#include "graph/ops/ops.h"

namespace memsim::graph {

class Autocast {
 public:
  // fp16: the low dtype is float16 (not bfloat16). Same element size; the one op whose
  // memory differs is softmax with dtype=float32 (CUDA's half_to_float kernel reads fp16
  // directly, bf16 input is converted first: fp32_softmax below).
  Autocast(Runtime& rt, uint64_t low_elem, bool fp16 = false)
      : rt_(rt), low_(low_elem), fp16_(fp16) {}
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

  // `inference_mode`: torch.inference_mode() is on, so casts are not cached.
  void enter(bool inference_mode);
  void exit();  // the cached weight copies lose the cache's reference
  bool active() const { return active_; }
  // torch.autocast(..., cache_enabled=flag) (default true); set before enter().
  void set_cache_enabled(bool flag) { cache_flag_ = flag; }
  // FSDP: parameters are views of the unsharded flat parameter, never cached (above).
  void set_params_are_views(bool views) { params_are_views_ = views; }

  // A nested `with torch.autocast(...)` that starts with an empty weight-cast cache and
  // drops it on leave(): torch.utils.checkpoint's recompute (graph/checkpoint.h), which
  // re-enters autocast with the state it recorded in the forward. The backward (and so
  // the recompute) runs outside the forward's region, where autocast's nesting count is
  // 0, so the recompute's exit is the outermost one and clears the cache
  // (clear_autocast_cache). Casts saved for backward outlive it as saved tensors.
  // enter_nested/leave_nested pair up; the outer state is restored on leave.
  // leaves: the reentrant recompute's inputs. CheckpointFunction.backward re-runs the
  // region on detach_variable(inputs): leaves that require grad (not views), which
  // cached_cast's rule (an fp32 leaf requiring grad) treats like weights, so a cast of
  // one of them is cached too and lives until leave_nested (HF LLaMA's selective core:
  // the q cast, which matmul's reshape copies, no longer dies with the matmul).
  void enter_nested(const std::vector<Tensor>* leaves = nullptr);
  void leave_nested();
  uint64_t low_elem() const { return low_; }

  // x.to(low or fp32 dtype) as a new tensor of `out_bytes` (ToCopyBackward0 under grad).
  Tensor cast(const Tensor& x, uint64_t out_bytes);
  // The low-precision copy of parameter `param` (cached for the region when allowed).
  // grad_transposed: the op hands the weight's grad back in the transposed layout (an
  // einsum's (d_in, d_out) operand), so AccumulateGrad clones the fp32 grad.
  // source: the handle the cast reads (a tied weight's use), default rt.param(param).
  Tensor weight(int32_t param, bool grad_transposed = true, const Tensor* source = nullptr);
  // einops.einsum(x, W) (cs336-model.md §2.1) under autocast: casts x unless it is
  // already low (`rows*d_in*low` bytes), casts W through the cache, one bmm of
  // rows*d_out*low bytes. BmmBackward0 saves the W copy and the x copy.
  Tensor linear(const Tensor& x, int32_t param, int64_t rows, int64_t d_in, int64_t d_out,
                double flops);
  // nn.Linear without bias (F.linear -> mm on the folded input) under autocast: the
  // wrapper casts its arguments right to left (W, then x: the CPU fixture's order),
  // then mm saves the x copy and W.t(); W's grad comes back in W's layout (stolen).
  Tensor mm_linear(const Tensor& x, int32_t param, int64_t rows, int64_t d_in, int64_t d_out,
                   double flops);
  // HF Conv1D: addmm(bias, x2d, W) under autocast. The wrapper casts right to left (W,
  // x, bias: the CPU fixture's order); W and the bias are parameters (cached), x is cast
  // unless already low. addmm saves the x and W copies; the bias grad is the engine's
  // sum_to of the low grad, cast back to fp32 by the bias cast's node.
  Tensor addmm(const Tensor& x, int32_t w, int32_t b, int64_t rows, int64_t d_in, int64_t d_out,
               double flops);
  // nn.Linear with a bias, F.linear(x, W, b), under autocast: the wrapper casts its
  // arguments right to left (b, W, x; both parameters through the cache), then torch
  // 2.x's linear flattens the contiguous 3-D input into addmm(b, x2d, W.t()), which saves
  // the x and W copies; W's grad comes back in W's layout (stolen), the bias grad is the
  // engine's sum_to of the low grad, cast back to fp32 by the bias cast's node.
  Tensor linear_bias(const Tensor& x, int32_t w, int32_t b, int64_t rows, int64_t d_in,
                     int64_t d_out, double flops);
  // F.softmax(x, dim) on low-precision x under autocast (softmax is CUDA's
  // fp32_set_opt_dtype: dtype=float32 is added). bf16: x.toType(float) (a temporary)
  // then _softmax in fp32; fp16: _softmax(x, half_to_float), whose backward returns the
  // fp16 grad directly. The result is fp32 (saved).
  Tensor fp32_softmax(const Tensor& x);
  // An fp32-list op's input: a fp32 copy of a low-precision x (x itself if fp32).
  Tensor to_fp32(const Tensor& x, uint64_t fp32_bytes);
  // A low-precision x entering a mixed-dtype add/sub whose output is fp32: a handle
  // sized as the fp32 operand it acts as (same storage and grad_fn as x). promoted()
  // then marks the op's node so that the engine's validate_outputs casts the fp32 grad
  // for input `slot` back to x's dtype (cast_promoted_grads).
  Tensor widen(const Tensor& x) const;
  static void promoted(Runtime& rt, const Tensor& out, int slot, const Tensor& low_input);

 private:
  Tensor new_cast(const Tensor& x, uint64_t out_bytes);  // an uncached _to_copy
  Runtime& rt_;
  uint64_t low_;
  bool fp16_ = false;
  bool active_ = false;
  bool cache_enabled_ = true;     // in the current region (false under inference_mode)
  bool cache_flag_ = true;        // torch.autocast(cache_enabled=...)
  bool params_are_views_ = false;  // FSDP (set_params_are_views)
  std::vector<Tensor> cache_;  // by parameter index; undefined = not cast yet
  std::vector<uint32_t> cache_graph_;  // the graph each cached copy's node belongs to
  std::vector<uint32_t> cache_seq_;    // that node's sequence number when first recorded
  // The state enter_nested() replaced (one level: checkpoint regions do not nest).
  bool outer_active_ = false, outer_cache_enabled_ = true, nested_ = false;
  std::vector<Tensor> outer_cache_;
  std::vector<uint32_t> outer_cache_graph_, outer_cache_seq_;
  std::vector<Tensor> leaves_, leaf_casts_;  // reentrant recompute (enter_nested)
};

// CS336 RotaryEmbedding.forward on a low-precision (B,H,S,h) view: the products with
// the fp32 cos/sin promote to fp32 (each x.bytes), the cat output is fp32 (2*x.bytes).
// Saves the four cos/sin views, like rope_cs336.
Tensor rope_cs336_autocast(Runtime& rt, const Tensor& x, const Tensor& freq_buffer);

// HF apply_rotary_pos_emb for one of q/k in the low dtype, cos/sin fp32:
// (x * cos) + (rotate_half(x) * sin) with fp32 products and output (2 * x.bytes); the
// neg and cat of rotate_half stay low precision. Saves cos and sin.
Tensor rope_hf_autocast(Runtime& rt, const Tensor& x, const Tensor& cos, const Tensor& sin);

// cs336_basics.nn_utils.cross_entropy on low-precision logits inside the autocast
// region (Wedsonlin's trace): max and x - max in bf16, exp on an fp32 copy, sum/log
// fp32, the log-softmax (bf16 - fp32) promotes to fp32; neg, gather, mean fp32.
Tensor cs336_cross_entropy_autocast(Autocast& ac, Runtime& rt, const Tensor& logits,
                                    const Tensor& targets, uint64_t rows);
// F.cross_entropy inside the region, as CUDA autocast runs it: log_softmax in the logits'
// low precision, then nll_loss (fp32 list) on an fp32 copy of the log-probabilities.
Tensor torch_cross_entropy_autocast(Autocast& ac, Runtime& rt, const Tensor& logits,
                                    const Tensor& targets);

// validate_outputs' dtype cast for an add/sub node marked by Autocast::promoted: the
// marked output's fp32 grad is replaced by a low-precision copy (hook of graph/ops/ops.cpp).
void cast_promoted_grads(Runtime& rt, Node& n, Grad out[3]);
// The same for one output slot (a node whose other input's grad is also reduced by
// validate_outputs' sum_to, which runs output by output: graph/ops/ops.cpp's mul).
void cast_promoted_grad(Runtime& rt, Node& n, Grad& g, int slot);
// Whether Autocast::promoted marked node `n` (its size[3] then holds the low input's bytes).
bool has_promoted_input(const Node& n);

// Backward of autocast_copy / grad_cast / rope_autocast (hook of graph/ops/ops.cpp).
bool run_autocast_backward(Runtime& rt, Node& n, const Grad in[2], Grad out[3]);

}  // namespace memsim::graph
