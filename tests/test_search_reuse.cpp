// Searches that reuse work (sim/search/sweep.h, sweep_grid.h; scenario/parsed_scenario.h):
// a scenario parsed once and overridden per point gives what a fresh load with --set
// gives, value for value and error for error (a property test over random keys and
// values, through one ParsedScenario so that no point can leak into the next); grids that
// share one Program between allocator-only points, per-worker workspaces and chunked
// groups give the results of independent evaluations.
#include <catch2/catch.hpp>

#include <cstdint>
#include <fstream>
#include <functional>
#include <iterator>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "scenario/parsed_scenario.h"
#include "scenario/scenario.h"
#include "sim/search/sweep.h"
#include "sim/search/sweep_grid.h"
#include "tests/cli_test_support.h"

#include "allocator/snapshot/snapshot.h"
#include "graph/checkpoint.h"
#include "sim/megatron/megatron_pipeline.h"
#include "sim/search/optimize.h"
#include "sim/search/optimize_pipeline.h"
#include "sim/search/workers.h"
#include "sim/step/schedule.h"
#include "sim/step/training_script.h"
#include "test_paths.h"

using namespace memsim;

namespace {

const std::string kTiny =
    "name: tiny reuse test\n"
    "model:\n  family: cs336\n  layers: 2\n  d_model: 64\n  heads: 4\n  d_ff: 256\n"
    "  vocab: 512\n"
    "batch:\n  micro_batch: 2\n  seq_len: 32\n"
    "optimizer:\n  type: adamw\n  impl: foreach\n"
    "step:\n  warmup_steps: 1\n"
    "device:\n  capacity: 1GiB\n  cuda_context: 0\n";

// A Megatron pipeline scenario: its Program (the worst stage) depends on allocator.*.
const std::string kPipeline =
    "name: tiny pipeline reuse test\n"
    "model:\n  family: megatron\n  layers: 4\n  d_model: 16\n  heads: 2\n  d_ff: 64\n"
    "  vocab: 32\n  context_length: 16\n  attention: eager\n  dropout: 0\n"
    "batch:\n  micro_batch: 2\n  seq_len: 8\n  grad_accum: 4\n"
    "precision:\n  params: fp32\n  autocast: none\n"
    "optimizer:\n  type: adamw\n  impl: fused\n"
    "step:\n  warmup_steps: 1\n"
    "parallel:\n  pipeline: 2\n  pipeline_schedule: 1f1b\n"
    "device:\n  capacity: 1GiB\n  cuda_context: 0\n";

// Keys and values to draw from: valid values, values the loader refuses, unknown keys,
// allocator-only keys, and model.moe.* (the loader's in-place merge).
const std::vector<std::pair<std::string, std::vector<std::string>>> kPool = {
    {"batch.micro_batch", {"1", "2", "3", "8", "0", "-1", "abc", ""}},
    {"batch.seq_len", {"16", "32", "48", "0", "x"}},
    {"batch.grad_accum", {"1", "2", "3"}},
    {"model.layers", {"1", "2", "3", "0"}},
    {"model.d_model", {"64", "128", "63"}},
    {"model.heads", {"4", "2", "3", "8"}},
    {"model.attention", {"eager", "flash", "mem-efficient", "bogus"}},
    {"model.dropout", {"0.0", "0.1", "2"}},
    {"model.tied_embeddings", {"true", "false", "perhaps"}},
    {"precision.params", {"fp32", "bf16", "fp16", "int4"}},
    {"precision.autocast", {"none", "bf16", "fp16"}},
    {"optimizer.type", {"adamw", "adam", "sgd", "none", "adafactor", "xyz"}},
    {"optimizer.impl", {"foreach", "for-loop", "fused", "cs336"}},
    {"step.warmup_steps", {"0", "1", "2", "-3"}},
    {"step.kind", {"train", "forward", "forward-backward", "generate"}},
    {"checkpoint.policy", {"none", "full", "selective", "sqrt", "bogus"}},
    {"device.capacity", {"1GiB", "64MiB", "2MiB", "0", "junk"}},
    {"device.cuda_context", {"0", "1MiB", "-5"}},
    {"device.preset", {"h100-80gb", "a100-40gb", "nope"}},
    {"allocator.expandable_segments", {"true", "false", "maybe"}},
    {"allocator.max_split_size_mb", {"20", "0", "-1"}},
    {"allocator.conf", {"expandable_segments:True", "garbage_collection_threshold:0.5", "x:y"}},
    {"model.moe.top_k", {"2"}},
    {"lora.rank", {"8"}},
    {"name", {"renamed", ""}},
    {"batch.seqlen", {"5"}},
    {"bogus.key", {"1"}},
};

// What a scenario leads to: its error, or its name and its run (the Program's events and
// the allocator's peaks and verdict on the scenario's own device).
std::string outcome(const std::function<Scenario()>& load) {
  Scenario s;
  try {
    s = load();
  } catch (const std::exception& e) {
    return std::string("load error: ") + e.what();
  }
  std::string out = s.name + "|" + s.source + "|";
  try {
    const Program p = build_program(s);
    uint64_t h = 1469598103934665603ull;
    for (const MemoryEvent& e : p.events) {
      h = (h ^ (e.bytes + 31 * e.tensor + 1009 * static_cast<uint64_t>(e.type))) * 1099511628211ull;
      h = (h ^ static_cast<uint64_t>(e.kind)) * 1099511628211ull;
    }
    ExecuteBuffers buffers;
    const Analysis a = execute_and_analyze(p, s, {}, buffers);
    out += std::to_string(p.events.size()) + " events, hash " + std::to_string(h) + ", peaks " +
           std::to_string(a.peak_allocated) + "/" + std::to_string(a.peak_reserved) + "/" +
           std::to_string(a.peak_requested) + (a.fits() ? " fits" : " oom");
  } catch (const std::exception& e) {
    out += std::string("build error: ") + e.what();
  }
  return out;
}

std::string result_text(const SweepResult& r) {
  return r.ok ? std::to_string(r.analysis.peak_allocated) + "/" +
                    std::to_string(r.analysis.peak_reserved) + "/" +
                    std::to_string(r.analysis.peak_requested) + " " + sweep_verdict(r)
              : "error: " + r.error;
}

}  // namespace

TEST_CASE("parsed scenario: overrides equal a fresh load with --set (random keys and values)",
          "[search-reuse]") {
  const ParsedScenario parsed(kTiny, "tiny.yaml");
  std::mt19937 rng(20);
  size_t loaded = 0, refused = 0;
  for (int round = 0; round < 400; ++round) {
    std::vector<std::pair<std::string, std::string>> overrides;
    const int n = 1 + static_cast<int>(rng() % 4);
    for (int i = 0; i < n; ++i) {
      const auto& [key, values] = kPool[rng() % kPool.size()];
      overrides.emplace_back(key, values[rng() % values.size()]);
    }
    const std::string fresh = outcome([&] { return load_scenario_text(kTiny, "tiny.yaml", overrides); });
    const std::string reused = outcome([&] { return parsed.with(overrides); });
    INFO("round " << round);
    for (const auto& [k, v] : overrides) INFO("--set " << k << "=" << v);
    REQUIRE(reused == fresh);
    (fresh.rfind("load error", 0) == 0 ? refused : loaded) += 1;
  }
  // Both kinds were drawn: the property covers loads that succeed and errors that name keys.
  CHECK(loaded > 40);
  CHECK(refused > 40);
  // A bad override's error still names the key, as --set on a fresh load does.
  CHECK_THROWS_WITH(parsed.with({{"batch.seqlen", "5"}}),
                    Catch::Contains("--set") && Catch::Contains("batch.seqlen") &&
                        Catch::Contains("batch.seq_len"));
  // The kept document is untouched by the model.moe.* merge (which works in place).
  CHECK(outcome([&] { return parsed.with({}); }) ==
        outcome([&] { return load_scenario_text(kTiny, "tiny.yaml"); }));
}

TEST_CASE("sweep grid: shared Programs and workspaces equal independent evaluations",
          "[search-reuse]") {
  for (const std::string* text : {&kTiny, &kPipeline}) {
    const SweepRunner runner(*text, "grid.yaml", {{"step.warmup_steps", "1"}});
    // (Expandable segments only on the one-GPU scenario: a pipeline scenario picks its
    // stage on an unlimited device, where they cost gigabytes of host memory.)
    std::vector<SweepAxis> axes = {
        {"batch.micro_batch", {"1", "2", "bad"}},
        {"device.capacity", {"1GiB", "3MiB", "24MiB", "oops"}},
        {"allocator.max_split_size_mb", {"64", "4", "128"}},
    };
    if (text == &kTiny) axes.push_back({"allocator.expandable_segments", {"false", "true"}});
    const std::vector<SweepOverrides> points = sweep_points(axes);
    std::vector<std::string> independent;
    for (const SweepOverrides& p : points) independent.push_back(result_text(runner.evaluate(p)));
    // 1 thread: one chunk per group; 2 and 5 threads: groups split into chunks, and the
    // workers' workspaces reused across groups; 64: more workers than groups.
    for (unsigned threads : {1u, 2u, 5u, 64u}) {
      size_t calls = 0, last = 0;
      const std::vector<SweepResult> grid =
          evaluate_grid(runner, points, threads, [&](size_t done, size_t total) {
            ++calls;
            CHECK(done == last + 1);
            CHECK(total == points.size());
            last = done;
          });
      REQUIRE(grid.size() == points.size());
      CHECK(calls == points.size());
      for (size_t i = 0; i < points.size(); ++i) {
        INFO(*text << "threads " << threads << ", point " << i);
        CHECK(result_text(grid[i]) == independent[i]);
      }
    }
    // The grid has fitting points, OOM points and error points.
    bool fit = false, oom = false, error = false;
    for (const std::string& r : independent) {
      fit = fit || r.find(" fits") != std::string::npos;
      oom = oom || r.find(" OOM at") != std::string::npos;
      error = error || r.rfind("error:", 0) == 0;
    }
    CHECK(fit);
    CHECK(oom);
    CHECK(error);
  }
}

TEST_CASE("sweep grid: the keys that only the allocator and device read", "[search-reuse]") {
  CHECK(allocator_only_key("device.capacity"));
  CHECK(allocator_only_key("allocator.expandable_segments"));
  CHECK_FALSE(allocator_only_key("device.preset"));  // kernels' workspace sizes come with it
  CHECK_FALSE(allocator_only_key("batch.micro_batch"));
}

TEST_CASE("sweep --max: a reused workspace finds what fresh evaluations find", "[search-reuse]") {
  const SweepRunner runner(kTiny, "max.yaml");
  SweepWorkspace workspace;
  int found = 0;
  for (const char* capacity : {"16MiB", "64MiB", "256MiB"}) {
    const SweepOverrides fixed = {{"device.capacity", capacity}};
    const MaxSearch fresh = find_max(runner, fixed, "batch.micro_batch");
    const MaxSearch reused = find_max(runner, fixed, "batch.micro_batch", workspace);
    INFO(capacity);
    CHECK(reused.largest_fit == fresh.largest_fit);
    CHECK(reused.first_failure == fresh.first_failure);
    CHECK(reused.failure == fresh.failure);
    CHECK(reused.evaluations == fresh.evaluations);
    found += fresh.largest_fit.has_value();
  }
  CHECK(found >= 2);  // searches that find a largest fit, and (16MiB) one that finds none
}

TEST_CASE("sweep axes: A..B..STEP ranges", "[search-reuse]") {
  const SweepAxis a = parse_sweep_axis("batch.seq_len=64..6400..64");
  REQUIRE(a.values.size() == 100);
  CHECK(a.values.front() == "64");
  CHECK(a.values[1] == "128");
  CHECK(a.values.back() == "6400");
  CHECK(parse_sweep_axis("k=1..10..4").values == std::vector<std::string>{"1", "5", "9"});
  CHECK(parse_sweep_axis("k=3..3..7").values == std::vector<std::string>{"3"});
  CHECK_THROWS_AS(parse_sweep_axis("k=1..10..0"), std::invalid_argument);
  CHECK_THROWS_AS(parse_sweep_axis("k=1..10..-2"), std::invalid_argument);
  CHECK_THROWS_AS(parse_sweep_axis("k=1..10..x"), std::invalid_argument);
  CHECK_THROWS_AS(parse_sweep_axis("k=1..10.."), std::invalid_argument);
}

namespace {
// Restores the process default of worker threads.
struct DefaultThreads {
  explicit DefaultThreads(unsigned t) { set_default_threads(t); }
  ~DefaultThreads() { set_default_threads(0); }
};

Scenario pipeline_scenario(const std::string& stages, const std::string& schedule) {
  return load_scenario_text(kPipeline, "pipeline.yaml",
                            {{"parallel.pipeline", stages},
                             {"parallel.pipeline_schedule", schedule},
                             {"model.layers", "8"},
                             {"batch.grad_accum", "8"}});
}
}  // namespace

TEST_CASE("pipeline stages in parallel: the sequential choice, Program and peaks",
          "[search-reuse]") {
  for (const auto& [stages, schedule] :
       std::vector<std::pair<std::string, std::string>>{{"2", "1f1b"}, {"4", "1f1b"}, {"8", "gpipe"}}) {
    const Scenario s = pipeline_scenario(stages, schedule);
    Program one, many;
    PipelineStagePeaks peaks_one, peaks_many;
    {
      DefaultThreads t(1);
      peaks_one = build_megatron_pipeline_program(s, {}, one);
    }
    {
      DefaultThreads t(3);
      peaks_many = build_megatron_pipeline_program(s, {}, many);
    }
    INFO(stages << " stages, " << schedule);
    CHECK(peaks_many.peak_reserved == peaks_one.peak_reserved);
    CHECK(peaks_many.worst == peaks_one.worst);
    CHECK(many.rank.why == one.rank.why);
    CHECK(many.rank.pipeline_stage == one.rank.pipeline_stage);
    REQUIRE(many.events.size() == one.events.size());
    bool same = true;
    for (size_t i = 0; i < one.events.size(); ++i)
      same = same && one.events[i].bytes == many.events[i].bytes &&
             one.events[i].type == many.events[i].type && one.events[i].tensor == many.events[i].tensor;
    CHECK(same);
    CHECK(peaks_one.peak_reserved.size() == static_cast<size_t>(s.parallel.pipeline));
  }
}

TEST_CASE("optimize's pipeline calibration in parallel: the sequential costs", "[search-reuse]") {
  const Scenario s = pipeline_scenario("4", "1f1b");
  const std::vector<graph::LayerCheckpoint> choices = {graph::LayerCheckpoint::keep,
                                                       graph::LayerCheckpoint::layer};
  PipelineCosts one, many;
  {
    DefaultThreads t(1);
    one = calibrate_pipeline(s, choices);
  }
  {
    DefaultThreads t(3);
    many = calibrate_pipeline(s, choices);
  }
  CHECK(many.layers == one.layers);
  CHECK(many.depth == one.depth);
  CHECK(many.stored == one.stored);
  CHECK(many.window == one.window);
  CHECK(many.gap == one.gap);
  CHECK(many.flops == one.flops);
}

TEST_CASE("workers: count, order of results, nested work and the first error in order",
          "[search-reuse]") {
  CHECK(worker_count(4, 2) == 2);
  CHECK(worker_count(3, 0) == 1);
  {
    DefaultThreads t(5);
    CHECK(worker_count(0, 100) == 5);
  }
  std::vector<unsigned> nested(50, 0);
  std::vector<size_t> out(50, 0);
  run_parallel_workers(
      50,
      [&](size_t i, unsigned w) {
        CHECK(w < 4);
        out[i] = i * i;
        nested[i] = worker_count(0, 64);  // from inside a task: this thread alone
      },
      4);
  for (size_t i = 0; i < out.size(); ++i) CHECK(out[i] == i * i);
  for (unsigned n : nested) CHECK(n == 1);
  CHECK(worker_count(2, 64) == 2);  // back outside: the flag is cleared
}

TEST_CASE("snapshot files: one read of the file gives what reading its bytes gives",
          "[search-reuse]") {
  for (const char* name : {"silmont2000_mem_snapshot.pickle", "magma27_memory_snapshot.pickle"}) {
    const std::string path = std::string(MEMSIM_SOURCE_DIR) + "/tests/data/" + name;
    std::ifstream in(path, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    REQUIRE(bytes.size() > 1000);
    const Snapshot a = read_snapshot_file(path);
    const Snapshot b = read_snapshot_bytes(bytes, path);
    INFO(name);
    CHECK(write_snapshot_bytes(a) == write_snapshot_bytes(b));
    CHECK(a.segments.size() == b.segments.size());
    CHECK(a.alloc_conf_string == b.alloc_conf_string);
  }
  CHECK_THROWS_AS(read_snapshot_file(std::string(MEMSIM_SOURCE_DIR) + "/tests/data/no-such.pickle"),
                  SnapshotError);
}

TEST_CASE("optimize's one-GPU calibration in parallel: the sequential costs", "[search-reuse]") {
  const Scenario s = load_scenario_text(kTiny, "tiny.yaml", {{"model.layers", "4"}});
  const TrainingScript script = default_script(s);
  const std::vector<graph::LayerCheckpoint> choices = OptimizeOptions{}.choices;  // all six
  LayerCosts one, many;
  {
    DefaultThreads t(1);
    one = calibrate(s, script, choices);
  }
  {
    DefaultThreads t(3);
    many = calibrate(s, script, choices);
  }
  CHECK(many.stored == one.stored);
  CHECK(many.window == one.window);
  CHECK(many.gap == one.gap);
  CHECK(many.flops == one.flops);
  CHECK(one.stored.size() == choices.size());
}

TEST_CASE("sweep --max with speculation on several workers: the one-thread search",
          "[search-reuse]") {
  const SweepRunner runner(kTiny, "max.yaml");
  std::vector<SweepWorkspace> spaces(5);
  for (const char* capacity : {"4MiB", "16MiB", "48MiB", "256MiB"}) {
    for (const auto& [start, limit] : std::vector<std::pair<int64_t, int64_t>>{{1, int64_t{1} << 40}, {3, 40}, {1, 5}}) {
      const SweepOverrides fixed = {{"device.capacity", capacity}};
      const MaxSearch one = find_max(runner, fixed, "batch.micro_batch", start, limit);
      for (size_t workers : {2, 3, 5}) {
        const MaxSearch many = find_max(runner, fixed, "batch.micro_batch", spaces.data(),
                                        workers, start, limit);
        INFO(capacity << ", start " << start << ", limit " << limit << ", " << workers << " workers");
        CHECK(many.largest_fit == one.largest_fit);
        CHECK(many.first_failure == one.first_failure);
        CHECK(many.failure == one.failure);
        CHECK(many.evaluations == one.evaluations);
      }
    }
  }
}

TEST_CASE("memsim -j: a pipeline run's and a sweep's output do not depend on the threads",
          "[search-reuse]") {
  const std::string scenario =
      " '" + std::string(MEMSIM_SOURCE_DIR) + "/scenarios/gpt3-175b-tp8-pp8-64xh100.yaml'";
  const auto run = [&](const std::string& args) {
    return memsim_test::run_shell(memsim_test::memsim_command() + args + " 2>/dev/null");
  };
  const auto one = run(" run" + scenario + " --set step.warmup_steps=0 --json - -j 1");
  const auto three = run(" -j 3 run" + scenario + " --set step.warmup_steps=0 --json -");
  CHECK(one.status == 0);
  CHECK(one.out.find("\"pipeline_stage\"") != std::string::npos);
  CHECK(three.out == one.out);
  const std::string grid = " sweep" + scenario +
                           " --set step.warmup_steps=0 --vary device.capacity=40GiB,50GiB,80GiB"
                           " --vary allocator.max_split_size_mb=32,512 --csv -";
  const auto grid1 = run(grid + " -j 1");
  const auto grid4 = run(grid + " -j 4");
  CHECK(grid1.status == 0);
  CHECK(grid1.out.find("OOM at") != std::string::npos);
  CHECK(grid4.out == grid1.out);
  CHECK(run(" run" + scenario + " -j -1").status == 2);  // bad usage
}
