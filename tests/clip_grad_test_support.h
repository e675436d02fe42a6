// Test support: the expected events of torch.nn.utils.clip_grad_norm_ once its total norm
// exists, shared by the one-GPU and FSDP2 (DTensor) suites (tests/test_clip_grad.cpp,
// tests/test_clip_grad_fsdp2.cpp), whose clips differ only before that point.
//
// Contract: appends, in step_events' text (tests/step_events_support.h), the statements of
// torch/nn/utils/clip_grad.py from the total norm on, as sim/step/clip_grad.cpp models them
// (docs/clip-grad.md): error_if_nonfinite's isnan / isinf / logical_or, the per-grad norms
// dying (from the last), clip_coef = max_norm / (total_norm + 1e-6), the clamp, the
// locals at return; the total norm too unless it is kept.
#pragma once

#include <cstdint>
#include <vector>

#include "step_events_support.h"

namespace memsim_test {

// `norms`: the per-grad norms' numbers; `total`: the total norm's; `e`: bytes of a norm.
inline void expect_clip_after_total(ExpectedEvents& x, const std::vector<size_t>& norms, size_t total,
                                    uint64_t e, bool nonfinite, bool keep) {
  if (nonfinite) {
    const size_t a = x.add(1, "ge"), b = x.add(1, "ge"), c = x.add(1, "bitwise_or");
    x.drop(a);
    x.drop(b);
    x.drop(c);
  }
  for (auto it = norms.rbegin(); it != norms.rend(); ++it) x.drop(*it);
  const size_t shifted = x.add(e, "add.Scalar");
  const size_t recip = x.add(e, "reciprocal");
  const size_t coef = x.add(e, "mul");
  x.drop(recip);
  x.drop(shifted);
  const size_t clamped = x.add(e, "other");
  x.drop(coef);
  x.drop(clamped);
  if (!keep) x.drop(total);
}

}  // namespace memsim_test
