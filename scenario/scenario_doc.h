// A scenario file flattened to its keys (internal to the scenario loader).
//
// scenario.cpp reads YAML text into a Doc (syntax, unknown keys, duplicates) and applies
// --set overrides to it; scenario_build.cpp turns a Doc into a checked Scenario. Keeping
// the overrides as ordinary Doc entries means they get exactly the validation and the
// messages a value written in the file gets.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "scenario/scenario.h"
#include "scenario/yaml_fields.h"

namespace memsim::scenario_detail {

// Sections and their keys, in the order design.md lists them ("name" is top-level).
const std::vector<std::pair<std::string, std::vector<std::string>>>& scenario_schema();

struct Doc {
  std::string source;                              // file name, or the name given for text
  std::map<std::string, Field> fields;             // "batch.micro_batch" -> value
  std::map<std::string, std::string> section_at;   // "batch" -> "FILE:LINE" of "batch:"

  const Field* find(const std::string& key) const {
    auto it = fields.find(key);
    return it == fields.end() ? nullptr : &it->second;
  }
  // Where to point for a key that is missing: its section's line, else line 1.
  std::string where_missing(const std::string& section) const {
    auto it = section_at.find(section);
    return it == section_at.end() ? source + ":1" : it->second;
  }
};

Scenario build_scenario(const Doc& doc);
// The steps of load_scenario_text, for scenario/parsed_scenario.cpp: the text read into a
// Doc (YAML syntax, unknown and duplicate keys), --set overrides applied to it (their
// errors name "--set KEY"), and the name a scenario without `name:` gets from its source.
Doc read_scenario_doc(const std::string& text, const std::string& source);
void apply_scenario_overrides(Doc& doc,
                              const std::vector<std::pair<std::string, std::string>>& overrides);
std::string scenario_stem(const std::string& path);
// The allocator section on top of `base` (conf first, then the individual keys).
AllocatorConfig build_allocator(const Doc& doc, AllocatorConfig base);

}  // namespace memsim::scenario_detail
