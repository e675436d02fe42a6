// The HF Trainer + FSDP2 suites' shared pieces (tests/test_fsdp2_accelerate.cpp,
// tests/test_fsdp2_output_dtype.cpp): docs/fsdp2.md's worked example in Trainer's loop and
// the measured step's alloc / free events by name.
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
// model's, `extra` whole sections.
inline std::string worked_text(const std::string& precision, const std::string& parallel,
                               const std::string& model_extra = "", const std::string& extra = "") {
  std::string y =
      "model:\n  family: hf-llama\n  layers: 2\n  d_model: 256\n  heads: 4\n  kv_heads: 4\n"
      "  d_ff: 1000\n  vocab: 1001\n  context_length: 64\n" + model_extra;
  y += "batch:\n  micro_batch: 2\n  seq_len: 64\n";
  y += "precision:\n  params: fp32\n" + precision;
  y += "optimizer:\n  type: adamw\n  impl: foreach\n";
  y += "step:\n  kind: train\n  warmup_steps: 1\n  keep_output: loss\n";
  y += "parallel:\n  data: 4\n  sharding: fsdp2\n" + parallel;
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

// The measured step's alloc / free events.
inline std::vector<Ev> measured(const memsim::Program& p) {
  const memsim::TensorNames names(p);
  std::vector<Ev> out;
  bool on = false;
  for (const memsim::MemoryEvent& e : p.events) {
    if (e.type == memsim::EventType::mark && p.str(static_cast<uint32_t>(e.bytes)) == "measured_step_begin")
      on = true;
    if (!on || (e.type != memsim::EventType::alloc && e.type != memsim::EventType::free)) continue;
    out.push_back({e.type, p.tensors[e.tensor].bytes, e.phase, names.name(e.tensor)});
  }
  return out;
}

}  // namespace memsim_test::accelerate
