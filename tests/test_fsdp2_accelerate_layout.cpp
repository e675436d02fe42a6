// parallel.accelerate_version: the modules Accelerate's fsdp2_prepare_model shards
// (sim/parallel/fsdp2_layout.h; docs/fsdp2.md "Accelerate's FSDP2 grouping"). No GPU and no
// CPU FSDP2 back these numbers: the group sizes and buffer counts are hand arithmetic from
// huggingface/accelerate's fsdp2_prepare_model (v1.13.0; v1.14.0 / 60b5c258; 16cb6eb8) and
// torch's _fully_shard rules (docs/fsdp2.md), on docs/fsdp2.md's 2-layer worked example
// (D 256, F 1000, vocab 1001, 4 ranks) with Accelerate >= 1.8's bf16 policy.
#include <catch2/catch.hpp>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_test_support.h"
#include "fsdp2_accelerate_test_support.h"
#include "live_at_mark_test_support.h"
#include "program/tensor_names.h"
#include "sim/step/schedule.h"
#include "test_paths.h"

using namespace memsim;

namespace {

using memsim_test::accelerate::kPolicy;
using memsim_test::accelerate::worked_text;
// Accelerate >= 1.8's MixedPrecisionPolicy for mixed_precision bf16.
const std::string kAcc = kPolicy + "  fsdp_output_dtype: bf16\n";

Scenario acc(const std::string& version, const std::string& extra_parallel = "",
             const std::string& model_extra = "", const std::string& extra = "") {
  std::string parallel = kAcc + extra_parallel;
  if (!version.empty()) parallel += "  accelerate_version: \"" + version + "\"\n";
  return load_scenario_text(worked_text("", parallel, model_extra, extra), "acc.yaml");
}

// Hand arithmetic, 4 ranks; torch.chunk pads dim 0 up to a multiple of 4 (chunk 0 is the
// largest): vocab 1001 rows -> 1004. Elements:
//   block: q, k, v, o 256 x 256, gate, up 1000 x 256, down 256 x 1000, two norms 256.
//   model.embed_tokens 1004 x 256; [model.norm, lm_head] 256 + 1004 x 256.
constexpr uint64_t kBlock = 4 * 65536 + 3 * 256000 + 2 * 256;  // 1,030,656
constexpr uint64_t kEmb = 1004 * 256;                          // 257,024
constexpr uint64_t kTail = 256 + 1004 * 256;                   // 257,280
constexpr uint64_t kRoot = kEmb + kTail;                       // the root of <= 1.13
constexpr uint64_t kWs = 4;

const char* const kLabels[] = {"block 0", "block 1", "model.embed_tokens", "[model.norm, lm_head]",
                               "the root"};

// Per group label: (phase, bytes) -> count of the named FSDP2 buffer over the whole program.
std::map<std::string, std::map<std::pair<Phase, uint64_t>, int>> per_group(const Program& p,
                                                                            const std::string& what) {
  std::map<std::string, std::map<std::pair<Phase, uint64_t>, int>> out;
  for (const char* g : kLabels) {
    const std::string name = what + " of " + g;
    for (const MemoryEvent& e : p.events)
      if (e.type == EventType::alloc && p.str(p.tensors[e.tensor].name) == name)
        ++out[g][{e.phase, e.bytes}];
  }
  return out;
}

int count(const std::map<std::pair<Phase, uint64_t>, int>& m) {
  int n = 0;
  for (const auto& [k, v] : m) n += v;
  return n;
}

std::string load_error(const std::string& text) {
  try {
    build_program(load_scenario_text(text, "acc.yaml"));
  } catch (const ScenarioError& e) {
    return e.what();
  }
  return "";
}

using memsim_test::kind;
using memsim_test::live_at;

// The measured step's events of the named FSDP2 buffers, as "phase name" in order.
std::vector<std::string> gathers(const Program& p) {
  const TensorNames names(p);
  std::vector<std::string> out;
  bool on = false;
  for (const MemoryEvent& e : p.events) {
    if (e.type == EventType::mark && p.str(static_cast<uint32_t>(e.bytes)) == "measured_step_begin") on = true;
    if (!on || e.type != EventType::alloc) continue;
    const std::string n = p.str(p.tensors[e.tensor].name);
    if (n.rfind("FSDP2 all-gather output (flat) of ", 0) != 0) continue;
    out.push_back(std::string(e.phase == Phase::backward ? "bwd " : "fwd ") + n.substr(34));
  }
  return out;
}

}  // namespace

TEST_CASE("Accelerate 1.14: the groups are each decoder layer, model.embed_tokens, "
          "[model.norm, lm_head] and a root without parameters", "[fsdp2][accelerate][accelerate_layout]") {
  const Scenario s = acc("1.14");
  CHECK(s.parallel.accelerate_version == 114);
  const Program p = build_program(s);
  // All-gathers in param_dtype bf16, the flat output = the group's full elements x 2 B, two
  // steps (warm-up, measured). Blocks and the embedding: forward, then again in backward
  // (reshard_after_forward True from the plugin); the tail only in forward (False); the
  // root none.
  auto ag = per_group(p, "FSDP2 all-gather output (flat)");
  CHECK(ag["block 0"][{Phase::forward, kBlock * 2}] == 2);
  CHECK(ag["block 0"][{Phase::backward, kBlock * 2}] == 2);
  CHECK(ag["block 1"][{Phase::forward, kBlock * 2}] == 2);
  CHECK(ag["block 1"][{Phase::backward, kBlock * 2}] == 2);
  CHECK(ag["model.embed_tokens"][{Phase::forward, kEmb * 2}] == 2);
  CHECK(ag["model.embed_tokens"][{Phase::backward, kEmb * 2}] == 2);
  CHECK(count(ag["model.embed_tokens"]) == 4);
  CHECK(ag["[model.norm, lm_head]"][{Phase::forward, kTail * 2}] == 2);
  CHECK(count(ag["[model.norm, lm_head]"]) == 2);
  CHECK(count(ag["the root"]) == 0);
  // Reduce-scatter once per group per step, reduce_dtype bf16: the input is full x 2 B.
  auto rs = per_group(p, "FSDP2 reduce-scatter input (chunk_cat)");
  CHECK(count(rs["block 0"]) == 2);
  CHECK(rs["block 0"][{Phase::backward, kBlock * 2}] == 2);
  CHECK(rs["model.embed_tokens"][{Phase::backward, kEmb * 2}] == 2);
  CHECK(rs["[model.norm, lm_head]"][{Phase::backward, kTail * 2}] == 2);
  CHECK(count(rs["the root"]) == 0);
  // The shards, their fp32 gradients and AdamW's moments cover every parameter once.
  const uint64_t shards = (2 * kBlock + kRoot) / kWs * 4;
  const auto end = live_at(p, "optimizer_end");
  CHECK(kind(end, TensorKind::parameter) >= shards);
  CHECK(kind(end, TensorKind::gradient) == shards);
}

TEST_CASE("Accelerate 1.14: the tail stays gathered after forward, the embedding is resharded "
          "and gathered again after block 0's backward", "[fsdp2][accelerate][accelerate_layout]") {
  const Program v14 = build_program(acc("1.14"));
  const Program v13 = build_program(acc("1.13"));
  const Program none = build_program(acc(""));
  // The measured step's all-gathers, in order. Forward: the embedding, the blocks, the tail
  // (at the final norm). Backward: the root's pre-backward gathers nothing (no parameter);
  // the tail's pre-backward (the logits' gradient) prefetches block 1, block 1's block 0,
  // block 0's the embedding (the group that post-forwarded before it).
  CHECK(gathers(v14) == std::vector<std::string>{
                            "fwd model.embed_tokens", "fwd block 0", "fwd block 1",
                            "fwd [model.norm, lm_head]", "bwd block 1", "bwd block 0",
                            "bwd model.embed_tokens"});
  // Accelerate <= 1.13: the root (embeddings, norm, lm_head) is given reshard_after_forward
  // True, which torch 2.11 honours: gathered in its pre-forward and again in its
  // pre-backward (which prefetches block 1). Without the key (the loop's own fully_shard(model),
  // default None) the root stays gathered.
  CHECK(gathers(v13) == std::vector<std::string>{"fwd the root", "fwd block 0", "fwd block 1",
                                                 "bwd the root", "bwd block 1", "bwd block 0"});
  CHECK(gathers(none) == std::vector<std::string>{"fwd the root", "fwd block 0", "fwd block 1",
                                                  "bwd block 1", "bwd block 0"});
  // Parameter bytes live at forward end (memsim's mark, after the LM head, before the loss
  // and the root's post-forward, which HF's model runs after its loss). The loop's own
  // layout and <= 1.13 hold the whole root gathered (514,304 x 2 B) and the last flat
  // all-gather output, block 1's (1,030,656 x 2 B: FSDP2 frees a forward all-gather output
  // at the next copy-out or in the root's post-forward); 1.14 holds the tail's unsharded
  // parameters (257,280 x 2 B) and its flat output, the last one (the same bytes): the
  // embedding was resharded after its forward, block 1's output freed at the tail's copy-out.
  const uint64_t shards = (2 * kBlock + kRoot) / kWs * 4;
  const uint64_t p14 = kind(live_at(v14, "forward_end"), TensorKind::parameter);
  const uint64_t p13 = kind(live_at(v13, "forward_end"), TensorKind::parameter);
  const uint64_t p0 = kind(live_at(none, "forward_end"), TensorKind::parameter);
  CHECK(p0 == p13);
  CHECK(p0 + 2 * kTail * 2 == p14 + kRoot * 2 + kBlock * 2);  // 2,060,800 B more in p0
  CHECK(p14 >= shards + 2 * kTail * 2);
  // Activations are the same layout-independent model's.
  CHECK(kind(live_at(v14, "forward_end"), TensorKind::activation) ==
        kind(live_at(none, "forward_end"), TensorKind::activation));
}

TEST_CASE("Accelerate's grouping composes with checkpointing, reshard_after_forward false "
          "and the 1.6 / 1.7 autocast path; tied embeddings under 1.14 need fsdp_init cpu", "[fsdp2][accelerate][accelerate_layout]") {
  // Full checkpointing: the recompute runs inside PRE_BACKWARD (FSDP2's pre-forward skips
  // it): the same all-gathers as without.
  const Program ck = build_program(acc("1.14", "", "", "checkpoint:\n  policy: full\n  reentrant: false\n"));
  CHECK(gathers(ck) == gathers(build_program(acc("1.14"))));
  // The plugin's reshard_after_forward false: every group (the embedding too) stays
  // gathered from forward to its post-backward; the tail was False anyway.
  const Program keep = build_program(acc("1.14", "  reshard_after_forward: false\n"));
  CHECK(gathers(keep) == std::vector<std::string>{"fwd model.embed_tokens", "fwd block 0",
                                                  "fwd block 1", "fwd [model.norm, lm_head]"});
  // <= 1.13 with false passes False to the root too: the loop's own layout's gathers.
  CHECK(gathers(build_program(acc("1.8", "  reshard_after_forward: false\n"))) ==
        gathers(build_program(acc("", "  reshard_after_forward: false\n"))));
  // Tied embeddings are modelled with cpu_ram_efficient_loading only (Accelerate re-ties
  // lm_head after loading: tests/test_fsdp2_accelerate_tied.cpp); without it, refused.
  CHECK(load_error(worked_text("", kAcc + "  accelerate_version: \"1.14\"\n", "  tied_embeddings: true\n"))
            .find("parallel.fsdp_init") != std::string::npos);
  CHECK(load_error(worked_text("", kAcc + "  accelerate_version: \"1.13\"\n", "  tied_embeddings: true\n")).empty());
  // Accelerate 1.7 (autocast + the policy): the root is given reshard_after_forward too.
  const std::string autocast = "  autocast: bf16\n";
  const Scenario a17 = load_scenario_text(
      worked_text(autocast, kAcc + "  accelerate_version: \"1.7\"\n"), "a17.yaml");
  CHECK(gathers(build_program(a17)) ==
        std::vector<std::string>{"fwd the root", "fwd block 0", "fwd block 1", "bwd the root",
                                 "bwd block 1", "bwd block 0"});
}

TEST_CASE("parallel.accelerate_version: bad values and settings Accelerate does not run are "
          "refused by key", "[fsdp2][accelerate][accelerate_layout][scenario]") {
  auto text = [](const std::string& version, const std::string& precision = "",
                 const std::string& parallel = kAcc, const std::string& extra = "") {
    return worked_text(precision, parallel + "  accelerate_version: " + version + "\n", "", extra);
  };
  CHECK(acc("1.14.0").parallel.accelerate_version == 114);
  CHECK(acc("1.15").parallel.accelerate_version == 115);
  CHECK(acc("none").parallel.accelerate_version == 0);
  CHECK(load_scenario_text(text("1.10"), "a.yaml").parallel.accelerate_version == 110);  // not 1.1
  for (const char* bad : {"\"1.5\"", "\"1.16\"", "latest", "\"2\"", "\"1.14x\"", "\"1.14.\"",
                          "\"+1.14\"", "\" 1.14\""})
    CHECK(load_error(text(bad)).find("parallel.accelerate_version") != std::string::npos);
  CHECK(load_error(text("\"1.5\"")).find("no FSDP2") != std::string::npos);
  // Another sharding.
  std::string fsdp1 = worked_text("", "", "");
  fsdp1.replace(fsdp1.find("sharding: fsdp2"), 15, "sharding: fsdp\n  accelerate_version: \"1.14\"");
  CHECK(load_error(fsdp1).find("parallel.accelerate_version") != std::string::npos);
  // The plugin's reshard_after_forward is a bool.
  CHECK(load_error(text("\"1.14\"", "", kAcc + "  reshard_after_forward: 2\n"))
            .find("parallel.accelerate_version") != std::string::npos);
  // >= 1.8 never autocasts an FSDP2 model; 1.6 / 1.7 always do with mixed precision.
  CHECK(load_error(text("\"1.8\"", "  autocast: bf16\n")).find("precision.autocast") != std::string::npos);
  CHECK(load_error(text("\"1.7\"")).find("precision.autocast") != std::string::npos);
  // LoRA under 1.14's grouping is modelled (tests/test_fsdp2_accelerate_lora.cpp); under
  // MixedPrecisionPolicy it is refused as for every FSDP2 loop.
  const std::string lora = "lora:\n  rank: 8\n  targets: [q_proj, v_proj]\n";
  CHECK(load_error(text("\"1.14\"", "", "", lora)).empty());
  CHECK(load_error(text("\"1.13\"", "", "", lora)).empty());
  CHECK(load_error(text("\"1.14\"", "", kAcc, lora)).find("parallel.fsdp_mixed_precision") !=
        std::string::npos);
  // Not transformers' model code.
  std::string titan = text("\"1.14\"");
  titan.replace(titan.find("family: hf-llama"), 16,
                "family: hf-llama\n  implementation: torchtitan\n  attention: flash");
  CHECK(load_error(titan).find("parallel.accelerate_version") != std::string::npos);
}

TEST_CASE("memsim run: Qwen2.5-7B through HF Trainer + Accelerate 1.14 FSDP2 bf16 on 8 H100",
          "[fsdp2][accelerate][accelerate_layout][cli][scenarios]") {
  const std::string file =
      MEMSIM_SOURCE_DIR + "/scenarios/qwen2.5-7b-hf-trainer-fsdp2-bf16-accelerate1.14-8xh100.yaml";
  const std::string old = MEMSIM_SOURCE_DIR + "/scenarios/qwen2.5-7b-hf-trainer-fsdp2-bf16-accelerate1.8-8xh100.yaml";
  const Scenario s = load_scenario(file);
  CHECK(s.parallel.accelerate_version == 114);
  CHECK(load_scenario(old).parallel.accelerate_version == 108);
  const nlohmann::json cur = memsim_test::run_json(file, "");
  CHECK(cur["fits"] == true);
  // The same job as the 1.8 file but for the key.
  const Program p = build_program(s);
  const Program p8 = build_program(load_scenario(old));
  // At forward end (before the loss) 1.8 holds the root gathered (embedding, norm, LM head:
  // 2,179,996,672 B) and the last block's flat all-gather output (233,057,792 x 2 =
  // 466,115,584 B); 1.14 the tail's unsharded parameters and flat output (1,090,001,920 B
  // each): 466,108,416 B less.
  const uint64_t root = (2 * 152064ull * 3584ull + 3584ull) * 2ull;
  const uint64_t tail = (152064ull * 3584ull + 3584ull) * 2ull;
  const uint64_t block = 233057792ull * 2ull;
  const uint64_t f14 = kind(live_at(p, "forward_end"), TensorKind::parameter);
  const uint64_t f8 = kind(live_at(p8, "forward_end"), TensorKind::parameter);
  CHECK(f8 + 2 * tail == f14 + root + block);
  CHECK(f8 - f14 == 466108416ull);
  // The peak (block 0's backward, the embedding gathered again) is below the 1.8 file's
  // (block 1's backward with the whole root gathered and lm_head's unsharded gradient
  // held until the final callback, where 1.14 reduce-scatters it after the final norm's
  // backward).
  const nlohmann::json old_run = memsim_test::run_json(old, "");
  CHECK(cur["peak_allocated_bytes"].get<uint64_t>() < old_run["peak_allocated_bytes"].get<uint64_t>());
  CHECK(cur["peak_event"]["layer"] == 0);
  // Refused by key, exit 1: a bad version (named where it was set), tied embeddings without
  // cpu_ram_efficient_loading (the file).
  const memsim_test::CommandResult bad = memsim_test::run_shell(
      memsim_test::memsim_command() + "run '" + file + "' --set parallel.accelerate_version=1.4 2>&1");
  CHECK(bad.status == 1);
  CHECK(bad.out.find("--set parallel.accelerate_version") != std::string::npos);
  const memsim_test::CommandResult tied = memsim_test::run_shell(
      memsim_test::memsim_command() + "run '" + file +
      "' --set model.tied_embeddings=true --set parallel.fsdp_init=gpu 2>&1");
  CHECK(tied.status == 1);
  CHECK(tied.out.find("parallel.fsdp_init") != std::string::npos);
  CHECK(tied.out.find("accelerate1.14-8xh100.yaml") != std::string::npos);
}
