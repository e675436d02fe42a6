#include "scenario/script_keys.h"

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "scenario/loss_impl.h"
#include "scenario/scenario_family.h"
#include "scenario/yaml_fields.h"

namespace memsim::scenario_detail {

namespace {
const std::vector<std::pair<std::string, LossPositions>> kPositions = {
    {"all", LossPositions::all}, {"last", LossPositions::last}};
const std::vector<std::pair<std::string, bool>> kMeasure = {{"last-step", false},
                                                            {"whole-run", true}};
}  // namespace

LossConfig build_loss(const Doc& d, const ModelConfig& m) {
  LossConfig l;
  // loss.impl (scenario/loss_impl.h): the spellings, then whether this family takes it.
  if (const Field* f = d.find("loss.impl")) {
    const std::string text = read_string(*f, "loss.impl");
    const std::optional<LossConfig> parsed = parse_loss_impl(text);
    if (!parsed)
      fail(f->where, "loss.impl",
           std::string("expected one of ") + loss_impl_spellings() + " (N a positive integer), got '" +
               text + "'" +
               did_you_mean(text, {"torch", "torch-float", "cs336", "one-hot", "liger", "chunked:8"}));
    const std::string why = loss_impl_refusal(m.family, parsed->impl);
    if (!why.empty()) fail(f->where, "loss.impl", "'" + text + "' " + why);
    l.impl = parsed->impl;
    l.chunks = parsed->chunks;
  }
  if (const Field* f = d.find("loss.positions")) {
    l.positions = read_enum(*f, "loss.positions", kPositions);
    // hf-* and megatron compute their loss on every position.
    if (!family_row(m.family).script_loss)
      fail(f->where, "loss.positions",
           std::string("is a cs336-family option (the script's own loss on the model's "
                       "logits), not for family '") +
               to_string(m.family) + "'; remove it");
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
  // loss.impl chunked:N / liger (issue #16 item 6, docs/losses.md): what is not modelled.
  const bool hidden_state_loss =
      s.loss.impl == LossFunction::chunked || s.loss.impl == LossFunction::liger;
  if (hidden_state_loss && s.parallel.sharding != Sharding::none)
    refuse(s, "loss.impl",
           loss_impl_label(s.loss) + " with parallel.sharding is not modelled (the head weight "
           "would be FSDP's gathered view, its grad the flat parameter's); use "
           "parallel.sharding: none (DDP, parallel.data > 1, is modelled)");
  if (s.loss.impl == LossFunction::chunked && s.loss.chunks > s.batch.seq_len)
    refuse(s, "loss.impl",
           "chunked:" + std::to_string(s.loss.chunks) + " has more chunks than batch.seq_len (" +
               std::to_string(s.batch.seq_len) + " positions): tensor_split would hand back "
               "empty chunks");
  if (s.loss.impl == LossFunction::liger && s.precision.autocast)
    refuse(s, "loss.impl",
           "liger under precision.autocast is not modelled: its forward runs inside the "
           "region (custom_fwd without cast_inputs), so the head matmuls cast an uncached "
           "weight.t() copy per chunk and the weight-grad path depends on the torch version "
           "(addmm out_dtype from 2.8); use precision.params bf16 without autocast, or "
           "loss.impl chunked:N");
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
