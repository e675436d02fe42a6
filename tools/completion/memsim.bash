# bash completion for memsim: verbs, their options, scenario keys after --set / --vary /
# --max, preset names after model.preset= / device.preset=, checkpoint policies, files.
#
# Install: `source tools/completion/memsim.bash` from ~/.bashrc, or copy this file to
# ~/.local/share/bash-completion/completions/memsim (bash-completion loads it on first use).
# The completion itself is printed by the binary (`memsim completion bash`), so it always
# matches the memsim it completes: the one on PATH, or $MEMSIM when set.
if command -v "${MEMSIM:-memsim}" >/dev/null 2>&1; then
  eval "$("${MEMSIM:-memsim}" completion bash 2>/dev/null)"
fi
