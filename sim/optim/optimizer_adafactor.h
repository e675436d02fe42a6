// transformers.optimization.Adafactor (Hugging Face, v4.3x-4.4x; the defaults
// scale_parameter=True, relative_step=True, beta1=None, weight_decay=0) as memory events.
//
// State (Shazeer & Stern 2018, "Adafactor": factored second moment, no first moment by
// default): for a matrix (graph::Parameter::rows > 0) exp_avg_sq_row (rows) and
// exp_avg_sq_col (cols = numel / rows), for a vector exp_avg_sq (numel); fp32 whatever the
// parameter's dtype (the grad is upcast first); plus state["RMS"], a 0-d fp32 tensor per
// parameter (set on every step, the first included). A 7B LLaMA's state is about 1.4 MB
// per layer instead of AdamW's 1.6 GB (fp32 m and v).
//
// Contract: step() walks the parameters in order (skipping those without .grad) and
// emits the code's allocations and frees in order, including the loop's Python locals
// that outlive an iteration (grad, p_data_fp32, update, lr hold the previous parameter's
// tensors until they are rebound; the last ones die when step() returns):
//   grad.float() and p.float() (16-bit parameters only), _rms (0-d), the relative-step lr
//   (0-d: RMS * step size; a Python float, no allocation, when the parameter's RMS is
//   below eps2 = 1e-3, e.g. a zero-initialised bias or lora_B, which is not modelled), update = grad**2 + eps (two n-sized fp32), the row/column means, the
//   approximation r_factor (rows), c_factor (cols), their product (n), the clip's _rms,
//   -update (n). Everything else is in place.
#pragma once

#include <cstdint>
#include <memory>

#include "sim/optim/optimizer_step.h"

namespace memsim {

// param_elem: bytes per element of the model's parameters; on_fp32_masters: it updates fp32
// master copies (no upcast copies then).
std::unique_ptr<OptimizerSim> make_hf_adafactor(uint64_t param_elem, bool on_fp32_masters);

}  // namespace memsim
