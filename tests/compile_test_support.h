// The compile suites' tiny decoder (tests/test_compile_fixtures.cpp, test_compile_fsdp2.cpp,
// test_compile_checkpoint.cpp): 2 layers, d_model 64, 4 heads, vocab 128, 2 x 16 tokens,
// eager attention; hf-llama with GQA (2 kv heads, d_ff 160), hf-gpt2 with d_ff 256. The
// functorch 1.13 partitions of tests/data/torch_cpu/compile_* are of this shape.
#pragma once

#include <string>

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

}  // namespace memsim_test
