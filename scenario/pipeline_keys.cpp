#include "scenario/pipeline_keys.h"

#include <string>
#include <utility>
#include <vector>

#include "scenario/yaml_fields.h"

namespace memsim {

const char* to_string(PipelineSchedule schedule) {
  switch (schedule) {
    case PipelineSchedule::one_f_one_b: return "1f1b";
    case PipelineSchedule::gpipe: return "gpipe";
    case PipelineSchedule::interleaved: return "interleaved";
  }
  return "?";
}

namespace scenario_detail {

namespace {
const std::vector<std::pair<std::string, PipelineSchedule>> kSchedules = {
    {"1f1b", PipelineSchedule::one_f_one_b},
    {"gpipe", PipelineSchedule::gpipe},
    {"interleaved", PipelineSchedule::interleaved}};
}  // namespace

void read_pipeline_schedule(const Doc& d, const ModelConfig& m, ParallelConfig& p) {
  const Field* schedule = d.find("parallel.pipeline_schedule");
  const Field* virtual_stages = d.find("parallel.virtual_stages");
  if (schedule != nullptr) {
    p.pipeline_schedule = read_enum(*schedule, "parallel.pipeline_schedule", kSchedules);
    if (p.pipeline_schedule != PipelineSchedule::one_f_one_b && p.pipeline == 1)
      fail(schedule->where, "parallel.pipeline_schedule",
           std::string(to_string(p.pipeline_schedule)) +
               " needs parallel.pipeline > 1 (one stage runs the plain loop)");
  }
  if (virtual_stages != nullptr)
    p.virtual_stages = read_int(*virtual_stages, "parallel.virtual_stages", 1);
  const bool interleaved = p.pipeline_schedule == PipelineSchedule::interleaved;
  if (p.virtual_stages > 1 && !interleaved)
    fail(virtual_stages->where, "parallel.virtual_stages",
         "model chunks per rank (> 1) need parallel.pipeline_schedule: interleaved");
  if (!interleaved) return;
  if (p.virtual_stages < 2)
    fail(virtual_stages != nullptr ? virtual_stages->where : schedule->where,
         virtual_stages != nullptr ? "parallel.virtual_stages" : "parallel.pipeline_schedule",
         "interleaved needs parallel.virtual_stages >= 2 (model chunks per rank)");
  if (m.layers % (p.pipeline * p.virtual_stages) != 0)
    fail(virtual_stages->where, "parallel.virtual_stages",
         std::to_string(p.pipeline) + " stages x " + std::to_string(p.virtual_stages) +
             " chunks do not divide " + std::to_string(m.layers) + " layers");
}

}  // namespace scenario_detail
}  // namespace memsim
