// Reading the scenario keys that describe a hand-written training script rather than a
// library call: loss.impl, loss.positions, and the checks of optimizer.impl out-of-place
// and precision.autocast_region whole-run that need other keys (internal to the scenario
// loader; the keys are documented in docs/scenario-format.md, the behaviour in
// sim/step/script_loss.h and sim/optim/optimizer_out_of_place.h).
//
// Contract: loss.impl is automatic (absent) | a spelling of scenario/loss_impl.h, refused
// by key for a family that does not take it (loss_impl_refusal); loss.positions is all
// (default) | last, a cs336-family option (the other families' losses use every position). optimizer.impl out-of-place needs optimizer.type adam or
// adamw. step.measure is last-step (default) | whole-run. Errors name FILE:LINE and the
// key.
#pragma once

#include "scenario/scenario.h"
#include "scenario/scenario_doc.h"

namespace memsim::scenario_detail {

LossConfig build_loss(const Doc& d, const ModelConfig& m);
// After optimizer.* has been read into o.
void check_script_optimizer(const Doc& d, const OptimizerConfig& o);
// step.measure: last-step (default) | whole-run.
void read_step_measure(const Doc& d, StepConfig& s);

}  // namespace memsim::scenario_detail

namespace memsim {

// The combinations of these keys with the rest of a loaded scenario that are not
// modelled (called by require_modelled, sim/step/modelled_features.h): refused by key.
void require_script_keys_modelled(const Scenario& s);

}  // namespace memsim
