// torchtune's lora_finetune_distributed: FSDP2 over torchtune's LoRA model
// (sim/parallel/fsdp2_layout.h, sim/parallel/fsdp2.h "torchtune's layout";
// docs/fsdp2.md "torchtune's lora_finetune_distributed"). Two kinds of evidence:
//  - CPU fixtures (tools/fixtures/gen_tune_lora_fsdp2_fixtures.py, torch 1.13): the same
//    model on one process with FSDP2's RegisterPostBackwardFunction on each layer's input,
//    which shows when each block's post-backward runs and what is live then;
//  - hand arithmetic from torchtune v0.6.1's recipe and shard_model and torch's
//    _fully_shard rules: group sizes, all-gather / reduce-scatter counts, the setup order,
//    what the sharded run keeps after the step.
#include <catch2/catch.hpp>

#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_test_support.h"
#include "json_test_support.h"
#include "live_at_mark_test_support.h"
#include "graph/offload_streams.h"
#include "sim/parallel/fsdp2.h"
#include "sim/step/schedule.h"
#include "test_paths.h"
#include "torch_fixture_test_support.h"

using namespace memsim;

namespace {

using memsim_test::kind;
using memsim_test::live_at;

// A 2-layer torchtune Llama as tests/test_fsdp2_torchtune.cpp's (D 256, 4 heads of 64, 2
// KV heads, F 512, vocab 1024, bf16, 2 x 64 tokens, fused AdamW) with llama3/8B_lora.yaml's
// adapters: q_proj, v_proj, output_proj and the MLP, rank 8; no checkpointing (the config's
// enable_activation_checkpointing: False).
std::string lora_yaml(const std::string& parallel, const std::string& ckpt = "none") {
  return "model:\n  family: hf-llama\n  implementation: torchtune\n  attention: flash\n"
         "  layers: 2\n  d_model: 256\n  heads: 4\n  kv_heads: 2\n  d_ff: 512\n  vocab: 1024\n"
         "  context_length: 64\n"
         "batch:\n  micro_batch: 2\n  seq_len: 64\n"
         "precision:\n  params: bf16\n  autocast: none\n"
         "optimizer:\n  type: adamw\n  impl: fused\n"
         "step:\n  kind: train\n  warmup_steps: 1\n"
         "checkpoint:\n  policy: " + ckpt + "\n"
         "lora:\n  rank: 8\n  alpha: 16\n  targets: [q_proj, v_proj, o_proj, gate_proj, up_proj, down_proj]\n" +
         parallel + "device:\n  capacity: 1TiB\n  cublas_workspace: 0\n  kernel_scratch: false\n";
}
const std::string kFsdp2 = "parallel:\n  data: 4\n  sharding: fsdp2\n";

Scenario lora_scenario(const std::vector<std::pair<std::string, std::string>>& over = {},
                       const std::string& parallel = kFsdp2, const std::string& ckpt = "none") {
  return load_scenario_text(lora_yaml(parallel, ckpt), "tune-lora.yaml", over);
}

std::string load_error(const std::vector<std::pair<std::string, std::string>>& over) {
  try {
    lora_scenario(over);
  } catch (const ScenarioError& e) {
    return e.what();
  }
  return "";
}

// Hand arithmetic, bf16 (2 B), shard group 4. Base per block as in test_fsdp2_torchtune.cpp:
// q, output_proj (256 x 256) 64 x 256; k, v (128 x 256) 32 x 256; w1, w3 (512 x 256) and w2
// (256 x 512) 32768 elements each; sa_norm, mlp_norm 64 each.
constexpr uint64_t kBlockBase = (2 * 16384 + 2 * 8192 + 3 * 32768 + 2 * 64) * 2;  // 295168 B
// Adapters, rank 8: lora_a (8 x in) -> 2 x in rows; lora_b (out x 8) -> out / 4 x 8.
// q: 2x256 + 64x8; v: 2x256 + 32x8; output_proj: 2x256 + 64x8; w1, w3: 2x256 + 128x8;
// w2: 2x512 + 64x8.
constexpr uint64_t kBlockAdapters =
    ((512 + 512) + (512 + 256) + (512 + 512) + 2 * (512 + 1024) + (1024 + 512)) * 2;  // 14848 B
constexpr uint64_t kVocab = 256 * 256 * 2;  // tok_embeddings / output shard: 1024 / 4 rows
constexpr uint64_t kNorm = 64 * 2;          // the final norm's shard (256 / 4 rows)

std::vector<const MemoryEvent*> allocs(const Program& p, const std::string& name) {
  std::vector<const MemoryEvent*> out;
  for (const MemoryEvent& e : p.events)
    if (e.type == EventType::alloc && p.str(p.tensors[e.tensor].name) == name) out.push_back(&e);
  return out;
}

bool fsdp2_named(const Program& p, uint32_t t) {
  return p.str(p.tensors[t].name).rfind("FSDP2 ", 0) == 0;
}

// At event index `at` (before it): live bytes of the tensors that are not FSDP2's own,
// split as the fixture's snapshot splits them.
struct Split {
  uint64_t activations = 0;  // activation, temporary, loss
  uint64_t gradients = 0;    // the adapters' unsharded .grad
};
Split live_split(const Program& p, size_t at) {
  std::vector<uint8_t> live(p.tensors.size(), 0);
  for (size_t i = 0; i < at; ++i) {
    const MemoryEvent& e = p.events[i];
    if (e.type == EventType::alloc) live[e.tensor] = 1;
    if (e.type == EventType::free) live[e.tensor] = 0;
  }
  Split s;
  for (size_t t = 0; t < live.size(); ++t) {
    if (!live[t] || fsdp2_named(p, static_cast<uint32_t>(t))) continue;
    const TensorKind k = p.tensors[t].kind;
    if (k == TensorKind::activation || k == TensorKind::temporary || k == TensorKind::loss)
      s.activations += p.tensors[t].bytes;
    if (k == TensorKind::gradient) s.gradients += p.tensors[t].bytes;
  }
  return s;
}

// Index of the last allocation named `name`.
size_t last_alloc(const Program& p, const std::string& name) {
  size_t at = p.events.size();
  for (size_t i = 0; i < p.events.size(); ++i)
    if (p.events[i].type == EventType::alloc && p.str(p.tensors[p.events[i].tensor].name) == name) at = i;
  REQUIRE(at < p.events.size());
  return at;
}

// The fixture's run as a scenario: its model and optimizer (for-loop), FSDP2 over `ws`.
Scenario fixture_scenario(const nlohmann::json& c, int ws) {
  std::string y = "model:\n  family: hf-llama\n  implementation: torchtune\n  attention: flash\n";
  for (const char* k : {"layers", "d_model", "heads", "kv_heads", "d_ff", "vocab"})
    y += std::string("  ") + k + ": " + std::to_string(c[k].get<int>()) + "\n";
  y += "  context_length: " + std::to_string(c["context"].get<int>()) + "\n";
  y += "batch:\n  micro_batch: " + std::to_string(c["batch"].get<int>()) +
       "\n  seq_len: " + std::to_string(c["seq"].get<int>()) + "\n";
  y += "precision:\n  params: " + c.value("dtype", std::string("fp32")) + "\n";
  y += "optimizer:\n  type: " + c["optimizer"].get<std::string>() + "\n  impl: for-loop\n";
  y += "lora:\n  rank: " + std::to_string(c["lora_rank"].get<int>()) + "\n  targets: [";
  for (const auto& t : c["lora_targets"]) y += t.get<std::string>() + ",";
  y.back() = ']';
  y += "\nstep:\n  kind: train\n  warmup_steps: 1\n";
  if (ws > 1) y += "parallel:\n  data: " + std::to_string(ws) + "\n  sharding: fsdp2\n";
  y += "device:\n  capacity: 1TiB\n  cublas_workspace: 0\n  kernel_scratch: false\n";
  return load_scenario_text(y, "tune-lora-fsdp2-fixture.yaml");
}

std::vector<std::filesystem::path> lora_fsdp2_fixtures() {
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::directory_iterator(MEMSIM_SOURCE_DIR + "/tests/data/torch_cpu_impl"))
    if (e.path().filename().string().rfind("tunelorafsdp2_", 0) == 0) files.push_back(e.path());
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

TEST_CASE("torchtune LoRA + FSDP2: each block's post-backward runs when its input's gradient "
          "is complete, block 0's in the final callback (CPU fixtures)",
          "[fsdp2][torchtune][lora][fixture]") {
  const auto files = lora_fsdp2_fixtures();
  REQUIRE(files.size() == 2);
  memsim_test::print_fixture_table_header();
  for (const auto& path : files) {
    const nlohmann::json fx = memsim_test::load_json(path);
    INFO(fx["name"].get<std::string>());
    // The stand-in is torchtune's LoRA model: one process, compared as the other
    // implementation fixtures are (forward end exact by kind and layer, peak).
    const Scenario one = fixture_scenario(fx["config"], 1);
    memsim_test::compare_with_fixture(fx, one, build_program(one));
    // FSDP2 over 4 ranks: at each block's post-backward (its reduce-scatter input), what is
    // live besides FSDP2's own tensors is what the stand-in holds when
    // RegisterPostBackwardFunction.backward runs: the activations exactly, and of the
    // adapters' gradients, this block's (the blocks above were reduced and freed; the one
    // process keeps them all).
    const Program p = build_program(fixture_scenario(fx["config"], 4));
    const auto& probes = fx["post_backward"];
    const int layers = fx["config"]["layers"].get<int>();
    REQUIRE(probes.size() == static_cast<size_t>(layers - 1));  // none for layer 0
    for (size_t k = 0; k < probes.size(); ++k) {
      const int layer = probes[k]["layer"].get<int>();
      CHECK(layer == layers - 1 - static_cast<int>(k));  // the blocks top down
      const size_t at = last_alloc(p, "FSDP2 reduce-scatter input (chunk_cat) of block " + std::to_string(layer));
      const Split s = live_split(p, at);
      const uint64_t grads_here = probes[k]["gradients"].get<uint64_t>() -
                                  (k == 0 ? 0 : probes[k - 1]["gradients"].get<uint64_t>());
      INFO("layer " << layer);
      CHECK(s.activations == probes[k]["activations"].get<uint64_t>());
      CHECK(s.gradients == grads_here);
    }
    // Block 0 (no Function: its input, tok_embeddings' output, needs no grad) reduces in
    // the final callback, after every allocation of the model's backward.
    const size_t rs0 = last_alloc(p, "FSDP2 reduce-scatter input (chunk_cat) of block 0");
    for (size_t i = rs0 + 1; i < p.events.size(); ++i) {
      const MemoryEvent& e = p.events[i];
      if (e.type == EventType::mark && p.str(static_cast<uint32_t>(e.bytes)) == "backward_end") break;
      if (e.type == EventType::alloc) CHECK(fsdp2_named(p, e.tensor));
    }
  }
}

TEST_CASE("torchtune LoRA + FSDP2: shard_model's groups without custom_sharded_layers, frozen "
          "base shards, adapters alone reduced and stepped", "[fsdp2][torchtune][lora]") {
  const Scenario s = lora_scenario();
  // The LoRA configs leave custom_sharded_layers out: tok_embeddings and output stay in
  // the root with the final norm.
  CHECK_FALSE(s.recipe.shard_tok_embeddings);
  CHECK_FALSE(s.recipe.shard_output);
  const Program p = build_program(s);
  const uint64_t base = 2 * kBlockBase + 2 * kVocab + kNorm;
  const uint64_t adapters = 2 * kBlockAdapters;
  const auto end = live_at(p, "optimizer_end");
  CHECK(kind(end, TensorKind::parameter) == base + adapters);
  // Gradients and AdamW's moments for the adapters only (+ fused AdamW's 0-d fp32 step per
  // trainable parameter: 2 layers x 6 linears x 2).
  CHECK(kind(end, TensorKind::gradient) == adapters);
  CHECK(kind(end, TensorKind::optimizer_state) == 2 * adapters + 24 * 4);
  // All-gathers per step: each block and the root once in forward and once in backward
  // (the root reshards after forward: shard_model passes reshard_after_forward to it), at
  // the frozen weights' full size too. Two steps.
  std::map<std::string, std::map<uint64_t, int>> ag, rs;
  for (const char* g : {"block 0", "block 1", "the root"}) {
    for (const MemoryEvent* e : allocs(p, std::string("FSDP2 all-gather output (flat) of ") + g)) ++ag[g][e->bytes];
    for (const MemoryEvent* e : allocs(p, std::string("FSDP2 reduce-scatter input (chunk_cat) of ") + g)) ++rs[g][e->bytes];
  }
  CHECK(ag["block 0"][(kBlockBase + kBlockAdapters) * 4] == 4);
  CHECK(ag["block 1"][(kBlockBase + kBlockAdapters) * 4] == 4);
  CHECK(ag["the root"][(2 * kVocab + kNorm) * 4] == 4);
  // Reduce-scatter: the adapters' gradients only, once per block per step; the root has
  // nothing trainable.
  CHECK(rs["block 0"][kBlockAdapters * 4] == 2);
  CHECK(rs["block 1"][kBlockAdapters * 4] == 2);
  CHECK(rs["the root"].empty());
  CHECK(allocs(p, "FSDP2 all-gather output (flat) of output").empty());
  // gradient_accumulation_steps 2 (the recipe has no no_sync): every micro-batch gathers
  // and reduce-scatters again, and the second adds into the first's sharded gradients.
  const Program ga = build_program(lora_scenario({{"batch.grad_accum", "2"}}));
  CHECK(allocs(ga, "FSDP2 all-gather output (flat) of block 0").size() == 2 * 2 * 2);
  CHECK(allocs(ga, "FSDP2 reduce-scatter input (chunk_cat) of block 0").size() == 2 * 2);
  CHECK(kind(live_at(ga, "optimizer_end"), TensorKind::gradient) == adapters);
}

TEST_CASE("torchtune LoRA + FSDP2: the adapters get their shards from to_empty before the base "
          "state dict loads", "[fsdp2][torchtune][lora]") {
  const Program p = build_program(lora_scenario());
  const std::string full = "torchtune full state-dict tensor (load_from_full_model_state_dict)";
  // The base state dict: tok_embeddings, 2 x 9 block weights, norm, output (no adapter).
  const auto loads = allocs(p, full);
  REQUIRE(loads.size() == 21);
  uint64_t total = 0;
  for (const MemoryEvent* e : loads) total += e->bytes;
  CHECK(total == (2 * kBlockBase + 2 * kVocab + kNorm) * 4);
  // Every adapter shard is allocated before the first full tensor.
  const size_t first_load = static_cast<size_t>(loads.front() - p.events.data());
  uint64_t adapters_before = 0;
  for (size_t i = 0; i < first_load; ++i) {
    const MemoryEvent& e = p.events[i];
    const std::string& n = p.str(p.tensors[e.tensor].name);
    if (e.type == EventType::alloc && n.rfind("FSDP2 shard of ", 0) == 0 && n.find(".lora_") != std::string::npos)
      adapters_before += e.bytes;
  }
  CHECK(adapters_before == 2 * kBlockAdapters);
  // fsdp_cpu_offload: lora_device is the CPU, nothing of the adapters reaches the GPU.
  const Program off = build_program(lora_scenario({{"parallel.cpu_offload", "true"}}));
  uint64_t adapter_gpu = 0;
  for (const MemoryEvent& e : off.events) {
    const std::string& n = off.str(off.tensors[e.tensor].name);
    if (e.type == EventType::alloc && e.phase == Phase::setup && n.find(".lora_") != std::string::npos)
      adapter_gpu += e.bytes;
  }
  CHECK(adapter_gpu == 0);
  const auto end = live_at(off, "optimizer_end");
  CHECK(kind(end, TensorKind::parameter) + kind(end, TensorKind::gradient) +
            kind(end, TensorKind::optimizer_state) == 0);
}

TEST_CASE("torchtune LoRA + FSDP2: the activations are the single-device LoRA run's, "
          "custom_sharded_layers tok_embeddings only gathers it in forward",
          "[fsdp2][torchtune][lora]") {
  for (const std::string ckpt : {"none", "full"}) {
    INFO(ckpt);
    const Program one = build_program(lora_scenario({}, "", ckpt));
    const Program sharded = build_program(lora_scenario({}, kFsdp2, ckpt));
    const auto a = live_at(one, "forward_end"), b = live_at(sharded, "forward_end");
    for (TensorKind k : {TensorKind::activation, TensorKind::temporary, TensorKind::input})
      CHECK(kind(a, k) == kind(b, k));
  }
  // tok_embeddings as its own group (frozen, its input the token ids): gathered for its
  // forward; in backward block 0's pre-backward prefetches it (the post-forward order
  // names it), nobody copies it out, and the final callback's finalize_backward frees it.
  const Program p = build_program(lora_scenario({{"parallel.custom_sharded_layers", "tok_embeddings"}}));
  const auto ag = allocs(p, "FSDP2 all-gather output (flat) of tok_embeddings");
  REQUIRE(ag.size() == 4);
  int in_backward = 0;
  for (const MemoryEvent* e : ag) {
    CHECK(e->bytes == kVocab * 4);
    in_backward += e->phase == Phase::backward;
  }
  CHECK(in_backward == 2);
  CHECK(allocs(p, "FSDP2 unsharded tok_embeddings.weight (all_gather_outputs)").size() == 2);  // forward only
  CHECK(allocs(p, "FSDP2 reduce-scatter input (chunk_cat) of tok_embeddings").empty());
  CHECK(allocs(p, "FSDP2 all-gather output (flat) of the root")[0]->bytes == (kVocab + kNorm) * 4);
}

TEST_CASE("torchtune LoRA + FSDP2: custom_sharded_layers output gathers the frozen output per "
          "logits chunk in forward and in backward, with no reduce-scatter",
          "[fsdp2][torchtune][lora]") {
  const Program p = build_program(lora_scenario({{"parallel.custom_sharded_layers", "[tok_embeddings, output]"}}));
  // Eight calls: each a pre-forward (all-gather, copy-out) and a post-forward reshard; in
  // backward each chunk's pre-backward hook gathers it again and its
  // RegisterPostBackwardFunction (the chunk of h requires grad) reshards it: 8 + 8 per step.
  const auto ag = allocs(p, "FSDP2 all-gather output (flat) of output");
  REQUIRE(ag.size() == 2 * 16);
  int backward = 0;
  for (const MemoryEvent* e : ag) {
    CHECK(e->bytes == kVocab * 4);
    backward += e->phase == Phase::backward;
  }
  CHECK(backward == 2 * 8);
  CHECK(allocs(p, "FSDP2 reduce-scatter input (chunk_cat) of output").empty());  // frozen
  CHECK(allocs(p, "FSDP2 all-gather output (flat) of the root")[0]->bytes == kNorm * 4);
  // One unsharded copy at a time, in backward too: each call's post-backward frees it
  // before the next call's pre-backward gathers it, and the last call's before the
  // chunks' SplitBackward0 cat.
  const std::string unsharded = "FSDP2 unsharded output.weight (all_gather_outputs)";
  std::vector<uint8_t> is(p.tensors.size(), 0);
  for (size_t t = 0; t < p.tensors.size(); ++t) is[t] = p.str(p.tensors[t].name) == unsharded;
  int live = 0, most = 0;
  bool seen_split_with_live = false;
  int splits = 0;
  for (const MemoryEvent& e : p.events) {
    if (e.type == EventType::alloc && is[e.tensor]) ++live;
    if (e.type == EventType::free && is[e.tensor]) --live;
    most = std::max(most, live);
    if (e.type == EventType::alloc && e.phase == Phase::backward && p.str(e.op) == "SplitBackward0") {
      seen_split_with_live = seen_split_with_live || live > 0;
      ++splits;
    }
  }
  CHECK(splits == 2 * 7);  // three levels of two-way cats: 4 + 2 + 1 per step
  CHECK(most == 1);
  CHECK_FALSE(seen_split_with_live);
}

TEST_CASE("torchtune LoRA + FSDP2 with enable_activation_offloading: the single-device "
          "offload's saves and copies, on a stream of their own", "[fsdp2][torchtune][lora][offload]") {
  // The recipe wraps the sharded model's forward in the same OffloadActivations as the
  // single-device recipe; FSDP2's unsharded weights are nn.Parameters (never offloaded) and
  // its buffers are not autograd saves: the offloaded tensors, their host bytes and the
  // backward's device copies are the single-device run's. The copies come back on
  // OffloadActivations' own stream s1, not on FSDP2's copy-in stream (allocator stream 1).
  const std::vector<std::pair<std::string, std::string>> off = {{"checkpoint.offload_activations", "true"}};
  for (const std::string parallel_of : {"", "tok_embeddings,output"}) {
    INFO(parallel_of);
    auto over = off;
    if (!parallel_of.empty()) over.push_back({"parallel.custom_sharded_layers", parallel_of});
    const Program one = build_program(lora_scenario(off, "", "full"));
    const Program sharded = build_program(lora_scenario(over, kFsdp2, "full"));
    const auto a = live_at(one, "forward_end"), b = live_at(sharded, "forward_end");
    for (TensorKind k : {TensorKind::activation, TensorKind::temporary, TensorKind::input})
      CHECK(kind(a, k) == kind(b, k));
    CHECK(sharded.host_offload_bytes > 0);
    CHECK(sharded.host_offload_bytes == one.host_offload_bytes);
    // The backward's device copies: same sizes, in the same order; on stream 4 under FSDP2
    // (streams 1-3 are its all-gather, reduce-scatter and all-reduce streams), where no
    // FSDP2 tensor is.
    std::vector<uint64_t> copies_one, copies_sharded;
    for (const MemoryEvent& e : one.events)
      if (e.type == EventType::alloc && e.stream == graph::kOffloadStream) copies_one.push_back(e.bytes);
    for (const MemoryEvent& e : sharded.events) {
      if (e.type != EventType::alloc || e.stream != kAllReduceStream + 1) continue;
      CHECK_FALSE(fsdp2_named(sharded, e.tensor));
      copies_sharded.push_back(e.bytes);
    }
    CHECK_FALSE(copies_one.empty());
    CHECK(copies_one == copies_sharded);
  }
}

TEST_CASE("torchtune LoRA + FSDP2: what lora_finetune_distributed does not do, and what is "
          "not modelled, is refused by key", "[fsdp2][torchtune][lora][scenario]") {
  CHECK(load_error({}).empty());
  const std::vector<std::pair<std::vector<std::pair<std::string, std::string>>, std::string>> refused = {
      {{{"parallel.replicate", "2"}}, "parallel.replicate: lora_finetune_distributed shards over one flat mesh"},
      {{{"lora.adapter_dtype", "fp32"}}, "lora.adapter_dtype: torchtune builds the adapters in the model's dtype"},
      {{{"lora.base_dtype", "nf4"}}, "lora.base_dtype"},
      {{{"parallel.fsdp_mixed_precision", "bf16"}}, "parallel.fsdp_mixed_precision: torchtune's shard_model passes no MixedPrecisionPolicy"},
      {{{"optimizer.in_backward", "true"}}, "with optimizer.in_backward: true"},
  };
  for (const auto& [over, message] : refused) {
    INFO(message);
    CHECK(load_error(over).find(message) != std::string::npos);
  }
}

TEST_CASE("memsim run on llama3-8b-torchtune-lora-fsdp2-8xh100 (llama3/8B_lora.yaml's defaults)",
          "[fsdp2][torchtune][lora][cli][scenarios]") {
  const std::string path = MEMSIM_SOURCE_DIR + "/scenarios/llama3-8b-torchtune-lora-fsdp2-8xh100.yaml";
  const nlohmann::json j = memsim_test::run_json(path);
  CHECK(j["fits"] == true);
  CHECK(j["rank"]["world_size"] == 8);
  const Program p = build_program(load_scenario(path));
  // 8,030,261,248 base parameters / 8 x 2 B plus the adapters: per layer q (8 x 4096 +
  // 4096 x 8), v (8 x 4096 + 1024 x 8), output_proj (8 x 4096 + 4096 x 8), w1, w3 (8 x 4096
  // + 14336 x 8), w2 (8 x 14336 + 4096 x 8) = 614,400; x 32 = 19,660,800 (torchtune's
  // 19.66M trainable), every dim 0 divisible by 8.
  const uint64_t adapters = 19660800ull;
  const auto end = live_at(p, "optimizer_end");
  CHECK(kind(end, TensorKind::parameter) == (8030261248ull + adapters) / 8 * 2);
  CHECK(kind(end, TensorKind::gradient) == adapters / 8 * 2);
  CHECK(kind(end, TensorKind::optimizer_state) == adapters / 8 * 4 + 32 * 12 * 4);  // + fused steps
}

TEST_CASE("memsim run on llama3.1-70b-torchtune-lora-fsdp2-8xa100 (70B_lora.yaml's defaults)",
          "[fsdp2][torchtune][lora][cli][scenarios]") {
  const std::string path = MEMSIM_SOURCE_DIR + "/scenarios/llama3.1-70b-torchtune-lora-fsdp2-8xa100.yaml";
  const nlohmann::json j = memsim_test::run_json(path);
  CHECK(j["fits"] == true);
  // torchtune's README (v0.6.1): 27.6 GiB per GPU for this job, measured with torch.compile
  // (not modelled with torchtune's code): the uncompiled prediction is within 12% above it.
  const double gib = j["peak_allocated_bytes"].get<double>() / (1024.0 * 1024 * 1024);
  CHECK(gib > 27.6);
  CHECK(gib < 27.6 * 1.12);
  // Adapters, rank 16, per layer: q (16 x 8192 + 8192 x 16), v (16 x 8192 + 1024 x 16),
  // output_proj (as q), w1, w3 (16 x 8192 + 28672 x 16), w2 (16 x 28672 + 8192 x 16):
  // 2,441,216; x 80 = 195,297,280 (torchtune's 195.3M trainable).
  const uint64_t adapters = 195297280ull;
  const Program p = build_program(load_scenario(path));
  const auto end = live_at(p, "optimizer_end");
  CHECK(kind(end, TensorKind::gradient) == adapters / 8 * 2);
  CHECK(kind(end, TensorKind::optimizer_state) == adapters / 8 * 4 + 80 * 12 * 4);
}

TEST_CASE("torchtune LoRA: the measured step's embedding and loss run outside every layer "
          "(the backward's last node is a block's when the embedding is frozen)",
          "[fsdp2][torchtune][lora]") {
  // One GPU and FSDP2: a forward that inherited ctx.layer from the backward's last node
  // (layer 0's, as tok_embeddings has no AccumulateGrad) ran FSDP2's hooks of block 0 at
  // the embedding and at the loss.
  for (const std::string& parallel : {std::string(), kFsdp2}) {
    INFO(parallel);
    const Program p = build_program(lora_scenario({}, parallel));
    size_t begin = 0;
    for (size_t i = 0; i < p.events.size(); ++i)
      if (p.events[i].type == EventType::mark && p.str(p.events[i].bytes) == "measured_step_begin")
        begin = i;
    REQUIRE(begin > 0);
    size_t outside = 0;
    for (size_t i = begin; i < p.events.size(); ++i) {
      const MemoryEvent& e = p.events[i];
      if (e.type != EventType::alloc) continue;  // (a free happens where the tensor dies)
      const auto m = static_cast<graph::Module>(p.tensors[e.tensor].module);
      if (e.phase != Phase::forward && e.phase != Phase::loss) continue;
      // (The residual adds inside the layers carry module embedding in torchtune's code
      // path: only the embedding op itself and the loss are checked.)
      const bool embedding_op = m == graph::Module::embedding && p.str(e.op) == "embedding";
      if (!embedding_op && m != graph::Module::loss) continue;
      ++outside;
      INFO("event " << i << ": " << p.str(e.op));
      CHECK(e.layer == -1);
    }
    CHECK(outside > 0);
  }
}
