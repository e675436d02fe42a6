#include "tests/support/real_runs_other.h"

namespace memsim {

namespace {

constexpr uint64_t kWorkspaceDefault = 8519680;  // cuBLAS workspace seen in all three traces

Scenario small_cs336(int64_t batch, int64_t seq) {
  Scenario s;
  s.source = "<real_runs_other>";
  s.model.family = ModelFamily::cs336;
  s.model.layers = 12;
  s.model.d_model = 768;
  s.model.heads = 12;
  s.model.kv_heads = 12;
  s.model.d_ff = 3072;
  s.model.vocab = 10000;
  s.model.context_length = seq;
  s.batch.micro_batch = batch;
  s.batch.seq_len = seq;
  s.device.capacity = 80ull << 30;
  s.device.cublas_workspace = kWorkspaceDefault;
  return s;
}

const std::string kSilmont = "silmont2000__assignment2-systems/";
const std::string kMagma = "MAGMA27__assignment2-systems/";
const std::string kCharan = "Charan6924__assignment2-systems/";

}  // namespace

const std::vector<ReplayPeaks>& other_runs_measured() {
  // `memsim replay FILE --json -`: peak_allocated_bytes, peak_reserved_bytes,
  // peak_requested_bytes (no mismatches in any of the four).
  static const std::vector<ReplayPeaks> m = {
      {kSilmont + "memory_forward_fp32_128__769df2d4.pickle", 560939008, 610271232, 556843008},
      {kSilmont + "memory_forward_bf16_128__d9ecf8be.pickle", 815783936, 861929472, 779837440},
      {kMagma + "memory_snapshot__a80ccc7b.pickle", 13927832064ull, 14180941824ull,
       13923997700ull},
      {kCharan + "cs336_systems_memory_snapshot__075dd064.pickle", 764083200, 937426944,
       762608640},
  };
  return m;
}

std::vector<RealRun> other_real_runs() {
  std::vector<RealRun> runs;

  // silmont2000 cs336_systems/benchmark.py @0f94da4e: their own TransformerLM "Small"
  // (768/3072/12/12, vocab 10000, ctx 128), batch 4, input_ids (4, 128) on the GPU, their
  // AdamW constructed (never stepped in forward mode). run_mode(): zero_grad(set_to_none),
  // `with ctx: with torch.no_grad(): _ = model.forward(input_ids)["logits"]` (`_` a local
  // of run_mode); ctx = nullcontext (fp32) or torch.autocast("cuda", bf16) around the
  // forward only. 5 warm-up + 1 timed run_mode, then recording covers one more.
  for (const bool bf16 : {false, true}) {
    RealRun r;
    r.id = std::string("silmont2000 small forward no_grad ") + (bf16 ? "bf16 autocast" : "fp32") +
           " S128";
    r.snapshot = kSilmont + (bf16 ? "memory_forward_bf16_128__d9ecf8be.pickle"
                                  : "memory_forward_fp32_128__769df2d4.pickle");
    r.scenario = small_cs336(4, 128);
    // swiglu.py: `a = w1(x)`, `b = w3(x)` (trace entries 141, 142), then w2(SiLU(a) * b).
    r.scenario.model.swiglu = SwigluImpl::projections_first;
    r.scenario.optimizer.type = OptimizerType::none;  // never stepped: no state
    r.scenario.step.kind = StepKind::forward_no_grad;
    r.scenario.step.warmup_steps = 6;
    if (bf16) {
      r.scenario.precision.autocast = DType::bf16;
      r.scenario.precision.autocast_region = AutocastRegion::forward;
    }
    r.script.outputs_are_step_locals = true;  // `_` dies when run_mode returns
    r.script.targets_on_device = false;       // forward mode: no targets
    runs.push_back(r);
  }

  // MAGMA27 cs336_systems/benchmarking_script.py @15883f2b: the staff
  // BasicsTransformerLM small (768/3072/12/12, vocab 10000, ctx 256), batch 32, fp32, data
  // and target (32, 256) int64 on the GPU. 5 warm-up iterations of `lm_head = model(data);
  // loss = nn_utils.cross_entropy(lm_head, target); loss.backward()`: no optimizer, no
  // zero_grad, so the grads accumulate. Recording starts before one more such iteration
  // (the previous lm_head dies when rebound after the forward: trace entry 1394).
  {
    RealRun r;
    r.id = "MAGMA27 small forward+backward, grads accumulate, S256 B32";
    r.snapshot = kMagma + "memory_snapshot__a80ccc7b.pickle";
    r.scenario = small_cs336(32, 256);
    r.scenario.optimizer.type = OptimizerType::none;
    r.scenario.step.kind = StepKind::forward_backward;
    r.scenario.step.warmup_steps = 5;
    r.script.loss = LossImpl::cs336;
    r.script.zero_grad = ZeroGradAt::never;
    runs.push_back(r);
  }

  // Charan6924 cs336_systems/benchmark.py @4e7e497c (the snapshot's commit): staff
  // BasicsTransformerLM, defaults small / ctx 512 / batch 4. Every allocation of the trace
  // is a forward (five logits of 81,920,000 B; no backward, no optimizer state), each
  // layer's activations freed at its end: mode "forward", `with torch.no_grad():
  // model(data)` with the output dropped. torch.optim.AdamW constructed (lazy state).
  // `_record_memory_history()` is called after the model, data and optimizer exist and
  // before the 5 warm-up run_step() calls; the snapshot is dumped after them, so the
  // trace is the 5 forwards (the cuBLAS workspace is allocated inside it).
  {
    RealRun r;
    r.id = "Charan6924 small forward no_grad x5 S512";
    r.snapshot = kCharan + "cs336_systems_memory_snapshot__075dd064.pickle";
    r.scenario = small_cs336(4, 512);
    r.scenario.optimizer.type = OptimizerType::none;  // AdamW never stepped: no state
    r.scenario.step.kind = StepKind::forward_no_grad;
    r.scenario.step.warmup_steps = 4;
    r.scenario.step.measure_whole_run = true;
    r.script.bind_output = false;
    r.script.targets_on_device = false;
    runs.push_back(r);
  }
  return runs;
}

}  // namespace memsim
