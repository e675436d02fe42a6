// Accelerate's FSDP2 bf16 path (HF Trainer bf16=True with fsdp_version 2): precision.autocast
// + parallel.fsdp_mixed_precision bf16 + parallel.reduce_dtype bf16 under FSDP2
// (sim/parallel/accelerate_amp.h; docs/fsdp2.md "Accelerate's FSDP2 bf16 path").
//
// What is proven here: autocast over bf16 unsharded parameters adds nothing to the model's
// program (every event of MixedPrecisionPolicy alone is there, in the same order), and the
// root's boundary adds exactly Accelerate's convert_outputs_to_fp32 copy and FSDP2's
// output_dtype casts, in the order _fsdp_state.py's _post_forward runs them, with the
// byte counts worked out by hand on docs/fsdp2.md's 2-layer model.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_test_support.h"
#include "fsdp2_accelerate_test_support.h"
#include "program/tensor_names.h"
#include "sim/step/schedule.h"
#include "step_measure_test_support.h"

using namespace memsim;

namespace {

using memsim_test::accelerate::worked_text;
Scenario worked(const std::string& precision, const std::string& parallel,
                const std::string& model_extra = "", const std::string& extra = "") {
  return load_scenario_text(worked_text(precision, parallel, model_extra, extra), "accelerate.yaml");
}

const std::string kAutocast = "  autocast: bf16\n";
using memsim_test::accelerate::kPolicy;
// Accelerate's whole policy: MixedPrecisionPolicy(param_dtype, reduce_dtype, output_dtype bf16).
const std::string kAccPolicy = kPolicy + "  fsdp_output_dtype: bf16\n";
const std::string kV5 = "  transformers: 5\n";

bool is_boundary(const std::string& name) {
  return name.find("convert_outputs_to_fp32") != std::string::npos ||
         name.find("cast_forward_outputs") != std::string::npos;
}

using memsim_test::accelerate::Ev;
using memsim_test::accelerate::measured;

}  // namespace

TEST_CASE("Accelerate FSDP2 bf16: autocast over bf16 parameters adds only the root's output casts",
          "[fsdp2][autocast][accelerate]") {
  const uint64_t N = 2 * 64, V = 1001;
  const uint64_t fp32_logits = N * V * 4;  // 512,512 B: convert_outputs_to_fp32's copy
  const uint64_t bf16_logits = N * V * 2;  // 256,256 B: the model's logits, and output_dtype's copy
  CHECK(fp32_logits == 512512);
  const Program acc = build_program(worked(kAutocast, kAccPolicy, kV5));
  const Program mp = build_program(worked("", kPolicy, kV5));  // MixedPrecisionPolicy alone
  const std::vector<Ev> a = measured(acc), b = measured(mp);

  // 1. Take the boundary's tensors out, and compare the 0-d loss tensors by event only (the
  //    loss in bf16 makes the backward's ones_like 2 bytes instead of 4; one more 4-byte
  //    fp32 gradient, ToCopyBackward0's): every other event is MixedPrecisionPolicy's.
  //    The model's bf16 logits are compared apart: they die earlier (at the convert, before
  //    the root's post-forward instead of when Trainer drops the outputs after it).
  auto strip = [](const std::vector<Ev>& v) {
    std::vector<std::pair<EventType, uint64_t>> r;
    for (const Ev& e : v)
      if (!is_boundary(e.name) && e.bytes > 4 && e.name != "logits") r.emplace_back(e.type, e.bytes);
    return r;
  };
  CHECK(strip(a) == strip(b));
  auto logits_events = [](const std::vector<Ev>& v) {
    int n = 0;
    for (const Ev& e : v) n += e.name == "logits" && e.bytes == 2 * 64 * 1001 * 2;
    return n;
  };
  CHECK(logits_events(a) == 2);
  CHECK(logits_events(b) == 2);
  int small_a = 0, small_b = 0;
  for (const Ev& e : a) small_a += e.bytes <= 4 && !is_boundary(e.name);
  for (const Ev& e : b) small_b += e.bytes <= 4;
  CHECK(small_a == small_b + 2);  // ToCopyBackward0's fp32 loss gradient: alloc and free

  // 2. The boundary, in _post_forward's order.
  size_t i = 0;
  while (i < a.size() && a[i].name.find("convert_outputs_to_fp32") == std::string::npos) ++i;
  REQUIRE(i + 8 < a.size());
  CHECK(a[i].type == EventType::alloc);
  CHECK(a[i].bytes == fp32_logits);         // logits.float() of the returned bf16 logits
  CHECK(a[i + 1].type == EventType::free);  // the bf16 original dies with its ModelOutput
  CHECK(a[i + 1].bytes == bf16_logits);
  CHECK(a[i + 1].name == "logits");
  CHECK(a[i + 2].type == EventType::free);  // root post-forward: the last all-gather result
  CHECK(a[i + 2].name == "FSDP2 all-gather output (flat) of block 1");
  CHECK(a[i + 3].type == EventType::alloc);  // output_dtype: the loss first (field order)
  CHECK(a[i + 3].bytes == 2);
  CHECK(a[i + 3].name == "loss in output_dtype (FSDP2 cast_forward_outputs)");
  CHECK(a[i + 4].type == EventType::alloc);  // then the logits, from the fp32 copy
  CHECK(a[i + 4].bytes == bf16_logits);
  CHECK(a[i + 5].type == EventType::free);   // the fp32 loss and fp32 logits die together
  CHECK(a[i + 5].bytes == 4);
  CHECK(a[i + 6].type == EventType::free);
  CHECK(a[i + 6].bytes == fp32_logits);
  CHECK(a[i + 7].type == EventType::free);   // Trainer keeps the loss only
  CHECK(a[i + 7].bytes == bf16_logits);
  // 3. Backward starts at the bf16 loss: ones_like (2 B), ToCopyBackward0's fp32 gradient
  //    (4 B), then the root's pre-backward (a hook on the fp32 loss) prefetches block 1.
  CHECK(a[i + 8].name == "ones_like temporary");
  CHECK(a[i + 8].bytes == 2);
  CHECK(a[i + 9].bytes == 4);
  CHECK(a[i + 9].phase == Phase::backward);
  CHECK(a[i + 10].name.rfind("FSDP2 all-gather input", 0) == 0);
  // The live bytes at the boundary, by hand: the step's high point there is the fp32 copy
  // with the bf16 logits (before the original dies) or with the bf16 copy (before it dies),
  // both 768,768 B above what the loss left.
  CHECK(fp32_logits + bf16_logits == 768768);
}

TEST_CASE("Accelerate FSDP2 bf16: transformers v4.45's fp32 logits need no convert copy",
          "[fsdp2][autocast][accelerate]") {
  // Llama v4.45 upcasts the logits inside its forward (logits.float()): the model returns
  // fp32 logits, convert_outputs_to_fp32 leaves them, output_dtype casts them to bf16.
  const Program acc = build_program(worked(kAutocast, kAccPolicy));
  const std::vector<Ev> a = measured(acc);
  int converts = 0, casts = 0;
  uint64_t cast_bytes = 0;
  for (const Ev& e : a) {
    if (e.type != EventType::alloc) continue;
    if (e.name.find("convert_outputs_to_fp32") != std::string::npos) ++converts;
    if (e.name.find("cast_forward_outputs") != std::string::npos) {
      ++casts;
      cast_bytes += e.bytes;
    }
  }
  CHECK(converts == 0);
  CHECK(casts == 2);
  CHECK(cast_bytes == 2 + 2 * 64 * 1001 * 2);
}

TEST_CASE("Accelerate FSDP2 bf16: other combinations are refused by key",
          "[fsdp2][autocast][accelerate][scenario]") {
  auto refused = [](const Scenario& s, const char* key) {
    INFO(key);
    CHECK_THROWS_WITH(build_program(s), Catch::Contains(std::string("accelerate.yaml: ") + key));
  };
  CHECK_NOTHROW(build_program(worked(kAutocast, kAccPolicy, kV5)));
  refused(worked(kAutocast, "  fsdp_mixed_precision: bf16\n", kV5), "parallel.reduce_dtype");
  refused(worked(kAutocast, "  fsdp_mixed_precision: bf16\n  reduce_dtype: fp32\n", kV5),
          "parallel.reduce_dtype");
  refused(worked(kAutocast, "  fsdp_mixed_precision: fp16\n  reduce_dtype: fp16\n", kV5),
          "parallel.fsdp_mixed_precision");
  refused(worked(kAutocast + "  autocast_region: forward\n", kAccPolicy, kV5), "precision.autocast_region");
  refused(worked(kAutocast + "  autocast_cache: false\n", kAccPolicy, kV5), "precision.autocast_cache");
  refused(worked(kAutocast, kAccPolicy + "  cpu_offload: true\n", kV5), "parallel.cpu_offload");
  // (Most other rows are refused under autocast by their knobs already: model.norm, ...)
  refused(worked(kAutocast, kAccPolicy, "  architecture: granite\n"), "model.architecture");
  // A loop that computes the loss after the model returns (not HF Trainer's).
  Scenario loop = worked(kAutocast, kAccPolicy, kV5);
  loop.step.output_dies_after_loss = false;
  refused(loop, "step.keep_output");
  Scenario gpt2 = worked(kAutocast, kAccPolicy);
  gpt2.model.family = ModelFamily::hf_gpt2;
  refused(gpt2, "model.family");
}

TEST_CASE("memsim run: Qwen2.5-7B through HF Trainer + Accelerate FSDP2 bf16 on 8 H100",
          "[fsdp2][autocast][accelerate][cli][scenarios]") {
  const std::string file = MEMSIM_SOURCE_DIR + "/scenarios/qwen2.5-7b-hf-trainer-fsdp2-bf16-8xh100.yaml";
  auto run = [&](const std::string& set) { return memsim_test::run_json(file, set); };
  const nlohmann::json acc = run("");
  CHECK(acc["fits"] == true);
  // The boundary's copies (1,245,708,288 B fp32 and 622,854,144 B bf16 logits, 2048 x
  // 152064 tokens x vocab) die before backward: the peak is MixedPrecisionPolicy's (the
  // policy alone is Accelerate >= 1.8's: 1.7 without autocast is refused by key).
  const nlohmann::json mp = run("--set precision.autocast=none --set parallel.accelerate_version=1.8");
  CHECK(acc["peak_allocated_bytes"] == mp["peak_allocated_bytes"]);
  CHECK(acc["peak_reserved_bytes"] == mp["peak_reserved_bytes"]);
  const Program p = build_program(load_scenario(file));
  const TensorNames names(p);
  uint64_t fp32_copy = 0;
  for (const MemoryEvent& e : p.events)
    if (e.type == EventType::alloc && names.name(e.tensor).find("convert_outputs_to_fp32") != std::string::npos)
      fp32_copy = e.bytes;
  CHECK(fp32_copy == 2048ull * 152064ull * 4ull);
  // Without Accelerate's reduce_dtype the combination is refused by key (exit 1).
  const memsim_test::CommandResult refused = memsim_test::run_shell(
      memsim_test::memsim_command() + "run '" + file + "' --set parallel.reduce_dtype=fp32 2>&1");
  CHECK(refused.status == 1);
  CHECK(refused.out.find("parallel.reduce_dtype") != std::string::npos);
}

TEST_CASE("Accelerate FSDP2 bf16: the boundary's lifetimes equal a torch 1.13 CPU stand-in's",
          "[fsdp2][autocast][accelerate]") {
  // tools/fixtures/gen_accelerate_fsdp2_fixtures.py: a bf16 root module computing its loss
  // (transformers 5.x style), its forward wrapped as accelerate's prepare_model does and a
  // forward hook casting the outputs as FSDP2's root post-forward does; live requested bytes
  // (parameters excluded) at each step. Same token and vocab sizes as the worked example,
  // so the boundary's deltas must be memsim's byte for byte.
  const nlohmann::json fx = memsim_test::load_torch_cpu_fixture("accelerate_fsdp2_boundary.json");
  CHECK(fx["autocast_adds_no_op"] == true);  // autocast over bf16 parameters: no extra op
  CHECK(fx["ops_without_autocast"].get<int>() > 40);
  nlohmann::json acc, plain;
  for (const nlohmann::json& r : fx["rows"]) (r["accelerate"] == true ? acc : plain) = r;
  REQUIRE(acc.is_object());
  REQUIRE(plain.is_object());
  CHECK(acc["loss_dtype"] == "torch.bfloat16");
  CHECK(plain["loss_dtype"] == "torch.float32");
  const nlohmann::json& pt = acc["points"];
  auto d = [&](const char* to, const char* from) {
    return pt[to].get<int64_t>() - pt[from].get<int64_t>();
  };
  REQUIRE(fx["config"]["batch"] == 2);
  REQUIRE(fx["config"]["seq"] == 64);
  REQUIRE(fx["config"]["vocab"] == 1001);
  // memsim's worked example, live non-parameter requested bytes along the measured step.
  const Program p = build_program(worked(kAutocast, kAccPolicy, kV5));
  const memsim_test::accelerate::Live l = memsim_test::accelerate::live_activations(p);
  const std::vector<int64_t>& live = l.bytes;
  const std::vector<std::string>& what = l.what;
  size_t i = 0;
  while (i < what.size() && what[i].find("convert_outputs_to_fp32") == std::string::npos) ++i;
  REQUIRE(i >= 1);
  REQUIRE(i + 6 < what.size());
  const int64_t after_loss = live[i - 1];
  CHECK(live[i + 1] - after_loss == d("hook_entry", "after_loss"));  // fp32 copy in, bf16 original out
  CHECK(live[i + 3] - live[i + 1] == d("hook_exit", "hook_entry"));  // the bf16 loss and logits copies
  CHECK(live[i + 5] - after_loss == d("after_call", "after_loss"));  // the fp32 loss and logits gone
  CHECK(live[i + 6] - live[i + 5] == d("outputs_dropped", "after_call"));  // Trainer keeps the loss
  CHECK(d("after_call", "after_loss") == -2);  // a bf16 loss (2 B) instead of the fp32 one (4 B)
  // And against MixedPrecisionPolicy alone: after backward the only difference is that loss.
  CHECK(pt["after_backward"].get<int64_t>() - plain["points"]["after_backward"].get<int64_t>() == -2);
}
