// memsim's megatron family against the published memory formulas: the rows of the
// README's "formula vs memsim" table, computed from simulated Programs. Used by
// tests/test_megatron.cpp (which asserts them) and tools/bench/bench_gpt3.cpp (which
// prints them).
//
//  - Korthikanti et al. 2022 (§4.1): activation bytes a transformer layer keeps for
//    backward, s*b*h*(34 + 5*a*s/h) with eager attention and dropout, s*b*h*34 without
//    the s^2 terms (here: fused attention); with tensor parallel t, Table 2's
//    s*b*h*(10 + 24/t + 5*a*s/(h*t)). memsim's figure is the requested bytes of
//    activation tensors allocated in that layer and live at forward_end; `extra` is what
//    Megatron keeps that the paper leaves out (LayerNorm mean/invvar, flash logsumexp and
//    RNG state), so that simulated == formula + extra exactly.
//  - Rajbhandari et al. 2020 (ZeRO, §3.1): model states of mixed-precision Adam, 16 bytes
//    per parameter with fp32 master weights, 12 without; and Megatron's own figures
//    (fp32 main_grad for bf16: 18; fp16 keeps fp32 grad copies until zero_grad: 20).
//    memsim's figure is parameters + gradients + optimizer_state live at optimizer_end,
//    divided by the parameter count.
#pragma once

#include <string>
#include <vector>

#include "scenario/scenario.h"

namespace memsim {

struct FormulaCheck {
  std::string name;      // what is compared
  std::string formula;   // the published expression
  std::string unit;      // "bytes/layer" or "bytes/param"
  double expected = 0;   // the formula's value
  double simulated = 0;  // memsim's
  double extra = 0;      // documented terms outside the formula (simulated - expected)
  std::string note;      // what `extra` is
};

// Korthikanti checks on `gpt3` (the shipped GPT-3 175B scenario): eager and flash.
std::vector<FormulaCheck> korthikanti_checks(const Scenario& gpt3);
// The same with tensor parallel t (Korthikanti Table 2: s*b*h*(10 + 24/t + 5*a*s/(h*t))
// eager, the s^2 term dropped with flash), on tensor-parallel rank 0.
// With `sequence`: s*b*h*(34/t + 5*a*s/(h*t)).
std::vector<FormulaCheck> korthikanti_tensor_parallel_checks(const Scenario& gpt3,
                                                             int64_t tensor, bool sequence = false);
// Megatron-LM's theoretical weight + optimizer memory (theoretical_memory_usage.py,
// 18 bytes/param, 6 + 12/d with parallel.zero 1, on the most loaded shard, pipeline 1) against memsim's parameters +
// gradients + optimizer state at optimizer_end of `s` (bf16, fp32 master, Adam).
FormulaCheck megatron_theoretical_weight_optimizer_check(const Scenario& s);
// Model-state checks on a small megatron model.
std::vector<FormulaCheck> model_state_checks();

}  // namespace memsim
