// torchtitan's selective activation checkpointing (checkpoint.policy sac-op and
// sac-layer:N; sim/step/torchtitan_checkpoint.h, graph/checkpoint.h "Selective
// checkpointing"): against the torch 1.13 CPU stand-in of tests/data/torchtitan/
// sac_hf_llama.json (tools/fixtures/gen_torchtitan_sac_fixtures.py, the hf-llama stand-in
// with eager attention: only the every-other-mm rule runs there), against hand arithmetic
// for the SDPA rule (no CPU torch has it), and the refusals.
#include <catch2/catch.hpp>

#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "json_test_support.h"
#include "sim/check/numeric_check.h"
#include "sim/step/checkpoint_policy.h"
#include "sim/step/schedule.h"
#include "sim/step/torchtitan_checkpoint.h"
#include "step_measure_test_support.h"
#include "test_paths.h"

using namespace memsim;

namespace {

using memsim_test::measure_step;

nlohmann::json sac_fixture() {
  return memsim_test::load_json(MEMSIM_SOURCE_DIR + "/tests/data/torchtitan/sac_hf_llama.json");
}

// The fixture's step: no optimizer, no warm-up, no cuBLAS workspaces (a CPU run).
Scenario fixture_scenario(const nlohmann::json& fx) {
  Scenario s;
  s.optimizer.type = OptimizerType::none;
  s.step.warmup_steps = 0;
  s.device.cublas_workspace = 0;
  s.device.kernel_scratch = false;
  memsim_test::apply_hf_fixture_config(s, fx["family"], fx["config"]);
  return s;
}

struct Run {
  Program program;
  memsim_test::StepMeasure m;
};

Run run_policy(Scenario s, const std::string& policy, bool early_stop) {
  s.checkpoint = parse_policy(policy);
  TrainingScript script = default_script(s);
  script.loss = LossImpl::torch;
  script.checkpoint_early_stop = early_stop;  // the non-torchtitan policies' torch
  Run r{build_program(s, script), {}};
  r.m = measure_step(r.program);
  return r;
}

std::string error_of(const std::string& yaml,
                     const std::vector<std::pair<std::string, std::string>>& overrides) {
  try {
    Scenario s = load_scenario_text(yaml, "titan.yaml", overrides);
    build_program(s);
  } catch (const ScenarioError& e) {
    return e.what();
  }
  return "";
}

const char* kLlama =
    "model: {family: hf-llama, layers: 4, d_model: 64, heads: 4, kv_heads: 2, d_ff: 172, "
    "vocab: 96, context_length: 64, tied_embeddings: false}\n"
    "batch: {micro_batch: 2, seq_len: 32}\n"
    "optimizer: {type: none}\n"
    "device: {capacity: 1GiB}\n";

}  // namespace

TEST_CASE("sac-layer:N checkpoints torchtitan's layers (counter % N == 0)", "[torchtitan][sac]") {
  // _apply_layer_sac: _layer_sac_count is 1 for the first block.
  const graph::CheckpointPlan p3 = make_plan(parse_policy("sac-layer:3"), 8);
  std::string which;
  for (size_t l = 0; l < p3.layers.size(); ++l)
    which += p3.layers[l] == graph::LayerCheckpoint::layer ? 'C' : '.';
  CHECK(which == "..C..C..");
  const graph::CheckpointPlan p1 = make_plan(parse_policy("sac-layer:1"), 3);
  for (auto c : p1.layers) CHECK(c == graph::LayerCheckpoint::layer);
  CHECK_FALSE(p1.selective.any());
  const graph::CheckpointPlan op = make_plan(parse_policy("sac-op"), 3);
  for (auto c : op.layers) CHECK(c == graph::LayerCheckpoint::layer);
  CHECK(op.selective.rule[static_cast<size_t>(graph::OpKind::mm_linear)] == graph::SacRule::save_odd);
  CHECK(op.selective.rule[static_cast<size_t>(graph::OpKind::sdpa_flash)] == graph::SacRule::save);
  CHECK(op.selective.rule[static_cast<size_t>(graph::OpKind::addmm)] == graph::SacRule::recompute);
  CHECK(policy_label(parse_policy("sac-layer:2")) == "sac-layer:2");
  CHECK_THROWS_AS(parse_policy("sac-layer"), PolicyError);
  CHECK_THROWS_AS(parse_policy("sac-op:2"), PolicyError);
}

TEST_CASE("torchtitan SAC matches the torch 1.13 stand-in (hf-llama, 4 layers)",
          "[torchtitan][sac]") {
  const nlohmann::json fx = sac_fixture();
  const Scenario s = fixture_scenario(fx);
  std::printf("\n| hf-llama policy | forward end real | predicted | step peak real | predicted |\n");
  std::printf("|---|---:|---:|---:|---:|\n");
  uint64_t none_fwd = 0, full_fwd = 0, none_peak = 0, full_peak = 0;
  for (const nlohmann::json& row : fx["policies"]) {
    const std::string policy = row["policy"];
    INFO("policy " << policy);
    const Run r = run_policy(s, policy, fx["early_stop"]);
    std::printf("| %s | %llu | %llu | %llu | %llu |\n", policy.c_str(),
                static_cast<unsigned long long>(row["live_at_forward_end"].get<uint64_t>()),
                static_cast<unsigned long long>(r.m.forward_end),
                static_cast<unsigned long long>(row["step_peak"].get<uint64_t>()),
                static_cast<unsigned long long>(r.m.peak));
    CHECK(r.m.before_forward == row["before_forward"].get<uint64_t>());
    CHECK(r.m.forward_end == row["live_at_forward_end"].get<uint64_t>());
    CHECK(r.m.after_backward == row["after_backward"].get<uint64_t>());
    CHECK(r.m.peak == row["step_peak"].get<uint64_t>());
    if (policy == "none") none_fwd = r.m.forward_end, none_peak = r.m.peak;
    if (policy == "full") full_fwd = r.m.forward_end, full_peak = r.m.peak;
    if (policy == "sac-op") {
      // Between no checkpointing and full checkpointing.
      CHECK(full_fwd < r.m.forward_end);
      CHECK(r.m.forward_end < none_fwd);
      CHECK(full_peak <= r.m.peak);
      CHECK(r.m.peak <= none_peak);
      // Hand arithmetic: each layer's cache holds the outputs of its 1st, 3rd, 5th and 7th
      // mm: q_proj (B,S,H*hd), v_proj (B,S,KV*hd), gate_proj (B,S,F), down_proj (B,S,D).
      const nlohmann::json& c = fx["config"];
      const uint64_t rows = c["batch"].get<uint64_t>() * c["seq"].get<uint64_t>();
      const uint64_t D = c["d_model"], F = c["d_ff"];
      const uint64_t kv = D / c["heads"].get<uint64_t>() * c["kv_heads"].get<uint64_t>();
      const uint64_t per_layer = rows * (D + kv + F + D) * 4;
      for (const auto& b : row["cached_bytes_per_layer"]) CHECK(b.get<uint64_t>() == per_layer);
      CHECK(r.m.forward_end - full_fwd == c["layers"].get<uint64_t>() * per_layer);
    }
  }
}

TEST_CASE("sac-op recomputes what it does not save (FLOPs and the k/o/up projections)",
          "[torchtitan][sac]") {
  const nlohmann::json fx = sac_fixture();
  const Scenario s = fixture_scenario(fx);
  const Run full = run_policy(s, "full", false);
  const Run sac = run_policy(s, "sac-op", false);
  const nlohmann::json& c = fx["config"];
  const double rows = c["batch"].get<double>() * c["seq"].get<double>();
  const double D = c["d_model"], F = c["d_ff"];
  const double kv = D / c["heads"].get<double>() * c["kv_heads"].get<double>();
  // The saved mms (q, v, gate, down) are not re-run: 2*rows*in*out FLOPs each, per layer.
  const double saved = 2 * rows * (D * D + D * kv + D * F + F * D) * c["layers"].get<double>();
  CHECK(full.program.flops.recompute - sac.program.flops.recompute == Approx(saved));
  CHECK(sac.program.flops.forward == full.program.flops.forward);
}

TEST_CASE("sac-op saves SDPA flash outputs (hand arithmetic, bf16)", "[torchtitan][sac]") {
  // No CPU torch has the SDPA ops: the rule is the source's (_op_sac_save_list holds
  // aten._scaled_dot_product_flash_attention; all its outputs are cached: out (B,H,S,hd)
  // and softmax_lse (B,H,S) fp32).
  const std::string yaml = std::string(kLlama) + "precision: {params: bf16}\n";
  for (const char* attention : {"flash", "mem-efficient"}) {
    INFO(attention);
    auto fwd_end = [&](const char* policy) {
      Scenario sc = load_scenario_text(yaml, "titan.yaml",
                                       {{"model.attention", attention},
                                        {"checkpoint.policy", policy}});
      return measure_step(build_program(sc)).forward_end;
    };
    const uint64_t B = 2, S = 32, D = 64, H = 4, hd = 16, KV = 2, F = 172, L = 4;
    const uint64_t lse_seq = std::string(attention) == "flash" ? S : (S + 31) / 32 * 32;
    const uint64_t mm = B * S * (D + KV * hd + F + D) * 2;
    const uint64_t sdpa = B * H * S * hd * 2 + B * H * lse_seq * 4;
    const uint64_t full = fwd_end("full"), sac = fwd_end("sac-op"), none = fwd_end("none");
    CHECK(sac - full == L * (mm + sdpa));
    CHECK(sac < none);
  }
}

TEST_CASE("torchtitan SAC: early stop defaults off, the key and the refusals",
          "[torchtitan][sac]") {
  // torchtitan's ActivationCheckpointConfig.early_stop is false; with early stop the re-run
  // ends at the last saved tensor, whose later cached outputs stay with the frame.
  Scenario a = load_scenario_text(kLlama, "t.yaml", {{"checkpoint.policy", "sac-op"}});
  Scenario b = load_scenario_text(kLlama, "t.yaml", {{"checkpoint.policy", "sac-op"},
                                                     {"checkpoint.early_stop", "false"}});
  Scenario c = load_scenario_text(kLlama, "t.yaml", {{"checkpoint.policy", "sac-op"},
                                                     {"checkpoint.early_stop", "true"}});
  CHECK_FALSE(b.checkpoint.early_stop.value());
  const Program pa = build_program(a), pb = build_program(b), pc = build_program(c);
  CHECK(pa.events.size() == pb.events.size());
  CHECK(pa.flops.recompute == pb.flops.recompute);
  // down_proj (the 7th mm) is cached, so stopping at its saves skips no FLOPs, only the
  // residual add after it; its cache entry is never consumed and dies with the frame.
  CHECK(pc.flops.recompute == pa.flops.recompute);
  CHECK(pc.events.size() < pa.events.size());

  CHECK_THAT(error_of(kLlama, {{"checkpoint.policy", "sac-layer"}}),
             Catch::Contains("checkpoint.policy") && Catch::Contains("sac-layer:N"));
  CHECK_THAT(error_of(kLlama, {{"checkpoint.policy", "sac-layer:9"}}),
             Catch::Contains("checkpoint.policy") && Catch::Contains("more than"));
  CHECK_THAT(error_of(kLlama, {{"checkpoint.policy", "sac-op"}, {"checkpoint.reentrant", "true"}}),
             Catch::Contains("checkpoint.reentrant") && Catch::Contains("non-reentrant"));
  CHECK_THAT(error_of(kLlama, {{"checkpoint.policy", "sac-op"}, {"lora.rank", "8"}, {"lora.targets", "q_proj"}}),
             Catch::Contains("lora.rank"));
  CHECK_THAT(error_of("model: {family: cs336, layers: 2, d_model: 64, heads: 4, d_ff: 256, "
                      "vocab: 512}\nbatch: {micro_batch: 2, seq_len: 32}\n",
                      {{"checkpoint.policy", "sac-op"}}),
             Catch::Contains("checkpoint.policy") && Catch::Contains("hf-"));
  CHECK(error_of(kLlama, {{"checkpoint.policy", "sac-layer:2"}}).empty());
  CHECK(error_of(kLlama, {{"checkpoint.policy", "sac-op"}}).empty());
}

TEST_CASE("torchtitan SAC is bit-identical to no checkpointing in numeric mode",
          "[torchtitan][sac][numeric]") {
  // The cache hands the re-run the forward's own storages: if it handed the wrong one (or
  // freed one early) the gradients would differ from policy none.
  for (const char* attention : {"eager", "flash", "mem-efficient"}) {
    INFO(attention);
    Scenario s = load_scenario_text(
        "model: {family: hf-llama, layers: 3, d_model: 32, heads: 4, kv_heads: 2, d_ff: 48, "
        "vocab: 40, context_length: 16}\n"
        "batch: {micro_batch: 2, seq_len: 8}\n"
        "optimizer: {type: adamw}\n"
        "step: {warmup_steps: 1}\n",
        "tiny.yaml", {{"model.attention", attention}});
    NumericCheckOptions o;
    o.policies = {"sac-op", "sac-layer:2", "sac-layer:1"};
    const NumericCheckReport r = run_numeric_check(s, o);
    REQUIRE(r.policies.size() == 3);
    for (const PolicyCheck& p : r.policies) {
      INFO(p.policy << " " << p.error);
      CHECK(p.identical);
    }
  }
}

TEST_CASE("sac-op under FSDP2: Llama 3 8B's per-layer cache over full checkpointing",
          "[torchtitan][sac][fsdp2]") {
  // scenarios/llama3-8b-torchtitan-sac.yaml (torchtitan's llama3_8b shape): the forward
  // ends with each of the 32 layers' cache live on top of what full checkpointing keeps:
  // q_proj (8192 x 4096), v_proj (8192 x 1024), gate_proj (8192 x 14336), down_proj
  // (8192 x 4096) in bf16, the SDPA output (8192 x 4096 bf16) and logsumexp (32 x 8192 fp32).
  const std::string path = MEMSIM_SOURCE_DIR + "/scenarios/llama3-8b-torchtitan-sac.yaml";
  const Scenario sac = load_scenario(path);
  const Scenario full = load_scenario(path, {{"checkpoint.policy", "full"}});
  const uint64_t S = 8192;
  const uint64_t per_layer = S * (4096 + 1024 + 14336 + 4096) * 2 + S * 4096 * 2 + 32 * S * 4;
  CHECK(per_layer == 433ull << 20);
  const auto m_sac = measure_step(build_program(sac));
  const auto m_full = measure_step(build_program(full));
  CHECK(m_sac.forward_end - m_full.forward_end == 32 * per_layer);
  CHECK(m_sac.after_backward == m_full.after_backward);
}
