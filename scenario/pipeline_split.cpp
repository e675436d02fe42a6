// See scenario/pipeline_split.h (Megatron-LM d98e8a64 get_num_layers_to_build,
// get_transformer_layer_offset, TransformerConfig.__post_init__).
#include "scenario/pipeline_split.h"

#include <algorithm>
#include <utility>

namespace memsim {

namespace {

int64_t given_ranks(const PipelineSplit& s) { return (s.first > 0 ? 1 : 0) + (s.last > 0 ? 1 : 0); }

// Layers of pipeline rank k, all its chunks together, before the embedding / loss
// accounting takes one from the first / last virtual stage (get_num_layers_to_build's
// num_layers_per_pipeline_rank).
int64_t rank_layers(const PipelineSplit& s, int64_t k) {
  if (s.first > 0 || s.last > 0) {
    if (k == 0 && s.first > 0) return s.first;
    if (k == s.stages - 1 && s.last > 0) return s.last;
    const int64_t middle = s.stages - given_ranks(s);
    return middle > 0 ? (s.layers - s.first - s.last) / middle : 0;
  }
  const int64_t n = s.layers + (s.embedding ? 1 : 0) + (s.loss ? 1 : 0);
  return n / s.stages;
}

// Layers of virtual stage j = chunk * p + rank.
int64_t virtual_stage_layers(const PipelineSplit& s, int64_t j) {
  const int64_t k = j % s.stages;
  int64_t n = rank_layers(s, k) / s.chunks;
  if (s.embedding && j == 0) n -= 1;
  if (s.loss && j == s.stages * s.chunks - 1) n -= 1;
  return n;
}

}  // namespace

PipelineSplit pipeline_split(const ModelConfig& m, const ParallelConfig& p) {
  PipelineSplit s;
  s.layers = m.layers;
  s.stages = std::max<int64_t>(1, p.pipeline);
  s.chunks = p.pipeline_schedule == PipelineSchedule::interleaved ? std::max<int64_t>(1, p.virtual_stages) : 1;
  s.first = p.pipeline_first_layers;
  s.last = p.pipeline_last_layers;
  s.embedding = p.pipeline_account_for_embedding;
  s.loss = p.pipeline_account_for_loss;
  return s;
}

std::string pipeline_split_error(const PipelineSplit& s, std::string& key) {
  const std::string L = std::to_string(s.layers), p = std::to_string(s.stages), v = std::to_string(s.chunks);
  const char* first_key = "parallel.pipeline_first_layers";
  const char* last_key = "parallel.pipeline_last_layers";
  const char* emb_key = "parallel.pipeline_account_for_embedding";
  const char* loss_key = "parallel.pipeline_account_for_loss";
  if (s.uneven() && s.stages < 2) {
    key = s.first > 0 ? first_key : s.last > 0 ? last_key : s.embedding ? emb_key : loss_key;
    return "an uneven pipeline split needs parallel.pipeline > 1";
  }
  if (s.first > 0 || s.last > 0) {
    // TransformerConfig.__post_init__, "Uneven PP".
    if (s.embedding || s.loss) {
      key = s.embedding ? emb_key : loss_key;
      return "cannot be combined with parallel.pipeline_first_layers / pipeline_last_layers "
             "(Megatron's TransformerConfig raises ValueError)";
    }
    for (const auto& [n, k] : {std::pair<int64_t, const char*>{s.first, first_key}, {s.last, last_key}})
      if (n > 0 && n % s.chunks != 0) {
        key = k;
        return std::to_string(n) + " layers do not divide into the " + v +
               " model chunks of the stage (parallel.virtual_stages)";
      }
    const int64_t middle_ranks = s.stages - given_ranks(s);
    const int64_t middle = s.layers - s.first - s.last;
    const char* named = s.last > 0 ? last_key : first_key;
    const std::string given = s.first > 0 && s.last > 0
                                  ? std::to_string(s.first) + " + " + std::to_string(s.last) + " layers"
                                  : std::to_string(s.first + s.last) + " layers";
    if (middle < 0) {
      key = named;
      return given + " on the first/last stage are more than the model's " + L + " layers";
    }
    if ((middle > 0) != (middle_ranks > 0)) {
      key = named;
      return middle_ranks == 0
                 ? given + " leave " + std::to_string(middle) + " of the " + L +
                       " layers to no middle stage (parallel.pipeline " + p + ")"
                 : given + " leave no layer for the " + std::to_string(middle_ranks) +
                       " other stages (Megatron: middle layers and middle stages must both be 0 or not)";
    }
    if (middle_ranks > 0 && middle % middle_ranks != 0) {
      key = named;
      return given + " leave " + std::to_string(middle) + " layers, not divisible by the " +
             std::to_string(middle_ranks) + " middle stages";
    }
    if (middle_ranks > 0 && (middle / middle_ranks) % s.chunks != 0) {
      key = "parallel.virtual_stages";
      return std::to_string(middle / middle_ranks) + " layers of each middle stage do not divide into " + v +
             " model chunks";
    }
    if (middle_ranks == 0 && s.chunks > 1) {
      // get_transformer_layer_offset, rank 1 with both counts given and no middle rank:
      // (0 // vp_size) // middle_pipeline_stages divides by zero.
      key = "parallel.virtual_stages";
      return "interleaved chunks with both parallel.pipeline_first_layers and "
             "pipeline_last_layers on 2 stages: Megatron-Core's get_transformer_layer_offset "
             "divides by its 0 middle stages (ZeroDivisionError)";
    }
    return "";
  }
  const int64_t n = s.layers + (s.embedding ? 1 : 0) + (s.loss ? 1 : 0);
  if (n % s.stages != 0) {
    key = "parallel.pipeline";
    if (!s.embedding && !s.loss) return p + " stages do not divide " + L + " layers";
    return p + " stages do not divide " + L + " layers + " +
           (s.embedding && s.loss ? "the embedding and the loss" : s.embedding ? "the embedding" : "the loss") +
           " (" + std::to_string(n) + ")";
  }
  if ((n / s.stages) % s.chunks != 0) {
    key = "parallel.virtual_stages";
    return p + " stages x " + v + " chunks do not divide " + L + " layers" +
           (s.embedding || s.loss ? " (+ the embedding / loss counted as layers: " + std::to_string(n) + ")" : "");
  }
  if ((s.embedding || s.loss) && s.chunks > 1) {
    key = s.embedding ? emb_key : loss_key;
    return "with interleaved chunks the first (last) rank's chunks would differ in length; "
           "memsim runs one recompute plan per rank: not modelled (use 1f1b)";
  }
  for (int64_t j = 0; j < s.stages * s.chunks; ++j)
    if (virtual_stage_layers(s, j) < 1) {
      key = j == 0 && s.embedding ? emb_key : loss_key;
      return std::string("stage ") + (j == 0 ? "0" : p + " - 1") + " would hold the " +
             (j == 0 && s.embedding ? "embedding" : "loss") +
             " and no transformer layer: a stage without layers is not modelled";
    }
  return "";
}

ChunkLayers chunk_layers(const PipelineSplit& s, int64_t stage, int64_t chunk) {
  const int64_t j = chunk * s.stages + stage;
  ChunkLayers c;
  for (int64_t i = 0; i < j; ++i) c.offset += virtual_stage_layers(s, i);
  c.count = virtual_stage_layers(s, j);
  return c;
}

int64_t max_stage_layers(const PipelineSplit& s) {
  int64_t most = 0;
  for (int64_t k = 0; k < s.stages; ++k) {
    int64_t n = 0;
    for (int64_t c = 0; c < s.chunks; ++c) n += virtual_stage_layers(s, c * s.stages + k);
    most = std::max(most, n);
  }
  return most;
}

}  // namespace memsim
