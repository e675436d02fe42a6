#include "sim/serve/vllm_profile_run.h"

#include <algorithm>
#include <utility>

#include "allocator/caching_allocator.h"
#include "graph/runtime.h"
#include "sim/step/execute.h"

namespace memsim::serve {

namespace {

using graph::OpKind;
using graph::Runtime;
using graph::Tensor;

// The forward and sampler of one profile run, tensor by tensor (header comment).
class ProfileBuilder {
 public:
  ProfileBuilder(Runtime& rt, const ServedModel& m, const ProfileRunShape& s, bool kernel_scratch)
      : rt_(rt), m_(m), s_(s), scratch_(kernel_scratch) {
    T_ = static_cast<uint64_t>(s.tokens);
    R_ = static_cast<uint64_t>(s.requests);
    e_ = static_cast<uint64_t>(m.elem);
    d_ = static_cast<uint64_t>(m.d_model);
  }

  void run() {
    rt_.ctx.phase = Phase::forward;
    Tensor hidden = forward();
    rt_.ctx.layer = -1;
    // _dummy_run: hidden_states[logit_indices] (advanced indexing: a new [R, hidden]).
    Tensor last = act(R_ * d_ * e_, OpKind::gather);
    rt_.mark("forward_end");
    rt_.ctx.phase = Phase::other;
    sampler(last);
    // profile_run: `del hidden_states, output`.
    last.reset();
    hidden.reset();
    rt_.mark("profile_end");
  }

 private:
  Tensor act(uint64_t bytes, OpKind op) { return rt_.alloc(bytes, TensorKind::activation, op); }
  Tensor tmp(uint64_t bytes, OpKind op) { return rt_.alloc(bytes, TensorKind::temporary, op); }

  // F.linear(x, W[, b]): a new [rows, out] in the model dtype; cuBLAS's workspace on first use.
  Tensor linear(uint64_t rows, uint64_t out, bool bias) {
    Tensor y = act(rows * out * e_, bias ? OpKind::addmm : OpKind::mm_linear);
    rt_.note_gemm();
    if (bias) rt_.note_gemm_lt();
    return y;
  }
  // RowParallelLinear with reduce_results: pynccl's out-of-place all_reduce; the partial
  // output dies when the linear returns.
  Tensor reduce(Tensor partial) {
    if (m_.tp == 1) return partial;
    Tensor out = act(partial.bytes, OpKind::other);
    partial.reset();
    return out;
  }

  Tensor embedding() {
    Tensor h = act(T_ * d_ * e_, OpKind::embedding_nn);
    if (m_.tp > 1) {
      // VocabParallelEmbedding: masked ids (int64) before the lookup, then all_reduce.
      h = reduce(std::move(h));
    }
    return h;
  }

  uint64_t q_width() const { return static_cast<uint64_t>(m_.q_heads_rank * m_.head_dim); }
  uint64_t kv_width() const { return static_cast<uint64_t>(m_.kv_heads_rank * m_.head_dim); }

  // Eager LlamaAttention.forward on the normed input: the output [T, hidden]. RoPE and
  // the KV-cache write work in place; the locals (qkv, the q/k norms' outputs, the
  // attention output) die when forward returns.
  Tensor attention() {
    const uint64_t qkv_w = q_width() + 2 * kv_width();
    Tensor qkv = linear(T_, qkv_w, m_.qkv_bias);
    Tensor qn, kn;
    if (m_.qk_norm) {  // Qwen3: q_norm / k_norm per head, out of place
      qn = act(T_ * q_width() * e_, OpKind::fused_rms_norm);
      kn = act(T_ * kv_width() * e_, OpKind::fused_rms_norm);
    }
    // Attention.forward: output = torch.empty(T, heads * head_dim); the kernel is skipped
    // without metadata (profiling).
    Tensor attn = act(T_ * q_width() * e_, OpKind::other);
    Tensor o = linear(T_, d_, m_.o_bias);
    return reduce(std::move(o));
  }

  // Eager LlamaMLP.forward on the normed input (which the caller keeps).
  Tensor mlp() {
    const uint64_t f = static_cast<uint64_t>(m_.d_ff_rank);
    Tensor gu = linear(T_, 2 * f, m_.mlp_bias);
    Tensor a = act(T_ * f * e_, OpKind::silu);  // SiluAndMul: torch.empty(..., d) + kernel
    gu.reset();  // `x = self.act_fn(x)` rebinds
    Tensor out = reduce(linear(T_, d_, m_.mlp_bias));
    a.reset();  // `x, _ = self.down_proj(x)` rebinds after down_proj returns
    return out;
  }

  Tensor forward() {
    Tensor h = embedding();
    Tensor residual;
    for (int64_t l = 0; l < m_.layers; ++l) {
      rt_.ctx.layer = static_cast<int32_t>(l);
      h = s_.compiled ? layer_compiled(std::move(h), residual, l) : layer_eager(h, residual, l);
    }
    rt_.ctx.layer = -1;
    if (s_.compiled) {
      // model.norm(h, residual): the fused add + norm writes two buffers; only the normed
      // output leaves the graph.
      Tensor sum = tmp(T_ * d_ * e_, OpKind::fused_rms_norm);
      h.reset();
      residual.reset();
      Tensor out = act(T_ * d_ * e_, OpKind::fused_rms_norm);
      sum.reset();
      return out;
    }
    // eager: fused_add_rms_norm in place; `residual` (the embedding's storage) dies when
    // LlamaModel.forward returns.
    residual.reset();
    return h;
  }

  // Python lifetimes: `h` (the layer input) is LlamaModel.forward's hidden_states for the
  // whole call; returns the layer output.
  Tensor layer_eager(const Tensor& h, Tensor& residual, int64_t l) {
    Tensor x;
    if (l == 0) {
      residual = h;  // `residual = hidden_states`: the embedding output
      x = act(T_ * d_ * e_, OpKind::fused_rms_norm);  // rms_norm: torch.empty_like + kernel
    } else {
      x = h;  // fused_add_rms_norm(hidden_states, residual) in place
    }
    Tensor a = attention();
    x.reset();  // `hidden_states = self.self_attn(...)` (the layer-0 norm output dies)
    // post_attention_layernorm: fused_add_rms_norm in place on a and residual.
    Tensor out = mlp();
    a.reset();  // `hidden_states = self.mlp(hidden_states)`
    return out;
  }

  // Inductor lifetimes: every intermediate dies at its last use.
  Tensor layer_compiled(Tensor h, Tensor& residual, int64_t l) {
    Tensor x;
    if (l == 0) {
      residual = std::move(h);
      x = act(T_ * d_ * e_, OpKind::fused_rms_norm);
    } else {
      Tensor sum = act(T_ * d_ * e_, OpKind::fused_rms_norm);  // h + residual
      h.reset();
      residual = std::move(sum);
      x = act(T_ * d_ * e_, OpKind::fused_rms_norm);
    }
    Tensor a;
    {
      Tensor normed = std::move(x);
      const uint64_t qkv_w = q_width() + 2 * kv_width();
      Tensor qkv = linear(T_, qkv_w, m_.qkv_bias);
      normed.reset();
      Tensor qr = act(T_ * q_width() * e_, OpKind::rope);  // (q_norm fused with RoPE)
      Tensor kr = act(T_ * kv_width() * e_, OpKind::rope);
      Tensor attn = act(T_ * q_width() * e_, OpKind::other);
      qr.reset();
      kr.reset();
      qkv.reset();
      Tensor o = linear(T_, d_, m_.o_bias);
      attn.reset();
      a = reduce(std::move(o));
    }
    Tensor sum2 = act(T_ * d_ * e_, OpKind::fused_rms_norm);  // a + residual
    a.reset();
    residual = std::move(sum2);
    Tensor x2 = act(T_ * d_ * e_, OpKind::fused_rms_norm);
    const uint64_t f = static_cast<uint64_t>(m_.d_ff_rank);
    Tensor gu = linear(T_, 2 * f, m_.mlp_bias);
    x2.reset();
    Tensor sm = act(T_ * f * e_, OpKind::silu);
    gu.reset();
    Tensor dn = linear(T_, d_, m_.mlp_bias);
    sm.reset();
    return reduce(std::move(dn));
  }

  // _dummy_sampler_run(last_hidden_states) and Sampler.forward (header comment).
  void sampler(const Tensor& /*last*/) {
    const uint64_t V = static_cast<uint64_t>(m_.vocab);
    const uint64_t N = R_ * V;
    Tensor rnd = act(R_ * d_ * e_, OpKind::other);  // torch.rand_like(hidden_states)
    // compute_logits: lm_head on the R rows, then (TP) all-gather along the vocabulary:
    // all_gather_into_tensor into a [tp, R, V/tp] buffer, movedim + reshape copies it.
    Tensor logits = linear(R_, static_cast<uint64_t>(m_.vocab_rank), false);
    if (m_.tp > 1) {
      const uint64_t full = R_ * static_cast<uint64_t>(m_.padded_vocab) * e_;
      Tensor gathered = act(full, OpKind::other);
      Tensor reshaped = act(full, OpKind::clone);
      gathered.reset();
      logits = std::move(reshaped);
    }
    // Sampler.forward: logits.to(torch.float32) (the caller keeps the model-dtype logits).
    Tensor f32 = e_ == 4 ? logits : act(N * 4, OpKind::to_copy);
    Tensor greedy = act(R_ * 8, OpKind::other);  // greedy_sample: argmax
    // apply_temperature: div_ in place. TopKTopPSampler.forward_native:
    Tensor scattered;
    {
      // logits.sort(dim=-1): values, int64 indices, and PyTorch's segmented sort scratch
      // (aten/src/ATen/native/cuda/SortStable.cu: int64 reverse indices; CUB's
      // DeviceSegmentedRadixSort::SortPairs alternate key and value buffers).
      Tensor vals = act(N * 4, OpKind::other);
      Tensor idx = act(N * 8, OpKind::other);
      if (scratch_) {
        Tensor rev = tmp(N * 8, OpKind::other);
        Tensor cub = tmp(N * (4 + 8), OpKind::other);
        cub.reset();
        rev.reset();
      }
      Tensor k_row = tmp(R_ * 8, OpKind::sub);        // vocab - k (int64)
      Tensor k_thr = tmp(R_ * 4, OpKind::gather);     // logits_sort.gather(1, ...)
      k_row.reset();
      Tensor k_mask = act(N, OpKind::compare);        // logits_sort < threshold (bool)
      k_thr.reset();
      Tensor probs_sort = act(N * 4, OpKind::softmax);  // softmax; cumsum(out=) in place
      Tensor p_thr = tmp(R_ * 4, OpKind::sub);         // 1 - p.unsqueeze(1)
      Tensor p_mask = act(N, OpKind::compare);
      p_thr.reset();
      scattered = act(N * 4, OpKind::other);          // logits_sort.scatter(...)
      // apply_top_k_top_p returns: its locals die.
    }
    Tensor probs = act(N * 4, OpKind::softmax);  // logits.softmax(dim=-1, dtype=float32)
    {
      Tensor q = act(N * 4, OpKind::other);  // torch.empty_like(probs).exponential_()
      Tensor choice = act(R_ * 8, OpKind::other);  // probs.div_(q).argmax(dim=-1)
      q.reset();
      // random_sample returns `choice`; forward_native returns it.
      probs.reset();
      scattered.reset();
      Tensor cond = tmp(R_, OpKind::compare);  // temperature < eps, where(..., out=greedy)
      cond.reset();
    }
    f32.reset();
    greedy.reset();
    logits.reset();
    rnd.reset();
  }

  Runtime& rt_;
  const ServedModel& m_;
  const ProfileRunShape& s_;
  bool scratch_;
  uint64_t T_ = 0, R_ = 0, e_ = 2, d_ = 0;
};

}  // namespace

ProfileRun vllm_profile_run(const ServedModel& m, const std::vector<WeightTensor>& weights,
                            const ProfileRunShape& shape, const DeviceConfig& device,
                            const AllocatorConfig& allocator) {
  ProfileRun r;
  {
    Runtime rt(r.program);
    rt.grad_enabled = false;  // torch.inference_mode()
    rt.cublas_workspace = device.cublas_workspace;
    rt.ctx.phase = Phase::setup;
    for (const WeightTensor& w : weights) rt.add_parameter(w.bytes, w.name);
    rt.mark("profile_begin");
    ProfileBuilder(rt, m, shape, device.kernel_scratch).run();
    rt.freeze();
  }
  constexpr uint64_t kUnlimited = 1ull << 60;  // device.capacity 0: no limit
  const uint64_t total = device.capacity == 0 ? kUnlimited : device.capacity;
  SimulatedDevice dev(total, std::min(device.cuda_context, total));
  ExecuteOptions options;
  options.reset_peaks_at_mark = "profile_begin";
  const Timeline tl = execute(r.program, allocator, dev, options);
  r.oom = tl.oom.has_value();
  // Walk the timeline: the baseline at profile_begin, the peaks after it.
  const std::string& begin = "profile_begin";
  const std::string& fwd_end = "forward_end";
  size_t i_begin = tl.size(), i_fwd = tl.size();
  for (size_t i = 0; i < tl.size(); ++i) {
    const MemoryEvent& ev = r.program.events[i];
    if (ev.type != EventType::mark) continue;
    const std::string& name = r.program.str(static_cast<uint32_t>(ev.bytes));
    if (name == begin) i_begin = i;
    if (name == fwd_end) i_fwd = i;
  }
  if (i_begin < tl.size()) {
    r.baseline_allocated = tl.allocated[i_begin];
    size_t at = i_begin;
    for (size_t i = i_begin; i < tl.size(); ++i) {
      if (tl.allocated[i] > r.peak_allocated) {
        r.peak_allocated = tl.allocated[i];
        at = i;
      }
      const uint64_t inc = tl.allocated[i] - r.baseline_allocated;
      if (i <= i_fwd) r.forward_peak_increase = std::max(r.forward_peak_increase, inc);
      else r.sampler_peak_increase = std::max(r.sampler_peak_increase, inc);
    }
    r.torch_peak_increase = r.peak_allocated - r.baseline_allocated;
    r.peak_op = r.program.str(r.program.events[at].op);
  }
  if (r.oom) r.oom_what = tl.oom->details.message;
  return r;
}

}  // namespace memsim::serve
