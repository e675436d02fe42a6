// F.scaled_dot_product_attention on PyTorch's cuDNN backend
// (aten::_scaled_dot_product_cudnn_attention, ScaledDotProductCudnnAttentionBackward0), the
// kernel torch >= 2.9 picks first for fp16/bf16 on sm90/sm100 when the runtime cuDNN is
// newer than 9.15 (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp,
// check_prefer_cudnn_attention; TORCH_CUDNN_SDPA_DEPRIORITIZED=1 turns it off).
//
// Contract (what the op emits, in the order the H200 traces of torch 2.11.0+cu130 show it:
// tests/data/h100/arch tf_arch_qwen2/qwen3_*_bf16_sdpa, tests/data/gpu/impl and
// tests/data/gpu/hft runs that recorded ScaledDotProductCudnnAttentionBackward0):
//  forward: philox seed and offset (two 1-element int64 device tensors, 8 B each, made even
//    without dropout), the output (B,S,H,hd layout, the input dtype), the logsumexp
//    (B,H,S) fp32 when a grad is needed, and a 256 B cuDNN workspace freed on return (the
//    size every traced shape got: B 4, S 1024, hd 64 and 128). The node saves q, k, v, out,
//    logsumexp, seed and offset.
//  backward: dq, dk, dv in q/k/v's own shapes (grouped KV heads natively: dk/dv have the
//    KV heads), then one workspace freed before the node returns:
//      B*H*S*hd*4 (an fp32 dQ accumulator)
//    + 2*B*H*S*hd*elem when k/v have fewer heads than q (grouped-query attention: dK/dV
//      for every query head, summed down by cuDNN)
//    + B*H*S*4 (the softmax statistics) + 256 B (as the forward's workspace).
//    Measured: 17039616 B (MHA, hd 64), 33816832 B (16/4 heads, hd 64), 67371264 B (16/8
//    heads, hd 128), all B 4, S 1024, bf16. The two GQA terms are read off bf16 runs, where
//    2*elem = 4: which of the two (fp32 dQ-sized or two low-precision dK/dV-sized buffers)
//    the second is, fp16/bf16 cannot tell apart (cuDNN takes no fp32). Not measured: other
//    S (padding of the statistics), MQA (one KV head), dropout.
#pragma once

#include "graph/ops/ops_nn.h"
#include "graph/runtime.h"

namespace memsim::graph {

// q (B,H,S,hd), k/v (B,KV,S,hd) with KV = s.kv_heads (0: H): the output.
Tensor sdpa_cudnn(Runtime& rt, const Tensor& q, const Tensor& k, const Tensor& v,
                  const SdpaShape& s, double flops);

// Backward of an sdpa_cudnn node (hook of graph::run_backward); false for other nodes.
bool run_sdpa_cudnn_backward(Runtime& rt, Node& n, const Grad in[2], Grad out[3]);

}  // namespace memsim::graph
