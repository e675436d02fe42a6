#include "scenario/parsed_scenario.h"

namespace memsim {

ParsedScenario::ParsedScenario(std::string text, std::string source)
    : text_(std::move(text)),
      source_(std::move(source)),
      doc_(scenario_detail::read_scenario_doc(text_, source_)) {}

Scenario ParsedScenario::with(
    const std::vector<std::pair<std::string, std::string>>& overrides) const {
  using namespace scenario_detail;
  // merge_moe_override (scenario/moe_keys.cpp) writes into the model.moe map node itself,
  // which a copy of doc_ shares: parse afresh rather than let one point change the next.
  for (const auto& kv : overrides)
    if (kv.first.rfind("model.moe.", 0) == 0) return load_scenario_text(text_, source_, overrides);
  Doc doc = doc_;  // the map of fields is copied; build_scenario only reads the nodes
  // yaml-cpp's Node assignment writes through to the node it refers to, which the copy
  // shares with doc_: drop the overridden entries first, so that the overrides make new
  // ones instead of rewriting the kept document's values.
  for (const auto& kv : overrides) doc.fields.erase(kv.first);
  apply_scenario_overrides(doc, overrides);
  Scenario s = build_scenario(doc);
  s.source = source_;
  if (s.name.empty()) s.name = scenario_stem(source_);
  return s;
}

}  // namespace memsim
