// Requested bytes of a simulated step at the moments the torch CPU fixtures record:
// live before the forward, at its end, after backward, and the step's peak. Shared by
// the tests that compare memsim's Program with tests/data/torch_cpu/*.json.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "json_test_support.h"
#include "program/program.h"
#include "scenario/scenario.h"
#include "test_paths.h"

namespace memsim_test {

struct StepMeasure {
  uint64_t before_forward = 0, forward_end = 0, after_backward = 0, peak = 0;
};

// Requested bytes live after each event, from the measured step's start to backward's end,
// counting only the tensors `keep(tensor_id)` accepts (e.g. everything but parameters,
// for a fixture that cannot count FSDP2's resized parameter storages).
template <class Keep>
StepMeasure measure_step_if(const memsim::Program& p, Keep keep) {
  using memsim::EventType;
  StepMeasure m;
  uint64_t live = 0;
  bool measuring = false;
  for (const memsim::MemoryEvent& e : p.events) {
    if (e.type == EventType::alloc && keep(e.tensor)) live += e.bytes;
    if (e.type == EventType::free && keep(e.tensor)) live -= p.tensors[e.tensor].bytes;
    if (e.type == EventType::mark) {
      const std::string& name = p.str(static_cast<uint32_t>(e.bytes));
      if (name == "measured_step_begin") {
        measuring = true;
        m.before_forward = live;
      }
      if (name == "forward_end") m.forward_end = live;
      if (name == "backward_end") {
        measuring = false;
        m.after_backward = live;
      }
    }
    if (measuring) m.peak = std::max(m.peak, live);
  }
  return m;
}

// The same over every tensor.
inline StepMeasure measure_step(const memsim::Program& p) {
  return measure_step_if(p, [](uint32_t) { return true; });
}

// A fixture of tests/data/torch_cpu/ (written by tools/fixtures/).
inline nlohmann::json load_torch_cpu_fixture(const std::string& file) {
  return load_json(MEMSIM_SOURCE_DIR + "/tests/data/torch_cpu/" + file);
}

// The model and batch of a CS336 checkpoint fixture's "config" (gen_checkpoint_fixtures.py).
inline void apply_cs336_fixture_config(memsim::Scenario& s, const nlohmann::json& c) {
  s.model.family = memsim::ModelFamily::cs336;
  s.model.layers = c["layers"];
  s.model.d_model = c["d_model"];
  s.model.heads = c["heads"];
  s.model.kv_heads = c["heads"];
  s.model.d_ff = c["d_ff"];
  s.model.vocab = c["vocab"];
  s.model.context_length = c["seq_len"];
  s.batch.micro_batch = c["batch"];
  s.batch.seq_len = c["seq_len"];
}

// The model and batch of a Hugging Face checkpoint fixture (family "hf-gpt2" or
// "hf-llama", eager attention; HF GPT-2 ties its head unless the fixture says otherwise).
inline void apply_hf_fixture_config(memsim::Scenario& s, const std::string& family,
                                    const nlohmann::json& c) {
  using namespace memsim;
  s.model.family = family == "hf-gpt2" ? ModelFamily::hf_gpt2 : ModelFamily::hf_llama;
  s.model.layers = c["layers"];
  s.model.d_model = c["d_model"];
  s.model.heads = c["heads"];
  s.model.kv_heads = c["kv_heads"];
  s.model.d_ff = c["d_ff"];
  s.model.vocab = c["vocab"];
  s.model.context_length = c["context"];
  s.model.dropout = c["dropout"];
  s.model.tied_embeddings = c.value("tied", family == "hf-gpt2");
  s.model.attention = AttentionImpl::eager;
  s.batch.micro_batch = c["batch"];
  s.batch.seq_len = c["seq"];
}

}  // namespace memsim_test
