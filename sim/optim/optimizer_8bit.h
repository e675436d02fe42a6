// bitsandbytes 8-bit Adam / AdamW (bnb.optim.Adam8bit, AdamW8bit: Optimizer2State with
// optim_bits=8, block_wise=True, min_8bit_size=4096, not paged) as memory events.
//
// Contract (bitsandbytes/optim/optimizer.py, Optimizer2State.init_state / step): step()
// walks the parameters in order, skipping those without .grad; on a parameter's first
// step it creates its state, then updates it with one fused kernel (no temporaries):
//  - numel < 4096 (min_8bit_size): state1, state2 fp32 (zeros_like(p, dtype=float32));
//  - otherwise state1, state2 uint8 (numel bytes each), absmax1, absmax2 fp32 with one
//    value per 256-element block (ceil(numel / 256); releases before 0.42 used 2048);
//    the first such parameter also moves the two shared 256-entry fp32 quantisation maps
//    ("dynamic", "udynamic") to the GPU, 1 KiB each, kept for the optimizer's lifetime.
// So a large parameter costs 2 + 8/256 = 2.03 bytes of state per element, against 8 for
// torch.optim.AdamW (Dettmers et al. 2022, "8-bit Optimizers via Block-wise Quantization").
#pragma once

#include <cstdint>
#include <memory>

#include "sim/optim/optimizer_step.h"

namespace memsim {

inline constexpr uint64_t kBnbMin8bitSize = 4096;
inline constexpr uint64_t kBnbBlockSize = 256;

// param_elem: bytes per element of the parameters (their numel is bytes / param_elem).
std::unique_ptr<OptimizerSim> make_bnb_adam8bit(uint64_t param_elem);

}  // namespace memsim
