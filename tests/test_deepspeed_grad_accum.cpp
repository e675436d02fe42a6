// DeepSpeed ZeRO 1/2/3 with gradient accumulation (batch.grad_accum > 1;
// sim/parallel/deepspeed_zero.h, docs/deepspeed.md "Gradient accumulation"): the ZeRO-3
// micro-batches after the first fetch, prefetch and reduce-scatter exactly as the hand
// derivation from DeepSpeed 0.19.6's source says, the step runs at the boundary only, the
// later micro-batches' peaks equal the first's, and stages 1 / 2 (with and without offload)
// keep what the source keeps between micro-batches.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "cli_test_support.h"
#include "deepspeed_test_support.h"
#include "program/tensor_names.h"
#include "sim/step/schedule.h"
#include "test_paths.h"

using namespace memsim;
using namespace memsim_test::deepspeed;

namespace {

// [begin, end) of each micro-batch: from its first forward event to the next micro-batch's
// (the last one of a step ends at its first optimizer event; the run's last at the end).
struct Window {
  size_t begin = 0, end = 0;
};
std::vector<Window> micro_batches(const Program& p) {
  std::vector<Window> w;
  for (size_t i = 0; i < p.events.size(); ++i) {
    const Phase ph = p.events[i].phase;
    const bool starts = ph == Phase::forward && (i == 0 || (p.events[i - 1].phase != Phase::forward &&
                                                            p.events[i - 1].phase != Phase::loss));
    if (starts) {
      if (!w.empty() && w.back().end == 0) w.back().end = i;
      w.push_back({i, 0});
    } else if (ph == Phase::optimizer && !w.empty() && w.back().end == 0) {
      w.back().end = i;
    }
  }
  if (!w.empty() && w.back().end == 0) w.back().end = p.events.size();
  return w;
}

// Requested bytes live after each event (the caching allocator's rounding aside).
std::vector<int64_t> live_curve(const Program& p) {
  std::vector<int64_t> out(p.events.size());
  int64_t live = 0;
  for (size_t i = 0; i < p.events.size(); ++i) {
    const MemoryEvent& e = p.events[i];
    if (e.type == EventType::alloc) live += static_cast<int64_t>(e.bytes);
    if (e.type == EventType::free) live -= static_cast<int64_t>(p.tensors[e.tensor].bytes);
    out[i] = live;
  }
  return out;
}
int64_t peak(const std::vector<int64_t>& curve, Window w) {
  return *std::max_element(curve.begin() + static_cast<std::ptrdiff_t>(w.begin),
                           curve.begin() + static_cast<std::ptrdiff_t>(w.end));
}

// DeepSpeed's own allocations in [from, to) (deepspeed_test_support.h; no scaled loss here).
Allocs ds_allocs(const Program& p, size_t from, size_t to) {
  return memsim_test::deepspeed::ds_allocs(p, from, to, false);
}

// Allocations named `glob` in the window.
size_t count_in(const Program& p, const std::string& glob, Window w) {
  const TensorNames names(p);
  size_t n = 0;
  for (size_t i = w.begin; i < w.end; ++i)
    if (p.events[i].type == EventType::alloc && named_as(names, p.events[i].tensor, glob)) ++n;
  return n;
}

const std::string kZero3 =
    "deepspeed:\n  reduce_bucket_size: 20000\n  stage3_param_persistence_threshold: 100\n"
    "  stage3_prefetch_bucket_size: 10000\n";

Program zero3(int64_t grad_accum, int64_t warmup = 1, const std::string& extra = "") {
  return build_program(load(small_llama(4, "  zero: 3\n", kZero3 + extra),
                            {{"batch.grad_accum", std::to_string(grad_accum)},
                             {"step.warmup_steps", std::to_string(warmup)}}));
}

const char* kGathers = "ZeRO-3 *all-gather of *";

}  // namespace

TEST_CASE("DeepSpeed ZeRO-3 gradient accumulation: a later micro-batch and the step by hand",
          "[deepspeed][grad-accum]") {
  // The small Llama (deepspeed_test_support.h) on d = 4, bf16: every parameter divisible by
  // 4, so a gather of n elements is n x 2 B and rank 0's partitions sum to 115008 / 4 = 28752.
  // Norms (64 <= persistence threshold 100) persist; reduce_bucket_size 20000,
  // stage3_prefetch_bucket_size 10000, max_live / max_reuse at DeepSpeed's 1e9.
  const Program p = zero3(2);
  const auto mbs = micro_batches(p);
  REQUIRE(mbs.size() == 4);  // warm-up step: 2 micro-batches, measured step: 2
  const size_t measured = mark_index(p, "measured_step_begin");
  REQUIRE(measured != SIZE_MAX);
  CHECK(mbs[1].end < measured);
  CHECK(mbs[2].begin > measured);

  // Hand derivation for every micro-batch with a complete trace (reset_step at each forward:
  // the run's first forward+backward is recorded, every later one replays it; nothing is
  // gathered when a forward starts: partitioned_param_coordinator.py fetch_sub_module,
  // __params_to_release, stage3.py backward_epilogue -> release_backward_leftovers).
  //  forward, module by module (fetch what is missing, then prefetch from the trace while
  //  the prefetched numel < 10000):
  //   embedding: fetch embed (16384 el = 32768 B); prefetch q, k, v of layer 0 (4096 each:
  //     4096, 8192 < 10000, 12288 stops) = 24576 B
  //   layer 0 attention: fetch o (8192 B); prefetch gate, up (8192, 16384 stops) = 32768 B
  //   layer 0 mlp: fetch down (16384 B); prefetch layer 1's q, k, v = 24576 B
  //   layer 1 attention, mlp: the same (8192, 32768, 16384); then lm_head is prefetched
  //     (16384 el = 32768 B: the next non-persistent parameter of the trace)
  //  Nothing is released in forward: each parameter is used again in backward within
  //  max_reuse_distance (the trace holds 2 x 115008 elements < 1e9), and in backward each
  //  is still gathered, so backward fetches nothing.
  //  backward, gradients in autograd order (lm_head 16384, norm 64, layer 1: down, up,
  //  gate 8192, post norm 64, o, v, k, q 4096, input norm 64, layer 0 the same, embed 16384)
  //  into the 20000-element bucket; a gradient that does not fit reduce-scatters the
  //  bucket: reduce_scatter_coalesced's input is the bucket's gradients padded to
  //  multiples of d (all divisible here):
  //   [lm_head, norm] 16448 el = 32896 B (when layer 1's down arrives)
  //   [down, up] 16384 = 32768 B (at gate)
  //   [gate, post norm, o, v] 16448 = 32896 B (at k)
  //   [k, q, input norm, layer 0 down] 16448 = 32896 B (at layer 0 up)
  //   [up, gate, post norm] 16448 = 32896 B (at layer 0 o)
  //   [o, v, k, q, input norm] 16448 = 32896 B (at embed)
  //   [embed] alone in the epilogue: one tensor divisible by d, reduce-scattered in place
  //   (no concatenation).
  //  partition_grads copies (micro-batch 0) or add_s (later) each chunk into
  //  grad_partitions_flat_buffer (bf16, the model's grad_accum_dtype): no allocation.
  const std::string rs = "bf16 reduce-scatter input of the IPG bucket (ZeRO-3 reduce_scatter_coalesced)";
  const Allocs hand = {
      {"ZeRO-3 all-gather of model.embed_tokens.weight", 32768},
      {"ZeRO-3 prefetch all-gather of model.layers.0.self_attn (3 parameters)", 24576},
      {"ZeRO-3 all-gather of model.layers.0.self_attn.o_proj.weight", 8192},
      {"ZeRO-3 prefetch all-gather of model.layers.0.mlp (2 parameters)", 32768},
      {"ZeRO-3 all-gather of model.layers.0.mlp.down_proj.weight", 16384},
      {"ZeRO-3 prefetch all-gather of model.layers.1.self_attn (3 parameters)", 24576},
      {"ZeRO-3 all-gather of model.layers.1.self_attn.o_proj.weight", 8192},
      {"ZeRO-3 prefetch all-gather of model.layers.1.mlp (2 parameters)", 32768},
      {"ZeRO-3 all-gather of model.layers.1.mlp.down_proj.weight", 16384},
      {"ZeRO-3 prefetch all-gather of lm_head.weight", 32768},
      {rs, 32896}, {rs, 32768}, {rs, 32896}, {rs, 32896}, {rs, 32896}, {rs, 32896},
  };
  // The warm-up's second micro-batch (the trace completed by the first) and both measured
  // ones: exactly the hand list.
  CHECK(ds_allocs(p, mbs[1].begin, mbs[1].end) == hand);
  CHECK(ds_allocs(p, mbs[2].begin, mbs[2].end) == hand);
  CHECK(ds_allocs(p, mbs[3].begin, mbs[3].end) == hand);
  // The run's first micro-batch records the trace: no prefetch; each module's gather is
  // released when it is left (q, k, v, o of a layer in one coalesced buffer).
  CHECK(count_in(p, "ZeRO-3 prefetch all-gather of *", mbs[0]) == 0);
  CHECK(count_in(p, "ZeRO-3 all-gather of model.layers.0.self_attn (4 parameters)", mbs[0]) == 2);

  // No gathered parameter outlives a micro-batch (release_backward_leftovers), and the
  // later micro-batch's peak equals the first's: they start from the same state.
  for (size_t k = 0; k < mbs.size(); ++k) CHECK(live_named_before(p, kGathers, mbs[k].end) == 0);
  const auto curve = live_curve(p);
  CHECK(peak(curve, mbs[3]) == peak(curve, mbs[2]));
  CHECK(curve[mbs[3].begin - 1] == curve[mbs[2].begin - 1]);

  // The step at the boundary only, in the measured step: _prepare_fp32_grad_for_sub_group's
  // flat bf16 gradient (28752 x 2 B) and its fp32 cast (28752 x 4 B); FusedAdam's state was
  // made by the warm-up's step.
  const size_t opt_end = mark_index(p, "optimizer_end");
  REQUIRE(opt_end != SIZE_MAX);
  // (The step's gradient-norm scalars and fp64 copies between them are
  // test_deepspeed_norm.cpp's; left out here.)
  Allocs step_buffers;
  for (const auto& a : ds_allocs(p, mbs[3].end, opt_end))
    if (a.first.find("norm") == std::string::npos) step_buffers.push_back(a);
  CHECK(step_buffers == Allocs{{"bf16 flat grad of sub group 0 (ZeRO-3)", 28752 * 2},
                               {"grad of fp32 partition of sub group 0 (ZeRO-3)", 28752 * 4}});
  CHECK(allocs(p, "* flat grad of sub group 0 (ZeRO-3)").size() == 2);  // one per step, not per micro-batch
  CHECK(allocs(p, "exp_avg of fp32 partition of *").size() == 1);
  // One gradient partition buffer for the run: the micro-batches accumulate into it.
  CHECK(allocs(p, "* gradient partitions of the trainable parameters (ZeRO-3 grad_partitions_flat_buffer)") ==
        std::vector<uint64_t>{28752 * 2});
}

TEST_CASE("DeepSpeed ZeRO-3: the measured step's peak does not depend on grad_accum",
          "[deepspeed][grad-accum]") {
  // DeepSpeed's estimators (estimate_zero3_model_states_mem_needs_all_live) have no
  // gradient-accumulation term: the model states after the step are the same, and so is
  // every measured micro-batch's peak (same state at each forward's start).
  const Program one = zero3(1);
  const auto c1 = live_curve(one);
  const auto m1 = micro_batches(one);
  const size_t opt1 = mark_index(one, "optimizer_end");
  for (int64_t ga : {2, 3}) {
    const Program p = zero3(ga);
    const auto c = live_curve(p);
    const auto m = micro_batches(p);
    REQUIRE(m.size() == static_cast<size_t>(2 * ga));
    for (size_t k = static_cast<size_t>(ga); k < m.size(); ++k) CHECK(peak(c, m[k]) == peak(c1, m1.back()));
    CHECK(c[mark_index(p, "optimizer_end")] == c1[opt1]);
  }
  // Without a warm-up step the measured step's first micro-batch records the trace and the
  // second prefetches (reset_step: RECORD, then COMPLETE, at any forward).
  const Program cold = zero3(2, 0);
  const auto mc = micro_batches(cold);
  REQUIRE(mc.size() == 2);
  CHECK(count_in(cold, "ZeRO-3 prefetch all-gather of *", mc[0]) == 0);
  CHECK(count_in(cold, "ZeRO-3 prefetch all-gather of *", mc[1]) == 5);
}

TEST_CASE("DeepSpeed ZeRO-3 offload_optimizer: the fp32 casts at the boundary only",
          "[deepspeed][grad-accum]") {
  // partition_grads with the buffer on the host: each reduced partition is copied to the
  // GPU every micro-batch (micro-batch 0: .to(device) after the copy; later: the GPU copy
  // add_ runs on), and cast to fp32 for the host gradient only when
  // is_gradient_accumulation_boundary() (_offload_grad_partition_at_boundary). 21
  // trainable parameters (embed, lm_head, final norm, 9 per layer).
  const Program p = zero3(2, 1, "  offload_optimizer: cpu\n");
  const auto mbs = micro_batches(p);
  REQUIRE(mbs.size() == 4);
  for (size_t k = 0; k < mbs.size(); ++k) {
    const bool boundary = k % 2 == 1;
    CHECK(count_in(p, "ZeRO-3 grad partition of * on the GPU (offload_optimizer)", mbs[k]) == 21);
    CHECK(count_in(p, "fp32 cast of ZeRO-3 grad partition of * (offload_optimizer)", mbs[k]) == (boundary ? 21 : 0));
  }
  // The host buffers do not depend on grad_accum at stage 3.
  CHECK(p.host.pinned == zero3(1, 1, "  offload_optimizer: cpu\n").host.pinned);
}

TEST_CASE("DeepSpeed ZeRO-2 gradient accumulation: the first micro-batch's partition is kept",
          "[deepspeed][grad-accum]") {
  // stage_1_and_2.py independent_gradient_partition_epilogue, every micro-batch: the first
  // one's all_grad_tensors (views of its grads_in_partition: 32768 bf16 elements, the
  // parameters overlapping rank 0's partition) are kept, a later one's are add_ed into them
  // and its own grads_in_partition dies with _release_ipg_buffers; the step (flatten, fp32
  // cast) at the boundary only.
  const std::string ds = "deepspeed:\n  reduce_bucket_size: 20000\n";
  const Program p = build_program(load(small_llama(4, "  zero: 2\n", ds), {{"batch.grad_accum", "2"}}));
  const auto mbs = micro_batches(p);
  REQUIRE(mbs.size() == 4);
  const std::string gip = "* gradients in group 0's partition (ZeRO-* grads_in_partition)";
  CHECK(allocs(p, gip) == std::vector<uint64_t>(4, 32768 * 2));
  CHECK(live_named_before(p, gip, mbs[3].begin) == 32768 * 2);  // micro-batch 0's, held
  CHECK(live_named_before(p, gip, mbs[3].end) == 32768 * 2);    // micro-batch 1's died
  CHECK(allocs(p, "* flat grad of group 0's partition (ZeRO-*)").size() == 2);
  CHECK(allocs(p, "* IPG gradient bucket * (ZeRO-* ipg_buffer)").size() == 4);  // per backward

  // offload_optimizer cpu: before the boundary the partition's gradients go to
  // accumulated_grads_in_cpu (one pinned bf16 buffer per parameter in the partition, whole:
  // 32768 elements) through views of temp_grad_buffer_for_gpu_offload; the fp32 cast of
  // async_inplace_copy_grad_to_fp32_buffer_from_gpu runs at the boundary only (5 parameters
  // overlap the partition: embed, layer 0's q, k, v, o).
  const std::string off = ds + "  offload_optimizer: cpu\n";
  const Program o = build_program(load(small_llama(4, "  zero: 2\n", off), {{"batch.grad_accum", "2"}}));
  const Program o1 = build_program(load(small_llama(4, "  zero: 2\n", off)));
  CHECK(o.host.pinned == o1.host.pinned + 32768 * 2);
  CHECK(o.host.pageable == o1.host.pageable);
  const auto mo = micro_batches(o);
  REQUIRE(mo.size() == 4);
  for (size_t k = 0; k < mo.size(); ++k)
    CHECK(count_in(o, "fp32 cast of grad of * for the host (ZeRO-2 offload_optimizer)", mo[k]) == (k % 2 == 1 ? 5 : 0));
}

TEST_CASE("DeepSpeed ZeRO-1 gradient accumulation: whole gradients until the boundary",
          "[deepspeed][grad-accum]") {
  // engine.allreduce_gradients at stage 1 reduces only at the boundary (reduce_gradients,
  // then the epilogue); before it the gradients stay whole and autograd accumulates into
  // them, and the bucket setup_buckets allocated at the first hook stays (ready_for_gradients).
  const Program p = build_program(load(small_llama(4, "  zero: 1\n"), {{"batch.grad_accum", "2"}}));
  const auto mbs = micro_batches(p);
  REQUIRE(mbs.size() == 4);
  // Every parameter's bf16 gradient is alive when the second micro-batch starts.
  CHECK(live_named_before(p, "grad of model.*", mbs[3].begin) + live_named_before(p, "grad of lm_head.weight", mbs[3].begin) ==
        kTotal * 2);
  // One bucket per step (at the first micro-batch's first hook), not per backward.
  CHECK(allocs(p, "* IPG gradient bucket * (ZeRO-* ipg_buffer)") == std::vector<uint64_t>{1000000000, 1000000000});
  // At the boundary reduce_gradients moves the partition's gradients into grads_in_partition
  // (once per step) and the epilogue drops the model's, as without accumulation.
  const size_t be = mark_index(p, "backward_end");
  REQUIRE(be != SIZE_MAX);
  CHECK(live_named_before(p, "grad of model.*", be) == 0);
  CHECK(live_named_before(p, "* gradients in group 0's partition (ZeRO-* grads_in_partition)", be) == 32768 * 2);
  CHECK(allocs(p, "* gradients in group 0's partition (ZeRO-* grads_in_partition)").size() == 2);
  CHECK(allocs(p, "* flat grad of group 0's partition (ZeRO-*)").size() == 2);
}

TEST_CASE("memsim run: Llama 2 7B ZeRO-3 with grad_accum 4 (docs/deepspeed.md)", "[deepspeed][grad-accum][cli]") {
  // The documented example: the peak's requested bytes equal grad_accum 1's, the model
  // states after the step too.
  memsim_test::TempDir dir("ds_ga_cli");
  const std::string scenario = std::string(MEMSIM_SOURCE_DIR) + "/scenarios/llama2-7b-zero3-8xa100.yaml";
  auto number = [](const std::string& json, const std::string& key) {
    std::smatch m;
    REQUIRE(std::regex_search(json, m, std::regex("\"" + key + "\": ([0-9]+)")));
    return std::stoull(m[1]);
  };
  auto optimizer_end = [](const std::string& json) {
    std::smatch m;
    REQUIRE(std::regex_search(json, m, std::regex("\"optimizer_end\": \\{[^}]*\"allocated\": ([0-9]+)")));
    return std::stoull(m[1]);
  };
  const memsim_test::CliResult four =
      memsim_test::run_memsim("run '" + scenario + "' --set batch.grad_accum=4 --json -", dir);
  const memsim_test::CliResult one = memsim_test::run_memsim("run '" + scenario + "' --json -", dir);
  REQUIRE(four.status == 0);
  REQUIRE(one.status == 0);
  CHECK(number(four.out, "peak_requested_bytes") == 29085519637ull);
  CHECK(number(one.out, "peak_requested_bytes") == 29085519637ull);
  CHECK(optimizer_end(four.out) == 14759328256ull);
  CHECK(optimizer_end(one.out) == 14759328256ull);
  // The other rows of docs/deepspeed.md's tables: ZeRO-3 with full checkpointing (equal for
  // grad_accum 1 and 2), ZeRO-2 and ZeRO-1 (higher with accumulation, as their source says).
  auto peak_of = [&](const std::string& sets) {
    const memsim_test::CliResult r = memsim_test::run_memsim("run '" + scenario + "' " + sets + " --json -", dir);
    REQUIRE(r.status == 0);
    return number(r.out, "peak_requested_bytes");
  };
  CHECK(peak_of("--set checkpoint.policy=full") == 19810391845ull);
  CHECK(peak_of("--set checkpoint.policy=full --set batch.grad_accum=2") == 19810391845ull);
  CHECK(peak_of("--set parallel.zero=2") == 37416706832ull);
  CHECK(peak_of("--set parallel.zero=2 --set batch.grad_accum=2") == 39117546256ull);
  CHECK(peak_of("--set parallel.zero=1") == 39059858188ull);
  CHECK(peak_of("--set parallel.zero=1 --set batch.grad_accum=2") == 51417442064ull);
}

TEST_CASE("DeepSpeed ZeRO-3 gradient accumulation on hf-gpt2 (tied head) and cs336",
          "[deepspeed][grad-accum]") {
  // The same replay for the other families: every micro-batch after the run's first
  // allocates exactly what the next one does, none leaves a gathered buffer behind, and the
  // measured micro-batches peak alike (grad_accum 3, one warm-up step: 6 micro-batches).
  const std::string tail =
      "batch:\n  micro_batch: 2\n  seq_len: 32\n  grad_accum: 3\nprecision:\n  params: bf16\n"
      "parallel:\n  data: 4\n  sharding: deepspeed\n  zero: 3\n"
      "deepspeed:\n  stage3_param_persistence_threshold: 100\n  stage3_prefetch_bucket_size: 10000\n"
      "device:\n  capacity: 1TiB\n  cublas_workspace: 0\n  kernel_scratch: false\n";
  const std::string gpt2 =
      "model:\n  family: hf-gpt2\n  layers: 2\n  d_model: 64\n  heads: 4\n  d_ff: 256\n  vocab: 256\n"
      "  context_length: 32\n  attention: eager\n";
  const std::string cs336 =
      "model:\n  family: cs336\n  layers: 2\n  d_model: 64\n  heads: 4\n  d_ff: 128\n  vocab: 256\n"
      "  context_length: 32\n";
  for (const std::string& model : {gpt2, cs336}) {
    const Program p = build_program(load(model + tail));
    const auto mbs = micro_batches(p);
    REQUIRE(mbs.size() == 6);
    const Allocs later = ds_allocs(p, mbs[1].begin, mbs[1].end);
    CHECK(count_in(p, "ZeRO-3 prefetch all-gather of *", mbs[1]) > 0);
    CHECK(count_in(p, "ZeRO-3 prefetch all-gather of *", mbs[0]) == 0);
    for (size_t k = 2; k < mbs.size(); ++k) CHECK(ds_allocs(p, mbs[k].begin, mbs[k].end) == later);
    for (const Window& w : mbs) CHECK(live_named_before(p, kGathers, w.end) == 0);
    const auto curve = live_curve(p);
    CHECK(peak(curve, mbs[4]) == peak(curve, mbs[3]));
    CHECK(peak(curve, mbs[5]) == peak(curve, mbs[3]));
  }
}
