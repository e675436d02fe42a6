// DeepSpeed's gradient norm, clipping, overflow check and loss scaling
// (sim/parallel/deepspeed_norm.h, docs/deepspeed.md "Gradient norm, clipping and the loss
// scaler"): the step's tensors of the small Llama of test_deepspeed.cpp, allocation by
// allocation, against hand arithmetic from DeepSpeed 0.19.6's stage_1_and_2.py / stage3.py
// (no DeepSpeed runs here), and the keys (ds.json gradient_clipping = optimizer.max_grad_norm).
#include <catch2/catch.hpp>

#include <algorithm>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "cli_test_support.h"
#include "deepspeed_test_support.h"
#include "json_test_support.h"
#include "program/tensor_names.h"
#include "sim/step/schedule.h"
#include "step_events_support.h"
#include "test_paths.h"

using namespace memsim;
using namespace memsim_test::deepspeed;

namespace {

using memsim_test::coarse;

// DeepSpeed's allocations (names with "ZeRO-" or the scaled loss) in [from, to).
Allocs ds_allocs(const Program& p, size_t from, size_t to) {
  return memsim_test::deepspeed::ds_allocs(p, from, to, true);
}

// The measured step's optimizer window: backward_end .. optimizer_end.
std::pair<size_t, size_t> step_window(const Program& p) {
  const size_t be = mark_index(p, "backward_end"), oe = mark_index(p, "optimizer_end");
  REQUIRE(be != SIZE_MAX);
  REQUIRE(oe != SIZE_MAX);
  return {be, oe};
}

const std::string kScalar2 = "gradient norm or overflow scalar (ZeRO-2 step)";
const std::string kScalar3 = "gradient norm or overflow scalar (ZeRO-3 step)";

// unscale_and_clip_grads with gradient_clipping > 0: / loss_scale, + 1e-6, / clip, clamp,
// * loss_scale, reciprocal, * 1.0 (fp32 norm at stage 1/2, fp64 at stage 3).
void add_clip(Allocs& a, const std::string& scalar, uint64_t e) {
  for (int k = 0; k < 7; ++k) a.emplace_back(scalar, e);
}

// mask_nan_or_inf_with_val_inplace: isinf, isnan, logical_or, err.
void add_mask(Allocs& a, const std::string& scalar) {
  a.insert(a.end(), {{scalar, 1}, {scalar, 1}, {scalar, 1}, {scalar, 4}});
}

}  // namespace

TEST_CASE("DeepSpeed step: memsim matches the torch 1.13 CPU run of DeepSpeed's step stand-ins",
          "[deepspeed][clip][fixture]") {
  // tools/fixtures/gen_deepspeed_norm_fixtures.py: DeepSpeed 0.19.6's step statements
  // (stage_1_and_2.py / stage3.py) on the same partition gradients, measured per aten op.
  struct Case {
    const char* name;
    const char* zero;
    const char* params;
    const char* clip;
  };
  for (const Case& c : {Case{"zero2_bf16_clip", "2", "bf16", "1.0"}, Case{"zero2_bf16_noclip", "2", "bf16", ""},
                        Case{"zero2_fp16_clip", "2", "fp16", "1.0"}, Case{"zero3_bf16_clip", "3", "bf16", "0.5"},
                        Case{"zero3_fp16_clip", "3", "fp16", "0.5"}}) {
    INFO(c.name);
    const nlohmann::json fx =
        memsim_test::load_json(std::string(MEMSIM_SOURCE_DIR) + "/tests/data/deepspeed_norm/ds_norm_" + c.name + ".json");
    REQUIRE(fx.contains("events"));
    const memsim_test::AllocFrees expected = memsim_test::fixture_alloc_frees(fx);
    REQUIRE(expected.size() > 40);
    std::string extra = "deepspeed:\n  reduce_bucket_size: 20000\n";
    if (std::string(c.clip).size() > 0) extra += "optimizer:\n  max_grad_norm: " + std::string(c.clip) + "\n";
    std::string y = small_llama(4, std::string("  zero: ") + c.zero + "\n", extra);
    y.replace(y.find("params: bf16"), 12, std::string("params: ") + c.params);
    const Program p = build_program(load(y));
    const auto [be, oe] = step_window(p);
    memsim_test::AllocFrees got;
    for (size_t i = be; i < oe; ++i) {
      const MemoryEvent& e = p.events[i];
      if (e.type == EventType::alloc) got.emplace_back(true, e.bytes);
      if (e.type == EventType::free) got.emplace_back(false, p.tensors[e.tensor].bytes);
    }
    CHECK(coarse(got) == coarse(expected));
  }
}

TEST_CASE("DeepSpeed ZeRO-2 step: grad norm in fp64, clip factor, _global_grad_norm by hand",
          "[deepspeed][clip]") {
  // P = 28752 (test_deepspeed.cpp): rank 0's averaged_gradients are the embedding (16384),
  // layer 0's q, k, v (4096 each) and the first 80 elements of o_proj (28752 - 28672).
  const Scenario s = load(small_llama(4, "  zero: 2\n", "deepspeed:\n  reduce_bucket_size: 20000\n"
                                                            "optimizer:\n  max_grad_norm: 1.0\n"));
  REQUIRE(s.optimizer.max_grad_norm == 1.0);
  const Program p = build_program(s);
  const auto [be, oe] = step_window(p);
  const std::string f64 = "fp64 copy of a gradient for its norm (ZeRO-2 grad norm)";
  const std::string stack = "stacked gradient norms (ZeRO-2 grad norm)";
  Allocs hand;
  // get_grad_norm_direct: vector_norm(g.double()) per gradient (the copy dies at once).
  for (uint64_t n : {16384, 4096, 4096, 4096, 80}) hand.insert(hand.end(), {{f64, n * 8}, {kScalar2, 8}});
  // stack [5] fp64, square, sum, .float(), pow(0.5), the mask; scaled_global_norm's stack
  // of the one group norm and its vector_norm; _global_grad_norm = norm / prev_scale.
  hand.insert(hand.end(), {{stack, 40}, {stack, 40}, {kScalar2, 8}, {kScalar2, 4}, {kScalar2, 4}});
  add_mask(hand, kScalar2);
  hand.insert(hand.end(), {{stack, 4}, {kScalar2, 4}, {"_global_grad_norm (ZeRO-2)", 4}});
  // The flat bf16 partition gradient and its fp32 cast, then the clip chain on it.
  hand.insert(hand.end(), {{"bf16 flat grad of group 0's partition (ZeRO-2)", 28752 * 2},
                           {"grad of fp32 partition of group 0 (ZeRO-2)", 28752 * 4}});
  add_clip(hand, kScalar2, 4);
  CHECK(ds_allocs(p, be, oe) == hand);
  // The fp64 copies are the step's largest new tensor here (the embedding's 131072 B,
  // freed before the next one): at most one is alive at a time.
  CHECK(live_named_before(p, f64, oe) == 0);
  // Only _global_grad_norm outlives the step (the optimizer's and the engine's attribute):
  // one per step, the previous one freed after the next step.
  CHECK(allocs(p, "_global_grad_norm (ZeRO-2)") == std::vector<uint64_t>{4, 4});
  CHECK(live_named_before(p, "_global_grad_norm (ZeRO-2)", oe) == 4);
  CHECK(live_named_before(p, kScalar2, oe) == 0);
  CHECK(live_named_before(p, stack, oe) == 0);

  // Without gradient_clipping the norm is still computed (step 1 of step()); only the clip
  // chain is gone (1. / loss_scale is a Python float).
  const Program q = build_program(load(small_llama(4, "  zero: 2\n", "deepspeed:\n  reduce_bucket_size: 20000\n")));
  const auto [qb, qe] = step_window(q);
  Allocs no_clip = hand;
  no_clip.resize(hand.size() - 7);
  CHECK(ds_allocs(q, qb, qe) == no_clip);
}

TEST_CASE("DeepSpeed ZeRO-2 fp16: the overflow check's float copies and masks", "[deepspeed][clip]") {
  std::string y = small_llama(4, "  zero: 2\n", "deepspeed:\n  reduce_bucket_size: 20000\n");
  y.replace(y.find("params: bf16"), 12, "params: fp16");
  const Program p = build_program(load(y));
  const auto [be, oe] = step_window(p);
  const Allocs got = ds_allocs(p, be, oe);
  const std::string copy = "fp32 copy of a gradient for the overflow check (ZeRO-2 _has_inf_or_nan)";
  const std::string mask = "inf / nan mask of gradients (ZeRO-2 overflow check)";
  // has_overflow_partitioned_grads_serial: invalid_grad_count (fp32 zeros [1]); per
  // gradient x.float(), isnan, isinf, logical_or, .float(), .max(); .bool(); .byte().
  Allocs hand{{kScalar2, 4}};
  for (uint64_t n : {16384, 4096, 4096, 4096, 80})
    hand.insert(hand.end(), {{copy, n * 4}, {mask, n}, {mask, n}, {mask, n}, {copy, n * 4}, {kScalar2, 4}});
  hand.insert(hand.end(), {{kScalar2, 1}, {kScalar2, 1}});
  REQUIRE(got.size() > hand.size());
  CHECK(Allocs(got.begin(), got.begin() + static_cast<std::ptrdiff_t>(hand.size())) == hand);
  // Then the norm as in bf16 (the fp64 copies of the same five gradients).
  CHECK(got[hand.size()] == std::make_pair(std::string("fp64 copy of a gradient for its norm (ZeRO-2 grad norm)"),
                                           uint64_t{16384 * 8}));
  // The loss scaler is a Python float: no tensor of its own; the scaled loss is one 0-d
  // fp32 tensor per backward (two steps here).
  CHECK(allocs(p, "scaled loss (DeepSpeed scale_if_loss: loss * loss_scale)") == std::vector<uint64_t>{4, 4});
}

TEST_CASE("DeepSpeed ZeRO-3 step: per-sub-group norm, fp64 clip, tracker, fp16 overflow on the reduce stream",
          "[deepspeed][clip]") {
  const std::string ds = "deepspeed:\n  reduce_bucket_size: 20000\n  stage3_param_persistence_threshold: 100\n"
                         "  stage3_prefetch_bucket_size: 10000\noptimizer:\n  max_grad_norm: 0.5\n";
  const Program p = build_program(load(small_llama(4, "  zero: 3\n", ds)));
  const auto [be, oe] = step_window(p);
  const Allocs got = ds_allocs(p, be, oe);
  const std::string f64 = "fp64 copy of a gradient for its norm (ZeRO-3 grad norm)";
  const std::string stack = "stacked gradient norms (ZeRO-3 grad norm)";
  // One sub group (sub_group_size 1e9) of 21 partitions: embedding and LM head 4096
  // elements, 8 attention projections 1024, 6 MLP projections 2048, 5 norms 16.
  REQUIRE(got.size() == 21 * 2 + 12 + 2 + 7);
  std::vector<uint64_t> copies;
  for (size_t k = 0; k < 21; ++k) {
    CHECK(got[2 * k].first == f64);
    CHECK(got[2 * k + 1] == std::make_pair(kScalar3, uint64_t{8}));
    copies.push_back(got[2 * k].second);
  }
  std::sort(copies.begin(), copies.end());
  std::vector<uint64_t> want;
  for (int k = 0; k < 5; ++k) want.push_back(16 * 8);
  for (int k = 0; k < 8; ++k) want.push_back(1024 * 8);
  for (int k = 0; k < 6; ++k) want.push_back(2048 * 8);
  for (int k = 0; k < 2; ++k) want.push_back(4096 * 8);
  CHECK(copies == want);
  // sum(pow(stack, 2)), ** 0.5, isinf / isnan / logical_or, err, torch.where (fp64);
  // step's vector_norm(stack(norm_groups)); _global_grad_norm (fp64); the sub group's flat
  // gradient and fp32 cast; the clip chain in fp64.
  Allocs tail{{stack, 21 * 8}, {stack, 21 * 8}, {kScalar3, 8}, {kScalar3, 8}};
  add_mask(tail, kScalar3);
  tail.insert(tail.end(), {{kScalar3, 8}, {stack, 8}, {kScalar3, 8}, {"_global_grad_norm (ZeRO-3)", 8},
                           {"bf16 flat grad of sub group 0 (ZeRO-3)", 28752 * 2},
                           {"grad of fp32 partition of sub group 0 (ZeRO-3)", 28752 * 4}});
  add_clip(tail, kScalar3, 8);
  CHECK(Allocs(got.begin() + 42, got.end()) == tail);
  // The 1-byte inf_or_nan_tracker: made once by __init__, kept.
  CHECK(allocs(p, "inf_or_nan_tracker (ZeRO-3 overflow flag)") == std::vector<uint64_t>{1});
  CHECK(live_at_end(p, "inf_or_nan_tracker (ZeRO-3 overflow flag)") == 1);
  CHECK(live_named_before(p, "_global_grad_norm (ZeRO-3)", oe) == 8);

  // fp16: has_overflow masks the whole grad partitions buffer (28752 bool) twice, on the
  // reduce stream, before the norms.
  std::string y = small_llama(4, "  zero: 3\n", ds);
  y.replace(y.find("params: bf16"), 12, "params: fp16");
  const Program h = build_program(load(y));
  const auto [hb, he] = step_window(h);
  const Allocs fp16 = ds_allocs(h, hb, he);
  const std::string mask = "inf / nan mask of gradients (ZeRO-3 overflow check)";
  REQUIRE(fp16.size() > 6);
  CHECK(Allocs(fp16.begin(), fp16.begin() + 6) ==
        Allocs{{mask, 28752}, {kScalar3, 1}, {mask, 28752}, {kScalar3, 1}, {kScalar3, 1}, {kScalar3, 1}});
  const TensorNames names(h);
  size_t on_reduce = 0;
  for (size_t i = hb; i < he; ++i)
    if (h.events[i].type == EventType::alloc && named_as(names, h.events[i].tensor, mask)) on_reduce += h.events[i].stream == 1;
  CHECK(on_reduce == 2);
}

TEST_CASE("DeepSpeed offload: norms taken in backward, kept until the step", "[deepspeed][clip]") {
  // ZeRO-2 cpu offload: at the boundary each partition gradient's fp64 norm (of its slice:
  // o_proj's 80 elements) is kept, and update_offload_overflow_tracker checks the whole
  // gradient (bf16: x.float() copies); the fp32 cast for the host is of the slice.
  const Program p = build_program(load(small_llama(4, "  zero: 2\n", "deepspeed:\n  reduce_bucket_size: 20000\n"
                                                                     "  offload_optimizer: cpu\n")));
  const size_t measured = mark_index(p, "measured_step_begin");
  const auto [be, oe] = step_window(p);
  const std::string f64 = "fp64 copy of a gradient for its norm (ZeRO-2 grad norm)";
  std::vector<uint64_t> copies;
  const TensorNames names(p);
  for (size_t i = measured; i < be; ++i)
    if (p.events[i].type == EventType::alloc && named_as(names, p.events[i].tensor, f64)) copies.push_back(p.events[i].bytes);
  std::sort(copies.begin(), copies.end());
  CHECK(copies == std::vector<uint64_t>{80 * 8, 4096 * 8, 4096 * 8, 4096 * 8, 16384 * 8});
  CHECK(allocs(p, "fp32 cast of grad of model.layers.0.self_attn.o_proj.weight for the host (ZeRO-2 offload_optimizer)") ==
        std::vector<uint64_t>{80 * 4, 80 * 4});
  // Five fp64 norms alive at backward_end, gone after the step (reset_cpu_buffers).
  CHECK(live_named_before(p, kScalar2, be) == 5 * 8);
  CHECK(live_named_before(p, kScalar2, oe) == 0);
  // The step on the GPU: only total_dev_norm (FloatTensor([...]), 4 B).
  CHECK(ds_allocs(p, be, oe) == Allocs{{kScalar2, 4}});

  // ZeRO-3 offload: _constant_buffered_norm2 of each GPU partition copy (reduce stream),
  // kept; the step sums them per sub group on the GPU.
  const Program z3 = build_program(load(small_llama(4, "  zero: 3\n", "deepspeed:\n  reduce_bucket_size: 20000\n"
                                                                      "  offload_optimizer: cpu\n")));
  const auto [zb, ze] = step_window(z3);
  CHECK(live_named_before(z3, kScalar3, zb) == 21 * 8);
  CHECK(live_named_before(z3, kScalar3, ze) == 0);
  CHECK(allocs(z3, "inf_or_nan_tracker (ZeRO-3 overflow flag)").empty());  // on the host
}

TEST_CASE("DeepSpeed gradient_clipping and optimizer.max_grad_norm are one setting", "[deepspeed][clip]") {
  using Catch::Contains;
  memsim_test::TempDir dir("ds_clip_keys");
  auto json = [&](const std::string& name, const std::string& clip) {
    const std::string path = (dir.path / name).string();
    std::ofstream(path) << "{\"bf16\": {\"enabled\": true}, \"zero_optimization\": {\"stage\": 2},"
                           " \"gradient_clipping\": " << clip << "}";
    return path;
  };
  auto with = [&](const std::string& file, const std::string& extra = "") {
    return small_llama(4, "", "deepspeed:\n  config: " + file + "\n" + extra);
  };
  // A number in ds.json is the clip; "auto" takes optimizer.max_grad_norm (HF Trainer's
  // fill); 0 is none.
  CHECK(load(with(json("one.json", "1.0"))).optimizer.max_grad_norm == 1.0);
  CHECK_FALSE(load(with(json("zero.json", "0"))).optimizer.max_grad_norm.has_value());
  CHECK_FALSE(load(with(json("auto.json", "\"auto\""))).optimizer.max_grad_norm.has_value());
  CHECK(load(with(json("auto2.json", "\"auto\""), "optimizer:\n  max_grad_norm: 0.3\n")).optimizer.max_grad_norm == 0.3);
  CHECK(load(with(json("same.json", "0.3"), "optimizer:\n  max_grad_norm: 0.3\n")).optimizer.max_grad_norm == 0.3);
  // A mismatch is refused (HF Trainer's fill_match); a bad value names the key.
  CHECK_THROWS_WITH(load(with(json("diff.json", "1.0"), "optimizer:\n  max_grad_norm: 0.3\n")),
                    Contains("diff.json: gradient_clipping: 1.0 disagrees with optimizer.max_grad_norm"));
  CHECK_THROWS_WITH(load(with(json("bad.json", "\"x\""))), Contains("bad.json: gradient_clipping: expected a number"));
  // Without the key DeepSpeed does not clip whatever the Trainer's max_grad_norm: refused.
  const std::string none = (dir.path / "none.json").string();
  std::ofstream(none) << "{\"bf16\": {\"enabled\": true}, \"zero_optimization\": {\"stage\": 2}}";
  CHECK_FALSE(load(with(none)).optimizer.max_grad_norm.has_value());
  CHECK_THROWS_WITH(load(with(none, "optimizer:\n  max_grad_norm: 1.0\n")),
                    Contains("optimizer.max_grad_norm: " + none + " has no gradient_clipping"));
  // torch clip_grad_norm_'s knobs do not apply to DeepSpeed's engine.
  CHECK_THROWS_WITH(build_program(load(small_llama(4, "  zero: 2\n", "optimizer:\n  max_grad_norm: 1.0\n  clip_keep_norm: true\n"))),
                    Contains("optimizer.clip_keep_norm: DeepSpeed keeps its norm itself"));
  CHECK_THROWS_WITH(build_program(load(small_llama(4, "  zero: 2\n", "optimizer:\n  max_grad_norm: 1.0\n  clip_foreach: false\n"))),
                    Contains("optimizer.clip_foreach: DeepSpeed clips inside its ZeRO optimizer"));
  // torch.amp.GradScaler stays refused: DeepSpeed's own scaler runs (modelled).
  CHECK_THROWS_WITH(build_program(load(small_llama(4, "  zero: 2\n"), {{"precision.grad_scaler", "true"}})),
                    Contains("precision.grad_scaler"));
}

TEST_CASE("memsim run: the shipped ZeRO-3 scenario clips at 1.0 inside DeepSpeed", "[deepspeed][clip][cli]") {
  // scenarios/llama2-7b-zero3-8xa100.yaml: optimizer.max_grad_norm 1.0 (HF Trainer's default,
  // ds.json "gradient_clipping": "auto"). The peak (in backward) holds the scaled loss (4 B),
  // the previous step's _global_grad_norm (8 B) and the tracker (1 B): 13 B above the run
  // without the norm (29,085,519,624 B before this change, docs/deepspeed.md).
  memsim_test::TempDir dir("ds_clip_cli");
  const std::string scenario = std::string(MEMSIM_SOURCE_DIR) + "/scenarios/llama2-7b-zero3-8xa100.yaml";
  const memsim_test::CliResult text = memsim_test::run_memsim("run '" + scenario + "'", dir);
  REQUIRE(text.status == 0);
  CHECK(text.out.find("gradient_clipping 1") != std::string::npos);
  const memsim_test::CliResult json = memsim_test::run_memsim("run '" + scenario + "' --json -", dir);
  REQUIRE(json.status == 0);
  CHECK(json.out.find("\"peak_requested_bytes\": 29085519637") != std::string::npos);
  // A ds.json that disagrees is refused by its key, exit 1.
  const std::string bad = (dir.path / "clip.json").string();
  std::ofstream(bad) << "{\"bf16\": {\"enabled\": true}, \"zero_optimization\": {\"stage\": 3}, \"gradient_clipping\": 0.5}";
  const memsim_test::CliResult refused = memsim_test::run_memsim("run '" + scenario + "' --set deepspeed.config=" + bad, dir);
  CHECK(refused.status == 1);
  CHECK(refused.err.find("gradient_clipping: 0.5 disagrees with optimizer.max_grad_norm") != std::string::npos);
}
