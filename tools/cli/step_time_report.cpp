#include "tools/cli/step_time_report.h"

namespace memsim::cli {

Json step_time_json(const StepTime& t) {
  Json j = Json::object();
  if (!t.estimated) {
    j["total"] = nullptr;
    j["refused"] = t.refused;
    return j;
  }
  j["total"] = t.seconds;
  for (int p = 0; p < kCostPartCount; ++p) j[to_string(static_cast<CostPart>(p))] = t.part[p];
  j["mfu"] = t.mfu;
  j["mfu_dtype"] = to_string(t.mfu_dtype);
  j["model_flops"] = t.model_flops;
  j["recompute_flops"] = t.recompute_flops;
  return j;
}

std::string human_seconds(double s) {
  char buf[32];
  if (s < 1e-3) std::snprintf(buf, sizeof buf, "%.0f us", s * 1e6);
  else if (s < 1.0) std::snprintf(buf, sizeof buf, "%.1f ms", s * 1e3);
  else std::snprintf(buf, sizeof buf, "%.3f s", s);
  return buf;
}

std::string step_time_text(const StepTime& t) {
  if (!t.estimated) return "not estimated: " + t.refused;
  std::string s = human_seconds(t.seconds) + " (";
  bool first = true;
  for (int p = 0; p < kCostPartCount; ++p) {
    if (t.part[p] <= 0) continue;
    s += (first ? "" : ", ") + std::string(to_string(static_cast<CostPart>(p))) + " " + human_seconds(t.part[p]);
    first = false;
  }
  s += ")";
  if (t.mfu > 0) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "; MFU %.1f%% of the %s peak", 100.0 * t.mfu, to_string(t.mfu_dtype));
    s += buf;
  }
  return s;
}

void print_step_time(std::FILE* out, const StepTime& t, const Style& style,
                     const std::string& qualifier) {
  std::fprintf(out, "\n%s  %s%s%s\n", style.bold("TIME").c_str(), qualifier.c_str(),
               t.estimated ? "estimated step " : "", step_time_text(t).c_str());
}

}  // namespace memsim::cli
