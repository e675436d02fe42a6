// The Hugging Face presets end to end (scenario -> build_program -> execute): every
// preset builds with each attention implementation its family models, the fused SDPA
// kernels keep no S x S tensor, and the shipped LLaMA 2 7B fine-tuning scenario fits.
#include <catch2/catch.hpp>

#include <string>

#include "sim/step/execute.h"
#include "sim/step/schedule.h"
#include "test_paths.h"

using namespace memsim;

namespace {

struct Run {
  uint64_t peak_requested = 0;
  uint64_t forward_end = 0;  // requested bytes at the measured step's forward_end mark
  bool oom = false;
};

Run run(const Scenario& s) {
  const Program program = build_program(s);
  SimulatedDevice device(s.device.capacity, s.device.cuda_context);
  ExecuteOptions options;
  options.record_by_kind = false;
  const Timeline t = execute(program, s.allocator, device, options);
  Run r;
  r.oom = t.oom.has_value();
  for (uint64_t v : t.requested) r.peak_requested = std::max(r.peak_requested, v);
  for (size_t i = 0; i < t.size(); ++i) {
    const MemoryEvent& e = program.events[i];
    if (e.type == EventType::mark && program.str(static_cast<uint32_t>(e.bytes)) == "forward_end")
      r.forward_end = t.requested[i];
  }
  return r;
}

// SGD without momentum: no optimizer state (the forward_end comparison below is then
// about activations and parameters only).
Scenario preset(const std::string& name, const std::string& attention, int seq) {
  return load_scenario_text("model:\n  preset: " + name + "\n  attention: " + attention +
                                "\nbatch:\n  seq_len: " + std::to_string(seq) +
                                "\nprecision:\n  params: bf16\noptimizer:\n  type: sgd\n"
                                "device:\n  capacity: 1TiB\n",
                            "hf-preset.yaml");
}

}  // namespace

TEST_CASE("hf presets build and run with every modelled attention", "[hf]") {
  for (const char* name : {"gpt2-small", "gpt2-medium", "gpt2-large", "gpt2-xl"}) {
    INFO(name);
    CHECK_FALSE(run(preset(name, "eager", 256)).oom);
    // GPT2Attention's SDPA variant is not modelled: a clear error, not a wrong answer.
    CHECK_THROWS(build_program(preset(name, "flash", 256)));
  }
  for (const char* name : {"llama2-7b", "llama2-13b", "llama3-8b"}) {
    INFO(name);
    const Run eager = run(preset(name, "eager", 512));
    const Run flash = run(preset(name, "flash", 512));
    const Run efficient = run(preset(name, "mem-efficient", 512));
    CHECK_FALSE(eager.oom);
    // The fused kernels keep no (B,H,S,S) softmax for backward (eager keeps one per
    // layer, plus its dropout-free matmul operands): less is alive after the forward.
    const uint64_t scores = 1ull * (name == std::string("llama2-13b") ? 40 : 32) * 512 * 512 * 2;
    CHECK(flash.forward_end + scores < eager.forward_end);
    CHECK(efficient.forward_end + scores < eager.forward_end);
  }
}

TEST_CASE("shipped llama2-7b fine-tuning scenario fits an A100 80GB", "[hf]") {
  const Scenario s = load_scenario(MEMSIM_SOURCE_DIR + "/scenarios/llama2-7b-finetune-a100.yaml");
  CHECK(s.model.family == ModelFamily::hf_llama);
  const Run r = run(s);
  CHECK_FALSE(r.oom);
  // bf16 weights + grads + AdamW state alone are 4 x 2 B x 6.74e9 parameters.
  CHECK(r.peak_requested > 4ull * 2 * 6'738'415'616ull);
}
