#!/usr/bin/env bash
# One GPU lease, one call: runs the prepared measuring groups one after another, each under
# its own time limit, and packs each group's outputs (its runs JSON, its snapshots archive,
# its log) into one tar under OUT, so that the call returns at most 8 files (the lending
# tool's limit) whatever a group leaves behind.
#
#   bash tools/gpu/lease.sh OUT [GROUP...]       # on the device: OUT=$OUT; all groups by default
#   LEASE_DRY=1 bash tools/gpu/lease.sh /tmp/o   # here: every group's CPU dry run (torch 1.13)
#
# A group that fails or runs past its limit is recorded in OUT/lease.log and the next group
# runs: one broken script cannot cost the others their turn. Groups run in order of value,
# so that a cut budget drops the last.
set -u
out=${1:?usage: lease.sh OUT [GROUP...]}; shift
mkdir -p "$out"
work=${LEASE_WORK:-/tmp/lease}
rm -rf "$work"; mkdir -p "$work"
py=${LEASE_PYTHON:-python3}
[ "${LEASE_DRY:-0}" = 1 ] && py=/usr/bin/python3
export PYTHONUNBUFFERED=1
log="$out/lease.log"
start=$(date +%s)

note() { echo "[lease +$(( $(date +%s) - start ))s] $*" | tee -a "$log"; }

# name | time limit (s) | command run in the repository root, $W its output folder
groups=(
  "env|20|$py tools/gpu/lease_env.py; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || true"
  # --- the 2026-11-28 lease (docs/gpu-next-session.md), in order of value ---
  # issue #16: FSDP2 + autocast over fp32, output_dtype (Accelerate >= 1.8), compile per block with AC,
  # torchtitan's code under FSDP2 (docs/fsdp2.md "Prepared, awaiting measurement")
  "fsdp2s10|175|$py tools/gpu/measure_fsdp2.py \$W --s10 --budget 150"
  # issue #15: transformers' own DeepSeek-V3 / V2 (autocast, bf16), PEFT LoRA on MLA, target_parameters LoRA
  # + HF checkpointing (docs/deepseek.md "GPU runs of the real code")
  "moe_s10|120|$py tools/gpu/measure_moe_s10.py \$W --budget 105"
  # issue #16: HF Trainer's FSDP2 paths on transformers' Qwen2: LoRA at another shape (the root hooks, blind),
  # Accelerate >= 1.8's bf16 policy with and without checkpointing, the real Accelerator (docs/hf-trainer.md)
  "hftfsdp2|80|$py tools/gpu/measure_hft.py \$W --s10 --budget 62"
  # issue #15: transformers' grouped_mm / batched_mm experts under bf16 autocast (docs/moe.md)
  "moe_mm|75|$py tools/gpu/measure_moe_autocast.py \$W --budget 60 --only 'moe_ac_tf_*_mm'"
  # issue #16: fp16 autocast with torch.amp.GradScaler (docs/autocast.md "GradScaler")
  "gscaler|65|$py tools/gpu/measure_gscaler.py \$W --budget 50"
  # issue #15: transformers' Qwen3-MoE under FSDP2 (full; target_parameters LoRA + HF checkpointing; grouped_mm)
  "moefsdp2|60|$py tools/gpu/measure_moe_fsdp2.py \$W --budget 45"
  # docs/gpu-next-session.md item 5 (docs/sdpa-gqa.md "Other shapes"): cuDNN attention at S = 1000,
  # MQA, 32 heads; blind predictions in tests/data/gpu/cudnn_shapes_predictions.json. ~15 s a run.
  "cudnn-shapes|55|$py tools/gpu/measure_cuda.py \$W --budget 33 --group cudnn-shapes"
  # docs/segment-placement.md "What a model would need": the driver's cudaMalloc placement
  "segments|35|$py tools/gpu/probe_segments.py \$W --budget 22"
  # issue #16 item 7: LitGPT's LoRAQKVLinear lora_B conv1d (cuDNN's workspace and copies: the one piece
  # memsim cannot size from the source; exploration, no prediction). A few seconds.
  "litqkv|25|$py tools/gpu/probe_litgpt_qkv_conv.py \$W --budget 15"
  # --- the 2026-11-27 leases' groups (measured; kept to re-run) ---
  "moe|95|$py tools/gpu/measure_moe_autocast.py \$W --budget 80"
  "cp|85|$py tools/gpu/measure_cp.py \$W --budget 70"
  "hft|105|$py tools/gpu/measure_hft.py \$W --budget 85"
  "impl|100|$py tools/gpu/measure_impl.py \$W --budget 80"
  # docs/gpu-next-session.md items 1 and 3 (C++ frames name the backward transients) and 2 (SDPA, blind)
  "arch|100|MEMSIM_CPP_STACKS=1 $py tools/gpu/measure_cuda.py \$W/stacks --budget 70 --only arch_llama_l4_d1024_s1024_b4_fp32 arch_qwen3_l4_d1024_s1024_b4_fp32 tf_arch_qwen2_l4_d1024_s1024_b4_fp32; $py tools/gpu/measure_cuda.py \$W/sdpa --budget 25 --only tf_arch_qwen2_l4_d1024_s1024_b4_bf16_sdpa tf_arch_qwen3_l4_d1024_s1024_b4_bf16_sdpa"
)

selected=("$@")
for g in "${groups[@]}"; do
  IFS='|' read -r name limit cmd <<<"$g"
  if [ ${#selected[@]} -gt 0 ] && [[ ! " ${selected[*]} " == *" $name "* ]]; then continue; fi
  W="$work/$name"; mkdir -p "$W"
  note "group $name: start (limit ${limit}s)"
  ( export W; timeout --kill-after=10 "$limit" bash -c "$cmd" ) >"$W/log.txt" 2>&1
  rc=$?
  note "group $name: rc $rc"
  tail -5 "$W/log.txt" | sed 's/^/    /' | tee -a "$log"
  # The environment's record goes into the log whole (the tool brings back at most 8 files).
  if [ "$name" = env ]; then sed 's/^/    /' "$W/log.txt" >>"$log"; continue; fi
  tar cf "$out/$name.tar" -C "$W" . 2>>"$log"
  # The lending tool brings back files up to 16 MiB: past that, the group's JSON and log alone.
  if [ "$(stat -c %s "$out/$name.tar")" -gt $((15 * 1024 * 1024)) ]; then
    note "group $name: archive over 15 MiB, snapshots left out"
    (cd "$W" && tar cf "$out/$name.tar" --exclude='*.tar.xz' --exclude='*.pickle' .)
  fi
done
note "done"
