// torch.autocast over FSDP2 (precision.autocast with parallel.sharding: fsdp2 and fp32
// unsharded parameters; docs/fsdp2.md "Autocast over FSDP2").
//
// The rule, measured with torch 1.13 on CPU (tools/fixtures/gen_fsdp2_autocast_fixtures.py,
// tests/data/torch_cpu/fsdp2_autocast_hf_llama.json): FSDP2's unsharded parameter is an
// nn.Parameter over an as_strided view of its all-gather output, a leaf that is not a view,
// so at::autocast::cached_cast caches its bf16 cast (keyed by the TensorImpl) like a plain
// parameter's; resharding (the storage resized to 0) does not touch the cache, so the cast
// lives until the autocast region exits (or, when an op saved it, until that op's
// backward). The stand-in's live bytes (parameters excluded) equal the plain model's in
// every number. Then memsim: FSDP2's program (sim/parallel/fsdp2.h) plus the one-GPU
// autocast program with the cache on (graph/autocast.h), where FSDP1's views are uncached.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "live_at_mark_test_support.h"
#include "cli_test_support.h"
#include "program/tensor_names.h"
#include "sim/analysis/layer_bytes.h"
#include "sim/step/schedule.h"
#include "step_measure_test_support.h"

using namespace memsim;

namespace {

using memsim_test::live;

// Live requested bytes of everything but parameters at the fixture's moments (the
// fixture cannot count FSDP2's resized parameter storages, so it counts no parameter).
using NonParam = memsim_test::StepMeasure;
NonParam non_param(const Program& p) {
  return memsim_test::measure_step_if(p, [&p](uint32_t t) {
    return !(t < p.tensors.size() && p.tensors[t].kind == TensorKind::parameter);
  });
}

Scenario fixture_scenario(const nlohmann::json& fx, const std::string& policy, bool fsdp2) {
  Scenario s;
  s.optimizer.type = OptimizerType::none;
  s.step.warmup_steps = 0;
  s.device.cublas_workspace = 0;
  s.device.kernel_scratch = false;
  s.precision.autocast = DType::bf16;
  s.precision.autocast_region = AutocastRegion::forward_and_loss;
  memsim_test::apply_hf_fixture_config(s, "hf-llama", fx["config"]);
  if (policy == "full") s.checkpoint.policy = CheckpointPolicy::full;
  if (fsdp2) {
    s.parallel.data = 4;
    s.parallel.sharding = Sharding::fsdp2;
  }
  return s;
}

// Live non-parameter bytes right before the measured step's first backward event (the
// autocast region has exited: forward-and-loss) and their peak until then.
struct BeforeBackward {
  uint64_t live = 0, peak = 0;
};
BeforeBackward before_backward(const Program& p) {
  BeforeBackward b;
  uint64_t live = 0;
  bool measuring = false;
  for (const MemoryEvent& e : p.events) {
    if (e.type == EventType::mark && p.str(static_cast<uint32_t>(e.bytes)) == "measured_step_begin")
      measuring = true;
    if (measuring && e.phase == Phase::backward && e.type != EventType::mark) {
      b.live = live;
      return b;
    }
    const bool param = e.tensor < p.tensors.size() && p.tensors[e.tensor].kind == TensorKind::parameter;
    if (e.type == EventType::alloc && !param) live += e.bytes;
    if (e.type == EventType::free && !param) live -= p.tensors[e.tensor].bytes;
    if (measuring) b.peak = std::max(b.peak, live);
  }
  FAIL("no backward event");
  return b;
}

Program fixture_program(const Scenario& s) {
  TrainingScript script = default_script(s);
  script.loss = LossImpl::torch;
  return build_program(s, script);
}

}  // namespace


TEST_CASE("autocast caches FSDP2's unsharded parameters' casts through the reshard (torch 1.13 CPU)",
          "[fsdp2][autocast]") {
  const nlohmann::json fx = memsim_test::load_torch_cpu_fixture("fsdp2_autocast_hf_llama.json");
  const nlohmann::json& c = fx["config"];
  const uint64_t D = c["d_model"], H = c["heads"], KV = c["kv_heads"], F = c["d_ff"];
  const uint64_t hd = D / H;
  // Layer 0's seven linear weights in bf16: q, k, v, o, gate, up, down (90624 B).
  const uint64_t layer0_casts = 2 * (D * H * hd + 2 * D * KV * hd + H * hd * D + 3 * D * F);
  auto row = [&](const char* weights, const char* policy) {
    for (const nlohmann::json& r : fx["rows"])
      if (r["weights"] == weights && r["policy"] == policy) return r;
    FAIL("no row " << weights << " " << policy);
    return nlohmann::json();
  };
  std::printf("\n| policy, weights | forward end real | memsim | after region exit real | memsim | "
              "forward+loss peak real | memsim |\n|---|---:|---:|---:|---:|---:|---:|\n");
  for (const char* policy : {"none", "full"}) {
    INFO(policy);
    const nlohmann::json leaf = row("leaf", policy), f2 = row("fsdp2", policy);
    // The measured rule: the stand-in's unsharded nn.Parameters (leaves over resized
    // storages) behave as the model's own parameters in every number ...
    for (const char* k : {"before_forward", "live_at_forward_end", "live_after_region_exit",
                          "forward_and_loss_peak", "after_backward", "step_peak",
                          "layer0_casts_live_after_post_forward", "layer0_casts_live_at_forward_end",
                          "layer0_casts_live_after_region_exit", "layer0_casts_made"})
      CHECK(f2[k] == leaf[k]);
    // ... although layer 0's storages were resized to 0 at its post-forward: the cached
    // casts outlive the reshard (all seven, 90624 B) ...
    CHECK(f2["layer0_param_storage_after_post_forward"] == 0);
    CHECK(leaf["layer0_param_storage_after_post_forward"] == f2["layer0_param_bytes"]);
    CHECK(f2["layer0_casts_live_after_post_forward"] == layer0_casts);
    CHECK(f2["layer0_casts_live_at_forward_end"] == layer0_casts);
    // ... and die when the region exits unless mm saved them (no checkpointing); under
    // full checkpointing nothing saved them and the recompute casts again (14 casts).
    const bool saved = std::string(policy) == "none";
    CHECK(f2["layer0_casts_live_after_region_exit"] == (saved ? layer0_casts : 0));
    CHECK(f2["layer0_casts_made"] == (saved ? 7 : 14));

    // memsim: one GPU with the cache on is the leaf row in every number; FSDP2 + autocast
    // is the stand-in's row up to backward (after it, FSDP2's reduce-scatter replaces the
    // unsharded .grads the stand-in keeps: tests/test_fsdp2.cpp checks those events).
    const Program one = fixture_program(fixture_scenario(fx, policy, false));
    const Program sharded = fixture_program(fixture_scenario(fx, policy, true));
    const NonParam o = non_param(one), s = non_param(sharded);
    const BeforeBackward ob = before_backward(one), sb = before_backward(sharded);
    CHECK(o.before_forward == leaf["before_forward"].get<uint64_t>());
    CHECK(o.forward_end == leaf["live_at_forward_end"].get<uint64_t>());
    CHECK(ob.live == leaf["live_after_region_exit"].get<uint64_t>());
    CHECK(ob.peak == leaf["forward_and_loss_peak"].get<uint64_t>());
    CHECK(o.after_backward == leaf["after_backward"].get<uint64_t>());
    CHECK(o.peak == leaf["step_peak"].get<uint64_t>());
    CHECK(s.before_forward == f2["before_forward"].get<uint64_t>());
    CHECK(s.forward_end == f2["live_at_forward_end"].get<uint64_t>());
    CHECK(sb.live == f2["live_after_region_exit"].get<uint64_t>());
    CHECK(sb.peak == f2["forward_and_loss_peak"].get<uint64_t>());
    std::printf("| %s, fsdp2 | %llu | %llu | %llu | %llu | %llu | %llu |\n", policy,
                static_cast<unsigned long long>(f2["live_at_forward_end"].get<uint64_t>()),
                static_cast<unsigned long long>(s.forward_end),
                static_cast<unsigned long long>(f2["live_after_region_exit"].get<uint64_t>()),
                static_cast<unsigned long long>(sb.live),
                static_cast<unsigned long long>(f2["forward_and_loss_peak"].get<uint64_t>()),
                static_cast<unsigned long long>(sb.peak));
  }
}

namespace {

// 2-layer hf-llama of docs/fsdp2.md's worked example: D 256, F 1000, vocab 1001, ws 4.
Scenario worked(const std::string& precision, const std::string& parallel,
                const std::string& extra = "") {
  std::string y =
      "model:\n  family: hf-llama\n  layers: 2\n  d_model: 256\n  heads: 4\n  kv_heads: 4\n"
      "  d_ff: 1000\n  vocab: 1001\n  context_length: 64\n";
  y += "batch:\n  micro_batch: 2\n  seq_len: 64\n";
  y += "precision:\n  params: fp32\n" + precision;
  y += "optimizer:\n  type: adamw\n  impl: foreach\n";
  y += "step:\n  kind: train\n  warmup_steps: 1\n";
  y += "parallel:\n" + parallel;
  y += extra;
  y += "device:\n  capacity: 1TiB\n  cublas_workspace: 0\n  kernel_scratch: false\n";
  return load_scenario_text(y, "fsdp2-autocast.yaml");
}

const std::string kAutocast = "  autocast: bf16\n";
const std::string kFsdp2 = "  data: 4\n  sharding: fsdp2\n";
const std::string kFullAc = "checkpoint:\n  policy: full\n";

// The measured step's bf16 weight casts ("bf16 autocast copy of P") of the parameters
// whose name starts with `prefix`: how many, where they are freed, and how many are live
// when the first FSDP2 unsharded tensor of that prefix is freed (its reshard).
struct Casts {
  int made = 0, freed_forward = 0, freed_loss = 0, freed_backward = 0, live_at_reshard = -1;
  uint64_t bytes = 0;
};
Casts casts_of(const Program& p, const std::string& prefix) {
  const TensorNames names(p);
  const std::string cast = "bf16 autocast copy of " + prefix, unsharded = "FSDP2 unsharded " + prefix;
  std::vector<char> is(p.tensors.size(), 0), un(p.tensors.size(), 0);
  for (size_t t = 0; t < p.tensors.size(); ++t) {
    const std::string& n = names.name(static_cast<uint32_t>(t));
    is[t] = n.rfind(cast, 0) == 0;
    un[t] = n.rfind(unsharded, 0) == 0;
  }
  Casts c;
  bool measuring = false;
  int live = 0;
  for (const MemoryEvent& e : p.events) {
    if (e.type == EventType::mark && p.str(static_cast<uint32_t>(e.bytes)) == "measured_step_begin")
      measuring = true;
    if (!measuring) continue;
    if (e.type == EventType::alloc && is[e.tensor] && e.phase == Phase::forward) {
      ++c.made;
      ++live;
      c.bytes += e.bytes;
    }
    if (e.type == EventType::free && is[e.tensor]) {
      --live;
      if (e.phase == Phase::forward) ++c.freed_forward;
      else if (e.phase == Phase::loss) ++c.freed_loss;
      else if (e.phase == Phase::backward) ++c.freed_backward;
    }
    if (e.type == EventType::free && un[e.tensor] && e.phase == Phase::forward && c.live_at_reshard < 0)
      c.live_at_reshard = live;
  }
  return c;
}

}  // namespace

TEST_CASE("FSDP2 + autocast, worked example: the cached casts of every layer outlive its reshard",
          "[fsdp2][autocast]") {
  const uint64_t D = 256, F = 1000, V = 1001;
  const uint64_t block_casts = (4 * D * D + 3 * D * F) * 2;  // 2,060,288 B per layer
  const uint64_t head_cast = V * D * 2;                       // 512,512 B (lm_head)
  // Full activation checkpointing: nothing saves a weight cast in the forward, the cache
  // alone keeps it: all seven of layer 0 are live when layer 0 reshards, and they die at
  // the region's exit after the loss (not in the forward, not in backward).
  const Program ck = build_program(worked(kAutocast, kFsdp2, kFullAc));
  const Casts l0 = casts_of(ck, "model.layers.0.");
  CHECK(l0.made == 7);
  CHECK(l0.bytes == block_casts);
  CHECK(l0.live_at_reshard == 7);
  CHECK(l0.freed_forward == 0);
  CHECK(l0.freed_loss == 7);
  // At the end of the forward both layers' casts and the lm_head's are live: 4,633,088 B
  // of unsharded bf16 weights that MixedPrecisionPolicy (resharded bf16 gathers) and FSDP1
  // + autocast (uncached view casts, dead with their op under checkpointing) do not hold.
  const Casts all = casts_of(ck, "");
  CHECK(all.made == 2 * 7 + 1);
  CHECK(all.bytes == 2 * block_casts + head_cast);
  CHECK(all.bytes == 4633088);
  const Program one = build_program(worked(kAutocast, "  data: 1\n", kFullAc));
  CHECK(live(ck, "forward_end", TensorKind::activation) == live(one, "forward_end", TensorKind::activation));
  const Program fsdp1 = build_program(worked(kAutocast, "  data: 4\n  sharding: fsdp\n", kFullAc));
  CHECK(live(ck, "forward_end", TensorKind::activation) - live(fsdp1, "forward_end", TensorKind::activation) ==
        2 * block_casts);  // FSDP1's lm_head cast is saved too; its layers' casts died
  // Without checkpointing mm saves every cast anyway: they die in backward, as on one GPU
  // and as under FSDP1 (whose uncached casts are the same saved copies).
  const Program plain = build_program(worked(kAutocast, kFsdp2));
  const Casts p0 = casts_of(plain, "");
  CHECK(p0.made == 2 * 7 + 1);
  CHECK(p0.freed_backward == p0.made);
  CHECK(live_bytes_at_mark(plain, "forward_end").by_kind[static_cast<int>(TensorKind::activation)] ==
        live_bytes_at_mark(build_program(worked(kAutocast, "  data: 4\n  sharding: fsdp\n")), "forward_end")
            .by_kind[static_cast<int>(TensorKind::activation)]);
  // FSDP2's own state is that of FSDP2 in fp32: the same shards, gathers, gradients and
  // AdamW state at every mark (autocast changes activations only).
  const Program fp32 = build_program(worked("", kFsdp2, kFullAc));
  for (TensorKind k : {TensorKind::parameter, TensorKind::gradient, TensorKind::optimizer_state})
    for (const char* mark : {"forward_end", "backward_end", "optimizer_end"})
      CHECK(live(ck, mark, k) == live(fp32, mark, k));
}

TEST_CASE("FSDP2 + autocast: activations are the one-GPU cached program's for every family",
          "[fsdp2][autocast]") {
  // GPT-2's bias casts (addmm does not save them) stay cached until the region exits, as
  // on one GPU; under FSDP1 they die with their op (tests/test_fsdp_autocast.cpp).
  for (const char* family : {"hf-llama", "hf-gpt2", "cs336"}) {
    INFO(family);
    auto scenario = [&](const std::string& parallel, const std::string& extra) {
      std::string y = "model:\n  family: " + std::string(family) +
                      "\n  layers: 2\n  d_model: 256\n  heads: 4\n  kv_heads: 4\n  d_ff: 1024\n"
                      "  vocab: 1000\n  context_length: 64\n  attention: eager\n";
      y += "batch:\n  micro_batch: 2\n  seq_len: 48\n";
      y += "precision:\n  params: fp32\n  autocast: bf16\n";
      y += "optimizer:\n  type: adamw\n  impl: foreach\n";
      y += "step:\n  kind: train\n  warmup_steps: 1\n";
      y += "parallel:\n" + parallel + extra;
      y += "device:\n  capacity: 1TiB\n  cublas_workspace: 0\n  kernel_scratch: false\n";
      return build_program(load_scenario_text(y, "fsdp2-autocast.yaml"));
    };
    for (const std::string& ac : {std::string(), kFullAc}) {
      const Program f2 = scenario(kFsdp2, ac), one = scenario("  data: 1\n", ac);
      const Program f1 = scenario("  data: 4\n  sharding: fsdp\n", ac);
      CHECK(live(f2, "forward_end", TensorKind::activation) == live(one, "forward_end", TensorKind::activation));
      CHECK(live(f2, "forward_end", TensorKind::temporary) == live(one, "forward_end", TensorKind::temporary));
      if (std::string(family) == "hf-gpt2" || !ac.empty())
        CHECK(live(f2, "forward_end", TensorKind::activation) > live(f1, "forward_end", TensorKind::activation));
    }
  }
}

TEST_CASE("FSDP2 + autocast: what is not modelled is refused by key", "[fsdp2][autocast][scenario]") {
  // Autocast over MixedPrecisionPolicy's parameters is modelled as Accelerate's policy only
  // (tests/test_fsdp2_accelerate.cpp): without reduce_dtype bf16 it is refused by that key,
  // with it by the loop (this one computes the loss after the model returns).
  CHECK_THROWS_WITH(build_program(worked(kAutocast, kFsdp2 + "  fsdp_mixed_precision: bf16\n")),
                    Catch::Contains("parallel.reduce_dtype") && Catch::Contains("Accelerate"));
  CHECK_THROWS_WITH(build_program(worked(kAutocast, kFsdp2 + "  fsdp_mixed_precision: bf16\n"
                                                             "  reduce_dtype: bf16\n")),
                    Catch::Contains("step.keep_output") && Catch::Contains("HF Trainer"));
  CHECK_THROWS_WITH(build_program(worked(kAutocast + "  autocast_region: whole-step\n", kFsdp2)),
                    Catch::Contains("precision.autocast_region"));
  CHECK_THROWS_WITH(build_program(worked(kAutocast + "  autocast_region: whole-run\n", kFsdp2)),
                    Catch::Contains("precision.autocast_region"));
  CHECK_NOTHROW(build_program(worked(kAutocast + "  autocast_region: forward\n", kFsdp2)));
  // fp16 autocast over fp32 parameters is modelled as bf16 is (with or without the
  // GradScaler: tests/test_grad_scaler_fsdp2.cpp); Accelerate's fp16 path over its fp16
  // policy is not.
  CHECK_NOTHROW(build_program(worked("  autocast: fp16\n", kFsdp2)));
  CHECK_THROWS_WITH(build_program(worked("  autocast: fp16\n", kFsdp2 + "  fsdp_mixed_precision: fp16\n"
                                                                      "  reduce_dtype: fp16\n")),
                    Catch::Contains("precision.autocast") && Catch::Contains("fp16 path"));
}

TEST_CASE("memsim run: FSDP2 + autocast end to end, MixedPrecisionPolicy without Accelerate's policy refused by key",
          "[fsdp2][autocast][cli][scenarios]") {
  const std::string file = MEMSIM_SOURCE_DIR + "/scenarios/llama3-8b-fsdp2-autocast-8xh100.yaml";
  const nlohmann::json j = memsim_test::run_json(file);
  CHECK(j["fits"] == true);
  // The scenario with a MixedPrecisionPolicy added but not Accelerate's (reduce_dtype unset):
  // exit 1, the message naming the file and the key.
  const memsim_test::CommandResult refused = memsim_test::run_shell(
      memsim_test::memsim_command() + "run '" + file + "' --set parallel.fsdp_mixed_precision=bf16 2>&1");
  CHECK(refused.status == 1);
  CHECK(refused.out.find("parallel.reduce_dtype") != std::string::npos);
  CHECK(refused.out.find("llama3-8b-fsdp2-autocast-8xh100.yaml") != std::string::npos);
  // Every layer's cached bf16 linear weights are live at the peak (the loss, inside the
  // region): 32 layers x 436,207,616 B, plus the LM head's 1,050,673,152 B (saved by mm).
  const Program p = build_program(load_scenario(file));
  const Casts c = casts_of(p, "");
  CHECK(c.made == 32 * 7 + 1);
  CHECK(c.bytes == 32ull * 436207616ull + 1050673152ull);
  CHECK(c.freed_loss == 32 * 7);
}
