// StepCost: the work of the measured training step, as plain data the time model
// (sim/analysis/step_time.h, docs/time-model.md) turns into seconds (issue #18 item 1).
//
// Contract:
//  - The graph runtime and the schedule add to it while they emit the Program: GEMMs
//    (matmuls and attention kernels: FLOPs, bytes of their operands and result, the
//    dtype they multiply in), the HBM bytes of every other op, the optimizer's bytes,
//    collectives (bytes per rank and group size) and host transfers (PCIe bytes).
//  - Everything added before the mark "measured_step_begin" is dropped at that mark
//    (Program::mark): the cost is the measured step's, the part of the run the peaks
//    are reported for (warm-up steps are not counted).
//  - GEMMs and collectives are kept in small tables of distinct shapes with a count
//    (a model repeats the same few dozen shapes per layer), so adding costs allocates
//    nothing once the tables have their rows: no per-event storage.
//  - `unmodelled` names, as "KEY: why", work of the step the time model does not cost
//    (the estimate is then refused, never partial). Kept across the measured-step reset.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace memsim {

enum class CostPart : uint8_t { forward, backward, recompute, optimizer, communication, transfer };
inline constexpr int kCostPartCount = 6;
const char* to_string(CostPart part);

// The peak-rate class a GEMM runs at (a device's datasheet row).
enum class MathDtype : uint8_t { fp32, tf32, bf16, fp16, fp8 };
inline constexpr int kMathDtypeCount = 5;
const char* to_string(MathDtype dtype);

enum class Collective : uint8_t { all_reduce, all_gather, reduce_scatter };
const char* to_string(Collective kind);

struct GemmCost {
  CostPart part = CostPart::forward;
  MathDtype dtype = MathDtype::fp32;
  double flops = 0;  // of one call
  double bytes = 0;  // operands read + result written, one call
  uint64_t count = 0;
};

// `bytes` is the full (unsharded) tensor a rank contributes to or receives: the buffer
// of an all-reduce, the gathered output of an all-gather, the input of a reduce-scatter.
struct CollectiveCost {
  Collective kind = Collective::all_reduce;
  int32_t ranks = 1;
  double bytes = 0;
  uint64_t count = 0;
};

struct StepCost {
  // HBM bytes moved by ops that are not GEMMs (element-wise, norms, softmax, copies,
  // losses, the optimizer's kernels), by part.
  double traffic[kCostPartCount] = {0, 0, 0, 0, 0, 0};
  std::vector<GemmCost> gemms;
  std::vector<CollectiveCost> collectives;
  double host_bytes = 0;  // host <-> device copies (PCIe), both directions summed
  std::string unmodelled;

  void add_gemm(CostPart part, MathDtype dtype, double flops, double bytes);
  void add_collective(Collective kind, int32_t ranks, double bytes);
  // First reason wins (the estimate is refused for it).
  void refuse(const std::string& why) {
    if (unmodelled.empty()) unmodelled = why;
  }
  // The measured step begins: what was added so far belonged to earlier steps.
  void reset_step();
  // FLOPs of the GEMMs of one part.
  double gemm_flops(CostPart part) const;
};

}  // namespace memsim
