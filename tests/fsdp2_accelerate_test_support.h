// The HF Trainer + FSDP suites' shared pieces (tests/test_fsdp2_accelerate.cpp,
// tests/test_fsdp2_output_dtype.cpp, tests/test_fsdp1_accelerate.cpp): docs/fsdp2.md's
// worked example in Trainer's loop (FSDP2 or FSDP1), the alloc / free events by name, and
// the live non-parameter bytes along the measured step.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "program/program.h"
#include "program/tensor_names.h"

namespace memsim_test::accelerate {

// docs/fsdp2.md's worked example (2 layers, D 256, F 1000, vocab 1001, ws 4, batch 2 x 64)
// in HF Trainer's loop (the model computes its loss: step.keep_output loss), fp32
// parameters: `precision` and `parallel` add lines to those sections, `model_extra` to the
// model's, `extra` whole sections; `sharding` fsdp2, or fsdp (FSDP1).
inline std::string worked_text(const std::string& precision, const std::string& parallel,
                               const std::string& model_extra = "", const std::string& extra = "",
                               const std::string& sharding = "fsdp2") {
  std::string y =
      "model:\n  family: hf-llama\n  layers: 2\n  d_model: 256\n  heads: 4\n  kv_heads: 4\n"
      "  d_ff: 1000\n  vocab: 1001\n  context_length: 64\n" + model_extra;
  y += "batch:\n  micro_batch: 2\n  seq_len: 64\n";
  y += "precision:\n  params: fp32\n" + precision;
  y += "optimizer:\n  type: adamw\n  impl: foreach\n";
  y += "step:\n  kind: train\n  warmup_steps: 1\n  keep_output: loss\n";
  y += "parallel:\n  data: 4\n  sharding: " + sharding + "\n" + parallel;
  y += extra;
  y += "device:\n  capacity: 1TiB\n  cublas_workspace: 0\n  kernel_scratch: false\n";
  return y;
}

// MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=bf16), without output_dtype.
inline const std::string kPolicy = "  fsdp_mixed_precision: bf16\n  reduce_dtype: bf16\n";

struct Ev {
  memsim::EventType type;
  uint64_t bytes;  // the bytes of the tensor the event concerns
  memsim::Phase phase;
  std::string name;
};

// The alloc / free events from the mark `from` on (empty: from the start; by default the
// measured step's).
inline std::vector<Ev> measured(const memsim::Program& p, const std::string& from = "measured_step_begin") {
  const memsim::TensorNames names(p);
  std::vector<Ev> out;
  bool on = from.empty();
  for (const memsim::MemoryEvent& e : p.events) {
    if (e.type == memsim::EventType::mark && p.str(static_cast<uint32_t>(e.bytes)) == from) on = true;
    if (!on || (e.type != memsim::EventType::alloc && e.type != memsim::EventType::free)) continue;
    out.push_back({e.type, p.tensors[e.tensor].bytes, e.phase, names.name(e.tensor)});
  }
  return out;
}

// The measured step's FSDP2 events of interest, in order (the Accelerate LoRA and tied-
// embedding suites): "ag <phase> <group>" for each flat all-gather output, "rs <group>" for
// each reduce-scatter input, "+<phase> <head_label>" / "-<phase> ..." for the root's
// unsharded lm_head weight and "+<phase> embed" / "-<phase> embed" for the unsharded
// embedding; <phase> is "fwd ", "bwd " or `other_phase` (each suite's spelling).
inline std::vector<std::string> fsdp2_order(const memsim::Program& p, const std::string& other_phase,
                                            const std::string& head_label) {
  using memsim::EventType;
  using memsim::Phase;
  std::vector<std::string> out;
  bool on = false;
  for (const memsim::MemoryEvent& e : p.events) {
    if (e.type == EventType::mark && p.str(static_cast<uint32_t>(e.bytes)) == "measured_step_begin") on = true;
    if (!on || (e.type != EventType::alloc && e.type != EventType::free)) continue;
    const std::string n = p.str(p.tensors[e.tensor].name);
    const std::string ph = e.phase == Phase::backward ? "bwd " : e.phase == Phase::forward ? "fwd " : other_phase;
    const std::string sign = e.type == EventType::alloc ? "+" : "-";
    if (e.type == EventType::alloc && n.rfind("FSDP2 all-gather output (flat) of ", 0) == 0)
      out.push_back("ag " + ph + n.substr(34));
    if (e.type == EventType::alloc && n.rfind("FSDP2 reduce-scatter input (chunk_cat) of ", 0) == 0)
      out.push_back("rs " + n.substr(42));
    if (n == "FSDP2 unsharded lm_head.weight (all_gather_outputs)") out.push_back(sign + ph + head_label);
    if (n == "FSDP2 unsharded model.embed_tokens.weight (all_gather_outputs)") out.push_back(sign + ph + "embed");
  }
  return out;
}

// Live requested bytes of the measured step after each alloc / free ("+name" / "-name" in
// `what`), parameters left out, and FSDP2's own buffers (names "FSDP2...") where
// without_fsdp2_buffers: what the torch stand-ins' trackers see.
struct Live {
  std::vector<int64_t> bytes;
  std::vector<std::string> what;
};
inline Live live_activations(const memsim::Program& p, bool without_fsdp2_buffers = false) {
  const memsim::TensorNames names(p);
  Live l;
  int64_t cur = 0;
  bool on = false;
  for (const memsim::MemoryEvent& e : p.events) {
    if (e.type == memsim::EventType::mark && p.str(static_cast<uint32_t>(e.bytes)) == "measured_step_begin")
      on = true;
    if (!on || (e.type != memsim::EventType::alloc && e.type != memsim::EventType::free)) continue;
    if (p.tensors[e.tensor].kind == memsim::TensorKind::parameter) continue;
    const std::string name = names.name(e.tensor);
    if (without_fsdp2_buffers && name.rfind("FSDP2", 0) == 0) continue;
    cur += (e.type == memsim::EventType::alloc ? 1 : -1) * static_cast<int64_t>(p.tensors[e.tensor].bytes);
    l.bytes.push_back(cur);
    l.what.push_back((e.type == memsim::EventType::alloc ? "+" : "-") + name);
  }
  return l;
}

}  // namespace memsim_test::accelerate
