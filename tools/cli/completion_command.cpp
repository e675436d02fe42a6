// memsim completion bash: prints a bash completion script made from this binary's own
// command line (verbs, their options, which options take a value), the scenario keys
// (scenario_schema), the model and device presets and the checkpoint policies, so that it
// is current by construction. tools/completion/memsim.bash loads it from the memsim on
// PATH (docs/cli.md, "Shell completion").
#include <cstdio>
#include <string>
#include <vector>

#include "scenario/moe_keys.h"
#include "scenario/scenario.h"
#include "scenario/scenario_doc.h"
#include "tools/cli/commands.h"
#include "tools/cli/errors.h"

namespace memsim::cli {

namespace {

std::string join(const std::vector<std::string>& words) {
  std::string s;
  for (const std::string& w : words) s += (s.empty() ? "" : " ") + w;
  return s;
}

// The completion logic; the data above it (_memsim_* variables) is generated.
const char* kFunction = R"BASH(
# The word being completed is taken from COMP_LINE up to the cursor, split at blanks
# only, so that KEY=VALUE and uniform:2 stay one word whatever COMP_WORDBREAKS holds.
_memsim() {
  local line=${COMP_LINE:0:COMP_POINT}
  local -a words
  read -r -a words <<< "$line"
  local cur="" prev=""
  if [[ $line =~ [[:space:]]$ ]]; then
    prev=${words[${#words[@]}-1]}
  else
    cur=${words[${#words[@]}-1]}
    (( ${#words[@]} > 1 )) && prev=${words[${#words[@]}-2]}
  fi
  local n=${#words[@]} verb="" i
  [[ -n $cur ]] && n=$((n - 1))
  for ((i = 1; i < n; i++)); do
    if [[ " $_memsim_verbs " == *" ${words[i]} "* ]]; then verb=${words[i]}; break; fi
  done
  local -a cands=()
  local nospace=0
  if [[ -z $verb ]]; then
    cands=($(compgen -W "$_memsim_verbs $_memsim_global" -- "$cur"))
  elif [[ $prev == --set || $prev == --vary ]]; then
    if [[ $cur == *=* ]]; then
      local key=${cur%%=*}
      case $key in
        model.preset) cands=($(compgen -P "$key=" -W "$_memsim_model_presets" -- "${cur#*=}"));;
        device.preset) cands=($(compgen -P "$key=" -W "$_memsim_device_presets" -- "${cur#*=}"));;
        checkpoint.policy) cands=($(compgen -P "$key=" -W "$_memsim_policies" -- "${cur#*=}"));;
      esac
    else
      cands=($(compgen -S "=" -W "$_memsim_keys" -- "$cur")); nospace=1
    fi
  elif [[ $prev == --max ]]; then
    cands=($(compgen -W "$_memsim_keys" -- "$cur"))
  elif [[ $prev == --policies ]]; then
    cands=($(compgen -W "$_memsim_policies" -- "${cur##*,}")); nospace=1
    local head=""; [[ $cur == *,* ]] && head=${cur%,*},
    cands=("${cands[@]/#/$head}")
  elif [[ " $(_memsim_valued "$verb") " == *" $prev "* ]]; then
    case $prev in
      --budget|-j|--threads|--fd-samples) cands=();;
      *) cands=($(compgen -f -- "$cur"));;
    esac
  elif [[ $cur == -* ]]; then
    cands=($(compgen -W "$(_memsim_options "$verb") $_memsim_global" -- "$cur"))
  elif [[ $verb == completion ]]; then
    cands=($(compgen -W "bash" -- "$cur"))
  elif [[ $verb != presets ]]; then
    cands=($(compgen -f -- "$cur"))
  fi
  # Bash replaces only the part of the word after the last COMP_WORDBREAKS character.
  local trim=${cur%"${cur##*[=:]}"}
  if [[ -n $trim && $COMP_WORDBREAKS == *"${trim: -1}"* ]]; then
    cands=("${cands[@]#"$trim"}")
  fi
  COMPREPLY=("${cands[@]}")
  if (( nospace )); then compopt -o nospace 2>/dev/null; fi
  return 0
}
complete -o default -F _memsim memsim
)BASH";

}  // namespace

CLI::App* add_completion_command(CLI::App& app, CompletionArgs& args) {
  CLI::App* cmd = app.add_subcommand(
      "completion", "Print the shell completion script (bash) for this memsim");
  cmd->add_option("SHELL", args.shell, "The shell: bash")->required()->check(CLI::IsMember({"bash"}));
  return cmd;
}

int run_completion(CLI::App& app, const CompletionArgs&) {
  std::vector<std::string> verbs;
  std::string options_case, valued_case;
  for (const CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    verbs.push_back(sub->get_name());
    std::vector<std::string> options, valued;
    for (const CLI::Option* opt : sub->get_options()) {
      if (opt->get_positional() && opt->get_lnames().empty() && opt->get_snames().empty()) continue;
      std::vector<std::string> names;
      for (const std::string& n : opt->get_lnames()) names.push_back("--" + n);
      for (const std::string& n : opt->get_snames()) names.push_back("-" + n);
      if (opt->get_group().empty()) continue;  // hidden (test hooks)
      for (const std::string& n : names) {
        options.push_back(n);
        if (opt->get_type_size() != 0) valued.push_back(n);
      }
    }
    options_case += "    " + sub->get_name() + ") echo \"" + join(options) + "\";;\n";
    valued_case += "    " + sub->get_name() + ") echo \"" + join(valued) + "\";;\n";
  }
  std::vector<std::string> keys = {"name"};
  for (const auto& [section, names] : scenario_detail::scenario_schema())
    for (const std::string& k : names) keys.push_back(section + "." + k);
  for (const std::string& k : scenario_detail::moe_sub_keys()) keys.push_back("model.moe." + k);
  std::vector<std::string> models, devices, policies;
  for (const PresetInfo& p : model_presets()) models.push_back(p.name);
  for (const PresetInfo& p : device_presets()) devices.push_back(p.name);
  for (const auto& [name, policy] : checkpoint_policy_spellings()) policies.push_back(name);

  std::printf("# bash completion for memsim, generated by `memsim completion bash`.\n");
  std::printf("_memsim_verbs=\"%s\"\n", join(verbs).c_str());
  std::printf("_memsim_global=\"--help --version -v --verbose\"\n");
  std::printf("_memsim_keys=\"%s\"\n", join(keys).c_str());
  std::printf("_memsim_model_presets=\"%s\"\n", join(models).c_str());
  std::printf("_memsim_device_presets=\"%s\"\n", join(devices).c_str());
  std::printf("_memsim_policies=\"%s\"\n", join(policies).c_str());
  std::printf("_memsim_options() {\n  case $1 in\n%s  esac\n}\n", options_case.c_str());
  std::printf("_memsim_valued() {\n  case $1 in\n%s  esac\n}\n", valued_case.c_str());
  std::fputs(kFunction, stdout);
  std::fflush(stdout);
  return kExitFits;
}

}  // namespace memsim::cli
