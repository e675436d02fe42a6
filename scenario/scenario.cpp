// Scenario files: reading YAML into a Doc, --set overrides, and the enum spellings.
// Turning a Doc into a checked Scenario is scenario_build.cpp; presets are
// scenario_presets.cpp.
#include "scenario/scenario.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string_view>

#include <yaml-cpp/eventhandler.h>

#include "scenario/moe_keys.h"
#include "scenario/scenario_doc.h"
#include "scenario/scenario_text_model.h"

namespace memsim {

int dtype_bytes(DType dtype) {
  switch (dtype) {
    case DType::fp32: return 4;
    case DType::bf16: return 2;
    case DType::fp16: return 2;
  }
  return 4;
}

const char* to_string(DType dtype) {
  switch (dtype) {
    case DType::fp32: return "fp32";
    case DType::bf16: return "bf16";
    case DType::fp16: return "fp16";
  }
  return "?";
}

// to_string(ModelFamily): the family table's spellings (sim/step/model_family.cpp).

const char* to_string(AttentionImpl impl) {
  switch (impl) {
    case AttentionImpl::eager: return "eager";
    case AttentionImpl::flash: return "flash";
    case AttentionImpl::mem_efficient: return "mem-efficient";
    case AttentionImpl::cudnn: return "cudnn";
  }
  return "?";
}

const char* to_string(OptimizerType type) {
  switch (type) {
    case OptimizerType::adamw: return "adamw";
    case OptimizerType::adam: return "adam";
    case OptimizerType::sgd: return "sgd";
    case OptimizerType::none: return "none";
    case OptimizerType::adam8bit: return "adam8bit";
    case OptimizerType::adamw8bit: return "adamw8bit";
    case OptimizerType::adafactor: return "adafactor";
  }
  return "?";
}

const char* to_string(OptimizerImpl impl) {
  switch (impl) {
    case OptimizerImpl::for_loop: return "for-loop";
    case OptimizerImpl::foreach: return "foreach";
    case OptimizerImpl::fused: return "fused";
    case OptimizerImpl::cs336: return "cs336";
    case OptimizerImpl::out_of_place: return "out-of-place";
  }
  return "?";
}

const char* to_string(StepKind kind) {
  switch (kind) {
    case StepKind::train: return "train";
    case StepKind::forward: return "forward";
    case StepKind::forward_no_grad: return "forward-no-grad";
    case StepKind::forward_backward: return "forward-backward";
    case StepKind::generate: return "generate";
  }
  return "?";
}

namespace {
// Indexed by CheckpointPolicy.
constexpr const char* kCheckpointPolicyNames[] = {"none",    "full",    "selective", "uniform",
                                                  "block",   "modules", "custom",    "sqrt",
                                                  "sac-op",  "sac-layer"};
static_assert(std::size(kCheckpointPolicyNames) == static_cast<size_t>(CheckpointPolicy::sac_layer) + 1,
              "one spelling per CheckpointPolicy");
}  // namespace

const char* to_string(CheckpointPolicy policy) {
  const auto i = static_cast<size_t>(policy);
  return i < std::size(kCheckpointPolicyNames) ? kCheckpointPolicyNames[i] : "?";
}

std::optional<CheckpointPolicy> parse_checkpoint_policy(std::string_view name) {
  for (size_t i = 0; i < std::size(kCheckpointPolicyNames); ++i)
    if (name == kCheckpointPolicyNames[i]) return static_cast<CheckpointPolicy>(i);
  return std::nullopt;
}

const std::vector<std::pair<std::string, CheckpointPolicy>>& checkpoint_policy_spellings() {
  static const std::vector<std::pair<std::string, CheckpointPolicy>> spellings = [] {
    std::vector<std::pair<std::string, CheckpointPolicy>> v;
    for (size_t i = 0; i < std::size(kCheckpointPolicyNames); ++i)
      v.emplace_back(kCheckpointPolicyNames[i], static_cast<CheckpointPolicy>(i));
    return v;
  }();
  return spellings;
}

namespace scenario_detail {

const std::vector<std::pair<std::string, std::vector<std::string>>>& scenario_schema() {
  static const std::vector<std::pair<std::string, std::vector<std::string>>> schema = {
      {"model", {"preset", "hf_config", "family", "architecture", "layers", "d_model", "heads",
                 "kv_heads", "d_ff", "vocab", "context_length", "tied_embeddings", "attention",
                 "dropout", "softmax", "sdpa", "swiglu", "head_dim", "qkv_bias", "o_bias",
                 "mlp_bias", "qk_norm", "norm", "norm_placement", "mlp", "activation", "fused_qkv",
                 "fused_gate_up", "embedding_scale", "attn_softcap", "final_softcap",
                 "sliding_window", "sliding_layers", "rotary_dim",
                 "implementation", "transformers",
                 // mixture of experts (issue #15; scenario/moe_keys.h): the map, and its
                 // routing assumption alone (for --set and sweeps)
                 "moe", "moe.routing"}},
      {"batch", {"micro_batch", "seq_len", "grad_accum"}},
      {"precision", {"params", "autocast", "autocast_region", "master_weights", "autocast_cache",
                     "grad_scaler" /* sim/step/grad_scaler.h */,
                     "float8", "float8_all_gather", "float8_precompute_scale"}},
      {"optimizer", {"type", "impl", "momentum", "in_backward",
                     "max_grad_norm", "clip_foreach", "clip_error_if_nonfinite", "clip_keep_norm" /* sim/step/clip_grad.h */}},
      {"step", {"kind", "warmup_steps", "zero_grad", "measure", "keep_output", "compile",
                "compile_scope", "compile_memory_budget"}},
      {"loss", {"impl", "positions"}},
      {"checkpoint", {"policy", "layers_per_segment", "custom", "reentrant", "early_stop", "offload",
                      "offload_activations"}},
      {"lora", {"rank", "alpha", "targets", "dropout", "base_dtype", "adapter_dtype",
                "input_require_grads", "target_parameters" /* lora_target_parameters_key.h */,
                "prepare_kbit" /* peft_kbit_key.h */, "compute_dtype" /* lora_compute_dtype_key.h */}},
      {"parallel", {"data", "tensor", "pipeline", "zero", "sharding", "reshard_after_forward",
                    "gradient_as_bucket_view", "fsdp_init", "sequence", "pipeline_schedule",
                    "virtual_stages", "pipeline_first_layers", "pipeline_last_layers",
                    "pipeline_account_for_embedding", "pipeline_account_for_loss" /* scenario/pipeline_keys.cpp */,
                    "cpu_offload", "fsdp_mixed_precision",
                    "replicate", "reduce_dtype", "fsdp_output_dtype", "accelerate_version" /* fsdp2: scenario/fsdp2_keys.cpp */,
                    "context", "context_rotate" /* scenario/context_parallel_keys.cpp */,
                    "expert", "expert_tensor" /* Megatron MoE: scenario/megatron_moe_keys.cpp */,
                    "fsdp_wrap", "use_orig_params" /* FSDP1 + LoRA: scenario/fsdp_lora_keys.cpp */,
                    "fsdp_backward_prefetch", "fsdp_sync_module_states" /* FSDP1: scenario/fsdp_keys.cpp */,
                    "custom_sharded_layers" /* torchtune + FSDP2: scenario/torchtune_keys.cpp */}},
      {"deepspeed", {"config", "reduce_bucket_size", "allgather_bucket_size", "contiguous_gradients",
                     "overlap_comm", "stage3_prefetch_bucket_size", "stage3_max_live_parameters",
                     "stage3_max_reuse_distance", "stage3_param_persistence_threshold",
                     "sub_group_size", "offload_optimizer", "offload_param", "zero_init",
                     "ranks_per_node"}},  // scenario/deepspeed_keys.h (issue #16 item 2)
      {"serve", {"engine", "gpu_memory_utilization", "mem_fraction_static", "max_model_len",
                 "max_num_batched_tokens", "max_num_seqs", "block_size", "kv_cache_dtype",
                 "cuda_graphs", "tensor_parallel", "prefix_caching",
                 "quantization", "nccl_memory", "fused_moe_chunk_size"}},  // scenario/serve_keys.h (issue #17)
      {"generate", {"prompt_len", "new_tokens", "cache", "logits_to_keep", "cache_classes", "residual_length",
                    "q_group_size"}},  // scenario/generate_keys.h (issue #17)
      {"device", {"preset", "capacity", "cuda_context", "cublas_workspace", "kernel_scratch",
                  // issue #18 item 1, the time model (scenario/device_rate_keys.cpp)
                  "tflops_fp32", "tflops_tf32", "tflops_bf16", "tflops_fp16", "tflops_fp8",
                  "hbm_gbps", "nvlink_gbps", "pcie_gbps", "network_gbps", "gpus_per_node"}},
      {"allocator", {"conf", "expandable_segments", "max_split_size_mb",
                     "max_non_split_rounding_mb", "garbage_collection_threshold",
                     "roundup_power2_divisions", "memory_fraction"}},
  };
  return schema;
}

namespace {

const std::vector<std::string>* section_keys(const std::string& section) {
  for (const auto& [name, keys] : scenario_schema()) {
    if (name == section) return &keys;
  }
  return nullptr;
}

std::vector<std::string> all_dotted_keys() {
  std::vector<std::string> out = {"name"};
  for (const auto& [section, keys] : scenario_schema()) {
    for (const auto& key : keys) out.push_back(section + "." + key);
  }
  return out;
}

// A hint for a key written in the wrong place ("seq_len" under model): the one section
// that has it, if any.
std::string elsewhere_hint(const std::string& key) {
  for (const auto& [section, keys] : scenario_schema()) {
    for (const auto& k : keys) {
      if (k == key) return "; did you mean '" + section + "." + key + "'?";
    }
  }
  return "";
}

std::string at(const std::string& source, const YAML::Mark& mark) {
  // yaml-cpp lines are 0-based, and -1 for nodes built in code.
  return source + ":" + std::to_string(mark.line >= 0 ? mark.line + 1 : 1);
}

std::string key_text(const YAML::Node& key, const std::string& where) {
  if (!key.IsScalar()) fail(where, "(document)", "keys must be plain names, got " + describe(key));
  return key.Scalar();
}

void read_section(Doc& doc, const std::string& section, const YAML::Node& body) {
  const std::string& section_where = doc.section_at[section];
  if (is_null(body)) return;  // "batch:" with nothing under it: every key keeps its default
  if (!body.IsMap()) {
    fail(section_where, section, "expected a mapping of keys, got " + describe(body));
  }
  const auto& keys = *section_keys(section);
  for (auto it = body.begin(); it != body.end(); ++it) {
    const std::string where = at(doc.source, it->first.Mark());
    const std::string key = key_text(it->first, where);
    const std::string dotted = section + "." + key;
    bool known = false;
    for (const auto& k : keys) known = known || k == key;
    if (!known) {
      std::string hint = did_you_mean(key, keys);
      if (hint.empty()) hint = elsewhere_hint(key);
      fail(where, dotted, "unknown key" + hint);
    }
    if (const Field* first = doc.find(dotted)) {
      fail(where, dotted, "duplicate key (first given at " + first->where + ")");
    }
    doc.fields[dotted] = Field{it->second, where};
  }
}

// yaml-cpp 0.7 loops forever on a document whose first token is ',' (jbeder/yaml-cpp
// #1040, fixed upstream by PR #1319, after the Debian 0.7 package): refuse it first.
void reject_leading_comma(const std::string& text, const std::string& source) {
  std::istringstream lines(text);
  std::string line;
  bool document_start = true;
  for (int number = 1; std::getline(lines, line); ++number) {
    std::string_view rest(line);
    if (rest.substr(0, 3) == "---" || rest.substr(0, 3) == "...") {
      document_start = true;
      rest.remove_prefix(3);
    } else if (document_start && !rest.empty() && rest.front() == '%') {
      continue;  // a directive
    }
    if (!document_start) continue;
    const size_t first = rest.find_first_not_of(" \t\r");
    if (first == std::string_view::npos || rest[first] == '#') continue;
    if (rest[first] == ',') fail(source + ":" + std::to_string(number), "(yaml)", "unexpected ','");
    document_start = false;
  }
}

// Counts documents without YAML::LoadAll, which is where the loop above lives.
class IgnoreEvents : public YAML::EventHandler {
 public:
  void OnDocumentStart(const YAML::Mark&) override {}
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t, const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}
};

// Whether a line of `text` starts with what can begin a YAML document other than the
// first: a "---" or "..." marker or a "%" directive (YAML 1.2 §9.2: documents after the
// first are separated by markers; line breaks are \n, \r or both). Without one the text
// holds one document at most, and the second parse below (half of reading a scenario) is
// not needed.
bool may_have_second_document(const std::string& text) {
  for (size_t i = 0; i < text.size(); ++i) {
    if (i > 0 && text[i - 1] != '\n' && text[i - 1] != '\r') continue;
    if (text[i] == '%' || text.compare(i, 3, "---") == 0 || text.compare(i, 3, "...") == 0)
      return true;
  }
  return false;
}

bool has_second_document(const std::string& text) {
  if (!may_have_second_document(text)) return false;
  std::istringstream in(text);
  YAML::Parser parser(in);
  IgnoreEvents ignore;
  return parser.HandleNextDocument(ignore) && parser.HandleNextDocument(ignore);
}

Doc read_doc(const std::string& text, const std::string& source) {
  Doc doc;
  doc.source = source;
  reject_leading_comma(text, source);
  YAML::Node root;
  try {
    root = YAML::Load(text);
    if (has_second_document(text)) fail(source + ":1", "(yaml)", "expected one YAML document, found more");
  } catch (const YAML::Exception& e) {
    fail(at(source, e.mark), "(yaml)", e.msg);
  }
  if (is_null(root)) return doc;  // empty file: defaults, then "required" errors
  if (!root.IsMap()) {
    fail(at(source, root.Mark()), "(document)",
         "expected a mapping of sections (name, model, batch, ...), got " + describe(root));
  }
  std::vector<std::string> top = {"name"};
  for (const auto& [section, keys] : scenario_schema()) top.push_back(section);
  for (auto it = root.begin(); it != root.end(); ++it) {
    const std::string where = at(source, it->first.Mark());
    const std::string key = key_text(it->first, where);
    if (key == "name") {
      if (doc.find("name")) fail(where, key, "duplicate key");
      doc.fields["name"] = Field{it->second, where};
      continue;
    }
    if (!section_keys(key)) {
      std::string hint = did_you_mean(key, top);
      if (hint.empty()) hint = elsewhere_hint(key);
      fail(where, key, "unknown section" + hint);
    }
    if (doc.section_at.count(key)) {
      fail(where, key, "duplicate section (first given at " + doc.section_at[key] + ")");
    }
    doc.section_at[key] = where;
    read_section(doc, key, it->second);
  }
  return doc;
}

// A --set value as a YAML node. Values are plain strings ("8", "bf16", "80GiB"), except
// that "{...}" and "[...]" are YAML flow collections (checkpoint.custom=[0,4,8]).
// roundup_power2_divisions keeps "[256:1,>:8]" as text: that is PyTorch's own syntax.
YAML::Node override_node(const std::string& key, const std::string& raw) {
  const size_t begin = raw.find_first_not_of(" \t");
  const std::string value = begin == std::string::npos ? "" : raw.substr(begin, raw.find_last_not_of(" \t") - begin + 1);
  const bool flow = !value.empty() && (value.front() == '{' || value.front() == '[');
  if (!flow || (key == "allocator.roundup_power2_divisions" && value.front() == '[')) {
    return YAML::Node(value);
  }
  try {
    return YAML::Load(value);
  } catch (const YAML::Exception& e) {
    fail("--set", key, "cannot read '" + value + "' as YAML: " + e.msg);
  }
}

void apply_overrides(Doc& doc, const std::vector<std::pair<std::string, std::string>>& overrides) {
  const std::vector<std::string> known = all_dotted_keys();
  for (const auto& [key, value] : overrides) {
    if (merge_moe_override(doc, key, override_node(key, value))) continue;  // model.moe.top_k=4
    bool ok = false;
    for (const auto& k : known) ok = ok || k == key;
    if (!ok) {
      std::string hint = did_you_mean(key, known);
      if (hint.empty() && key.find('.') == std::string::npos) hint = elsewhere_hint(key);
      fail("--set", key, "unknown key" + hint);
    }
    doc.fields[key] = Field{override_node(key, value), "--set"};
    // A section that only overrides bring: a missing key of it is blamed on the first
    // such override ("--set lora.rank=8: lora.targets: required"), not on line 1 of a
    // file that never had the section.
    const size_t dot = key.find('.');
    if (dot != std::string::npos && !doc.section_at.count(key.substr(0, dot)))
      doc.section_at[key.substr(0, dot)] = "--set " + key + "=" + value;
  }
}

std::string stem(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  const size_t dot = base.find_last_of('.');
  return dot == std::string::npos || dot == 0 ? base : base.substr(0, dot);
}

}  // namespace

// For scenario/parsed_scenario.cpp (parse once, override per point): the same steps
// load_scenario_text takes.
Doc read_scenario_doc(const std::string& text, const std::string& source) {
  return read_doc(text, source);
}
void apply_scenario_overrides(Doc& doc,
                              const std::vector<std::pair<std::string, std::string>>& overrides) {
  apply_overrides(doc, overrides);
}
std::string scenario_stem(const std::string& path) { return stem(path); }

}  // namespace scenario_detail

std::string Scenario::key_prefix(const std::string& key) const {
  for (const auto& [k, where] : key_where) {
    if (k != key) continue;
    // As scenario_detail::fail() writes it: "--set KEY" for an override, "FILE:LINE: KEY".
    return where == "--set" || where == "--model" ? where + " " + key : where + ": " + key;
  }
  return source + ": " + key;
}

Scenario load_scenario_text(const std::string& text, const std::string& source,
                            const std::vector<std::pair<std::string, std::string>>& overrides) {
  using namespace scenario_detail;
  Doc doc = read_doc(text, source);
  apply_overrides(doc, overrides);
  Scenario s = build_scenario(doc);
  s.source = source;
  if (s.name.empty()) s.name = stem(source);
  return s;
}

namespace {

std::string read_scenario_file(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    scenario_detail::fail(path + ":1", "(file)", "is a directory, not a scenario file");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    scenario_detail::fail(path + ":1", "(file)",
                          std::string("cannot open the scenario file: ") + std::strerror(err));
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) {
    scenario_detail::fail(path + ":1", "(file)", "cannot read the scenario file");
  }
  return text.str();
}

// The report name of a scenario made from a config alone: the checkpoint's folder
// ("models/Qwen2.5-7B/config.json" -> "Qwen2.5-7B"), else the file's stem.
std::string config_name(const std::string& path) {
  const std::filesystem::path p(path);
  if (p.filename() == "config.json" && p.has_parent_path() && !p.parent_path().filename().empty())
    return p.parent_path().filename().string();
  if (std::filesystem::is_directory(p)) return p.lexically_normal().filename().string();
  return p.stem().string();
}

}  // namespace

Scenario load_scenario(const std::string& path,
                       const std::vector<std::pair<std::string, std::string>>& overrides) {
  return load_scenario_text(read_scenario_file(path), path, overrides);
}

Scenario load_scenario_with_model(const std::string& path, const std::string& model_path,
                                  const std::vector<std::pair<std::string, std::string>>& overrides) {
  if (path.empty()) return load_scenario_text_with_model("", "", model_path, overrides);
  return load_scenario_text_with_model(read_scenario_file(path), path, model_path, overrides);
}

Scenario load_scenario_text_with_model(const std::string& text, const std::string& source,
                                       const std::string& model_path,
                                       const std::vector<std::pair<std::string, std::string>>& overrides) {
  using namespace scenario_detail;
  const std::string& path = source;
  Doc doc;
  if (path.empty()) {
    doc.source = model_path;
  } else {
    doc = read_doc(text, path);
  }
  for (auto it = doc.fields.begin(); it != doc.fields.end();) {
    const bool model_key = it->first.rfind("model.", 0) == 0;
    const bool kept = it->first == "model.attention" || it->first == "model.dropout" ||
                      it->first == "model.implementation" || it->first == "model.transformers";
    it = model_key && !kept ? doc.fields.erase(it) : std::next(it);
  }
  doc.fields["model.hf_config"] = Field{YAML::Node(model_path), "--model"};
  apply_overrides(doc, overrides);
  Scenario s = build_scenario(doc);
  s.source = path.empty() ? model_path : path;
  if (s.name.empty()) s.name = path.empty() ? config_name(model_path) : stem(path);
  return s;
}

AllocatorConfig apply_allocator_overrides(
    AllocatorConfig base, const std::vector<std::pair<std::string, std::string>>& overrides) {
  using namespace scenario_detail;
  for (const auto& [key, value] : overrides) {
    if (key.rfind("allocator.", 0) != 0) {
      fail("--set", key, "only allocator.* settings apply here" + did_you_mean(key, all_dotted_keys()));
    }
  }
  Doc doc;
  doc.source = "--set";
  apply_overrides(doc, overrides);
  return build_allocator(doc, base);
}

}  // namespace memsim
