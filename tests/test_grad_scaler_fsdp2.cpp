// precision.grad_scaler over FSDP2 (sim/step/grad_scaler.h; docs/autocast.md "Over FSDP2"):
// the plain torch.amp.GradScaler over DTensor gradients, checked event by event against hand
// arithmetic from the cited source (torch 1.13, the CPU build here, has neither FSDP2, DTensor
// nor a CPU GradScaler): the single-GPU unscale_ events plus, inside
// _amp_foreach_non_finite_check_and_unscale_'s DTensor dispatch (found_inf_reduce_handler,
// torch/distributed/tensor/_dispatch.py @ 00223c21f5b5), the Partial("max") found_inf's
// full_tensor(): funcol.all_reduce's 4-B clone, dead at the handler's return; the fused
// path's _check_inf_per_device likewise; HSDP; clipping after unscale_; the scaled loss
// dying after FSDP2's post-backward; the refusals by key; the shipped scenario through the CLI.
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "cli_test_support.h"
#include "program/program.h"
#include "scenario/scenario.h"
#include "scenario_error_test_support.h"
#include "sim/step/schedule.h"
#include "step_events_support.h"

using namespace memsim;

namespace {

using Sets = std::vector<std::pair<std::string, std::string>>;
using memsim_test::allocations;
using memsim_test::head;
using memsim_test::step_events;

// 2-layer hf-llama, D 256, fp32 shards under fp16 autocast over FSDP2 (4 ranks), foreach
// AdamW (tests/test_clip_grad_fsdp2.cpp's model).
const std::string kFsdp2 =
    "model: { family: hf-llama, layers: 2, d_model: 256, heads: 4, kv_heads: 4, d_ff: 1000,\n"
    "         vocab: 1001, context_length: 64 }\n"
    "batch: { micro_batch: 2, seq_len: 64 }\n"
    "precision: { params: fp32, autocast: fp16 }\n"
    "optimizer: { type: adamw, impl: foreach }\n"
    "step: { kind: train, warmup_steps: 1 }\n"
    "parallel: { data: 4, sharding: fsdp2 }\n"
    "device: { capacity: 1TiB }\n";

Scenario scenario(bool scaler, Sets set = {}) {
  set.emplace_back("precision.grad_scaler", scaler ? "true" : "false");
  return load_scenario_text(kFsdp2, "fsdp2gs.yaml", set);
}

// unscale_ over DTensor grads (torch/amp/grad_scaler.py @ 0202916b unscale_ and
// _unscale_grads_; _dispatch.py @ 00223c21 found_inf_reduce_handler).
const std::vector<std::string> kUnscale = {
    "+8 _to_copy #0", "+8 reciprocal #1", "-#0",  // _scale.double().reciprocal(): the fp64 copy dies
    "+4 _to_copy #2", "-#1",                      // .float(): inv_scale; the reciprocal dies
    "+4 full #3",                                 // found_inf = torch.full((), 0.0)
    "+4 _to_copy #4",                             // per_device_found_inf.get(grad.device): the
                                                  // DTensor's device is its local tensor's
    "+4 _to_copy #5",                             // per_device_inv_scale.get(device)
    "+4 clone #6",  // the handler, after the local kernel: Partial("max").full_tensor() ->
                    // funcol.all_reduce clones the found_inf copy and reduces the clone
    "-#6",          // copy_ into the found_inf copy; the clone dies at the handler's return
    "-#5",          // _unscale_grads_ returns: the inv_scale copy
    "-#2", "-#3"};  // unscale_ returns: inv_scale, found_inf

}  // namespace

TEST_CASE("grad_scaler fsdp2: unscale_ over DTensor grads, the found_inf all-reduce's clone",
          "[grad_scaler][fsdp2]") {
  const Program on = build_program(scenario(true));
  const std::vector<std::string> opt = step_events(on, "backward_end", "optimizer_end");
  REQUIRE(opt.size() > kUnscale.size() + 1);
  CHECK(head(opt, kUnscale.size()) == kUnscale);
  CHECK(opt.back() == "-#4");  // update(): the found_inf copy, the step's last event
  // Per step the single-GPU 8 allocations and the clone (one dtype group: fp32 shards' grads);
  // the first step also _scale and _growth_tracker.
  const Program off = build_program(scenario(false));
  CHECK(allocations(on) == allocations(off) + 2 + 2 * 9);
  const std::vector<std::string> plain = step_events(off, "backward_end", "optimizer_end");
  CHECK(opt.size() == plain.size() + kUnscale.size() + 1);
}

TEST_CASE("grad_scaler fsdp2: a fused optimizer's _check_inf_per_device takes the clone too",
          "[grad_scaler][fsdp2]") {
  const Sets fused = {{"optimizer.impl", "fused"}};
  const Program on = build_program(scenario(true, fused));
  // dummy_inv_scale, found_inf; the copies; the handler's clone (dies at its return); the inv
  // copy at _unscale_grads_'s return; dummy_inv_scale, found_inf at _check_inf_per_device's;
  // sum(found_inf copies) (0 + copy), grad_scale = _scale * 1: plain 0-d tensors the DTensor
  // dispatch of _fused_adamw_ takes as Replicate kwargs (_try_replicate_spec_for_scalar_tensor,
  // never redistributed); then del grad_scale, the sum, and update()'s found_inf copy.
  const std::vector<std::string> expected = {
      "+4 full #0", "+4 full #1", "+4 _to_copy #2", "+4 _to_copy #3", "+4 clone #4", "-#4", "-#3",
      "-#0",        "-#1",        "+4 add #5",      "+4 mul #6"};
  const std::vector<std::string> ev = step_events(on, "backward_end", "optimizer_end");
  REQUIRE(ev.size() >= expected.size() + 3);
  CHECK(head(ev, expected.size()) == expected);
  CHECK(std::vector<std::string>(ev.end() - 3, ev.end()) == std::vector<std::string>{"-#6", "-#5", "-#2"});
  CHECK(allocations(on) == allocations(build_program(scenario(false, fused))) + 2 + 2 * 9);
}

TEST_CASE("grad_scaler fsdp2: HSDP, the policy alone, the scaled loss after FSDP2's post-backward",
          "[grad_scaler][fsdp2]") {
  // HSDP's (Replicate, Shard(0)) grads: found_inf (Replicate, Partial("max")), one all-reduce
  // over the shard dimension, the same clone.
  const Sets hsdp = {{"parallel.replicate", "2"}};
  CHECK(head(step_events(build_program(scenario(true, hsdp)), "backward_end", "optimizer_end"), kUnscale.size()) ==
        kUnscale);
  // MixedPrecisionPolicy(param_dtype=fp16, reduce_dtype=fp32) over the fp32 shards without
  // autocast: the sharded grads are fp32 DTensors all the same; transformers 5's loss upcasts
  // the logits (an fp32 loss).
  const Sets policy = {{"precision.autocast", "none"},
                       {"parallel.fsdp_mixed_precision", "fp16"},
                       {"parallel.reduce_dtype", "fp32"}};
  const Program mp = build_program(scenario(true, policy));
  CHECK(head(step_events(mp, "backward_end", "optimizer_end"), kUnscale.size()) == kUnscale);
  CHECK(allocations(mp) == allocations(build_program(scenario(false, policy))) + 2 + 2 * 9);
  // scale(loss): `loss * _scale` (+4 mul); the statement's temporary dies after FSDP2's
  // post-backward, the backward span's last event.
  const std::vector<std::string> bwd = step_events(build_program(scenario(true)), "forward_end", "backward_end");
  std::string scaled;
  for (const std::string& s : bwd)
    if (s.rfind("+4 mul #", 0) == 0) scaled = "-" + s.substr(s.find('#'));
  REQUIRE(!scaled.empty());
  CHECK(bwd.back() == scaled);
}

TEST_CASE("grad_scaler fsdp2: unscale_, then clip_grad_norm_ over the unscaled DTensor grads",
          "[grad_scaler][fsdp2][clip_grad]") {
  const Program on = build_program(scenario(true, {{"optimizer.max_grad_norm", "1.0"}}));
  const std::vector<std::string> ev = step_events(on, "backward_end", "optimizer_end");
  REQUIRE(ev.size() > kUnscale.size() + 3);
  CHECK(head(ev, kUnscale.size()) == kUnscale);
  // The clip follows (sim/step/clip_grad_dtensor.h): _foreach_norm's workspaces first.
  CHECK(ev[kUnscale.size()].find(" zeros #7") != std::string::npos);
  CHECK(ev.back() == "-#4");
  // Per step: the scaler's 9 and the clip's 21 grads + 12.
  CHECK(allocations(on) == allocations(build_program(scenario(false))) + 2 + 2 * 9 + 2 * (21 + 12));
}

TEST_CASE("grad_scaler fsdp2: refused by key where not modelled", "[grad_scaler][fsdp2]") {
  auto refusal = [](const Sets& set) {
    return memsim_test::refusal_of([&] { build_program(scenario(true, set)); });
  };
  CHECK(refusal({{"parallel.cpu_offload", "true"}}).find("fsdp2gs.yaml: parallel.cpu_offload: ") !=
        std::string::npos);
  // Accelerate >= 1.8's fp16 policy: output_dtype fp16 makes the loss fp16.
  CHECK(refusal({{"precision.autocast", "none"},
                 {"parallel.fsdp_mixed_precision", "fp16"},
                 {"parallel.reduce_dtype", "fp16"},
                 {"parallel.fsdp_output_dtype", "fp16"},
                 {"step.keep_output", "loss"}})
            .find("fsdp2gs.yaml: parallel.fsdp_output_dtype: ") != std::string::npos);
  // Accelerate 1.6 / 1.7's fp16 path (autocast over its fp16 policy), with or without the scaler.
  const Sets accel = {{"parallel.fsdp_mixed_precision", "fp16"},
                      {"parallel.reduce_dtype", "fp16"},
                      {"parallel.fsdp_output_dtype", "fp16"},
                      {"step.keep_output", "loss"}};
  CHECK(refusal(accel).find("fsdp2gs.yaml: precision.autocast: ") != std::string::npos);
  try {
    build_program(scenario(false, accel));
    FAIL("Accelerate's fp16 autocast path over FSDP2 was accepted");
  } catch (const ScenarioError& e) {
    CHECK(std::string(e.what()).find("fsdp2gs.yaml: precision.autocast: ") != std::string::npos);
  }
  // A 2-byte loss (cs336's cross entropy over fp16 logits under the fp16 policy): scale()'s
  // fp32 product and the grad's cast back are not modelled; refused when scale() sees it.
  CHECK(refusal({{"model.family", "cs336"},
                 {"precision.autocast", "none"},
                 {"parallel.fsdp_mixed_precision", "fp16"},
                 {"parallel.reduce_dtype", "fp32"}})
            .find("fsdp2gs.yaml: precision.grad_scaler: the loss is not fp32 (2-byte)") != std::string::npos);
  // torchao's float8 all-gather (bf16 compute: the policy) with the scaler: not checked.
  CHECK(refusal({{"precision.autocast", "none"},
                 {"precision.float8", "tensorwise"},
                 {"precision.float8_all_gather", "true"},
                 {"parallel.fsdp_mixed_precision", "bf16"},
                 {"model.d_ff", "1024"}})
            .find("fsdp2gs.yaml: precision.grad_scaler: torchao's float8 all-gather") != std::string::npos);
}

TEST_CASE("grad_scaler fsdp2: the shipped scenario through the CLI", "[grad_scaler][fsdp2][cli]") {
  const std::string file = MEMSIM_SOURCE_DIR + "/scenarios/llama3-8b-fsdp2-fp16-scaler-8xh100.yaml";
  const nlohmann::json on = memsim_test::run_json(file);
  const nlohmann::json off = memsim_test::run_json(file, "--set precision.grad_scaler=false");
  // Two steps of 9 allocations and the state's 2; at the peak (the loss, the measured step)
  // _scale and _growth_tracker: two 512-B blocks.
  CHECK(on["memory_stats"]["allocation.all.allocated"].get<uint64_t>() ==
        off["memory_stats"]["allocation.all.allocated"].get<uint64_t>() + 2 + 2 * 9);
  CHECK(on["peak_allocated_bytes"].get<uint64_t>() == off["peak_allocated_bytes"].get<uint64_t>() + 2 * 512);
  const memsim_test::CommandResult text =
      memsim_test::run_shell(memsim_test::memsim_command() + "run '" + file + "' 2>&1");
  CHECK(text.out.find("GradScaler") != std::string::npos);
  const memsim_test::CommandResult bad = memsim_test::run_shell(
      memsim_test::memsim_command() + "run '" + file + "' --set parallel.cpu_offload=true 2>&1");
  CHECK(bad.status == 1);
  CHECK(bad.out.find("llama3-8b-fsdp2-fp16-scaler-8xh100.yaml: parallel.cpu_offload:") != std::string::npos);
}
