// Model family `cs336`: the CS336 staff BasicsTransformerLM (cs336-model.md), written
// op by op against graph::Runtime.
//
// Contract:
//  - construct() allocates the parameters and the RoPE buffer in construction order
//    (§1; the allocator's layout depends on it).
//  - forward() emits the eager forward (§2, §3); block() is the per-layer emitter and
//    may be re-invoked (checkpoint recomputation) with the same layer index.
//  - Python lifetimes are mirrored: locals die where the staff code's would (§2.10,
//    §2.11: embedded_tokens lives for the whole forward, block locals until return).
#pragma once

#include <cstdint>
#include <vector>

#include "graph/ops/ops.h"

namespace memsim::graph {

class Autocast;  // graph/autocast.h

// Which release of the staff code (cs336-model.md §0). v2025 (v1.0.x) gathers cos/sin
// with explicit position ids: each attention call allocates an int64 arange(S) and each
// RoPE call a gathered (2, S, h/2) fp32 copy that its muls save.
enum class Cs336Revision : uint8_t { v26, v2025 };

// The attention softmax as the user's code writes it. staff: nn_utils.softmax (§2.6),
// exp(x - max) once. exp_twice: `exp(x - max) / sum(exp(x - max))`, a common hand-written
// form that evaluates the shifted exp twice: the denominator's exp output is saved by its
// ExpBackward0 too (one more S x S tensor per attention call), and the max values live
// until the function returns (scenario key model.softmax: exp-twice).
enum class Cs336Softmax : uint8_t { staff, exp_twice };

// The attention's scaling and masking as the user's code writes it. staff: §2.5/§2.7
// (bool mask from an arange compare, scores / sqrt(h), torch.where). masked_fill:
// `mask = torch.tril(torch.ones(S, S))` built on the CPU, copied to the GPU inside the
// attention function (fp32 S x S); scores = QK^T / torch.sqrt(torch.tensor(h, device=...))
// (a 0-d int64 tensor and its fp32 square root, which the div saves);
// `scores.masked_fill_(~mask.bool(), -inf)` in place (the inverted bool mask is saved);
// the raw and the scaled scores are locals that live until the function returns
// (scenario key model.sdpa: masked-fill).
enum class Cs336Sdpa : uint8_t { staff, masked_fill };

// The SwiGLU feed-forward as the user's code writes it. staff: §2.9,
// `w2(silu(w1 x) * w3 x)` evaluated left to right (w1 x and its silu temporaries die
// under no_grad before w3 x exists). projections_first: `a = w1(x); b = w3(x);
// return w2(silu(a) * b)`: both d_ff projections exist before the silu and stay alive
// (locals) until the function returns, one more B x S x d_ff tensor at a no_grad
// forward's FFN peak; under grad the same tensors in another order (scenario key
// model.swiglu: projections-first).
enum class Cs336Swiglu : uint8_t { staff, projections_first };

struct Cs336Shape {
  int64_t layers = 0, d_model = 0, heads = 0, d_ff = 0, vocab = 0, context_length = 0;
  int64_t batch = 1, seq = 1;
  uint64_t elem = 4;  // fp32 parameters and activations
  Cs336Revision revision = Cs336Revision::v26;
  Cs336Softmax softmax = Cs336Softmax::staff;
  Cs336Sdpa sdpa = Cs336Sdpa::staff;
  Cs336Swiglu swiglu = Cs336Swiglu::staff;
};

// Parameter count of the staff model: 2VD + L(4D^2 + 3DF + 2D) + D (§1).
int64_t cs336_parameter_count(const Cs336Shape& s);

class Cs336Model {
 public:
  Cs336Model(Runtime& rt, const Cs336Shape& shape) : rt_(rt), s_(shape) {}

  void construct();
  // ids: (B,S) int64. Returns the logits (B,S,V).
  Tensor forward(const Tensor& ids);
  // One TransformerBlock on x (the caller keeps x alive, as its loop variable does).
  Tensor block(int32_t layer, const Tensor& x);

  const Cs336Shape& shape() const { return s_; }
  // torch.autocast region owner (graph/autocast.h); while it is active the forward
  // emits the mixed-precision graph of cs336-model.md §5. nullptr = never.
  void set_autocast(Autocast* ac) { ac_ = ac; }
  // Byte sizes used throughout (a, f, A of §0, and row vectors).
  uint64_t act() const { return s_.batch * s_.seq * s_.d_model * s_.elem; }
  uint64_t ffn() const { return s_.batch * s_.seq * s_.d_ff * s_.elem; }
  uint64_t scores() const { return s_.batch * s_.heads * s_.seq * s_.seq * s_.elem; }

 private:
  struct LayerParams {
    int32_t q, k, v, o, w1, w2, w3, ln1, ln2;
  };
  Tensor rmsnorm(const Tensor& x, int32_t weight);
  Tensor attention(const LayerParams& p, const Tensor& x);
  Tensor sdpa(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& mask);
  // The two einsums both attention variants share: Q Kᵀ (the raw scores) and the
  // weights times V, viewed back to (B, H, S, h).
  Tensor attention_scores(const Tensor& q, const Tensor& k);
  Tensor attention_output(const Tensor& weights, const Tensor& v);
  Tensor softmax_lastdim(const Tensor& x, uint64_t rows);
  Tensor softmax_exp_twice(const Tensor& x, uint64_t rows);
  Tensor sdpa_masked_fill(const Tensor& q, const Tensor& k, const Tensor& v,
                          const Tensor& mask);
  Tensor swiglu(const LayerParams& p, const Tensor& x);
  Tensor linear(const Tensor& x, int32_t weight, int64_t d_in, int64_t d_out);

  bool autocast_on() const;

  Runtime& rt_;
  Cs336Shape s_;
  Autocast* ac_ = nullptr;
  int32_t embedding_ = -1, ln_final_ = -1, lm_head_ = -1;
  std::vector<LayerParams> layers_;
  Tensor rope_buffer_;
};

}  // namespace memsim::graph
