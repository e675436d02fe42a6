// torch.autocast under FSDP (precision.autocast with parallel.sharding: fsdp) and the
// weight-cast cache rule it rests on (graph/autocast.h, docs/autocast.md "Under FSDP").
//
// The rule, measured with torch 1.13 on CPU (tools/fixtures/gen_autocast_view_fixtures.py,
// tests/data/torch_cpu/autocast_views_{hf_llama,hf_gpt2,cs336}.json): cached_cast caches only fp32
// leaves that require grad and are not views. FSDP's module weights are non-leaf views of
// the FlatParameter (torch.split(flat, numels)[i].view(shape), set before every forward),
// so their casts are never cached: the fixture's `views` rows equal its `leaf_nocache`
// rows (torch.autocast(cache_enabled=False)) and memsim's cache-disabled program
// (precision.autocast_cache: false) exactly, while the `leaf` rows are the cached program.
// Then FSDP + autocast: the FSDP program (sim/parallel/fsdp.h) with every weight cast per use.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "live_at_mark_test_support.h"
#include "sim/analysis/layer_bytes.h"
#include "sim/step/schedule.h"
#include "step_measure_test_support.h"

using namespace memsim;

namespace {

Scenario fixture_scenario(const nlohmann::json& fx, const nlohmann::json& row) {
  const nlohmann::json& c = fx["config"];
  const std::string family = fx["family"];
  Scenario s;
  s.optimizer.type = OptimizerType::none;
  s.step.warmup_steps = 0;
  s.device.cublas_workspace = 0;
  s.device.kernel_scratch = false;
  s.precision.autocast = DType::bf16;
  s.precision.autocast_region = row["autocast_region"] == "whole-step"
                                    ? AutocastRegion::whole_step
                                    : AutocastRegion::forward_and_loss;
  // `leaf`: cached; `views` (FSDP's) and `leaf_nocache`: nothing cached.
  s.precision.autocast_cache = row["weights"] == "leaf";
  if (family == "cs336") {
    memsim_test::apply_cs336_fixture_config(s, c);
    return s;
  }
  memsim_test::apply_hf_fixture_config(s, family, c);
  return s;
}

Scenario tiny(const std::string& family, const std::string& precision,
              const std::string& parallel) {
  std::string y = "model:\n  family: " + family +
                  "\n  layers: 4\n  d_model: 256\n  heads: 4\n  kv_heads: 4\n  d_ff: 1024\n"
                  "  vocab: 1000\n  context_length: 64\n  attention: eager\n";
  // 2 x 48 tokens: no activation, cast or logits size equals a weight's bf16 size.
  y += "batch:\n  micro_batch: 2\n  seq_len: 48\n";
  y += "precision:\n  params: fp32\n" + precision;
  y += "optimizer:\n  type: adamw\n  impl: foreach\n";
  y += "step:\n  kind: train\n  warmup_steps: 1\n";
  y += "parallel:\n" + parallel;
  y += "device:\n  capacity: 1TiB\n  cublas_workspace: 0\n  kernel_scratch: false\n";
  return load_scenario_text(y, "fsdp-autocast.yaml");
}

const std::string kFsdp = "  data: 4\n  sharding: fsdp\n";
const std::string kOneGpu = "  data: 1\n";

using memsim_test::live;

// The bf16 weight casts of the measured step's forward: allocations of `_to_copy` whose
// size is a parameter's at 2 bytes per element; counts those freed in the forward (phase
// forward, i.e. not saved and not cached) and in backward.
struct WeightCasts {
  int made = 0, freed_in_forward = 0, freed_in_backward = 0, freed_later = 0;
  uint64_t live_at_forward_end = 0;  // bytes
};
WeightCasts weight_casts(const Program& p, const std::vector<uint64_t>& weight_bf16_bytes) {
  WeightCasts w;
  std::vector<char> is(p.tensors.size(), 0);
  bool measured = false;
  uint64_t live = 0;
  for (const MemoryEvent& e : p.events) {
    if (e.type == EventType::mark && p.str(static_cast<uint32_t>(e.bytes)) == "measured_step_begin")
      measured = true;
    if (!measured) continue;
    if (e.type == EventType::mark && p.str(static_cast<uint32_t>(e.bytes)) == "forward_end")
      w.live_at_forward_end = live;
    if (e.type == EventType::alloc && e.phase == Phase::forward && p.str(e.op) == "_to_copy" &&
        std::find(weight_bf16_bytes.begin(), weight_bf16_bytes.end(), e.bytes) !=
            weight_bf16_bytes.end()) {
      is[e.tensor] = 1;
      ++w.made;
      live += e.bytes;
    }
    if (e.type == EventType::free && is[e.tensor]) {
      live -= p.tensors[e.tensor].bytes;
      if (e.phase == Phase::forward) ++w.freed_in_forward;
      else if (e.phase == Phase::backward) ++w.freed_in_backward;
      else ++w.freed_later;
    }
  }
  return w;
}

}  // namespace

TEST_CASE("autocast does not cache casts of FSDP-style parameter views (torch 1.13 CPU)",
          "[autocast][fsdp][views]") {
  // cs336: the stand-in applies cached_cast's rule itself for its einsums (CUDA's
  // einsum casts; gen_autocast_view_fixtures.py), so that file checks memsim's uncached
  // CS336 program; the Hugging Face files measure torch's own rule.
  for (const char* file : {"autocast_views_hf_llama.json", "autocast_views_hf_gpt2.json",
                           "autocast_views_cs336.json"}) {
    const nlohmann::json fx = memsim_test::load_torch_cpu_fixture(file);
    std::printf("\n| %s | forward end real | memsim | after backward real | memsim | step peak real | memsim |\n",
                file);
    std::printf("|---|---:|---:|---:|---:|---:|---:|\n");
    for (const nlohmann::json& row : fx["rows"]) {
      const std::string label = std::string(row["weights"]) + ", " + std::string(row["autocast_region"]);
      INFO(file << ": " << label);
      const Scenario s = fixture_scenario(fx, row);
      TrainingScript script = default_script(s);
      script.loss = LossImpl::torch;
      const memsim_test::StepMeasure m = memsim_test::measure_step(build_program(s, script));
      std::printf("| %s | %llu | %llu | %llu | %llu | %llu | %llu |\n", label.c_str(),
                  static_cast<unsigned long long>(row["live_at_forward_end"].get<uint64_t>()),
                  static_cast<unsigned long long>(m.forward_end),
                  static_cast<unsigned long long>(row["after_backward"].get<uint64_t>()),
                  static_cast<unsigned long long>(m.after_backward),
                  static_cast<unsigned long long>(row["step_peak"].get<uint64_t>()),
                  static_cast<unsigned long long>(m.peak));
      CHECK(m.before_forward == row["before_forward"].get<uint64_t>());
      CHECK(m.forward_end == row["live_at_forward_end"].get<uint64_t>());
      CHECK(m.after_backward == row["after_backward"].get<uint64_t>());
      CHECK(m.peak == row["step_peak"].get<uint64_t>());
    }
    // The measured rule itself: views behave as with the cache disabled, in every number.
    for (const nlohmann::json& v : fx["rows"]) {
      if (v["weights"] != "views") continue;
      for (const nlohmann::json& n : fx["rows"])
        if (n["weights"] == "leaf_nocache" && n["autocast_region"] == v["autocast_region"])
          for (const char* k : {"before_forward", "live_at_forward_end", "after_backward", "step_peak"})
            CHECK(v[k] == n[k]);
    }
  }
}

TEST_CASE("the cache's absence shows where torch measured it: GPT-2's biases, whole-step weights",
          "[autocast][fsdp][views]") {
  auto row = [](const nlohmann::json& fx, const char* weights, const char* region) {
    for (const nlohmann::json& r : fx["rows"])
      if (r["weights"] == weights && r["autocast_region"] == region) return r;
    FAIL("no row");
    return nlohmann::json();
  };
  const nlohmann::json gpt2 = memsim_test::load_torch_cpu_fixture("autocast_views_hf_gpt2.json");
  const nlohmann::json llama = memsim_test::load_torch_cpu_fixture("autocast_views_hf_llama.json");
  // addmm does not save its bias: a cached bias copy lives until the region exits, an
  // uncached one dies with the addmm. 4 layers x (3D + D + 4D + D) bias elements x 2 B.
  const nlohmann::json& c = gpt2["config"];
  const uint64_t D = c["d_model"], L = c["layers"];
  CHECK(row(gpt2, "leaf", "forward-and-loss")["live_at_forward_end"].get<uint64_t>() -
            row(gpt2, "views", "forward-and-loss")["live_at_forward_end"].get<uint64_t>() ==
        L * (3 * D + D + 4 * D + D) * 2);
  // Whole-step: cached copies outlive backward; uncached ones die with their saved tensors.
  for (const nlohmann::json* fx : {&gpt2, &llama}) {
    CHECK(row(*fx, "leaf", "whole-step")["after_backward"].get<uint64_t>() >
          row(*fx, "views", "whole-step")["after_backward"].get<uint64_t>());
    CHECK(row(*fx, "views", "whole-step")["after_backward"] ==
          row(*fx, "views", "forward-and-loss")["after_backward"]);
  }
}

TEST_CASE("FSDP + autocast: the FSDP program with every weight cast per use", "[fsdp][autocast]") {
  const std::string ac = "  autocast: bf16\n";
  for (const char* family : {"hf-llama", "hf-gpt2", "cs336"}) {
    INFO(family);
    const Program fsdp_ac = build_program(tiny(family, ac, kFsdp));
    const Program fsdp_fp32 = build_program(tiny(family, "", kFsdp));
    const Program one_nocache = build_program(tiny(family, ac + "  autocast_cache: false\n", kOneGpu));
    const Program one_cached = build_program(tiny(family, ac, kOneGpu));
    // What autocast adds (casts, bf16 activations) is the single-GPU program with the
    // cache disabled: the same activation and temporary bytes at every mark.
    for (const char* mark : {"forward_end", "backward_end"}) {
      INFO(mark);
      CHECK(live(fsdp_ac, mark, TensorKind::activation) == live(one_nocache, mark, TensorKind::activation));
      CHECK(live(fsdp_ac, mark, TensorKind::temporary) == live(one_nocache, mark, TensorKind::temporary));
    }
    // FSDP's own state is autocast's business only through the views: the same gathered
    // parameters, sharded gradients and optimizer state as FSDP in fp32.
    for (TensorKind k : {TensorKind::parameter, TensorKind::gradient, TensorKind::optimizer_state})
      for (const char* mark : {"forward_end", "optimizer_end"})
        CHECK(live(fsdp_ac, mark, k) == live(fsdp_fp32, mark, k));
    // bf16 activations, but the saved bf16 weight copies (unsharded) count as activations
    // too: hf-llama below separates them.
    // GPT-2: the bias copies (addmm does not save them) die at once without the cache.
    if (std::string(family) == "hf-gpt2")
      CHECK(live(one_cached, "forward_end", TensorKind::activation) >
            live(fsdp_ac, "forward_end", TensorKind::activation));
  }
}

TEST_CASE("FSDP + autocast: weight casts die with their op or their backward, never with the region",
          "[fsdp][autocast]") {
  // LLaMA: 7 linear weights per layer + lm_head, each cast once per use and saved by mm.
  const Scenario s = tiny("hf-llama", "  autocast: bf16\n  autocast_region: whole-step\n", kFsdp);
  const Program p = build_program(s);
  const uint64_t D = 256, F = 1024, V = 1000;
  const std::vector<uint64_t> sizes = {D * D * 2, D * F * 2, V * D * 2};
  const WeightCasts w = weight_casts(p, sizes);
  CHECK(w.made == 4 * 7 + 1);
  CHECK(w.freed_in_backward == w.made);  // saved by mm, freed by MmBackward0
  CHECK(w.freed_later == 0);             // nothing left for the whole-step region's exit
  // Every copy is saved: at the end of the forward the unsharded bf16 weights of all
  // layers are alive (2 B per linear weight), while FSDP has resharded their fp32 views.
  CHECK(w.live_at_forward_end == 4 * (4 * D * D + 3 * D * F) * 2 + V * D * 2);
  // The rest of the activations are bf16 casts and outputs: less than FSDP in fp32 saves.
  const Program fp32 = build_program(tiny("hf-llama", "", kFsdp));
  CHECK(live(p, "forward_end", TensorKind::activation) - w.live_at_forward_end <
        live(fp32, "forward_end", TensorKind::activation));
  // On one GPU the same whole-step region keeps every cached copy until the step ends.
  const Program one = build_program(tiny("hf-llama", "  autocast: bf16\n  autocast_region: whole-step\n",
                                         kOneGpu));
  const WeightCasts c = weight_casts(one, sizes);
  CHECK(c.made == 4 * 7 + 1);
  CHECK(c.freed_in_backward == 0);
  CHECK(c.freed_later == c.made);
  // Under checkpointing nothing saves them in the forward: each dies with its op (on one
  // GPU the cache would keep them until the region exits).
  const Program ck = build_program(tiny("hf-llama", "  autocast: bf16\n", kFsdp + "checkpoint:\n  policy: full\n"));
  const WeightCasts k = weight_casts(ck, sizes);
  CHECK(k.made == 4 * 7 + 1);
  CHECK(k.freed_in_forward == 4 * 7);  // the lm_head's (outside the layers) is saved
  // GPT-2: the bias casts are not saved by addmm: freed in the forward under FSDP.
  const Program g = build_program(tiny("hf-gpt2", "  autocast: bf16\n", kFsdp));
  const WeightCasts b = weight_casts(g, {3 * D * 2, 4 * D * 2});  // c_attn and c_fc biases
  CHECK(b.made == 2 * 4);
  CHECK(b.freed_in_forward == b.made);
}

TEST_CASE("precision.autocast_cache and FSDP's MixedPrecision with autocast are checked by key",
          "[fsdp][autocast][scenario]") {
  CHECK_THROWS_WITH(tiny("hf-llama", "  autocast_cache: false\n", kOneGpu),
                    Catch::Contains("precision.autocast_cache") &&
                        Catch::Contains("only applies with precision.autocast"));
  CHECK_THROWS_WITH(tiny("hf-llama", "  autocast: bf16\n  autocast_cache: maybe\n", kOneGpu),
                    Catch::Contains("precision.autocast_cache"));
  CHECK_FALSE(tiny("hf-llama", "  autocast: bf16\n  autocast_cache: false\n", kOneGpu)
                  .precision.autocast_cache);
  CHECK_THROWS_WITH(
      build_program(tiny("hf-llama", "  autocast: bf16\n", kFsdp + "  fsdp_mixed_precision: bf16\n")),
      Catch::StartsWith("fsdp-autocast.yaml: step.keep_output: Accelerate's FSDP1 bf16 path"));
}
