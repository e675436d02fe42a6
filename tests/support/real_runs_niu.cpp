#include "tests/support/real_runs_niu.h"

namespace memsim {

namespace {
const std::string kDir = "NiuHuangxiaozi__assignment2-systems/cs336_systems_profile_memory_";
}  // namespace

const std::vector<ReplayPeaks>& niu_measured() {
  // `memsim replay FILE --json -` peak_allocated_bytes / peak_reserved_bytes /
  // peak_requested_bytes (tests/test_niu_runs.cpp re-replays the files when shared/ is
  // checked out and compares the requested peak with manifest.json's).
  static const std::vector<ReplayPeaks> m = {
      {kDir + "forward_memory_snapshot_100__baf850cc.pickle", 416297472, 463470592, 412643888},
      {kDir + "forward_memory_snapshot_150__f1c4f97d.pickle", 639149056, 666894336, 626943088},
      {kDir + "forward_memory_snapshot_200__b4768efa.pickle", 882670592, 945815552, 879662288},
      {kDir + "forward_memory_snapshot_200_mixed_precision__7b5db6e8.pickle", 701606400,
       742391808, 693557968},
      {kDir + "forward_and_backward_memory_snapshot_100__9ab7a6e9.pickle", 695675904, 786432000,
       682735240},
      {kDir + "forward_and_backward_memory_snapshot_150__16edf316.pickle", 953719808,
       1063256064, 937034440},
      {kDir + "forward_and_backward_memory_snapshot_200__cee681b8.pickle", 1234635264,
       1390411776, 1229753640},
      {kDir + "forward_and_backward_memory_snapshot_200_mixed_precision__4ed70088.pickle",
       984657920, 1205862400, 977167528},
  };
  return m;
}

std::vector<RealRun> niu_forward_runs() {
  std::vector<RealRun> runs;
  // profile_memory.py / profile_mixprecision_memory.py @9d868b9b, mode "forward":
  // `_record_memory_history()`, build the model on the GPU, `torch.randint(0, 10000,
  // (10, S)).to("cuda")`, then three times `model(dummy_data)` with grad enabled and the
  // output discarded (mixed precision: each call inside `with autocast(bf16)`).
  // The cuBLAS workspace in the traces is 8,519,680 B (not an sm_90 GPU).
  struct Case {
    int64_t seq;
    bool bf16;
    const char* file;
  };
  const Case cases[] = {{100, false, "forward_memory_snapshot_100__baf850cc.pickle"},
                        {150, false, "forward_memory_snapshot_150__f1c4f97d.pickle"},
                        {200, false, "forward_memory_snapshot_200__b4768efa.pickle"},
                        {200, true, "forward_memory_snapshot_200_mixed_precision__7b5db6e8.pickle"}};
  for (const Case& c : cases) {
    RealRun r;
    r.id = std::string("niu forward ") + (c.bf16 ? "bf16 autocast" : "fp32") + " S" +
           std::to_string(c.seq);
    r.snapshot = kDir + c.file;
    Scenario& s = r.scenario;
    s.source = "<real_runs_niu>";
    s.model.family = ModelFamily::cs336;
    s.model.layers = 4;
    s.model.d_model = 512;
    s.model.heads = 16;
    s.model.kv_heads = 16;
    s.model.d_ff = 1344;
    s.model.vocab = 10000;
    s.model.context_length = 256;
    s.model.softmax = SoftmaxImpl::exp_twice;  // NIUsoftmax
    s.model.sdpa = SdpaImpl::masked_fill;      // NIUscaled_dot_product_attention
    s.batch.micro_batch = 10;
    s.batch.seq_len = c.seq;
    s.optimizer.type = OptimizerType::none;
    s.step.kind = StepKind::forward;
    s.step.warmup_steps = 2;  // forwards 1 and 2; the third is the "measured" one
    if (c.bf16) s.precision.autocast = DType::bf16;
    s.device.capacity = 80ull << 30;
    s.device.cublas_workspace = 8519680;
    r.script.bind_output = false;        // `model(dummy_data)`: the logits die at once
    r.script.targets_on_device = false;  // no labels in forward mode
    runs.push_back(r);
  }
  return runs;
}

std::vector<RealRun> niu_train_runs() {
  std::vector<RealRun> runs;
  // profile_memory.py / profile_mixprecision_memory.py @9d868b9b, mode
  // "forward_and_backward": `_record_memory_history()`, the model on the GPU,
  // `NIUAdam(model.parameters(), lr=0.001)` (its __init__ makes m and v for every
  // parameter), `dummy_data` (10, S) and `labels` (10,) int64 on the GPU, then three times
  // `zero_grad(); logits = model(dummy_data); predict = logits[:, -1, :];
  // loss = NIUCrossEntropyLoss()(predict, labels); loss.backward(); step()`. Mixed
  // precision: one `with autocast(bf16)` around the whole loop.
  struct Case {
    int64_t seq;
    bool bf16;
    const char* file;
  };
  const Case cases[] = {
      {100, false, "forward_and_backward_memory_snapshot_100__9ab7a6e9.pickle"},
      {150, false, "forward_and_backward_memory_snapshot_150__16edf316.pickle"},
      {200, false, "forward_and_backward_memory_snapshot_200__cee681b8.pickle"},
      {200, true, "forward_and_backward_memory_snapshot_200_mixed_precision__4ed70088.pickle"}};
  const std::vector<RealRun> forward = niu_forward_runs();
  for (const Case& c : cases) {
    RealRun r;
    r.id = std::string("niu train ") + (c.bf16 ? "bf16 autocast" : "fp32") + " S" +
           std::to_string(c.seq);
    r.snapshot = kDir + c.file;
    Scenario& s = r.scenario;
    s = forward[0].scenario;  // the same model, batch 10
    s.batch.seq_len = c.seq;
    s.precision.autocast.reset();
    if (c.bf16) {
      s.precision.autocast = DType::bf16;
      s.precision.autocast_region = AutocastRegion::whole_run;  // `with cm:` around the loop
    }
    s.loss.impl = LossFunction::one_hot;         // NIUCrossEntropyLoss
    s.loss.positions = LossPositions::last;      // logits[:, -1, :], labels (10,)
    s.optimizer.type = OptimizerType::adamw;     // NIUAdam's p.data - lr*wd*p.data line
    s.optimizer.impl = OptimizerImpl::out_of_place;
    s.step.kind = StepKind::train;
    s.step.warmup_steps = 2;                     // iterations 1 and 2, then the third
    r.script = default_script(s);                // zero_grad() first, logits/loss loop names
    runs.push_back(r);
  }
  return runs;
}

}  // namespace memsim
