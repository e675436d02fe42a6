#include "sim/megatron/megatron_step.h"

#include <algorithm>
#include <memory>
#include <stdexcept>
#include <string>

#include "graph/numeric/numeric.h"
#include "graph/ops/ops.h"
#include "sim/megatron/megatron_moe_parallel.h"
#include "sim/megatron/megatron_optimizer.h"
#include "sim/megatron/megatron_parallel.h"
#include "sim/megatron/megatron_pipeline.h"
#include "sim/parallel/data_parallel.h"
#include "sim/parallel/zero_sharding.h"
#include "sim/step/time_model_setup.h"
#include "sim/step/checkpoint_policy.h"
#include "sim/step/schedule.h"

namespace memsim {

using graph::OpKind;
using graph::Runtime;
using graph::Tensor;

graph::MegatronShape megatron_shape(const Scenario& s) {
  graph::MegatronShape shape;
  shape.layers = s.model.layers;
  shape.hidden = s.model.d_model;
  shape.heads = s.model.heads;
  shape.ffn = s.model.d_ff;
  shape.vocab = s.model.vocab;
  shape.max_positions = s.model.context_length > 0 ? s.model.context_length : s.batch.seq_len;
  shape.batch = s.batch.micro_batch;
  shape.seq = s.batch.seq_len;
  shape.elem = static_cast<uint64_t>(dtype_bytes(s.precision.params));
  shape.flash = s.model.attention != AttentionImpl::eager;
  shape.dropout = s.model.dropout > 0.0;
  shape.tensor = s.parallel.tensor;
  shape.sequence_parallel = s.parallel.sequence;
  shape.tied = s.model.tied_embeddings;
  shape.moe = megatron_moe_shape(s);  // Megatron-Core MoE (sim/megatron/megatron_moe_parallel.h)
  // --swiglu, --disable-bias-linear / --add-qkv-bias, --num-query-groups (scenario/megatron_arch_keys.h).
  shape.swiglu = s.megatron_arch.swiglu;
  shape.bias = s.megatron_arch.bias_linear;
  shape.add_qkv_bias = s.megatron_arch.qkv_bias && !s.megatron_arch.bias_linear;
  shape.kv_heads = s.model.kv_heads > 0 ? s.model.kv_heads : s.model.heads;
  return shape;
}

namespace {

// Names the tensor in reports (the op name is the default).
Tensor named(Runtime& rt, Tensor t, const char* name) {
  rt.program().tensors[t.storage].name = rt.program().intern(name);
  return t;
}

void check_supported(const Scenario& s) {
  auto fail = [](const std::string& what) {
    throw std::runtime_error("model family 'megatron': " + what + " is not modelled yet");
  };
  require_megatron_model_parallel_modelled(s);  // sim/megatron/megatron_parallel.h
  require_megatron_data_parallel_modelled(s);  // sim/parallel/data_parallel.h
  if (s.precision.autocast.has_value()) fail("torch.autocast (Megatron casts the model instead)");
  if (s.model.kv_heads != 0 && s.model.kv_heads != s.model.heads && s.model.attention == AttentionImpl::eager)
    fail("grouped-query attention with eager attention");
}

// One pretrain_gpt run. Members mirror Megatron's Python objects.
class MegatronLoop {
 public:
  MegatronLoop(const Scenario& s, const MegatronOptions& o, Program& program,
               graph::RuntimeBuffers* buffers = nullptr, graph::NumericContext* numeric = nullptr)
      : s_(s), rt_(program, buffers), model_(rt_, megatron_shape(s)) {
    rt_.numeric = numeric;  // numeric mode (graph/numeric/numeric.h); null in normal runs
    if (numeric != nullptr) rt_.test_drop_save = numeric->test_drop_save;
    optimizer_config_ = megatron_optimizer_config(s, o.zero_paper_accounting);
    grad_elem_ = optimizer_config_.grad_elem;
  }

  void run() {
    configure_device(rt_, s_.device);
    configure_time_model(rt_, s_);  // sim/step/time_model_setup.h
    // Activation recomputation (sim/step/checkpoint_policy.h; Megatron's reentrant
    // CheckpointFunction, graph/models/megatron.h): installs itself on rt_.
    checkpoint_ = make_checkpoint_engine(rt_, s_, default_script(s_));
    const graph::MegatronMoeShape& moe = model_.shape().moe;
    if (!checkpoint_ && moe.enabled() && (moe.recompute_moe || moe.recompute_shared)) {
      // --recompute-modules moe / shared_experts alone: Megatron's reentrant checkpoint of
      // those modules only (graph/models/megatron_moe.cpp opens the regions itself).
      graph::CheckpointPlan plan;
      plan.layers.assign(static_cast<size_t>(s_.model.layers), graph::LayerCheckpoint::keep);
      plan.reentrant = true;
      plan.early_stop = false;
      checkpoint_ = std::make_unique<graph::CheckpointEngine>(rt_, std::move(plan));
    }
    rt_.ctx.phase = Phase::setup;
    model_.construct();
    allocate_grad_buffer();
    std::vector<int32_t> order;  // param groups: decayed first, then the others
    for (int pass = 0; pass < 2; ++pass)
      for (size_t i = 0; i < model_.parameter_ids().size(); ++i)
        if (model_.decayed()[i] == (pass == 0)) order.push_back(model_.parameter_ids()[i]);
    const bool has_optimizer = s_.optimizer.type != OptimizerType::none;
    if (has_optimizer) {
      if (s_.parallel.zero >= 1 && model_.shape().moe.enabled())
        // Dense parameters sharded over the data-parallel group, expert ones over the expert
        // data-parallel group (sim/megatron/megatron_moe_parallel.h).
        optimizer_config_.owned_numel =
            megatron_moe_owned_numel(rt_, model_.shape().elem, model_.parameter_ids(),
                                     model_.expert(), s_.parallel.data, expert_data_parallel(s_));
      else if (s_.parallel.zero >= 1)  // --use-distributed-optimizer: this rank's shard only
        optimizer_config_.owned_numel = megatron_owned_numel(rt_, model_.shape().elem, s_);
      optimizer_ = std::make_unique<MegatronOptimizer>(optimizer_config_, std::move(order));
      rt_.ctx.module = graph::Module::optimizer;
      optimizer_->construct(rt_);
      rt_.ctx.module = graph::Module::none;
    }
    for (int64_t step = 0; step <= s_.step.warmup_steps; ++step)
      train_step(step == s_.step.warmup_steps);
    rt_.freeze();
  }

 private:
  uint64_t rows() const { return model_.rows(); }

  void allocate_grad_buffer() {
    // DistributedDataParallel: one grad buffer for all parameters (one bucket when
    // gradient reduce is not overlapped), torch.zeros(numel, dtype=grad_dtype).
    uint64_t numel = 0;
    for (const graph::Parameter& p : rt_.parameters()) numel += p.bytes / model_.shape().elem;
    rt_.ctx.layer = -1;
    // The distributed optimizer pads the buffer to a multiple of the data-parallel size.
    if (s_.parallel.zero >= 1) numel = padded_numel(numel, s_.parallel.data);
    if (model_.shape().moe.enabled()) {
      // Megatron DDP keeps expert parameters in their own buffers, reduced (and, with the
      // distributed optimizer, padded and sharded) over the expert data-parallel group.
      const MegatronMoeNumel n =
          megatron_moe_numel(rt_, model_.shape().elem, model_.parameter_ids(), model_.expert());
      uint64_t dense = n.dense, expert = n.expert;
      if (s_.parallel.zero >= 1) {
        dense = padded_numel(dense, s_.parallel.data);
        expert = padded_numel(expert, expert_data_parallel(s_));
      }
      main_grad_ = named(rt_, rt_.alloc(dense * grad_elem_, TensorKind::gradient, OpKind::other),
                         "main_grad buffer (Megatron DDP: every dense parameter's main_grad)");
      expert_grad_ = named(rt_, rt_.alloc(expert * grad_elem_, TensorKind::gradient, OpKind::other),
                           "main_grad buffer (Megatron DDP: the expert parameters' main_grad)");
      return;
    }
    main_grad_ = named(rt_, rt_.alloc(numel * grad_elem_, TensorKind::gradient, OpKind::other),
                       "main_grad buffer (Megatron DDP: every parameter's main_grad)");
  }

  void train_step(bool measured) {
    rt_.ctx.phase = Phase::other;
    rt_.ctx.layer = -1;
    if (measured) rt_.mark("measured_step_begin");
    const StepKind kind = s_.step.kind;
    // zero_grad_buffer() (in place) and optimizer.zero_grad(set_to_none=True).
    rt_.ctx.phase = Phase::optimizer;
    if (optimizer_) optimizer_->zero_grad(rt_);
    if (rt_.numeric != nullptr) rt_.numeric->zero_main_grads();
    const int64_t micro = std::max<int64_t>(1, s_.batch.grad_accum);
    for (int64_t mb = 0; mb < micro; ++mb) {
      const bool last = mb + 1 == micro;
      micro_batch(kind, measured && last);
    }
    if (kind == StepKind::train && optimizer_) {
      rt_.ctx.phase = Phase::optimizer;
      rt_.ctx.layer = -1;
      rt_.ctx.module = graph::Module::optimizer;
      optimizer_->step(rt_);
      if (rt_.numeric != nullptr) rt_.numeric->on_optimizer_step(rt_);
      rt_.ctx.module = graph::Module::none;
      if (measured) rt_.mark("optimizer_end");
    }
  }

  void micro_batch(StepKind kind, bool marks) {
    const bool with_grad = kind != StepKind::forward_no_grad;
    const bool with_backward = kind == StepKind::train || kind == StepKind::forward_backward;
    rt_.ctx.phase = Phase::forward;
    rt_.ctx.layer = -1;
    rt_.grad_enabled = with_grad;
    const uint32_t graph = with_grad ? rt_.begin_graph() : 0;
    // get_batch_on_this_tp_rank: each field copied to the device.
    const uint64_t b = model_.shape().batch, s = model_.shape().seq;
    Tensor tokens = named(rt_, rt_.alloc(rows() * 8, TensorKind::input, OpKind::other), "tokens");
    Tensor labels = named(rt_, rt_.alloc(rows() * 8, TensorKind::input, OpKind::other), "labels");
    Tensor loss_mask =
        named(rt_, rt_.alloc(rows() * 4, TensorKind::input, OpKind::other), "loss_mask");
    Tensor attention_mask =
        named(rt_, rt_.alloc(b * s * s, TensorKind::input, OpKind::other), "attention_mask");
    Tensor position_ids =
        named(rt_, rt_.alloc(rows() * 8, TensorKind::input, OpKind::other), "position_ids");
    if (rt_.numeric != nullptr)
      rt_.numeric->fill_megatron_batch(tokens, labels, loss_mask, position_ids);
    Tensor loss;
    {
      Tensor logits = model_.forward(tokens, position_ids, attention_mask);
      rt_.ctx.phase = Phase::loss;
      loss = model_.language_model_loss(logits, labels);
    }  // GPTModel.forward returns: the 16-bit logits die
    // forward_step returns: its batch names die (the embeddings saved the indices).
    tokens.reset();
    labels.reset();
    attention_mask.reset();
    position_ids.reset();
    // loss_func: torch.sum(losses.view(-1) * loss_mask).
    rt_.ctx.module = graph::Module::loss;
    Tensor masked = graph::mul(rt_, loss, loss_mask);
    loss_mask.reset();
    loss.reset();
    Tensor total = graph::sum_dim(rt_, masked, 4);
    masked.reset();
    rt_.ctx.module = graph::Module::none;
    rt_.grad_enabled = true;
    if (marks) rt_.mark("forward_end");
    if (!with_backward) {
      total.reset();
      if (graph != 0) rt_.discard_graph(graph);
      return;
    }
    rt_.ctx.phase = Phase::backward;
    rt_.backward(total);
    rt_.ctx.phase = Phase::other;
    total.reset();
    if (marks) rt_.mark("backward_end");
  }

  const Scenario& s_;
  Runtime rt_;
  graph::MegatronModel model_;
  uint64_t grad_elem_ = 4;
  MegatronOptimizerConfig optimizer_config_;
  std::unique_ptr<MegatronOptimizer> optimizer_;
  std::unique_ptr<graph::CheckpointEngine> checkpoint_;
  Tensor main_grad_;
  Tensor expert_grad_;  // Megatron-Core MoE: the expert parameters' DDP buffer
};

}  // namespace

void check_megatron_supported(const Scenario& scenario) { check_supported(scenario); }

Program build_megatron_program(const Scenario& scenario, const MegatronOptions& options) {
  Program program;
  build_megatron_program(scenario, options, program, nullptr);
  return program;
}

void build_megatron_program(const Scenario& scenario, const MegatronOptions& options,
                            Program& program, graph::RuntimeBuffers* buffers) {
  check_supported(scenario);
  if (scenario.parallel.pipeline > 1) {  // one Program per stage, the worst reported
    build_megatron_pipeline_program(scenario, options, program, buffers);
    return;
  }
  program.clear();
  {
    // Growing the event vector dominates building a 96-layer Program: reserve it (about
    // 115 events per layer and micro-batch, 13 per layer at setup and per optimizer step).
    const size_t layers = static_cast<size_t>(scenario.model.layers);
    const size_t steps = static_cast<size_t>(scenario.step.warmup_steps + 1);
    const size_t micro = static_cast<size_t>(std::max<int64_t>(1, scenario.batch.grad_accum));
    const size_t events = steps * (micro * (layers * 120 + 200) + layers * 40) + layers * 40;
    program.reserve(events);
    program.tensors.reserve(events / 2 + layers * 40);
  }
  MegatronLoop loop(scenario, options, program, buffers);
  loop.run();
  program.rank = megatron_model_parallel_rank(scenario, data_parallel_rank(scenario));
}

void build_megatron_program(const Scenario& scenario, Program& program,
                            graph::NumericContext* numeric) {
  check_supported(scenario);
  if (scenario.model.arch.moe.experts > 0)
    throw std::runtime_error("model family 'megatron': numeric mode of a MoE model is not modelled");
  if (scenario.megatron_arch.swiglu || !scenario.megatron_arch.bias_linear ||
      (scenario.model.kv_heads != 0 && scenario.model.kv_heads != scenario.model.heads))
    throw std::runtime_error(
        "model family 'megatron': numeric mode of --swiglu, --disable-bias-linear or grouped-query "
        "attention is not modelled");
  MegatronLoop(scenario, {}, program, nullptr, numeric).run();
}

}  // namespace memsim
