// The op library as one table: a row per OpKind with the library that emits it and
// runs its backward (graph/ops/ops.cpp core ops, graph/ops/ops_nn.h torch.nn-level ops for the
// Hugging Face decoders, graph/ops/ops_fused.h Megatron's fused kernels, graph/autocast.h,
// graph/ops/ops_lora.h bitsandbytes, graph/ops/ops_liger.h Liger-Kernel), the aten op name
// its forward allocations carry and the autograd node name its backward allocations carry
// (what a real memory snapshot
// shows). Adding an op is a row here plus its forward function and backward recipe in
// its library's file. X(kind, library, forward name, backward name).
#pragma once

// clang-format off
#define MEMSIM_OP_TABLE(X) \
  X(accumulate_grad, core, "accumulate_grad", "AccumulateGrad") /* AccumulateGrad: steals or clones the incoming grad into .grad */ \
  X(pow2, core, "pow", "PowBackward0") /* pow.Tensor_Scalar(x, 2): saves x */ \
  X(mean_dim, core, "mean.dim", "MeanBackward1") /* mean(-1, keepdim): saves nothing; backward materialises input size */ \
  X(mean_all, core, "mean", "MeanBackward0") /* mean(): scalar */ \
  X(add_scalar, core, "add.Scalar", "AddBackward1") /* x + python scalar: pass-through backward */ \
  X(add, core, "add", "AddBackward0") /* add.Tensor, same shapes: pass-through to both inputs */ \
  X(sub, core, "sub", "SubBackward0") /* sub.Tensor, other may broadcast (reduced): other gets -grad (+sum_to) */ \
  X(mul, core, "mul", "MulBackward0") /* mul.Tensor, either side may broadcast */ \
  X(div, core, "div", "DivBackward0") /* div.Tensor(self, other), other may broadcast */ \
  X(div_scalar, core, "div.Scalar", "DivBackward1") /* x / python scalar */ \
  X(rsqrt, core, "rsqrt", "RsqrtBackward0") /* saves result */ \
  X(sigmoid, core, "sigmoid", "SigmoidBackward0") /* saves result */ \
  X(exp, core, "exp", "ExpBackward0") /* saves result */ \
  X(log, core, "log", "LogBackward0") /* saves self */ \
  X(neg, core, "neg", "NegBackward0") /* saves nothing */ \
  X(max_dim, core, "max.dim", "MaxBackward0") /* max.dim: values + int64 indices; saves indices */ \
  X(sum_dim, core, "sum.dim_IntList", "SumBackward1") /* sum(-1, keepdim): backward is an expand (view) */ \
  X(where_scalar, core, "where", "WhereBackward0") /* where(mask, x, python scalar): saves mask */ \
  X(gather, core, "gather", "GatherBackward0") /* gather(self, -1, idx): saves self (!) and idx */ \
  X(clone, core, "clone", "CloneBackward0") /* reshape that cannot be a view: clone + _unsafe_view */ \
  X(view, core, "view", "ViewBackward0") /* view/permute/reshape-alias; backward copies when the grad is not viewable */ \
  X(rope, core, "rope", "RopeBackward") /* CS336 RotaryEmbedding.forward, one composite node (cs336-model.md §2.4) */ \
  X(bmm, core, "bmm", "BmmBackward0") /* bmm(self, mat2): saves both */ \
  X(linear, core, "einsum", "BmmBackward0") /* einops.einsum(x, W) = views + bmm; weight grad reaches AccumulateGrad transposed */ \
  X(embedding, core, "index", "IndexBackward0") /* weight[ids]: aten::index; saves ids */ \
  X(log_softmax, core, "_log_softmax", "LogSoftmaxBackward0") /* _log_softmax: saves result */ \
  X(nll_loss, core, "nll_loss_forward", "NllLossBackward0") /* nll_loss_forward: output + total_weight; saves self, target, total_weight */ \
  X(addmm, nn, "addmm", "AddmmBackward0") \
  X(mm_linear, nn, "mm", "MmBackward0") \
  X(layer_norm, nn, "native_layer_norm", "NativeLayerNormBackward0") \
  X(embedding_nn, nn, "embedding", "EmbeddingBackward0") \
  X(softmax, nn, "_softmax", "SoftmaxBackward0") \
  X(tanh, nn, "tanh", "TanhBackward0") \
  X(silu, nn, "silu", "SiluBackward0") \
  X(mul_scalar, nn, "mul.Scalar", "MulBackward1") \
  X(add_bcast, nn, "add", "AddBackward0") \
  X(to_copy, nn, "_to_copy", "ToCopyBackward0") \
  X(native_dropout, nn, "native_dropout", "NativeDropoutBackward0") \
  X(slice_seq, nn, "slice", "SliceBackward0") \
  X(expand_clone, nn, "clone", "ExpandBackward0") \
  X(tied_sum, nn, "tied_weight", "InputBuffer::accumulate") \
  X(rope_hf, nn, "apply_rotary_pos_emb", "RotaryBackward") \
  X(sdpa_flash, nn, "_scaled_dot_product_flash_attention", "ScaledDotProductFlashAttentionBackward0") \
  X(sdpa_efficient, nn, "_scaled_dot_product_efficient_attention", "ScaledDotProductEfficientAttentionBackward0") \
  X(split_qkv, nn, "split", "SplitBackward0") \
  X(arange, core, "arange", "arange") \
  X(compare, core, "ge", "ge") \
  X(scalar_tensor, core, "scalar_tensor", "scalar_tensor") \
  X(fill, core, "ones_like", "ones_like") \
  X(optimizer_math, core, "optimizer", "optimizer") \
  X(other, core, "other", "other") \
  X(fused_layer_norm, fused, "fused_layer_norm", "FusedLayerNormAffineFunctionBackward") /* apex FusedLayerNormAffineFunction: saves input, mean, invvar */ \
  X(megatron_linear, fused, "megatron_linear", "LinearWithGradAccumulationAndAsyncCommunicationBackward") /* LinearWithGradAccumulationAndAsyncCommunication: saves input */ \
  X(qkv_split, fused, "qkv_split", "SplitWithSizesBackward0") /* views of the fused QKV output; backward cats the q, k, v grads */ \
  X(baddbmm, fused, "baddbmm", "BaddbmmBackward0") /* QK^T into a new scores tensor: saves q and k */ \
  X(fused_softmax, fused, "scaled_upper_triang_masked_softmax", "ScaledUpperTriangMaskedSoftmaxBackward") /* scaled_upper_triang_masked_softmax: saves its result */ \
  X(dropout, fused, "native_dropout", "NativeDropoutBackward0") /* native_dropout: output + bool mask; saves the mask */ \
  X(bias_dropout_add, fused, "bias_dropout_add", "BiasDropoutAddBackward") /* jit-fused bias + dropout + residual add: saves the mask */ \
  X(bias_gelu, fused, "bias_gelu", "GeLUFunctionBackward") /* GeLUFunction (fused bias + gelu): saves its input */ \
  X(fused_attention, fused, "fused_attention", "FusedAttnFuncBackward") /* flash / cuDNN attention: saves q, k, v, out, softmax lse */ \
  X(megatron_embedding, fused, "embedding", "EmbeddingBackward0") /* F.embedding whose weight grad goes to main_grad */ \
  X(vocab_parallel_ce, fused, "vocab_parallel_cross_entropy", "_VocabParallelCrossEntropyBackward") /* _VocabParallelCrossEntropy: saves the fp32 softmax */ \
  X(autocast_copy, autocast, "_to_copy", "ToCopyBackward0") /* _to_copy made by autocast: ToCopyBackward0 casts the grad back */ \
  X(grad_cast, autocast, "type_promotion", "validate_outputs") /* names the engine's validate_outputs dtype cast of a grad (no node) */ \
  X(rope_autocast, autocast, "rope", "RopeBackward") /* CS336 RoPE on a bf16/fp16 input (fp32 products; graph/autocast.h) */ \
  X(matmul_4bit, lora, "matmul_4bit", "MatMul4BitBackward") /* MatMul4Bit: dequantise the NF4 weight, linear; saves nothing */ \
  X(rope_hf_autocast, autocast, "apply_rotary_pos_emb", "RotaryBackward") /* HF apply_rotary_pos_emb on a bf16/fp16 input with fp32 cos/sin */ \
  X(sequence_scatter, fused, "scatter_to_sequence_parallel_region", "_ScatterToSequenceParallelRegionBackward") /* _ScatterToSequenceParallelRegion: this rank's contiguous shard */ \
  /* Megatron-Core MoE (graph/ops/ops_megatron_moe.h; issue #15, Megatron part) */ \
  X(moe_scatter, fused, "scatter", "ScatterBackward0") /* zeros_like(logits).scatter(1, idx, probs): saves idx */ \
  X(seq_gather, fused, "gather_from_sequence_parallel_region", "_GatherFromSequenceParallelRegionBackward") /* all-gather over TP x EP: saves nothing */ \
  X(seq_reduce_scatter, fused, "reduce_scatter_to_sequence_parallel_region", "_ReduceScatterToSequenceParallelRegionBackward") /* saves nothing */ \
  X(all_to_all, fused, "all_to_all", "_AllToAllBackward") /* EP all-to-all: saves nothing */ \
  X(index_select_rows, fused, "index_select", "IndexSelectBackward0") /* permute: saves the index */ \
  X(masked_select, fused, "masked_select", "MaskedSelectBackward0") /* permuted probs: saves the mask */ \
  X(scatter_add_rows, fused, "scatter_add_", "ScatterAddBackward0") /* unpermute, in place: saves the index */ \
  X(expert_bias_scale, fused, "mul", "MulBackward0") /* an expert's fc2 bias times its probs: saves the probs */ \
  /* Megatron-Core SwiGLU / GQA / router losses (graph/ops/ops_megatron_arch.h, ops_megatron_loss.h; issue #15, Megatron part 2) */ \
  X(fused_swiglu, fused, "bias_swiglu", "SwiGLUFunctionBackward") /* SwiGLUFunction / BiasSwiGLUFunction: saves its [.., 2f] input */ \
  X(weighted_swiglu, fused, "weighted_swiglu", "WeightedSwiGLUFunctionBackward") /* an expert's SwiGLU times its probs: saves the input and the probs */ \
  X(fused_attention_gqa, fused, "fused_attention", "FusedAttnFuncBackward") /* TE fused attention on the query copy and the k / v views: saves q, k, v, out, lse */ \
  X(logsumexp_rows, fused, "logsumexp", "LogsumexpBackward0") /* the z-loss's logsumexp(logits, -1): saves self and result */ \
  X(switch_aux_loss, fused, "switch_load_balancing_loss", "MulBackward0") /* sum(probs.sum(0) * tokens_per_expert) * c: saves tokens_per_expert */ \
  X(aux_loss_scaler, fused, "MoEAuxLossAutoScaler", "MoEAuxLossAutoScalerBackward") /* returns its input (a view); saves the loss; backward: the grad, ones_like(loss) * scale */ \
  X(moe_act_recompute, fused, "CheckpointWithoutOutput", "CheckpointWithoutOutput._recompute") /* --recompute-modules moe_act: the grad hook on TEGroupedMLP's fc2 output (a view); backward re-runs the weighted SwiGLU into fc2's emptied saved input (graph/ops/ops_megatron_arch.h) */ \
  X(select_dim, nn, "select", "SelectBackward0") /* x.select(dim, i), a view; SelectBackward0 = zeros(input) + copy */ \
  X(gelu, nn, "gelu", "GeluBackward0") /* F.gelu (exact or approximate='tanh'): saves self */ \
  X(cat2, nn, "cat", "CatBackward0") /* torch.cat((a, b), -1): new; CatBackward0 hands back views of the grad */ \
  X(chunk2, nn, "split", "SplitBackward0") /* x.chunk(2, -1): two views; SplitBackward0 cats the grads (new, x) */ \
  X(liger_flce, liger, "fused_linear_cross_entropy", "LigerFusedLinearCrossEntropyFunctionBackward") /* Liger's fused linear CE: grads computed in forward and saved; backward hands them out */ \
  X(fused_rms_norm, nn, "_fused_rms_norm", "FusedRmsNormBackward0") /* nn.RMSNorm on CUDA, torch >= 2.9: out + fp32 rstd; saves input, rstd, weight (graph/ops/ops_stack.h) */ \
  X(rope_complex, nn, "mul", "MulBackward0") /* torchtitan apply_rotary_emb on one of q/k: complex product with freqs_cis; saves the table (graph/ops/ops_stack.h) */ \
  X(rope_pairs, nn, "stack", "StackBackward0") /* torchtune RotaryPositionalEmbeddings.forward on one of q/k: four products on the cache, sub, add, stack; saves the cache (graph/ops/ops_stack.h) */ \
  X(copy_slices, nn, "copy_", "CopySlices") /* base[..., slice].copy_(src) (DeepSeek-V2's expand_kv, graph/ops/ops_mla.h): no forward bytes; backward a base-sized copy of the grad and the slice's clone */ \
  X(float8_linear, float8, "_scaled_mm", "matmul_with_hp_or_float8_argsBackward") /* torchao Float8Linear: tensorwise saves x, the fp8 weight and its scale (graph/ops/ops_float8.h); rowwise / rowwise_with_gw_hp save x and W (graph/ops/ops_float8_rowwise.h) */ \
  X(moe_index, moe, "index", "IndexBackward0") /* x[idx] (advanced indexing, graph/ops/ops_moe.h): saves the indices; backward zeros(x) + index_put_ accumulate */ \
  X(topk, moe, "topk", "TopkBackward0") /* torch.topk: values + int64 indices; saves indices; backward zeros + scatter */ \
  X(index_add, moe, "index_add_", "IndexAddBackward0") /* self.index_add_(0, idx, src): in place; saves idx; src's grad = index_select */ \
  X(div_inplace, moe, "div_", "DivBackward0") /* a /= b (b broadcast): the original a cloned and saved */ \
  X(cat_n, moe, "cat", "CatBackward0") /* torch.cat of many tensors (graph/ops/ops_moe.h cat_n): new; narrow views of the grad, a chain of nodes of up to three edges */ \
  X(one_hot, moe, "one_hot", "one_hot") /* F.one_hot: zeros(..., E) int64 + scatter_ (no grad) */ \
  X(nonzero, moe, "nonzero", "nonzero") /* nonzero / torch.where(cond): (n, dims) int64 (no grad) */ \
  X(sort, moe, "sort", "sort") /* argsort / histc / cumsum of the grouped_mm path (no grad) */ \
  X(grouped_mm, moe, "_grouped_mm", "GroupedMmBackward0") /* torch._grouped_mm(x, W3d, offs): saves x and W; backward grad_x, grad_W (the whole 3-D weight) */ \
  X(expand_index, moe, "index", "IndexBackward0") /* W3d[expert_ids] (batched_mm): (T*K, ...) weight copies; backward zeros(W) + index_put_ */ \
  X(zeros, core, "zeros", "zeros") /* generate (issue #17): StaticCache's preallocated K/V buffers (graph/models/kv_cache.h); no grad */ \
  X(cumsum, core, "cumsum", "cumsum") /* generate: cache_position, position_ids = attention_mask.cumsum(-1) - 1 */ \
  X(index, core, "index", "index") /* generate: input_ids[:, cache_position] */ \
  X(full, core, "full", "full") /* generate: torch.full (the causal mask, the stopping criteria's flags) */ \
  X(triu, core, "triu", "triu") /* generate: torch.triu of the causal mask */ \
  X(masked_fill, core, "masked_fill", "masked_fill") /* generate: the padding part of the 4-D mask */ \
  X(argmax, core, "argmax", "argmax") /* generate: greedy token selection */ \
  X(isin, core, "isin", "isin") /* generate: the EOS checks */ \
  X(reduce_any, core, "any", "any") /* generate: .any() checks */ \
  X(reduce_sum, core, "sum", "sum") /* generate: StaticCache.get_seq_length's sum */ \
  X(reduce_max, core, "max", "max") /* generate: unfinished_sequences.max() */ \
  X(eq, core, "eq", "eq") /* generate: == comparisons */ \
  X(bitwise, core, "bitwise_or", "bitwise_or") /* generate: the stopping criteria's |, ~, & */ \
  X(lift_fresh, core, "lift_fresh", "lift_fresh") /* generate: torch.tensor(token) for the special tokens */ \
  X(offload_unpack, core, "_to_copy", "_to_copy") /* save_on_cpu's unpack hook: tensor.to(device) of a host copy, in backward (graph/offload.h) */ \
  X(rope_litgpt, nn, "cat", "CatBackward0") /* LitGPT: cat((apply_rope(q[..., :n], cos, sin), q[..., n:])), one composite node; saves cos, sin (graph/ops/ops_litgpt.h) */ \
  X(chunked_ce_litgpt, nn, "_log_softmax", "LogSoftmaxBackward0") /* LitGPT chunked_cross_entropy(logits[..., :-1, :], ...), 128-row chunks, one composite node (graph/ops/ops_litgpt.h) */ \
  X(sdpa_cudnn, nn, "_scaled_dot_product_cudnn_attention", "ScaledDotProductCudnnAttentionBackward0") /* SDPA's cuDNN backend: philox seed/offset on the device, grouped KV heads natively (graph/ops/ops_sdpa_cudnn.h) */ \
  X(reciprocal, core, "reciprocal", "reciprocal") /* GradScaler.unscale_: _scale.double().reciprocal() (sim/step/grad_scaler.h); no grad */
// clang-format on
