#include "program/tensor_names.h"

#include <cctype>

namespace memsim {
namespace {

// What an unnamed tensor is, from its kind: the op's output, a temporary, ...
const char* role_of(TensorKind kind) {
  switch (kind) {
    case TensorKind::temporary: return " temporary";
    case TensorKind::gradient: return " gradient";
    case TensorKind::optimizer_state: return " state";
    case TensorKind::parameter: return " parameter";
    case TensorKind::input: return " input";
    case TensorKind::loss: return " loss";
    case TensorKind::activation:
    case TensorKind::other: return " output";
  }
  return " output";
}

// "model.layers.3.mlp.up_proj.weight" -> "model.layers.3.mlp.up_proj".
std::string_view module_of(std::string_view param_name) {
  const size_t dot = param_name.rfind('.');
  return dot == std::string_view::npos ? param_name : param_name.substr(0, dot);
}

// Appends parameter P's name `p` with what the tensor is of it (TensorInfo::role).
void append_with_role(std::string& out, NameRole role, const std::string& p) {
  auto wrap = [&](const char* before, std::string_view what, const char* after) {
    out += before;
    out += what;
    out += after;
  };
  switch (role) {
    case NameRole::none: out += p; return;
    case NameRole::grad: return wrap("grad of ", p, "");
    case NameRole::saved_input: return wrap("saved input of ", module_of(p), "");
    case NameRole::saved_input_recomputed: return wrap("saved input of ", module_of(p), " (recomputed)");
    case NameRole::exp_avg: return wrap("exp_avg of ", p, "");
    case NameRole::exp_avg_sq: return wrap("exp_avg_sq of ", p, "");
    case NameRole::adam_sqrt: return wrap("exp_avg_sq.sqrt() of ", p, " (foreach temporary)");
    case NameRole::adam_denom: return wrap("denom of ", p, "");
    case NameRole::momentum: return wrap("momentum_buffer of ", p, "");
    case NameRole::master: return wrap("master copy of ", p, "");
    case NameRole::master_grad: return wrap("fp32 grad of ", p, "");
    case NameRole::autocast_bf16: return wrap("bf16 autocast copy of ", p, "");
    case NameRole::autocast_f16: return wrap("fp16 autocast copy of ", p, "");
    case NameRole::adam_step: return wrap("step of ", p, " (fused Adam)");
    case NameRole::optimizer_temp: return wrap("optimizer temporary of ", p, "");
    case NameRole::shard_master: return wrap("master copy of ", p, " (distributed-optimizer shard)");
    case NameRole::shard_master_grad: return wrap("fp32 grad of ", p, " (distributed-optimizer shard)");
    case NameRole::shard_exp_avg: return wrap("exp_avg of ", p, " (distributed-optimizer shard)");
    case NameRole::shard_exp_avg_sq: return wrap("exp_avg_sq of ", p, " (distributed-optimizer shard)");
    case NameRole::grad_use: return wrap("grad of ", p, " from one of its uses (AccumulateGrad's input buffer)");
  }
  out += p;
}

std::string with_role(NameRole role, const std::string& p) {
  std::string out;
  append_with_role(out, role, p);
  return out;
}

}  // namespace

std::string module_path_text(const Program& program, int32_t layer, uint8_t module) {
  if (const uint32_t path = program.module_path(layer, module); path != 0) return program.str(path);
  // No parameter of this module in this layer (a residual add, a module without weights):
  // the layer's own path, the common prefix of its modules' ("model.layers.3").
  if (layer >= 0) {
    std::string common;
    bool any = false;
    for (uint8_t m = 0; m < 16; ++m) {
      const uint32_t path = program.module_path(layer, m);
      if (path == 0) continue;
      const std::string& p = program.str(path);
      if (!any) {
        common = p;
        any = true;
        continue;
      }
      size_t n = 0, last_dot = 0;
      while (n < common.size() && n < p.size() && common[n] == p[n]) {
        if (common[n] == '.') last_dot = n;
        ++n;
      }
      const bool whole = (n == common.size() || common[n] == '.') && (n == p.size() || p[n] == '.');
      common.resize(whole ? n : last_dot);
    }
    if (!common.empty()) return common;
    return "layers." + std::to_string(layer);
  }
  const uint32_t label = module < 16 ? program.module_label[module] : 0;
  return label != 0 ? program.str(label) : std::string();
}

std::string tensor_name(const Program& program, uint32_t tensor, const MemoryEvent& a) {
  if (tensor >= program.tensors.size()) return std::string();
  return tensor_name(program, program.tensors[tensor], a);
}

std::string tensor_name(const Program& program, const TensorInfo& info, const MemoryEvent& a) {
  std::string s;
  append_tensor_name(s, program, info, a);
  return s;
}

void append_tensor_name(std::string& out, const Program& program, const TensorInfo& info,
                        const MemoryEvent& a) {
  if (info.name != 0) return append_with_role(out, info.role, program.str(info.name));
  if (a.op == 0) return;  // a replayed block: no op, no name
  out += program.str(a.op);
  out += role_of(info.kind);
  if (const uint32_t path = program.module_path(a.layer, info.module); path != 0) {
    // module_path_text's first case, without a copy.
    if (const std::string& where = program.str(path); !where.empty()) {
      out += " in ";
      out += where;
    }
  } else if (const std::string where = module_path_text(program, a.layer, info.module);
             !where.empty()) {
    out += " in ";
    out += where;
  }
  if (info.flags & kTensorRecomputed) out += " (recomputed)";
}

TensorNames::TensorNames(const Program& program) : program_(program) {
  const size_t n = program.tensors.size();
  alloc_.assign(n, SIZE_MAX);
  name_of_.assign(n, 0);
  names_.emplace_back();
  for (size_t i = 0; i < program.events.size(); ++i) {
    const MemoryEvent& e = program.events[i];
    if (e.type == EventType::alloc && e.tensor < n && alloc_[e.tensor] == SIZE_MAX) alloc_[e.tensor] = i;
  }
  // Given names map one to one onto (string id, role); composed ones onto (op, layer,
  // module, kind, flags). Either way each distinct name is built once.
  std::unordered_map<uint64_t, uint32_t> given, composed;
  for (uint32_t t = 0; t < n; ++t) {
    const TensorInfo& info = program.tensors[t];
    if (info.name != 0) {
      const uint64_t key = uint64_t{info.name} | (uint64_t{static_cast<uint8_t>(info.role)} << 32);
      auto [it, fresh] = given.try_emplace(key, static_cast<uint32_t>(names_.size()));
      if (fresh) names_.push_back(with_role(info.role, program.str(info.name)));
      name_of_[t] = it->second;
      continue;
    }
    if (alloc_[t] == SIZE_MAX) continue;
    const MemoryEvent& a = program.events[alloc_[t]];
    if (a.op == 0) continue;  // a replayed block: no op, no name
    const uint64_t key = uint64_t{a.op} | (uint64_t{static_cast<uint16_t>(a.layer + 1)} << 32) |
                         (uint64_t{info.module} << 48) |
                         (uint64_t{static_cast<uint8_t>(info.kind)} << 56) |
                         (uint64_t{info.flags & 1u} << 63);
    auto [it, fresh] = composed.try_emplace(key, static_cast<uint32_t>(names_.size()));
    if (fresh) names_.push_back(tensor_name(program, t, a));
    name_of_[t] = it->second;
  }
}

const std::string& TensorNames::name(uint32_t tensor) const {
  return names_[tensor < name_of_.size() ? name_of_[tensor] : 0];
}

std::string TensorNames::module_path(uint32_t tensor) const {
  if (tensor >= alloc_.size() || alloc_[tensor] == SIZE_MAX) return std::string();
  return module_path_text(program_, program_.events[alloc_[tensor]].layer,
                          program_.tensors[tensor].module);
}

std::string name_pattern(std::string_view name) {
  std::string out;
  out.reserve(name.size());
  append_name_pattern(out, name);
  return out;
}

void append_name_pattern(std::string& out, std::string_view name) {
  // Copies the text between replaced numbers in runs (one append per run, not per
  // character: the live set at a peak patterns every live tensor's name, issue #20).
  // A number is replaced when it starts after a '.' or ' ' (never at position 0) and ends
  // the name or before '.', ' ', ',' or ')'. Any digit run is skipped whole: the digits
  // after its first do not follow a '.' or ' '.
  // '0'-'9': what isdigit() accepts in every locale (C11 7.4.1.5), without its call.
  auto digit = [](char c) { return c >= '0' && c <= '9'; };
  size_t copied = 0;  // name[copied, i) is still to be copied
  size_t i = 1;
  while (i < name.size()) {
    if (!digit(name[i]) || (name[i - 1] != '.' && name[i - 1] != ' ')) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < name.size() && digit(name[j])) ++j;
    const bool ends = j == name.size() || name[j] == '.' || name[j] == ' ' || name[j] == ',' ||
                      name[j] == ')';
    if (ends) {  // a number that is a whole component: a layer or block index
      out.append(name.data() + copied, i - copied);
      out += 'N';
      copied = j;
    }
    i = j;
  }
  out.append(name.data() + copied, name.size() - copied);
}

std::string common_module_path(std::string_view a, std::string_view b) {
  // b's module (its last component is the tensor); a is either a name or a path already.
  const size_t dot = b.rfind('.');
  b = dot == std::string_view::npos ? std::string_view() : b.substr(0, dot);
  size_t n = 0, last_dot = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) {
    if (a[n] == '.') last_dot = n;
    ++n;
  }
  const bool whole = (n == a.size() || a[n] == '.') && (n == b.size() || b[n] == '.');
  return std::string(a.substr(0, whole ? n : last_dot));
}

const char* snapshot_category(TensorKind kind) {
  switch (kind) {
    case TensorKind::parameter: return "parameter";
    case TensorKind::gradient: return "gradient";
    case TensorKind::optimizer_state: return "optimizer_state";
    case TensorKind::activation: return "activation";
    case TensorKind::loss: return "activation";  // the profiler's category for an autograd output
    case TensorKind::temporary: return "temporary";
    case TensorKind::input: return "input";
    case TensorKind::other: return "unknown";
  }
  return "unknown";
}

}  // namespace memsim
