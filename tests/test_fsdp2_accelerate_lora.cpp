// parallel.accelerate_version >= 1.14 with LoRA: Accelerate's fsdp2_prepare_model on a
// PeftModel (sim/parallel/fsdp2_layout.h; docs/fsdp2.md "Accelerate's FSDP2 grouping",
// "LoRA under 1.14"). No GPU and no CPU FSDP2 back these numbers (torch 1.13 has no
// fully_shard): the group sizes and the order of all-gathers, frees and reduce-scatters are
// hand arithmetic from huggingface/accelerate v1.14.0 (beb0672a) src/accelerate/utils/
// fsdp_utils.py lines 627-642 (_find_final_norm) and 751-774 (the embedding, the tail, the
// root), huggingface/peft 5d602fdb (PeftModel / LoraModel __getattr__), and torch 2.11's
// _fully_shard rules (docs/fsdp2.md), on docs/fsdp2.md's 2-layer worked example (D 256,
// F 1000, vocab 1001, 4 ranks), fp32 parameters (LoRA under MixedPrecisionPolicy is
// refused), LoRA r 8 on q_proj / v_proj.
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

using memsim_test::accelerate::worked_text;
using memsim_test::kind;
using memsim_test::live_at;

const std::string kLora = "lora:\n  rank: 8\n  targets: [q_proj, v_proj]\n";

Program lora_program(const std::string& version, const std::string& extra = "") {
  std::string parallel;
  if (!version.empty()) parallel = "  accelerate_version: \"" + version + "\"\n";
  return build_program(load_scenario_text(worked_text("", parallel, "", kLora + extra), "lora.yaml"));
}

// Hand arithmetic, 4 ranks, fp32 (4 B). torch.chunk pads dim 0 to a multiple of 4: vocab
// 1001 -> 1004 rows; lora_A (8 x 256) -> 8 rows, lora_B (256 x 8) -> 256 rows. Elements:
//   block: 1,030,656 frozen (q, k, v, o 256 x 256; gate, up 1000 x 256; down 256 x 1000;
//   two norms) + 2 x (8 x 256 + 256 x 8) = 8,192 adapters;
//   model.embed_tokens 1004 x 256; [lm_head] 1004 x 256; the root: model.norm 256.
constexpr uint64_t kBase = 4 * 65536 + 3 * 256000 + 2 * 256;  // 1,030,656
constexpr uint64_t kAdapters = 2 * (8 * 256 + 256 * 8);       // 8,192
constexpr uint64_t kBlock = kBase + kAdapters;                // 1,038,848
constexpr uint64_t kEmb = 1004 * 256;                         // 257,024
constexpr uint64_t kHead = 1004 * 256;                        // 257,024
constexpr uint64_t kNorm = 256;

// The measured step's FSDP2 events of interest (fsdp2_accelerate_test_support.h).
std::vector<std::string> order(const Program& p) { return memsim_test::accelerate::fsdp2_order(p, "opt ", "lm_head"); }

}  // namespace

// Per group label: (phase, bytes) -> count of the named FSDP2 buffer over the program.
std::map<std::string, std::map<std::pair<Phase, uint64_t>, int>> per_group(const Program& p,
                                                                            const std::string& what) {
  std::map<std::string, std::map<std::pair<Phase, uint64_t>, int>> out;
  for (const char* g : {"block 0", "block 1", "model.embed_tokens", "[lm_head]", "the root"}) {
    const std::string name = what + " of " + g;
    for (const MemoryEvent& e : p.events)
      if (e.type == EventType::alloc && p.str(p.tensors[e.tensor].name) == name) ++out[g][{e.phase, e.bytes}];
  }
  return out;
}

int count(const std::map<std::pair<Phase, uint64_t>, int>& m) {
  int n = 0;
  for (const auto& [k, v] : m) n += v;
  return n;
}

TEST_CASE("Accelerate 1.14 on a PeftModel: the groups are each decoder layer, "
          "model.embed_tokens, [lm_head] and a root holding the final norm",
          "[fsdp2][accelerate][accelerate_lora]") {
  const Program p = lora_program("1.14");
  // Two steps (warm-up, measured); fp32 all-gathers (no policy): the flat output is the
  // group's padded full elements x 4 B. Blocks and the (frozen) embedding: forward, then
  // in backward (the plugin's reshard_after_forward True); [lm_head] only in forward
  // (reshard_after_forward=False); the root (model.norm, kept gathered: reshard_after_forward
  // left at None) only in its pre-forward.
  auto ag = per_group(p, "FSDP2 all-gather output (flat)");
  for (const char* b : {"block 0", "block 1"}) {
    CHECK(ag[b][{Phase::forward, kBlock * 4}] == 2);
    CHECK(ag[b][{Phase::backward, kBlock * 4}] == 2);
    CHECK(count(ag[b]) == 4);
  }
  CHECK(ag["model.embed_tokens"][{Phase::forward, kEmb * 4}] == 2);
  // (block 0's pre-backward prefetches it; nothing waits for it without an embedding
  // backward: finalize_backward drops it in the final callback.)
  CHECK(ag["model.embed_tokens"][{Phase::backward, kEmb * 4}] == 2);
  CHECK(ag["[lm_head]"][{Phase::forward, kHead * 4}] == 2);
  CHECK(count(ag["[lm_head]"]) == 2);
  CHECK(ag["the root"][{Phase::forward, kNorm * 4}] == 2);
  CHECK(count(ag["the root"]) == 2);
  // Reduce-scatters: only the blocks hold trainable parameters (the adapters: 8,192 x 4 B);
  // a group with only frozen parameters reduces nothing.
  auto rs = per_group(p, "FSDP2 reduce-scatter input (chunk_cat)");
  CHECK(rs["block 0"][{Phase::backward, kAdapters * 4}] == 2);
  CHECK(rs["block 1"][{Phase::backward, kAdapters * 4}] == 2);
  CHECK(count(rs["block 0"]) == 2);
  CHECK(count(rs["model.embed_tokens"]) == 0);
  CHECK(count(rs["[lm_head]"]) == 0);
  CHECK(count(rs["the root"]) == 0);
  // The shards cover every parameter once; gradients and AdamW's moments only the adapters.
  const uint64_t shards = (2 * kBlock + kEmb + kHead + kNorm) / 4 * 4;
  const auto end = live_at(p, "optimizer_end");
  CHECK(kind(end, TensorKind::parameter) == shards);
  CHECK(kind(end, TensorKind::gradient) == 2 * kAdapters / 4 * 4);
  CHECK(kind(end, TensorKind::optimizer_state) >= 2 * (2 * kAdapters / 4 * 4));
}

TEST_CASE("Accelerate 1.14 on a PeftModel: the order of all-gathers, frees and "
          "reduce-scatters", "[fsdp2][accelerate][accelerate_lora]") {
  // Forward: the root's pre-forward gathers model.norm; the embedding is gathered and
  // resharded after its forward; the blocks; [lm_head] at its first op (its copy-out frees
  // block 1's flat output), kept. Backward (the loss computed in the model: the root's hook
  // on the loss runs first; its prefetch target, [lm_head], is still gathered): lm_head's
  // pre-backward hook on the logits prefetches block 1; lm_head's
  // RegisterPostBackwardFunction (its input, the final hidden states, requires grad)
  // reshards it once that gradient is complete: lm_head's weight is freed before the final
  // norm's backward and before block 1's; block 1's pre-backward prefetches block 0, block
  // 0's the embedding; block 1 reduce-scatters at its input's gradient, block 0 (whose
  // input, the frozen embedding's output, needs no grad) in the final callback.
  CHECK(order(lora_program("1.14")) ==
        std::vector<std::string>{"ag fwd the root", "ag fwd model.embed_tokens", "+fwd embed",
                                 "-fwd embed", "ag fwd block 0", "ag fwd block 1",
                                 "ag fwd [lm_head]", "+fwd lm_head", "ag bwd block 1",
                                 "-bwd lm_head", "ag bwd block 0", "rs block 1",
                                 "ag bwd model.embed_tokens", "rs block 0"});
  // Accelerate <= 1.13 (the root: embeddings, final norm and lm_head, given
  // reshard_after_forward True: resharded after the loss, gathered again at its
  // backward) and the loop's own fully_shard(model) (the root kept): lm_head's weight
  // lives until the final callback.
  CHECK(order(lora_program("1.13")) ==
        std::vector<std::string>{"ag fwd the root", "+fwd embed", "+fwd lm_head",
                                 "ag fwd block 0", "ag fwd block 1", "-opt embed",
                                 "-opt lm_head", "ag bwd the root", "+bwd embed", "+bwd lm_head",
                                 "ag bwd block 1", "ag bwd block 0", "rs block 1", "-bwd embed",
                                 "-bwd lm_head", "rs block 0"});
  // Where lm_head's weight goes: after its matmul's backward (grad_input, in lm_head),
  // before the final norm's first backward allocation.
  const Program p = lora_program("1.14");
  bool on = false;
  int prev_module = -1, next_module = -1;
  bool seen = false;
  for (const MemoryEvent& e : p.events) {
    if (e.type == EventType::mark && p.str(static_cast<uint32_t>(e.bytes)) == "measured_step_begin") on = true;
    if (!on || e.phase != Phase::backward) continue;
    const std::string n = p.str(p.tensors[e.tensor].name);
    if (e.type == EventType::free && n == "FSDP2 unsharded lm_head.weight (all_gather_outputs)") seen = true;
    if (e.type != EventType::alloc || n.rfind("FSDP2", 0) == 0) continue;
    if (!seen) prev_module = p.tensors[e.tensor].module;
    else if (next_module < 0) next_module = p.tensors[e.tensor].module;
  }
  CHECK(seen);
  CHECK(prev_module == static_cast<int>(graph::Module::head));
  CHECK(next_module == static_cast<int>(graph::Module::norm));
  // At forward end (memsim's mark after the LM head, before the loss) above the shards:
  // 1.14 holds model.norm (256 x 4 B), lm_head's unsharded weight and its flat all-gather
  // output (257,024 x 4 B each); 1.13 the whole root (514,304 x 4 B) and block 1's flat
  // output (1,038,848 x 4 B): 4,155,392 B more.
  const uint64_t shards = (2 * kBlock + kEmb + kHead + kNorm) / 4 * 4;
  const uint64_t p14 = kind(live_at(p, "forward_end"), TensorKind::parameter);
  const uint64_t p13 = kind(live_at(lora_program("1.13"), "forward_end"), TensorKind::parameter);
  CHECK(p14 == shards + kNorm * 4 + 2 * kHead * 4);
  CHECK(p13 == shards + (kEmb + kNorm + kHead) * 4 + kBlock * 4);
  CHECK(p13 - p14 == 4155392);
}

TEST_CASE("Accelerate 1.14 on a PeftModel with PEFT's enable_input_require_grads hook: the "
          "frozen embedding's pre-backward copies out its prefetched all-gather",
          "[fsdp2][accelerate][accelerate_lora]") {
  // Reentrant checkpointing turns lora.input_require_grads on (PEFT's hook): the
  // embedding's output requires grad, so its post-forward registered a pre-backward hook
  // there (_fsdp_state.py _register_pre_backward_hook), which runs when block 0's
  // RegisterPostBackwardFunction (its input now requires grad) hands the gradient on: block
  // 0 reduce-scatters, then the embedding's copy-out (its unsharded weight, 257,024 x 4 B)
  // from the all-gather block 0 prefetched, freed by its post-backward in the final callback.
  const std::vector<std::string> reentrant =
      order(lora_program("1.14", "checkpoint:\n  policy: full\n  reentrant: true\n"));
  CHECK(reentrant == std::vector<std::string>{"ag fwd the root", "ag fwd model.embed_tokens",
                                              "+fwd embed", "-fwd embed", "ag fwd block 0",
                                              "ag fwd block 1", "ag fwd [lm_head]", "+fwd lm_head",
                                              "ag bwd block 1", "-bwd lm_head", "ag bwd block 0",
                                              "rs block 1", "ag bwd model.embed_tokens",
                                              "rs block 0", "+bwd embed", "-bwd embed"});
  // Non-reentrant: the hook is off (lora.input_require_grads defaults false), no copy-out.
  CHECK(order(lora_program("1.14", "checkpoint:\n  policy: full\n  reentrant: false\n")) ==
        order(lora_program("1.14")));
}

TEST_CASE("memsim run: Qwen2.5-7B LoRA through HF Trainer + Accelerate 1.14 FSDP2 on 8 H100",
          "[fsdp2][accelerate][accelerate_lora][cli][scenarios]") {
  const std::string file =
      MEMSIM_SOURCE_DIR + "/scenarios/qwen2.5-7b-hf-trainer-fsdp2-lora-accelerate1.14-8xh100.yaml";
  const Scenario s = load_scenario(file);
  CHECK(s.parallel.accelerate_version == 114);
  CHECK(s.lora.rank == 16);
  const nlohmann::json cur = memsim_test::run_json(file, "");
  CHECK(cur["fits"] == true);
  const nlohmann::json old = memsim_test::run_json(file, "--set parallel.accelerate_version=1.13");
  CHECK(cur["peak_allocated_bytes"].get<uint64_t>() < old["peak_allocated_bytes"].get<uint64_t>());
  // At forward end, 1.13 holds the root (embedding, final norm, lm_head) and the last block's
  // flat output, 1.14 the final norm, lm_head and lm_head's flat output: the difference is
  // the block's flat fp32 output, (233,057,792 base + 180,224 adapter elements) x 4 B
  // (adapters: q lora_A 16 x 3,584, lora_B 3,584 x 16; v lora_A 16 x 3,584, lora_B 512 x 16;
  // 8 ranks divide every dim 0).
  Scenario s13 = s;
  s13.parallel.accelerate_version = 113;
  const uint64_t f14 = kind(live_at(build_program(s), "forward_end"), TensorKind::parameter);
  const uint64_t f13 = kind(live_at(build_program(s13), "forward_end"), TensorKind::parameter);
  CHECK(f13 - f14 == (233057792ull + 180224ull) * 4ull);
}
