// Model family `megatron`: a GPT as Megatron-LM builds it (megatron/core GPTModel with the
// local layer spec: apex fused LayerNorm, ColumnParallel/RowParallel linears with
// gradient-accumulation fusion, fused causal scale-mask-softmax, jit-fused
// bias-dropout-add and bias-GeLU, learned absolute positions, output layer tied to the
// word embedding or not, vocab-parallel cross entropy), tensor parallel t
// (MegatronShape::tensor), the whole model or one pipeline chunk (pre_process /
// post_process), written op by op against graph::Runtime with the ops of graph/ops/ops_fused.h.
//
// Layout [s, b, h]; activations in the parameters' 16-bit dtype. Parameters pass to the
// ops as byte counts: their grads go to Megatron's main_grad buffer (the scheduler owns
// it, sim/megatron/megatron_step.h), never to a lasting .grad.
//
// What one transformer layer keeps for backward, term by term against Korthikanti et al.
// 2022, "Reducing Activation Recomputation in Large Transformer Models", §4.1
// (16-bit activations, eager attention, dropout on; s*b*h*(34 + 5*a*s/h) bytes):
//
//   paper term                         memsim tensor (op that allocates it, who saves it)
//   attention block, 11sbh + 5as^2b:
//     QKV input            2sbh        input_layernorm output (fused_layer_norm; QKV linear)
//     Q and K for QK^T     4sbh        \ the fused QKV output, 3 x 2sbh, one storage
//     V for attn*V         2sbh        / (megatron_linear; baddbmm saves q,k, bmm saves v)
//     softmax output       2as^2b      fused_causal_softmax output (saved by itself)
//     softmax dropout mask as^2b       dropout mask, 1 byte/element (dropout)
//     dropout output       2as^2b      dropout output (saved by the attn*V bmm)
//     projection input     2sbh        permute(...).contiguous() copy (clone; dense linear)
//     attention dropout    sbh         bias_dropout_add mask
//   MLP block, 19sbh:
//     fc1 input            2sbh        post_attention_layernorm output (fc1 linear)
//     GeLU input           8sbh        fc1 output (bias_gelu)
//     fc2 input            8sbh        bias_gelu output (fc2 linear)
//     dropout mask         sbh         bias_dropout_add mask
//   layer norms, 4sbh:
//     LN1 input            2sbh        the previous layer's output (bias_dropout_add out)
//     LN2 input            2sbh        the attention bias_dropout_add output
//
// What Megatron keeps that the paper leaves out (O(sb), not O(sbh)): each fused
// LayerNorm's fp32 mean and invvar, 2 x 4sb bytes per norm, 16sb per layer. With
// attention `flash` (Transformer Engine fused attention on the packed QKV, sbhd): no
// s^2 tensors; the output [s,b,h] is the projection's input itself (no copy), plus the
// fp32 softmax logsumexp (4*a*s*b) and, with dropout, a 16-byte RNG state: 34sbh + those.
//
// Activation recomputation (sim/step/checkpoint_policy.h policies, graph/checkpoint.h
// regions). Megatron's options map to: --recompute-granularity selective = `selective`
// (core_attention(q, k, v, mask) checkpointed: a layer then keeps 34sbh, Korthikanti
// Table 2); --recompute-granularity full with --recompute-method uniform and
// --recompute-num-layers N = `uniform:N` (chunks of N layers, each keeping only its input
// hidden state, 2sbh, and the attention mask); --recompute-method block with N =
// `block:N` (the first N layers, one checkpoint each). `modules` / `custom` halves (the
// norm plus self-attention, the norm plus MLP) are generic checkpoints around those
// halves, as Megatron-core's newer --recompute-modules does for mlp. Megatron
// checkpoints with its own tensor_parallel.CheckpointFunction, a reentrant checkpoint:
// forward under no_grad saving only the inputs (save_for_backward(*args)), and in
// backward the whole chunk is re-run with grad and torch.autograd.backward is called on
// its outputs. Two differences from torch.utils.checkpoint(use_reentrant=False), both
// modelled (CheckpointPlan::reentrant): the re-run always runs to the chunk's end (no
// early stop), and the re-run's output stays alive until the chunk's backward is done.
// distribute_saved_activations (tensor parallel only) is not modelled.
//
// Outside the layers: the embedding (word + position, transpose-contiguous, dropout
// mask), the final LayerNorm, the bf16 logits [s,b,V] (dead when the model's forward
// returns) and the fp32 copy the cross entropy turns into its saved softmax (4sbV).
// Eager attention also allocates Megatron's global "mpu" buffer (b*np, s, s) once: the
// baddbmm input that beta=0 ignores, alive for the whole run.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "graph/models/decoder_spec.h"
#include "graph/ops/ops_fused.h"

namespace memsim::graph {

// Megatron-Core MoE (graph/models/megatron_moe.h / .cpp, docs/moe-megatron.md): spec.experts
// > 0 makes the MLP of every layer spec.layer_is_moe(l) a MoELayer.
enum class MegatronDispatcher : uint8_t { allgather, alltoall };
struct MegatronMoeShape {
  MoeSpec spec;                    // experts, top_k, expert_d_ff, shared_d_ff, router, routing
  int64_t expert_parallel = 1;     // EP: this rank (EP rank 0) holds experts [0, E/EP)
  // ETP (--expert-tensor-parallel-size): each local expert's fc1 columns and fc2 rows split
  // over ETP ranks, which all receive the same tokens (graph/models/megatron_moe.cpp).
  int64_t expert_tensor = 1;
  MegatronDispatcher dispatcher = MegatronDispatcher::allgather;
  double capacity_factor = 0;      // --moe-expert-capacity-factor; 0 = dropless
  bool pad_to_capacity = false;    // --moe-pad-expert-input-to-capacity
  bool recompute_moe = false;      // --recompute-modules moe
  bool recompute_shared = false;   // --recompute-modules shared_experts
  // --recompute-modules moe_act: TEGroupedMLP's CheckpointWithoutOutput around the weighted
  // SwiGLU (grouped_gemm only; graph/models/megatron_moe.cpp, docs/moe-megatron.md).
  bool recompute_moe_act = false;
  // The router's losses (graph/models/megatron_moe_loss.h): --moe-aux-loss-coeff > 0 (the
  // aux_loss load-balancing type) and --moe-z-loss-coeff given.
  bool aux_loss = false;
  bool z_loss = false;
  // --moe-grouped-gemm: TEGroupedMLP (Transformer Engine GroupedLinear fc1 / fc2; SwiGLU, no
  // bias). te_workspace: bytes of each of TE's 4 grouped-GEMM cuBLAS workspaces
  // (get_cublas_workspace_size_bytes: 32 MiB + 1024 on sm_90+, else 4 MiB).
  bool grouped_gemm = false;
  uint64_t te_workspace = 0;
  bool enabled() const { return spec.experts > 0; }
  int64_t local_experts() const { return spec.experts / expert_parallel; }
  int64_t expert_ffn() const { return spec.expert_d_ff / expert_tensor; }  // F / ETP per rank
};

struct MegatronShape {
  int64_t layers = 0, hidden = 0, heads = 0, ffn = 0, vocab = 0, max_positions = 0;
  int64_t batch = 1, seq = 1;
  uint64_t elem = 2;       // parameter and activation bytes (bf16 / fp16)
  bool flash = false;      // fused attention instead of the eager core attention
  bool dropout = true;     // hidden and attention dropout probability > 0
  bool bias = true;        // add_bias_linear
  // Issue #15 Megatron part 2 (docs/moe-megatron.md): --add-qkv-bias without
  // add_bias_linear (the QKV bias alone); --group-query-attention --num-query-groups
  // (kv_heads < heads: fused attention only); --swiglu (fc1 of 2 x ffn, the fused SwiGLU).
  bool add_qkv_bias = false;
  int64_t kv_heads = 0;    // 0: heads
  bool swiglu = false;
  bool qkv_bias() const { return bias || add_qkv_bias; }
  int64_t groups() const { return kv_heads > 0 ? kv_heads : heads; }
  bool gqa() const { return groups() != heads; }
  // QKV output columns over all ranks: h + 2 * groups * head_dim (3h for MHA).
  int64_t qkv_width() const { return hidden + 2 * groups() * (hidden / heads); }
  // fc1's output columns for an MLP of `f` (gated: [gate, up]).
  int64_t fc1_width(int64_t f) const { return swiglu ? 2 * f : f; }
  // Tensor parallel degree t (Megatron's Shoeybi et al. 2019 split): QKV and fc1
  // column-parallel (outputs and weights / t, heads / t), proj and fc2 row-parallel
  // (weights / t, outputs full after the all-reduce), the word embedding and the logits
  // vocab-parallel over the padded vocabulary; LayerNorms, position embedding and the
  // row-parallel biases are replicated. heads and ffn must divide by t.
  int64_t tensor = 1;
  // Sequence parallelism (Korthikanti et al. 2022 §4.2.2, --sequence-parallel, t > 1):
  // LayerNorms, dropouts and residual adds work on this rank's s/t sequence shard; the
  // column-parallel linears all-gather their input into the global buffer and save only
  // the shard, the row-parallel ones reduce-scatter their output; the embedding output
  // is scattered. seq must divide by t.
  bool sequence_parallel = false;
  // Pipeline parallelism (sim/megatron/megatron_pipeline.h): the model is one chunk of the GPT,
  // `layers` of its transformer layers (numbered from 0 within the chunk, as Megatron's
  // TransformerBlock numbers its local layers). pre_process: the chunk holds the
  // embedding (the first stage); post_process: the final LayerNorm, the output layer and
  // the loss (the last stage). A last stage without the embedding keeps its own copy of
  // the word embedding for the tied output layer (Megatron's shared_embedding,
  // "output_layer.weight", initialised from and all-reduced with stage 0's). The whole
  // model is both.
  bool pre_process = true, post_process = true;
  // Global index of this chunk's first layer (0 for the whole model): Megatron-Core's
  // get_transformer_layer_offset (transformer/transformer_layer.py at d98e8a64). Which layers
  // are MoE follows the global index (gpt_layer_specs.py get_gpt_decoder_block_spec slices
  // the whole model's moe_layer_pattern at [offset, offset + num_layers_to_build)); the
  // layers stay numbered from 0 within the chunk everywhere else (sim/megatron/
  // megatron_pipeline_moe.h).
  int64_t layer_offset = 0;
  // Output layer tied to the word embedding (Megatron's default); false =
  // --untie-embeddings-and-output-weights: the output layer has its own V_pad/t x h weight
  // (on the last stage, where the tied case keeps the shared copy: the same bytes there).
  bool tied = true;
  // Megatron pads the vocabulary to a multiple of make_vocab_size_divisible_by (128)
  // times t. With t == 1 the vocabulary is used as given (memsim's behaviour before
  // tensor parallelism; the shipped one-GPU numbers keep it).
  // Megatron-Core MoE layers (none unless moe.enabled()). A MoE model runs the dense MLPs'
  // bias + GeLU unfused (--no-bias-gelu-fusion: Megatron's fused bias-GeLU refuses the
  // experts' per-token probabilities, and the flag is global).
  MegatronMoeShape moe;
  // `l` is the chunk's local layer index.
  bool layer_is_moe(int64_t l) const { return moe.enabled() && moe.spec.layer_is_moe(l + layer_offset); }
  int64_t padded_vocab() const {
    if (tensor == 1) return vocab;
    const int64_t m = 128 * tensor;
    return (vocab + m - 1) / m * m;
  }
};

// Parameters of one tensor-parallel rank (all of them for t == 1): V*h + P*h + L*(12h^2 + 13h) + 2h for the bias GPT with ffn = 4h; in
// general L*(4h^2 + 2*h*ffn + 9h + ffn) + ... (tied output layer: no extra V*h). For a
// pipeline chunk: its layers, plus V*h + P*h with pre_process, plus 2h (final norm) with
// post_process, plus V*h (the output weight) with post_process alone or untied.
int64_t megatron_parameter_count(const MegatronShape& s);

// The formula's terms in bytes for one layer (see the table above), and the extras.
struct MegatronLayerBytes {
  uint64_t korthikanti = 0;   // s*b*h*(34 + 5*a*s/h), eager; s*b*h*34 with flash
  uint64_t norm_stats = 0;    // 2 LayerNorms x (mean + invvar) fp32
  uint64_t flash_extras = 0;  // logsumexp + RNG state (flash only)
  uint64_t total() const { return korthikanti + norm_stats + flash_extras; }
};
MegatronLayerBytes megatron_layer_saved_bytes(const MegatronShape& s);

class MegatronModel {
 public:
  MegatronModel(Runtime& rt, const MegatronShape& shape) : rt_(rt), s_(shape) {}

  // Megatron's get_global_memory_buffer() is one per process (parallel_state.py
  // _GLOBAL_MEMORY_BUFFER, keyed by name and dtype): the model chunks of an interleaved
  // pipeline stage share it. `buffer` outlives this model; unset, the model keeps its own.
  void share_global_buffer(Tensor* buffer) { shared_global_buffer_ = buffer; }
  // TEGroupedMLP's cuBLAS workspaces (get_cublas_workspace, functools.lru_cache'd) and
  // dummy wgrads (module/base.py's module-level _dummy_wgrads dict, keyed by shape and
  // dtype) are process-wide in Transformer Engine (d0067d0d): the model chunks of an
  // interleaved pipeline stage share them. `buffers` outlives this model; unset, the model
  // keeps its own.
  void share_te_buffers(std::vector<Tensor>* buffers) { shared_te_buffers_ = buffers; }

  // Parameters in Megatron's construction order (embedding, layers, final norm; the
  // output layer reuses the word embedding).
  void construct();
  // GPTModel.forward up to the logits: tokens and position ids (b, s) int64, and the
  // dataloader's attention mask (never read by the causal fused softmax, but passed down
  // to every layer and saved by the recompute checkpoints); returns the logits [s, b, V]
  // in the 16-bit dtype.
  Tensor forward(const Tensor& tokens, const Tensor& position_ids, const Tensor& attention_mask);
  // The three parts of forward, for pipeline chunks: the embedding ([s, b, h] after
  // dropout, [s/t, b, h] with SP; pre_process), the chunk's layers on `hidden` (the
  // caller keeps it alive), and the final LayerNorm + output layer (post_process).
  Tensor embed(const Tensor& tokens, const Tensor& position_ids);
  Tensor decoder(const Tensor& hidden, const Tensor& attention_mask);
  Tensor head(Tensor hidden);
  // One TransformerLayer (the caller keeps x alive, as the decoder loop does).
  Tensor layer(int32_t index, const Tensor& x, const Tensor& attention_mask);
  // compute_language_model_loss: labels transposed, vocab-parallel CE, loss transposed
  // back to [b, s] (fp32).
  Tensor language_model_loss(const Tensor& logits, const Tensor& labels);

  const MegatronShape& shape() const { return s_; }
  // Parameter ids in construction order, and whether each is weight-decayed (Megatron's
  // param groups: matrices decay, biases and norm parameters do not).
  const std::vector<int32_t>& parameter_ids() const { return params_; }
  const std::vector<bool>& decayed() const { return decayed_; }
  // Per entry of parameter_ids(): an expert parameter of a MoE layer (sharded over EP, its
  // grads and optimizer state over the expert data-parallel group). Empty without MoE.
  const std::vector<bool>& expert() const { return expert_; }
  uint64_t rows() const { return static_cast<uint64_t>(s_.batch * s_.seq); }
  uint64_t act() const { return rows() * s_.hidden * s_.elem; }  // one [s, b, h] tensor
  uint64_t tp() const { return static_cast<uint64_t>(s_.tensor); }
  // Rows of the tensors outside the tensor-parallel regions ([s/t, b, h] with SP).
  uint64_t rows_sp() const { return s_.sequence_parallel ? rows() / tp() : rows(); }

 private:
  Tensor attention(const Tensor& ln_out, const Tensor& attention_mask);
  // {q, k, v, mask} (eager) or {mixed QKV, mask} (flash).
  Tensor core_attention(const std::vector<Tensor>& in);
  // {query copy, mixed QKV, mask}: grouped-query attention (fused only).
  Tensor core_attention_gqa(const std::vector<Tensor>& in);
  Tensor mlp(const Tensor& ln_out);
  int32_t param(uint64_t elems, const std::string& name, bool decay);
  // get_global_memory_buffer().get_tensor(bytes, "mpu"): allocated at the first use and
  // replaced by a larger one when a use needs more; kept for the process lifetime.
  void use_global_buffer(uint64_t bytes);
  // The all-gathered input of a sequence-parallel column-parallel linear (0 without SP).
  uint64_t sp_gather() {
    if (!s_.sequence_parallel) return 0;
    use_global_buffer(act());
    return act();
  }
  uint64_t sp_scatter(uint64_t full) const { return s_.sequence_parallel ? full / tp() : 0; }

  Runtime& rt_;
  MegatronShape s_;
  // Parameter ids per layer (numeric mode names them to the fused ops; -1: no bias).
  struct LayerIds {
    int32_t ln1 = -1, qkv = -1, qkv_b = -1, proj = -1, proj_b = -1, ln2 = -1, fc1 = -1,
            fc1_b = -1, fc2 = -1, fc2_b = -1;
  };
  std::vector<LayerIds> ids_;
  // --- Megatron-Core MoE (graph/models/megatron_moe.cpp) ---------------------------------
  // The MoE layer's parameters (ids in params_): router weight and bias, this rank's local
  // experts (fc1 / fc2 weights and biases, as one id each per expert), the shared experts.
  struct MoeIds {
    int32_t router = -1, router_b = -1, shared_fc1 = -1, shared_fc2 = -1;
  };
  std::vector<MoeIds> moe_ids_;
  // The token dispatcher's attributes that outlive a forward (allgather: local_map,
  // local_probs, the reversed permutation; alltoall: probs, routing_map, the reversed
  // permutation): replaced by the same layer's next forward.
  struct MoeState {
    Tensor a, b, c;
  };
  std::vector<MoeState> moe_state_;
  std::vector<bool> expert_;  // per entry of params_: an expert parameter (EP-sharded)
  void construct_moe(int32_t layer, const std::string& prefix);
  // MoELayer.forward on the pre-MLP LayerNorm output; returns its [s/t, b, h] output (no bias).
  Tensor moe(const Tensor& ln_out);
  Tensor moe_body(const Tensor& ln_out);
  Tensor moe_router(const Tensor& x, Tensor& routing_map);
  Tensor moe_experts(const Tensor& permuted, const Tensor& probs, uint64_t rows);
  Tensor shared_experts(const Tensor& ln_out);
  // The router's losses (graph/models/megatron_moe_loss.cpp): apply_z_loss on the logits,
  // and the aux_loss load-balancing loss attached to the probs (each returns its input's
  // MoEAuxLossAutoScaler alias).
  Tensor moe_z_loss(const Tensor& logits);
  Tensor moe_aux_loss(const Tensor& logits, const Tensor& probs);
  int64_t moe_layer_index(int32_t l) const;
  // The dense MLP with bias + GeLU unfused (MoE models; see MegatronShape::moe).
  Tensor mlp_unfused(const Tensor& ln_out, uint64_t ffn, int32_t fc1, int32_t fc2, bool fc1_bias);
  int32_t word_ = -1, pos_ = -1, final_ln_ = -1;
  int32_t output_ = -1;  // output_layer.weight (untied head, or a last stage's copy)
  std::vector<int32_t> params_;
  std::vector<bool> decayed_;
  // mpu.get_global_memory_buffer() for the baddbmm input and the sequence-parallel gathers:
  // the model's own, or the one share_global_buffer() named.
  Tensor& global_buffer() { return shared_global_buffer_ ? *shared_global_buffer_ : global_buffer_; }
  Tensor global_buffer_;
  Tensor* shared_global_buffer_ = nullptr;
  // TEGroupedMLP's process-lifetime buffers (graph/models/megatron_moe.cpp): TE's 4
  // multi-stream cuBLAS workspaces and get_dummy_wgrad's cached [2F, h] and [h, F] tensors.
  std::vector<Tensor> te_buffers_;
  std::vector<Tensor>* shared_te_buffers_ = nullptr;
  std::vector<Tensor>& te_buffers() { return shared_te_buffers_ ? *shared_te_buffers_ : te_buffers_; }
  void use_te_grouped_buffers();
};

}  // namespace memsim::graph
