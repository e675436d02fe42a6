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

Issue #15 Megatron part 3 (pipeline stages, config F): pipeline_model_parallel_size p > 1.
The formula's "most loaded" shard holds 1/p of the transformer block (layers and the final
LayerNorm, tensor-parallel, replicated and expert parameters alike) plus ONE embedding
(h x V_pad / TP; the untied output layer is added only when p = 1), its "other shards"
1/p of the block without embedding (stage_weights_and_optimizer). Activations for p > 1
without sequence parallelism and selective recompute: compute_activation_memory_without_sp
(s*b*h*(10 + 24/TP) per layer x all L layers, 8*s*b*p + s*b*h*p for the embedding, times
min(1, m/p) for 1F1B, times its 1.05 overhead factor; no output-layer term for p > 1).

Expert tensor parallelism (config G): expert parameters over ETP x EP, the expert
data-parallel size world / (ETP x EP x PP), as compute_weight_and_optimizer_memory has them.

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


def stage_weights_and_optimizer(c):
    """(most loaded shard, other shards) bytes and parameters for pipeline p = c["pp"]."""
    h, L, V = c["hidden"], c["layers"], c["padded_vocab"]
    E, F, S = c["experts"], c["moe_ffn"], c.get("shared_ffn", 0)
    tp, ep, etp, pp, dp = c["tp"], c["ep"], c.get("etp", 1), c["pp"], c["dp"]
    world = tp * dp * pp
    edp = world // (etp * ep * pp)
    heads, groups = c.get("heads", 1), c.get("groups", c.get("heads", 1))
    gated = 1.5 if c.get("swiglu") else 1
    attention = 2 * h * h * (1 + groups / heads)
    norms = 2 * h * 2                           # LayerNorm (norm_size 2), as this family has
    router = h * E + (E if c["bias"] else 0)
    experts = 2 * h * F * E * gated
    shared = 2 * h * S * gated
    embedding = h * V
    tp_block = (attention + shared) * L
    replicated_block = (norms + router) * L + 2 * h    # + final_layernorm
    expert_block = experts * L

    def per_param(d):
        return 6 + 12 / d if c["dist_opt"] else 18

    def total(tp_sharded, replicated, expert_sharded):
        return ((tp_sharded + replicated) * per_param(dp) + expert_sharded * per_param(edp),
                tp_sharded + replicated, expert_sharded)

    most = total((tp_block / pp + embedding) / tp, replicated_block / pp,
                 expert_block / pp / (etp * ep))
    other = total(tp_block / (pp * tp), replicated_block / pp, expert_block / (pp * etp * ep))
    return most, other


def activations_without_sp(c):
    s, b, h, L, tp, pp, m = c["seq"], c["micro"], c["hidden"], c["layers"], c["tp"], c["pp"], c["micro_batches"]
    act = s * b * h * (10 + 24 / tp) * L
    act += 8 * s * b * pp + s * b * h * pp
    if pp > 1:
        act *= min(1, m / pp)
    return act * 1.05


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
    # scenarios/mixtral-8x7b-megatron-swiglu-gqa-etp2-ep8.yaml (expert tensor parallelism):
    # D with --expert-tensor-parallel-size 2 (Megatron's default, = TP): EDP 32 / (2 x 8) = 2.
    "G: D with ETP 2 (shipped, EDP 2)": dict(
        hidden=4096, layers=32, padded_vocab=32000, experts=8, moe_ffn=14336, ffn=14336,
        heads=32, groups=8, swiglu=True,
        tp=2, ep=8, etp=2, dp=16, bias=False, untied=True, dist_opt=True, seq=4096, micro=1),
}

# scenarios/mixtral-8x7b-megatron-pp4-ep8.yaml (issue #15, Megatron part 3): Megatron-LM's
# examples/mixtral script's layout, TP1 PP4 EP8, DP8 (32 GPUs), 32 micro-batches.
STAGE_CONFIGS = {
    "F: SwiGLU + GQA, TP1 PP4 EP8 DP8 (EDP 1), dist. opt., m 32 (shipped)": dict(
        hidden=4096, layers=32, padded_vocab=32000, experts=8, moe_ffn=14336, ffn=14336,
        heads=32, groups=8, swiglu=True, tp=1, pp=4, ep=8, dp=8, bias=False, untied=True,
        dist_opt=True, seq=4096, micro=1, micro_batches=32),
}

if __name__ == "__main__":
    GiB = 1024 ** 3
    for name, c in CONFIGS.items():
        w, dense, expert = weights_and_optimizer(c)
        a = activations(c)
        print(f"{name}: dense params {dense:,.0f}, expert params {expert:,.0f}, "
              f"weights+optimizer {w / GiB:.3f} GiB ({w:,.0f} B), activations {a / GiB:.3f} GiB")
    for name, c in STAGE_CONFIGS.items():
        (mw, md, me), (ow, od, oe) = stage_weights_and_optimizer(c)
        a = activations_without_sp(c)
        print(f"{name}: most loaded shard: dense params {md:,.0f}, expert params {me:,.0f}, "
              f"weights+optimizer {mw / GiB:.3f} GiB ({mw:,.0f} B); other shards: dense params "
              f"{od:,.0f}, expert params {oe:,.0f}, weights+optimizer {ow / GiB:.3f} GiB ({ow:,.0f} B); "
              f"first-stage activations (without SP) {a / GiB:.3f} GiB ({a:,.0f} B)")
