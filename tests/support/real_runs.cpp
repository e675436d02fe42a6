#include "tests/support/real_runs.h"

#include <cstring>

#include "sim/step/execute.h"
#include "sim/step/schedule.h"

namespace memsim {
namespace {

constexpr uint64_t kWorkspaceDefault = 8519680;  // cuBLAS workspace, GPUs other than sm_90
constexpr uint64_t kWorkspaceSm90 = 33554432;    // H100/H200

Scenario cs336(int64_t layers, int64_t d_model, int64_t heads, int64_t d_ff, int64_t seq) {
  Scenario s;
  s.source = "<real_runs>";
  s.model.family = ModelFamily::cs336;
  s.model.layers = layers;
  s.model.d_model = d_model;
  s.model.heads = heads;
  s.model.kv_heads = heads;
  s.model.d_ff = d_ff;
  s.model.vocab = 10000;
  s.model.context_length = seq;  // the scripts build the model with ctx = the measured length
  s.batch.micro_batch = 4;
  s.batch.seq_len = seq;
  s.device.capacity = 80ull << 30;
  s.device.cublas_workspace = kWorkspaceDefault;
  return s;
}
Scenario medium(int64_t seq) { return cs336(24, 1024, 16, 4096, seq); }
Scenario xl(int64_t seq) { return cs336(32, 2560, 32, 10240, seq); }

std::string tag(int64_t seq) { return " S" + std::to_string(seq); }

}  // namespace

std::vector<RealRun> cs336_real_runs() {
  std::vector<RealRun> runs;

  // Wedsonlin nsys_profile.py @8630bcfe, memory_profile(): medium, batch 4, 5 warm-up
  // steps. Training: per warm-up step `output = model(x); loss = cross_entropy(output, y);
  // loss.backward(); optimizer.step(); optimizer.zero_grad()`, then `del output, loss;
  // zero_grad(set_to_none=True)`, reset peaks, record forward + staff cross_entropy +
  // backward + staff AdamW step. Batches: (5,B,S) warm-up inputs, (1,B,S) measured
  // inputs, then the same two for targets. The 512/1024 training (and 512 inference)
  // snapshots were recorded under bf16 autocast (their traces cast every einsum operand
  // with _to_copy), so only 128/256 training are fp32 (the bf16 ones: tests/support/real_runs_bf16.cpp).
  for (int64_t seq : {128, 256}) {
    RealRun r;
    r.id = "wedsonlin medium train" + tag(seq);
    r.snapshot = "Wedsonlin__assignment2-systems/results_medium_" + std::to_string(seq) +
                 "_training_memory_snapshot__" + (seq == 128 ? "0db7d8c0" : "8a4284c4") +
                 ".pickle";
    r.scenario = medium(seq);
    r.scenario.optimizer.impl = OptimizerImpl::cs336;
    r.scenario.step.warmup_steps = 5;
    r.script.loss = LossImpl::cs336;
    r.script.zero_grad = ZeroGradAt::after_step;
    r.script.measured_step_zero_grad = false;
    r.script.del_outputs_before_measured = true;
    r.script.zero_grad_before_measured = true;
    r.script.per_step_batches = true;
    runs.push_back(r);
  }
  // Inference: model.eval(); torch.inference_mode(); `model(x)` result discarded; inputs
  // only (no targets).
  for (int64_t seq : {128, 256, 1024}) {
    RealRun r;
    r.id = "wedsonlin medium inference" + tag(seq);
    const char* blob = seq == 128 ? "77da8fef" : seq == 256 ? "e0143d82" : "1cfc21cd";
    r.snapshot = "Wedsonlin__assignment2-systems/results_medium_" + std::to_string(seq) +
                 "_inference_memory_snapshot__" + blob + ".pickle";
    r.scenario = medium(seq);
    r.scenario.step.kind = StepKind::forward_no_grad;
    r.scenario.step.warmup_steps = 5;
    r.script.bind_output = false;
    r.script.per_step_batches = true;
    r.script.targets_on_device = false;
    runs.push_back(r);
  }

  // LINYUNLinYun benchmark_nvtx.py: xl, batch 4, 5 warm-up steps of run_step(); run_step
  // = zero_grad(set_to_none=True); logits = model(inputs) [under no_grad for "forward"];
  // F.cross_entropy; backward; torch.optim.AdamW (foreach) step; logits and loss are
  // locals of run_step. Recording starts before the measured run_step (its zero_grad
  // frees the previous grads inside the trace).
  for (int64_t seq : {128, 512, 1024, 2048}) {
    RealRun r;
    r.id = "linyun xl forward no_grad" + tag(seq);
    const char* blob = seq == 128 ? "972da1f1" : seq == 512 ? "de79a1c6" : seq == 1024 ? "0713a14b" : "8bc56ac7";
    r.snapshot = "LINYUNLinYun__CS336-assignment2-systems/cs336_systems_results_memory_profiles_xl_ctx" +
                 std::to_string(seq) + "_forward_none__" + blob + ".pickle";
    r.scenario = xl(seq);
    r.scenario.step.kind = StepKind::forward_no_grad;
    r.scenario.step.warmup_steps = 5;
    r.script.outputs_are_step_locals = true;
    runs.push_back(r);
  }
  for (int64_t seq : {128, 512}) {
    RealRun r;
    r.id = "linyun xl train foreach AdamW" + tag(seq);
    r.snapshot = "LINYUNLinYun__CS336-assignment2-systems/cs336_systems_results_memory_profiles_xl_ctx" +
                 std::to_string(seq) + "_full_step_none__" + (seq == 128 ? "c5fe7494" : "f23d548b") +
                 ".pickle";
    r.scenario = xl(seq);
    r.scenario.optimizer.impl = OptimizerImpl::foreach;
    r.scenario.step.warmup_steps = 5;
    r.script.outputs_are_step_locals = true;
    runs.push_back(r);
  }

  // bolongcheng benchmark_base.py (B200, PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True):
  // xl, batch 4, 5 warm-up calls then one recorded call, forward only, output dropped;
  // token ids only on the device. cl128/cl2048 ran under no_grad, cl512 with grad on
  // (its peak is the logits allocation with every layer's saved tensors alive).
  for (int64_t seq : {128, 512, 2048}) {
    RealRun r;
    r.id = std::string("bolongcheng xl forward ") + (seq == 512 ? "grad" : "no_grad") + tag(seq);
    const char* blob = seq == 128 ? "c8575e83" : seq == 512 ? "0df6e0e9" : "5f809f2e";
    r.snapshot = "bolongcheng__assignment2-systems/benchmarks_memory_snapshot_xl_fwd_cl" +
                 std::to_string(seq) + "_dtypetorch.float32__" + blob + ".pickle";
    r.scenario = xl(seq);
    r.scenario.step.kind = seq == 512 ? StepKind::forward : StepKind::forward_no_grad;
    r.scenario.step.warmup_steps = 5;
    r.scenario.allocator.expandable_segments = true;
    r.script.outputs_are_step_locals = true;
    r.script.targets_on_device = false;
    runs.push_back(r);
  }

  // sidsoc12 memory_profiling.py @e6dfb40f (2025 staff code, "2.7B" = xl shape, H100:
  // 32 MiB cuBLAS workspace): one warm-up `logits = model(inputs)` with grad on, then
  // recording starts; recorded `logits = model(inputs)` (the warm-up logits and graph
  // die only when rebound), for train + staff cross_entropy, backward, staff AdamW
  // (v1.0.0: weight decay after the update), zero_grad().
  for (int64_t seq : {128, 256, 512}) {
    RealRun r;
    const bool train = seq == 128;
    for (int pass = 0; pass < (train ? 2 : 1); ++pass) {
      const bool is_train = train && pass == 1;
      r.id = std::string("sidsoc12 xl ") + (is_train ? "train" : "forward+warm-up graph") + tag(seq);
      const char* blob = is_train ? "8169e1e6" : seq == 128 ? "09d97098" : seq == 256 ? "0c23672b" : "e6cb6b41";
      r.snapshot = "sidsoc12__spring2024-assignment2-systems/cs336_systems_mem_snapshot_ctx" +
                   std::to_string(seq) + "_fp32_" + (is_train ? "train" : "infer") + "__" + blob +
                   ".pickle";
      r.scenario = xl(seq);
      r.scenario.device.cublas_workspace = kWorkspaceSm90;
      r.scenario.step.kind = is_train ? StepKind::train : StepKind::forward;
      r.scenario.step.warmup_steps = 1;
      r.scenario.optimizer.impl = OptimizerImpl::cs336;
      r.script.warmup_kind_set = true;
      r.script.warmup_kind = StepKind::forward;
      r.script.loss = LossImpl::cs336;
      r.script.zero_grad = ZeroGradAt::after_step;
      r.script.cs336_revision = graph::Cs336Revision::v2025;
      runs.push_back(r);
    }
  }
  return runs;
}

MeasuredStep predict_measured_step(const Scenario& scenario, const TrainingScript& script) {
  const Program program = build_program(scenario, script);
  SimulatedDevice device(scenario.device.capacity, scenario.device.cuda_context);
  ExecuteOptions options;
  options.record_by_kind = false;
  const Timeline t = execute(program, scenario.allocator, device, options);
  MeasuredStep m;
  m.events = program.events.size();
  size_t begin = 0;
  for (size_t i = 0; i < program.events.size(); ++i) {
    const MemoryEvent& e = program.events[i];
    if (e.type == EventType::mark && program.str(static_cast<uint32_t>(e.bytes)) == "measured_step_begin") {
      begin = i;
      break;
    }
  }
  if (t.size() == 0) return m;
  m.allocated_at_begin = t.allocated[begin];
  m.reserved_at_begin = t.reserved[begin];
  uint32_t allocs = 0;
  for (size_t i = begin; i < t.size(); ++i) {
    if (program.events[i].type == EventType::alloc) ++allocs;
    if (t.allocated[i] > m.peak_allocated) {
      m.peak_allocated = t.allocated[i];
      m.peak_event = i;
      m.peak_alloc_ordinal = allocs;
    }
    m.peak_reserved = std::max(m.peak_reserved, t.reserved[i]);
    m.peak_requested = std::max(m.peak_requested, t.requested[i]);
  }
  m.n_allocs = allocs;
  const MemoryEvent& pe = program.events[m.peak_event];
  m.peak_op = program.str(pe.op);
  m.peak_layer = pe.layer;
  m.peak_phase = pe.phase;
  return m;
}

}  // namespace memsim
