// parallel.fsdp_output_dtype: MixedPrecisionPolicy.output_dtype, the cast of the root's
// outputs in FSDP2's post-forward; with the policy alone it is what Accelerate >= 1.8 runs
// for HF Trainer's bf16=True under FSDP2 (sim/parallel/accelerate_amp.h cast_outputs;
// docs/fsdp2.md "Accelerate's FSDP2 bf16 path").
//
// What is proven here: against the same policy without output_dtype, the key adds exactly
// the root's casts (a bf16 copy of the fp32 loss, and with transformers 4.x's fp32 logits a
// bf16 copy of them), in _post_forward's order, with the byte counts worked out by hand on
// docs/fsdp2.md's 2-layer model, and the live bytes at the boundary move as in a torch 1.13
// CPU stand-in; settings it is not modelled for are refused by key.
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

// docs/fsdp2.md's worked example in Trainer's loop (fsdp2_accelerate_test_support.h), the
// parallel lines first.
std::string worked_text(const std::string& parallel, const std::string& model_extra = "",
                        const std::string& precision = "") {
  return memsim_test::accelerate::worked_text(precision, parallel, model_extra);
}
Scenario worked(const std::string& parallel, const std::string& model_extra = "",
                const std::string& precision = "") {
  return load_scenario_text(worked_text(parallel, model_extra, precision), "outdtype.yaml");
}

// Accelerate >= 1.8's policy for mixed_precision: bf16 (kOut), and the same without output_dtype.
using memsim_test::accelerate::kPolicy;
const std::string kOut = kPolicy + "  fsdp_output_dtype: bf16\n";
const std::string kV4 = "  transformers: 4\n";
const std::string kV5 = "  transformers: 5\n";

bool is_cast(const std::string& name) { return name.find("cast_forward_outputs") != std::string::npos; }

using memsim_test::accelerate::Ev;
using memsim_test::accelerate::measured;
size_t first_cast(const std::vector<Ev>& v) {
  size_t i = 0;
  while (i < v.size() && !is_cast(v[i].name)) ++i;
  return i;
}

// Live requested bytes of the measured step, parameters and FSDP2's own buffers left out
// (what the torch stand-in's tracker sees), after each event.
using memsim_test::accelerate::Live;
Live live_activations(const Program& p) { return memsim_test::accelerate::live_activations(p, true); }

}  // namespace

TEST_CASE("FSDP2 output_dtype, transformers 5.x: the root's only cast is a 2-byte bf16 loss",
          "[fsdp2][accelerate][output_dtype]") {
  const std::vector<Ev> a = measured(build_program(worked(kOut, kV5)));
  const std::vector<Ev> b = measured(build_program(worked(kPolicy, kV5)));
  // Every event above 4 bytes is the policy's without output_dtype, in the same order.
  auto big = [](const std::vector<Ev>& v) {
    std::vector<std::pair<EventType, uint64_t>> r;
    for (const Ev& e : v)
      if (e.bytes > 4) r.emplace_back(e.type, e.bytes);
    return r;
  };
  CHECK(big(a) == big(b));
  CHECK(a.size() == b.size() + 4);  // the bf16 loss (alloc, free), ToCopyBackward0's gradient
  // The boundary, by hand: block 1's flat all-gather output freed (the root's post-forward),
  // then the bf16 loss (2 B), the fp32 loss dies with the replaced output, and Trainer drops
  // the outputs: the bf16 logits (128 x 1001 x 2 = 256,256 B, the LM head's, never cast).
  const size_t i = first_cast(a);
  REQUIRE(i >= 1);
  REQUIRE(i + 5 < a.size());
  CHECK(a[i - 1].type == EventType::free);
  CHECK(a[i - 1].name == "FSDP2 all-gather output (flat) of block 1");
  CHECK(a[i].type == EventType::alloc);
  CHECK(a[i].bytes == 2);
  CHECK(a[i].name == "loss in output_dtype (FSDP2 cast_forward_outputs)");
  CHECK(a[i + 1].type == EventType::free);
  CHECK(a[i + 1].bytes == 4);  // the fp32 loss
  CHECK(a[i + 2].type == EventType::free);
  CHECK(a[i + 2].bytes == 2 * 64 * 1001 * 2);
  CHECK(a[i + 2].name == "logits");
  // Backward starts at the bf16 loss: ones_like (2 B), ToCopyBackward0's fp32 gradient
  // (4 B), then the root's pre-backward (a hook on the fp32 loss) all-gathers block 1.
  CHECK(a[i + 3].name == "ones_like temporary");
  CHECK(a[i + 3].bytes == 2);
  CHECK(a[i + 4].bytes == 4);
  CHECK(a[i + 5].name.rfind("FSDP2 all-gather input", 0) == 0);
  int casts = 0;
  for (const Ev& e : a) casts += e.type == EventType::alloc && is_cast(e.name);
  CHECK(casts == 1);
}

TEST_CASE("FSDP2 output_dtype, transformers 4.x: a bf16 copy of the fp32 logits",
          "[fsdp2][accelerate][output_dtype]") {
  const uint64_t fp32_logits = 2 * 64 * 1001 * 4, bf16_logits = 2 * 64 * 1001 * 2;
  CHECK(fp32_logits == 512512);
  const std::vector<Ev> a = measured(build_program(worked(kOut, kV4)));
  const std::vector<Ev> b = measured(build_program(worked(kPolicy, kV4)));
  // v4.45's forward upcasts the logits (logits.float()): the model returns fp32 logits.
  // The root's post-forward casts the loss, then the logits (field order); both fp32
  // originals die with the replaced output; Trainer then drops the bf16 logits copy.
  const size_t i = first_cast(a);
  REQUIRE(i >= 1);
  REQUIRE(i + 5 < a.size());
  CHECK(a[i - 1].name == "FSDP2 all-gather output (flat) of block 1");
  CHECK(a[i].type == EventType::alloc);
  CHECK(a[i].bytes == 2);
  CHECK(a[i + 1].type == EventType::alloc);
  CHECK(a[i + 1].bytes == bf16_logits);
  CHECK(a[i + 1].name == "logits in output_dtype (FSDP2 cast_forward_outputs)");
  CHECK(a[i + 2].type == EventType::free);
  CHECK(a[i + 2].bytes == 4);
  CHECK(a[i + 3].type == EventType::free);
  CHECK(a[i + 3].bytes == fp32_logits);
  CHECK(a[i + 4].type == EventType::free);
  CHECK(a[i + 4].bytes == bf16_logits);
  CHECK(a[i + 5].name == "ones_like temporary");
  // Without output_dtype the fp32 logits live until Trainer drops the outputs: the same
  // events otherwise (the policy's run has one 512,512 B free where this one has the
  // bf16 copy's alloc and free and the fp32 free moved up).
  const size_t j = [&] {
    size_t k = 0;
    while (k < b.size() && !(b[k].name == "FSDP2 all-gather output (flat) of block 1" &&
                             b[k].type == EventType::free && k + 1 < b.size() &&
                             b[k + 1].bytes == fp32_logits))
      ++k;
    return k;
  }();
  REQUIRE(j + 1 < b.size());
  CHECK(b[j + 1].type == EventType::free);  // the outputs dropped: the fp32 logits
  // The boundary's high point above what the loss left: the fp32 logits and their bf16 copy
  // together, 512,512 + 256,256 + 2 B, for an instant (the loss's own peak, log-softmax's
  // fp32 output with the logits, is higher: the step's peak does not move).
  CHECK(fp32_logits + bf16_logits == 768768);
}

TEST_CASE("FSDP2 output_dtype: the boundary's lifetimes equal a torch 1.13 CPU stand-in's",
          "[fsdp2][accelerate][output_dtype]") {
  // tools/fixtures/gen_fsdp2_output_dtype_fixtures.py: a bf16 root computing its loss in
  // forward, a forward hook casting its outputs as FSDP2's root post-forward does, no
  // accelerate wrapper; transformers 4.x (fp32 logits returned) and 5.x rows, with and
  // without the hook. Same tokens and vocabulary as the worked example.
  const nlohmann::json fx = memsim_test::load_torch_cpu_fixture("fsdp2_output_dtype_boundary.json");
  REQUIRE(fx["config"]["batch"] == 2);
  REQUIRE(fx["config"]["seq"] == 64);
  REQUIRE(fx["config"]["vocab"] == 1001);
  REQUIRE(fx["rows"].size() == 4);
  for (const int v : {4, 5}) {
    INFO("transformers " << v);
    nlohmann::json cast, plain;
    for (const nlohmann::json& r : fx["rows"])
      if (r["transformers"] == v) (r["output_dtype"] == "bf16" ? cast : plain) = r;
    REQUIRE(cast.is_object());
    REQUIRE(plain.is_object());
    CHECK(cast["loss_dtype"] == "torch.bfloat16");
    CHECK(cast["logits_dtype"] == "torch.bfloat16");
    CHECK(plain["logits_dtype"] == (v == 4 ? "torch.float32" : "torch.bfloat16"));
    const nlohmann::json& pt = cast["points"];
    auto d = [&](const nlohmann::json& p, const char* to, const char* from) {
      return p[to].get<int64_t>() - p[from].get<int64_t>();
    };
    const Live l = live_activations(build_program(worked(kOut, v == 4 ? kV4 : kV5)));
    size_t i = 0;
    while (i < l.what.size() && !is_cast(l.what[i])) ++i;
    REQUIRE(i >= 1);
    const size_t casts = v == 4 ? 2 : 1;  // loss, then (4.x) logits
    REQUIRE(i + 2 * casts + 1 < l.what.size());
    const int64_t after_loss = l.bytes[i - 1];
    CHECK(l.bytes[i + casts - 1] - after_loss == d(pt, "hook_exit", "hook_entry"));
    CHECK(l.bytes[i + 2 * casts - 1] - after_loss == d(pt, "after_call", "after_loss"));
    CHECK(l.bytes[i + 2 * casts] - l.bytes[i + 2 * casts - 1] == d(pt, "outputs_dropped", "after_call"));
    CHECK(d(pt, "hook_entry", "after_loss") == 0);  // nothing between the loss and the hook
    // After backward the only difference from the policy alone is the bf16 loss (2 B
    // instead of 4).
    CHECK(pt["after_backward"].get<int64_t>() - plain["points"]["after_backward"].get<int64_t>() == -2);
  }
}

TEST_CASE("FSDP2 output_dtype: fp32 over fp32 layers copies nothing", "[fsdp2][output_dtype]") {
  // fp32 parameters, no policy: the loss and logits are fp32 already, _cast_fp_tensor
  // returns them as they are.
  const std::vector<Ev> a = measured(build_program(worked("  fsdp_output_dtype: fp32\n", kV4)));
  const std::vector<Ev> b = measured(build_program(worked("", kV4)));
  REQUIRE(a.size() == b.size());
  for (size_t k = 0; k < a.size(); ++k) {
    CHECK(a[k].type == b[k].type);
    CHECK(a[k].bytes == b[k].bytes);
  }
}

TEST_CASE("FSDP2 output_dtype: what is not modelled is refused by key", "[fsdp2][output_dtype][scenario]") {
  auto refused = [](const std::string& text, const char* key) {
    INFO(key);
    CHECK_THROWS_WITH(build_program(load_scenario_text(text, "outdtype.yaml")),
                      Catch::Contains(std::string("outdtype.yaml")) && Catch::Contains(key));
  };
  CHECK_NOTHROW(build_program(worked(kOut, kV5)));
  CHECK_NOTHROW(build_program(worked(kPolicy + "  fsdp_output_dtype: none\n", kV5)));
  // A value outside none | bf16 | fp16 | fp32.
  refused(worked_text(kPolicy + "  fsdp_output_dtype: fp8\n"), "parallel.fsdp_output_dtype");
  // Another dtype than the layers' compute dtype: every decoder layer would cast too.
  refused(worked_text(kPolicy + "  fsdp_output_dtype: fp32\n"), "parallel.fsdp_output_dtype");
  refused(worked_text(kPolicy + "  fsdp_output_dtype: fp16\n"), "parallel.fsdp_output_dtype");
  refused(worked_text("  fsdp_output_dtype: bf16\n"), "parallel.fsdp_output_dtype");
  // Autocast over fp32 parameters (no policy): the layers' outputs are of mixed dtypes.
  refused(worked_text("  fsdp_output_dtype: fp32\n", "", "  autocast: bf16\n"), "parallel.fsdp_output_dtype");
  // A loop computing the loss from the returned (cast) logits.
  std::string loop = worked_text(kOut);
  loop.replace(loop.find("keep_output: loss"), 17, "keep_output: true");
  refused(loop, "parallel.fsdp_output_dtype");
  refused(worked_text(kOut + "  context: 2\n"), "parallel.context");
  // Autocast with the policy (Accelerate v1.6 / v1.7) needs the policy's output_dtype.
  refused(worked_text(kPolicy, kV5, "  autocast: bf16\n"), "parallel.fsdp_output_dtype");
  CHECK_NOTHROW(build_program(worked(kOut, kV5, "  autocast: bf16\n")));
  // Only FSDP2 has output_dtype.
  for (const char* sharding : {"none", "fsdp"}) {
    INFO(sharding);
    std::string t = worked_text("  fsdp_output_dtype: bf16\n");
    t.replace(t.find("sharding: fsdp2"), 15, std::string("sharding: ") + sharding);
    refused(t, "parallel.fsdp_output_dtype");
  }
}

TEST_CASE("memsim run: Qwen2.5-7B through HF Trainer + Accelerate >= 1.8 FSDP2 bf16 on 8 H100",
          "[fsdp2][accelerate][output_dtype][cli][scenarios]") {
  const std::string file =
      MEMSIM_SOURCE_DIR + "/scenarios/qwen2.5-7b-hf-trainer-fsdp2-bf16-accelerate1.8-8xh100.yaml";
  auto run = [&](const std::string& set) { return memsim_test::run_json(file, set); };
  const nlohmann::json cur = run("");
  CHECK(cur["fits"] == true);
  // The 2-byte loss copy dies before backward: the peak is the policy's without output_dtype.
  const nlohmann::json none = run("--set parallel.fsdp_output_dtype=none");
  CHECK(cur["peak_allocated_bytes"] == none["peak_allocated_bytes"]);
  CHECK(cur["peak_reserved_bytes"] == none["peak_reserved_bytes"]);
  const Scenario s = load_scenario(file);
  CHECK_FALSE(s.precision.autocast.has_value());
  const Program p = build_program(s);
  const TensorNames names(p);
  std::vector<uint64_t> casts;
  for (const MemoryEvent& e : p.events)
    if (e.type == EventType::alloc && names.name(e.tensor).find("cast_forward_outputs") != std::string::npos)
      casts.push_back(e.bytes);
  CHECK(casts == std::vector<uint64_t>{2, 2});  // one bf16 loss per step (warm-up, measured)
  // transformers 4.x: the fp32 logits (2048 x 152064 x 4 = 1,245,708,288 B) get a bf16 copy.
  std::string text = memsim_test::slurp(file);
  REQUIRE(text.find("transformers: 5") != std::string::npos);
  text.replace(text.find("transformers: 5"), 15, "transformers: 4");
  const Program p4 = build_program(load_scenario_text(text, "v4.yaml"));
  const TensorNames names4(p4);
  uint64_t logits_cast = 0;
  for (const MemoryEvent& e : p4.events)
    if (e.type == EventType::alloc && names4.name(e.tensor).rfind("logits in output_dtype", 0) == 0)
      logits_cast = e.bytes;
  CHECK(logits_cast == 2048ull * 152064ull * 2ull);
  // Refused by key, exit 1 with the file named.
  const memsim_test::CommandResult refused = memsim_test::run_shell(
      memsim_test::memsim_command() + "run '" + file + "' --set parallel.fsdp_output_dtype=fp32 2>&1");
  CHECK(refused.status == 1);
  CHECK(refused.out.find("parallel.fsdp_output_dtype") != std::string::npos);
  CHECK(refused.out.find("accelerate1.8-8xh100.yaml") != std::string::npos);
}
