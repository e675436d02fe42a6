// How the simulator builds each model family's Program: a FamilyBuild per family
// (the rest of a family's row, its spelling and capabilities, is the scenario's:
// scenario/scenario_family.h).
//
// Contract: family_build(f) exists for every ModelFamily; a null builder means "not
// implemented" (build_program refuses the family by key).
#pragma once

#include <cstdint>

#include "program/program.h"
#include "scenario/scenario.h"
#include "scenario/scenario_family.h"
#include "sim/step/training_script.h"

namespace memsim::graph {
class NumericContext;
struct RuntimeBuffers;
enum class NumericFamily : uint8_t;  // graph/numeric/numeric.h
}  // namespace memsim::graph

namespace memsim {

// Builds the family's Program for `scenario` into `program` (cleared first, capacity
// kept), with a Runtime that borrows `buffers` (may be null).
using FamilyBuilder = void (*)(const Scenario& scenario, const TrainingScript& script,
                               Program& program, graph::RuntimeBuffers* buffers);
// Same, executed numerically by `numeric` (graph/numeric/numeric.h) into a fresh `program`.
using FamilyNumericBuilder = void (*)(const Scenario& scenario, const TrainingScript& script,
                                      Program& program, graph::NumericContext* numeric);

struct FamilyBuild {
  graph::NumericFamily numeric{};                             // numeric mode's model
  int64_t (*numeric_parameters)(const Scenario&) = nullptr;  // the tiny model's size limit
  FamilyBuilder build = nullptr;
  bool build_sets_rank = false;  // the builder records the rank it simulates itself
  FamilyNumericBuilder build_numeric = nullptr;
};

// The build of `family` (std::logic_error for a value outside the enum).
const FamilyBuild& family_build(ModelFamily family);

// The functions the builds point to.
namespace family_builders {
// sim/step/schedule.cpp: the training loop over graph::Cs336Model / graph::DecoderModel, and
// Megatron's own (build_megatron_program, sim/megatron/megatron_step.h; it ignores the script).
void cs336(const Scenario&, const TrainingScript&, Program&, graph::RuntimeBuffers*);
void decoder(const Scenario&, const TrainingScript&, Program&, graph::RuntimeBuffers*);
void megatron(const Scenario&, const TrainingScript&, Program&, graph::RuntimeBuffers*);
void cs336_numeric(const Scenario&, const TrainingScript&, Program&, graph::NumericContext*);
void decoder_numeric(const Scenario&, const TrainingScript&, Program&, graph::NumericContext*);
void megatron_numeric(const Scenario&, const TrainingScript&, Program&, graph::NumericContext*);
// sim/check/numeric_check.cpp: parameter counts of the tiny numeric models.
int64_t cs336_numeric_parameters(const Scenario&);
int64_t hf_llama_numeric_parameters(const Scenario&);
int64_t hf_gpt2_numeric_parameters(const Scenario&);
int64_t megatron_numeric_parameters(const Scenario&);
}  // namespace family_builders

}  // namespace memsim
