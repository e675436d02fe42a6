#include "sim/megatron/megatron_pipeline.h"

#include <algorithm>
#include <cstdio>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>

#include "allocator/caching_allocator.h"
#include "graph/models/megatron.h"
#include "graph/ops/ops.h"
#include "scenario/pipeline_split.h"
#include "sim/megatron/megatron_moe_parallel.h"
#include "sim/megatron/megatron_optimizer.h"
#include "sim/megatron/megatron_parallel.h"
#include "sim/megatron/megatron_pipeline_moe.h"
#include "sim/megatron/pipeline_schedule.h"
#include "sim/parallel/data_parallel.h"
#include "sim/parallel/zero_sharding.h"
#include "sim/search/workers.h"
#include "sim/step/time_model_setup.h"
#include "sim/step/checkpoint_policy.h"
#include "sim/step/peak_sink.h"
#include "sim/step/schedule.h"

namespace memsim {

using graph::OpKind;
using graph::Runtime;
using graph::Tensor;

namespace {

int64_t chunks_per_rank(const Scenario& s) {
  return s.parallel.pipeline_schedule == PipelineSchedule::interleaved ? s.parallel.virtual_stages : 1;
}
// Chunk c of rank `stage` holds virtual stage c * p + stage: the first one adds the
// embedding, the last one the output layer and the loss.
bool chunk_is_first(const Scenario& s, int64_t stage, int64_t c) {
  return c * s.parallel.pipeline + stage == 0;
}
bool chunk_is_last(const Scenario& s, int64_t stage, int64_t c) {
  return c * s.parallel.pipeline + stage == s.parallel.pipeline * chunks_per_rank(s) - 1;
}
std::vector<PipelineAction> stage_actions(const Scenario& s, int64_t stage) {
  const StepKind kind = s.step.kind;
  const bool with_backward = kind == StepKind::train || kind == StepKind::forward_backward;
  return pipeline_actions(s.parallel.pipeline_schedule, s.parallel.pipeline, chunks_per_rank(s),
                          std::max<int64_t>(1, s.batch.grad_accum), stage, !with_backward);
}

Tensor named(Runtime& rt, Tensor t, const char* name) {
  rt.program().tensors[t.storage].name = rt.program().intern(name);
  return t;
}

// One micro-batch a chunk has run forward and not yet backward (the schedule's
// input_tensors / output_tensors entries).
struct InFlight {
  Tensor input;       // the received activation (chunks after the first virtual stage)
  int32_t leaf = -1;  // its Runtime leaf id
  int32_t out_fn = -1;
  uint8_t out_slot = 0;
  Tensor output;      // the deallocated output: its 1-element stand-in
  uint32_t graph = 0;
};

struct Chunk {
  std::unique_ptr<graph::MegatronModel> model;
  size_t first_param = 0, end_param = 0;  // its parameter ids
  std::deque<InFlight> in_flight;
  // set_input_tensor: the decoder's input_tensor attribute keeps the last received input
  // until the chunk's next forward (past its backward, through the optimizer step).
  Tensor input_attribute;
};

class StageLoop {
 public:
  StageLoop(const Scenario& s, const MegatronOptions& o, int64_t stage, Program& program,
            graph::RuntimeBuffers* buffers)
      : s_(s), stage_(stage), rt_(program, buffers) {
    const ParallelConfig& p = s.parallel;
    v_ = p.pipeline_schedule == PipelineSchedule::interleaved ? p.virtual_stages : 1;
    // The chunk's scenario: its layers only (shape, checkpoint plan, per-layer numbering).
    // The chunks of one rank build equally many layers (scenario/pipeline_split.h refuses
    // the splits where they would not), so one plan serves them all.
    const PipelineSplit split = pipeline_split(s);
    chunk_scenario_ = s;
    chunk_scenario_.model.layers = chunk_layers(split, stage, 0).count;
    optimizer_config_ = megatron_optimizer_config(s, o.zero_paper_accounting);
    for (int64_t c = 0; c < v_; ++c) {
      graph::MegatronShape shape = megatron_shape(chunk_scenario_);
      // What the stage changes here is part of megatron_stage_key: keep the two in step.
      shape.pre_process = chunk_is_first(s, stage, c);
      shape.post_process = chunk_is_last(s, stage, c);
      // MoE layers follow the global layer index (sim/megatron/megatron_pipeline_moe.h).
      const ChunkLayers layers = chunk_layers(split, stage, c);
      if (layers.count != chunk_scenario_.model.layers)
        throw std::logic_error("pipeline chunks of one rank differ in length");
      shape.layer_offset = layers.offset;
      Chunk chunk;
      chunk.model = std::make_unique<graph::MegatronModel>(rt_, shape);
      chunk.model->share_global_buffer(&global_buffer_);  // one per process, not per chunk
      chunk.model->share_te_buffers(&te_buffers_);        // TEGroupedMLP's, likewise
      chunks_.push_back(std::move(chunk));
    }
    const graph::MegatronShape& shape = chunks_[0].model->shape();
    const uint64_t seq = static_cast<uint64_t>(shape.sequence_parallel ? shape.seq / shape.tensor
                                                                        : shape.seq);
    p2p_bytes_ = seq * static_cast<uint64_t>(shape.batch * shape.hidden) * shape.elem;
  }

  void run() {
    configure_device(rt_, s_.device);
    configure_time_model(rt_, s_);  // sim/step/time_model_setup.h
    try {
      checkpoint_ = make_checkpoint_engine(rt_, chunk_scenario_, default_script(chunk_scenario_));
    } catch (const PolicyError& e) {
      // Megatron numbers each chunk's layers from 0, and its recompute settings apply per
      // chunk: say so, or "the model has 12 layers" would puzzle a 96-layer scenario.
      throw PolicyError(std::string(e.what()) + "; with parallel.pipeline " +
                        std::to_string(s_.parallel.pipeline) +
                        " checkpoint.custom numbers the layers of each stage's chunk (0-" +
                        std::to_string(chunk_scenario_.model.layers - 1) + "), as Megatron does");
    }
    const graph::MegatronMoeShape& moe = chunks_[0].model->shape().moe;
    if (!checkpoint_ && moe.enabled() && (moe.recompute_moe || moe.recompute_shared)) {
      // --recompute-modules moe / shared_experts alone, as in the one-stage loop
      // (sim/megatron/megatron_step.cpp): the MoE layers open their reentrant regions.
      graph::CheckpointPlan plan;
      plan.layers.assign(static_cast<size_t>(chunk_scenario_.model.layers), graph::LayerCheckpoint::keep);
      plan.reentrant = true;
      plan.early_stop = false;
      checkpoint_ = std::make_unique<graph::CheckpointEngine>(rt_, std::move(plan));
    }
    rt_.ctx.phase = Phase::setup;
    // get_model builds every chunk, then wraps each in its own DDP (one grad buffer each).
    for (Chunk& c : chunks_) {
      c.first_param = rt_.parameters().size();
      c.model->construct();
      c.end_param = rt_.parameters().size();
    }
    for (Chunk& c : chunks_) allocate_grad_buffer(c);
    if (s_.optimizer.type != OptimizerType::none) construct_optimizer();
    for (int64_t step = 0; step <= s_.step.warmup_steps; ++step)
      train_step(step == s_.step.warmup_steps);
    rt_.freeze();
  }

 private:
  uint64_t elem() const { return chunks_[0].model->shape().elem; }

  void allocate_grad_buffer(const Chunk& c) {
    uint64_t numel = 0;
    for (size_t i = c.first_param; i < c.end_param; ++i)
      numel += rt_.parameters()[i].bytes / elem();
    rt_.ctx.layer = -1;
    if (c.model->shape().moe.enabled()) {
      allocate_moe_grad_buffers(c);
      return;
    }
    if (s_.parallel.zero >= 1) numel = padded_numel(numel, s_.parallel.data);
    // Megatron's DistributedDataParallel grad buffer: the main_grad of every parameter of
    // the model chunk (one bucket: reduce is not overlapped).
    const std::string name = "main_grad buffer of model chunk " + std::to_string(grad_buffers_.size()) +
                             " (Megatron DDP: every parameter's main_grad)";
    grad_buffers_.push_back(named(
        rt_, rt_.alloc(numel * optimizer_config_.grad_elem, TensorKind::gradient, OpKind::other),
        name.c_str()));
  }

  // A MoE chunk's DistributedDataParallel: the dense parameters' buffer, then the expert
  // parameters' (expert_parallel_buffers, reduced over the expert data-parallel group),
  // each padded to its group with the distributed optimizer (as sim/megatron/megatron_step.cpp
  // does for one stage; Megatron-LM d98e8a64 core/distributed/distributed_data_parallel.py).
  void allocate_moe_grad_buffers(const Chunk& c) {
    const MegatronMoeNumel n = megatron_moe_numel(rt_, elem(), c.model->parameter_ids(), c.model->expert());
    uint64_t dense = n.dense, expert = n.expert;
    if (s_.parallel.zero >= 1) {
      dense = padded_numel(dense, s_.parallel.data);
      expert = padded_numel(expert, expert_data_parallel(s_));
    }
    const std::string k = std::to_string(grad_buffers_.size() / 2);
    const std::string dense_name =
        "main_grad buffer of model chunk " + k + " (Megatron DDP: every dense parameter's main_grad)";
    const std::string expert_name =
        "main_grad buffer of model chunk " + k + " (Megatron DDP: the expert parameters' main_grad)";
    grad_buffers_.push_back(named(
        rt_, rt_.alloc(dense * optimizer_config_.grad_elem, TensorKind::gradient, OpKind::other),
        dense_name.c_str()));
    // A chunk of dense layers only (model.moe.first_dense_layers) has no expert parameter:
    // DDP then builds no expert buffer.
    if (n.expert == 0) {
      grad_buffers_.emplace_back();
      return;
    }
    grad_buffers_.push_back(named(
        rt_, rt_.alloc(expert * optimizer_config_.grad_elem, TensorKind::gradient, OpKind::other),
        expert_name.c_str()));
  }

  void construct_optimizer() {
    std::vector<int32_t> order;  // param groups: decayed first, then the others, chunk by chunk
    for (int pass = 0; pass < 2; ++pass)
      for (const Chunk& c : chunks_)
        for (size_t i = 0; i < c.model->parameter_ids().size(); ++i)
          if (c.model->decayed()[i] == (pass == 0)) order.push_back(c.model->parameter_ids()[i]);
    if (s_.parallel.zero >= 1) {
      // The distributed optimizer shards each DDP buffer (each chunk's) over the data-parallel
      // group; rank 0's share of every parameter.
      for (const Chunk& c : chunks_) {
        if (c.model->shape().moe.enabled()) {
          // Dense parameters over the data-parallel group, expert ones over the expert
          // data-parallel group (sim/megatron/megatron_moe_parallel.h); this chunk's ids.
          const std::vector<uint64_t> all = megatron_moe_owned_numel(
              rt_, elem(), c.model->parameter_ids(), c.model->expert(), s_.parallel.data,
              expert_data_parallel(s_));
          optimizer_config_.owned_numel.insert(optimizer_config_.owned_numel.end(),
                                               all.begin() + static_cast<std::ptrdiff_t>(c.first_param),
                                               all.begin() + static_cast<std::ptrdiff_t>(c.end_param));
          continue;
        }
        std::vector<uint64_t> numel;
        for (size_t i = c.first_param; i < c.end_param; ++i)
          numel.push_back(rt_.parameters()[i].bytes / elem());
        const std::vector<uint64_t> owned = megatron_shard_numel(numel, s_.parallel.data, 0);
        optimizer_config_.owned_numel.insert(optimizer_config_.owned_numel.end(), owned.begin(),
                                             owned.end());
      }
    }
    optimizer_ = std::make_unique<MegatronOptimizer>(optimizer_config_, std::move(order));
    rt_.ctx.module = graph::Module::optimizer;
    optimizer_->construct(rt_);
    rt_.ctx.module = graph::Module::none;
  }

  void train_step(bool measured) {
    rt_.ctx.phase = Phase::other;
    rt_.ctx.layer = -1;
    if (measured) rt_.mark("measured_step_begin");
    rt_.ctx.phase = Phase::optimizer;
    if (optimizer_) optimizer_->zero_grad(rt_);
    const StepKind kind = s_.step.kind;
    with_backward_ = kind == StepKind::train || kind == StepKind::forward_backward;
    with_grad_ = kind != StepKind::forward_no_grad;
    const std::vector<PipelineAction> actions = stage_actions(s_, stage_);  // in the key
    size_t last_forward = 0, last_backward = 0;
    for (size_t i = 0; i < actions.size(); ++i) (actions[i].forward ? last_forward : last_backward) = i;
    for (size_t i = 0; i < actions.size(); ++i) {
      const PipelineAction& a = actions[i];
      if (a.forward) {
        forward(chunks_[static_cast<size_t>(a.chunk)]);
      } else {
        backward(chunks_[static_cast<size_t>(a.chunk)]);
      }
      rt_.ctx.phase = Phase::other;
      rt_.ctx.layer = -1;
      if (measured && a.forward && i == last_forward) rt_.mark("forward_end");
      if (measured && !a.forward && i == last_backward) rt_.mark("backward_end");
    }
    // The schedule function returns: its locals die.
    input_tensor_.reset();
    output_tensor_grad_.reset();
    drop_input_tensor_grad();
    rt_.grad_enabled = true;
    if (kind == StepKind::train && optimizer_) {
      rt_.ctx.phase = Phase::optimizer;
      rt_.ctx.module = graph::Module::optimizer;
      optimizer_->step(rt_);
      rt_.ctx.module = graph::Module::none;
      if (measured) rt_.mark("optimizer_end");
    }
  }

  void drop_input_tensor_grad() {
    if (input_tensor_grad_ == graph::kNoStorage) return;
    const uint32_t g = input_tensor_grad_;
    input_tensor_grad_ = graph::kNoStorage;
    rt_.release(g);
  }

  // forward_step on one chunk (recv_forward first unless it is the first virtual stage).
  void forward(Chunk& chunk) {
    graph::MegatronModel& model = *chunk.model;
    const graph::MegatronShape& shape = model.shape();
    rt_.ctx.phase = Phase::forward;
    rt_.ctx.layer = -1;
    rt_.ctx.module = graph::Module::none;
    rt_.grad_enabled = with_grad_;
    InFlight f;
    // A new graph generation first: the received leaf belongs to this micro-batch's graph.
    f.graph = with_grad_ ? rt_.begin_graph() : 0;
    if (!shape.pre_process) {
      // p2p recv: torch.empty(shape, requires_grad=True), bound to input_tensor.
      Tensor in = with_grad_ ? rt_.alloc_leaf(p2p_bytes_, TensorKind::activation, OpKind::other,
                                              &f.leaf)
                             : rt_.alloc(p2p_bytes_, TensorKind::activation, OpKind::other);
      input_tensor_ = named(rt_, std::move(in), "pipeline recv: input activation");
      f.input = input_tensor_;
      chunk.input_attribute = input_tensor_;  // set_input_tensor
    }
    Tensor output;
    {
      // get_batch: the first and last virtual stages load the batch (tensor-parallel rank 0
      // copies all five fields to the device); the others get None.
      Tensor tokens, labels, loss_mask, attention_mask, position_ids;
      if (shape.pre_process || shape.post_process) {
        const uint64_t rows = model.rows();
        tokens = named(rt_, rt_.alloc(rows * 8, TensorKind::input, OpKind::other), "tokens");
        labels = named(rt_, rt_.alloc(rows * 8, TensorKind::input, OpKind::other), "labels");
        loss_mask = named(rt_, rt_.alloc(rows * 4, TensorKind::input, OpKind::other), "loss_mask");
        attention_mask = named(
            rt_,
            rt_.alloc(static_cast<uint64_t>(shape.batch * shape.seq * shape.seq),
                      TensorKind::input, OpKind::other),
            "attention_mask");
        position_ids =
            named(rt_, rt_.alloc(rows * 8, TensorKind::input, OpKind::other), "position_ids");
      }
      Tensor embedded;  // GPTModel.forward's decoder_input
      if (shape.pre_process) embedded = model.embed(tokens, position_ids);
      Tensor hidden = model.decoder(shape.pre_process ? embedded : f.input, attention_mask);
      if (shape.post_process) {
        Tensor logits = model.head(std::move(hidden));
        embedded.reset();
        rt_.ctx.phase = Phase::loss;
        Tensor loss = model.language_model_loss(logits, labels);
        logits.reset();
        tokens.reset();
        labels.reset();
        attention_mask.reset();
        position_ids.reset();
        // loss_func: torch.sum(losses.view(-1) * loss_mask) (then scaled in place).
        rt_.ctx.module = graph::Module::loss;
        Tensor masked = graph::mul(rt_, loss, loss_mask);
        loss_mask.reset();
        loss.reset();
        output = graph::sum_dim(rt_, masked, 4);
        masked.reset();
        rt_.ctx.module = graph::Module::none;
      } else {
        output = std::move(hidden);
      }
    }  // forward_step returns: the batch names die
    rt_.ctx.phase = Phase::forward;
    if (!with_backward_) {  // forward only: the output is dropped, its graph with it
      output.reset();
      if (f.graph != 0) rt_.discard_graph(f.graph);
      return;
    }
    // send_forward, then deallocate_output_tensor: out.data = torch.empty((1,)).
    f.out_fn = output.grad_fn;
    f.out_slot = output.out_slot;
    const uint64_t one = shape.post_process ? output.bytes : elem();
    f.output = named(rt_, rt_.alloc(one, TensorKind::activation, OpKind::other),
                     "pipeline output (deallocated to 1 element)");
    output.reset();
    chunk.in_flight.push_back(std::move(f));
  }

  // backward_step on one chunk's oldest micro-batch (recv_backward first unless it is the
  // last virtual stage), then send_backward of its input's grad.
  void backward(Chunk& chunk) {
    const graph::MegatronShape& shape = chunk.model->shape();
    InFlight f = std::move(chunk.in_flight.front());
    chunk.in_flight.pop_front();
    input_tensor_ = f.input;  // input_tensor = input_tensors.pop(0)
    f.input.reset();
    rt_.ctx.phase = Phase::backward;
    rt_.ctx.layer = -1;
    rt_.ctx.module = graph::Module::none;
    if (!shape.post_process) {
      output_tensor_grad_ = named(rt_, rt_.alloc(p2p_bytes_, TensorKind::temporary, OpKind::other),
                                  "pipeline recv: output grad");
      rt_.backward(f.out_fn, f.out_slot, output_tensor_grad_.storage);
    } else {
      // custom_backward with grad_output None: ones_like(output).
      Tensor ones = rt_.alloc(f.output.bytes, TensorKind::temporary, OpKind::fill);
      rt_.backward(f.out_fn, f.out_slot, ones.storage);
      ones.reset();
    }
    f.output.reset();
    rt_.ctx.phase = Phase::backward;
    rt_.ctx.layer = -1;
    if (f.leaf >= 0) {
      // input_tensor_grad = input_tensor.grad (sent back; bound until the next backward).
      const uint32_t g = rt_.take_leaf_grad(f.leaf);
      drop_input_tensor_grad();
      input_tensor_grad_ = g;
    }
  }

  const Scenario& s_;
  Scenario chunk_scenario_;
  int64_t stage_ = 0, v_ = 1;
  Runtime rt_;
  graph::Tensor global_buffer_;  // Megatron's process-wide global memory buffer
  // Transformer Engine's process-wide grouped-GEMM workspaces and dummy wgrads
  // (graph/models/megatron.h share_te_buffers).
  std::vector<graph::Tensor> te_buffers_;
  std::vector<Chunk> chunks_;
  std::vector<Tensor> grad_buffers_;
  MegatronOptimizerConfig optimizer_config_;
  std::unique_ptr<MegatronOptimizer> optimizer_;
  std::unique_ptr<graph::CheckpointEngine> checkpoint_;
  uint64_t p2p_bytes_ = 0;
  bool with_backward_ = true, with_grad_ = true;
  // The schedule's Python locals.
  Tensor input_tensor_, output_tensor_grad_;
  uint32_t input_tensor_grad_ = graph::kNoStorage;
};

RankInfo stage_rank(const Scenario& scenario, int64_t stage) {
  RankInfo r = data_parallel_rank(scenario);
  r.pipeline_stage = static_cast<int>(stage);
  // Megatron's rank order (tp fastest, then dp, then pp): tensor- and data-parallel rank 0.
  r.index = static_cast<int>(stage * scenario.parallel.tensor * scenario.parallel.data);
  r.why.clear();
  return r;
}

std::string gib(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", static_cast<double>(bytes) / (1024.0 * 1024 * 1024));
  return buf;
}

}  // namespace

void build_megatron_stage_program(const Scenario& scenario, const MegatronOptions& options,
                                  int64_t stage, Program& program,
                                  graph::RuntimeBuffers* buffers) {
  program.clear();
  {
    const size_t layers = static_cast<size_t>(max_stage_layers(pipeline_split(scenario)));
    const size_t steps = static_cast<size_t>(scenario.step.warmup_steps + 1);
    const size_t micro = static_cast<size_t>(std::max<int64_t>(1, scenario.batch.grad_accum));
    const size_t events = steps * (micro * (layers * 120 + 200) + layers * 40) + layers * 40;
    program.reserve(events);
    program.tensors.reserve(events / 2 + layers * 40);
  }
  StageLoop loop(scenario, options, stage, program, buffers);
  loop.run();
  program.rank = stage_rank(scenario, stage);
}

std::vector<int32_t> megatron_stage_key(const Scenario& scenario, int64_t stage) {
  std::vector<int32_t> key;
  // Each chunk's flags and layer count (uneven splits: scenario/pipeline_split.h).
  const PipelineSplit split = pipeline_split(scenario);
  for (int64_t c = 0; c < chunks_per_rank(scenario); ++c)
    key.push_back((chunk_is_first(scenario, stage, c) ? 1 : 0) | (chunk_is_last(scenario, stage, c) ? 2 : 0) |
                  static_cast<int32_t>(chunk_layers(split, stage, c).count << 2));
  for (const PipelineAction& a : stage_actions(scenario, stage))
    key.push_back(a.forward ? a.chunk + 1 : -(a.chunk + 1));
  // MoE: which of the stage's layers are MoE layers (by the global index), and their
  // routing when it differs per layer (empty without MoE: dense keys unchanged).
  const std::vector<int32_t> moe = megatron_moe_stage_key_part(scenario, stage);
  if (!moe.empty()) {
    key.push_back(0x7fffffff);  // separator: the action codes are small
    key.insert(key.end(), moe.begin(), moe.end());
  }
  return key;
}

PipelineStagePeaks build_megatron_pipeline_program(const Scenario& scenario,
                                                   const MegatronOptions& options,
                                                   Program& program,
                                                   graph::RuntimeBuffers* buffers) {
  const int64_t p = scenario.parallel.pipeline;
  PipelineStagePeaks peaks;
  // The caller's sink (a plain `run`, program/event_sink.h) must see only the stage
  // chosen: the selection below builds without it.
  const SinkAttachment sink = program.take_sink();
  peaks.peak_reserved.assign(static_cast<size_t>(p), 0);

  // Stages with equal keys build equal events (megatron_stage_key): the first of each key
  // is built and its peak stands for the others.
  std::vector<size_t> built;               // stages built, in order
  std::vector<size_t> peak_of(static_cast<size_t>(p));  // per stage: index into `built`
  {
    std::map<std::vector<int32_t>, size_t> first_of;
    for (int64_t k = 0; k < p; ++k) {
      const auto [it, added] = first_of.emplace(megatron_stage_key(scenario, k), built.size());
      if (added) built.push_back(static_cast<size_t>(k));
      peak_of[static_cast<size_t>(k)] = it->second;
    }
  }
  // The built stages are independent: streamed into a PeakSink each on the -j workers
  // (sim/search/workers.h), each worker reusing its Program, Runtime and Executor tables.
  // Nothing per event is stored. The error raised is the first failing stage's, as when
  // they run in order (a key's stages fail alike; its first is the one built).
  struct Worker {
    Program candidate;
    graph::RuntimeBuffers runtime;
    std::vector<BlockId> block_of;
    std::vector<uint64_t> rounded_of;
  };
  const unsigned workers = worker_count(0, built.size());
  std::vector<Worker> pool(workers);
  std::vector<uint64_t> built_peak(built.size(), 0);
  std::vector<std::exception_ptr> failures(built.size());
  run_parallel_workers(
      built.size(),
      [&](size_t task, unsigned w) {
        const auto k = static_cast<int64_t>(built[task]);
        Worker& me = pool[w];
        try {
          SimulatedDevice device(1ull << 60, 0);
          PeakSink peak(scenario.allocator, device, "measured_step_begin", &me.block_of, &me.rounded_of);
          me.candidate.set_sink(SinkAttachment{&peak});
          struct Detach {
            Program& p;
            ~Detach() { p.take_sink(); }
          } detach{me.candidate};
          // Worker 0 is the calling thread: it keeps using the caller's buffers.
          build_megatron_stage_program(scenario, options, k, me.candidate,
                                       w == 0 && buffers != nullptr ? buffers : &me.runtime);
          me.candidate.finish();
          // Peaks were reset at measured_step_begin: this is the measured step's peak.
          built_peak[task] = static_cast<uint64_t>(peak.stats().reserved_bytes.all.peak);
        } catch (...) {
          failures[task] = std::current_exception();
        }
      },
      workers);
  for (const std::exception_ptr& f : failures)
    if (f) std::rethrow_exception(f);
  for (size_t k = 0; k < peaks.peak_reserved.size(); ++k) peaks.peak_reserved[k] = built_peak[peak_of[k]];
  // The largest peak, the first of equals (always a stage that was built: an earlier
  // stage with an equal key would have the same peak).
  for (size_t k = 1; k < peaks.peak_reserved.size(); ++k)
    if (peaks.peak_reserved[k] > peaks.peak_reserved[static_cast<size_t>(peaks.worst)])
      peaks.worst = static_cast<int64_t>(k);
  RankInfo r = stage_rank(scenario, peaks.worst);
  const ParallelConfig& pc = scenario.parallel;
  std::string why = "pipeline stage " + std::to_string(peaks.worst) + " of " + std::to_string(p) +
                    " has the largest peak reserved with unlimited memory (GiB by stage:";
  for (size_t k = 0; k < peaks.peak_reserved.size(); ++k)
    why += (k == 0 ? " " : ", ") + gib(peaks.peak_reserved[k]);
  why += std::string("; ") + to_string(pc.pipeline_schedule) + " schedule, " +
         std::to_string(std::max<int64_t>(1, scenario.batch.grad_accum)) + " micro-batches";
  if (pc.pipeline_schedule == PipelineSchedule::interleaved)
    why += ", " + std::to_string(pc.virtual_stages) + " chunks per rank";
  const PipelineSplit split = pipeline_split(scenario);
  if (split.uneven()) {  // uneven split: the layers each stage builds
    why += "; layers by stage:";
    for (int64_t k = 0; k < p; ++k) {
      int64_t n = 0;
      for (int64_t c = 0; c < split.chunks; ++c) n += chunk_layers(split, k, c).count;
      why += (k == 0 ? " " : ", ") + std::to_string(n);
    }
  }
  why += ")";
  if (pc.tensor > 1)
    why += "; tensor-parallel rank 0 of the stage stands for all " + std::to_string(pc.tensor);
  if (pc.data > 1) why += "; data-parallel rank 0 of " + std::to_string(pc.data);
  r.why = why;
  // The chosen stage once more, into the caller's Program and its sink (if any: then the
  // events are executed as they are emitted and none is stored). The build is not
  // stopped at an out-of-memory (abort_when_done off): a pipeline's Analysis::events and
  // FLOPs stay the whole stage's, as when the stage was built before being streamed.
  if (sink.sink != nullptr) {
    SinkAttachment whole = sink;
    whole.abort_when_done = false;
    program.set_sink(whole);
  }
  build_megatron_stage_program(scenario, options, peaks.worst, program, buffers);
  program.rank = r;
  return peaks;
}

}  // namespace memsim
