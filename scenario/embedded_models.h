// The config.json files of scenarios/models/, compiled into the binary (the presets
// model.preset names; tools/embed_models.cmake writes the definition at build time), so
// no preset depends on where memsim runs from.
#pragma once

#include <string_view>
#include <vector>

namespace memsim {

struct EmbeddedFile {
  std::string_view name;  // the file name without ".json" ("qwen2.5-7b")
  std::string_view text;  // its contents
};

// In file-name order.
const std::vector<EmbeddedFile>& embedded_model_configs();

}  // namespace memsim
