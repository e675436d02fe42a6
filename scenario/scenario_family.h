// The model families as one table: a plain row per family (tables over virtuals, as in
// ninja or LLVM's .def files). A row holds the family's spelling, what its model is and
// what memsim models for it; the functions that build its Program are the simulator's
// (sim/step/model_family.h, one FamilyBuild per family). The checks
// (sim/step/modelled_features.cpp, sim/check/numeric_check.cpp, the scenario reader) and the
// scheduler (sim/step/schedule.cpp) look a family up here instead of switching on it, so a
// capability is one bit in one place, and a new family is one new row.
//
// Contract: family_row(f).family == f for every ModelFamily; the rows are constant.
// Every capability bit says what memsim models for the family, not what the real
// framework can do: a false bit is a setting require_modelled (or the scenario reader,
// or numeric mode) refuses by key, with the message it always gave.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "scenario/scenario.h"

namespace memsim {

struct FamilyRow {
  ModelFamily family = ModelFamily::cs336;
  const char* name = "";  // model.family's spelling: to_string(family)

  // --- What the model is.
  // A Hugging Face decoder (graph::DecoderModel): model.architecture rows and their knobs,
  // "architecture" in reports; its attention runs the model.attention kernels.
  bool hf = false;
  bool rope = false;         // rotary position embeddings: the head size must be even
  // The CS336 staff model (graph::Cs336Model): its own variants model.softmax /
  // model.sdpa / model.swiglu; no attention kernels, dropout, LoRA or architecture knobs.
  bool staff_model = false;
  // The loop computes its own loss on the logits (loss.impl, loss.positions); the other
  // families' loss is the model's.
  bool script_loss = false;

  // --- What memsim models for it (anything else is refused by key).
  bool autocast = false;                  // precision.autocast
  bool autocast_tied_embeddings = false;  // ... with a tied embedding / lm_head weight
  bool dropout = false;                   // model.dropout > 0
  bool lora = false;                      // lora.* (LoRA / QLoRA adapters)
  bool adafactor = false;                 // needs the parameters' shapes
  bool adam8bit = false;                  // bitsandbytes 8-bit Adam(W)
  bool tensor_parallel = false;           // parallel.tensor, parallel.pipeline, parallel.sequence
  // Data parallelism through torch's wrappers (DDP, FSDP, ZeroRedundancyOptimizer); false:
  // the family's own (Megatron's grad buffer and distributed optimizer).
  bool torch_data_parallel = false;
  bool whole_run_measure = false;         // step.measure whole-run
  // Checkpointing is always reentrant (Megatron's CheckpointFunction): checkpoint.reentrant
  // false is refused, and the plan is reentrant whatever the key says.
  bool reentrant_checkpoint_only = false;

  // --- Numeric mode (sim/check/numeric_check.h).
  bool numeric_fused_attention = false;  // kernels for model.attention flash / mem-efficient
  bool numeric_adafactor = false;
  bool numeric_adam8bit = false;
  bool numeric_no_decay_1d = false;      // param groups: 1-D parameters (biases, norms) not decayed

};

// The row of `family` (std::logic_error for a value outside the enum).
const FamilyRow& family_row(ModelFamily family);
// model.family's spellings, in enum order (the order error messages list them).
const std::vector<std::pair<std::string, ModelFamily>>& family_spellings();

}  // namespace memsim
