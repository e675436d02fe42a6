// parallel.context (scenario/context_parallel_keys.h, graph/ops/ops_ring.h,
// sim/step/context_parallel_buffers.h): torch's context_parallel as torchtitan drives it.
// No CPU torch runs ring attention (it needs a process group and the CUDA flash kernel), so
// the evidence is hand arithmetic from torch's _context_parallel/_attention.py: the ring's
// exact allocation sequence, its peak and what it leaves behind, forward and backward;
// that every activation of a Llama scales as 1/N; that FSDP2 shards over data x context;
// and the refusals by key.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "graph/ops/ops_ring.h"
#include "graph/runtime.h"
#include "program/program.h"
#include "scenario/scenario.h"
#include "sim/step/schedule.h"
#include "event_span_test_support.h"
#include "step_measure_test_support.h"

using namespace memsim;

namespace {

using memsim_test::allocs_between;

// Live requested bytes over events [from, to) relative to `from`: {peak, end}.
std::pair<int64_t, int64_t> live_between(const Program& p, size_t from, size_t to) {
  const auto [live, peak] = memsim_test::live_and_peak(p, from, to);
  return {peak, live};
}

// Storages whose name starts with "CP ring:" still alive at the end of the program.
int ring_storages_alive(const Program& p) {
  std::vector<int> alive(p.tensors.size(), 0);
  for (const MemoryEvent& e : p.events) {
    if (e.type == EventType::alloc) alive[e.tensor] = 1;
    if (e.type == EventType::free) alive[e.tensor] = 0;
  }
  int n = 0;
  for (size_t t = 0; t < p.tensors.size(); ++t)
    if (alive[t] && p.str(p.tensors[t].name).rfind("CP ring:", 0) == 0) ++n;
  return n;
}

// Bytes of the first storage with this name.
uint64_t named_bytes(const Program& p, const std::string& name) {
  for (const MemoryEvent& e : p.events)
    if (e.type == EventType::alloc && p.str(p.tensors[e.tensor].name) == name) return e.bytes;
  return 0;
}

struct Ring {
  Program program;
  size_t f0 = 0, f1 = 0, b0 = 0;
};

// q, k, v leaves of (B, H, L, hd) bf16, the ring's forward, then backward from the output.
void run_ring(Ring& r, uint64_t B, uint64_t H, uint64_t L, uint64_t hd, graph::RingSpec ring) {
  graph::Runtime rt(r.program);
  rt.kernel_scratch = false;  // the flash backward's scratch is sdpa_flash's (tested there)
  rt.ctx.phase = Phase::forward;
  const uint64_t X = B * H * L * hd * 2;
  int32_t lq = -1, lk = -1, lv = -1;
  graph::Tensor q = rt.alloc_leaf(X, TensorKind::activation, graph::OpKind::other, &lq);
  graph::Tensor k = rt.alloc_leaf(X, TensorKind::activation, graph::OpKind::other, &lk);
  graph::Tensor v = rt.alloc_leaf(X, TensorKind::activation, graph::OpKind::other, &lv);
  rt.begin_graph();
  r.f0 = r.program.events.size();
  graph::Tensor out = graph::sdpa_ring_flash(rt, q, k, v, graph::SdpaShape{B, H, L, hd, 2}, ring);
  r.f1 = r.program.events.size();
  rt.ctx.phase = Phase::backward;
  r.b0 = r.program.events.size();
  rt.backward(out);
  rt.freeze();
}

const char* kLlama =
    "model: {family: hf-llama, layers: 2, d_model: 64, heads: 4, kv_heads: 2, d_ff: 128, "
    "vocab: 96, attention: flash}\n"
    "batch: {micro_batch: 1, seq_len: 128}\n"
    "precision: {params: bf16}\n"
    "optimizer: {type: adamw, impl: foreach}\n"
    "parallel: {data: 8, sharding: fsdp2}\n"
    "device: {cublas_workspace: 0, kernel_scratch: false}\n"
    "step: {warmup_steps: 1}\n";

Scenario with(const std::vector<std::pair<std::string, std::string>>& overrides) {
  return load_scenario_text(kLlama, "cp.yaml", overrides);
}

std::string error_of(const std::vector<std::pair<std::string, std::string>>& overrides) {
  try {
    with(overrides);
  } catch (const ScenarioError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("ring forward, allgather, N=2 rank 0: every buffer by hand", "[context-parallel]") {
  // B 1, H 2, L 8 (this rank's half of S = 16), hd 4, bf16: X = 128 (one local q, k or
  // v), Xf = 256 (fp32), l = 64 (the fp32 logsumexp).
  Ring r;
  run_ring(r, 1, 2, 8, 4, {2, 0, false});
  const std::vector<uint64_t> forward = {
      128, 128,       // key.contiguous(), value.contiguous()
      256, 512,       // step 0: cat([k, v]); all_gather_tensor: 2X x N
      128, 64, 256,   // step 0's kernel: out, logsumexp; merger: out.to(float32)
      64, 32, 128,    // step 1 (1 > rank 0: q's second half): out, logsumexp, fp32 out
      32, 32,         // block_lse - lse, sigmoid
      128, 128, 128,  // out - block_out, the product, the new (half) out
      32, 32, 32,     // lse - block_lse, logsigmoid, the new (half) lse
      64, 256,        // _partial_update's torch.cat: full lse, full fp32 out
      128};           // results(): out.to(bf16), the autograd output
  CHECK(allocs_between(r.program, r.f0, r.f1) == forward);
  const auto [peak, left] = live_between(r.program, r.f0, r.f1);
  // Peak at step 0: k/v copies + the cat + the gathered K/V + out + lse + fp32 out.
  CHECK(peak == 2 * 128 + 256 + 512 + 128 + 64 + 256);
  CHECK(left == 128 + 64);  // the output and the merged logsumexp (saved), nothing else
  CHECK(named_bytes(r.program, "CP ring: all-gathered K/V (allgather rotater)") == 2 * 128 * 2);
  CHECK(named_bytes(r.program, "CP ring: merged logsumexp fp32 (merger)") == 64);
}

TEST_CASE("ring backward, allgather, N=2 rank 0: every buffer by hand", "[context-parallel]") {
  Ring r;
  run_ring(r, 1, 2, 8, 4, {2, 0, false});
  const std::vector<uint64_t> backward = {
      128,               // the root grad (ones_like of the output)
      256, 256, 256,     // zeros_like(q/k/v, float32): the fp32 accumulators
      128, 128,          // key.contiguous(), value.contiguous()
      256, 512,          // step 0: cat([k, v]) (kept by next_kv), all-gathered K/V
      128,               // out.contiguous(): rank 0's merged out is (B,H,L,hd), H > 1
      128, 128, 128,     // step 0's flash backward: dq, dk, dv
      512, 512,          // cat([grad_key, grad_value]) fp32, permute_tensor's output
      32,                // step 1 (i > rank): logsumexp's second half .contiguous()
      64,                // out's second half .contiguous() (B*H > 1; grad_out's is dense at B 1)
      64, 128, 128,      // dq (half q), dk, dv (full k, v)
      512, 512,          // the dK/dV cat and its permute_tensor output
      256,               // _partial_update(grad_query): torch.cat
      128, 256};         // grad_query.to(bf16); the last dK/dV .to(bf16)
  std::vector<uint64_t> got = allocs_between(r.program, r.b0, r.program.events.size());
  REQUIRE(got.size() >= backward.size());
  got.resize(backward.size());
  CHECK(got == backward);
  CHECK(ring_storages_alive(r.program) == 0);  // every ring buffer died with its frame
}

TEST_CASE("ring forward: rank N-1 never halves q, alltoall keeps one K/V chunk in flight",
          "[context-parallel]") {
  // N = 2, rank 1: step 1 (1 <= rank) runs the full q on k/v's first halves (views).
  Ring last;
  run_ring(last, 1, 2, 8, 4, {2, 1, false});
  const std::vector<uint64_t> forward = {128, 128, 256, 512, 128, 64, 256,
                                         128, 64, 256,       // full-size step 1 results
                                         64, 64, 256, 256, 256, 64, 64, 64,  // merge, full size
                                         128};
  CHECK(allocs_between(last.program, last.f0, last.f1) == forward);
  CHECK(live_between(last.program, last.f0, last.f1).second == 128 + 64);
  // alltoall, N = 3, rank 0: per step < N-1 a 2X cat and a 2X permute_tensor output; no
  // all-gather. The peak is at step 1: its received chunk (viewed by k, v) and the one in
  // flight, the sent cat until the wait.
  Ring a2a;
  run_ring(a2a, 1, 2, 12, 4, {3, 0, true});
  const uint64_t X = 2 * 12 * 4 * 2;
  CHECK(named_bytes(a2a.program, "CP ring: all-gathered K/V (allgather rotater)") == 0);
  CHECK(named_bytes(a2a.program, "CP ring: received K/V (permute_tensor)") == 2 * X);
  CHECK(live_between(a2a.program, a2a.f0, a2a.f1).second == static_cast<int64_t>(X + 2 * 12 * 4));
  CHECK(ring_storages_alive(a2a.program) == 0);
}

TEST_CASE("a Llama's activations scale as 1/N, FSDP2 shards over data x context",
          "[context-parallel]") {
  // 8 GPUs: data 8 / context 1, data 4 / context 2, data 2 / context 4. The FSDP2 group is 8
  // ranks in all three, so the parameters' shards and the gathered root are the same; the
  // inputs stay B x S int64 (sharded in place). Every activation of the Llama with flash
  // attention is linear in the local length S/N: what the step holds at its start (the
  // warm-up step's logits, `logits = model(x)`) and what the forward adds beyond the
  // gathered root and the last `shard.clone()` of the labels (B x S/N x 8) fall as 1/N.
  std::vector<Program> p;
  std::vector<memsim_test::StepMeasure> m;
  for (int n : {1, 2, 4}) {
    p.push_back(build_program(
        with({{"parallel.context", std::to_string(n)}, {"parallel.data", std::to_string(8 / n)}})));
    m.push_back(memsim_test::measure_step(p.back()));
  }
  const std::string gate = "FSDP2 shard of model.layers.0.mlp.gate_proj.weight (padded chunk 0)";
  for (const Program& q : p) CHECK(named_bytes(q, gate) == 128 * 64 * 2 / 8);
  auto before = [&](int i) { return static_cast<int64_t>(m[i].before_forward); };
  CHECK(before(0) - before(1) > 0);
  CHECK(before(0) - before(1) == 2 * (before(1) - before(2)));
  // With N > 1 rank 0's ring output is contiguous (B,H,L,hd) and the attention's
  // transpose(1, 2).contiguous() keeps a copy per layer (graph/ops/ops_ring.h), which the
  // one-GPU kernel's layout makes a no-op: also linear in S/N, but absent at N = 1.
  auto d = [&](int i, int n) {
    const int64_t clone = n > 1 ? 1 * (128 / n) * 8 : 0;
    const int64_t transpose_copy = n > 1 ? 2 * 1 * 4 * (128 / n) * 16 * 2 : 0;  // 2 layers
    return static_cast<int64_t>(m[i].forward_end - m[i].before_forward) - clone -
           transpose_copy;
  };
  const int64_t a_half = d(0, 1) - d(1, 2);  // A/2
  CHECK(a_half > 0);
  CHECK(d(1, 2) - d(2, 4) == a_half / 2);   // A/4
  CHECK(m[1].peak < m[0].peak);
  CHECK(m[2].peak < m[1].peak);
  // data 2 x context 2 shards over 4 ranks, as data 4 does; data 2 alone over 2.
  const std::vector<std::pair<std::string, std::string>> c2 = {{"parallel.context", "2"},
                                                               {"parallel.data", "2"}};
  CHECK(named_bytes(build_program(with(c2)), gate) == 128 * 64 * 2 / 4);
  CHECK(named_bytes(build_program(with({{"parallel.data", "4"}})), gate) == 128 * 64 * 2 / 4);
  CHECK(named_bytes(build_program(with({{"parallel.data", "2"}})), gate) == 128 * 64 * 2 / 2);
}

TEST_CASE("parallel.context: combinations fail first, the rest is refused by key",
          "[context-parallel]") {
  CHECK(error_of({{"parallel.context", "2"}}).empty());
  CHECK(error_of({{"parallel.context", "4"}, {"parallel.context_rotate", "alltoall"}}).empty());
  CHECK(error_of({{"parallel.context", "1"}, {"parallel.sharding", "none"}}).empty());
  CHECK_THAT(error_of({{"parallel.context", "0"}}), Catch::Contains("parallel.context"));
  CHECK_THAT(error_of({{"parallel.context_rotate", "ring"}}),
             Catch::Contains("parallel.context_rotate") && Catch::Contains("alltoall"));
  // 128 is not divisible by 2 x 3.
  CHECK_THAT(error_of({{"parallel.context", "3"}}),
             Catch::Contains("parallel.context") && Catch::Contains("batch.seq_len 128") &&
                 Catch::Contains("2 x 3"));
  CHECK_THAT(error_of({{"parallel.context", "2"}, {"model.attention", "eager"}}),
             Catch::Contains("parallel.context") && Catch::Contains("model.attention eager"));
  CHECK_THAT(error_of({{"parallel.context", "2"}, {"parallel.sharding", "none"}}),
             Catch::Contains("parallel.sharding") && Catch::Contains("fsdp2"));
  CHECK_THAT(error_of({{"parallel.context", "2"}, {"parallel.sharding", "fsdp"}}),
             Catch::Contains("parallel.sharding"));
  CHECK_THAT(error_of({{"parallel.context", "2"}, {"model.attention", "mem-efficient"},
                       {"precision.params", "fp32"}}),
             Catch::Contains("model.attention") && Catch::Contains("mem-efficient"));
  CHECK_THAT(error_of({{"parallel.context", "2"}, {"model.architecture", "qwen2"}}),
             Catch::Contains("model.architecture"));
  CHECK_THAT(error_of({{"parallel.context", "2"}, {"lora.rank", "8"},
                       {"lora.targets", "all-linear"}}),
             Catch::Contains("lora.rank"));
  CHECK_THAT(error_of({{"parallel.context", "2"}, {"step.compile", "true"}}),
             Catch::Contains("step.compile"));
  CHECK_THAT(error_of({{"parallel.context", "2"}, {"checkpoint.policy", "sac-op"}}),
             Catch::Contains("checkpoint.policy"));
  CHECK(error_of({{"parallel.context", "2"}, {"checkpoint.policy", "full"}}).empty());
  CHECK_THAT(error_of({{"parallel.context", "2"}, {"step.kind", "forward"}}),
             Catch::Contains("step.kind"));
  CHECK_THAT(error_of({{"parallel.context", "2"}, {"model.implementation", "torchtitan"}}),
             Catch::Contains("model.implementation"));
  CHECK_THAT(error_of({{"parallel.context", "2"}, {"parallel.reshard_after_forward", "2"}}),
             Catch::Contains("parallel.reshard_after_forward"));
  // data 1 x context 8: FSDP2 still shards over the 8 ranks of the context group.
  CHECK(error_of({{"parallel.context", "8"}, {"parallel.data", "1"}}).empty());
  CHECK_NOTHROW(build_program(with({{"parallel.context", "8"}, {"parallel.data", "1"}})));
}

TEST_CASE("parallel.context 2 with full checkpointing: the ring re-runs in backward",
          "[context-parallel]") {
  // Each block's re-run repeats the ring forward: the program holds two all-gathers of
  // K/V per layer per step (forward and re-run) plus the backward's own.
  const Program p = build_program(
      with({{"parallel.context", "2"}, {"parallel.data", "4"}, {"checkpoint.policy", "full"}}));
  size_t gathers = 0;
  for (const MemoryEvent& e : p.events)
    if (e.type == EventType::alloc &&
        p.str(p.tensors[e.tensor].name) == "CP ring: all-gathered K/V (allgather rotater)")
      ++gathers;
  CHECK(gathers == 2 /* steps */ * 2 /* layers */ * 3);
  CHECK(ring_storages_alive(p) == 0);
}
