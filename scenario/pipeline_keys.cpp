#include "scenario/pipeline_keys.h"

#include <string>
#include <utility>
#include <vector>

#include "scenario/pipeline_split.h"
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

void read_pipeline_schedule(const Doc& d, ParallelConfig& p) {
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
  if (interleaved && p.virtual_stages < 2)
    fail(virtual_stages != nullptr ? virtual_stages->where : schedule->where,
         virtual_stages != nullptr ? "parallel.virtual_stages" : "parallel.pipeline_schedule",
         "interleaved needs parallel.virtual_stages >= 2 (model chunks per rank)");
}

void read_pipeline_split(const Doc& d, const ModelConfig& m, ParallelConfig& p) {
  if (const Field* f = d.find("parallel.pipeline_first_layers"))
    p.pipeline_first_layers = read_int(*f, "parallel.pipeline_first_layers", 1);
  if (const Field* f = d.find("parallel.pipeline_last_layers"))
    p.pipeline_last_layers = read_int(*f, "parallel.pipeline_last_layers", 1);
  if (const Field* f = d.find("parallel.pipeline_account_for_embedding"))
    p.pipeline_account_for_embedding = read_bool(*f, "parallel.pipeline_account_for_embedding");
  if (const Field* f = d.find("parallel.pipeline_account_for_loss"))
    p.pipeline_account_for_loss = read_bool(*f, "parallel.pipeline_account_for_loss");
  std::string key;
  const std::string why = pipeline_split_error(pipeline_split(m, p), key);  // scenario/pipeline_split.h
  if (why.empty()) return;
  // Where: the key's own line, else (parallel.pipeline from a preset) the section's.
  const Field* f = d.find(key);
  if (f == nullptr && key == "parallel.virtual_stages") f = d.find("parallel.pipeline_schedule");
  if (f == nullptr) f = d.find("parallel.pipeline");
  fail(f != nullptr ? f->where : d.where_missing("parallel"), key, why);
}

}  // namespace scenario_detail
}  // namespace memsim
