#!/usr/bin/env python3
"""Megatron-LM's theoretical memory estimate for a MoE GPT, for docs/moe-megatron.md.

Re-implements (not copies) the arithmetic of megatron/training/theoretical_memory_usage.py
at NVIDIA/Megatron-LM d98e8a64ddf34856e74b24714e3bedb2f5a39553 (2026-08-22):
compute_weight_and_optimizer_memory (dense parameters at 18 bytes, or 6 + 12/DP with the
distributed optimizer; expert parameters the same over the expert data-parallel size
world / (ETP x EP x PP)) and compute_activation_memory (Korthikanti et al. Table 2 with
sequence parallelism and selective recompute: s*b*h*(18 + 4*ffn/h) per layer over TP, plus
the embedding and output-layer terms; it has no MoE term: ffn_hidden_size stands for the
MLP). No MTP, no latent MoE, no MLA, moe_layer_freq 1, LayerNorm, pipeline 1. Issue #15
Megatron part 2: --swiglu (gated_linear_multiplier 3/2 on every MLP and expert) and
--group-query-attention (attention 2h^2 (1 + groups / heads)), as the formula has them.

Usage: theoretical_moe_memory.py  (prints the configs of docs/moe-megatron.md)
"""


def weights_and_optimizer(c):
    h, L, V = c["hidden"], c["layers"], c["padded_vocab"]
    E, F, S = c["experts"], c["moe_ffn"], c.get("shared_ffn", 0)
    tp, ep, etp, pp, dp = c["tp"], c["ep"], c.get("etp", 1), 1, c["dp"]
    world = tp * dp * pp
    edp = world // (etp * ep * pp)
    heads, groups = c.get("heads", 1), c.get("groups", c.get("heads", 1))
    gated = 1.5 if c.get("swiglu") else 1       # gated_linear_multiplier
    attention = 2 * h * h * (1 + groups / heads)  # QKV + proj (4h^2 without GQA)
    norms = 2 * h * 2                           # two LayerNorms with bias
    router = h * E + (E if c["bias"] else 0)    # the formula counts the router bias
    experts = 2 * h * F * E * gated
    shared = 2 * h * S * gated
    embedding = h * V
    tp_sharded = (attention + shared) * L + embedding
    if c["untied"]:
        tp_sharded += embedding
    tp_sharded /= tp
    replicated = (norms + router) * L + 2 * h
    expert_sharded = experts * L / (etp * ep)

    def per_param(d):
        return 6 + 12 / d if c["dist_opt"] else 18

    return ((tp_sharded + replicated) * per_param(dp) + expert_sharded * per_param(edp),
            tp_sharded + replicated, expert_sharded)


def activations(c):
    s, b, h, L, V = c["seq"], c["micro"], c["hidden"], c["layers"], c["padded_vocab"]
    ffn = c["ffn"]
    act = s * b * h * (18 + 4 * ffn / h) * L
    act += 8 * s * b + s * b * h                 # embedding input and dropout (pp = 1)
    act += s * b * h * 4 * (1 + V / h)           # output layer and CE (pp = 1)
    return act / c["tp"]


CONFIGS = {
    "A: shipped (TP2 SP, DP8, EP8, alltoall)": dict(
        hidden=4096, layers=32, padded_vocab=32000, experts=8, moe_ffn=14336, ffn=14336,
        tp=2, ep=8, dp=8, bias=True, untied=True, dist_opt=True, seq=4096, micro=1),
    "B: EP4 (expert DP 4)": dict(
        hidden=4096, layers=32, padded_vocab=32000, experts=8, moe_ffn=14336, ffn=14336,
        tp=2, ep=4, dp=8, bias=True, untied=True, dist_opt=True, seq=4096, micro=1),
    "C: EP8, no distributed optimizer": dict(
        hidden=4096, layers=32, padded_vocab=32000, experts=8, moe_ffn=14336, ffn=14336,
        tp=2, ep=8, dp=8, bias=True, untied=True, dist_opt=False, seq=4096, micro=1),
    # scenarios/mixtral-8x7b-megatron-swiglu-gqa-ep8.yaml (issue #15, Megatron part 2)
    "D: SwiGLU + GQA 8 groups, no biases, DP16 EP8 (shipped)": dict(
        hidden=4096, layers=32, padded_vocab=32000, experts=8, moe_ffn=14336, ffn=14336,
        heads=32, groups=8, swiglu=True,
        tp=2, ep=8, dp=16, bias=False, untied=True, dist_opt=True, seq=4096, micro=1),
    "E: D on 16 GPUs (parallel.data=8, expert DP 2)": dict(
        hidden=4096, layers=32, padded_vocab=32000, experts=8, moe_ffn=14336, ffn=14336,
        heads=32, groups=8, swiglu=True,
        tp=2, ep=8, dp=8, bias=False, untied=True, dist_opt=True, seq=4096, micro=1),
}

if __name__ == "__main__":
    GiB = 1024 ** 3
    for name, c in CONFIGS.items():
        w, dense, expert = weights_and_optimizer(c)
        a = activations(c)
        print(f"{name}: dense params {dense:,.0f}, expert params {expert:,.0f}, "
              f"weights+optimizer {w / GiB:.3f} GiB ({w:,.0f} B), activations {a / GiB:.3f} GiB")
