// parallel.accelerate_version >= 1.14 with model.tied_embeddings (scenario/
// accelerate_tied_head.h, sim/parallel/fsdp2_layout.h; docs/fsdp2.md "Tied embeddings under
// 1.14"). No GPU and no CPU FSDP2 back these numbers (torch 1.13 has no fully_shard): the
// group sizes and the order of all-gathers, frees and reduce-scatters are hand arithmetic from
// huggingface/accelerate v1.14.0 (beb0672a) src/accelerate/utils/fsdp_utils.py lines 751-805
// (the tied tail, the root, the re-tie after fsdp2_load_full_state_dict) and torch 2.11's
// _fully_shard (_fully_shard.py fully_shard: a call's parameters are those of its managed
// modules; _fsdp_param_group.py _get_param_module_infos: only the call's modules get the
// sharded parameter; _fsdp_state.py _register_group_forward_hooks: a group's post-forward
// after its last module; _fsdp_param.py reset_sharded_param), on docs/fsdp2.md's 2-layer
// worked example (D 256, F 1000, vocab 1001, 4 ranks) with Accelerate >= 1.8's bf16 policy
// and cpu_ram_efficient_loading (parallel.fsdp_init: cpu).
#include <catch2/catch.hpp>

#include <map>
#include <string>
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
using memsim_test::kind;
using memsim_test::live_at;

const std::string kAcc = kPolicy + "  fsdp_output_dtype: bf16\n  fsdp_init: cpu\n";
const std::string kTied = "  tied_embeddings: true\n";

std::string tied_text(const std::string& version, const std::string& parallel_extra = "",
                      const std::string& extra = "") {
  std::string parallel = kAcc + parallel_extra;
  if (!version.empty()) parallel += "  accelerate_version: \"" + version + "\"\n";
  return worked_text("", parallel, kTied, extra);
}
Program tied_program(const std::string& version, const std::string& extra = "") {
  return build_program(load_scenario_text(tied_text(version, "", extra), "tied.yaml"));
}

std::string load_error(const std::string& text) {
  try {
    build_program(load_scenario_text(text, "tied.yaml"));
  } catch (const ScenarioError& e) {
    return e.what();
  }
  return "";
}

// Hand arithmetic, 4 ranks, bf16 all-gathers (2 B), fp32 shards (4 B). Elements (dim 0
// padded to a multiple of 4: vocab 1001 -> 1004 rows):
//   block 1,030,656; [model.norm, model.embed_tokens] 256 + 1004 x 256 = 257,280; the root
//   lm_head.weight (the tied matrix) 257,024.
constexpr uint64_t kBlock = 4 * 65536 + 3 * 256000 + 2 * 256;  // 1,030,656
constexpr uint64_t kMatrix = 1004 * 256;                       // 257,024
constexpr uint64_t kTail = 256 + kMatrix;                      // 257,280

const char* const kTailLabel = "[model.norm, model.embed_tokens]";

// The measured step's FSDP2 events of interest (fsdp2_accelerate_test_support.h).
std::vector<std::string> order(const Program& p) { return memsim_test::accelerate::fsdp2_order(p, "other ", "head"); }

}  // namespace

TEST_CASE("Accelerate 1.14, tied embeddings: [model.norm, model.embed_tokens] one group, "
          "lm_head.weight the root's, one shard of the tied matrix",
          "[fsdp2][accelerate][accelerate_tied]") {
  const Program p = tied_program("1.14");
  std::map<std::string, int> ag_count, rs_count;
  std::map<std::string, uint64_t> ag_bytes, rs_bytes;
  for (const MemoryEvent& e : p.events) {
    if (e.type != EventType::alloc) continue;
    const std::string n = p.str(p.tensors[e.tensor].name);
    if (n.rfind("FSDP2 all-gather output (flat) of ", 0) == 0) {
      ++ag_count[n.substr(34)];
      ag_bytes[n.substr(34)] = e.bytes;
    }
    if (n.rfind("FSDP2 reduce-scatter input (chunk_cat) of ", 0) == 0) {
      ++rs_count[n.substr(42)];
      rs_bytes[n.substr(42)] = e.bytes;
    }
  }
  // Two steps. The group and the root are gathered once per step (kept: False / the root's
  // None), the blocks twice; every group reduce-scatters once (bf16: full x 2 B).
  CHECK(ag_count[kTailLabel] == 2);
  CHECK(ag_bytes[kTailLabel] == kTail * 2);
  CHECK(ag_count["the root"] == 2);
  CHECK(ag_bytes["the root"] == kMatrix * 2);
  CHECK(ag_count["block 0"] == 4);
  CHECK(ag_bytes["block 0"] == kBlock * 2);
  CHECK(rs_count["the root"] == 2);
  CHECK(rs_bytes["the root"] == kMatrix * 2);
  CHECK(rs_count[kTailLabel] == 2);
  CHECK(rs_bytes[kTailLabel] == kTail * 2);
  CHECK(rs_count["block 1"] == 2);
  // One fp32 shard of the tied matrix (the state dict's separate lm_head shard is dropped
  // when Accelerate re-ties, before training): the same shard bytes as the tied model under
  // <= 1.13, where the root holds it once.
  const Program p13 = tied_program("1.13");
  const uint64_t shards = (2 * kBlock + kTail) / 4 * 4;
  CHECK(kind(live_at(p, "optimizer_end"), TensorKind::parameter) == shards);
  CHECK(kind(live_at(p13, "optimizer_end"), TensorKind::parameter) == shards);
  // Gradients after the step: the embedding shard's .grad is the root's reduce-scatter
  // output (its lm_head gradient, fp32 257,024 x 4 / 4 B), the group's output (norm and
  // embedding, added into it) stays alive as the norm's .grad view: one 257,024-element
  // fp32 shard more than the tied model's single gradient under <= 1.13.
  CHECK(kind(live_at(p, "backward_end"), TensorKind::gradient) ==
        (2 * kBlock + kMatrix + kTail) / 4 * 4);
  CHECK(kind(live_at(p13, "backward_end"), TensorKind::gradient) == (2 * kBlock + kTail) / 4 * 4);
}

TEST_CASE("Accelerate 1.14, tied embeddings: the order of all-gathers, frees and "
          "reduce-scatters", "[fsdp2][accelerate][accelerate_tied]") {
  // Forward: the root's pre-forward gathers lm_head's weight (a copy of the tied matrix),
  // the group's pre-forward (at the embedding) gathers the norm and the embedding (its
  // copy-out frees the root's flat output); both stay gathered. No copy-out follows block
  // 1's, so its flat output lives until the root's post-forward (after the loss).
  // Backward: the root's hook (the loss) prefetches the group (gathered: nothing); the
  // group's hook sits on the final norm's output, so block 1 is prefetched after the LM
  // head's backward; the embedding's backward follows block 0's post-backward. The final
  // callback: the root (lm_head's unsharded weight freed, its gradient reduced), then the
  // group (both unsharded weights freed, norm and embedding reduced).
  CHECK(order(tied_program("1.14")) ==
        std::vector<std::string>{"ag fwd the root", "+fwd head", "ag fwd [model.norm, model.embed_tokens]",
                                 "+fwd embed", "ag fwd block 0", "ag fwd block 1", "ag bwd block 1",
                                 "ag bwd block 0", "rs block 1", "rs block 0", "-bwd head",
                                 "rs the root", "-bwd embed", "rs [model.norm, model.embed_tokens]"});
  // Accelerate <= 1.13 (one tied parameter in the root, resharded after the loss and
  // gathered again at its backward) for comparison.
  CHECK(order(tied_program("1.13")) ==
        std::vector<std::string>{"ag fwd the root", "+fwd embed", "ag fwd block 0", "ag fwd block 1",
                                 "-other embed", "ag bwd the root", "+bwd embed", "ag bwd block 1",
                                 "ag bwd block 0", "rs block 1", "rs block 0", "-bwd embed",
                                 "rs the root"});
  // Where block 1's prefetch goes: after the LM head's backward allocations (the group's
  // pre-backward hook is on the final norm's output), before the final norm's; the untied
  // model's [model.norm, lm_head] prefetches it at the LM head's first backward op.
  auto prefetch_after_head = [](const Program& p) {
    bool on = false, head_seen = false;
    for (const MemoryEvent& e : p.events) {
      if (e.type == EventType::mark && p.str(static_cast<uint32_t>(e.bytes)) == "measured_step_begin") on = true;
      if (!on || e.phase != Phase::backward || e.type != EventType::alloc) continue;
      const std::string n = p.str(p.tensors[e.tensor].name);
      if (n == "FSDP2 all-gather output (flat) of block 1") return head_seen;
      if (n.rfind("FSDP2", 0) != 0 && p.tensors[e.tensor].module == static_cast<uint8_t>(graph::Module::head))
        head_seen = true;
    }
    return false;
  };
  CHECK(prefetch_after_head(tied_program("1.14")));
  const std::string untied = worked_text("", kAcc + "  accelerate_version: \"1.14\"\n");
  CHECK_FALSE(prefetch_after_head(build_program(load_scenario_text(untied, "u.yaml"))));
  // At forward end (after the LM head, before the loss) above the shards: the root's
  // lm_head copy (257,024 x 2 B), the group's norm and embedding (257,280 x 2 B) and block
  // 1's flat output (1,030,656 x 2 B); <= 1.13 holds the tied root once (257,280 x 2 B) and
  // block 1's flat output: 514,048 B less.
  const uint64_t shards = (2 * kBlock + kTail) / 4 * 4;
  const uint64_t f14 = kind(live_at(tied_program("1.14"), "forward_end"), TensorKind::parameter);
  const uint64_t f13 = kind(live_at(tied_program("1.13"), "forward_end"), TensorKind::parameter);
  CHECK(f14 == shards + kMatrix * 2 + kTail * 2 + kBlock * 2);
  CHECK(f13 == shards + kTail * 2 + kBlock * 2);
  CHECK(f14 - f13 == 514048);
}

TEST_CASE("Accelerate 1.14, tied embeddings: what is refused", "[fsdp2][accelerate][accelerate_tied]") {
  CHECK(load_error(tied_text("1.14")).empty());
  // Without cpu_ram_efficient_loading Accelerate never re-ties lm_head: the root keeps a
  // shard of its own that the optimizer never steps.
  std::string gpu = tied_text("1.14");
  gpu.replace(gpu.find("  fsdp_init: cpu\n"), 16, "");
  CHECK(load_error(gpu).find("parallel.fsdp_init") != std::string::npos);
  CHECK(load_error(tied_text("1.14", "  cpu_offload: true\n")).find("parallel.cpu_offload") !=
        std::string::npos);
  std::string lora = worked_text("", "  fsdp_init: cpu\n  accelerate_version: \"1.14\"\n", kTied,
                                 "lora:\n  rank: 8\n  targets: [q_proj, v_proj]\n");
  CHECK(load_error(lora).find("lora.rank") != std::string::npos);
  // <= 1.13 groups a tied model as before (the key's own rows).
  std::string gpu13 = tied_text("1.13");
  gpu13.replace(gpu13.find("  fsdp_init: cpu\n"), 16, "");
  CHECK(load_error(gpu13).empty());
}

TEST_CASE("memsim run: Llama-3.2-3B (tied) through HF Trainer + Accelerate 1.14 FSDP2 bf16 on 8 H100",
          "[fsdp2][accelerate][accelerate_tied][cli][scenarios]") {
  const std::string file =
      MEMSIM_SOURCE_DIR + "/scenarios/llama3.2-3b-hf-trainer-fsdp2-bf16-accelerate1.14-8xh100.yaml";
  const Scenario s = load_scenario(file);
  REQUIRE(s.model.tied_embeddings);
  CHECK(s.parallel.accelerate_version == 114);
  const nlohmann::json cur = memsim_test::run_json(file, "");
  CHECK(cur["fits"] == true);
  const nlohmann::json old = memsim_test::run_json(file, "--set parallel.accelerate_version=1.13");
  // The second gathered copy of the tied matrix (the root's lm_head) and the second
  // unsharded gradient cost more than 1.13's re-gather of the root saves.
  CHECK(cur["peak_allocated_bytes"].get<uint64_t>() > old["peak_allocated_bytes"].get<uint64_t>());
  // At forward end the difference is the root's copy of lm_head: 128,256 x 3,072 x 2 B
  // (8 ranks divide 128,256 rows: no padding).
  Scenario s13 = s;
  s13.parallel.accelerate_version = 113;
  const uint64_t f14 = kind(live_at(build_program(s), "forward_end"), TensorKind::parameter);
  const uint64_t f13 = kind(live_at(build_program(s13), "forward_end"), TensorKind::parameter);
  CHECK(f14 - f13 == 128256ull * 3072ull * 2ull);
  // Without cpu_ram_efficient_loading: refused by key, naming the file.
  const memsim_test::CommandResult gpu = memsim_test::run_shell(
      memsim_test::memsim_command() + "run '" + file + "' --set parallel.fsdp_init=gpu 2>&1");
  CHECK(gpu.status == 1);
  CHECK(gpu.out.find("parallel.fsdp_init") != std::string::npos);
  CHECK(gpu.out.find("accelerate1.14-8xh100.yaml") != std::string::npos);
}
