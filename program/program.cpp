#include "program/program.h"

#include <algorithm>
#include <functional>

namespace memsim {

const char* to_string(TensorKind kind) {
  switch (kind) {
    case TensorKind::parameter: return "parameters";
    case TensorKind::gradient: return "gradients";
    case TensorKind::optimizer_state: return "optimizer_state";
    case TensorKind::activation: return "activations";
    case TensorKind::temporary: return "temporaries";
    case TensorKind::input: return "input";
    case TensorKind::loss: return "loss";
    case TensorKind::other: return "other";
  }
  return "other";
}

const char* to_string(Phase phase) {
  switch (phase) {
    case Phase::setup: return "setup";
    case Phase::forward: return "forward";
    case Phase::loss: return "loss";
    case Phase::backward: return "backward";
    case Phase::optimizer: return "optimizer";
    case Phase::other: return "other";
  }
  return "other";
}

uint32_t Program::intern(std::string_view s) {
  if (s.empty()) return 0;
  if (string_slots_.empty()) {  // first use (or after clear()): index what is there
    string_slots_.assign(64, kNoString);
    for (uint32_t i = 1; i < strings_.size(); ++i) index_string(i);
  }
  const size_t mask = string_slots_.size() - 1;
  for (size_t k = std::hash<std::string_view>{}(s) & mask;; k = (k + 1) & mask) {
    const uint32_t at = string_slots_[k];
    if (at == kNoString) break;
    if (strings_[at] == s) return at;
  }
  const uint32_t index = static_cast<uint32_t>(strings_.size());
  strings_.emplace_back(s);
  if (2 * strings_.size() > string_slots_.size()) {  // keep it at most half full
    string_slots_.assign(2 * string_slots_.size(), kNoString);
    for (uint32_t i = 1; i < strings_.size(); ++i) index_string(i);
  } else {
    index_string(index);
  }
  return index;
}

// Puts strings_[index] (not yet in the table) into its first free slot.
void Program::index_string(uint32_t index) {
  const size_t mask = string_slots_.size() - 1;
  size_t k = std::hash<std::string_view>{}(strings_[index]) & mask;
  while (string_slots_[k] != kNoString) k = (k + 1) & mask;
  string_slots_[k] = index;
}

uint32_t Program::alloc(uint64_t bytes, TensorKind kind, Phase phase, uint32_t op,
                        int32_t layer, uint32_t name, uint8_t stream) {
  maybe_flush(phase);
  if (sink_done_ && abort_when_done_ && !aborted_) {
    aborted_ = true;
    throw StopEmitting{};
  }
  const TensorInfo info{name, kind, 0, 0, NameRole::none, bytes};
  uint32_t id;
  if (!free_ids_.empty() && sink_ != nullptr && !sink_done_) {  // recycle (see program.h)
    id = free_ids_.back();
    free_ids_.pop_back();
    tensors[id] = info;
  } else {
    id = static_cast<uint32_t>(tensors.size());
    tensors.push_back(info);
  }
  if (sink_ != nullptr) {
    if (id >= serial_of_.size()) serial_of_.resize(size_t{id} + 1024);  // once per 1024 ids
    serial_of_[id] = serial_;
  }
  ++serial_;
  events.push_back(MemoryEvent{EventType::alloc, kind, phase, stream, layer, id, op, bytes});
  return id;
}

void Program::free(uint32_t tensor, Phase phase, uint32_t op, int32_t layer, bool recycle) {
  const TensorInfo& info = tensors.at(tensor);
  if (recycle && sink_ != nullptr) {
    if (tensor >= recyclable_.size()) recyclable_.resize(size_t{tensor} + 1024);  // once per 1024 ids
    recyclable_[tensor] = 1;
  }
  events.push_back(
      MemoryEvent{EventType::free, info.kind, phase, 0, layer, tensor, op, info.bytes});
}

void Program::mark(std::string_view name, Phase phase) {
  maybe_flush(phase);
  MemoryEvent e;
  e.type = EventType::mark;
  e.phase = phase;
  e.bytes = intern(name);
  events.push_back(e);
  if (name == "measured_step_begin") cost.reset_step();  // program/step_cost.h
}

void Program::set_module_path(int32_t layer, uint8_t module, uint32_t path) {
  if (layer < -1) return;
  const size_t k = static_cast<size_t>(layer + 1) * 16 + (module & 15);
  if (module_paths_.size() <= k) module_paths_.resize(k + 1, 0);
  module_paths_[k] = path;
}

uint32_t Program::module_path(int32_t layer, uint8_t module) const {
  if (layer < -1) return 0;
  const size_t k = static_cast<size_t>(layer + 1) * 16 + (module & 15);
  return k < module_paths_.size() ? module_paths_[k] : 0;
}

void Program::clear() {
  events.clear();
  tensors.clear();
  flops = Flops{};
  rank = RankInfo{};
  host = HostMemory{};
  host_offload_bytes = 0;
  cost.reset_step();  // keeps the tables' capacity
  cost.unmodelled.clear();
  module_paths_.clear();
  for (uint32_t& m : module_label) m = 0;
  strings_.resize(1);  // "" stays index 0
  std::fill(string_slots_.begin(), string_slots_.end(), kNoString);  // keeps its size
  flushed_ = 0;  // the sink stays attached
  serial_ = 0;
  free_ids_.clear();
  serial_of_.clear();
  recyclable_.clear();
  holds_ = 0;
  sink_done_ = false;
  aborted_ = false;
}

void Program::reserve(size_t events_hint) {
  // With a sink only the tail is stored: a few chunks (setup events and held regions may
  // make it longer; the vector grows then).
  events.reserve(sink_ != nullptr ? std::min(events_hint, 2 * chunk_ + 64) : events_hint);
}

void Program::set_sink(const SinkAttachment& a) {
  sink_ = a.sink;
  chunk_ = std::max<size_t>(1, a.chunk);
  abort_when_done_ = a.abort_when_done;
  sink_done_ = false;
  aborted_ = false;
}

SinkAttachment Program::take_sink() {
  SinkAttachment a{sink_, chunk_, abort_when_done_};
  sink_ = nullptr;
  return a;
}

void Program::finish() {
  if (sink_ != nullptr && !events.empty()) flush_now();
}

void Program::flush_now() {
  if (!sink_done_) {
    sink_done_ = !sink_->consume(*this, events.data(), events.size(), flushed_);
    // The sink has seen these frees: their ids may be reused (program.h's contract). Not
    // after it stopped: it may still name the tensors it holds (the out-of-memory's).
    if (!sink_done_)
      for (const MemoryEvent& e : events)
        if (e.type == EventType::free && e.tensor < recyclable_.size() && recyclable_[e.tensor]) {
          recyclable_[e.tensor] = 0;
          free_ids_.push_back(e.tensor);
        }
  }
  flushed_ += events.size();
  events.clear();
}

void Program::empty_cache(Phase phase) {
  maybe_flush(phase);
  MemoryEvent e;
  e.type = EventType::empty_cache;
  e.phase = phase;
  events.push_back(e);
}

}  // namespace memsim
