// Optimizer variants, fp32 master weights and LoRA against real PyTorch: the fixtures in
// tests/data/torch_cpu_optim/*.json are training steps of the plain-torch LLaMA / GPT-2 stand-ins
// measured on CPU (tools/fixtures/gen_optim_lora_fixtures.py, torch 1.13; requested
// bytes). For each, the same scenario is built and compared: bytes live at the end of the
// forward (exactly, and by kind), gradient bytes after backward (frozen LoRA base weights
// get none), optimizer state after the step (exactly) and the step's peak.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "sim/step/schedule.h"
#include "test_paths.h"

using namespace memsim;

namespace {

const std::string kDir = MEMSIM_SOURCE_DIR + "/tests/data/torch_cpu_optim";

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

Scenario scenario_for(const nlohmann::json& c) {
  const std::string family = c["family"];
  std::string y = "model:\n  family: " + family + "\n";
  for (const char* k : {"layers", "d_model", "heads", "kv_heads", "d_ff", "vocab"})
    y += std::string("  ") + k + ": " + std::to_string(c[k].get<int>()) + "\n";
  y += "  context_length: " + std::to_string(c["context"].get<int>()) + "\n";
  const bool tied = c.value("tied", family == "hf-gpt2");  // HF GPT-2 ties; LLaMA may
  y += std::string("  tied_embeddings: ") + (tied ? "true" : "false") + "\n  attention: eager\n";
  y += "  dropout: " + num(c["dropout"].get<double>()) + "\n";
  y += "batch:\n  micro_batch: " + std::to_string(c["batch"].get<int>()) +
       "\n  seq_len: " + std::to_string(c["seq"].get<int>()) + "\n";
  y += "precision:\n  params: " + c["dtype"].get<std::string>() + "\n";
  if (c["master_weights"].get<bool>()) y += "  master_weights: true\n";
  const auto& o = c["optimizer"];
  y += "optimizer:\n  type: " + o["type"].get<std::string>() + "\n  impl: " +
       o["impl"].get<std::string>() + "\n";
  if (o.contains("momentum")) y += "  momentum: " + num(o["momentum"].get<double>()) + "\n";
  if (!c["lora"].is_null()) {
    const auto& l = c["lora"];
    y += "lora:\n  rank: " + std::to_string(l["rank"].get<int>()) + "\n  alpha: " +
         num(l["alpha"].get<double>()) + "\n  targets: [";
    bool first = true;
    for (const auto& t : l["targets"]) {
      y += (first ? "" : ", ") + t.get<std::string>();
      first = false;
    }
    y += "]\n  dropout: " + num(l.value("dropout", 0.0)) + "\n";
    y += "  adapter_dtype: " + l.value("adapter_dtype", std::string("fp32")) + "\n";
  }
  y += "step:\n  kind: train\n  warmup_steps: 1\n";
  y += "device:\n  capacity: 1TiB\n  cublas_workspace: 0\n  kernel_scratch: false\n";
  return load_scenario_text(y, "optim-lora-fixture.yaml");
}

struct Walk {
  std::map<std::string, std::map<TensorKind, uint64_t>> at;  // mark -> live bytes by kind
  std::map<std::string, uint64_t> total;
  uint64_t step_peak = 0;
  uint64_t optimizer_peak = 0;  // from the backward_end mark to the optimizer_end mark
};

Walk walk(const Program& p) {
  Walk w;
  std::vector<uint8_t> live(p.tensors.size(), 0);
  uint64_t cur = 0;
  bool measuring = false, in_optimizer = false;
  for (const MemoryEvent& e : p.events) {
    if (e.type == EventType::alloc) {
      cur += e.bytes;
      live[e.tensor] = 1;
      if (measuring) w.step_peak = std::max(w.step_peak, cur);
      if (in_optimizer) w.optimizer_peak = std::max(w.optimizer_peak, cur);
    } else if (e.type == EventType::free) {
      cur -= p.tensors[e.tensor].bytes;
      live[e.tensor] = 0;
    } else if (e.type == EventType::mark) {
      const std::string& name = p.str(static_cast<uint32_t>(e.bytes));
      if (name == "measured_step_begin") {
        measuring = true;
        w.step_peak = cur;
      }
      if (!measuring) continue;
      if (name == "backward_end") {
        in_optimizer = true;
        w.optimizer_peak = cur;
      }
      if (name == "optimizer_end") in_optimizer = false;
      w.total[name] = cur;
      auto& by_kind = w.at[name];
      for (size_t t = 0; t < live.size(); ++t)
        if (live[t]) by_kind[p.tensors[t].kind] += p.tensors[t].bytes;
    }
  }
  return w;
}

uint64_t kind(const Walk& w, const std::string& mark, TensorKind k) {
  auto it = w.at.find(mark);
  if (it == w.at.end()) return 0;
  auto jt = it->second.find(k);
  return jt == it->second.end() ? 0 : jt->second;
}

}  // namespace

TEST_CASE("optimizer variants, master weights and LoRA match torch CPU steps", "[optim][lora]") {
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(kDir))
    if (entry.path().extension() == ".json") files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  REQUIRE(files.size() >= 9);
  std::printf("\n| fixture | forward-end real | predicted | step peak real | predicted | error |\n|---|---:|---:|---:|---:|---:|\n");
  for (const auto& path : files) {
    std::ifstream in(path);
    nlohmann::json fx;
    in >> fx;
    const std::string name = fx["name"];
    INFO(name);
    const Scenario s = scenario_for(fx["config"]);
    const Program program = build_program(s);
    const Walk w = walk(program);
    const auto& marks = fx["marks"];
    const uint64_t real_peak = fx["peak_live_bytes"];
    const double err = (static_cast<double>(w.step_peak) - real_peak) / real_peak;
    std::printf("| %s | %llu | %llu | %llu | %llu | %+.3f%% |\n", name.c_str(),
                static_cast<unsigned long long>(marks["forward_end"]["total"].get<uint64_t>()),
                static_cast<unsigned long long>(w.total.at("forward_end")),
                static_cast<unsigned long long>(real_peak),
                static_cast<unsigned long long>(w.step_peak), 100 * err);
    for (const char* mark : {"forward_end", "backward_end", "optimizer_end"}) {
      INFO(mark);
      const auto& m = marks[mark];
      CHECK(kind(w, mark, TensorKind::parameter) == m["parameters"].get<uint64_t>());
      CHECK(kind(w, mark, TensorKind::gradient) == m["gradients"].get<uint64_t>());
      CHECK(kind(w, mark, TensorKind::optimizer_state) == m["optimizer_state"].get<uint64_t>());
    }
    CHECK(w.total.at("forward_end") == marks["forward_end"]["total"].get<uint64_t>());
    CHECK(w.total.at("backward_end") == marks["backward_end"]["total"].get<uint64_t>());
    CHECK(std::fabs(err) < 0.01);
    // The optimizer step's own peak (its state and temporaries on top of the step's
    // parameters and grads).
    const uint64_t real_opt = fx["optimizer_step_peak_bytes"];
    INFO("optimizer step peak real " << real_opt << " predicted " << w.optimizer_peak);
    CHECK(std::fabs((static_cast<double>(w.optimizer_peak) - real_opt) / real_opt) < 0.001);
    // Frozen base weights: no .grad after backward in either.
    CHECK(fx["frozen_parameters_with_grad"].get<int>() == 0);
  }
}
