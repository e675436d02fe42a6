// precision.float8: rowwise and rowwise_with_gw_hp (graph/ops/ops_float8_rowwise.h,
// docs/float8.md): torchao's Float8Linear with axiswise scales. torch 1.13 has no float8
// dtypes, so the evidence is hand arithmetic from torchao's source (pytorch/ao @36027d8):
// the op's exact allocation sequence in forward and backward, its forward peak, what a
// 2-layer bf16 Llama keeps at the end of its forward, the refusals by key, and a run of a
// shipped scenario through the CLI.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "float8_test_support.h"
#include "cli_test_support.h"
#include "graph/ops/ops_float8_rowwise.h"
#include "graph/runtime.h"
#include "program/program.h"
#include "scenario/scenario.h"
#include "sim/step/schedule.h"
#include "step_measure_test_support.h"
#include "test_paths.h"

using namespace memsim;

namespace {

using memsim_test::allocs_between;
using memsim_test::live_and_peak;

// hp_tensor_to_float8_dynamic of n bf16 elements with an s-element scale and
// round_scales_to_power_of_2: abs, bf16 amax, f64 amax, clamp, reciprocal, product, fp32
// scale, log2, floor, exp2; then _ToFloat8ConstrFunc: fp32 copy, product, clamp, fp8 data.
void cast(std::vector<uint64_t>& seq, uint64_t n, uint64_t s) {
  for (uint64_t b : {2 * n, 2 * s, 8 * s, 8 * s, 8 * s, 8 * s, 4 * s, 4 * s, 4 * s, 4 * s,
                     4 * n, 4 * n, 4 * n, n})
    seq.push_back(b);
}

// addmm_float8_unwrapped without fast accum: a_inv, b_inv, the post scale, two 0-d ones,
// the bf16 output.
void scaled_mm_post(std::vector<uint64_t>& seq, uint64_t rows, uint64_t cols) {
  for (uint64_t b : {4 * rows, 4 * cols, 4 * rows * cols, uint64_t{4}, uint64_t{4},
                     2 * rows * cols})
    seq.push_back(b);
}



const uint64_t R = 64, I = 64, O = 128;  // x (R, I), W (O, I), out (R, O)
const uint64_t nx = R * I, nw = O * I, ng = R * O;

struct OneLinear {
  Program program;
  std::vector<uint64_t> forward, backward;
  int64_t forward_live = 0, forward_peak = 0;
};

void run_one(OneLinear& r, graph::Float8Kind kind) {
  graph::Runtime rt(r.program);
  rt.ctx.phase = Phase::forward;
  const int32_t w = rt.add_parameter(nw * 2, "w");
  int32_t leaf = -1;
  graph::Tensor x = rt.alloc_leaf(nx * 2, TensorKind::activation, graph::OpKind::other, &leaf);
  rt.begin_graph();
  const size_t f0 = r.program.events.size();
  graph::Tensor y =
      graph::float8_linear_rowwise(rt, x, rt.param(w), R, I, O, 2.0 * R * I * O, kind);
  const size_t f1 = r.program.events.size();
  r.forward = allocs_between(r.program, f0, f1);
  std::tie(r.forward_live, r.forward_peak) = live_and_peak(r.program, f0, f1);
  rt.ctx.phase = Phase::backward;
  const size_t b0 = r.program.events.size();
  rt.backward(y);
  r.backward = allocs_between(r.program, b0, r.program.events.size());
}

const char* const kLlama = memsim_test::kFloat8Llama;
std::string error_of(const std::vector<std::pair<std::string, std::string>>& overrides) {
  return memsim_test::float8_error_of(overrides);
}

}  // namespace

TEST_CASE("float8 rowwise linear: torchao's allocations, forward and backward",
          "[float8]") {
  OneLinear r;
  run_one(r, graph::Float8Kind::rowwise);
  std::vector<uint64_t> forward;
  cast(forward, nx, R);  // input along dim -1: scale (R, 1)
  cast(forward, nw, O);  // W.t() along dim 0: scale (1, O)
  for (uint64_t b : {4 * R, 4 * O, 2 * ng}) forward.push_back(b);  // 1/scales, output
  CHECK(r.forward == forward);
  // Nothing is kept but the output: the Function saves the bf16 x and W.t() (a view of
  // the parameter), and every cast is a local of its forward.
  CHECK(r.forward_live == static_cast<int64_t>(2 * ng));
  // Peak: the weight cast's fp32 product + clamp + fp8 data and its (1, O) scale, next to
  // the input's fp8 copy and (R, 1) scale.
  CHECK(r.forward_peak == static_cast<int64_t>(9 * nw + 4 * O + nx + 4 * R));
  CHECK(r.forward_peak == 78592);

  std::vector<uint64_t> backward = {2 * ng};  // the root grad (ones_like)
  cast(backward, ng, R);                      // grad_output along dim -1 (e4m3)
  cast(backward, nw, I);                      // W.t() along dim -1: scale (I, 1)
  backward.push_back(nw);                     // W8.t() copied column-major
  scaled_mm_post(backward, R, I);             // grad_input, post-scaled (R x I fp32)
  cast(backward, ng, O);                      // grad_output along dim 0
  cast(backward, nx, I);                      // the saved input along dim 0
  backward.push_back(ng);                     // g8.t() made contiguous
  backward.push_back(nx);                     // x8 copied column-major
  scaled_mm_post(backward, O, I);             // grad_weight, post-scaled (O x I fp32)
  std::vector<uint64_t> got = r.backward;
  REQUIRE(got.size() >= backward.size());
  got.resize(backward.size());
  CHECK(got == backward);
}

TEST_CASE("float8 rowwise_with_gw_hp linear: tensorwise weight for grad_input, bf16 grad_weight",
          "[float8]") {
  OneLinear r, rw;
  run_one(r, graph::Float8Kind::rowwise_with_gw_hp);
  run_one(rw, graph::Float8Kind::rowwise);
  CHECK(r.forward == rw.forward);  // the forward casts are the rowwise recipe's
  CHECK(r.forward_peak == rw.forward_peak);
  std::vector<uint64_t> backward = {2 * ng};
  cast(backward, ng, R);     // grad_output along dim -1
  cast(backward, nw, 1);     // the weight tensorwise: 0-d scale, still rounded to 2^k
  backward.push_back(nw);    // W8.t() copied column-major
  backward.push_back(4 * I);  // the 0-d scale repeated to (1, I) for the axiswise kernel
  scaled_mm_post(backward, R, I);
  backward.push_back(2 * nw);  // grad_weight = mm(g.t(), x) in bf16: no casts, no copies
  std::vector<uint64_t> got = r.backward;
  REQUIRE(got.size() >= backward.size());
  got.resize(backward.size());
  CHECK(got == backward);
}

TEST_CASE("float8 rowwise on a 2-layer bf16 Llama: nothing saved beyond nn.Linear's",
          "[float8]") {
  const Program base = build_program(load_scenario_text(kLlama, "f8.yaml", {}));
  const memsim_test::StepMeasure a = memsim_test::measure_step(base);
  for (const char* recipe : {"rowwise", "rowwise_with_gw_hp"}) {
    INFO(recipe);
    const Program f8 =
        build_program(load_scenario_text(kLlama, "f8.yaml", {{"precision.float8", recipe}}));
    const memsim_test::StepMeasure b = memsim_test::measure_step(f8);
    CHECK(b.before_forward == a.before_forward);
    CHECK(b.forward_end == a.forward_end);  // bf16 x and W.t() are what nn.Linear saves
    CHECK(b.after_backward == a.after_backward);
    // The casts' fp32 temporaries never lower the peak (here the loss's logits may set it).
    CHECK(b.peak >= a.peak);
  }
  // tensorwise (torchao @7ca1bfb) keeps the e4m3 weights on top.
  const memsim_test::StepMeasure t = memsim_test::measure_step(
      build_program(load_scenario_text(kLlama, "f8.yaml", {{"precision.float8", "tensorwise"}})));
  CHECK(t.forward_end > a.forward_end);
}

TEST_CASE("precision.float8 rowwise recipes: what is refused, by key", "[float8]") {
  CHECK(error_of({{"precision.float8", "rowwise"}}).empty());
  CHECK(error_of({{"precision.float8", "rowwise_with_gw_hp"}}).empty());
  CHECK(error_of({{"precision.float8", "rowwise"}, {"parallel.data", "4"}}).empty());  // DDP
  CHECK(error_of({{"precision.float8", "rowwise"}, {"checkpoint.policy", "full"}}).empty());
  CHECK(error_of({{"precision.float8", "rowwise"}, {"checkpoint.policy", "sac-layer:2"}}).empty());
  CHECK_THAT(error_of({{"precision.float8", "rowwise"}, {"checkpoint.policy", "sac-op"}}),
             Catch::Contains("checkpoint.policy") && Catch::Contains("rowwise") &&
                 Catch::Contains("sac-op"));
  CHECK_THAT(error_of({{"precision.float8", "rowwise"}, {"checkpoint.policy", "selective"}}),
             Catch::Contains("checkpoint.policy") && Catch::Contains("not checked"));
  CHECK_THAT(error_of({{"precision.float8", "rowwise"}, {"parallel.sharding", "fsdp2"}}),
             Catch::Contains("fsdp2") && Catch::Contains("tensorwise only"));
  CHECK_THAT(error_of({{"precision.float8", "rowwise_with_gw_hp"}, {"step.compile", "true"}}),
             Catch::Contains("step.compile"));
  CHECK_THAT(error_of({{"precision.float8", "rowwise"}, {"model.architecture", "qwen2"}}),
             Catch::Contains("model.architecture"));
  CHECK_THAT(error_of({{"precision.float8", "rowwise"}, {"precision.params", "fp32"}}),
             Catch::Contains("bf16"));
  CHECK_THAT(error_of({{"precision.float8", "rowwise_blockwise"}}),
             Catch::Contains("precision.float8"));
}

namespace {
// Allocations a checkpoint re-run makes under the float8 op's forward name.
size_t recomputed_float8_allocs(const Program& p) {
  size_t n = 0;
  for (const MemoryEvent& e : p.events)
    if (e.type == EventType::alloc && e.phase == Phase::backward && p.str(e.op) == "_scaled_mm")
      ++n;
  return n;
}
}  // namespace

TEST_CASE("float8 with full checkpointing: the re-run casts again, early stop at the last save",
          "[float8]") {
  const std::vector<std::pair<std::string, std::string>> full = {
      {"checkpoint.policy", "full"}, {"checkpoint.early_stop", "true"}};
  const memsim_test::StepMeasure a =
      memsim_test::measure_step(build_program(load_scenario_text(kLlama, "f8.yaml", full)));
  // Allocations of one Float8Linear forward: two casts of 14 (rowwise: power-of-2 scales)
  // or 11 (tensorwise), then two reciprocals and the output.
  struct Case {
    const char* recipe;
    size_t per_linear, before_save;
  };
  for (const Case& c : {Case{"rowwise", 31, 0}, Case{"rowwise_with_gw_hp", 31, 0},
                        Case{"tensorwise", 25, 11}}) {
    INFO(c.recipe);
    std::vector<std::pair<std::string, std::string>> sets = full;
    sets.push_back({"precision.float8", c.recipe});
    const Program p = build_program(load_scenario_text(kLlama, "f8.yaml", sets));
    const memsim_test::StepMeasure b = memsim_test::measure_step(p);
    // Only the layers' inputs are kept: the fp8 weights (tensorwise) are recomputed too.
    CHECK(b.forward_end == a.forward_end);
    CHECK(b.after_backward == a.after_backward);
    // Each layer's re-run: q, k, v, o, gate, up run whole; down_proj stops at its save
    // (tensorwise: after the weight cast, which @7ca1bfb does outside the Function).
    // Two steps (the warm-up and the measured one) of two layers.
    CHECK(recomputed_float8_allocs(p) == 2 * 2 * (6 * c.per_linear + c.before_save));
    // Without early stop the re-run goes to the end of the layer.
    std::vector<std::pair<std::string, std::string>> no_stop = sets;
    no_stop[1].second = "false";
    CHECK(recomputed_float8_allocs(build_program(load_scenario_text(kLlama, "f8.yaml", no_stop))) ==
          2 * 2 * 7 * c.per_linear);
  }
}

TEST_CASE("memsim run: Llama-3-8B with float8 rowwise under full checkpointing", "[float8][cli]") {
  auto peak = [](const std::string& sets) {
    const memsim_test::CommandResult r = memsim_test::run_shell(
        memsim_test::memsim_command() + "run '" + MEMSIM_SOURCE_DIR + "/scenarios/llama3-8b-torchtitan-seq8192-h200.yaml' " + sets + " --json - 2>/dev/null");
    REQUIRE(r.status == 0);
    return nlohmann::json::parse(r.out);
  };
  const nlohmann::json none = peak("");
  const nlohmann::json rowwise = peak("--set precision.float8=rowwise");
  const nlohmann::json gw_hp = peak("--set precision.float8=rowwise_with_gw_hp");
  // Nothing outlives an op: the allocated peak (the optimizer step's, under the scenario's
  // full checkpointing) is the bf16 run's plus the two 1 MiB cuBLASLt workspaces
  // (forward and autograd threads) that _scaled_mm takes and the bf16 mm does not.
  CHECK(rowwise["peak_allocated_bytes"].get<uint64_t>() ==
        none["peak_allocated_bytes"].get<uint64_t>() + 2 * (1u << 20));
  CHECK(gw_hp["peak_allocated_bytes"].get<uint64_t>() ==
        rowwise["peak_allocated_bytes"].get<uint64_t>());
  // The casts' fp32 temporaries are cached blocks: reserved grows.
  CHECK(rowwise["peak_reserved_bytes"].get<uint64_t>() >
        none["peak_reserved_bytes"].get<uint64_t>());
  // sac-op (the scenario's own torchtitan policy family) is refused by key.
  const memsim_test::CommandResult r = memsim_test::run_shell(
      memsim_test::memsim_command() + "run '" + MEMSIM_SOURCE_DIR + "/scenarios/llama3-8b-torchtitan-seq8192-h200.yaml' --set precision.float8=rowwise "
      "--set checkpoint.policy=sac-op 2>&1");
  CHECK(r.status == 1);
  CHECK_THAT(r.out, Catch::Contains("checkpoint.policy") && Catch::Contains("sac-op"));
}
