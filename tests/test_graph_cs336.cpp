// Unit tests of the symbolic eager runtime and the CS336 builder against the fact
// sheet (shared/docs/cs336-model.md).
#include <catch2/catch.hpp>

#include "graph/models/cs336.h"
#include "graph/models/losses.h"
#include "sim/step/execute.h"
#include "sim/step/schedule.h"

using namespace memsim;
using namespace memsim::graph;

namespace {

Cs336Shape xl_shape(int64_t seq) {
  Cs336Shape s;
  s.layers = 32;
  s.d_model = 2560;
  s.heads = 32;
  s.d_ff = 10240;
  s.vocab = 10000;
  s.context_length = seq;
  s.batch = 4;
  s.seq = seq;
  return s;
}

// Requested bytes of the tensors alive after event `end` (exclusive).
uint64_t live_bytes(const Program& p, size_t end) {
  int64_t live = 0;
  for (size_t i = 0; i < end; ++i) {
    const MemoryEvent& e = p.events[i];
    if (e.type == EventType::alloc) live += static_cast<int64_t>(e.bytes);
    if (e.type == EventType::free) live -= static_cast<int64_t>(e.bytes);
  }
  return static_cast<uint64_t>(live);
}

Scenario xl_scenario(int64_t seq) {
  Scenario s;
  s.model.family = ModelFamily::cs336;
  s.model.layers = 32;
  s.model.d_model = 2560;
  s.model.heads = 32;
  s.model.kv_heads = 32;
  s.model.d_ff = 10240;
  s.model.vocab = 10000;
  s.batch.micro_batch = 4;
  s.batch.seq_len = seq;
  s.device.capacity = 80ull << 30;
  return s;
}

}  // namespace

TEST_CASE("cs336 xl parameter count and bytes (§1)", "[graph][cs336]") {
  const Cs336Shape shape = xl_shape(128);
  CHECK(cs336_parameter_count(shape) == 3406809600LL);
  Program p;
  Runtime rt(p);
  Cs336Model model(rt, shape);
  model.construct();
  uint64_t bytes = 0;
  for (const Parameter& param : rt.parameters()) bytes += param.bytes;
  CHECK(bytes == 13627238400ULL);
  CHECK(rt.parameters().size() == 2 + 32 * 9 + 1);
  // Construction order: embedding, RoPE buffer (40,960 B at ctx 128), then layer 0's q.
  REQUIRE(p.tensors.size() >= 3);
  CHECK(p.tensors[0].bytes == 102400000);
  CHECK(p.tensors[1].bytes == 40960);
  CHECK(p.tensors[1].kind == TensorKind::other);
  CHECK(p.tensors[2].bytes == 26214400);
}

TEST_CASE("cs336 block keeps exactly the unique saved set of §3", "[graph][cs336]") {
  // 10a + 2A + 5f + S^2 + 8BHS + 4BHS + 8BS, block input included: 174,280,704 B at
  // xl S=128 (B=4).
  Cs336Shape shape = xl_shape(128);
  shape.layers = 1;
  Program p;
  Runtime rt(p);
  Cs336Model model(rt, shape);
  model.construct();
  // The block input: an activation that requires grad (a leaf here).
  const int32_t x_param = rt.add_parameter(model.act(), "x");
  rt.begin_graph();
  Tensor x = rt.param(x_param);
  const size_t before = p.events.size();
  const uint64_t live_before = live_bytes(p, before);
  Tensor out = model.block(0, x);
  out.reset();  // the block output is not saved by the block itself
  const uint64_t saved_new = live_bytes(p, p.events.size()) - live_before;
  CHECK(saved_new + model.act() == 174280704ULL);
}

TEST_CASE("cs336 xl forward under no_grad peaks at 13,859,874,816 B (§8.3)", "[graph][cs336]") {
  Scenario s = xl_scenario(128);
  s.step.kind = StepKind::forward_no_grad;
  s.step.warmup_steps = 0;
  s.device.cublas_workspace = 8519680;
  TrainingScript script;
  script.outputs_are_step_locals = true;
  const Program p = build_program(s, script);
  SimulatedDevice device(s.device.capacity, 0);
  const Timeline t = execute(p, s.allocator, device);
  uint64_t peak = 0;
  for (uint64_t a : t.allocated) peak = std::max(peak, a);
  CHECK(peak == 13859874816ULL);
  // Requested-size view: 13,724,936,192 B (params requested + RoPE + workspace + batch
  // + 85 MiB of FFN activations).
  uint64_t peak_req = 0;
  for (uint64_t r : t.requested) peak_req = std::max(peak_req, r);
  CHECK(peak_req == 13724936192ULL);
}

TEST_CASE("a training step frees every activation and keeps grads and state", "[graph][cs336]") {
  Scenario s = xl_scenario(128);
  s.model.layers = 2;
  s.optimizer.impl = OptimizerImpl::foreach;
  s.step.warmup_steps = 1;
  TrainingScript script;
  script.outputs_are_step_locals = true;
  const Program p = build_program(s, script);
  // Live at the end: params, their grads, exp_avg + exp_avg_sq, the batch, the RoPE
  // buffer and the two cuBLAS workspaces.
  uint64_t params = 0;
  {
    Program q;
    Runtime rt(q);
    Cs336Shape shape = xl_shape(128);
    shape.layers = 2;
    Cs336Model m(rt, shape);
    m.construct();
    for (const Parameter& param : rt.parameters()) params += param.bytes;
  }
  const uint64_t expected = 4 * params + 2 * 4 * 128 * 8 + 40960 + 2 * s.device.cublas_workspace;
  CHECK(live_bytes(p, p.events.size()) == expected);
  // Every alloc is freed at most once and tensor ids are dense.
  std::vector<int> state(p.tensors.size(), 0);
  for (const MemoryEvent& e : p.events) {
    if (e.type == EventType::alloc) CHECK(state[e.tensor]++ == 0);
    if (e.type == EventType::free) CHECK(state[e.tensor]++ == 1);
  }
  // The step's marks are there, in order.
  std::vector<std::string> marks;
  for (const MemoryEvent& e : p.events)
    if (e.type == EventType::mark) marks.push_back(p.str(static_cast<uint32_t>(e.bytes)));
  CHECK(marks == std::vector<std::string>{"measured_step_begin", "forward_end", "backward_end",
                                          "optimizer_end"});
}

TEST_CASE("cs336 FLOPs: backward is twice the forward matmuls", "[graph][cs336]") {
  Scenario s = xl_scenario(128);
  s.step.warmup_steps = 0;
  s.optimizer.type = OptimizerType::none;
  s.step.kind = StepKind::forward_backward;
  const Program p = build_program(s);
  const double B = 4, S = 128, D = 2560, F = 10240, V = 10000, L = 32, H = 32, h = 80;
  const double fwd = L * (2 * B * S * (4 * D * D + 3 * D * F) + 2 * 2 * B * H * S * S * h) +
                     2 * B * S * D * V;
  CHECK(p.flops.forward == Approx(fwd));
  CHECK(p.flops.backward == Approx(2 * fwd));
}

TEST_CASE("InputBuffer accumulation: in place into a solely owned grad, else a new sum",
          "[graph][autograd]") {
  Program p;
  Runtime rt(p);
  const int32_t w = rt.add_parameter(1024, "w");
  rt.ctx.phase = Phase::forward;
  rt.begin_graph();
  Tensor x = rt.param(w);
  // y = sigmoid(x) * x: two grads flow into x's AccumulateGrad; with a non-leaf in the
  // middle: a = exp(x); y = sigmoid(a) * a, the two grads into `a` meet in a buffer.
  Tensor a = graph::exp(rt, x);
  Tensor s = graph::sigmoid(rt, a);
  Tensor y = graph::mul(rt, s, a);
  Tensor loss = graph::mean_all(rt, y, 4);
  s.reset();
  y.reset();
  const size_t before = p.events.size();
  rt.ctx.phase = Phase::backward;
  rt.backward(loss);
  // Backward allocations: root grad (4), MeanBackward (1024), MulBackward 2x1024,
  // SigmoidBackward 1024 (added in place into the mul's grad for `a`: no sum tensor),
  // ExpBackward 1024 (stolen by AccumulateGrad).
  int allocs = 0;
  for (size_t i = before; i < p.events.size(); ++i)
    if (p.events[i].type == EventType::alloc) ++allocs;
  CHECK(allocs == 6);
  REQUIRE(rt.parameters()[w].grad != kNoStorage);
  CHECK(p.tensors[rt.parameters()[w].grad].kind == TensorKind::gradient);
}

TEST_CASE("gradient accumulation: later micro-batches add into .grad in place",
          "[graph][cs336]") {
  Scenario s = xl_scenario(128);
  s.model.layers = 1;
  s.optimizer.type = OptimizerType::none;
  s.step.kind = StepKind::forward_backward;
  s.step.warmup_steps = 0;
  auto grad_allocs = [](const Program& p) {
    int n = 0;
    for (const MemoryEvent& e : p.events)
      if (e.type == EventType::alloc && e.kind == TensorKind::gradient) ++n;
    return n;
  };
  s.batch.grad_accum = 1;
  const Program one = build_program(s);
  s.batch.grad_accum = 3;
  const Program three = build_program(s);
  // .grad tensors are created by the first micro-batch only (clone or steal).
  CHECK(grad_allocs(one) == grad_allocs(three));
  CHECK(grad_allocs(one) == 1 * 9 + 3);
  CHECK(three.flops.forward == Approx(3 * one.flops.forward));
}
