// A scenario file read once, then turned into Scenarios under different --set overrides
// (memsim sweep, sweep --max and optimize evaluate one file at thousands of points).
//
// Contract:
//  - ParsedScenario(text, source) reads the YAML into the loader's flattened document
//    (syntax, unknown and duplicate keys: the errors load_scenario_text gives, naming
//    FILE:LINE and the key) and keeps it.
//  - with(overrides) == load_scenario_text(text, source, overrides), field for field and
//    error for error: the overrides are applied to a copy of the kept document and the
//    result is built and validated by the same code (scenario_build.cpp), so a bad
//    override's message still names "--set KEY". Only the YAML parse is saved (the
//    dominant part of loading; building from the document is a few microseconds).
//    The kept document never changes: an overridden key's entry is replaced, not written
//    through (yaml-cpp nodes are references), and overrides of model.moe.* (merged into
//    the file's model.moe map in place) fall back to a fresh parse.
//  - Not thread-safe: the copies share yaml-cpp nodes with the kept document, whose
//    reference counts and lazy lookups are not synchronized. Use one ParsedScenario per
//    thread (sim/search/sweep.h keeps one per worker).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "scenario/scenario.h"
#include "scenario/scenario_doc.h"

namespace memsim {

class ParsedScenario {
 public:
  // Throws ScenarioError as load_scenario_text does for a bad document.
  ParsedScenario(std::string text, std::string source);

  Scenario with(const std::vector<std::pair<std::string, std::string>>& overrides) const;
  const std::string& text() const { return text_; }
  const std::string& source() const { return source_; }

 private:
  std::string text_;
  std::string source_;
  scenario_detail::Doc doc_;
};

}  // namespace memsim
