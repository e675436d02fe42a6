// DecoderModel's LitGPT row (model.implementation litgpt; docs/implementations.md): the
// Llama architecture as Lightning-AI/litgpt v0.5.13 (26857050fe3ff627cd714fe92f5838f51a3d5efa)
// writes it, run by its finetune/full.py loop under Lightning Fabric 2.6.5.
//  - litgpt/model.py GPT.__init__: lm_head, then transformer.wte, transformer.h (Block:
//    norm_1, attn (qkv, proj), norm_2, mlp (fc_1, fc_2, proj)), transformer.ln_f; then the
//    `max_seq_length = block_size` setter registers the non-persistent cos/sin buffers
//    (build_rope_cache: fp32 (block_size, rope_n_elem) each, computed on the device).
//  - Fabric: fabric.init_module makes the parameters in the precision's dtype;
//    fabric.setup's HalfPrecision.convert_module (bf16-true) is module.to(bf16), which casts
//    the two buffers to bf16 as well; full.py then sets `model.max_seq_length` to the data's
//    longest sequence (here batch.seq_len), which rebuilds fp32 buffers of that length when
//    it differs from the block size. _FabricModule.forward's convert_output casts the bf16
//    logits to fp32 (the default dtype).
//  - GPT.forward: cos/sin = self.cos[:T].unsqueeze(0) (views); wte; blocks; ln_f; lm_head.
//    No mask (SDPA is_causal); mask_cache is only built by set_kv_cache (inference).
//  - Block.forward (parallel_residual False): x_normed = norm_1(x); attention_output =
//    attn(...) (a local until the block returns); x = attention_output + x; norm_2;
//    mlp(x_normed) + x.
//  - CausalSelfAttention.forward: qkv = self.qkv(x) (one (B,T,(H+2KV)hs) output);
//    q, k, v = qkv.split(...) (views, one SplitWithSizesBackward0); view + transpose each;
//    q_roped = apply_rope(q[..., :n]), k_roped likewise (the full slice is q itself); q =
//    cat((q_roped, q[..., n:])) (a copy; the empty slice's backward is a zeros(q)); k
//    likewise; GQA: k, v = repeat_interleave(q_per_kv, dim=1) (PyTorch 2.x: unsqueeze,
//    expand, clone: a copy always, also for one query group); SDPA is_causal;
//    transpose + reshape (a copy after flash, whose output follows q's (B,h,T,hs)
//    layout; a view after mem-efficient's (B,T,h,hs) output); proj. Locals (qkv,
//    q_roped, k_roped) die as it returns.
//  - RMSNorm.forward: x.float(); torch.mean(x * x, -1, keepdim); x * rsqrt(norm_x + eps);
//    (x_normed * weight.float()).to(dtype): saves the fp32 input, rsqrt, the fp32 x_normed
//    and the fp32 weight copy.
//  - LLaMAMLP: fc_1(x), fc_2(x), silu(x_fc_1) * x_fc_2, proj.
//  - finetune/full.py: loss = chunked_cross_entropy(logits[..., :-1, :], targets[..., 1:])
//    (graph/ops/ops_litgpt.h), fabric.backward(loss / accumulation_iters); `logits` lives
//    until the next step's forward returns.
//  - With lora.rank (litgpt/lora.py GPT under finetune/lora.py; docs/implementations.md
//    "LitGPT LoRA"): LoRALinear on attn.proj / the MLP (LoraModules::tune_adapter_path, the
//    same sequence as torchtune's), mark_only_lora_as_trainable, the replaced modules of
//    lora.Block.__init__ as transients, lm_head_chunk_size=128's list of logits and
//    chunked_cross_entropy's list branch (lit_chunked_head, lit_lora_loss). LoRAQKVLinear
//    (q/k/v targets) is refused (scenario/litgpt_lora_keys.h).
//  - With step.compile the run is pretrain.py's, the only LitGPT script that compiles
//    (docs/compile.md "LitGPT's code"): the rope cache rebuilt by initialize_weights (and
//    at train.max_seq_length) before `torch.compile(model)` and fabric.setup's cast;
//    GPT.forward one compiled region (graph/compile.h, CompileScope::model), Fabric's fp32
//    cast after it; chunked_cross_entropy(logits, targets) unshifted, eager.
// The 2-way splits of qkv: torch.split's one SplitWithSizesBackward0 (a cat of the three
// grads into a qkv-sized tensor) is emitted as two graph::Chunk2 (q | kv, then k | v): the
// same views forward; backward cats k and v first (one kv-sized tensor more, briefly).
#include <string>
#include <vector>

#include "graph/checkpoint.h"
#include "graph/compile.h"
#include "graph/models/decoder.h"
#include "graph/ops/ops_litgpt.h"
#include "graph/ops/ops_nn.h"

namespace memsim::graph {

namespace {
// LitGPT calls torch.compile in pretrain.py only (finetune/*.py never do;
// scenario/scenario_implementation.cpp refuses the rest): with a compile engine installed
// the run is pretrain.py's setup and loop, otherwise finetune/full.py's (or lora.py's).
bool pretrain_run(const Runtime& rt) { return rt.compile != nullptr; }

// Fabric's convert_module (module.to(dtype)) on the two (len, n_elem) fp32 buffers of
// `elems` elements: each replaced by its cast, cos first.
void lit_rope_cache_cast(Runtime& rt, Tensor& cos, Tensor& sin, uint64_t elems, uint64_t cast_elem) {
  if (cast_elem == 4) return;
  cos = rt.alloc(elems * cast_elem, TensorKind::other, OpKind::to_copy);
  sin = rt.alloc(elems * cast_elem, TensorKind::other, OpKind::to_copy);
}
}  // namespace

bool DecoderModel::litgpt() const { return arch().impl == ModelImpl::litgpt; }

// fp32 when the model is, or when full.py rebuilt the buffers (seq != block size);
// otherwise Fabric's bf16-true cast of them. pretrain.py sets max_seq_length before
// fabric.setup, whose cast then covers any rebuilt buffers: always the model's dtype there.
uint64_t DecoderModel::lit_cache_elem() const {
  if (pretrain_run(rt_)) return s_.elem;
  return s_.seq != s_.context_length ? 4 : s_.elem;
}

// build_rope_cache(seq_len=len, n_elem=head_size) on the device, then (cast_elem != 4)
// Fabric's .to(bf16) of both buffers. theta's (n_elem/2)-element vectors are left out.
void DecoderModel::lit_rope_cache(uint64_t len, uint64_t cast_elem) {
  const uint64_t n = s_.head_dim();
  Tensor cos, sin;
  {
    Tensor seq_idx;
    {
      Tensor ar = rt_.alloc(len * 8, TensorKind::temporary, OpKind::arange);
      Tensor f = rt_.alloc(len * 4, TensorKind::temporary, OpKind::to_copy);  // .float()
      ar.reset();
      seq_idx = rt_.alloc(len * 4, TensorKind::temporary, OpKind::div_scalar);  // / condense_ratio
    }
    Tensor idx_theta;
    {
      Tensor outer = rt_.alloc(len * n / 2 * 4, TensorKind::temporary, OpKind::other);
      idx_theta = rt_.alloc(len * n * 4, TensorKind::temporary, OpKind::other);  // .repeat(1, 2)
    }
    {
      Tensor c = rt_.alloc(len * n * 4, TensorKind::temporary, OpKind::other);
      cos = rt_.alloc(len * n * 4, TensorKind::other, OpKind::mul_scalar);  // * attention_scaling
    }
    {
      Tensor s = rt_.alloc(len * n * 4, TensorKind::temporary, OpKind::other);
      sin = rt_.alloc(len * n * 4, TensorKind::other, OpKind::mul_scalar);
    }
  }
  // `self.cos, self.sin = ...` (or register_buffer): the old buffers die as they are replaced.
  lit_cos_ = std::move(cos);
  lit_sin_ = std::move(sin);
  lit_rope_cache_cast(rt_, lit_cos_, lit_sin_, len * n, cast_elem);
}

void DecoderModel::construct_litgpt() {
  const uint64_t e = s_.elem, D = s_.d_model, F = s_.d_ff, V = s_.vocab;
  const uint64_t qD = s_.q_dim(), kvD = s_.kv_dim();
  const bool lora = lora_.enabled();
  rt_.ctx.module = Module::head;
  // litgpt.lora.GPT: lm_head = create_lora_linear(..., use_r=lora_head): a LoRALinear
  // with r 0 (lora_head is not a memsim target), its nn.Linear as `linear`.
  lm_head_ = rt_.add_parameter(V * D * e, lora ? "lm_head.linear.weight" : "lm_head.weight");
  rt_.parameters()[lm_head_].rows = V;
  rt_.ctx.module = Module::embedding;
  embed_ = rt_.add_parameter(V * D * e, "transformer.wte.weight");
  rt_.parameters()[embed_].rows = V;
  layers_.resize(s_.layers);
  const uint64_t r = lora ? static_cast<uint64_t>(s_.lora.rank) : 0, a = s_.lora.adapter_elem;
  auto temp = [&](uint64_t bytes) { return rt_.alloc(bytes, TensorKind::temporary, OpKind::other); };
  // A LoRALinear(in, out) with use_r: its nn.Linear, then lora_A (r, in), lora_B (out, r).
  auto lora_linear_temps = [&](uint64_t out, uint64_t in, bool use_r, std::vector<Tensor>& keep) {
    keep.push_back(temp(out * in * e));
    if (use_r) {
      keep.push_back(temp(r * in * a));
      keep.push_back(temp(out * r * a));
    }
  };
  for (int32_t l = 0; l < s_.layers; ++l) {
    rt_.ctx.layer = l;
    LayerParams& p = layers_[l];
    const std::string pre = "transformer.h." + std::to_string(l) + ".";
    rt_.ctx.module = Module::norm;
    p.norm[kInputNorm] = add_norm(D, pre, "norm_1");
    if (!lora) {
      rt_.ctx.module = Module::attention;
      p.qkv = add_proj(qD + 2 * kvD, D, pre, "attn.qkv", false, -1);
      p.o = add_proj(D, qD, pre, "attn.proj", false, -1);
      rt_.ctx.module = Module::norm;
      p.norm[kPostAttnNorm] = add_norm(D, pre, "norm_2");
      rt_.ctx.module = Module::mlp;
      p.gate = add_proj(F, D, pre, "mlp.fc_1", false, -1);
      p.up = add_proj(F, D, pre, "mlp.fc_2", false, -1);
      p.down = add_proj(D, F, pre, "mlp.proj", false, -1);
      continue;
    }
    // litgpt.lora.Block.__init__ first runs the base Block.__init__, which builds a base
    // CausalSelfAttention (qkv, proj nn.Linear) and config.mlp_class (the LoRA config's
    // LLaMAMLP), then replaces both: its own CausalSelfAttention (whose base __init__
    // builds qkv and proj once more before LoRAQKVLinear and create_lora_linear replace
    // them) and a second LLaMAMLP. Under fabric.init_module (empty_init False on one
    // device) each is allocated on the device; a replaced module dies at the assignment.
    const bool o_r = lora_.targets(kOProj);
    const bool mlp_r = lora_.targets(kGateProj);
    rt_.ctx.module = Module::attention;
    std::vector<Tensor> base_attn = {temp((qD + 2 * kvD) * D * e), temp(D * qD * e)};
    rt_.ctx.module = Module::norm;
    p.norm[kPostAttnNorm] = add_norm(D, pre, "norm_2");
    rt_.ctx.module = Module::mlp;
    std::vector<Tensor> first_mlp;
    lora_linear_temps(F, D, mlp_r, first_mlp);
    lora_linear_temps(F, D, mlp_r, first_mlp);
    lora_linear_temps(D, F, mlp_r, first_mlp);
    rt_.ctx.module = Module::attention;
    {
      Tensor qkv2 = temp((qD + 2 * kvD) * D * e), proj2 = temp(D * qD * e);
      // LoRAQKVLinear with no q/k/v target: its nn.Linear only (no lora_A / lora_B).
      p.qkv = add_proj(qD + 2 * kvD, D, pre, "attn.qkv.linear", false, -1);
      qkv2.reset();  // `self.qkv = LoRAQKVLinear(...)` drops the base one
      p.o = add_proj(D, qD, pre, "attn.proj.linear", false, o_r ? static_cast<int32_t>(kOProj) : -1);
      if (o_r) p.ad[kOProj] = lora_.add_tune_adapter(D, qD, pre + "attn.proj", ".lora_A", ".lora_B");
    }  // proj2 dies at `self.proj = ...`
    base_attn.clear();  // `self.attn = CausalSelfAttention(...)` drops the base attention
    rt_.ctx.module = Module::mlp;
    auto mlp_proj = [&](uint64_t out, uint64_t in, const char* name, uint32_t m) {
      Proj pr = add_proj(out, in, pre, (std::string(name) + ".linear").c_str(), false,
                         mlp_r ? static_cast<int32_t>(m) : -1);
      if (mlp_r) p.ad[m] = lora_.add_tune_adapter(out, in, pre + name, ".lora_A", ".lora_B");
      return pr;
    };
    p.gate = mlp_proj(F, D, "mlp.fc_1", kGateProj);
    p.up = mlp_proj(F, D, "mlp.fc_2", kUpProj);
    p.down = mlp_proj(D, F, "mlp.proj", kDownProj);
    first_mlp.clear();  // `self.mlp = config.mlp_class(config)` drops the first one
  }
  rt_.ctx.layer = -1;
  rt_.ctx.module = Module::norm;
  final_norm_ = add_norm(D, "transformer.", "ln_f");
  rt_.ctx.module = Module::attention;
  const uint64_t ctx_len = static_cast<uint64_t>(s_.context_length), seq = static_cast<uint64_t>(s_.seq);
  if (pretrain_run(rt_)) {
    // pretrain.py main(): GPT(config) builds fp32 buffers at block_size;
    // initialize_weights -> utils.reset_parameters(model) -> GPT.reset_parameters rebuilds
    // them (`self.cos, self.sin = self.rope_cache(...)`); `model.max_seq_length =
    // train.max_seq_length` rebuilds at that length when it differs; then
    // torch.compile(model) and fabric.setup, whose convert_module casts them (bf16-true).
    lit_rope_cache(ctx_len, 4);
    lit_rope_cache(ctx_len, 4);
    if (seq != ctx_len) lit_rope_cache(seq, 4);
    lit_rope_cache_cast(rt_, lit_cos_, lit_sin_, seq * s_.head_dim(), e);
  } else {
    // The buffers at block_size, Fabric's cast, then full.py's max_seq_length.
    lit_rope_cache(ctx_len, e);
    if (seq != ctx_len) lit_rope_cache(seq, 4);
  }
  rt_.ctx.module = Module::none;
  // finetune/lora.py: mark_only_lora_as_trainable (every parameter without "lora_" in
  // its name frozen), before fabric.setup_module; its setup order is otherwise full.py's.
  if (lora) lora_.freeze_all_but_tune_adapters();
}

// litgpt.model.RMSNorm (add_unit_offset False) in PyTorch ops: for 16-bit x the fp32 copy,
// x * x, mean (a local until return), + eps, rsqrt, x * rsqrt, weight.float(), the
// product, .to(dtype).
Tensor DecoderModel::lit_rms_norm(const Tensor& x, int32_t w, uint64_t rows) {
  ModuleScope module_scope(rt_, Module::norm);
  const uint64_t e = s_.elem;
  Tensor xf = e == 4 ? x : to_copy(rt_, x, x.bytes / e * 4);
  Tensor norm_x;
  {
    Tensor sq = mul(rt_, xf, xf);
    norm_x = mean_dim(rt_, sq, rows * 4);
  }
  Tensor r;
  {
    Tensor a = add_scalar(rt_, norm_x);
    r = rsqrt(rt_, a);
  }
  Tensor x_normed = mul(rt_, xf, r);
  Tensor weight = rt_.param(w);
  if (e != 4) weight = to_copy(rt_, weight, weight.bytes / e * 4);  // weight.float()
  Tensor out = mul(rt_, x_normed, weight, Broadcast::leading_dims, 4);
  if (e != 4) out = to_copy(rt_, out, out.bytes / 4 * e);  // .to(dtype=dtype)
  // The frame's locals die as it returns.
  xf.reset();
  norm_x.reset();
  x_normed.reset();
  weight.reset();
  return out;
}

Tensor DecoderModel::mlp_litgpt(const LayerParams& p, const Tensor& x) {
  ModuleScope module_scope(rt_, Module::mlp);
  Tensor m;
  {
    Tensor x_fc_1 = project(x, p, p.gate);
    Tensor x_fc_2 = project(x, p, p.up);
    Tensor a = activation(x_fc_1);
    m = mul(rt_, a, x_fc_2);
  }
  return project(m, p, p.down);
}

Tensor DecoderModel::attention_litgpt(const LayerParams& p, const Tensor& x) {
  ModuleScope module_scope(rt_, Module::attention);
  const uint64_t e = s_.elem, B = s_.batch, H = s_.heads, S = s_.seq, hd = s_.head_dim();
  const uint64_t KV = static_cast<uint64_t>(s_.kv_heads), n_rep = H / KV, rows = s_.rows();
  const uint64_t ce = lit_cache_elem();
  Tensor out;
  {
    Tensor qkv = project(x, p, p.qkv);
    Tensor q, k, v;
    {
      Chunk2 q_kv(rt_, qkv, rows * H * hd * e);
      q = q_kv.piece(rt_, 0);
      Tensor kv = q_kv.piece(rt_, 1);
      Chunk2 k_v(rt_, kv, rows * KV * hd * e);
      k = k_v.piece(rt_, 0);
      v = k_v.piece(rt_, 1);
    }
    // .view(B, T, h, hs).transpose(1, 2). q's and k's grads come back from the rope node
    // as contiguous (B,h,T,hs) tensors (its zeros buffer), v's from repeat_interleave's
    // expand (the same layout) or, without GQA, from the flash kernel in (B,T,h,hs)
    // memory: the views' backward reshape copies unless the grad is viewable.
    q = view(rt_, q, H > 1);
    k = view(rt_, k, KV > 1);
    v = view(rt_, v, n_rep > 1 && KV > 1);
    Tensor q_roped = rope_litgpt(rt_, q, e, ce);
    Tensor k_roped = rope_litgpt(rt_, k, e, ce);
    q = rope_litgpt_cat(rt_, q_roped, q, lit_cos_, lit_sin_, e, ce);
    k = rope_litgpt_cat(rt_, k_roped, k, lit_cos_, lit_sin_, e, ce);
    if (n_rep > 1) {  // repeat_interleave: unsqueeze, expand, clone (a copy)
      k = expand_clone(rt_, k, n_rep);
      v = expand_clone(rt_, v, n_rep);
    }
    SdpaShape sh{B, H, S, hd, e};
    const double flops = 4.0 * B * H * S * S * hd;
    const bool flash = s_.attention == HfAttention::flash;
    Tensor o = run_region(rt_, RegionKind::core_attention, {q, k, v},
                          [this, sh, flash, flops](const Inputs& in) {
                            return flash ? sdpa_flash(rt_, in[0], in[1], in[2], sh, flops)
                                         : sdpa_efficient(rt_, in[0], in[1], in[2], sh, flops);
                          });
    // y.transpose(1, 2).reshape(B, T, C). The flash kernel allocates its output as
    // empty_like(q.transpose(1, 2)) (flash_api.cpp mha_fwd), cuDNN attention as
    // alloc_with_matching_layout(q) (cudnn/MHA.cpp): both follow q's memory layout, and
    // q here is torch.cat's contiguous (B,h,T,hs), so the reshape copies (a (B,T,C)
    // tensor per layer that attn.proj saves; the kernel's output stays saved by SDPA).
    // The mem-efficient kernel writes a fresh (B,T,h,hs) tensor: a view. Measured on the
    // H200 (tests/data/gpu/impl, impl_litgpt_bf16: the copy at `y.reshape`).
    if (flash) o = clone(rt_, o);
    out = project(o, p, p.o);
    // CausalSelfAttention.forward returns: qkv, then q_roped and k_roped die.
    qkv.reset();
    q = k = v = Tensor();
    q_roped.reset();
    k_roped.reset();
  }
  return out;
}

Tensor DecoderModel::forward_litgpt(const Tensor& ids) {
  const uint64_t e = s_.elem, D = s_.d_model;
  // Outside the blocks: with gradient accumulation the previous micro-batch's backward
  // left its last node's layer in the context (labels only).
  rt_.ctx.layer = -1;
  // GPT.forward from the embedding to ln_f's output.
  auto hidden = [this, &ids, e, D] {
    rt_.ctx.module = Module::embedding;
    Tensor h = embedding_nn(rt_, rt_.param(embed_), ids, s_.rows() * D * e, D);
    Inputs extra = {Tensor(), Tensor(), lit_cos_, lit_sin_};  // views of the buffers
    h = run_layers(rt_, static_cast<int32_t>(s_.layers), std::move(h), extra,
                   [this](int32_t l, const Tensor& in, const Inputs& ex) { return layer(l, in, ex); });
    extra.clear();
    return norm(h, final_norm_, s_.rows(), D);
  };
  if (lora_.enabled()) {
    Tensor h = hidden();
    rt_.ctx.module = Module::head;
    return lit_chunked_head(std::move(h));
  }
  // pretrain.py: `model = torch.compile(model)` and fabric.setup, which unwraps the
  // OptimizedModule, converts and re-compiles the GPT, and wraps the result in
  // _FabricModule (lightning 2.6.5 be98784a fabric.py setup: _unwrap_compiled,
  // convert_module, _to_compiled): GPT.forward is the compiled graph (dynamo traces it
  // whole in training: the Python loop over blocks is unrolled, `self.cos[:T]` is a slice
  // of a buffer input, mask_cache is never built, SDPA is_causal; nothing breaks the graph)
  // and _FabricModule.forward's convert_output (below) runs after it, eagerly. Without
  // step.compile, compile_region is the plain call.
  Tensor logits = compile_region(rt_, CompileScope::model, [this, &hidden, D] {
    Tensor h = hidden();
    rt_.ctx.module = Module::head;
    return lm_linear(h, lm_head_, D, s_.vocab);
  });
  rt_.name(logits.storage, rt_.program().intern("logits"));
  if (e != 4) {  // _FabricModule: precision.convert_output -> .to(torch.float32)
    logits = to_copy(rt_, logits, logits.bytes / e * 4);
    rt_.name(logits.storage, rt_.program().intern("logits.float()"));
  }
  rt_.ctx.module = Module::none;
  return logits;
}

// finetune/lora.py: `logits = model(input_ids, lm_head_chunk_size=128)`. GPT.forward:
// `[lm_head(x_i) for x_i in x.split(128, dim=1)]` (clamp_head is nn.Identity for Llama);
// then _FabricModule's convert_output builds the fp32 list (bf16-true) while the bf16 one
// is alive. The frozen lm_head runs matmul(x_i, W.t()) on a chunk that is not viewable
// as 2-D when B > 1: should_fold declines for a weight that needs no grad, so bmm runs
// against the expanded weight, no copy (torchtune's frozen head, measured on the H200:
// decoder_impl.cpp), and nothing of x is saved. torch.split's one SplitBackward0 is
// emitted as a chain of graph::Chunk2 (128 rows | the rest): the same views forward; in
// backward it cats level by level, whose last cat has the real one's size. Returns the
// first chunk; the list is chunks_ (the loop's `logits`, alive until the next forward).
Tensor DecoderModel::lit_chunked_head(Tensor h) {
  const uint64_t e = s_.elem, B = s_.batch, S = s_.seq, D = s_.d_model, V = s_.vocab;
  std::vector<Tensor> pieces;
  {
    Tensor rest = h;
    for (uint64_t start = 0; start + kLitHeadChunk < S; start += kLitHeadChunk) {
      Chunk2 split(rt_, rest, B * kLitHeadChunk * D * e);
      pieces.push_back(split.piece(rt_, 0));
      rest = split.piece(rt_, 1);
    }
    pieces.push_back(std::move(rest));
  }
  std::vector<Tensor> outs;
  for (size_t i = 0; i < pieces.size(); ++i) {
    const uint64_t rows = pieces[i].bytes / (D * e);
    outs.push_back(mm_linear(rt_, pieces[i], rt_.param(lm_head_), rows * V * e,
                             2.0 * static_cast<double>(rows) * D * V));
  }
  pieces.clear();
  h.reset();  // GPT.forward returns: x (ln_f's output) dies
  if (e != 4) {  // precision.convert_output: .to(torch.float32) per chunk, a new list
    std::vector<Tensor> f32;
    for (Tensor& c : outs) f32.push_back(to_copy(rt_, c, c.bytes / e * 4));
    outs = std::move(f32);  // the bf16 list dies with the old output
  }
  // `logits = model(...)` rebinds the loop's name: the previous list dies now.
  std::vector<Tensor> old = std::move(chunks_);
  chunks_ = std::move(outs);
  old.clear();
  rt_.ctx.module = Module::none;
  return chunks_.front();
}

// finetune/lora.py fit(): `logits[-1] = logits[-1][..., :-1, :]` (a view the list keeps),
// `chunked_cross_entropy(logits, targets[..., 1:])` (its list branch, graph/ops/ops_litgpt.h).
Tensor DecoderModel::lit_lora_loss() {
  const uint64_t B = s_.batch, V = s_.vocab, row_bytes = V * 4;
  chunks_.back() = slice_seq(rt_, chunks_.back(), chunks_.back().bytes - B * row_bytes);
  Tensor loss;
  {
    // logit_chunks: reshape(-1, V) views, but the sliced last chunk is not contiguous
    // when B > 1: its reshape copies.
    std::vector<Tensor> flat(chunks_.begin(), chunks_.end());
    if (B > 1) flat.back() = clone(rt_, flat.back());
    // target_chunks: targets[..., 1:] split like the logits; each reshape(-1) copies
    // (int64) when B > 1, else a view of the batch.
    std::vector<Tensor> targets;
    for (const Tensor& c : flat)
      targets.push_back(B > 1 ? rt_.alloc(c.bytes / row_bytes * 8, TensorKind::temporary, OpKind::clone)
                              : Tensor());
    std::vector<Tensor> losses;
    for (size_t i = 0; i < flat.size(); ++i)
      losses.push_back(ce_chunk_litgpt(rt_, flat[i], targets[i], flat[i].bytes / row_bytes, row_bytes));
    Tensor joined = losses.front();
    for (size_t i = 1; i < losses.size(); ++i) joined = lit_ce_join(rt_, joined, losses[i]);
    loss = ce_total_litgpt(rt_, joined, B * (s_.seq - 1));
    // chunked_cross_entropy returns: its lists die (the clone and the target copies stay
    // saved by the nodes that need them).
  }
  return loss;
}

Tensor DecoderModel::loss_litgpt(const Tensor& logits) {
  ModuleScope module_scope(rt_, Module::loss);
  // finetune/full.py: chunked_cross_entropy(logits[..., :-1, :], targets[..., 1:]);
  // pretrain.py: chunked_cross_entropy(logits, targets) (its data loader's rows are
  // seq + 1 tokens long, input_ids and targets the two shifted slices).
  Tensor loss = lora_.enabled() ? lit_lora_loss()
                                : chunked_ce_litgpt(rt_, logits, s_.batch, s_.seq, s_.vocab,
                                                    /*shifted=*/!pretrain_run(rt_));
  return div_scalar(rt_, loss);  // loss / train.gradient_accumulation_iters(...)
}

}  // namespace memsim::graph
