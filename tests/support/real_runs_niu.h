// NiuHuangxiaozi/assignment2-systems's profile_memory runs (shared/groundtruth/snapshots,
// SOURCES.md) as memsim inputs: the runs that memsim's cs336 family expresses with the
// scenario keys model.softmax: exp-twice and model.sdpa: masked-fill, and the measured
// peaks of all eight snapshots.
//
// Their own model (NiuTransformerLM, vocab 10000, ctx 256, d_model 512, 4 layers, 16
// heads, d_ff 1344) is the CS336 architecture written with the staff model's tensor
// sizes (einsum linears, hand-written RMSNorm / SiLU / RoPE) except in the attention: a
// softmax that computes exp(x - max) twice, and a CPU float mask applied in place with
// masked_fill_ on scores kept until the function returns (docs/niu-runs.md). Recording
// starts before the model is built, so each trace is a whole run from an empty allocator.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tests/support/real_runs.h"

namespace memsim {

// All eight snapshots (forward and forward_and_backward, fp32 S100/150/200, bf16 S200).
const std::vector<ReplayPeaks>& niu_measured();

// The four forward runs (3 forwards with grad, outputs discarded; the _mixed_precision
// one under torch.autocast(bf16) around each forward).
std::vector<RealRun> niu_forward_runs();

// The four forward_and_backward runs (fp32 S100/150/200, bf16 autocast S200): NIUAdam
// built after the model, then 3 x (zero_grad, logits = model(x), the one-hot loss on
// logits[:, -1, :], backward, step), expressed with the scenario keys loss.impl one-hot,
// loss.positions last, optimizer.impl out-of-place and (bf16) precision.autocast_region
// whole-run (docs/niu-runs.md). Recording covers the whole run: compare whole-program
// peaks, not the measured step's.
std::vector<RealRun> niu_train_runs();

}  // namespace memsim
