// The real CS336 runs recorded under torch.autocast(bf16) (precision.autocast: bf16;
// graph/autocast.h), with the evidence per run. Their scripts are the fp32 runs' of
// tests/support/real_runs.cpp with the forward (and, where the trace shows it, the loss) inside
// the autocast block. Not here: NiuHuangxiaozi's and silmont2000's bf16 snapshots, which
// use their own model classes (not cs336_basics), so memsim's cs336 family cannot
// express them.
#include "tests/support/real_runs.h"

namespace memsim {
namespace {

Scenario xl_bf16(int64_t seq) {
  Scenario s;
  s.source = "<real_runs_bf16>";
  s.model.family = ModelFamily::cs336;
  s.model.layers = 32;
  s.model.d_model = 2560;
  s.model.heads = 32;
  s.model.kv_heads = 32;
  s.model.d_ff = 10240;
  s.model.vocab = 10000;
  s.model.context_length = seq;
  s.batch.micro_batch = 4;
  s.batch.seq_len = seq;
  s.device.capacity = 80ull << 30;
  s.device.cublas_workspace = 8519680;
  s.precision.autocast = DType::bf16;
  return s;
}

Scenario medium_bf16(int64_t seq) {
  Scenario s = xl_bf16(seq);
  s.model.layers = 24;
  s.model.d_model = 1024;
  s.model.heads = 16;
  s.model.kv_heads = 16;
  s.model.d_ff = 4096;
  return s;
}

std::string tag(int64_t seq) { return " S" + std::to_string(seq); }

}  // namespace

std::vector<RealRun> cs336_bf16_real_runs() {
  std::vector<RealRun> runs;
  const std::string linyun =
      "LINYUNLinYun__CS336-assignment2-systems/cs336_systems_results_memory_profiles_xl_ctx";
  // LINYUNLinYun benchmark_nvtx.py, bf16 = `with torch.autocast("cuda", torch.bfloat16)`
  // around run_step's forward (no_grad for "forward"). The weight casts are cached (the
  // trace's cached_cast frames), and freed when the region exits after the forward.
  for (int64_t seq : {128, 512, 1024, 2048}) {
    RealRun r;
    r.id = "linyun xl forward no_grad bf16" + tag(seq);
    const char* blob = seq == 128 ? "e1139f57" : seq == 512 ? "6499e302" : seq == 1024 ? "06f69eb6" : "0b44bffa";
    r.snapshot = linyun + std::to_string(seq) + "_forward_bf16__" + blob + ".pickle";
    r.scenario = xl_bf16(seq);
    r.scenario.step.kind = StepKind::forward_no_grad;
    r.scenario.step.warmup_steps = 5;
    r.script.outputs_are_step_locals = true;
    runs.push_back(r);
  }
  // Full step: forward in the region, then `F.cross_entropy(logits.float(), ...)`: the
  // fp32 copy of the bf16 logits lives through log_softmax and nll_loss.
  for (int64_t seq : {128, 512}) {
    RealRun r;
    r.id = "linyun xl train foreach AdamW bf16" + tag(seq);
    r.snapshot = linyun + std::to_string(seq) + "_full_step_bf16__" +
                 (seq == 128 ? "f68696dc" : "4e0e7ff6") + ".pickle";
    r.scenario = xl_bf16(seq);
    r.scenario.optimizer.impl = OptimizerImpl::foreach;
    r.scenario.step.warmup_steps = 5;
    r.scenario.precision.autocast_region = AutocastRegion::forward_and_loss;
    r.scenario.loss.impl = LossFunction::torch_float;
    r.script.loss = LossImpl::torch_float;
    r.script.outputs_are_step_locals = true;
    runs.push_back(r);
  }
  // Wedsonlin nsys_profile.py: the 512/1024 "training" snapshots were recorded with the
  // autocast flag on (SOURCES.md says fp32): every einsum operand goes through
  // cached_cast, and the staff cross_entropy runs inside the region (its exp casts the
  // bf16 shifted logits to fp32 with cached_cast).
  for (int64_t seq : {512, 1024}) {
    RealRun r;
    r.id = "wedsonlin medium train bf16" + tag(seq);
    r.snapshot = "Wedsonlin__assignment2-systems/results_medium_" + std::to_string(seq) +
                 "_training_memory_snapshot__" + (seq == 512 ? "61dcd14d" : "83e7cb0c") + ".pickle";
    r.scenario = medium_bf16(seq);
    r.scenario.optimizer.impl = OptimizerImpl::cs336;
    r.scenario.step.warmup_steps = 5;
    r.scenario.precision.autocast_region = AutocastRegion::forward_and_loss;
    r.script.loss = LossImpl::cs336;
    r.script.zero_grad = ZeroGradAt::after_step;
    r.script.measured_step_zero_grad = false;
    r.script.del_outputs_before_measured = true;
    r.script.zero_grad_before_measured = true;
    r.script.per_step_batches = true;
    runs.push_back(r);
  }
  // Wedsonlin inference S512: inference_mode + autocast, so no weight cast is cached
  // (each einsum's x and W copies die with it).
  {
    RealRun r;
    r.id = "wedsonlin medium inference bf16 S512";
    r.snapshot = "Wedsonlin__assignment2-systems/results_medium_512_inference_memory_snapshot__2afd8bc6.pickle";
    r.scenario = medium_bf16(512);
    r.scenario.step.kind = StepKind::forward_no_grad;
    r.scenario.step.warmup_steps = 5;
    r.script.bind_output = false;
    r.script.per_step_batches = true;
    r.script.targets_on_device = false;
    r.script.inference_mode = true;
    runs.push_back(r);
  }
  // sidsoc12 memory_profiling.py, bf16 infer S512: the fp32 script's warm-up forward
  // whose logits stay bound, then the recorded forward, both under autocast (H100).
  {
    RealRun r;
    r.id = "sidsoc12 xl forward+warm-up graph bf16 S512";
    r.snapshot = "sidsoc12__spring2024-assignment2-systems/cs336_systems_mem_snapshot_ctx512_bf16_infer__3239def3.pickle";
    r.scenario = xl_bf16(512);
    r.scenario.device.cublas_workspace = 33554432;
    r.scenario.step.kind = StepKind::forward;
    r.scenario.step.warmup_steps = 1;
    r.scenario.optimizer.impl = OptimizerImpl::cs336;
    r.script.warmup_kind_set = true;
    r.script.warmup_kind = StepKind::forward;
    r.script.loss = LossImpl::cs336;
    r.script.zero_grad = ZeroGradAt::after_step;
    r.script.cs336_revision = graph::Cs336Revision::v2025;
    runs.push_back(r);
  }
  // bolongcheng benchmark_base.py cl512 bf16 (B200, expandable segments): forward with
  // grad on, output dropped.
  {
    RealRun r;
    r.id = "bolongcheng xl forward grad bf16 S512";
    r.snapshot = "bolongcheng__assignment2-systems/benchmarks_memory_snapshot_xl_fwd_cl512_dtypetorch.bfloat16__bf3e273f.pickle";
    r.scenario = xl_bf16(512);
    r.scenario.step.kind = StepKind::forward;
    r.scenario.step.warmup_steps = 5;
    r.scenario.allocator.expandable_segments = true;
    r.script.outputs_are_step_locals = true;
    r.script.targets_on_device = false;
    runs.push_back(r);
  }
  return runs;
}

}  // namespace memsim
