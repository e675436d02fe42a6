// The preset tables behind `model.preset` and `device.preset`.
#include <cstdio>
#include <string>
#include <vector>

#include "allocator/units.h"
#include "sim/scenario.h"

namespace memsim {
namespace {

struct ModelEntry {
  ModelConfig config;
  const char* source;
};
struct DeviceEntry {
  DeviceConfig config;
  const char* source;
};

ModelConfig model(const char* name, ModelFamily family, int64_t layers, int64_t d_model,
                  int64_t heads, int64_t kv_heads, int64_t d_ff, int64_t vocab,
                  int64_t context_length, bool tied) {
  ModelConfig m;
  m.preset = name;
  m.family = family;
  m.layers = layers;
  m.d_model = d_model;
  m.heads = heads;
  m.kv_heads = kv_heads;
  m.d_ff = d_ff;
  m.vocab = vocab;
  m.context_length = context_length;
  m.tied_embeddings = tied;
  return m;
}

const std::vector<ModelEntry>& model_table() {
  using F = ModelFamily;
  // CS336 sizes: the assignment's model table (shared/groundtruth SOURCES.md). Their
  // context_length is 0 = "the benchmarked sequence length": the CS336 benchmarking
  // scripts build the model with context_length = the length they measure, and the RoPE
  // buffer (2 x ctx x h/2 fp32) of the real snapshots is sized that way (cs336-model.md
  // §8.3: 40,960 B at ctx 128, 655,360 B at ctx 2048).
  static const char* cs336 = "CS336 assignment model table; vocab 10000, untied (cs336-model.md)";
  static const char* gpt2 = "Hugging Face gpt2* configs (n_positions 1024, tied lm_head)";
  static const std::vector<ModelEntry> table = {
      {model("cs336-small", F::cs336, 12, 768, 12, 12, 3072, 10000, 0, false), cs336},
      {model("cs336-medium", F::cs336, 24, 1024, 16, 16, 4096, 10000, 0, false), cs336},
      {model("cs336-large", F::cs336, 36, 1280, 20, 20, 5120, 10000, 0, false), cs336},
      {model("cs336-xl", F::cs336, 32, 2560, 32, 32, 10240, 10000, 0, false),
       "CS336 2026 handout 'xl' (= the 2025 handout's '2.7B'); vocab 10000, untied"},
      {model("cs336-2.7b", F::cs336, 32, 2560, 32, 32, 10240, 10000, 0, false),
       "CS336 2025 handout '2.7B' (same shape as cs336-xl)"},
      {model("gpt2-small", F::hf_gpt2, 12, 768, 12, 12, 3072, 50257, 1024, true), gpt2},
      {model("gpt2-medium", F::hf_gpt2, 24, 1024, 16, 16, 4096, 50257, 1024, true), gpt2},
      {model("gpt2-large", F::hf_gpt2, 36, 1280, 20, 20, 5120, 50257, 1024, true), gpt2},
      {model("gpt2-xl", F::hf_gpt2, 48, 1600, 25, 25, 6400, 50257, 1024, true), gpt2},
      {model("llama2-7b", F::hf_llama, 32, 4096, 32, 32, 11008, 32000, 4096, false),
       "meta-llama/Llama-2-7b-hf config.json"},
      {model("llama2-13b", F::hf_llama, 40, 5120, 40, 40, 13824, 32000, 4096, false),
       "meta-llama/Llama-2-13b-hf config.json"},
      {model("llama3-8b", F::hf_llama, 32, 4096, 32, 8, 14336, 128256, 8192, false),
       "meta-llama/Meta-Llama-3-8B config.json (GQA, 8 KV heads)"},
      // Megatron's GPT shares the input embedding with the output layer by default.
      {model("gpt3-175b", F::megatron, 96, 12288, 96, 96, 49152, 50257, 2048, true),
       "GPT-3 paper (Brown et al. 2020) table 2.1; Megatron-LM GPT layout"},
  };
  return table;
}

// Capacity = cudaMemGetInfo's total as PyTorch prints it in OOM messages ("GPU 0 has a
// total capacity of 79.11 GiB"), which is a little below the marketing size. Those
// messages print 2 decimals, so each value is good to about +-5 MiB; where no message
// was at hand the value is an estimate and says so. Written in hundredths of a GiB.
constexpr uint64_t capacity_gib_x100(uint64_t hundredths) { return hundredths * 1024 / 100 * MiB; }

// CUDA context: invisible to the allocator, created on first use and grown as kernels
// load lazily during the first iteration. pytorch-allocator.md §12 quotes ~300 MiB at
// creation on recent stacks and 200-700 MiB depending on the GPU; a training process
// that has run its kernels sits in the middle of that range, so every preset uses
// 500 MiB. Override device.cuda_context with a measured value (nvidia-smi minus
// torch.cuda.memory_reserved()) when it matters.
constexpr uint64_t kContext = 500 * MiB;

// cuBLAS workspace: 32 MiB (4096 KiB x 8) on compute capability 9.0, else
// 2 x 4096 KiB + 8 x 16 KiB = 8,519,680 B (pytorch-allocator.md §12; cs336-model.md §1).
// B200 (sm_100) uses the small size: the bolongcheng B200 forward peaks equal
// LINYUNLinYun's, whose baseline needs exactly 8,519,680 B (cs336-model.md §8.3).
constexpr uint64_t kWorkspaceSm90 = 33554432;
constexpr uint64_t kWorkspaceDefault = 8519680;

DeviceConfig device(const char* name, uint64_t hundredths, uint64_t workspace) {
  DeviceConfig d;
  d.preset = name;
  d.capacity = capacity_gib_x100(hundredths);
  d.cuda_context = kContext;
  d.cublas_workspace = workspace;
  return d;
}

// A device measured on a lent machine: cudaMemGetInfo's total, and the device memory in
// use outside the caching allocator after a training step (context, cuBLAS/cuDNN handles,
// lazily loaded kernels).
DeviceConfig measured_device(const char* name, uint64_t capacity, uint64_t context,
                             uint64_t workspace) {
  DeviceConfig d = device(name, 0, workspace);
  d.capacity = capacity;
  d.cuda_context = context;
  return d;
}

const std::vector<DeviceEntry>& device_table() {
  static const std::vector<DeviceEntry> table = {
      {device("a100-40gb", 3939, kWorkspaceDefault), "OOM messages: 39.39 GiB total"},
      {device("a100-80gb", 7915, kWorkspaceDefault), "OOM messages: 79.15 GiB total"},
      {measured_device("h100-80gb", 85017493504ull, 787283968ull, kWorkspaceSm90),
       "measured (tests/data/h100/cuda_runs.json): H100 80GB HBM3, driver 580, CUDA 13, "
       "PyTorch 2.11: 79.18 GiB total, 750.8 MiB outside the allocator after a training step"},
      // No OOM message at hand for these two: nvidia-smi's total (H200 143,771 MiB,
      // B200 183,359 MiB) less the ~0.54 GiB an H100 shows between nvidia-smi (81,559 MiB)
      // and cudaMemGetInfo (79.11 GiB).
      {device("h200", 13986, kWorkspaceSm90), "estimate: nvidia-smi 143,771 MiB less ~0.54 GiB"},
      {device("b200", 17852, kWorkspaceDefault), "estimate: nvidia-smi 183,359 MiB less ~0.54 GiB"},
      {device("rtx-4070", 1172, kWorkspaceDefault), "OOM messages: 11.72 GiB total"},
      {device("rtx-4090", 2365, kWorkspaceDefault),
       "OOM messages: 23.64-23.69 GiB total depending on the driver; 23.65 taken"},
      {device("mi300x", 19198, kWorkspaceDefault),
       "ROCm OOM messages: 191.98 GiB total; hipBLAS workspace not verified"},
      {device("v100-16gb", 1577, kWorkspaceDefault), "OOM messages: 15.77 GiB total"},
      {device("v100-32gb", 3174, kWorkspaceDefault), "OOM messages: 31.74 GiB total"},
  };
  return table;
}

std::string model_summary(const ModelConfig& m) {
  std::string s = std::string(to_string(m.family)) + ", " + std::to_string(m.layers) +
                  " layers, d_model " + std::to_string(m.d_model) + ", " +
                  std::to_string(m.heads) + " heads";
  if (m.kv_heads != m.heads) s += " (" + std::to_string(m.kv_heads) + " KV)";
  s += ", d_ff " + std::to_string(m.d_ff) + ", vocab " + std::to_string(m.vocab) +
       ", context " + (m.context_length ? std::to_string(m.context_length) : "= seq_len") +
       (m.tied_embeddings ? ", tied" : ", untied");
  return s;
}

std::string device_summary(const DeviceConfig& d) {
  char line[160];
  std::snprintf(line, sizeof line, "capacity %.2f GiB, CUDA context %llu MiB, cuBLAS workspace %s",
                static_cast<double>(d.capacity) / static_cast<double>(GiB),
                static_cast<unsigned long long>(d.cuda_context / MiB),
                d.cublas_workspace == kWorkspaceSm90 ? "32 MiB" : "8,519,680 B");
  return line;
}

}  // namespace

std::vector<PresetInfo> model_presets() {
  std::vector<PresetInfo> out;
  for (const auto& e : model_table()) out.push_back({e.config.preset, model_summary(e.config), e.source});
  return out;
}

std::vector<PresetInfo> device_presets() {
  std::vector<PresetInfo> out;
  for (const auto& e : device_table()) out.push_back({e.config.preset, device_summary(e.config), e.source});
  return out;
}

const ModelConfig* find_model_preset(std::string_view name) {
  for (const auto& e : model_table()) {
    if (e.config.preset == name) return &e.config;
  }
  return nullptr;
}

const DeviceConfig* find_device_preset(std::string_view name) {
  for (const auto& e : device_table()) {
    if (e.config.preset == name) return &e.config;
  }
  return nullptr;
}

}  // namespace memsim
