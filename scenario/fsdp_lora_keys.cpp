#include "scenario/fsdp_lora_keys.h"

#include <string>
#include <utility>
#include <vector>

#include "scenario/yaml_fields.h"

namespace memsim::scenario_detail {

namespace {
const std::vector<std::pair<std::string, FsdpWrap>> kWrap = {{"block", FsdpWrap::block},
                                                             {"peft", FsdpWrap::peft}};
}  // namespace

void read_fsdp_lora_keys(const Doc& d, ParallelConfig& p) {
  if (const Field* f = d.find("parallel.fsdp_wrap")) {
    if (p.sharding != Sharding::fsdp)
      fail(f->where, "parallel.fsdp_wrap",
           "only applies with parallel.sharding: fsdp (FSDP1's auto_wrap_policy; FSDP2 is "
           "modelled with fully_shard per decoder layer)");
    p.fsdp_wrap = read_enum(*f, "parallel.fsdp_wrap", kWrap);
  }
  if (const Field* f = d.find("parallel.use_orig_params")) {
    if (p.sharding != Sharding::fsdp)
      fail(f->where, "parallel.use_orig_params",
           "only applies with parallel.sharding: fsdp (FSDP1's use_orig_params; FSDP2 always "
           "keeps per-parameter DTensors)");
    p.use_orig_params = read_bool(*f, "parallel.use_orig_params");
  }
}

}  // namespace memsim::scenario_detail
