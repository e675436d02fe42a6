// The scheduler: turns a Scenario into a Program (the ordered memory events of the
// measured training step, preceded by model construction and warm-up steps).
//
// Which loop builds a family's Program is its row's builder (sim/step/model_family.h).
//
// Contract: deterministic; the same Scenario gives the same Program. Every tensor the
// model family would allocate in PyTorch eager appears with its kind, op, phase and
// layer, freed where PyTorch would free it. Marks named "forward_end",
// "backward_end" and "optimizer_end" bracket the measured step's phases, and
// "measured_step_begin" opens it (the analysis reports peaks from there on).
#pragma once

#include "graph/runtime.h"
#include "program/program.h"
#include "scenario/scenario.h"
#include "sim/step/training_script.h"

namespace memsim::graph { class NumericContext; }

namespace memsim {

// The device's kernel-level settings on a Runtime: cuBLAS workspace size and whether
// CUDA kernels' scratch is emitted (DeviceConfig). Every step loop calls it first.
inline void configure_device(graph::Runtime& rt, const DeviceConfig& device) {
  rt.cublas_workspace = device.cublas_workspace;
  rt.kernel_scratch = device.kernel_scratch;
}

Program build_program(const Scenario& scenario);
// Same, with the training loop's details given explicitly (sim/step/training_script.h);
// build_program(s) == build_program(s, default_script(s)).
Program build_program(const Scenario& scenario, const TrainingScript& script);
// Same, executed numerically by `numeric` (graph/numeric/numeric.h; sim/check/numeric_check.h), which
// is attached to the Runtime for the whole program. Every family whose row has a numeric
// builder (sim/step/model_family.h).
Program build_program(const Scenario& scenario, const TrainingScript& script,
                      graph::NumericContext* numeric);

// Storage reused from one build to the next (memsim optimize builds dozens of Programs
// of one scenario; fresh arrays each time cost more in page faults than the build).
struct BuildBuffers {
  Program program;  // the last Program built
  graph::RuntimeBuffers runtime;
};
// Same Program as build_program(scenario, script), built into buffers.program (cleared
// first, capacity kept); the reference is valid until the next build into `buffers`.
const Program& build_program(const Scenario& scenario, const TrainingScript& script,
                             BuildBuffers& buffers);

}  // namespace memsim
