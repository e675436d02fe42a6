#include "tools/cli/json_report.h"

#include "scenario/scenario_family.h"
#include "sim/analysis/parameter_count.h"

namespace memsim::cli {

using json = Json;

json layer_json(int32_t layer) { return layer < 0 ? json(nullptr) : json(layer); }

namespace {

json event_json(const EventPoint& p) {
  return json{{"index", p.index},
              {"op", p.op},
              {"phase", to_string(p.phase)},
              {"layer", layer_json(p.layer)},
              {"allocated_bytes", p.allocated},
              {"reserved_bytes", p.reserved},
              {"requested_bytes", p.requested}};
}

json breakdown_json(const Breakdown& b) {
  return json{{"parameters", b.parameters},       {"gradients", b.gradients},
              {"optimizer_state", b.optimizer_state}, {"activations", b.activations},
              {"temporaries", b.temporaries},     {"other", b.other}};
}

json live_json(const LiveSet& live) {
  json by_kind = json::object();
  for (int k = 0; k < kTensorKindCount; ++k) {
    by_kind[to_string(static_cast<TensorKind>(k))] = live.by_kind[static_cast<size_t>(k)];
  }
  json by_layer = json::array();
  for (const LayerBytes& l : live.by_layer) {
    by_layer.push_back({{"layer", layer_json(l.layer)}, {"bytes", l.bytes}, {"tensors", l.tensors}});
  }
  json by_op = json::array();
  for (const NamedBytes& o : live.by_op) {
    by_op.push_back({{"op", o.name}, {"bytes", o.bytes}, {"tensors", o.tensors}});
  }
  // Every live tensor (issue #19: `live_at_peak.tensors` lists them), repeats collapsed
  // (LiveSet::by_name): `name` is the pattern ("model.layers.N.mlp.up_proj.weight") when
  // several tensors share it, else the name; `count` of them, `bytes` in all.
  json tensors = json::array();
  for (const NameGroup& g : live.by_name) {
    tensors.push_back({{"name", g.tensors == 1 ? g.example : g.name},
                       {"count", g.tensors},
                       {"bytes", g.bytes},
                       {"bytes_each", g.bytes_each},
                       {"kind", to_string(g.kind)},
                       {"layer", layer_json(g.first_layer == g.last_layer ? g.first_layer : -1)},
                       {"first_layer", layer_json(g.first_layer)},
                       {"last_layer", layer_json(g.last_layer)},
                       {"op", g.op}});
  }
  return json{{"tensor_count", live.tensors},
              {"bytes", live.bytes},
              {"by_kind", std::move(by_kind)},
              {"by_layer", std::move(by_layer)},
              {"by_op", std::move(by_op)},
              {"tensors", std::move(tensors)}};
}

json oom_json(const OomReport& o) {
  return json{{"index", o.index},
              {"op", o.op},
              {"phase", to_string(o.phase)},
              {"layer", layer_json(o.layer)},
              {"kind", to_string(o.kind)},
              {"tensor", o.tensor},
              {"requested_bytes", o.requested_bytes},
              {"allocated_bytes", o.allocated_bytes},
              {"reserved_bytes", o.reserved_bytes},
              {"capacity_bytes", o.capacity_bytes},
              {"free_bytes", o.free_bytes},
              {"message", o.message},
              {"breakdown", breakdown_json(o.breakdown)}};
}

}  // namespace

json host_memory_json(const HostMemory& h) {
  const uint64_t per_rank = h.pinned + h.pageable;
  return json{{"pinned_bytes", h.pinned},
              {"pageable_bytes", h.pageable},
              {"per_rank_bytes", per_rank},
              {"ranks_per_node", h.ranks_per_node},
              {"per_node_bytes", per_rank * static_cast<uint64_t>(h.ranks_per_node)},
              {"nvme_bytes", h.nvme},
              {"counts", h.what}};
}

json rank_json(const RankInfo& r) {
  return json{{"index", r.index},       {"world_size", r.world_size},
              {"data_parallel", r.data}, {"tensor_parallel", r.tensor},
              {"pipeline_parallel", r.pipeline}, {"pipeline_stage", r.pipeline_stage},
              {"why", r.why}};
}

json model_json(const Scenario& s, const RankInfo& rank) {
  const bool hf = family_row(s.model.family).hf;
  json j{{"family", to_string(s.model.family)},
         {"architecture", hf ? json(s.model.arch.architecture) : json(nullptr)},
         {"parameter_count", parameter_count(s.model)},
         {"trainable_parameter_count", trainable_parameter_count(s)},
         {"parameter_count_per_rank", parameter_count_per_rank(s, rank.pipeline_stage)}};
  // model.implementation: written when not transformers' (hf), so hf reports are unchanged.
  if (hf && s.model.arch.impl != graph::ModelImpl::hf) j["implementation"] = to_string(s.model.arch.impl);
  return j;
}

std::string dump_json(const Json& j) {
  return j.dump(2, ' ', false, Json::error_handler_t::replace) + "\n";
}

json memory_stats_json(const MemoryStats& stats) {
  json out = json::object();
  for (const auto& [key, value] : stats.to_flat_map()) out[key] = value;
  return out;
}

json analysis_json(const Analysis& a) {
  json j = json::object();
  j["fits"] = a.fits();
  j["peak_allocated_bytes"] = a.peak_allocated;
  j["peak_reserved_bytes"] = a.peak_reserved;
  j["peak_requested_bytes"] = a.peak_requested;
  j["peak_event"] = a.peak ? event_json(*a.peak) : json(nullptr);
  j["breakdown_at_peak"] = breakdown_json(a.breakdown_at_peak);

  json marks = json::object();
  for (const auto& [name, mark] : a.marks) {
    marks[name] = mark ? json{{"index", mark->index},
                              {"allocated", mark->allocated},
                              {"reserved", mark->reserved}}
                       : json(nullptr);
  }
  j["marks"] = std::move(marks);
  j["oom"] = a.oom ? oom_json(*a.oom) : json(nullptr);
  j["flops"] = json{{"forward", a.flops.forward},
                    {"backward", a.flops.backward},
                    {"recompute", a.flops.recompute}};

  json peaks = json::array();
  for (const EventPoint& p : a.top_peaks) peaks.push_back(event_json(p));
  j["top_peaks"] = std::move(peaks);

  json tensors = json::array();
  for (const LiveTensor& t : a.live_at_peak.largest) {
    tensors.push_back({{"name", t.name},
                       {"kind", to_string(t.kind)},
                       {"bytes", t.bytes},
                       {"op", t.op},
                       {"phase", to_string(t.phase)},
                       {"layer", layer_json(t.layer)},
                       {"alloc_event", t.alloc_event}});
  }
  j["top_tensors"] = std::move(tensors);
  j["live_at_peak"] = live_json(a.live_at_peak);
  j["events"] = a.events;
  j["events_executed"] = a.events_executed;
  j["measured_from_event"] = a.measured_begin;
  return j;
}

}  // namespace memsim::cli
