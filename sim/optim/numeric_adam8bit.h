// Numeric bitsandbytes 8-bit Adam / AdamW (bnb.optim.Adam8bit / AdamW8bit: block-wise,
// 256 values per block, min_8bit_size 4096) for numeric mode (sim/check/numeric_check.h).
//
// Contract:
//  - bnb_dynamic_map(signed) is bitsandbytes' create_dynamic_map(signed, 7, 8) computed
//    as torch 1.13 does on the CPU in float32: linspace's kernel (fused multiply-add in
//    the scalar path, 8-lane AVX2 arange chunks pairwise, scalar tail), the float32 means
//    and scale products, sorted. tests/data/numeric/bnb_dynamic_map.json (written by
//    tools/fixtures/bnb_dynamic_map.py with torch) pins it bit for bit.
//  - NumericAdam8bit is the modelled kernel. A parameter of >= 4096 elements: the update
//    of kOptimizerStatic8bit2StateBlockwise per 256-block: dequantise (code[state] *
//    absmax), m = m b1 + (1-b1) g, v = v b2 + (1-b2) g^2, new absmax = max |.| over the
//    block (a partial block's padding slots count, as the kernel's reduce sees them:
//    state1 code 128, grad 0), p += (-lr c2 / c1) m / (sqrt(v) + c2 eps) with
//    c1 = 1 - b1^t, c2 = sqrt(1 - b2^t), then p *= 1 - lr wd; requantise with the
//    kernel's quantize_2D binary search (float32 midpoints) over the maps, m's sign kept
//    (the index moves by one when the code's sign differs). Smaller parameters: fp32
//    state and the 32-bit kernel (kOptimizer32bit2State), the same math unquantised.
//    State lives ONLY in the buffers the schedule allocated and registered
//    (sim/optim/optimizer_8bit.cpp): state1 / state2 (uint8 codes, or fp32), absmax1 / absmax2
//    (fp32 per block), the shared qmap1 / qmap2 (written once: the maps' .to(device)).
//    The arithmetic is double: the quantisation is emulated exactly at the map and
//    rounding-rule level, not the fp32 rounding of the Adam arithmetic.
//  - Adam8bitReference: the textbook Adam(W) (bias-corrected m-hat, v-hat, decoupled
//    decay after the step, as bitsandbytes applies it) with each block's m and v stored
//    as the NEAREST code value (linear scan) times the block's max |.|, m's sign kept;
//    its own state arrays.
//  - test_step_offset (test-only sabotage): the modelled kernel uses step + offset.
#pragma once

#include <Eigen/Core>
#include <array>
#include <cmath>
#include <cstdint>
#include <vector>

#include "graph/numeric/numeric.h"

namespace memsim {

// numeric mode's fixed AdamW8bit weight decay (as torch AdamW's, sim/optim/numeric_optimizer.h).
inline constexpr double numeric_hyper_8bit_weight_decay = 0.1;

std::array<float, 256> bnb_dynamic_map(bool is_signed);
// The kernel's quantize_2D<is_signed> of x (a value / the block's absmax) over `code`.
uint8_t bnb_quantize_2d(const Eigen::ArrayXd& code, bool is_signed, double x);

class NumericAdam8bit {
 public:
  explicit NumericAdam8bit(double weight_decay) : wd_(weight_decay) {}
  void step(graph::Runtime& rt, graph::NumericContext& c, const std::vector<Eigen::ArrayXd*>& params,
            const std::vector<const Eigen::ArrayXd*>& grads);
  int64_t test_step_offset = 0;
  int64_t quantised_params = 0;  // parameters updated through the 8-bit path (last step)
  // How close the run came to a different code: over every quantisation of a value
  // strictly inside (-1, 1), the smallest |x - nearest decision midpoint| / |x| (float32
  // arithmetic on the GPU moves x by a few 2^-24 relative), and the count.
  double min_margin = HUGE_VAL;
  int64_t decisions = 0;

 private:
  double wd_;
  std::vector<int64_t> step_;
  bool maps_written_ = false;
};

class Adam8bitReference {
 public:
  explicit Adam8bitReference(double weight_decay);
  void step(const std::vector<Eigen::ArrayXd*>& params, const std::vector<const Eigen::ArrayXd*>& grads);

 private:
  double wd_;
  std::array<float, 256> map1_, map2_;
  std::vector<int64_t> t_;
  std::vector<Eigen::ArrayXd> m_, v_;
};

}  // namespace memsim
