// See sim/search/max_keys.h.
#include "sim/search/max_keys.h"

#include <utility>

namespace memsim {

std::string max_key_refusal(const std::string& key) {
  static const std::pair<const char*, const char*> kLoopCounts[] = {
      {"step.warmup_steps",
       "warm-up steps repeat the same step; the allocator reaches its steady state within two"},
      {"batch.grad_accum",
       "accumulation repeats the same micro-step; the peak is reached by the second one"},
  };
  for (const auto& [name, why] : kLoopCounts)
    if (key == name)
      return std::string("memory does not grow with ") + name + " (" + why +
             "), so there is no largest value that fits; compare values with --vary instead";
  return "";
}

}  // namespace memsim
