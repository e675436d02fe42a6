// Which global transformer layers each model chunk of each pipeline rank builds, as
// Megatron-Core assigns them (issue #15; docs/moe-megatron.md "Uneven pipeline splits").
//
// Megatron-LM d98e8a64ddf34856e74b24714e3bedb2f5a39553:
//  - megatron/core/transformer/transformer_block.py get_num_layers_to_build: with
//    num_layers_in_first_pipeline_stage f and/or num_layers_in_last_pipeline_stage l
//    (--decoder-first/last-pipeline-num-layers), the first (last) rank builds f (l) layers
//    and every other rank (L - f - l) / (p - given) ("middle" ranks; a rank whose count is
//    not given is a middle rank); otherwise every rank builds (L + e + o) / p where e / o are
//    1 with --account-for-embedding / --account-for-loss-in-pipeline-split. With v model
//    chunks per rank (interleaved) each chunk builds the rank's count / v. Then the first
//    virtual stage builds one layer fewer with e, the last virtual stage one fewer with o.
//  - megatron/core/transformer/transformer_layer.py get_transformer_layer_offset: chunk c
//    of rank k starts at c * (f/v + middle/v + l/v) + (k > 0 ? f/v + (k' * middle/v) /
//    middle_ranks : 0) with k' the rank among the middle ones (uneven), or at
//    c * (L+e+o)/v + k * (L+e+o)/(p v) - e (unless c = k = 0) otherwise: in both cases the
//    layers of virtual stage j = c * p + k follow those of virtual stage j - 1 (the prefix
//    sum of the counts above, which is how chunk_layers computes it; tests/
//    test_pipeline_split.cpp checks it against the closed forms for many configurations).
//  - megatron/core/transformer/transformer_config.py __post_init__ ("Uneven PP") and
//    megatron/training/arguments.py: what is refused (pipeline_split_error).
// --pipeline-model-parallel-layout (an explicit per-stage list) is not modelled (no key).
//
// Contract: pure functions of the split; chunk_layers needs a split for which
// pipeline_split_error returned "" (then every chunk has count >= 1 and the chunks in
// virtual-stage order cover [0, L) once).
#pragma once

#include <cstdint>
#include <string>

#include "scenario/scenario.h"

namespace memsim {

struct PipelineSplit {
  int64_t layers = 0;   // L, the model's transformer layers
  int64_t stages = 1;   // p
  int64_t chunks = 1;   // v (1 unless interleaved)
  int64_t first = 0;    // num_layers_in_first_pipeline_stage; 0 = None
  int64_t last = 0;     // num_layers_in_last_pipeline_stage; 0 = None
  bool embedding = false, loss = false;  // account_for_embedding / loss_in_pipeline_split
  bool uneven() const { return first > 0 || last > 0 || embedding || loss; }
};

struct ChunkLayers {
  int64_t offset = 0;  // global index of the chunk's first layer
  int64_t count = 0;   // layers it builds
};

// The scenario's split (its parallel.pipeline* keys; chunks from the schedule).
PipelineSplit pipeline_split(const ModelConfig& m, const ParallelConfig& p);
inline PipelineSplit pipeline_split(const Scenario& s) { return pipeline_split(s.model, s.parallel); }

// "" when Megatron builds the split, else why not (the first reason found), and `key` is
// set to the scenario key to name (parallel.pipeline, parallel.virtual_stages or one of
// the split keys). Also refuses what Megatron accepts
// but memsim does not model: a chunk without transformer layers, the embedding/loss
// accounting with several chunks per rank (their chunks then differ in length), and p = 2
// with both counts and several chunks (Megatron's offset divides by its 0 middle ranks).
std::string pipeline_split_error(const PipelineSplit& split, std::string& key);

// Chunk `chunk` (vp_stage) of pipeline rank `stage`.
ChunkLayers chunk_layers(const PipelineSplit& split, int64_t stage, int64_t chunk);

// The largest number of layers one rank builds (all its chunks together).
int64_t max_stage_layers(const PipelineSplit& split);

}  // namespace memsim
