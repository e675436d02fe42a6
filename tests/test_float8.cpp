// precision.float8: tensorwise (graph/ops/ops_float8.h, docs/float8.md): torchao's
// Float8Linear on the decoder layers' linears. torch 1.13 has no float8 dtypes, so the
// evidence is hand arithmetic from torchao's source: the op's exact allocation sequence and
// forward peak, what a 2-layer bf16 Llama keeps at the end of its forward with and without
// float8, and the refusals by key.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "float8_test_support.h"
#include "graph/ops/ops_float8.h"
#include "graph/runtime.h"
#include "program/program.h"
#include "scenario/scenario.h"
#include "sim/step/schedule.h"
#include "step_measure_test_support.h"

using namespace memsim;

namespace {

// tensor_to_scale of n bf16 elements: abs, 0-d bf16 max, f64 amax, clamp, reciprocal,
// product, fp32 scale. Then _ToFloat8ConstrFunc: fp32 copy, quotient, clamp, fp8 data.
void cast(std::vector<uint64_t>& seq, uint64_t n) {
  for (uint64_t b : {2 * n, uint64_t{2}, uint64_t{8}, uint64_t{8}, uint64_t{8}, uint64_t{8},
                     uint64_t{4}, 4 * n, 4 * n, 4 * n, n})
    seq.push_back(b);
}


// Peak of requested bytes over events [from, to), relative to the live bytes at `from`.
uint64_t peak_between(const Program& p, size_t from, size_t to) {
  return static_cast<uint64_t>(memsim_test::live_and_peak(p, from, to).second);
}

using memsim_test::allocs_between;
using memsim_test::live_and_peak;
const char* const kLlama = memsim_test::kFloat8Llama;
std::string error_of(const std::vector<std::pair<std::string, std::string>>& overrides) {
  return memsim_test::float8_error_of(overrides);
}

}  // namespace

TEST_CASE("float8_linear: torchao's allocations, forward and backward", "[float8]") {
  const uint64_t R = 64, I = 64, O = 128;  // x (R, I), W (O, I), out (R, O)
  const uint64_t nx = R * I, nw = O * I, ng = R * O;
  Program program;
  graph::Runtime rt(program);
  rt.ctx.phase = Phase::forward;
  const int32_t w = rt.add_parameter(nw * 2, "w");
  int32_t leaf = -1;
  graph::Tensor x = rt.alloc_leaf(nx * 2, TensorKind::activation, graph::OpKind::other, &leaf);
  rt.begin_graph();
  const size_t f0 = program.events.size();
  graph::Tensor y = graph::float8_linear(rt, x, rt.param(w), R, I, O, 2.0 * R * I * O);
  const size_t f1 = program.events.size();

  std::vector<uint64_t> forward;
  cast(forward, nw);  // _get_weight_scale + _cast_weight_to_float8_t
  cast(forward, nx);  // the input, inside matmul_with_hp_or_float8_args.forward
  for (uint64_t b : {uint64_t{4}, uint64_t{4}, 2 * ng}) forward.push_back(b);  // 1/scales, out
  CHECK(allocs_between(program, f0, f1) == forward);
  // Kept after the forward: the bf16 output plus the saved fp8 weight and its 0-d scale
  // (the input's fp8 copy and scale are locals of the Function's forward).
  int64_t live = 0;
  for (size_t i = f0; i < f1; ++i) {
    const MemoryEvent& e = program.events[i];
    if (e.type == EventType::alloc) live += static_cast<int64_t>(e.bytes);
    if (e.type == EventType::free) live -= static_cast<int64_t>(program.tensors[e.tensor].bytes);
  }
  CHECK(live == static_cast<int64_t>(2 * ng + nw + 4));
  // Forward peak: the weight cast's fp32 quotient + clamp + fp8 data next to its scale
  // (9 nw + 4 = 73,732 B) beats the input cast's (nw + 4 + 4 + 9 nx = 45,064 B).
  CHECK(peak_between(program, f0, f1) == std::max({9 * nw + 4, nw + 8 + 9 * nx,
                                                   nw + nx + 16 + 2 * ng}));
  CHECK(peak_between(program, f0, f1) == 73732);

  rt.ctx.phase = Phase::backward;
  const size_t b0 = program.events.size();
  rt.backward(y);
  std::vector<uint64_t> backward = {2 * ng};  // the root grad (ones_like)
  cast(backward, ng);                         // grad_output to e5m2 (dim0)
  backward.push_back(nw);                     // W_fp8_t.t() copied column-major
  for (uint64_t b : {uint64_t{4}, uint64_t{4}, 2 * nx}) backward.push_back(b);  // grad_input
  cast(backward, ng);                         // grad_output to e5m2 again (dim1)
  cast(backward, nx);                         // the saved bf16 input to e4m3 again
  backward.push_back(ng);                     // g8.t() made contiguous
  backward.push_back(nx);                     // x8 copied column-major
  for (uint64_t b : {uint64_t{4}, uint64_t{4}, 2 * nw}) backward.push_back(b);  // grad_weight
  std::vector<uint64_t> got = allocs_between(program, b0, program.events.size());
  REQUIRE(got.size() >= backward.size());
  got.resize(backward.size());
  CHECK(got == backward);
}

TEST_CASE("float8 on a 2-layer bf16 Llama: the saved fp8 weights, exactly", "[float8]") {
  const Program base = build_program(load_scenario_text(kLlama, "f8.yaml", {}));
  const Program f8 =
      build_program(load_scenario_text(kLlama, "f8.yaml", {{"precision.float8", "tensorwise"}}));
  const memsim_test::StepMeasure a = memsim_test::measure_step(base);
  const memsim_test::StepMeasure b = memsim_test::measure_step(f8);
  // d_model 64, 4 heads of 16, 2 kv heads (kv width 32), d_ff 128. Per layer, each of the
  // seven Float8Linear saves its e4m3 weight (out x in bytes) and its 0-d fp32 scale; the
  // bf16 input is saved as by nn.Linear, the lm_head is not converted.
  const uint64_t per_layer = (64 * 64 + 4) + (32 * 64 + 4) + (32 * 64 + 4) + (64 * 64 + 4) +
                             3 * (128 * 64 + 4);
  CHECK(per_layer == 36892);
  CHECK(b.before_forward == a.before_forward);
  CHECK(b.forward_end - a.forward_end == 2 * per_layer);
  CHECK(b.after_backward == a.after_backward);  // every cast and copy is gone
  CHECK(b.peak > a.peak);                       // fp32 cast temporaries
}

TEST_CASE("precision.float8: what is refused, by key", "[float8]") {
  CHECK(error_of({{"precision.float8", "tensorwise"}}).empty());
  CHECK(error_of({{"precision.float8", "tensorwise"}, {"parallel.data", "4"}}).empty());  // DDP
  CHECK(error_of({{"precision.float8", "rowwise"}}).empty());  // tests/test_float8_rowwise.cpp
  CHECK_THAT(error_of({{"precision.float8", "tensorwise"},
                       {"lora.rank", "8"},
                       {"lora.targets", "all-linear"}}),
             Catch::Contains("lora.rank"));
  CHECK_THAT(error_of({{"precision.float8", "tensorwise"}, {"step.compile", "true"}}),
             Catch::Contains("step.compile"));
  CHECK(error_of({{"precision.float8", "tensorwise"}, {"checkpoint.policy", "full"}}).empty());
  CHECK_THAT(error_of({{"precision.float8", "tensorwise"}, {"checkpoint.policy", "sac-op"}}),
             Catch::Contains("checkpoint.policy") && Catch::Contains("sac-op"));
  CHECK_THAT(error_of({{"precision.float8", "tensorwise"}, {"parallel.sharding", "fsdp"}}),
             Catch::Contains("parallel.sharding"));
  CHECK_THAT(error_of({{"precision.float8", "tensorwise"}, {"parallel.sharding", "fsdp2"}}),
             Catch::Contains("fsdp2"));
  CHECK_THAT(error_of({{"precision.float8", "tensorwise"}, {"precision.params", "fp32"},
                       {"precision.autocast", "bf16"}}),
             Catch::Contains("precision.params"));
  CHECK_THAT(error_of({{"precision.float8", "tensorwise"}, {"precision.params", "fp32"}}),
             Catch::Contains("bf16"));
  CHECK_THAT(error_of({{"precision.float8", "tensorwise"}, {"model.architecture", "qwen2"}}),
             Catch::Contains("model.architecture"));
  CHECK_THAT(error_of({{"precision.float8", "tensorwise"}, {"model.d_ff", "100"}}),
             Catch::Contains("multiple of 16"));
}
