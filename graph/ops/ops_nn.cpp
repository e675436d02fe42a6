#include "graph/ops/ops_nn.h"

#include "graph/autocast.h"
#include "graph/ops/op_helpers.h"

#include <algorithm>

#include "graph/ops/ops.h"

namespace memsim::graph {

namespace {

using detail::out_tensor;
using detail::wants_grad;

// Unary op whose backward allocates one input-sized grad. save: 0 nothing, 1 self, 2 result.
Tensor unary(Runtime& rt, const Tensor& x, OpKind k, int save, uint64_t out_bytes) {
  Tensor out = out_tensor(rt, out_bytes, k);
  detail::numeric_forward(rt, k, {&x}, {&out});  // numeric mode (graph/numeric/numeric.h)
  if (wants_grad(rt, {&x})) {
    int32_t n = rt.make_node(k, {&x});
    rt.node(n).size[0] = x.bytes;
    if (save == 1) rt.save(n, x);
    if (save == 2) rt.save(n, out);
    out.grad_fn = n;
  }
  return out;
}

// Flash backward scratch sizes are packed in size[3] (4-byte units, 32 bits each).
uint64_t pack_scratch(uint64_t a, uint64_t b) { return ((b / 4) << 32) | (a / 4); }
uint64_t scratch_lo(uint64_t v) { return (v & 0xffffffffull) * 4; }
uint64_t scratch_hi(uint64_t v) { return (v >> 32) * 4; }
uint64_t round_up(uint64_t x, uint64_t m) { return (x + m - 1) / m * m; }

// mm_linear / addmm nodes: x was a 2-D tensor of its own (LinearInput::flat), so its grad
// is the dense mm result, not a view of it (graph/ops/linear_input.h).
constexpr uint8_t kFlatInput = 1;

}  // namespace

Tensor addmm_bias(Runtime& rt, const Tensor& bias, const Tensor& x, const Tensor& w,
                  uint64_t out_bytes, double flops, LinearInput input) {
  Tensor out = out_tensor(rt, out_bytes, OpKind::addmm);
  detail::numeric_forward(rt, OpKind::addmm, {&bias, &x, &w}, {&out});
  rt.note_gemm_lt();
  const double io = static_cast<double>(bias.bytes + x.bytes + w.bytes + out_bytes);
  rt.add_flops_forward(flops, io);
  if (wants_grad(rt, {&bias, &x, &w})) {
    int32_t n = rt.make_node(OpKind::addmm, {&bias, &x, &w});
    Node& node = rt.node(n);
    node.size[0] = bias.bytes;
    node.size[1] = x.bytes;
    node.size[2] = w.bytes;
    node.flops = detail::matmul_backward_flops(x, w, flops);
    node.gemm_bytes = detail::matmul_backward_bytes(x, w, io);
    if (input == LinearInput::flat) node.flags |= kFlatInput;
    detail::save_cross(rt, n, w, x);
    out.grad_fn = n;
  }
  return out;
}

Tensor mm_linear(Runtime& rt, const Tensor& x, const Tensor& w, uint64_t out_bytes,
                 double flops, LinearInput input) {
  Tensor out;
  const double io = static_cast<double>(x.bytes + w.bytes + out_bytes);
  if (!detail::sac_reused(rt, OpKind::mm_linear, {&out})) {
    out = out_tensor(rt, out_bytes, OpKind::mm_linear);
    detail::numeric_forward(rt, OpKind::mm_linear, {&x, &w}, {&out});
    detail::sac_cache(rt, OpKind::mm_linear, {&out});  // after the kernel wrote it
    rt.note_gemm();
    rt.add_flops_forward(flops, io);
  }
  if (wants_grad(rt, {&x, &w})) {
    int32_t n = rt.make_node(OpKind::mm_linear, {&x, &w});
    Node& node = rt.node(n);
    node.size[0] = x.bytes;
    node.size[1] = w.bytes;
    node.flops = detail::matmul_backward_flops(x, w, flops);
    node.gemm_bytes = detail::matmul_backward_bytes(x, w, io);
    if (input == LinearInput::flat) node.flags |= kFlatInput;
    detail::save_cross(rt, n, w, x);
    out.grad_fn = n;
  }
  return out;
}

Tensor layer_norm(Runtime& rt, const Tensor& x, const Tensor& w, const Tensor& b, uint64_t rows) {
  Tensor out = out_tensor(rt, x.bytes, OpKind::layer_norm);
  Tensor mean = out_tensor(rt, rows * 4, OpKind::layer_norm);
  Tensor rstd = out_tensor(rt, rows * 4, OpKind::layer_norm);
  detail::numeric_forward(rt, OpKind::layer_norm, {&x, &w, &b}, {&out, &mean, &rstd});
  if (wants_grad(rt, {&x, &w, &b})) {
    int32_t n = rt.make_node(OpKind::layer_norm, {&x, &w, &b});
    Node& node = rt.node(n);
    node.size[0] = x.bytes;
    node.size[1] = w.bytes;
    node.size[2] = b.bytes;
    rt.save(n, x);
    rt.save(n, w);
    rt.save(n, b);
    rt.save(n, mean);
    rt.save(n, rstd);
    out.grad_fn = n;
  }
  return out;  // mean and rstd: the Python result is only `out`; the node keeps them
}

Tensor softmax(Runtime& rt, const Tensor& x) { return unary(rt, x, OpKind::softmax, 2, x.bytes); }
Tensor tanh(Runtime& rt, const Tensor& x) { return unary(rt, x, OpKind::tanh, 2, x.bytes); }
Tensor silu(Runtime& rt, const Tensor& x) { return unary(rt, x, OpKind::silu, 1, x.bytes); }
Tensor gelu(Runtime& rt, const Tensor& x) { return unary(rt, x, OpKind::gelu, 1, x.bytes); }
Tensor mul_scalar(Runtime& rt, const Tensor& x) {
  return unary(rt, x, OpKind::mul_scalar, 0, x.bytes);
}
Tensor to_copy(Runtime& rt, const Tensor& x, uint64_t out_bytes) {
  return unary(rt, x, OpKind::to_copy, 0, out_bytes);
}

Tensor add_bcast(Runtime& rt, const Tensor& a, const Tensor& b) {
  Tensor out = out_tensor(rt, std::max(a.bytes, b.bytes), OpKind::add_bcast);
  detail::numeric_forward(rt, OpKind::add_bcast, {&a, &b}, {&out});
  if (wants_grad(rt, {&a, &b})) {
    int32_t n = rt.make_node(OpKind::add_bcast, {&a, &b});
    rt.node(n).size[0] = a.bytes;
    rt.node(n).size[1] = b.bytes;
    out.grad_fn = n;
  }
  return out;
}

Tensor native_dropout(Runtime& rt, const Tensor& x, uint64_t elem) {
  // CUDA's dropout kernel makes the bool mask before the output (H100 trace); the CPU
  // one the other way round (kernel_scratch false describes a CPU run).
  Tensor out, mask;
  if (rt.kernel_scratch) {
    mask = out_tensor(rt, x.bytes / elem, OpKind::native_dropout);
    out = out_tensor(rt, x.bytes, OpKind::native_dropout);
  } else {
    out = out_tensor(rt, x.bytes, OpKind::native_dropout);
    mask = out_tensor(rt, x.bytes / elem, OpKind::native_dropout);
  }
  detail::numeric_forward(rt, OpKind::native_dropout, {&x}, {&out, &mask});
  if (wants_grad(rt, {&x})) {
    int32_t n = rt.make_node(OpKind::native_dropout, {&x});
    rt.node(n).size[0] = x.bytes;
    rt.save(n, mask);
    out.grad_fn = n;
  }
  return out;
}

Tensor embedding_nn(Runtime& rt, const Tensor& weight, const Tensor& ids, uint64_t out_bytes,
                    uint64_t d_model) {
  Tensor out = out_tensor(rt, out_bytes, OpKind::embedding_nn);
  detail::numeric_forward(rt, OpKind::embedding_nn, {&weight, &ids}, {&out});
  if (wants_grad(rt, {&weight})) {
    int32_t n = rt.make_node(OpKind::embedding_nn, {&weight});
    rt.node(n).size[0] = weight.bytes;
    rt.node(n).size[1] = ids.bytes;
    rt.node(n).size[2] = d_model * 4;  // an fp32 accumulation row (backward)
    rt.save(n, ids);
    out.grad_fn = n;
  }
  return out;
}

Tensor slice_seq(Runtime& rt, const Tensor& x, uint64_t out_bytes) {
  Tensor out = rt.view_of(x, out_bytes);
  detail::numeric_forward(rt, OpKind::slice_seq, {&x}, {&out});
  if (wants_grad(rt, {&x})) {
    int32_t n = rt.make_node(OpKind::slice_seq, {&x});
    rt.node(n).size[0] = x.bytes;
    out.grad_fn = n;
    out.out_slot = 0;
  }
  return out;
}

Tensor cat2(Runtime& rt, const Tensor& a, const Tensor& b) {
  Tensor out = out_tensor(rt, a.bytes + b.bytes, OpKind::cat2);
  if (wants_grad(rt, {&a, &b})) {
    int32_t n = rt.make_node(OpKind::cat2, {&a, &b});
    out.grad_fn = n;
    out.out_slot = 0;
  }
  return out;
}

Chunk2::Chunk2(Runtime& rt, const Tensor& x, uint64_t first_bytes)
    : base_(x), first_(first_bytes > 0 ? first_bytes : x.bytes / 2) {
  if (wants_grad(rt, {&x})) {
    node_ = rt.make_node(OpKind::chunk2, {&x});
    rt.node(node_).size[0] = x.bytes;
  }
}

Tensor Chunk2::piece(Runtime& rt, int which) const {
  Tensor p = rt.view_of(base_, which == 0 ? first_ : base_.bytes - first_);
  if (node_ < 0) return p;
  p.grad_fn = node_;
  p.out_slot = static_cast<uint8_t>(which);
  return p;
}

Tensor select_dim(Runtime& rt, const Tensor& x, uint64_t out_bytes) {
  Tensor out = rt.view_of(x, out_bytes);
  if (wants_grad(rt, {&x})) {
    int32_t n = rt.make_node(OpKind::select_dim, {&x});
    rt.node(n).size[0] = x.bytes;
    out.grad_fn = n;
    out.out_slot = 0;
  }
  return out;
}

Tensor expand_clone(Runtime& rt, const Tensor& x, uint64_t n_rep) {
  return unary(rt, x, OpKind::expand_clone, 0, x.bytes * n_rep);
}

SplitQkv::SplitQkv(Runtime& rt, const Tensor& qkv) : base_(qkv) {
  detail::numeric_forward(rt, OpKind::split_qkv, {&qkv}, {});  // records the (B,S,3D) shape
  if (wants_grad(rt, {&qkv})) {
    node_ = rt.make_node(OpKind::split_qkv, {&qkv});
    rt.node(node_).size[0] = qkv.bytes;
  }
}

Tensor SplitQkv::head_view(Runtime& rt, int which) const {
  // split piece -> view(B,S,H,hd) -> permute: the permuted grad arriving here is not
  // viewable as (B,S,D) for q and v, so the view's backward reshape copies (a
  // piece-sized tensor); k's is (see ops_nn.h).
  Tensor piece = rt.view_of(base_, base_.bytes / 3);
  // Numeric mode: records the piece's view (the builder hints which piece it is).
  detail::numeric_forward(rt, OpKind::view, {&piece}, {&piece});
  if (node_ < 0) return piece;
  piece.grad_fn = node_;
  piece.out_slot = which == 0 ? 0 : 1;
  int32_t v = rt.make_node(OpKind::view, {&piece});
  rt.node(v).size[0] = piece.bytes;
  if (which != 1) rt.node(v).flags |= kCopyInBackward;  // k: viewable (see ops_nn.h)
  piece.grad_fn = v;
  piece.out_slot = 0;
  return piece;
}

Tensor expand_view(Runtime& rt, const Tensor& x, uint64_t n_rep) {
  Tensor out = rt.view_of(x, x.bytes * n_rep);
  detail::numeric_forward(rt, OpKind::expand_clone, {&x}, {&out});
  if (wants_grad(rt, {&x})) {
    int32_t n = rt.make_node(OpKind::expand_clone, {&x});
    rt.node(n).size[0] = x.bytes;
    out.grad_fn = n;
    out.out_slot = 0;
  }
  return out;
}

TiedWeight::TiedWeight(Runtime& rt, const Tensor& param) : base_(param) {
  if (wants_grad(rt, {&param})) {
    node_ = rt.make_node(OpKind::tied_sum, {&param});
    rt.node(node_).size[0] = param.bytes;
  }
}

Tensor TiedWeight::use(uint8_t slot) const {
  Tensor t = base_;
  if (node_ >= 0) {
    t.grad_fn = node_;
    t.out_slot = slot;
  }
  return t;
}

Tensor where_tensor(Runtime& rt, const Tensor& cond, const Tensor& x, uint64_t elem) {
  Tensor out = out_tensor(rt, x.bytes, OpKind::where_scalar);
  detail::numeric_forward(rt, OpKind::where_scalar, {&cond, &x}, {&out});
  if (wants_grad(rt, {&x})) {
    int32_t n = rt.make_node(OpKind::where_scalar, {&x});
    rt.node(n).size[0] = x.bytes;
    rt.node(n).size[3] = elem;
    rt.save(n, cond);
    out.grad_fn = n;
  }
  return out;
}

Tensor rope_hf(Runtime& rt, const Tensor& x, const Tensor& cos, const Tensor& sin) {
  // q_embed = (q * cos) + (rotate_half(q) * sin); rotate_half = cat((-x2, x1), -1).
  // CPython frees each temporary once the op that consumes it returns.
  const uint64_t X = x.bytes, h = X / 2;
  Tensor a = rt.alloc(X, TensorKind::temporary, OpKind::mul);  // x * cos
  Tensor neg = rt.alloc(h, TensorKind::temporary, OpKind::neg);
  Tensor cat = rt.alloc(X, TensorKind::temporary, OpKind::rope_hf);
  neg.reset();
  Tensor b = rt.alloc(X, TensorKind::temporary, OpKind::mul);  // rotate_half(x) * sin
  cat.reset();
  Tensor out = out_tensor(rt, X, OpKind::rope_hf);  // a + b
  detail::numeric_forward(rt, OpKind::rope_hf, {&x, &cos, &sin}, {&out});
  if (wants_grad(rt, {&x})) {
    int32_t n = rt.make_node(OpKind::rope_hf, {&x});
    rt.node(n).size[0] = X;
    rt.save(n, cos);  // mul(x, cos) saves cos; mul(rot, sin) saves sin
    rt.save(n, sin);
    out.grad_fn = n;
  }
  a.reset();
  b.reset();
  return out;
}

namespace {

Tensor sdpa(Runtime& rt, OpKind kind, const Tensor& q, const Tensor& k, const Tensor& v,
            const SdpaShape& s, uint64_t lse_bytes, uint64_t scratch, double flops) {
  const bool grad = wants_grad(rt, {&q, &k, &v});
  Tensor out, lse;
  // A selective checkpoint's re-run may hand back the forward's (out, logsumexp).
  if (!detail::sac_reused(rt, kind, {&out, &lse})) {
    out = out_tensor(rt, s.batch * s.heads * s.seq * s.head_dim * s.elem, kind);
    if (grad || kind == OpKind::sdpa_flash) lse = out_tensor(rt, lse_bytes, kind);
    if (lse.defined()) detail::numeric_forward(rt, kind, {&q, &k, &v}, {&out, &lse});
    else detail::numeric_forward(rt, kind, {&q, &k, &v}, {&out});
    detail::sac_cache(rt, kind, {&out, &lse});
    // IO-aware kernels: q, k, v read once, out and the logsumexp written once.
    rt.add_flops_forward(flops, static_cast<double>(q.bytes + k.bytes + v.bytes + out.bytes +
                                                    (lse.defined() ? lse.bytes : 0)));
  }
  if (grad) {
    int32_t n = rt.make_node(kind, {&q, &k, &v});
    Node& node = rt.node(n);
    node.size[0] = q.bytes;
    node.size[1] = k.bytes;
    node.size[2] = v.bytes;
    node.size[3] = scratch;
    node.flops = 2.5 * flops;  // dQ, dK, dV plus the recomputed scores
    // Reads q, k, v, out, dout and the logsumexp; writes dq, dk, dv.
    node.gemm_bytes = static_cast<float>(2 * (q.bytes + k.bytes + v.bytes) + 2 * out.bytes +
                                         (lse.defined() ? lse.bytes : 0));
    rt.save(n, q);
    rt.save(n, k);
    rt.save(n, v);
    rt.save(n, out);
    rt.save(n, lse);
    out.grad_fn = n;
  }
  return out;
}

}  // namespace

Tensor sdpa_flash(Runtime& rt, const Tensor& q, const Tensor& k, const Tensor& v,
                  const SdpaShape& s, double flops) {
  // FA2 mha_fwd: softmax_lse (B, H, S) fp32. mha_bwd: softmax_d (B, H, S rounded to 128)
  // and dq_accum (B, S rounded to 128, H, E rounded to 32) fp32, both transient.
  const uint64_t sr = round_up(s.seq, 128);
  const uint64_t softmax_d = s.batch * s.heads * sr * 4;
  const uint64_t dq_accum = s.batch * sr * s.heads * round_up(s.head_dim, 32) * 4;
  Tensor out = sdpa(rt, OpKind::sdpa_flash, q, k, v, s, s.batch * s.heads * s.seq * 4,
                    pack_scratch(softmax_d, dq_accum), flops);
  // Grouped KV heads (enable_gqa): mha_bwd's dk_expanded / dv_expanded, (B,S,H,hd) each in
  // the input dtype (PyTorch flash_api.cpp mha_bwd, `if (num_heads_k != num_heads)`).
  if (s.kv_heads != 0 && s.kv_heads < s.heads && out.grad_fn >= 0)
    rt.node(out.grad_fn).flags |= kSdpaGqa;
  return out;
}

Tensor sdpa_efficient(Runtime& rt, const Tensor& q, const Tensor& k, const Tensor& v,
                      const SdpaShape& s, double flops) {
  // CUTLASS kernel: log_sumexp (B, H, ceil(S/32)*32) fp32 only when a grad is needed;
  // backward: delta (B, H, S) fp32 transient (workspace sizes beyond it not modelled).
  const uint64_t delta = s.batch * s.heads * s.seq * 4;
  return sdpa(rt, OpKind::sdpa_efficient, q, k, v, s,
              s.batch * s.heads * round_up(s.seq, 32) * 4, pack_scratch(delta, 0), flops);
}

// --------------------------------------------------------------------------- backward
bool run_nn_backward(Runtime& rt, Node& n, const Grad in[2], Grad out[3]) {
  if (op_library(n.kind) != OpLibrary::nn) return false;
  const Grad& g = in[0];
  auto A = [&](uint64_t bytes, TensorKind kind = TensorKind::temporary) {
    return rt.alloc_raw(bytes, kind, n.kind);
  };
  auto F = [&](uint32_t s) { rt.release(s); };
  auto needs = [&](int i) { return n.next[i].node >= 0; };
  // A grad that AccumulateGrad will steal is a parameter gradient from birth.
  auto kind_for = [&](int i) {
    return (needs(i) && rt.node(n.next[i].node).kind == OpKind::accumulate_grad)
               ? TensorKind::gradient
               : TensorKind::temporary;
  };
  auto fresh = [](uint32_t s) { return Grad{s, false, false}; };
  if (n.kind == OpKind::split_qkv) {
    // cat of the q, k, v grads into a (B,S,3D) tensor. The k and v grads share slot 1
    // (the runtime buffers two slots), so they were already summed in place: the
    // real step holds one more piece-sized grad until this node runs.
    if (in[0].storage == kNoStorage && in[1].storage == kNoStorage) return true;
    out[0] = fresh(A(n.size[0]));
    return true;
  }
  if (n.kind == OpKind::chunk2) {
    // SplitBackward0: the two pieces' grads (a missing one as zeros) catted into one.
    if (in[0].storage == kNoStorage && in[1].storage == kNoStorage) return true;
    out[0] = fresh(A(n.size[0], kind_for(0)));
    return true;
  }
  if (n.kind == OpKind::tied_sum) {
    // Both uses' grads are buffered here; old + new is a new tensor (see ops_nn.h).
    if (in[0].storage != kNoStorage && in[1].storage != kNoStorage &&
        (n.flags & kTiedSumInPlace)) {
      rt.retain(in[0].storage);  // old.add_(new): the first grad's storage
      out[0] = Grad{in[0].storage, false, false};
    } else if (in[0].storage != kNoStorage && in[1].storage != kNoStorage) {
      out[0] = fresh(A(n.size[0], TensorKind::gradient));
    } else {
      const Grad& only = in[0].storage != kNoStorage ? in[0] : in[1];
      if (only.storage == kNoStorage) return true;
      rt.retain(only.storage);
      out[0] = Grad{only.storage, false, true};  // a transposed view: cloned into .grad
    }
    return true;
  }
  if (g.storage == kNoStorage) return true;
  switch (n.kind) {
    case OpKind::addmm:  // mat1 grad, mat2 grad, then the engine's sum_to for the bias
      // mat1 is the 2-D view of an N-D activation (_flatten_nd_linear's reshape, Conv1D's
      // x.view(-1, D)): x's grad is ViewBackward0's reshape of the mm result, a view whose
      // base shares the storage, so an InputBuffer holding it adds the next grad for x out
      // of place (H200 C++ frames, tests/data/h100/arch/cpp_stacks_runs.json: q/k/v_proj
      // with biases, InputBuffer::add -> at::add; docs/input-buffer.md). A flat x's grad
      // is the mm result itself.
      if (needs(1)) out[1] = Grad{A(n.size[1]), (n.flags & kFlatInput) == 0, false};
      rt.note_gemm();
      if (needs(2)) out[2] = fresh(A(n.size[2], kind_for(2)));
      if (needs(0)) {
        out[0] = fresh(A(n.size[0], kind_for(0)));
        // The bias grad sums the (rows, out) grad over its rows (H100 trace: 40 MiB of
        // staging for GPT-2's 4096 x 1280 c_proj). x = rows * in * e, w = in * out * e,
        // bias = out * e.
        // elem = (x / rows) / (w / bias) = (in * e) / in: exact divisions, where the
        // product bias * x overflowed for petabyte activations (a SIGFPE found by fuzzing
        // micro_batch 2^32 on GPT-2 large; tests/data/fuzz-scenario).
        const uint64_t rows = rt.program().tensors[g.storage].bytes / n.size[0];
        const uint64_t elem = n.size[1] / rows / (n.size[2] / n.size[0]);
        detail::outer_reduce_staging(rt, rows, n.size[0] / elem, n.kind);
      }
      break;
    case OpKind::mm_linear:
      // mat2 (W.t()) grad first, then self's; the backward thread's cuBLAS workspace is
      // taken inside the first mm, after its output (H100 trace, tests/data/cuda_runs.json).
      if (needs(1)) {
        // W.t()'s grad: mm_mat2_backward's (grad.t() @ x).t() for the column-major
        // operand, then TBackward0's .t(): a view whose base shares the storage.
        // AccumulateGrad may steal it (layout matches W); an InputBuffer (W used more than
        // once: chunked heads, a cached autocast cast) adds into it only out of place.
        out[1] = Grad{A(n.size[1], kind_for(1)), true, false};
        rt.note_gemm();
      }
      if (needs(0)) {
        // F.linear on (B, S, D) folds x to (B*S, D): x's grad is the mm result reshaped
        // back, a view whose base keeps the storage shared, so the InputBuffer adds a
        // second grad for x out of place (H100 trace: gate_proj + up_proj). On a flat
        // (2-D) x there is no fold: the grad is the dense mm result (the MoE block's
        // router and shared expert: summed in place, H200 Qwen2-MoE trace).
        out[0] = Grad{A(n.size[0]), (n.flags & kFlatInput) == 0, false};
        rt.note_gemm();
      }
      break;
    case OpKind::fused_rms_norm:  // _fused_rms_norm_backward (graph/ops/ops_stack.h)
      if (needs(0)) out[0] = fresh(A(n.size[0]));
      if (needs(1)) out[1] = fresh(A(n.size[1], kind_for(1)));
      break;
    case OpKind::rope_complex: {  // graph/ops/ops_stack.h rope_complex_pair
      // [16-bit: ToCopyBackward0 to fp32], MulBackward0: grad * freqs.conj() (the conjugate
      // fallback materialises the table first), [ToCopyBackward0 back].
      // (DeepSeek-V2, ops_mla.h: size[3], ViewAsRealBackward0's contiguous copy of a
      // strided fp32 grad, freed once the product exists.)
      const uint32_t up = n.size[2] != 0 ? A(n.size[2]) : kNoStorage;
      const uint32_t strided = n.size[3] != 0 ? A(n.size[3]) : kNoStorage;
      const uint32_t conj = A(n.size[1]);
      const uint32_t prod = A(n.size[2] != 0 ? n.size[2] : n.size[0], n.size[2] != 0 ? TensorKind::temporary : kind_for(0));
      F(conj);
      if (strided != kNoStorage) F(strided);
      if (up != kNoStorage) {
        F(up);
        out[0] = fresh(A(n.size[0], kind_for(0)));
        F(prod);
      } else {
        out[0] = fresh(prod);
      }
      break;
    }
    case OpKind::copy_slices: {  // graph/ops/ops_mla.h copy_into_slice (CopySlices::apply)
      const uint32_t result = A(n.size[0]);  // grad.new_empty_strided(base) + copy_
      const uint32_t slice = A(n.size[1]);   // grad_slice.clone(): CopyBackwards' src grad
      if (n.size[2] != 0) {
        // src of another dtype: CopyBackwards returns grad.to(src dtype), a new tensor; the
        // clone (its argument) dies when it returns, the zeros when CopySlices::apply does.
        const uint32_t zeros = needs(0) ? A(n.size[1]) : kNoStorage;
        if (needs(1)) out[1] = fresh(A(n.size[2], kind_for(1)));
        F(slice);
        if (zeros != kNoStorage) F(zeros);
        if (needs(0)) out[0] = fresh(result);
        else F(result);
        break;
      }
      if (needs(0)) {
        // zeros_like(slice) for the base's previous node, copied into result's slice; the
        // vector holding it dies when apply returns.
        F(A(n.size[1]));
        out[0] = fresh(result);
      }
      if (needs(1)) out[1] = fresh(slice);
      else F(slice);
      if (!needs(0)) F(result);
      break;
    }
    case OpKind::rope_pairs: {  // graph/ops/ops_stack.h rope_pairs
      const bool low = n.size[2] != 0;
      const uint64_t x32 = low ? n.size[2] : n.size[0], half = x32 / 2;
      const uint32_t up = low ? A(x32) : kNoStorage;  // ToCopyBackward0 (type_as)
      uint32_t acc = kNoStorage;
      for (int i = 0; i < 4; ++i) {
        // StackBackward0 hands out views; AddBackward0 passes through; SubBackward0
        // negates its second operand's grad (the third product in autograd's order).
        const uint32_t negated = i == 2 ? A(half) : kNoStorage;
        const uint32_t prod = A(half);  // grad * cache slice
        if (negated != kNoStorage) F(negated);
        const uint32_t sel = A(x32, !low && acc == kNoStorage ? kind_for(0) : TensorKind::temporary);
        F(prod);
        if (acc == kNoStorage) acc = sel;
        else F(sel);  // added into the first in place
      }
      if (low) {
        F(up);
        out[0] = fresh(A(n.size[0], kind_for(0)));  // ToCopyBackward0 (x.float())
        F(acc);
      } else {
        out[0] = fresh(acc);
      }
      break;
    }
    case OpKind::layer_norm:
      if (needs(0)) out[0] = fresh(A(n.size[0]));
      if (needs(1)) out[1] = fresh(A(n.size[1], kind_for(1)));
      if (needs(2)) out[2] = fresh(A(n.size[2], kind_for(2)));
      break;
    case OpKind::softmax: {
      // _softmax_backward_data on CUDA (SoftMax.cu): grad_input first, then the kernel's
      // input `tmp = grad * output` (the output's dtype), freed when it returns.
      out[0] = fresh(A(n.size[0], kind_for(0)));
      if (rt.kernel_scratch) F(A(n.size[2] != 0 ? n.size[2] : n.size[0]));
      break;
    }
    case OpKind::tanh:     // tanh_backward
    case OpKind::silu:     // silu_backward
    case OpKind::gelu:     // gelu_backward
    case OpKind::mul_scalar:
    case OpKind::to_copy:  // the grad cast back to the source dtype
    case OpKind::native_dropout:  // native_dropout_backward: grad * mask * scale
    case OpKind::slice_seq:       // zeros(input) + copy into the slice
    case OpKind::select_dim: {  // select_backward: zeros(input) + copy into the index
      // The MoE experts' slices of one 3-D weight: the first grad to reach AccumulateGrad's
      // input buffer becomes the .grad; the engine adds each later one into it in place
      // and frees it, so those are temporaries.
      TensorKind kind = kind_for(0);
      if (kind == TensorKind::gradient && rt.node(n.next[0].node).grad[n.next[0].slot] != kNoStorage)
        kind = TensorKind::temporary;
      out[0] = fresh(A(n.size[0], kind));
      break;
    }
    case OpKind::expand_clone:    // expand's sum_to
      out[0] = fresh(A(n.size[0], kind_for(0)));
      break;
    case OpKind::cat2:  // narrow views of the grad, one per input
      for (int i = 0; i < 2; ++i) {
        if (!needs(i)) continue;
        rt.retain(g.storage);
        out[i] = Grad{g.storage, true, false};
      }
      // A low input promoted into an fp32 cat (DeepSeek-V3's query under autocast):
      // validate_outputs casts its fp32 grad slice back.
      cast_promoted_grads(rt, n, out);
      break;
    case OpKind::add_bcast:
      if (needs(1)) out[1] = fresh(A(n.size[1], kind_for(1)));  // sum_to, reduced
      if (needs(0)) {
        rt.retain(g.storage);
        out[0] = Grad{g.storage, g.is_view, false};
      }
      break;
    case OpKind::embedding_nn: {
      // embedding_dense_backward on CUDA (H100 trace, torch 2.11): sorted and original
      // indices, an arange for the radix sort's values; then grad_weight = zeros(V, D);
      // embedding_backward_cuda_kernel's segment offsets and counts, and its partial
      // sums, sized for the worst case (n + n/10 segments, NROWS_PER_THREAD = 10) of fp32
      // rows. CUB's own scratch (a few KiB to tens of KiB, small pool) is not modelled.
      // At most 3072 indices (and no scale_grad_by_freq, which memsim has no key for)
      // take the direct kernel: zeros(V, D) alone, no sort (aten/src/ATen/native/cuda/
      // Embedding.cu, embedding_dense_backward_cuda; the FSDP2 runs' traces at 2 x 1024
      // tokens have no other allocation there, tests/test_gpu_fsdp2_runs.cpp).
      const uint64_t k = n.size[1], idx = k / 8;
      if (!rt.kernel_scratch || idx <= 3072) {  // CPU, or the direct kernel
        out[0] = fresh(A(n.size[0], kind_for(0)));
        break;
      }
      const uint64_t max_segments = idx + idx / 10;
      uint32_t sorted = A(k), orig = A(k);
      F(A(k));  // arange
      uint32_t w = A(n.size[0], kind_for(0));
      uint32_t seg_offsets = A(k), n_segments = A(8);
      F(A(k));
      uint32_t partials_per_segment = A(k), partials_offset = A(k);
      uint32_t n_partials = A(8), partial_offsets = A(max_segments * 8);
      F(A(max_segments * n.size[2]));  // grad_weight_per_segment
      F(partial_offsets);
      F(n_partials);
      F(partials_offset);
      F(partials_per_segment);
      F(n_segments);
      F(seg_offsets);
      F(orig);
      F(sorted);
      out[0] = fresh(w);
      break;
    }
    case OpKind::rope_hf: {
      // The autograd nodes of (x * cos) + (rotate_half(x) * sin), latest first (H100
      // trace, tests/data/cuda_runs.json): grad*sin; cat's grads are views of it; neg of
      // the x2 half; slice_backward of x2 (zeros + copy); slice_backward of x1, added
      // into x2's in place (the InputBuffer owns it alone); grad*cos, added in place too.
      // Each MulBackward0 drops its saved sin / cos once it has run.
      const uint64_t X = n.size[0], h = X / 2;
      uint32_t m1 = A(X);
      rt.release_saved_slot(n, 1);  // sin
      uint32_t ng = A(h);
      uint32_t s2 = A(X);
      F(ng);
      uint32_t s1 = A(X);
      F(m1);
      F(s1);
      uint32_t m2 = A(X);
      rt.release_saved_slot(n, 0);  // cos
      F(m2);
      out[0] = fresh(s2);
      break;
    }
    case OpKind::sdpa_flash:
    case OpKind::sdpa_efficient: {
      uint32_t dq = A(n.size[0]), dk = A(n.size[1]), dv = A(n.size[2]);
      const uint64_t s1 = scratch_lo(n.size[3]), s2 = scratch_hi(n.size[3]);
      uint32_t t1 = s1 ? A(s1) : kNoStorage, t2 = s2 ? A(s2) : kNoStorage;
      if (n.flags & kSdpaGqa) {  // mha_bwd's dk_expanded, dv_expanded: q-sized, freed first
        const uint32_t dke = A(n.size[0]), dve = A(n.size[0]);
        F(dve);
        F(dke);
      }
      if (t2 != kNoStorage) F(t2);
      if (t1 != kNoStorage) F(t1);
      out[0] = fresh(dq);
      out[1] = fresh(dk);
      out[2] = fresh(dv);
      break;
    }
    default:
      break;
  }
  return true;
}

}  // namespace memsim::graph
