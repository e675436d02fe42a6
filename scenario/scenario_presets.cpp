// The preset tables behind `model.preset` and `device.preset`: C++ rows for the CS336
// and Megatron models, the Hugging Face models from their config.json files
// (scenarios/models/, compiled in: scenario/embedded_models.h).
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "allocator/units.h"
#include "scenario/embedded_models.h"
#include "scenario/model_architecture.h"
#include "scenario/scenario_family.h"
#include "scenario/model_presets.h"
#include "sim/analysis/parameter_count.h"
#include "scenario/scenario.h"

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
  static const std::vector<ModelEntry> table = {
      {model("cs336-small", F::cs336, 12, 768, 12, 12, 3072, 10000, 0, false), cs336},
      {model("cs336-medium", F::cs336, 24, 1024, 16, 16, 4096, 10000, 0, false), cs336},
      {model("cs336-large", F::cs336, 36, 1280, 20, 20, 5120, 10000, 0, false), cs336},
      {model("cs336-xl", F::cs336, 32, 2560, 32, 32, 10240, 10000, 0, false),
       "CS336 2026 handout 'xl' (= the 2025 handout's '2.7B'); vocab 10000, untied"},
      {model("cs336-2.7b", F::cs336, 32, 2560, 32, 32, 10240, 10000, 0, false),
       "CS336 2025 handout '2.7B' (same shape as cs336-xl)"},
      // Megatron's GPT shares the input embedding with the output layer by default.
      {model("gpt3-175b", F::megatron, 96, 12288, 96, 96, 49152, 50257, 2048, true),
       "GPT-3 paper (Brown et al. 2020) table 2.1; Megatron-LM GPT layout"},
  };
  return table;
}

// Names with their numbers compared as numbers: gemma2-2b < gemma2-9b < gemma2-27b.
bool natural_less(const std::string& a, const std::string& b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const bool da = std::isdigit(static_cast<unsigned char>(a[i])) != 0;
    const bool db = std::isdigit(static_cast<unsigned char>(b[j])) != 0;
    if (da && db) {
      size_t ei = i, ej = j;
      while (ei < a.size() && std::isdigit(static_cast<unsigned char>(a[ei]))) ++ei;
      while (ej < b.size() && std::isdigit(static_cast<unsigned char>(b[ej]))) ++ej;
      const std::string na = a.substr(i, ei - i), nb = b.substr(j, ej - j);
      if (na.size() != nb.size()) return na.size() < nb.size();
      if (na != nb) return na < nb;
      i = ei;
      j = ej;
    } else {
      if (a[i] != b[j]) return a[i] < b[j];
      ++i;
      ++j;
    }
  }
  return a.size() - i < b.size() - j;
}

struct ConfigPreset {
  std::string name;
  HfConfig config;   // the import, sliding rule unresolved
  ModelConfig model; // what find_model_preset() returns
  std::string source;
};

// One embedded config.json, parsed at its first use: a scenario names one preset, and
// parsing all of them (35 files) was half of loading a scenario that names a C++ preset
// or one config (issue #20: start-up). Thread-safe (sweep workers load scenarios in
// parallel). An embedded file that does not parse is a bug the preset tests catch (its
// ScenarioError names the file and key); the exception leaves the slot unparsed.
struct ConfigSlot {
  std::string_view name;
  std::string_view text;
  std::once_flag once;
  ConfigPreset preset;
};

ConfigPreset parse_config_preset(const ConfigSlot& slot) {
  ConfigPreset p;
  p.name = std::string(slot.name);
  const std::string file = "scenarios/models/" + p.name + ".json";
  p.config = parse_hf_config(std::string(slot.text), file);
  p.model = p.config.model;
  p.model.preset = p.name;
  p.model.dropout = 0.0;  // the architecture only (scenario/model_presets.h)
  p.model.arch.sliding_layers = resolve_sliding(p.config.sliding, p.model.layers);
  p.source = "Hugging Face " +
             (p.config.name_or_path.empty() ? std::string() : p.config.name_or_path + " ") +
             "config.json (" + file + ")";
  return p;
}

// The slots in natural name order (the order `memsim presets` lists them in).
const std::vector<std::unique_ptr<ConfigSlot>>& config_slots() {
  static const std::vector<std::unique_ptr<ConfigSlot>> slots = [] {
    std::vector<std::unique_ptr<ConfigSlot>> out;
    for (const EmbeddedFile& f : embedded_model_configs()) {
      out.push_back(std::make_unique<ConfigSlot>());
      out.back()->name = f.name;
      out.back()->text = f.text;
    }
    std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
      return natural_less(std::string(a->name), std::string(b->name));
    });
    return out;
  }();
  return slots;
}

const ConfigPreset& parsed(ConfigSlot& slot) {
  std::call_once(slot.once, [&slot] { slot.preset = parse_config_preset(slot); });
  return slot.preset;
}

// The parsed preset named `name`, or nullptr; parses that one only.
const ConfigPreset* find_config(std::string_view name) {
  for (const auto& slot : config_slots())
    if (slot->name == name) return &parsed(*slot);
  return nullptr;
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

// The time model's datasheet rates (issue #18 item 1; docs/time-model.md): dense tensor
// peaks (the datasheets print the 2:4-sparse figure for TF32/BF16/FP16/FP8 with an
// asterisk; these are half of it), HBM bandwidth, NVLink / Infinity Fabric and PCIe per
// direction (the datasheets print both directions summed: these are half), and the
// network per GPU (one NIC per GPU in the DGX/HGX reference nodes). 0 = the part has no
// such math or link (V100 has no BF16, TF32 or FP8; GeForce cards have no NVLink).
struct Rates {
  double fp32, tf32, bf16, fp16, fp8;  // TFLOP/s dense
  double hbm, nvlink, pcie, network;   // GB/s per direction
};
DeviceConfig with_rates(DeviceConfig d, const Rates& r) {
  constexpr double T = 1e12, G = 1e9;
  d.flops_fp32 = r.fp32 * T;
  d.flops_tf32 = r.tf32 * T;
  d.flops_bf16 = r.bf16 * T;
  d.flops_fp16 = r.fp16 * T;
  d.flops_fp8 = r.fp8 * T;
  d.hbm_bandwidth = r.hbm * G;
  d.nvlink_bandwidth = r.nvlink * G;
  d.pcie_bandwidth = r.pcie * G;
  d.network_bandwidth = r.network * G;
  return d;
}
// NVIDIA A100 Tensor Core GPU datasheet (2021): SXM FP32 19.5, TF32 156, BF16/FP16 312
// TFLOPS dense; HBM2 1,555 GB/s (40GB) / HBM2e 2,039 GB/s (80GB); NVLink 600 GB/s; PCIe
// Gen4 64 GB/s. DGX A100: one 200 Gb/s HDR NIC per GPU (25 GB/s).
constexpr Rates kA100_40{19.5, 156, 312, 312, 0, 1555, 300, 32, 25};
constexpr Rates kA100_80{19.5, 156, 312, 312, 0, 2039, 300, 32, 25};
// NVIDIA H100 Tensor Core GPU datasheet (SXM5): FP32 67, TF32 989*, BF16/FP16 1,979*, FP8
// 3,958* TFLOPS (* sparse); HBM3 3.35 TB/s; NVLink 900 GB/s; PCIe Gen5 128 GB/s. DGX H100:
// one 400 Gb/s NDR NIC per GPU (50 GB/s).
constexpr Rates kH100Sxm{67, 494.5, 989.5, 989.5, 1979, 3350, 450, 64, 50};
// NVIDIA H200 datasheet (SXM): the H100 SXM's math, HBM3e 4.8 TB/s, NVLink 900 GB/s, PCIe
// Gen5 128 GB/s.
constexpr Rates kH200{67, 494.5, 989.5, 989.5, 1979, 4800, 450, 64, 50};
// NVIDIA HGX B200 datasheet (8 GPUs; per GPU): FP32 75 (600/8), TF32 2.2 PF*, BF16/FP16
// 4.5 PF*, FP8 9 PF* (* sparse); HBM3e 8 TB/s; NVLink 5 1.8 TB/s; PCIe Gen5 128 GB/s.
// DGX B200: one 400 Gb/s NIC per GPU.
constexpr Rates kB200{75, 1125, 2250, 2250, 4500, 8000, 900, 64, 50};
// NVIDIA V100 datasheet (SXM2): FP32 15.7, FP16 tensor 125 TFLOPS; HBM2 900 GB/s; NVLink
// 300 GB/s; PCIe Gen3 32 GB/s. DGX-1: 100 Gb/s EDR InfiniBand, one per two GPUs (6.25).
constexpr Rates kV100{15.7, 0, 0, 125, 0, 900, 150, 16, 6.25};
// NVIDIA Ada Lovelace architecture whitepaper (RTX 4090): FP32 82.6; FP16/BF16 tensor with
// FP32 accumulate 165.2, TF32 82.6, FP8 (FP32 accumulate) 330.3 TFLOPS dense; GDDR6X
// 1,008 GB/s; no NVLink; PCIe Gen4 x16 32 GB/s per direction. No network (a workstation).
constexpr Rates kRtx4090{82.6, 82.6, 165.2, 165.2, 330.3, 1008, 0, 32, 0};
// AMD Instinct MI300X datasheet: FP32 163.4 (matrix), TF32 653.7, BF16/FP16 1,307.4, FP8
// 2,614.9 TFLOPS dense; HBM3 5.3 TB/s; Infinity Fabric 896 GB/s peer-to-peer (7 links);
// PCIe Gen5 128 GB/s. One 400 Gb/s NIC per GPU in the reference platform.
constexpr Rates kMi300x{163.4, 653.7, 1307.4, 1307.4, 2614.9, 5300, 448, 64, 50};

const std::vector<DeviceEntry>& device_table() {
  static const std::vector<DeviceEntry> table = {
      {with_rates(device("a100-40gb", 3939, kWorkspaceDefault), kA100_40), "OOM messages: 39.39 GiB total"},
      {with_rates(device("a100-80gb", 7915, kWorkspaceDefault), kA100_80), "OOM messages: 79.15 GiB total"},
      {with_rates(measured_device("h100-80gb", 85017493504ull, 787283968ull, kWorkspaceSm90), kH100Sxm),
       "measured (tests/data/h100/cuda_runs.json): H100 80GB HBM3, driver 580, CUDA 13, "
       "PyTorch 2.11: 79.18 GiB total, 750.8 MiB outside the allocator after a training step"},
      // No OOM message at hand for these two: nvidia-smi's total (H200 143,771 MiB,
      // B200 183,359 MiB) less the ~0.54 GiB an H100 shows between nvidia-smi (81,559 MiB)
      // and cudaMemGetInfo (79.11 GiB).
      {with_rates(device("h200", 13986, kWorkspaceSm90), kH200), "estimate: nvidia-smi 143,771 MiB less ~0.54 GiB"},
      {with_rates(device("b200", 17852, kWorkspaceDefault), kB200), "estimate: nvidia-smi 183,359 MiB less ~0.54 GiB"},
      {device("rtx-4070", 1172, kWorkspaceDefault), "OOM messages: 11.72 GiB total"},
      {with_rates(device("rtx-4090", 2365, kWorkspaceDefault), kRtx4090),
       "OOM messages: 23.64-23.69 GiB total depending on the driver; 23.65 taken"},
      {with_rates(device("mi300x", 19198, kWorkspaceDefault), kMi300x),
       "ROCm OOM messages: 191.98 GiB total; hipBLAS workspace not verified"},
      {with_rates(device("v100-16gb", 1577, kWorkspaceDefault), kV100), "OOM messages: 15.77 GiB total"},
      {with_rates(device("v100-32gb", 3174, kWorkspaceDefault), kV100), "OOM messages: 31.74 GiB total"},
  };
  return table;
}

std::string with_commas(int64_t n) {
  std::string digits = std::to_string(n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

std::string model_summary(const ModelConfig& m) {
  const bool hf = family_row(m.family).hf;
  std::string s = std::string(to_string(m.family)) +
                  (hf ? " (" + std::string(m.arch.architecture) + ")" : std::string()) + ", " +
                  std::to_string(m.layers) + " layers, d_model " + std::to_string(m.d_model) +
                  ", " + std::to_string(m.heads) + " heads";
  if (m.kv_heads != m.heads) s += " (" + std::to_string(m.kv_heads) + " KV)";
  if (m.arch.head_dim > 0 && m.arch.head_dim * m.heads != m.d_model)
    s += ", head_dim " + std::to_string(m.arch.head_dim);
  s += ", d_ff " + std::to_string(m.d_ff) + ", vocab " + std::to_string(m.vocab) +
       ", context " + (m.context_length ? std::to_string(m.context_length) : "= seq_len") +
       (m.tied_embeddings ? ", tied" : ", untied");
  if (hf && m.arch.sliding_window > 0) s += ", sliding window " + std::to_string(m.arch.sliding_window);
  if (hf && m.arch.moe.experts > 0)  // docs/moe.md
    s += ", MoE " + std::to_string(m.arch.moe.experts) + " experts of d_ff " +
         std::to_string(m.arch.moe.expert_d_ff) + ", top " + std::to_string(m.arch.moe.top_k);
  s += "; " + with_commas(parameter_count(m)) + " parameters";
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
  for (const auto& slot : config_slots()) {
    const ConfigPreset& p = parsed(*slot);
    out.push_back({p.name, model_summary(p.model), p.source});
  }
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
  const ConfigPreset* p = find_config(name);
  return p != nullptr ? &p->model : nullptr;
}

const HfConfig* find_config_preset(std::string_view name) {
  const ConfigPreset* p = find_config(name);
  return p != nullptr ? &p->config : nullptr;
}

const DeviceConfig* find_device_preset(std::string_view name) {
  for (const auto& e : device_table()) {
    if (e.config.preset == name) return &e.config;
  }
  return nullptr;
}

}  // namespace memsim
