// Which scenario settings the scheduler really models.
//
// The scenario format (docs/scenario-format.md) names settings that later work will
// model (tensor/pipeline/data parallelism, ZeRO, autocast, ...). Until a setting changes
// the simulated program, a scenario that asks for it is refused here with a reason,
// rather than silently simulated as if the setting were absent.
#pragma once

#include "scenario/scenario.h"

namespace memsim {

// Throws ScenarioError ("SOURCE: KEY: ... is not modelled yet ...") for the first
// requested setting that the scenario's model family cannot simulate faithfully.
void require_modelled(const Scenario& scenario);

}  // namespace memsim
