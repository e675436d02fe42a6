// build_generate_program: HF generate() (greedy) as a Program (sim/step/generate.h). Python
// names are mirrored: a rebinding allocates the new tensor before the old one is freed, a
// function's locals die when it returns. Checked against tools/fixtures/
// gen_generate_fixtures.py's CPU stand-ins (tests/test_generate.cpp).
#include "sim/step/generate.h"

#include <algorithm>
#include <stdexcept>

#include "graph/models/decoder.h"
#include "graph/models/kv_cache.h"
#include "graph/ops/ops.h"
#include "scenario/hf_family.h"
#include "sim/step/event_budget.h"
#include "sim/step/schedule.h"
#include "sim/step/time_model_setup.h"

namespace memsim {
namespace {

using graph::OpKind;
using graph::Runtime;
using graph::Tensor;

uint64_t live_bytes(const Program& p) {
  uint64_t live = 0;
  for (const MemoryEvent& e : p.events) {
    if (e.type == EventType::alloc) live += e.bytes;
    if (e.type == EventType::free) live -= p.tensors[e.tensor].bytes;
  }
  return live;
}

class GenerateLoop {
 public:
  GenerateLoop(const Scenario& s, Program& program, graph::RuntimeBuffers* buffers)
      : s_(s), rt_(program, buffers), model_(rt_, shape(s)),
        cache_(rt_, model_.shape(),
               s.generate.cache == GenerateCache::static_cache ? graph::KvCacheKind::static_buffers
                                                               : graph::KvCacheKind::dynamic,
               s.generate.prompt_len + s.generate.new_tokens) {}

  void run(GenerateFacts* facts) {
    const GenerateConfig& g = s_.generate;
    const uint64_t B = static_cast<uint64_t>(s_.batch.micro_batch);
    const int64_t P = g.prompt_len, max_length = g.prompt_len + g.new_tokens;
    configure_device(rt_, s_.device);
    // The GEMMs' dtype (the weights': generate() runs without autocast) and the time
    // model's refusals; without it every GEMM was costed at the fp32 peak.
    configure_time_model(rt_, s_);
    rt_.reserve(static_cast<size_t>(g.new_tokens) *
                    (static_cast<size_t>(s_.model.layers) * 90 + 120) + 64 +
                static_cast<size_t>(s_.model.layers) * 16);
    rt_.grad_enabled = false;  // generate() is @torch.no_grad()
    rt_.ctx.phase = Phase::setup;
    model_.construct();
    // The prompts, as a tokenizer's output moved to the device: input_ids, attention_mask.
    Tensor prompt_ids = rt_.alloc(B * P * 8, TensorKind::input, OpKind::other);
    Tensor prompt_mask = rt_.alloc(B * P * 8, TensorKind::input, OpKind::other);
    if (facts != nullptr) facts->weights_bytes = live_bytes(rt_.program()) - 2 * B * P * 8;
    rt_.mark("measured_step_begin");

    // _prepare_special_tokens: generation_config's bos/eos/pad tensors, then the sanity
    // checks isin(eos, pad).any() and (eos < 0).any() (their results die at once).
    Tensor bos = rt_.alloc(8, TensorKind::other, OpKind::lift_fresh);
    Tensor eos = rt_.alloc(8, TensorKind::other, OpKind::lift_fresh);
    Tensor pad = rt_.alloc(8, TensorKind::other, OpKind::lift_fresh);
    for (OpKind check : {OpKind::isin, OpKind::compare}) {
      Tensor c = rt_.alloc(1, TensorKind::temporary, check);
      Tensor any = rt_.alloc(1, TensorKind::temporary, OpKind::reduce_any);
    }
    const bool quantized = s_.generate.cache == GenerateCache::quantized_int4 ||
                           s_.generate.cache == GenerateCache::quantized_int2 ||
                           s_.generate.cache == GenerateCache::quantized_int8;
    if (quantized) {
      // cache_implementation="quantized": QuantizedCache(backend quanto, nbits, q_group_size,
      // residual_length); 5.x's holds its QuantizedLayers from the start (truthy at the
      // prefill) and masks as DynamicLayer over its cumulative length: v4.45's masks.
      graph::QuantoSpec q;
      q.bits = s_.generate.cache == GenerateCache::quantized_int4 ? 4 : 2;
      q.group_size = s_.generate.q_group_size;
      cache_.set_quantized(q, s_.generate.residual_length, s_.generate.cache_classes_v5);
      if (s_.generate.cache == GenerateCache::quantized_int8) {
        // QuantizedCache(backend="hqq", nbits=8) (5.x only: the scenario reader refuses v4.45's).
        graph::HqqSpec h;
        h.group_size = s_.generate.q_group_size;
        h.states_fp16 = s_.precision.params == DType::fp16;
        cache_.use_hqq(h);
      }
    } else if (s_.generate.cache_classes_v5 && s_.generate.cache == GenerateCache::static_cache) {
      cache_.set_lazy(true);  // 5.x StaticCache(config, max_cache_len): StaticLayer buffers
    } else if (s_.generate.cache_classes_v5) {
      // DynamicCache(config=...): a DynamicSlidingWindowLayer per sliding layer.
      const graph::DecoderArch& a = s_.model.arch;
      std::vector<uint8_t> sliding(static_cast<size_t>(s_.model.layers), 0);
      for (int64_t l = 0; l < s_.model.layers; ++l) sliding[static_cast<size_t>(l)] = a.layer_slides(l) ? 1 : 0;
      cache_.use_layers(sliding, a.sliding_window);
      // DynamicCache(config, offloading=True): every layer's K/V on the host between uses.
      cache_.set_offloading(s_.generate.cache == GenerateCache::offloaded);
    }
    cache_.allocate();  // _prepare_cache_for_generation: StaticCache's buffers
    model_.set_cache(&cache_);

    // _sample
    rt_.ctx.phase = Phase::forward;
    Tensor unfinished = rt_.alloc(B * 8, TensorKind::temporary, OpKind::fill);
    Tensor cache_position;
    {
      Tensor ones = rt_.alloc(static_cast<uint64_t>(P) * 8, TensorKind::temporary, OpKind::fill);
      cache_position = rt_.alloc(static_cast<uint64_t>(P) * 8, TensorKind::temporary, OpKind::cumsum);
      ones.reset();
      cache_position = rt_.alloc(static_cast<uint64_t>(P) * 8, TensorKind::temporary, OpKind::sub);
    }
    Tensor input_ids = prompt_ids, attention_mask = prompt_mask;
    Tensor this_peer_finished;
    // _sample's loop locals: they keep the previous iteration's tensors until rebound.
    Tensor model_ids, model_pos, model_mask, model_cache_position, next_token_logits, next_tokens;
    int64_t cur_len = P;
    bool first = true;
    while (cur_len < max_length) {
      const int64_t S = first ? P : 1;  // input_ids.shape[1] != cache_position.shape[0] after prefill
      const int64_t T = cur_len;        // attention_mask's columns
      const uint64_t BT = B * static_cast<uint64_t>(T), BS = B * static_cast<uint64_t>(S);
      model_.set_generate_step(S, cache_.kind() == graph::KvCacheKind::static_buffers ? max_length
                                                                                     : T);
      // prepare_inputs_for_generation
      {
        Tensor ids;
        if (!first) ids = rt_.alloc(BS * 8, TensorKind::temporary, OpKind::index);
        Tensor pos = rt_.alloc(BT * 8, TensorKind::temporary, OpKind::cumsum);
        pos = rt_.alloc(BT * 8, TensorKind::temporary, OpKind::sub);
        rt_.alloc(BT, TensorKind::temporary, OpKind::eq).reset();  // masked_fill_(mask == 0, 1)
        // `if past_key_values:` -- a DynamicCache is falsy until it holds a layer; a
        // StaticCache defines no __len__ and is always truthy.
        // generate.cache_classes v5: DynamicCache(config) holds its layer objects from the
        // start (`len(self.layers)`), so the prefill's position_ids are sliced and cloned too.
        const bool sliced = cache_.kind() == graph::KvCacheKind::static_buffers || !first ||
                            cache_.layered() || cache_.truthy_from_start();
        if (sliced) pos = rt_.alloc(BS * 8, TensorKind::temporary, OpKind::clone);
        Tensor new_ids = rt_.alloc(BS * 8, TensorKind::temporary, OpKind::clone);
        Tensor new_mask;
        if (cache_.kind() == graph::KvCacheKind::static_buffers)
          new_mask = model_.generate_mask(static_cast<uint64_t>(max_length), static_cast<uint64_t>(T));
        ids.reset();  // prepare_inputs returns: its `input_ids` local dies
        // `model_inputs = ...`: the previous dict dies now. It holds the ids and position_ids
        // clones, cache_position and the mask (a StaticCache's 4-D one, else the 2-D
        // attention_mask itself: the previous mask outlives its concatenation until here).
        model_ids = std::move(new_ids);
        model_pos = std::move(pos);
        if (new_mask.defined())
          model_mask = std::move(new_mask);
        else
          model_mask = attention_mask;
        model_cache_position = cache_position;
      }
      graph::DecoderModel::GenerateInputs in;
      in.mask_len = T;
      in.mask4d = cache_.kind() == graph::KvCacheKind::static_buffers ? &model_mask : nullptr;
      in.position_ids = &model_pos;
      in.cache_position = &cache_position;
      in.logits_to_keep = g.logits_to_keep;
      Tensor outputs = model_.forward_generate(model_ids, in);
      if (facts != nullptr) facts->cache_bytes.push_back(cache_.bytes());
      rt_.ctx.layer = -1;
      rt_.ctx.module = graph::Module::none;
      // next_token_logits = outputs.logits.clone()[:, -1, :].float(): the clone of the
      // whole (B, keep, V) logits; .float() of fp32 logits is the clone's view, of low
      // precision ones an fp32 (B, V) copy (the clone dies at once).
      {
        const uint64_t keep = g.logits_to_keep <= 0 || g.logits_to_keep > S
                                  ? static_cast<uint64_t>(S)
                                  : static_cast<uint64_t>(g.logits_to_keep);
        const uint64_t BV = B * static_cast<uint64_t>(s_.model.vocab);
        Tensor c = rt_.alloc(outputs.bytes, TensorKind::temporary, OpKind::clone);
        if (outputs.bytes == BV * keep * 4)
          next_token_logits = std::move(c);
        else
          next_token_logits = rt_.alloc(BV * 4, TensorKind::temporary, OpKind::to_copy);
      }
      // next_tokens = argmax; next_tokens * unfinished + pad * (1 - unfinished)
      next_tokens = rt_.alloc(B * 8, TensorKind::temporary, OpKind::argmax);
      {
        Tensor a = rt_.alloc(B * 8, TensorKind::temporary, OpKind::mul);
        Tensor b;
        {
          Tensor rsub = rt_.alloc(B * 8, TensorKind::temporary, OpKind::sub);
          b = rt_.alloc(B * 8, TensorKind::temporary, OpKind::mul);
        }
        Tensor sum = rt_.alloc(B * 8, TensorKind::temporary, OpKind::add);
        a.reset();
        b.reset();
        next_tokens = std::move(sum);
      }
      input_ids = rt_.alloc(B * static_cast<uint64_t>(cur_len + 1) * 8, TensorKind::temporary, OpKind::cat2);
      // _update_model_kwargs_for_generation
      {
        Tensor ones = rt_.alloc(B * 8, TensorKind::temporary, OpKind::fill);  // new_ones
        Tensor m = rt_.alloc(B * static_cast<uint64_t>(cur_len + 1) * 8, TensorKind::temporary, OpKind::cat2);
        ones.reset();
        attention_mask = std::move(m);
      }
      cache_position = rt_.alloc(8, TensorKind::temporary, OpKind::add);
      // StoppingCriteriaList: full(False) | MaxLength's full | isin(input_ids[:, -1], eos)
      {
        Tensor done = rt_.alloc(B, TensorKind::temporary, OpKind::full);
        {
          Tensor max_len = rt_.alloc(B, TensorKind::temporary, OpKind::full);
          done = rt_.alloc(B, TensorKind::temporary, OpKind::bitwise);
        }
        {
          Tensor eos_done = rt_.alloc(B, TensorKind::temporary, OpKind::isin);
          done = rt_.alloc(B, TensorKind::temporary, OpKind::bitwise);
        }
        // unfinished_sequences & ~is_done
        Tensor not_done = rt_.alloc(B, TensorKind::temporary, OpKind::bitwise);
        done.reset();
        Tensor u = rt_.alloc(B * 8, TensorKind::temporary, OpKind::bitwise);
        not_done.reset();
        unfinished = std::move(u);
      }
      // this_peer_finished = unfinished_sequences.max() == 0
      {
        Tensor mx = rt_.alloc(8, TensorKind::temporary, OpKind::reduce_max);
        Tensor eq = rt_.alloc(1, TensorKind::temporary, OpKind::eq);
        mx.reset();
        this_peer_finished = std::move(eq);
      }
      ++cur_len;
      outputs.reset();  // del outputs
      if (first) rt_.mark("prefill_end");
      first = false;
    }
    if (facts != nullptr) {
      facts->cache_bytes_end = cache_.bytes();
      facts->cache_tokens_end = cache_.seq_length();
      facts->cache_host_bytes_end = cache_.host_bytes();
      facts->cache_host_peak_bytes = cache_.host_peak_bytes();
    }
    // Pinned host memory of the offloaded cache, reported as checkpoint.offload's is.
    rt_.program().host_offload_bytes = cache_.host_peak_bytes();
    // _sample returns the sequences; its locals and generate()'s die (a DynamicCache with
    // model_kwargs; a StaticCache stays on the model as self._cache).
    rt_.ctx.phase = Phase::other;
    model_.set_cache(nullptr);
    model_ids.reset();
    model_pos.reset();
    model_mask.reset();
    model_cache_position.reset();
    next_token_logits.reset();
    next_tokens.reset();
    unfinished.reset();
    this_peer_finished.reset();
    attention_mask.reset();
    cache_position.reset();
    if (cache_.kind() != graph::KvCacheKind::static_buffers) cache_.clear();
    bos.reset();
    eos.reset();
    pad.reset();
    rt_.mark("generate_end");
    rt_.freeze();  // the script ends: the sequences, the prompts and the model stay
  }

 private:
  static graph::HfShape shape(const Scenario& s) {
    graph::HfShape h = hf_shape(s);  // scenario/hf_family.h
    h.dropout = 0.0;                 // eval mode
    return h;
  }
  const Scenario& s_;
  Runtime rt_;
  graph::DecoderModel model_;
  graph::KvCache cache_;
};

}  // namespace

void build_generate_program(const Scenario& scenario, Program& program,
                            graph::RuntimeBuffers* buffers, GenerateFacts* facts) {
  if (scenario.step.kind != StepKind::generate)
    throw std::logic_error("build_generate_program: step.kind is not generate");
  check_event_budget(scenario);  // before any reservation (sim/step/event_budget.h)
  program.clear();
  GenerateLoop(scenario, program, buffers).run(facts);
}

}  // namespace memsim
