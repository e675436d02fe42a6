#include "scenario/script_keys.h"

#include <string>
#include <utility>
#include <vector>

#include "scenario/scenario_family.h"
#include "scenario/yaml_fields.h"

namespace memsim::scenario_detail {

namespace {
const std::vector<std::pair<std::string, LossFunction>> kLossImpls = {
    {"torch", LossFunction::torch}, {"torch-float", LossFunction::torch_float},
    {"cs336", LossFunction::cs336},
    {"one-hot", LossFunction::one_hot}};
const std::vector<std::pair<std::string, LossPositions>> kPositions = {
    {"all", LossPositions::all}, {"last", LossPositions::last}};
const std::vector<std::pair<std::string, bool>> kMeasure = {{"last-step", false},
                                                            {"whole-run", true}};
}  // namespace

LossConfig build_loss(const Doc& d, const ModelConfig& m) {
  LossConfig l;
  for (const char* key : {"loss.impl", "loss.positions"}) {
    const Field* f = d.find(key);
    if (f == nullptr) continue;
    if (std::string(key) == "loss.impl")
      l.impl = read_enum(*f, key, kLossImpls);
    else
      l.positions = read_enum(*f, key, kPositions);
    // hf-* and megatron compute their own loss inside the model call.
    if (!family_row(m.family).script_loss)
      fail(f->where, key,
           std::string("is a cs336-family option (the script's own loss on the model's "
                       "logits), not for family '") +
               to_string(m.family) + "', whose loss is the model's; remove it");
  }
  return l;
}

void read_step_measure(const Doc& d, StepConfig& s) {
  if (const Field* f = d.find("step.measure")) s.measure_whole_run = read_enum(*f, "step.measure", kMeasure);
}

void check_script_optimizer(const Doc& d, const OptimizerConfig& o) {
  if (o.impl != OptimizerImpl::out_of_place) return;
  if (o.type == OptimizerType::adam || o.type == OptimizerType::adamw) return;
  const Field* f = d.find("optimizer.impl");
  fail(f != nullptr ? f->where : d.where_missing("optimizer"), "optimizer.impl",
       std::string("out-of-place is a hand-written Adam / AdamW, but optimizer.type is ") +
           to_string(o.type));
}

}  // namespace memsim::scenario_detail

namespace memsim {

namespace {
[[noreturn]] void refuse(const Scenario& s, const char* key, const std::string& why) {
  throw ScenarioError(s.source + ": " + key + ": " + why);
}
}  // namespace

void require_script_keys_modelled(const Scenario& s) {
  const bool torch_loss =
      s.loss.impl == LossFunction::torch || s.loss.impl == LossFunction::torch_float ||
      (s.loss.impl == LossFunction::automatic && s.optimizer.impl != OptimizerImpl::cs336);
  if (s.loss.positions == LossPositions::last && torch_loss)
    refuse(s, "loss.positions",
           "last with F.cross_entropy (loss.impl torch, the default unless optimizer.impl is "
           "cs336) is not modelled: its CUDA kernel on the strided logits[:, -1, :] view is not "
           "checked; use loss.impl cs336 or one-hot, or loss.positions all");
  if (s.optimizer.impl == OptimizerImpl::out_of_place) {
    if (s.precision.master_weights)
      refuse(s, "optimizer.impl",
             "out-of-place updates the parameters themselves (no fp32 master copy); use "
             "precision.master_weights: false");
    if (s.parallel.data > 1 || s.parallel.sharding != Sharding::none || s.parallel.zero != 0)
      refuse(s, "optimizer.impl",
             "out-of-place (a hand-written Adam rebinding p.data) is modelled on one GPU only; "
             "use parallel.data: 1 or a torch.optim implementation");
  }
  if (s.step.measure_whole_run && !family_row(s.model.family).whole_run_measure)
    refuse(s, "step.measure",
           "whole-run is modelled for the cs336 and hf families (megatron's step marks its "
           "own measured step); use step.measure: last-step");
  if (s.precision.autocast && s.precision.autocast_region == AutocastRegion::whole_run &&
      s.checkpoint.policy != CheckpointPolicy::none)
    refuse(s, "precision.autocast_region",
           "whole-run autocast with activation checkpointing is not modelled (the recompute "
           "would run inside the region); use autocast_region forward-and-loss or forward");
}

}  // namespace memsim
