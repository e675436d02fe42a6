// precision.grad_scaler (sim/step/grad_scaler.h; docs/autocast.md "GradScaler"): the 0-d
// tensors torch.amp.GradScaler allocates, checked by hand arithmetic against
// torch/amp/grad_scaler.py (torch 1.13's GradScaler is CUDA-only, so there is no CPU
// fixture): the events it adds to a step and their order, what it adds to the step's peak
// and marks (block-rounded: 512 B per tensor), its composition with checkpointing, gradient
// accumulation, DDP and FSDP1, the fused-optimizer path, the CLI, and the refusals by key.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "cli_test_support.h"
#include "program/program.h"
#include "real_run_test_support.h"
#include "sim/analysis/analysis.h"
#include "sim/step/execute.h"
#include "scenario/scenario.h"
#include "scenario_error_test_support.h"
#include "sim/step/schedule.h"
#include "step_events_support.h"

using namespace memsim;

namespace {

using Sets = std::vector<std::pair<std::string, std::string>>;
using memsim_test::allocations;
using memsim_test::step_events;

// fp32 weights under fp16 autocast, foreach AdamW, one warm-up step: the scaler's 4-8 B
// requests are sizes nothing else in this step has.
const std::string kLlama =
    "model: { family: hf-llama, layers: 2, d_model: 64, heads: 4, d_ff: 128, vocab: 1000 }\n"
    "batch: { micro_batch: 2, seq_len: 32 }\n"
    "precision: { params: fp32, autocast: fp16 }\n"
    "optimizer: { type: adamw, impl: foreach }\n"
    "step: { warmup_steps: 1 }\n";

Scenario scenario(bool scaler, Sets set = {}) {
  set.emplace_back("precision.grad_scaler", scaler ? "true" : "false");
  return load_scenario_text(kLlama, "gs.yaml", set);
}

// The allocation "+BYTES op #K" whose text starts with `head` ("+4 mul"), and its free "-#K".
std::pair<std::string, std::string> alloc_and_free(const std::vector<std::string>& ev, const std::string& head) {
  for (const std::string& s : ev)
    if (s.rfind(head + " #", 0) == 0) return {s, "-" + s.substr(s.find('#'))};
  return {"", ""};
}

// The allocations under 16 bytes (the scaler's and the loss's 0-d tensors) in the measured
// step from `from` to `to`, as step_events() writes them.
std::vector<std::string> small_allocs_between(const Program& p, const std::string& from, const std::string& to) {
  std::vector<std::string> out;
  for (const std::string& s : step_events(p, from, to))
    if (s[0] == '+' && std::stoull(s.substr(1)) < 16) out.push_back(s.substr(0, s.find(" #")));
  return out;
}

// Live allocated bytes (block-rounded, 512 B) at each of the measured step's marks.
struct Marks {
  uint64_t forward_end = 0, backward_end = 0, optimizer_end = 0;
};
Marks marks(const Scenario& s, const Program& p) {
  SimulatedDevice device(s.device.capacity, s.device.cuda_context);
  const Timeline t = execute(p, s.allocator, device, ExecuteOptions{});
  const Analysis a = analyze(p, t);
  Marks m;
  for (const auto& [name, point] : a.marks) {
    REQUIRE(point.has_value());
    if (name == "forward_end") m.forward_end = point->allocated;
    if (name == "backward_end") m.backward_end = point->allocated;
    if (name == "optimizer_end") m.optimizer_end = point->allocated;
  }
  return m;
}

}  // namespace

TEST_CASE("grad_scaler: the default is the unscaled step", "[grad_scaler]") {
  const Program none = build_program(load_scenario_text(kLlama, "gs.yaml"));
  const Program off = build_program(scenario(false));
  REQUIRE(none.events.size() == off.events.size());
  CHECK(allocations(none) == allocations(off));
}

TEST_CASE("grad_scaler: 2 state tensors once, 8 allocations per step", "[grad_scaler]") {
  const size_t off = allocations(build_program(scenario(false)));
  // warm-up + measured step: 2 steps x (scaled loss, MulBackward0's grad, 6 in unscale_).
  CHECK(allocations(build_program(scenario(true))) == off + 2 + 2 * 8);
  CHECK(allocations(build_program(scenario(true, {{"step.warmup_steps", "3"}}))) ==
        allocations(build_program(scenario(false, {{"step.warmup_steps", "3"}}))) + 2 + 4 * 8);
  // Gradient accumulation: scale and its grad per micro-batch, one unscale_ per step.
  CHECK(allocations(build_program(scenario(true, {{"batch.grad_accum", "2"}}))) ==
        allocations(build_program(scenario(false, {{"batch.grad_accum", "2"}}))) + 2 + 2 * (2 * 2 + 6));
}

TEST_CASE("grad_scaler: scale(loss) and its backward, in order", "[grad_scaler]") {
  const Program on = build_program(scenario(true));
  const Program off = build_program(scenario(false));
  // Backward without the scaler: the root ones_like(loss) (4 B, fp32 loss) lives through it.
  // With it: the scaled loss (mul) is made after the loss, before backward; the root is
  // ones_like(scaled); MulBackward0 makes the loss's grad (4 B), which dies once the loss's
  // node ran; the root, then the scaled loss, die when the statement ends.
  // The state tensors exist since the warm-up step: nothing of theirs here. Small
  // allocations: the unscaled step's, plus the scaled loss and MulBackward0's grad.
  std::vector<std::string> small_on = small_allocs_between(on, "forward_end", "backward_end");
  const std::vector<std::string> small_off = small_allocs_between(off, "forward_end", "backward_end");
  REQUIRE(small_on.size() == small_off.size() + 2);
  small_on.erase(std::find(small_on.begin(), small_on.end(), "+4 mul"));
  small_on.erase(std::find(small_on.begin(), small_on.end(), "+4 MulBackward0"));
  CHECK(small_on == small_off);
  const std::vector<std::string> ev = step_events(on, "forward_end", "backward_end");
  const auto [scaled, scaled_free] = alloc_and_free(ev, "+4 mul");
  const auto [root, root_free] = alloc_and_free(ev, "+4 ones_like");
  const auto [grad, grad_free] = alloc_and_free(ev, "+4 MulBackward0");
  auto at = [&](const std::string& s) { return std::find(ev.begin(), ev.end(), s) - ev.begin(); };
  REQUIRE(!scaled.empty());
  REQUIRE(!root.empty());
  REQUIRE(!grad.empty());
  // scale(loss) after the loss, the root, MulBackward0's grad right after it; that grad dies
  // inside backward; the root, then the scaled loss, are the step's last two events.
  CHECK(at(scaled) < at(root));
  CHECK(at(grad) == at(root) + 1);
  CHECK(at(grad_free) < at(root_free));
  REQUIRE(ev.size() >= 2);
  CHECK(ev[ev.size() - 2] == root_free);
  CHECK(ev.back() == scaled_free);
}

TEST_CASE("grad_scaler: unscale_ before the optimizer, the found_inf copy until update", "[grad_scaler]") {
  const Program on = build_program(scenario(true));
  const std::vector<std::string> opt = step_events(on, "backward_end", "optimizer_end");
  // _scale.double() (8), .reciprocal() (8), the fp64 copy dies, .float() (inv_scale, 4),
  // the reciprocal dies, found_inf = full (4), _unscale_grads_'s copies: found_inf, then
  // inv_scale (4 each, .to(copy=True)); then the inv_scale copy, inv_scale and found_inf die.
  const std::vector<std::string> unscale = {
      "+8 _to_copy #0", "+8 reciprocal #1", "-#0", "+4 _to_copy #2", "-#1", "+4 full #3",
      "+4 _to_copy #4",  // found_inf's copy
      "+4 _to_copy #5",  // inv_scale's copy
      "-#5", "-#2", "-#3"};
  REQUIRE(opt.size() > unscale.size() + 1);
  CHECK(std::vector<std::string>(opt.begin(), opt.begin() + unscale.size()) == unscale);
  // update(): the found_inf copy dies, the last event before optimizer_end.
  CHECK(opt.back() == "-#4");
  // Without the scaler the optimizer phase has no tensor under 16 B at all.
  CHECK(small_allocs_between(build_program(scenario(false)), "backward_end", "optimizer_end").empty());
}

TEST_CASE("grad_scaler: a fused optimizer gets grad_scale and found_inf, not unscaled grads", "[grad_scaler]") {
  const Program on = build_program(scenario(true, {{"optimizer.impl", "fused"}}));
  // _check_inf_per_device: dummy_inv_scale and found_inf (full), _unscale_grads_'s copies
  // (found_inf's, then the inv scale's), the inv copy dies at its return, then
  // dummy_inv_scale and found_inf; found_inf = 0 + copy (add), grad_scale = _scale * 1
  // (mul); fused AdamW's measured step allocates nothing; del optimizer.grad_scale, the
  // summed found_inf at step()'s return, the found_inf copy in update().
  const std::vector<std::string> expected = {
      "+4 full #0", "+4 full #1", "+4 _to_copy #2", "+4 _to_copy #3", "-#3", "-#0", "-#1",
      "+4 add #4",  "+4 mul #5",  "-#5",            "-#4",            "-#2"};
  CHECK(step_events(on, "backward_end", "optimizer_end") == expected);
  CHECK(allocations(on) == allocations(build_program(scenario(false, {{"optimizer.impl", "fused"}}))) + 2 + 2 * 8);
}

TEST_CASE("grad_scaler: the step's peak and marks, block-rounded", "[grad_scaler]") {
  for (const char* policy : {"none", "full"}) {
    INFO(policy);
    const Scenario son = scenario(true, {{"checkpoint.policy", policy}});
    const Scenario soff = scenario(false, {{"checkpoint.policy", policy}});
    const Program pon = build_program(son), poff = build_program(soff);
    const memsim_test::SimulatedPeaks on = memsim_test::simulate_peaks(son, pon);
    const memsim_test::SimulatedPeaks off = memsim_test::simulate_peaks(soff, poff);
    // Measured step: _scale and _growth_tracker (2 x 512 B) are live throughout; at the
    // backward peak also the scaled loss (the scaled root replaces the loss's root), at the
    // optimizer's the found_inf copy: 3 blocks either way.
    CHECK(on.allocated == off.allocated + 3 * 512);
    const Marks mon = marks(son, pon), moff = marks(soff, poff);
    CHECK(mon.forward_end == moff.forward_end + 2 * 512);
    CHECK(mon.backward_end == moff.backward_end + 2 * 512);  // the scaled loss is gone
    CHECK(mon.optimizer_end == moff.optimizer_end + 2 * 512);  // so is the found_inf copy
  }
}

TEST_CASE("grad_scaler: composes with torch DDP, FSDP1 and every autocast dtype", "[grad_scaler]") {
  const Sets ddp = {{"parallel.data", "2"}};
  CHECK(allocations(build_program(scenario(true, ddp))) == allocations(build_program(scenario(false, ddp))) + 18);
  // FSDP1 (ShardedGradScaler): the same tensors; the scaled loss dies when the backward
  // statement ends, after FSDP's final callback has resharded and reduced the root.
  const Sets fsdp = {{"parallel.data", "2"}, {"parallel.sharding", "fsdp"}};
  const Program on = build_program(scenario(true, fsdp));
  CHECK(allocations(on) == allocations(build_program(scenario(false, fsdp))) + 18);
  const std::vector<std::string> ev = step_events(on, "forward_end", "backward_end");
  REQUIRE(!ev.empty());
  CHECK(ev.back() == alloc_and_free(ev, "+4 mul").second);
  const Sets bf16 = {{"precision.autocast", "bf16"}};
  CHECK(allocations(build_program(scenario(true, bf16))) == allocations(build_program(scenario(false, bf16))) + 18);
  const Sets fp32 = {{"precision.autocast", "none"}};
  CHECK(allocations(build_program(scenario(true, fp32))) == allocations(build_program(scenario(false, fp32))) + 18);
}

TEST_CASE("grad_scaler: refused by key where not modelled", "[grad_scaler]") {
  auto refusal = [](const Sets& set) {
    return memsim_test::refusal_of([&] { build_program(scenario(true, set)); });
  };
  for (const Sets& set : std::vector<Sets>{
           {{"precision.params", "fp16"}, {"precision.autocast", "none"}},
           {{"precision.params", "bf16"}, {"precision.autocast", "none"}},
           {{"parallel.data", "2"}, {"parallel.zero", "1"}},
           {{"precision.autocast_region", "forward"}},
           {{"step.kind", "forward-backward"}},
       }) {
    INFO(set.front().first << ": " << set.front().second);
    const std::string why = refusal(set);
    CHECK(why.find("gs.yaml") != std::string::npos);
    CHECK(why.find("precision.grad_scaler") != std::string::npos);
  }
  // FSDP2 is modelled (tests/test_grad_scaler_fsdp2.cpp has its events and refusals).
  // FSDP1 with CPU-offloaded or MixedPrecision shards: refused naming the FSDP key.
  const std::string offload =
      refusal({{"parallel.data", "2"}, {"parallel.sharding", "fsdp"}, {"parallel.cpu_offload", "true"}});
  CHECK(offload.find("gs.yaml: parallel.cpu_offload:") != std::string::npos);
  const std::string mixed = refusal({{"parallel.data", "2"},
                                     {"parallel.sharding", "fsdp"},
                                     {"precision.autocast", "none"},
                                     {"parallel.fsdp_mixed_precision", "fp16"}});
  CHECK(mixed.find("gs.yaml: parallel.fsdp_mixed_precision:") != std::string::npos);
  const std::string bad = memsim_test::scenario_error(kLlama, "gs.yaml", {{"precision.grad_scaler", "maybe"}});
  CHECK(bad.find("precision.grad_scaler") != std::string::npos);
}

TEST_CASE("grad_scaler: end to end through the CLI (the GPU run's scenario)", "[grad_scaler][cli]") {
  using memsim_test::memsim_command;
  using memsim_test::run_shell;
  const std::string file = MEMSIM_SOURCE_DIR + "/tests/data/gpu/gscaler/gs_llama_l4_d1024_s1024_b4_fp16_scaler.yaml";
  const nlohmann::json on = memsim_test::run_json(file);
  const nlohmann::json off = memsim_test::run_json(file, "--set precision.grad_scaler=false");
  CHECK(on["peak_allocated_bytes"].get<uint64_t>() == off["peak_allocated_bytes"].get<uint64_t>() + 3 * 512);
  const memsim_test::CommandResult text = run_shell(memsim_command() + "run '" + file + "' 2>&1");
  CHECK(text.status == 0);
  CHECK(text.out.find("autocast fp16, GradScaler") != std::string::npos);
  // A bad value and a refused combination (ZeRO-1): exit 1, the key named.
  const memsim_test::CommandResult bad =
      run_shell(memsim_command() + "run '" + file + "' --set precision.grad_scaler=maybe 2>&1");
  CHECK(bad.status == 1);
  CHECK(bad.out.find("precision.grad_scaler") != std::string::npos);
  const memsim_test::CommandResult refused = run_shell(
      memsim_command() + "run '" + file + "' --set parallel.data=2 --set parallel.zero=1 2>&1");
  CHECK(refused.status == 1);
  CHECK(refused.out.find("gs_llama_l4_d1024_s1024_b4_fp16_scaler.yaml: precision.grad_scaler: GradScaler "
                         "with ZeroRedundancyOptimizer") != std::string::npos);
}
