#include "scenario/scenario_checkpoint.h"

#include <optional>

namespace memsim {

namespace {

// `offload[:N]` (issue #18 item 4): no checkpointing, save_on_cpu around every layer or
// the first N (scenario key checkpoint.offload; graph/offload.h).
constexpr const char* kOffloadSpec = "offload";

bool is_policy_name(const std::string& word) {
  const std::string name = word.substr(0, word.find(':'));
  return name == kOffloadSpec || parse_checkpoint_policy(name).has_value();
}


}  // namespace

std::optional<int64_t> parse_count(const std::string& s) {
  if (s.empty() || s.size() > 9 || s.find_first_not_of("0123456789") != std::string::npos)
    return std::nullopt;
  return std::stoll(s);
}

std::vector<std::string> split_list(const std::string& text, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    const size_t end = text.find(sep, start);
    out.push_back(text.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return out;
}

CheckpointConfig with_call_of(CheckpointConfig policy, const CheckpointConfig& user) {
  policy.reentrant = user.reentrant;
  policy.early_stop = user.early_stop;
  return policy;
}

CheckpointConfig parse_policy(const std::string& spec) {
  CheckpointConfig c;
  const size_t colon = spec.find(':');
  const std::string name = spec.substr(0, colon);
  const std::string arg = colon == std::string::npos ? "" : spec.substr(colon + 1);
  const bool has_arg = colon != std::string::npos;
  if (name == kOffloadSpec) {
    if (!has_arg) {
      c.offload_all = true;
      return c;
    }
    const auto k = parse_count(arg);
    if (!k || *k < 1) throw PolicyError("policy '" + spec + "': expected offload:N with N >= 1");
    for (int64_t l = 0; l < *k; ++l) c.offload.push_back(l);
    return c;
  }
  const std::optional<CheckpointPolicy> policy = parse_checkpoint_policy(name);
  if (!policy) throw PolicyError("unknown checkpoint policy '" + spec + "'");
  c.policy = *policy;
  if (c.policy == CheckpointPolicy::uniform || c.policy == CheckpointPolicy::block ||
      c.policy == CheckpointPolicy::sac_layer) {
    const auto k = parse_count(arg);
    if (!has_arg || !k || *k < 1)
      throw PolicyError("policy '" + spec + "': expected " + name + ":N with N >= 1");
    c.layers_per_segment = *k;
  } else if (c.policy == CheckpointPolicy::modules || c.policy == CheckpointPolicy::custom) {
    if (has_arg) c.custom = split_list(arg, ',');
    if (c.policy == CheckpointPolicy::custom && c.custom.empty())
      throw PolicyError("policy '" + spec + "': expected custom:ITEM,... (layers or modules)");
    for (const std::string& item : c.custom)
      if (item.empty()) throw PolicyError("policy '" + spec + "': empty item");
  } else if (has_arg) {
    throw PolicyError("policy '" + name + "' takes no argument (got '" + spec + "')");
  }
  return c;
}

std::vector<std::string> split_policies(const std::string& list) {
  std::vector<std::string> out;
  for (const std::string& piece : split_list(list, ',')) {
    if (piece.empty()) continue;
    if (!out.empty() && !is_policy_name(piece) && out.back().find(':') != std::string::npos)
      out.back() += "," + piece;
    else
      out.push_back(piece);
  }
  return out;
}

std::string policy_label(const CheckpointConfig& c) {
  using P = CheckpointPolicy;
  if (c.offload_all || !c.offload.empty()) {
    // offload[:N] as parse_policy reads it; another mix (checkpointed layers, or offloaded
    // layers that are not the first N) as POLICY+offload:LAYERS, for reports only.
    bool prefix = true;
    for (size_t i = 0; i < c.offload.size(); ++i) prefix = prefix && c.offload[i] == static_cast<int64_t>(i);
    std::string off = c.offload_all ? std::string(kOffloadSpec)
                                    : prefix ? std::string(kOffloadSpec) + ":" + std::to_string(c.offload.size())
                                             : std::string(kOffloadSpec) + "@";
    if (!c.offload_all && !prefix)
      for (size_t i = 0; i < c.offload.size(); ++i) off += (i ? "," : "") + std::to_string(c.offload[i]);
    if (c.policy == P::none) return off;
    CheckpointConfig plain = c;
    plain.offload.clear();
    plain.offload_all = false;
    return policy_label(plain) + "+" + off;
  }
  const std::string name = to_string(c.policy);
  if (c.policy == P::uniform || c.policy == P::block || c.policy == P::sac_layer)
    return name + ":" + std::to_string(c.layers_per_segment);
  if ((c.policy == P::custom || c.policy == P::modules) && !c.custom.empty()) {
    std::string s = name + ":";
    for (size_t i = 0; i < c.custom.size(); ++i) s += (i ? "," : "") + c.custom[i];
    return s;
  }
  return name;
}

}  // namespace memsim
