#include "sim/step/model_family.h"

#include <iterator>
#include <stdexcept>

#include "graph/numeric/numeric.h"

namespace memsim {
namespace {

namespace fb = family_builders;

FamilyBuild build_of(graph::NumericFamily numeric, int64_t (*numeric_parameters)(const Scenario&),
                     FamilyBuilder build, bool build_sets_rank, FamilyNumericBuilder build_numeric) {
  FamilyBuild b;
  b.numeric = numeric;
  b.numeric_parameters = numeric_parameters;
  b.build = build;
  b.build_sets_rank = build_sets_rank;
  b.build_numeric = build_numeric;
  return b;
}

}  // namespace

const FamilyBuild& family_build(ModelFamily family) {
  // Indexed by ModelFamily.
  static const FamilyBuild kBuilds[] = {
      build_of(graph::NumericFamily::cs336, fb::cs336_numeric_parameters, fb::cs336,
               false, fb::cs336_numeric),  // cs336
      build_of(graph::NumericFamily::hf_llama, fb::hf_llama_numeric_parameters, fb::decoder,
               false, fb::decoder_numeric),  // hf_llama
      build_of(graph::NumericFamily::hf_gpt2, fb::hf_gpt2_numeric_parameters, fb::decoder,
               false, fb::decoder_numeric),  // hf_gpt2
      build_of(graph::NumericFamily::megatron, fb::megatron_numeric_parameters, fb::megatron,
               true, fb::megatron_numeric),  // megatron: records the model-parallel rank (sim/megatron/megatron_parallel.h)
  };
  const auto i = static_cast<size_t>(family);
  if (i >= std::size(kBuilds)) throw std::logic_error("family_build: not a ModelFamily");
  return kBuilds[i];
}

}  // namespace memsim
