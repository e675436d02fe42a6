// The compile suites' shared pieces (tests/test_compile_*.cpp). The tiny decoder of
// test_compile_fixtures.cpp, test_compile_fsdp2.cpp and test_compile_checkpoint.cpp: 2
// layers, d_model 64, 4 heads, vocab 128, 2 x 16 tokens, eager attention; hf-llama with
// GQA (2 kv heads, d_ff 160), hf-gpt2 with d_ff 256. The functorch 1.13 partitions of
// tests/data/torch_cpu/compile_* are of this shape.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "graph/compile.h"
#include "graph/models/decoder.h"
#include "program/program.h"
#include "scenario/hf_family.h"
#include "scenario/scenario.h"

namespace memsim_test {

// A scenario's text: the model and batch above, `params` parameters, Adam (`impl`), one
// warm-up step, then `step_extra` (more `step:` lines), `rest` (other sections) and a
// 1 TiB device without cuBLAS workspace or kernel scratch.
inline std::string tiny_compile_yaml(const std::string& family, const std::string& params,
                                     const std::string& impl, const std::string& step_extra,
                                     const std::string& rest = "") {
  std::string y = "model:\n  family: " + family + "\n  layers: 2\n  d_model: 64\n  heads: 4\n";
  y += family == "hf-llama" ? "  kv_heads: 2\n  d_ff: 160\n" : "  kv_heads: 4\n  d_ff: 256\n";
  y += "  vocab: 128\n  context_length: 64\n  attention: eager\n";
  y += "batch:\n  micro_batch: 2\n  seq_len: 16\n";
  y += "precision:\n  params: " + params + "\n";
  y += "optimizer:\n  type: adamw\n  impl: " + impl + "\n";
  y += "step:\n  kind: train\n  warmup_steps: 1\n" + step_extra;
  y += rest;
  y += "device:\n  capacity: 1TiB\n  cublas_workspace: 0\n  kernel_scratch: false\n";
  return y;
}

// FSDP2's buffers ("FSDP2 ..." names), the measured step's live bytes at forward end and its
// peak, and the measured forward's other allocations, from a Program's events.
inline bool fsdp2_buffer(const memsim::Program& p, uint32_t t) {
  const memsim::TensorInfo& info = p.tensors[t];
  return info.role == memsim::NameRole::none && info.name != 0 && p.str(info.name).rfind("FSDP2", 0) == 0;
}

struct Trace {
  bool ok = true;  // every free follows its alloc, once
  uint64_t forward_end = 0, peak = 0, end = 0;
  // FSDP2's buffers: (alloc?, bytes, stream, name) in event order.
  std::vector<std::tuple<bool, uint64_t, uint8_t, std::string>> fsdp2;
  // The measured forward's other allocations: (bytes, layer).
  std::vector<std::pair<uint64_t, int32_t>> forward;
  // Per layer: did FSDP2's copy-out of the block come before its first activation?
  std::vector<int> gathered_first;
};

inline Trace trace(const memsim::Program& p) {
  Trace t;
  std::vector<uint8_t> live(p.tensors.size(), 0);
  uint64_t cur = 0;
  bool measured = false, forward = false;
  std::vector<int> unsharded(8, 0), first(8, -1);
  for (const memsim::MemoryEvent& e : p.events) {
    if (e.type == memsim::EventType::mark) {
      const std::string& name = p.str(static_cast<uint32_t>(e.bytes));
      if (name == "measured_step_begin") {
        measured = forward = true;
        t.peak = cur;
        t.fsdp2.clear();
      }
      if (name == "forward_end") {
        if (measured) t.forward_end = cur;
        forward = false;
      }
      continue;
    }
    if (e.type != memsim::EventType::alloc && e.type != memsim::EventType::free) continue;
    const bool is_alloc = e.type == memsim::EventType::alloc;
    if (live[e.tensor] == is_alloc) t.ok = false;
    live[e.tensor] = is_alloc;
    cur = is_alloc ? cur + e.bytes : cur - p.tensors[e.tensor].bytes;
    if (measured) t.peak = std::max(t.peak, cur);
    const bool f = fsdp2_buffer(p, e.tensor);
    if (f) t.fsdp2.emplace_back(is_alloc, p.tensors[e.tensor].bytes, e.stream, p.str(p.tensors[e.tensor].name));
    if (!measured || !forward || !is_alloc) continue;
    if (!f) t.forward.emplace_back(e.bytes, e.layer);
    if (e.layer < 0 || e.layer >= 8) continue;
    const std::string name = f ? p.str(p.tensors[e.tensor].name) : std::string();
    if (name.rfind("FSDP2 unsharded", 0) == 0) unsharded[e.layer] = 1;
    if (!f && first[e.layer] < 0) first[e.layer] = unsharded[e.layer];
  }
  t.end = cur;
  t.gathered_first.assign(first.begin(), first.end());
  return t;
}


// One forward of `s`'s decoder under the compile engine alone (no step schedule) with
// `scope` (every block its own region, or the whole model one) and `partitioner`'s rules,
// `hooks` (if any) on the Runtime during it: the regions' statistics.
inline std::vector<memsim::graph::CompiledRegionStats> compiled_forward_regions(
    const memsim::Scenario& s, memsim::graph::CompileScope scope,
    memsim::graph::PartitionerVersion partitioner = memsim::graph::CompileOptions{}.partitioner,
    memsim::graph::RuntimeHooks* hooks = nullptr) {
  using namespace memsim;
  Program program;
  graph::Runtime rt(program);
  graph::CompileOptions o;
  o.scope = scope;
  o.partitioner = partitioner;
  graph::CompileEngine engine(rt, o);
  rt.hooks = hooks;
  graph::DecoderModel model(rt, hf_shape(s));
  model.construct();
  graph::Tensor ids = rt.alloc(s.batch.micro_batch * s.batch.seq_len * 8, TensorKind::input,
                               graph::OpKind::other);
  rt.ctx.phase = Phase::forward;
  rt.begin_graph();
  graph::Tensor logits = model.forward(ids);
  rt.hooks = nullptr;
  rt.freeze();
  return engine.regions();
}

// The block-scope case of compiled_forward_regions.
inline std::vector<memsim::graph::CompiledRegionStats> compiled_block_forward(
    const memsim::Scenario& s, memsim::graph::RuntimeHooks* hooks = nullptr,
    memsim::graph::PartitionerVersion partitioner = memsim::graph::CompileOptions{}.partitioner) {
  return compiled_forward_regions(s, memsim::graph::CompileScope::block, partitioner, hooks);
}

// A region's saved set is `want` (op, bytes), in order: the first is an input (the
// region's primal) or not as `first_input` says, and the saved bytes are want's sum.
inline void check_saved_values(const memsim::graph::CompiledRegionStats& r,
                               const std::vector<std::pair<memsim::graph::OpKind, uint64_t>>& want,
                               bool first_input = true) {
  for (size_t i = 0; i < r.saved_values.size(); ++i)
    UNSCOPED_INFO(i << ": " << memsim::graph::forward_name(r.saved_values[i].op) << " " << r.saved_values[i].bytes);
  REQUIRE(r.saved_values.size() == want.size());
  uint64_t total = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    INFO(i);
    CHECK(r.saved_values[i].op == want[i].first);
    CHECK(r.saved_values[i].bytes == want[i].second);
    total += want[i].second;
  }
  CHECK(r.saved_values[0].input == first_input);
  CHECK(r.saved_bytes == total);
}

}  // namespace memsim_test
