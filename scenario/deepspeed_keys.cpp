#include "scenario/deepspeed_keys.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "scenario/scenario_family.h"
#include "scenario/yaml_fields.h"

namespace memsim {

const char* to_string(DsOffload offload) {
  switch (offload) {
    case DsOffload::none: return "none";
    case DsOffload::cpu: return "cpu";
    case DsOffload::nvme: return "nvme";
  }
  return "?";
}

namespace scenario_detail {

namespace {

using Json = nlohmann::json;

const std::vector<std::pair<std::string, DsOffload>> kOffload = {
    {"none", DsOffload::none}, {"cpu", DsOffload::cpu}, {"nvme", DsOffload::nvme}};

// One value of the JSON file with its path ("zero_optimization.stage") for messages.
struct JsonReader {
  std::string file;
  const Scenario& s;

  [[noreturn]] void refuse(const std::string& path, const std::string& why) const {
    throw ScenarioError(file + ": " + path + ": " + why);
  }
  bool is_auto(const Json& v) const { return v.is_string() && v.get<std::string>() == "auto"; }
  int64_t integer(const Json& v, const std::string& path) const {
    // DeepSpeed's pp_int fields accept 5e8 written as a float.
    if (v.is_number_integer() && v.get<int64_t>() >= 0) return v.get<int64_t>();
    if (v.is_number_float() && v.get<double>() >= 0 && std::floor(v.get<double>()) == v.get<double>())
      return static_cast<int64_t>(v.get<double>());
    refuse(path, "expected a non-negative integer, got " + v.dump());
  }
  bool boolean(const Json& v, const std::string& path) const {
    if (!v.is_boolean()) refuse(path, "expected true or false, got " + v.dump());
    return v.get<bool>();
  }
  std::string text(const Json& v, const std::string& path) const {
    if (!v.is_string()) refuse(path, "expected a string, got " + v.dump());
    return v.get<std::string>();
  }
  const Json& object(const Json& v, const std::string& path) const {
    if (!v.is_object()) refuse(path, "expected an object, got " + v.dump());
    return v;
  }
};

// Keys of a JSON object that change nothing memsim measures (logging, schedules,
// checkpoint files): accepted and ignored.
const std::set<std::string> kIgnoredTop = {
    "scheduler", "steps_per_print", "wall_clock_breakdown", "gradient_clipping" /* read below */,
    "prescale_gradients", "gradient_predivide_factor", "zero_allow_untested_optimizer",
    "zero_force_ds_cpu_optimizer", "flops_profiler", "tensorboard", "wandb", "csv_monitor",
    "comms_logger", "aio", "checkpoint", "dump_state", "memory_breakdown", "seed",
    "elasticity", "train_batch_size", "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps", "bf16", "fp16", "optimizer", "zero_optimization",
    "amp", "torch_autocast", "compile", "communication_data_type", "data_types",
    "activation_checkpointing", "sparse_gradients", "gradient_accumulation_dtype"};
const std::set<std::string> kIgnoredZero = {
    "stage3_gather_16bit_weights_on_model_save", "stage3_gather_fp16_weights_on_model_save",
    "load_from_fp32_weights", "elastic_checkpoint", "ignore_unused_parameters",
    "use_multi_rank_bucket_allreduce", "log_trace_cache_warnings", "enable_sanity_checks",
    "override_module_apply", "memory_efficient_linear", "pipeline_loading_checkpoint",
    "allgather_partitions"};

void read_offload(const JsonReader& r, const Json& v, const std::string& path, DsOffload& device,
                  DeepSpeedConfig& c, bool param) {
  if (v.is_null()) return;
  r.object(v, path);
  for (const auto& [key, value] : v.items()) {
    const std::string p = path + "." + key;
    if (key == "device") {
      if (value.is_null()) continue;
      const std::string d = r.text(value, p);
      bool found = false;
      for (const auto& [name, e] : kOffload)
        if (name == d) { device = e; found = true; }
      if (!found) r.refuse(p, "expected cpu, nvme or none, got '" + d + "'");
    } else if (key == "pin_memory") {
      c.offload_pin_memory = r.boolean(value, p);
    } else if (key == "buffer_count") {
      (param ? c.nvme_param_buffer_count : c.nvme_optimizer_buffer_count) = r.integer(value, p);
    } else if (key == "buffer_size" && param) {
      c.nvme_param_buffer_size = r.integer(value, p);
    } else if (key == "ratio") {
      if (!value.is_number() || value.get<double>() != 1.0)
        r.refuse(p, "partial optimizer offload (ratio < 1) is not modelled; remove it or use 1.0");
    } else if (key == "nvme_path" || key == "pipeline_read" || key == "pipeline_write" ||
               key == "fast_init" || key == "cpuadam_cores_perc" || key == "max_in_cpu") {
      // where the swap files are, I/O scheduling, CPU threads: no GPU or pinned-host bytes
    } else if (key == "super_offload" && !value.is_boolean()) {
      r.refuse(p, "expected true or false");
    } else if (key == "super_offload") {
      if (value.get<bool>()) r.refuse(p, "SuperOffload is not modelled; remove it");
    } else {
      r.refuse(p, "unknown offload key (memsim reads device, pin_memory, buffer_count, "
                  "buffer_size, ratio, nvme_path)");
    }
  }
}

// zero_optimization, with HF Trainer's "auto" fills.
void read_zero_json(const JsonReader& r, const Json& z, DeepSpeedConfig& c, int64_t& stage) {
  r.object(z, "zero_optimization");
  const int64_t hidden = r.s.model.d_model;
  for (const auto& item : z.items()) {
    // Named references, not a structured binding: the lambdas below capture them, which
    // clang (the fuzz build) refuses for bindings before C++20.
    const std::string& key = item.key();
    const Json& value = item.value();
    const std::string p = "zero_optimization." + key;
    const bool autov = r.is_auto(value);
    auto size = [&](int64_t& out, std::optional<int64_t> auto_fill) {
      if (autov) {
        if (!auto_fill) r.refuse(p, "\"auto\" is filled by transformers' HF Trainer only for "
                                    "reduce_bucket_size, stage3_prefetch_bucket_size and "
                                    "stage3_param_persistence_threshold; give a number");
        out = *auto_fill;
      } else {
        out = r.integer(value, p);
      }
    };
    if (key == "stage") {
      stage = r.integer(value, p);
    } else if (key == "reduce_bucket_size") {
      size(c.reduce_bucket_size, hidden * hidden);
    } else if (key == "allgather_bucket_size") {
      size(c.allgather_bucket_size, std::nullopt);
    } else if (key == "stage3_prefetch_bucket_size") {
      size(c.stage3_prefetch_bucket_size, static_cast<int64_t>(0.9 * static_cast<double>(hidden * hidden)));
    } else if (key == "stage3_param_persistence_threshold") {
      size(c.stage3_param_persistence_threshold, 10 * hidden);
    } else if (key == "stage3_max_live_parameters") {
      size(c.stage3_max_live_parameters, std::nullopt);
    } else if (key == "stage3_max_reuse_distance") {
      size(c.stage3_max_reuse_distance, std::nullopt);
    } else if (key == "sub_group_size") {
      size(c.sub_group_size, std::nullopt);
    } else if (key == "contiguous_gradients") {
      c.contiguous_gradients = r.boolean(value, p);
    } else if (key == "overlap_comm") {
      c.overlap_comm = r.boolean(value, p);
    } else if (key == "reduce_scatter") {
      if (!r.boolean(value, p))
        r.refuse(p, "reduce_scatter false (all-reduce of whole buckets) is not modelled; use true");
    } else if (key == "offload_optimizer") {
      read_offload(r, value, p, c.offload_optimizer, c, false);
    } else if (key == "offload_param") {
      read_offload(r, value, p, c.offload_param, c, true);
    } else if (key == "cpu_offload" || key == "cpu_offload_param" || key == "cpu_offload_use_pin_memory") {
      r.refuse(p, "deprecated spelling; use zero_optimization.offload_optimizer / offload_param "
                  "{\"device\": \"cpu\"}");
    } else if (key == "round_robin_gradients") {
      if (r.boolean(value, p)) r.refuse(p, "round-robin gradient order (changes which parameters "
                                           "fall in a rank's partition) is not modelled; use false");
    } else if (key == "zero_hpz_partition_size") {
      if (r.integer(value, p) > 1) r.refuse(p, "ZeRO++ hierarchical partitioning is not modelled; use 1");
    } else if (key == "zero_quantized_weights" || key == "zero_quantized_gradients" ||
               key == "zero_quantized_nontrainable_weights" || key == "stage3_use_all_reduce_for_fetch_params" ||
               key == "stage3_allgather_sequential" || key == "save_muon_momentum_buffer_in_memory" ||
               key == "mics_hierarchical_params_gather" || key == "legacy_stage1") {
      if (r.boolean(value, p)) r.refuse(p, "not modelled; use false");
    } else if (key == "mics_shard_size") {
      if (!value.is_number_integer() || value.get<int64_t>() > 0)
        r.refuse(p, "MiCS sharding is not modelled; use -1");
    } else if (key == "stage3_model_persistence_threshold" || key == "module_granularity_threshold" ||
               key == "stage3_module_granularity_threshold") {
      r.refuse(p, "not modelled (memsim keeps DeepSpeed's default); remove it");
    } else if (kIgnoredZero.count(key) == 0) {
      r.refuse(p, "unknown or unmodelled zero_optimization key; remove it (memsim refuses keys "
                  "it cannot say have no memory effect)");
    }
  }
}

// Where a key was given, else its section, else the file's first line.
std::string origin_of(const Doc& d, const std::string& key) {
  if (const Field* f = d.find(key)) return f->where;
  return d.where_missing(key.substr(0, key.find('.')));
}

std::string resolve(const Doc& d, const Field& f, std::string path) {
  const bool from_file = f.where.rfind("--", 0) != 0;
  if (from_file && std::filesystem::path(path).is_relative()) {
    const std::filesystem::path folder = std::filesystem::path(d.source).parent_path();
    if (!folder.empty()) path = (folder / path).lexically_normal().string();
  }
  return path;
}

// The JSON file: fills c and stage; checks precision, optimizer and batch against s.
void read_json_file(const Doc& d, const Field& f, Scenario& s, DeepSpeedConfig& c, int64_t& stage,
                    bool& optimizer_given) {
  const std::string path = resolve(d, f, read_string(f, "deepspeed.config"));
  std::ifstream in(path);
  if (!in) fail(f.where, "deepspeed.config", "cannot read '" + path + "'");
  std::stringstream buf;
  buf << in.rdbuf();
  Json j;
  try {
    j = Json::parse(buf.str());
  } catch (const Json::parse_error& e) {
    throw ScenarioError(path + ": does not parse as JSON (deepspeed.config, given at " + f.where +
                        "): " + e.what());
  }
  const JsonReader r{path, s};
  if (!j.is_object()) r.refuse("(document)", "expected a JSON object");
  for (const auto& [key, value] : j.items())
    if (kIgnoredTop.count(key) == 0)
      r.refuse(key, "unknown or unmodelled DeepSpeed config key; remove it (memsim refuses keys it "
                    "cannot say have no memory effect)");
  c.config = path;
  if (j.contains("zero_optimization")) read_zero_json(r, j["zero_optimization"], c, stage);
  // Mixed precision: engine.get_data_types (bf16 / fp16 model, else fp32).
  bool bf16 = false, fp16 = false;
  auto enabled = [&](const char* section, DType want, bool& out) {
    if (!j.contains(section)) return;
    const Json& sec = r.object(j[section], section);
    for (const auto& [key, value] : sec.items()) {
      const std::string p = std::string(section) + "." + key;
      if (key == "enabled") {
        out = r.is_auto(value) ? s.precision.params == want : r.boolean(value, p);
      } else if (key == "check_grad_overflow") {
        // bf16.check_grad_overflow: the ZeRO 1/2 overflow check memsim models for fp16
        // (engine._configure_zero_optimizer checks fp16 always), in bf16; not wired here.
        if (want == DType::bf16 && value.is_boolean() && value.get<bool>())
          r.refuse(p, "the overflow check in bf16 is not modelled (fp16's is); use false");
      } else if (key == "immediate_grad_update" ||
                 key == "bf16_master_weights_and_grads" || key == "bf16_optimizer_states" ||
                 key == "fp16_master_weights_and_grads") {
        if (value.is_boolean() && value.get<bool>())
          r.refuse(p, "not modelled (memsim keeps fp32 master weights and optimizer state); use false");
      } else if (key == "auto_cast") {
        if (value.is_boolean() && value.get<bool>()) r.refuse(p, "fp16 auto_cast is not modelled; use false");
      }
      // loss_scale, initial_scale_power, loss_scale_window, hysteresis, min_loss_scale,
      // consecutive_hysteresis: the loss scaler's scalars, no memory.
    }
  };
  enabled("bf16", DType::bf16, bf16);
  enabled("fp16", DType::fp16, fp16);
  if (bf16 && fp16) r.refuse("bf16.enabled", "bf16 and fp16 are both enabled (DeepSpeed refuses)");
  const DType ds_dtype = bf16 ? DType::bf16 : fp16 ? DType::fp16 : DType::fp32;
  if (ds_dtype != s.precision.params)
    r.refuse(bf16 ? "bf16.enabled" : fp16 ? "fp16.enabled" : "bf16.enabled",
             std::string("DeepSpeed runs the model in ") + to_string(ds_dtype) +
                 " but precision.params is " + to_string(s.precision.params) +
                 "; make them agree (precision.params " + to_string(ds_dtype) + ")");
  for (const char* off : {"amp", "torch_autocast", "compile"})
    if (j.contains(off) && j[off].is_object() && j[off].value("enabled", false))
      r.refuse(std::string(off) + ".enabled", "not modelled with DeepSpeed; use false");
  if (j.contains("communication_data_type") && !j["communication_data_type"].is_null())
    r.refuse("communication_data_type", "a communication dtype other than the model's is not modelled; remove it");
  if (j.contains("data_types") && j["data_types"].is_object() &&
      j["data_types"].contains("grad_accum_dtype") && !j["data_types"]["grad_accum_dtype"].is_null())
    r.refuse("data_types.grad_accum_dtype", "a gradient-accumulation dtype other than the model's "
                                            "is not modelled (it switches ZeRO-1 to BF16_Optimizer); remove it");
  if (j.contains("activation_checkpointing"))
    r.refuse("activation_checkpointing", "DeepSpeed's own activation checkpointing is not modelled; "
                                         "use the scenario's checkpoint section (torch.utils.checkpoint)");
  if (j.contains("sparse_gradients") && j["sparse_gradients"] == true)
    r.refuse("sparse_gradients", "not modelled; use false");
  // gradient_clipping: the engine's clip_grad (sim/parallel/deepspeed_norm.h), the same
  // setting as optimizer.max_grad_norm. HF Trainer fills "auto" with
  // TrainingArguments.max_grad_norm (here optimizer.max_grad_norm; unset: no clipping) and
  // refuses a number that disagrees with it (HfTrainerDeepSpeedConfig.fill_match).
  if (j.contains("gradient_clipping") && !r.is_auto(j["gradient_clipping"])) {
    const Json& v = j["gradient_clipping"];
    if (!v.is_number() || v.get<double>() < 0)
      r.refuse("gradient_clipping", "expected a number >= 0 or \"auto\", got " + v.dump());
    const double clip = v.get<double>();
    const double mine = s.optimizer.max_grad_norm.value_or(0.0);
    if (s.optimizer.max_grad_norm && clip != mine)
      r.refuse("gradient_clipping", v.dump() + " disagrees with optimizer.max_grad_norm " + std::to_string(mine) +
                                        " (HF Trainer refuses the mismatch); make them agree or write \"auto\"");
    if (clip > 0.0) s.optimizer.max_grad_norm = clip;
  } else if (!j.contains("gradient_clipping") && s.optimizer.max_grad_norm) {
    // HF Trainer fills the key only where it says "auto": without it DeepSpeed clips
    // nothing (its default 0.0) and Accelerate's clip_grad_norm_ returns None for DeepSpeed.
    const std::string why = path + " has no gradient_clipping, so DeepSpeed does not clip (HF Trainer "
                                   "fills the key only where it is \"auto\"); add \"gradient_clipping\": "
                                   "\"auto\" to the file or remove optimizer.max_grad_norm";
    if (const Field* g = d.find("optimizer.max_grad_norm")) fail(g->where, "optimizer.max_grad_norm", why);
    r.refuse("gradient_clipping", why);
  }
  // Batch sizes: "auto" is the Trainer's; a number must match the scenario.
  auto batch = [&](const char* key, int64_t want, const char* scenario_key) {
    if (!j.contains(key) || r.is_auto(j[key])) return;
    const int64_t v = r.integer(j[key], key);
    if (v != want)
      r.refuse(key, std::to_string(v) + " disagrees with " + scenario_key + " " + std::to_string(want));
  };
  batch("train_micro_batch_size_per_gpu", s.batch.micro_batch, "batch.micro_batch");
  batch("gradient_accumulation_steps", std::max<int64_t>(1, s.batch.grad_accum), "batch.grad_accum");
  // optimizer: engine._configure_basic_optimizer (Adam/AdamW -> FusedAdam, DeepSpeedCPUAdam
  // with offload_optimizer).
  if (j.contains("optimizer")) {
    const Json& o = r.object(j["optimizer"], "optimizer");
    const std::string type = o.contains("type") ? r.text(o["type"], "optimizer.type") : "";
    std::string low;
    for (char ch : type) low += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    if (low == "adam" || low == "fusedadam") {
      // DeepSpeed's Adam is AdamW unless params.adam_w_mode is false; memory is the same.
      s.optimizer.type = OptimizerType::adamw;
      if (o.contains("params") && o["params"].is_object() &&
          o["params"].value("adam_w_mode", true) == false)
        s.optimizer.type = OptimizerType::adam;
    } else if (low == "adamw") {
      s.optimizer.type = OptimizerType::adamw;
    } else {
      r.refuse("optimizer.type", "'" + type + "': memsim models DeepSpeed's Adam / AdamW (FusedAdam, "
                                 "CPUAdam) only");
    }
    s.optimizer.impl = OptimizerImpl::fused;
    optimizer_given = true;
  }
}

void read_size_key(const Doc& d, const char* key, int64_t& out) {
  if (const Field* f = d.find(key)) out = static_cast<int64_t>(read_number(*f, key));
  if (const Field* f = d.find(key))
    if (read_number(*f, key) < 0) fail(f->where, key, "expected a non-negative number of elements");
}

void read_offload_key(const Doc& d, const char* key, DsOffload& device, DeepSpeedConfig& c) {
  const Field* f = d.find(key);
  if (f == nullptr) return;
  if (!f->node.IsMap()) {
    device = read_enum(*f, key, kOffload);
    return;
  }
  for (auto it = f->node.begin(); it != f->node.end(); ++it) {
    const std::string sub = it->first.Scalar();
    const Field v{it->second, f->where};
    const std::string k = std::string(key) + "." + sub;
    if (sub == "device") device = read_enum(v, k, kOffload);
    else if (sub == "pin_memory") c.offload_pin_memory = read_bool(v, k);
    else if (sub == "buffer_count")
      (std::string(key) == "deepspeed.offload_param" ? c.nvme_param_buffer_count
                                                     : c.nvme_optimizer_buffer_count) = read_int(v, k, 1);
    else if (sub == "buffer_size" && std::string(key) == "deepspeed.offload_param")
      c.nvme_param_buffer_size = read_int(v, k, 1);
    else
      fail(f->where, k, "unknown key (device, pin_memory, buffer_count, buffer_size)");
  }
}

}  // namespace

void read_deepspeed(const Doc& d, Scenario& s) {
  DeepSpeedConfig c;
  ParallelConfig& p = s.parallel;
  const Field* first = nullptr;
  for (const auto& [key, field] : d.fields)
    if (key.rfind("deepspeed.", 0) == 0 && first == nullptr) first = &field;
  if (p.sharding != Sharding::deepspeed) {
    for (const auto& [key, field] : d.fields)
      if (key.rfind("deepspeed.", 0) == 0)
        fail(field.where, key, "only applies with parallel.sharding: deepspeed");
    return;
  }
  const FamilyRow& family = family_row(s.model.family);
  if (!family.torch_data_parallel)
    fail(origin_of(d, "parallel.sharding"), "parallel.sharding",
         "DeepSpeed ZeRO is modelled for hf-llama, hf-gpt2 and cs336; the megatron family shards "
         "with its distributed optimizer (parallel.zero: 1, parallel.sharding: none)");
  int64_t stage = -1;
  bool optimizer_given = false;
  const OptimizerConfig before = s.optimizer;
  if (const Field* f = d.find("deepspeed.config")) read_json_file(d, *f, s, c, stage, optimizer_given);
  // The scenario's keys override the file's.
  read_size_key(d, "deepspeed.reduce_bucket_size", c.reduce_bucket_size);
  read_size_key(d, "deepspeed.allgather_bucket_size", c.allgather_bucket_size);
  read_size_key(d, "deepspeed.stage3_prefetch_bucket_size", c.stage3_prefetch_bucket_size);
  read_size_key(d, "deepspeed.stage3_max_live_parameters", c.stage3_max_live_parameters);
  read_size_key(d, "deepspeed.stage3_max_reuse_distance", c.stage3_max_reuse_distance);
  read_size_key(d, "deepspeed.stage3_param_persistence_threshold", c.stage3_param_persistence_threshold);
  read_size_key(d, "deepspeed.sub_group_size", c.sub_group_size);
  if (const Field* f = d.find("deepspeed.contiguous_gradients"))
    c.contiguous_gradients = read_bool(*f, "deepspeed.contiguous_gradients");
  if (const Field* f = d.find("deepspeed.overlap_comm")) c.overlap_comm = read_bool(*f, "deepspeed.overlap_comm");
  read_offload_key(d, "deepspeed.offload_optimizer", c.offload_optimizer, c);
  read_offload_key(d, "deepspeed.offload_param", c.offload_param, c);
  const Field* zero_init = d.find("deepspeed.zero_init");
  if (zero_init != nullptr) c.zero_init = read_bool(*zero_init, "deepspeed.zero_init");
  if (const Field* f = d.find("deepspeed.ranks_per_node")) c.ranks_per_node = read_int(*f, "deepspeed.ranks_per_node", 1);

  // The stage: parallel.zero and/or zero_optimization.stage.
  const Field* zero = d.find("parallel.zero");
  if (zero != nullptr && stage >= 0 && stage != p.zero)
    fail(zero->where, "parallel.zero",
         std::to_string(p.zero) + " disagrees with zero_optimization.stage " + std::to_string(stage) +
             " in " + c.config);
  if (zero == nullptr && stage >= 0) p.zero = stage;
  if (zero == nullptr && stage < 0)
    fail(origin_of(d, "parallel.sharding"), "parallel.zero",
         "required with parallel.sharding: deepspeed (1, 2 or 3; or zero_optimization.stage in "
         "deepspeed.config)");
  if (p.zero < 1 || p.zero > 3) {
    if (zero != nullptr)
      fail(zero->where, "parallel.zero", "DeepSpeed ZeRO stages are 1, 2 and 3, got " + std::to_string(p.zero));
    throw ScenarioError(c.config + ": zero_optimization.stage: DeepSpeed ZeRO stages memsim models are "
                        "1, 2 and 3, got " + std::to_string(p.zero));
  }
  if (p.data < 2)
    fail(origin_of(d, "parallel.data"), "parallel.data",
         "DeepSpeed ZeRO on one GPU partitions nothing; set parallel.data > 1");
  if (!c.overlap_comm) c.overlap_comm = p.zero == 3;  // DeepSpeedZeroConfig.overlap_comm_valid
  // Stage-3-only knobs. A refusal names the scenario key when the scenario set it, else the
  // JSON path in the config file.
  auto refuse = [&](const char* key, const std::string& json, const std::string& why) {
    if (const Field* f = d.find(key)) fail(f->where, key, why);
    throw ScenarioError(c.config + ": " + json + ": " + why);
  };
  if (p.zero < 3) {
    if (c.offload_param != DsOffload::none)
      refuse("deepspeed.offload_param", "zero_optimization.offload_param",
             "parameter offload needs ZeRO stage 3 (parallel.zero is " + std::to_string(p.zero) + ")");
    for (const char* key : {"deepspeed.stage3_prefetch_bucket_size", "deepspeed.stage3_max_live_parameters",
                            "deepspeed.stage3_max_reuse_distance", "deepspeed.stage3_param_persistence_threshold"})
      if (const Field* f = d.find(key))
        fail(f->where, key, "a ZeRO stage 3 knob, but parallel.zero is " + std::to_string(p.zero));
    if (zero_init != nullptr && c.zero_init)
      fail(zero_init->where, "deepspeed.zero_init", "zero.Init partitions parameters: ZeRO stage 3 only");
    c.zero_init = false;
  }
  if (c.offload_param != DsOffload::none && c.offload_optimizer == DsOffload::none)
    refuse("deepspeed.offload_param", "zero_optimization.offload_param",
           "DeepSpeed offloads parameters only together with the optimizer (offload_optimizer "
           "device cpu or nvme)");
  if (p.zero < 3 && c.offload_optimizer == DsOffload::nvme)
    refuse("deepspeed.offload_optimizer", "zero_optimization.offload_optimizer",
           "NVMe optimizer offload needs ZeRO stage 3");
  if (c.reduce_bucket_size < 1)
    refuse("deepspeed.reduce_bucket_size", "zero_optimization.reduce_bucket_size", "must be positive");
  // The optimizer DeepSpeed steps: FusedAdam / CPUAdam unless the scenario names a torch one.
  if (!optimizer_given && d.find("optimizer.impl") == nullptr) s.optimizer.impl = OptimizerImpl::fused;
  if (optimizer_given) {
    if (const Field* f = d.find("optimizer.impl"))
      if (before.impl != OptimizerImpl::fused)
        fail(f->where, "optimizer.impl", "the DeepSpeed config's optimizer section (" + c.config +
                                             ") builds FusedAdam (impl fused); remove one of them");
    if (const Field* f = d.find("optimizer.type"))
      if (before.type != s.optimizer.type)
        fail(f->where, "optimizer.type", std::string("disagrees with the optimizer section of ") +
                                             c.config + " (" + to_string(s.optimizer.type) + ")");
  }
  s.deepspeed = c;
}

}  // namespace scenario_detail
}  // namespace memsim
