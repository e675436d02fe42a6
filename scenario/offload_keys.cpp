#include "scenario/offload_keys.h"

#include <algorithm>
#include <string>

#include "scenario/scenario_checkpoint.h"
#include "scenario/scenario_family.h"
#include "scenario/yaml_fields.h"

namespace memsim {
namespace scenario_detail {

void read_offload(const Doc& d, const ModelConfig& m, CheckpointConfig& c) {
  const Field* f = d.find("checkpoint.offload");
  if (f == nullptr) return;
  const char* key = "checkpoint.offload";
  c.offload_where = f->where;
  std::vector<std::string> items;
  for (const std::string& item : read_string_list(*f, key))
    for (const std::string& piece : split_list(item, ','))  // --set checkpoint.offload=0,1
      if (!piece.empty()) items.push_back(piece);
  if (items.size() == 1 && (items[0] == "all" || items[0] == "none")) {
    c.offload_all = items[0] == "all";
    return;
  }
  for (const std::string& item : items) {
    const std::optional<int64_t> layer = parse_count(item);
    if (!layer)
      fail(f->where, key,
           "expected a list of layer indices (0-based), all or none, got '" + item + "'");
    if (*layer >= m.layers)
      fail(f->where, key,
           "layer " + item + " does not exist (the model has " + std::to_string(m.layers) +
               " layers, 0-based)");
    if (std::find(c.offload.begin(), c.offload.end(), *layer) != c.offload.end())
      fail(f->where, key, "layer " + item + " is listed twice");
    c.offload.push_back(*layer);
  }
  std::sort(c.offload.begin(), c.offload.end());
}

}  // namespace scenario_detail

std::vector<bool> offload_layers(const CheckpointConfig& c, int64_t layers) {
  std::vector<bool> out(static_cast<size_t>(std::max<int64_t>(0, layers)), c.offload_all);
  for (int64_t l : c.offload)
    if (l >= 0 && l < layers) out[static_cast<size_t>(l)] = true;
  return out;
}

bool offloads(const CheckpointConfig& c) { return c.offload_all || !c.offload.empty(); }

std::string offload_label(const CheckpointConfig& c) {
  if (c.offload_all) return "all";
  if (c.offload.empty()) return "none";
  std::string s;
  for (size_t i = 0; i < c.offload.size(); ++i) s += (i ? "," : "") + std::to_string(c.offload[i]);
  return s;
}

void require_offload_modelled(const Scenario& s) {
  if (!offloads(s.checkpoint)) return;
  const std::string where = s.checkpoint.offload_where.empty() ? s.source : s.checkpoint.offload_where;
  auto refuse = [&](const char* key, const std::string& why) {
    throw ScenarioError(where + ": " + key + ": " + why);
  };
  const FamilyRow& family = family_row(s.model.family);
  if (!family.hf && !family.staff_model)
    refuse("model.family",
           std::string("checkpoint.offload (save_on_cpu around layers) is modelled for the cs336 "
                       "and Hugging Face families, not '") +
               to_string(s.model.family) + "'; remove checkpoint.offload");
  if (s.parallel.sharding != Sharding::none)
    refuse("parallel.sharding",
           "checkpoint.offload with FSDP / FSDP2 / DeepSpeed is not modelled (their hooks own "
           "the parameters save_on_cpu would copy); use parallel.sharding: none or remove "
           "checkpoint.offload");
  if (s.step.compile)
    refuse("step.compile",
           "checkpoint.offload with torch.compile is not modelled (the partitioner decides "
           "what is saved); use step.compile: false or remove checkpoint.offload");
  if (s.step.kind != StepKind::train)
    refuse("step.kind",
           "checkpoint.offload applies to training steps (step.kind: train): a step without "
           "backward never unpacks; remove checkpoint.offload");
}

}  // namespace memsim
