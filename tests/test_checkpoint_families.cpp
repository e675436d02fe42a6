// Activation checkpointing in the hf-gpt2, hf-llama and megatron families (the cs336
// family has its own tests in tests/test_checkpoint.cpp; all four are checked against
// real PyTorch in tests/test_checkpoint_fixtures.cpp). Per family and attention kernel:
// what each policy leaves alive at the end of forward, that recomputation costs the
// forward FLOPs of what it re-runs, that nothing leaks, that Megatron's recompute options
// keep what Korthikanti et al. 2022 say, and that the optimizer's cost model (exact for
// requested bytes) and `memsim compare` / `memsim optimize` work for every family.
#include <catch2/catch.hpp>

#include "tests/cli_test_support.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "graph/models/megatron.h"
#include "sim/analysis/layer_bytes.h"
#include "sim/megatron/megatron_step.h"
#include "sim/search/optimize.h"
#include "sim/step/checkpoint_policy.h"
#include "sim/step/schedule.h"

using namespace memsim;
using graph::CheckpointPlan;
using graph::LayerCheckpoint;

namespace {

constexpr int64_t kLayers = 4, kD = 64, kH = 4, kF = 256, kV = 96, kB = 2, kS = 64;

// A small model of `family` (fp32 for the HF families, bf16 for megatron as it trains),
// one warm-up step and the measured one, no cuBLAS workspace.
Scenario small(ModelFamily family, AttentionImpl attention) {
  Scenario s;
  s.name = "family checkpoint test";
  s.model.family = family;
  s.model.layers = kLayers;
  s.model.d_model = kD;
  s.model.heads = kH;
  s.model.kv_heads = family == ModelFamily::hf_llama ? 2 : kH;
  s.model.d_ff = kF;
  s.model.vocab = kV;
  s.model.context_length = kS;
  s.model.attention = attention;
  s.model.dropout = family == ModelFamily::hf_llama ? 0.0 : 0.1;
  s.model.tied_embeddings = family != ModelFamily::hf_llama;
  s.batch.micro_batch = kB;
  s.batch.seq_len = kS;
  if (family == ModelFamily::megatron) {
    s.precision.params = DType::bf16;
    s.precision.master_weights = true;
  }
  s.optimizer.type = OptimizerType::adamw;
  s.optimizer.impl = OptimizerImpl::foreach;
  s.step.warmup_steps = 1;
  s.device.cublas_workspace = 0;
  s.device.kernel_scratch = false;
  return s;
}

Scenario with_policy(Scenario s, const std::string& spec) {
  s.checkpoint = parse_policy(spec);
  return s;
}

struct Case {
  ModelFamily family;
  AttentionImpl attention;
};
const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
      {ModelFamily::hf_gpt2, AttentionImpl::eager},    {ModelFamily::hf_llama, AttentionImpl::eager},
      {ModelFamily::hf_llama, AttentionImpl::flash},   {ModelFamily::megatron, AttentionImpl::eager},
      {ModelFamily::megatron, AttentionImpl::flash}};
  return all;
}

uint64_t elem(const Scenario& s) { return static_cast<uint64_t>(dtype_bytes(s.precision.params)); }
uint64_t hidden_bytes(const Scenario& s) { return kB * kS * kD * elem(s); }

// Activation bytes layer l's forward leaves alive at forward_end (measured step).
uint64_t layer_activations(const LiveBytes& live, int32_t l) {
  return live.by_layer.at(static_cast<size_t>(l))[static_cast<int>(TensorKind::activation)];
}

uint64_t all_layers(const LiveBytes& live) {
  uint64_t sum = 0;
  for (int32_t l = 0; l < kLayers; ++l) sum += layer_activations(live, l);
  return sum;
}

// Requested bytes live at the last event (after the measured step).
uint64_t live_at_end(const Program& p) {
  uint64_t live = 0;
  for (const MemoryEvent& e : p.events) {
    if (e.type == EventType::alloc) live += e.bytes;
    if (e.type == EventType::free) live -= p.tensors[e.tensor].bytes;
  }
  return live;
}

}  // namespace

TEST_CASE("each policy lowers what the layers keep at the end of forward, in every family",
          "[checkpoint]") {
  for (const Case& c : cases()) {
    const Scenario s = small(c.family, c.attention);
    INFO(to_string(c.family) << " " << to_string(c.attention));
    const Program none_p = build_program(s);
    const LiveBytes none = live_bytes_at_mark(none_p, "forward_end");
    REQUIRE(none.by_layer.size() == kLayers);
    const uint64_t act = hidden_bytes(s);
    for (int32_t l = 0; l < kLayers; ++l) CHECK(layer_activations(none, l) > 8 * act);

    // full: every layer keeps only its output (the next checkpoint's input, or the final
    // norm's saved input); everything else in the layer is recomputed.
    const Program full_p = build_program(with_policy(s, "full"));
    const LiveBytes full = live_bytes_at_mark(full_p, "forward_end");
    for (int32_t l = 0; l < kLayers; ++l) CHECK(layer_activations(full, l) == act);
    // uniform:2: a chunk of two layers keeps only the second one's output.
    const LiveBytes uni2 = live_bytes_at_mark(build_program(with_policy(s, "uniform:2")), "forward_end");
    for (int32_t l = 0; l < kLayers; ++l) CHECK(layer_activations(uni2, l) == (l % 2 == 1 ? act : 0));
    // block:1: only layer 0 checkpointed.
    const LiveBytes block1 = live_bytes_at_mark(build_program(with_policy(s, "block:1")), "forward_end");
    CHECK(layer_activations(block1, 0) == act);
    for (int32_t l = 1; l < kLayers; ++l) CHECK(layer_activations(block1, l) == layer_activations(none, l));
    // modules and selective keep less than nothing checkpointed, and modules (both
    // halves) less than selective (the attention core only).
    const LiveBytes modules = live_bytes_at_mark(build_program(with_policy(s, "modules")), "forward_end");
    const LiveBytes selective = live_bytes_at_mark(build_program(with_policy(s, "selective")), "forward_end");
    CHECK(all_layers(modules) < all_layers(selective));
    CHECK(all_layers(selective) < all_layers(none));
    CHECK(all_layers(full) < all_layers(modules));
    // Nothing leaks: every policy ends the step with what `none` ends it with.
    for (const char* spec : {"full", "uniform:2", "block:2", "modules", "modules:mlp", "selective",
                             "sqrt", "custom:0,2.attention,3.mlp"}) {
      INFO(spec);
      CHECK(live_at_end(build_program(with_policy(s, spec))) == live_at_end(none_p));
    }
  }
}

TEST_CASE("recompute FLOPs are the forward FLOPs of what is re-run, in every family", "[checkpoint]") {
  for (const Case& c : cases()) {
    const Scenario s = small(c.family, c.attention);
    INFO(to_string(c.family) << " " << to_string(c.attention));
    const double B = kB, S = kS, D = kD, H = kH, F = kF, hd = kD / kH;
    const double kvD = static_cast<double>(s.model.kv_heads) * hd;
    const double steps = 2;  // one warm-up + the measured step
    const double core = 2 * (2 * B * H * S * S * hd);  // QK^T and attention x V
    // The linears of one layer: QKV, output projection; MLP (LLaMA: gate, up, down).
    const double attention_linears = 2 * B * S * D * (D + 2 * kvD) + 2 * B * S * D * D;
    const double mlp = (c.family == ModelFamily::hf_llama ? 3 : 2) * 2 * B * S * D * F;
    const double layer = attention_linears + core + mlp;
    auto recompute = [&](const std::string& spec, bool early_stop) {
      const Scenario p = with_policy(s, spec);
      TrainingScript t = default_script(p);
      t.checkpoint_early_stop = early_stop;
      return build_program(p, t).flops.recompute / steps;
    };
    CHECK(build_program(s).flops.recompute == 0);
    for (bool early_stop : {false, true}) {
      INFO("early stop " << early_stop);
      CHECK(recompute("full", early_stop) == Approx(kLayers * layer));
      CHECK(recompute("uniform:2", early_stop) == Approx(kLayers * layer));
      CHECK(recompute("block:1", early_stop) == Approx(layer));
      CHECK(recompute("modules", early_stop) == Approx(kLayers * layer));
      CHECK(recompute("modules:mlp", early_stop) == Approx(kLayers * mlp));
      CHECK(recompute("selective", early_stop) == Approx(kLayers * core));
      CHECK(recompute("custom:1,3.mlp", early_stop) == Approx(layer + mlp));
    }
  }
}

// Korthikanti et al. 2022, Table 2: per layer, no recomputation keeps sbh(34 + 5as/h),
// selective recomputation sbh*34, full recomputation 2sbh (the layer's input). memsim
// adds the LayerNorms' fp32 statistics (16sb), which the paper leaves out.
TEST_CASE("megatron recompute options keep what Korthikanti et al. 2022 say", "[checkpoint][megatron]") {
  const Scenario s = small(ModelFamily::megatron, AttentionImpl::eager);
  const uint64_t sb = kS * kB, sbh = sb * kD;
  const graph::MegatronShape shape = megatron_shape(s);
  const LiveBytes none = live_bytes_at_mark(build_program(s), "forward_end");
  const LiveBytes selective = live_bytes_at_mark(build_program(with_policy(s, "selective")), "forward_end");
  const LiveBytes full = live_bytes_at_mark(build_program(with_policy(s, "full")), "forward_end");
  for (int32_t l = 0; l < kLayers; ++l) {
    INFO("layer " << l);
    CHECK(layer_activations(none, l) == graph::megatron_layer_saved_bytes(shape).total());
    CHECK(layer_activations(selective, l) == 34 * sbh + 16 * sb);
    CHECK(layer_activations(full, l) == 2 * sbh);
  }
  // The checkpoints save the dataloader's attention mask (b, 1, s, s) bool among their
  // inputs: it outlives the forward step, which drops it otherwise.
  CHECK(selective.by_kind[static_cast<int>(TensorKind::input)] ==
        none.by_kind[static_cast<int>(TensorKind::input)] + kB * kS * kS);
}

// Megatron's CheckpointFunction is reentrant: the re-run goes to the chunk's end and its
// output lives until the chunk's backward is done. The same plan run non-reentrant (as
// torch.utils.checkpoint(use_reentrant=False) would) has a lower or equal peak.
TEST_CASE("megatron recomputes as a reentrant checkpoint", "[checkpoint][megatron]") {
  const Scenario s = with_policy(small(ModelFamily::megatron, AttentionImpl::eager), "full");
  const Program reentrant = build_program(s);
  Scenario hf = with_policy(small(ModelFamily::hf_gpt2, AttentionImpl::eager), "full");
  // The HF family with the reentrant switch behaves the same way relative to its default.
  const Program hf_plain = build_program(hf);
  hf.checkpoint.reentrant = true;
  const Program hf_reentrant = build_program(hf);
  auto peak = [](const Program& p) {
    uint64_t live = 0, most = 0;
    for (const MemoryEvent& e : p.events) {
      if (e.type == EventType::alloc) live += e.bytes;
      if (e.type == EventType::free) live -= p.tensors[e.tensor].bytes;
      most = std::max(most, live);
    }
    return most;
  };
  CHECK(peak(hf_reentrant) >= peak(hf_plain));
  CHECK(hf_reentrant.flops.recompute >= hf_plain.flops.recompute);
  CHECK(reentrant.flops.recompute > 0);
  // checkpoint.reentrant: false is refused for megatron (it has no such mode).
  const std::string yaml =
      "model: { family: megatron, layers: 2, d_model: 64, heads: 4, d_ff: 256, vocab: 96 }\n"
      "batch: { micro_batch: 1, seq_len: 32 }\n"
      "precision: { params: bf16 }\n"
      "checkpoint:\n  policy: full\n  reentrant: false\n";
  try {
    load_scenario_text(yaml, "m.yaml");
    FAIL("checkpoint.reentrant: false accepted for megatron");
  } catch (const ScenarioError& e) {
    CHECK(std::string(e.what()).find("m.yaml:6: checkpoint.reentrant") != std::string::npos);
  }
}

TEST_CASE("the optimizer's cost model in every family: exact up to shared checkpoint inputs",
          "[optimize]") {
  for (const Case& c : cases()) {
    const Scenario s = small(c.family, c.attention);
    INFO(to_string(c.family) << " " << to_string(c.attention));
    const TrainingScript script = default_script(s);
    const LayerCosts costs = calibrate(s, script, OptimizeOptions{}.choices);
    CheckpointPlan plan;
    plan.layers = {LayerCheckpoint::layer, LayerCheckpoint::attention,
                   LayerCheckpoint::core_attention, LayerCheckpoint::mlp};
    Scenario planned = s;
    planned.checkpoint = config_for_plan(plan);
    const Program p = build_program(planned, script);
    size_t begin = 0;
    for (size_t i = 0; i < p.events.size(); ++i)
      if (p.events[i].type == EventType::mark &&
          p.str(static_cast<uint32_t>(p.events[i].bytes)) == "measured_step_begin")
        begin = i;
    int64_t live = 0, peak = 0;
    auto r = [](uint64_t b) { return b == 0 ? 0 : static_cast<int64_t>((b + 511) / 512 * 512); };
    for (size_t i = 0; i < p.events.size(); ++i) {
      const MemoryEvent& e = p.events[i];
      if (e.type == EventType::alloc) live += r(e.bytes);
      if (e.type == EventType::free) live -= r(p.tensors[e.tensor].bytes);
      if (i > begin) peak = std::max(peak, live);
    }
    // Exact for hf-gpt2. Where checkpoints share an input that lives outside the layers
    // (HF LLaMA's causal mask, cache_position and cos/sin, Megatron's attention mask),
    // that input lives until the backward of the lowest checkpointed layer: a plan-wide
    // effect the per-layer model does not see. The model is then low by at most those
    // tensors (rounded to 512-byte blocks); the optimizer's verification by simulation
    // keeps its answers within the budget.
    auto round = [](uint64_t b) { return static_cast<int64_t>((b + 511) / 512 * 512); };
    const uint64_t e = elem(s), hd = kD / kH;
    int64_t shared = 0;
    if (c.family == ModelFamily::hf_llama) {
      shared = round(kS * 8) + 2 * round(kS * hd * e);
      if (c.attention == AttentionImpl::eager) shared += round(kS * (kS + 1) * e);
    }
    if (c.family == ModelFamily::megatron) shared = round(kB * kS * kS);
    CHECK(model_peak(costs, plan) <= peak);
    CHECK(peak - model_peak(costs, plan) <= shared);
  }
}

TEST_CASE("memsim compare and optimize run hf-gpt2, hf-llama and megatron scenarios", "[checkpoint][cli]") {
  namespace fs = std::filesystem;
  const std::string models[] = {
      "  family: hf-gpt2\n  layers: 4\n  d_model: 64\n  heads: 4\n  d_ff: 256\n  vocab: 96\n"
      "  context_length: 128\n",
      "  family: hf-llama\n  layers: 4\n  d_model: 64\n  heads: 4\n  kv_heads: 2\n  d_ff: 172\n"
      "  vocab: 96\n",
      "  family: megatron\n  layers: 4\n  d_model: 64\n  heads: 4\n  d_ff: 256\n  vocab: 96\n"
      "  context_length: 128\n  dropout: 0.1\n  tied_embeddings: true\n"};
  for (const std::string& model : models) {
    INFO(model);
    const fs::path file =
        fs::temp_directory_path() / ("memsim_ckpt_family_" + std::to_string(::getpid()) + ".yaml");
    std::ofstream(file) << "model:\n" << model
                        << "batch:\n  micro_batch: 4\n  seq_len: 128\n"
                           "precision:\n  params: bf16\n"
                           "step:\n  warmup_steps: 1\n"
                           "device:\n  capacity: 1GiB\n  cuda_context: 0\n  cublas_workspace: 0\n  kernel_scratch: false\n";
    const std::string cmd = memsim_test::memsim_command();
    const auto compare = memsim_test::run_shell(
        cmd + "compare '" + file.string() + "' --policies none,full,selective --json - 2>&1");
    REQUIRE(compare.status == 0);
    const nlohmann::json j = nlohmann::json::parse(compare.out);
    REQUIRE(j["policies"].size() == 3);
    CHECK(j["policies"][0]["flops"]["recompute"] == 0);
    CHECK(j["policies"][1]["flops"]["recompute"].get<double>() > 0);
    CHECK(j["policies"][2]["flops"]["recompute"].get<double>() > 0);
    CHECK(j["policies"][1]["recompute_share"].get<double>() >
          j["policies"][2]["recompute_share"].get<double>());

    const auto none = memsim_test::run_shell(cmd + "run '" + file.string() + "' --json - 2>/dev/null");
    REQUIRE(none.status == 0);
    const uint64_t peak = nlohmann::json::parse(none.out)["peak_reserved_bytes"];
    const auto opt = memsim_test::run_shell(cmd + "optimize '" + file.string() + "' --budget " +
                                            std::to_string(peak * 9 / 10) + " --json - 2>/dev/null");
    INFO(opt.out);
    REQUIRE((opt.status == 0 || opt.status == 3));
    const nlohmann::json o = nlohmann::json::parse(opt.out);
    if (o["found"] == true) {
      CHECK(o["peak_reserved_bytes"].get<uint64_t>() <= peak * 9 / 10);
      CHECK(o["flops"]["recompute"].get<double>() > 0);
    }
    fs::remove(file);
  }
}

TEST_CASE("optimize keeps the scenario's checkpoint.reentrant for every plan it simulates",
          "[optimize]") {
  // A reentrant checkpoint holds its re-run's output until the region's backward is done
  // (graph/checkpoint.h): plans must be calibrated and verified that way, or the plan
  // returned behaves differently once written into the user's scenario.
  Scenario s = small(ModelFamily::hf_llama, AttentionImpl::eager);
  s.model.d_model = 256;  // hidden states large enough to show in the peak
  s.model.d_ff = 1024;
  s.batch.seq_len = s.model.context_length = 256;
  s.checkpoint.reentrant = true;
  s.optimizer.type = OptimizerType::none;  // activations decide the peak
  s.step.kind = StepKind::forward_backward;
  const TrainingScript script = default_script(s);
  auto peak_allocated = [&](const Scenario& sc) {
    const Program p = build_program(sc, script);
    SimulatedDevice device(uint64_t{1} << 40, 0);
    return analyze(p, execute(p, sc.allocator, device)).peak_allocated;
  };
  Scenario full = with_policy(s, "full");
  full.checkpoint.reentrant = true;
  Scenario full_plain = full;
  full_plain.checkpoint.reentrant = false;
  REQUIRE(peak_allocated(full) > peak_allocated(full_plain));  // the held output shows

  CheckpointPlan all;
  all.layers.assign(kLayers, LayerCheckpoint::layer);
  CHECK(simulate_plan(s, script, all, 0).analysis.peak_allocated == peak_allocated(full));
  // The calibration sees it too: the modelled peak of the all-checkpointed plan is the
  // simulated one's lower bound within the allocator's rounding (few 512-byte blocks),
  // not a hidden state below it.
  const LayerCosts costs = calibrate(s, script, {LayerCheckpoint::keep, LayerCheckpoint::layer});
  const int64_t hidden = static_cast<int64_t>(kB * 256 * 256 * 4);
  CHECK(model_peak(costs, all) <= static_cast<int64_t>(peak_allocated(full)));
  CHECK(model_peak(costs, all) > static_cast<int64_t>(peak_allocated(full)) - hidden / 2);

  // optimize's answer, written into the scenario and run the ordinary way, fits.
  CheckpointPlan keep;
  keep.layers.assign(kLayers, LayerCheckpoint::keep);
  const uint64_t hi = simulate_plan(s, script, keep, 0).analysis.peak_reserved;
  const uint64_t lo = simulate_plan(s, script, all, 0).analysis.peak_reserved;
  REQUIRE(lo < hi);
  const uint64_t budget = lo + (hi - lo) / 2;
  const OptimizeResult r = optimize_checkpointing(s, script, budget);
  REQUIRE(r.fits);
  Scenario planned = s;
  planned.checkpoint = config_for_plan(r.plan);
  planned.checkpoint.reentrant = true;
  const Program p = build_program(planned, script);
  SimulatedDevice device(budget, 0);
  const Analysis a = analyze(p, execute(p, planned.allocator, device));
  CHECK(a.fits());
  CHECK(r.run.analysis.peak_allocated == a.peak_allocated);
  CHECK(r.run.analysis.peak_reserved == a.peak_reserved);
}
