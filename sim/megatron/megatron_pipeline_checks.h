// memsim's first pipeline stage against Megatron-LM's theoretical memory
// (megatron/training/theoretical_memory_usage.py, the branch for sequence parallelism with
// selective recomputation), term by term. Used by tests/test_megatron_pipeline.cpp, which
// asserts the identities below, and printed there for the README's table.
//
// The formula, for the first stage of p (tensor parallel t, L layers, m micro-batches):
//  - weights + optimizer: 18 bytes (6 + 12/d with the distributed optimizer) x
//    (P_block / p + V_pad * h) / t, P_block = the L layers + the final LayerNorm.
//  - activations: [s*b*h*(18 + 4*ffn/h) * L      (Korthikanti Table 2, 34sbh per layer)
//                 + 8*s*b*p                       (input to the embedding)
//                 + s*b*h*p] / t                  (embedding dropout mask)
//    times min(1, m/p) for 1F1B, or (1 + (p-1)/(p*v)) for the interleaved schedule: L
//    layers of one micro-batch = L/p layers of p micro-batches in flight.
// memsim's side is measured on stage 0's Program (sim/megatron/megatron_pipeline.h): model states
// (parameters + gradients + optimizer state) at optimizer_end, activations live at
// forward_end (stage 0 then holds as many micro-batches as at its first backward).
//
// What each memsim row holds beyond the formula (`extra`, documented in `note`):
//  - layers: + the fused LayerNorms' fp32 mean/invvar (16sb/t per layer, per micro-batch
//    in flight), - the last layer's output, 2sbh/t per micro-batch (sent and deallocated;
//    the formula's per-layer count includes the next layer's input);
//  - embedding: + the embedding's output, 2sbh/t per micro-batch (the first layer's input,
//    counted in the layer term by the formula), + the 1-element stand-ins of the
//    deallocated outputs;
//  - inputs: token and position ids, 8sb each, not split by t (both saved by the
//    embedding lookups), and the b*s^2 attention mask the selective recompute keeps,
//    against the formula's 8sbp/t;
//  - weights: biases, the position embedding (not split by t) and replicated LayerNorms.
#pragma once

#include <vector>

#include "scenario/scenario.h"
#include "sim/megatron/megatron_checks.h"

namespace memsim {

// Rows: layers, embedding, inputs, activations total, weights + grads + optimizer, total.
// Throws std::invalid_argument unless `s` is a megatron pipeline (p > 1, 1f1b or
// interleaved) with sequence parallelism and selective recomputation, the setting that
// branch of the formula describes.
std::vector<FormulaCheck> megatron_theoretical_first_stage_checks(const Scenario& s);

}  // namespace memsim
