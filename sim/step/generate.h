// step.kind generate (issue #17 item 1): the Program of one Hugging Face generate() call,
// greedy, over a decoder row of the hf-llama family (docs/generate.md).
//
// What is emitted, in order (transformers v4.45, a55adee890b0757461e1588d8847fd385ce5c214:
// generation/utils.py GenerationMixin.generate / _sample, cache_utils.py, models/llama/
// modeling_llama.py prepare_inputs_for_generation and forward):
//  - setup: the model's weights and buffers (no gradients, no optimizer), then the prompts
//    input_ids and attention_mask (B, prompt_len) int64 (what a tokenizer call moved to the
//    device); the mark "measured_step_begin" (peaks count from the generate() call);
//  - _prepare_special_tokens: bos/eos/pad 0-d int64 device tensors (alive until generate
//    returns) and the isin/any, `< 0`/any checks; StaticCache: its zero buffers;
//  - _sample: unfinished_sequences (B) int64; cache_position = ones_like.cumsum(0) - 1; then
//    new_tokens iterations of: prepare_inputs_for_generation (input_ids[:, cache_position]
//    when decoding, position_ids = attention_mask.cumsum(-1) - 1 with its masked_fill_, the
//    slice + clone when the cache is non-empty (a StaticCache always), input_ids.clone(), a
//    StaticCache's 4-D mask) -- the previous iteration's model_inputs die only when the new
//    dict is bound; the forward (graph/models/decoder.h forward_generate: prefill of
//    prompt_len tokens, then one token per step, the KV cache growing); next_token_logits =
//    logits.clone()[:, -1, :].float(); argmax; the EOS padding arithmetic; input_ids and
//    attention_mask concatenated (the caller's prompt tensors stay alive);
//    cache_position[-1:] + 1; StoppingCriteriaList (MaxLength, EOS isin);
//    unfinished_sequences.max() == 0; `del outputs`. Marks "prefill_end" after the first
//    iteration and "generate_end" when generate() has returned (its locals freed, the
//    sequences kept, a StaticCache kept on the model as `self._cache`).
// The generation never stops early (EOS never sampled: memsim has no values), so it runs
// new_tokens forwards, the last token's K/V never entering the cache.
//
// Contract: deterministic; requires a Scenario whose step.kind is generate (checked by
// scenario/generate_keys.h). GenerateFacts, when asked for, receives the cache's bytes as
// the run left them (read from the cache's own tensors, not from a formula).
#pragma once

#include <cstdint>
#include <vector>

#include "graph/runtime.h"
#include "program/program.h"
#include "scenario/scenario.h"

namespace memsim {

struct GenerateFacts {
  uint64_t weights_bytes = 0;          // parameters and buffers the model holds
  uint64_t cache_bytes_end = 0;        // bytes the KV cache holds after the last forward
  int64_t cache_tokens_end = 0;        // tokens per sequence it holds then
  std::vector<uint64_t> cache_bytes;   // after each forward (prefill first)
  // generate.cache offloaded: host bytes of the layers' copies after the last forward and
  // the most at once (0 otherwise); cache_bytes* above count device bytes only.
  uint64_t cache_host_bytes_end = 0;
  uint64_t cache_host_peak_bytes = 0;
};

// The Program of the scenario's generate() call into `program` (cleared first).
void build_generate_program(const Scenario& scenario, Program& program,
                            graph::RuntimeBuffers* buffers = nullptr, GenerateFacts* facts = nullptr);

}  // namespace memsim
