// Storage reuse across builds and runs (sim/step/schedule.h BuildBuffers, sim/step/execute.h
// ExecuteBuffers), which memsim optimize relies on for speed: a Program built into reused
// buffers, and a Timeline executed with reused arrays, must equal fresh ones whatever was
// built or run before (bigger or smaller models, other families and policies).
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "sim/analysis/analysis.h"
#include "sim/step/checkpoint_policy.h"
#include "sim/step/execute.h"
#include "sim/step/schedule.h"

using namespace memsim;

namespace {

Scenario model(ModelFamily family, int64_t layers, int64_t seq, const std::string& policy) {
  Scenario s;
  s.name = "reuse test";
  s.model.family = family;
  s.model.layers = layers;
  s.model.d_model = 64;
  s.model.heads = 4;
  s.model.kv_heads = family == ModelFamily::hf_llama ? 2 : 4;
  s.model.d_ff = 172;
  s.model.vocab = 96;
  s.model.context_length = seq;
  s.model.tied_embeddings = family != ModelFamily::hf_llama;
  if (family == ModelFamily::megatron) s.precision.params = DType::bf16;
  s.batch.micro_batch = 2;
  s.batch.seq_len = seq;
  s.optimizer.impl = OptimizerImpl::foreach;
  s.step.warmup_steps = 1;
  s.device.cublas_workspace = 0;
  s.device.kernel_scratch = false;
  s.checkpoint = parse_policy(policy);
  return s;
}

void require_same(const Program& a, const Program& b) {
  REQUIRE(a.events.size() == b.events.size());
  REQUIRE(a.tensors.size() == b.tensors.size());
  for (size_t i = 0; i < a.events.size(); ++i) {
    const MemoryEvent &x = a.events[i], &y = b.events[i];
    INFO("event " << i);
    REQUIRE((x.type == y.type && x.kind == y.kind && x.phase == y.phase &&
             x.stream == y.stream && x.layer == y.layer && x.tensor == y.tensor &&
             x.op == y.op && x.bytes == y.bytes));
    REQUIRE(a.str(x.op) == b.str(y.op));
  }
  for (size_t t = 0; t < a.tensors.size(); ++t) {
    REQUIRE(a.tensors[t].bytes == b.tensors[t].bytes);
    REQUIRE(a.str(a.tensors[t].name) == b.str(b.tensors[t].name));
  }
  CHECK(a.flops.forward == b.flops.forward);
  CHECK(a.flops.backward == b.flops.backward);
  CHECK(a.flops.recompute == b.flops.recompute);
}

}  // namespace

TEST_CASE("a Program built into reused buffers equals a fresh build", "[optimize][schedule]") {
  const std::vector<Scenario> sequence = {
      model(ModelFamily::cs336, 6, 64, "full"),
      model(ModelFamily::cs336, 2, 32, "none"),
      model(ModelFamily::hf_llama, 4, 64, "modules"),
      model(ModelFamily::hf_gpt2, 3, 64, "custom:0,1.selective"),
      model(ModelFamily::cs336, 4, 64, "selective"),
      model(ModelFamily::megatron, 2, 64, "full"),
      model(ModelFamily::cs336, 6, 64, "full")};
  BuildBuffers buffers;
  ExecuteBuffers exec;
  Timeline previous;
  for (const Scenario& s : sequence) {
    INFO(to_string(s.model.family) << " " << s.model.layers << " layers, " << to_string(s.checkpoint.policy));
    const TrainingScript script = default_script(s);
    const Program fresh = build_program(s, script);
    const Program& reused = build_program(s, script, buffers);
    require_same(fresh, reused);

    SimulatedDevice d1(uint64_t{1} << 40, 0), d2(uint64_t{1} << 40, 0);
    const Timeline t1 = execute(fresh, s.allocator, d1);
    ExecuteOptions options;
    options.buffers = &exec;
    exec.timeline = std::move(previous);  // the previous run's arrays
    const Timeline t2 = execute(reused, s.allocator, d2, options);
    CHECK(t1.allocated == t2.allocated);
    CHECK(t1.reserved == t2.reserved);
    CHECK(t1.requested == t2.requested);
    CHECK(t1.by_kind == t2.by_kind);
    CHECK(t1.oom.has_value() == t2.oom.has_value());
    CHECK(analyze(fresh, t1).peak_reserved == analyze(reused, t2).peak_reserved);
    previous = t2;
  }
}
