// The command line's fit and finish (issue #19 item 3), through the built binary:
// --version, a scenario on standard input, the default CUDA context of a device without a
// preset, a preset's context length, did-you-mean by prefix, --set errors that name the
// override, exit status 3 when nothing fits (compare, sweep, sweep --max, optimize),
// warm-up and measured-step labels, progress on stderr, per-verb --help and bash completion.
#include <catch2/catch.hpp>

#include "tests/cli_test_support.h"

#include <chrono>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>
#include "test_paths.h"

namespace fs = std::filesystem;
using nlohmann::json;
using memsim_test::CliResult;

namespace {

struct Dir : memsim_test::TempDir {
  Dir() : memsim_test::TempDir("memsim_cli_finish") {}
};

CliResult memsim(const std::string& args, const Dir& dir) { return memsim_test::run_memsim(args, dir); }

std::string q(const fs::path& p) { return "'" + p.string() + "'"; }

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Two layers of d_model 64: simulates in milliseconds.
const std::string kTiny =
    "name: tiny finish test\n"
    "model:\n  family: cs336\n  layers: 2\n  d_model: 64\n  heads: 4\n  d_ff: 256\n  vocab: 128\n"
    "batch:\n  micro_batch: 2\n  seq_len: 16\n"
    "step:\n  warmup_steps: 1\n"
    "device:\n  capacity: 1GiB\n  cuda_context: 0\n";

}  // namespace

TEST_CASE("memsim --version prints the version and exits 0", "[cli_finish]") {
  Dir dir;
  const CliResult r = memsim("--version", dir);
  CHECK(r.status == 0);
  CHECK(r.out.rfind("memsim 0.", 0) == 0);
  CHECK(r.err.empty());
}

TEST_CASE("SCENARIO '-' reads the scenario from standard input", "[cli_finish]") {
  Dir dir;
  const fs::path file = dir.write("tiny.yaml", kTiny);
  const CliResult from_file = memsim("run " + q(file) + " --json -", dir);
  const CliResult from_stdin = memsim("run - --json - < " + q(file), dir);
  REQUIRE(from_file.status == 0);
  REQUIRE(from_stdin.status == 0);
  json a = json::parse(from_file.out), b = json::parse(from_stdin.out);
  CHECK(b["scenario_file"] == "<stdin>");
  a.erase("scenario_file");
  b.erase("scenario_file");
  CHECK(a == b);

  // Errors name <stdin> and the line.
  const fs::path bad = dir.write("bad.yaml", kTiny + "parallel:\n  data: 0\n");
  const CliResult err = memsim("run - < " + q(bad), dir);
  CHECK(err.status == 1);
  CHECK(has(err.err, "<stdin>:18: parallel.data"));

  // compare, sweep, optimize and check take '-' too.
  CHECK(memsim("compare - --policies none,full < " + q(file), dir).status == 0);
  CHECK(memsim("sweep - --vary batch.micro_batch=1,2 < " + q(file), dir).status == 0);
  CHECK(memsim("sweep - --max batch.micro_batch --set device.capacity=64MiB < " + q(file), dir).status == 0);
  CHECK(memsim("optimize - --budget 1GiB < " + q(file), dir).status == 0);
}

TEST_CASE("a capacity without a preset takes the measured H100 CUDA context and says so", "[cli_finish]") {
  Dir dir;
  const std::string hand = "model: {preset: gpt2-small}\nbatch: {micro_batch: 1, seq_len: 64}\n";
  const fs::path file = dir.write("hand.yaml", hand + "device: {capacity: 8GiB}\n");
  const CliResult text = memsim("run " + q(file), dir);
  REQUIRE(text.status == 0);
  CHECK(has(text.out, "750.81 MiB CUDA context (the default without device.preset"));
  const CliResult j = memsim("run " + q(file) + " --json -", dir);
  REQUIRE(j.status == 0);
  const json doc = json::parse(j.out);
  CHECK(doc["device"]["cuda_context_bytes"] == 787283968u);
  CHECK(doc["device"]["usable_bytes"] == (8ull << 30) - 787283968u);

  // An explicit context is the user's: no note.
  const fs::path explicit_context = dir.write("ctx.yaml", hand + "device: {capacity: 8GiB, cuda_context: 0}\n");
  const CliResult zero = memsim("run " + q(explicit_context), dir);
  REQUIRE(zero.status == 0);
  CHECK(!has(zero.out, "the default without device.preset"));
  // A preset keeps its own context.
  const CliResult preset = memsim("run " + q(file) + " --set device.preset=a100-80gb", dir);
  CHECK(!has(preset.out, "the default without device.preset"));

  // A capacity the default context would fill: refused by key, saying why.
  const fs::path small = dir.write("small.yaml", hand + "device: {capacity: 512MiB}\n");
  const CliResult refused = memsim("run " + q(small), dir);
  CHECK(refused.status == 1);
  CHECK(has(refused.err, "small.yaml:3: device.capacity: 512"));
  CHECK(has(refused.err, "is not more than the 750.81 MiB CUDA context memsim assumes for a device without device.preset"));
}

TEST_CASE("a preset's context length is enforced unless model.context_length extends it", "[cli_finish]") {
  Dir dir;
  const fs::path file = dir.write("gpt2.yaml",
                                  "model: {preset: gpt2-small}\nbatch: {micro_batch: 1, seq_len: 2048}\n"
                                  "step: {kind: forward}\n");
  const CliResult refused = memsim("run " + q(file), dir);
  CHECK(refused.status == 1);
  CHECK(has(refused.err, "gpt2.yaml:2: batch.seq_len: 2048 is longer than the model's context length 1024"));
  CHECK(has(refused.err, "model.preset 'gpt2-small'"));
  CHECK(has(refused.err, "model.context_length: 2048"));
  // Through --set the error names the override.
  const fs::path short_file = dir.write("gpt2s.yaml",
                                        "model: {preset: gpt2-small}\nbatch: {micro_batch: 1, seq_len: 512}\n"
                                        "step: {kind: forward}\n");
  CHECK(memsim("run " + q(short_file), dir).status == 0);
  const CliResult by_set = memsim("run " + q(short_file) + " --set batch.seq_len=4096", dir);
  CHECK(by_set.status == 1);
  CHECK(has(by_set.err, "--set batch.seq_len: 4096 is longer than the model's context length 1024"));

  // Extended on purpose: a larger position table, so more parameters.
  const CliResult extended = memsim("run " + q(file) + " --set model.context_length=2048 --json -", dir);
  REQUIRE(extended.status == 0);
  const CliResult base = memsim("run " + q(short_file) + " --json -", dir);
  REQUIRE(base.status == 0);
  CHECK(json::parse(extended.out)["model"]["parameter_count"].get<int64_t>() -
            json::parse(base.out)["model"]["parameter_count"].get<int64_t>() ==
        1024 * 768);
}

TEST_CASE("did-you-mean lists names that start with the word first", "[cli_finish]") {
  Dir dir;
  const fs::path file = dir.write("tiny.yaml", kTiny);
  const CliResult h100 = memsim("run " + q(file) + " --set device.preset=h100", dir);
  CHECK(h100.status == 1);
  CHECK(has(h100.err, "did you mean 'h100-80gb'?"));
  CHECK(!has(h100.err, "h200"));
  const CliResult a100 = memsim("run " + q(file) + " --set device.preset=A100", dir);
  CHECK(has(a100.err, "did you mean 'a100-40gb' or 'a100-80gb'?"));
  // A typo that is no prefix still gets the nearest spelling.
  const CliResult typo = memsim("run " + q(file) + " --set batch.micro_bach=2", dir);
  CHECK(has(typo.err, "did you mean 'batch.micro_batch'?"));
}

TEST_CASE("errors from --set name the override, not line 1 of the file", "[cli_finish]") {
  Dir dir;
  const fs::path file = dir.write("tiny.yaml", kTiny);
  // lora.targets is missing from a lora section that only --set brings.
  const CliResult r = memsim("run " + q(file) + " --set lora.rank=8", dir);
  CHECK(r.status == 1);
  CHECK(has(r.err, "--set lora.rank=8: lora.targets: required"));
  CHECK(!has(r.err, "tiny.yaml:1:"));
  const CliResult bad_value = memsim("run " + q(file) + " --set batch.micro_batch=0", dir);
  CHECK(has(bad_value.err, "memsim: error: --set batch.micro_batch: expected a positive integer"));
}

TEST_CASE("exit status 3 when nothing fits: run, compare, sweep, sweep --max, optimize", "[cli_finish]") {
  Dir dir;
  const fs::path file = dir.write("tiny.yaml", kTiny);
  const std::string tight = " --set device.capacity=1MiB";
  CHECK(memsim("run " + q(file) + tight, dir).status == 3);
  CHECK(memsim("compare " + q(file) + " --policies none,full" + tight, dir).status == 3);
  CHECK(memsim("compare " + q(file) + " --policies none,full", dir).status == 0);
  CHECK(memsim("sweep " + q(file) + " --vary batch.micro_batch=1,2" + tight, dir).status == 3);
  CHECK(memsim("sweep " + q(file) + " --vary batch.micro_batch=1,2", dir).status == 0);
  // Some points fit: 0.
  CHECK(memsim("sweep " + q(file) + " --vary device.capacity=1MiB,1GiB", dir).status == 0);
  CHECK(memsim("sweep " + q(file) + " --max batch.micro_batch" + tight, dir).status == 3);
  CHECK(memsim("sweep " + q(file) + " --max batch.micro_batch --set device.capacity=64MiB", dir).status == 0);
  CHECK(memsim("optimize " + q(file) + " --budget 1MiB", dir).status == 3);
  CHECK(memsim("optimize " + q(file) + " --budget 1GiB", dir).status == 0);
}

TEST_CASE("warm-up and measured-step events are labelled apart", "[cli_finish]") {
  Dir dir;
  const fs::path file = dir.write("tiny.yaml", kTiny);
  const CliResult fits = memsim("run " + q(file), dir);
  REQUIRE(fits.status == 0);
  CHECK(has(fits.out, "measured step)"));
  CHECK(has(fits.out, "setup and 1 warm-up step: events 0-"));
  CHECK(has(fits.out, "Marks (measured step)"));
  // Out of memory in the warm-up step (the optimizer state is first made there).
  const json j = json::parse(memsim("run " + q(file) + " --json -", dir).out);
  const uint64_t peak = j["peak_reserved_bytes"];
  const CliResult oom = memsim("run " + q(file) + " --set device.capacity=" + std::to_string(peak / 2), dir);
  REQUIRE(oom.status == 3);
  CHECK(has(oom.out, "warm-up)"));
  // Without warm-up steps only the setup (the model built) comes before the measured step.
  const CliResult single = memsim("run " + q(file) + " --set step.warmup_steps=0", dir);
  CHECK(has(single.out, "  setup: events 0-"));
  CHECK(!has(single.out, "warm-up"));
  // Out of memory while the weights are built: setup.
  const CliResult setup_oom = memsim("run " + q(file) + " --set device.capacity=4KiB", dir);
  CHECK(setup_oom.status == 3);
  CHECK(has(setup_oom.out, "at event 0: empty (setup) requesting"));
}

TEST_CASE("progress: nothing for a quick sweep, lines off a terminal for a long one", "[cli_finish]") {
  Dir dir;
  const fs::path file = dir.write("tiny.yaml", kTiny);
  const CliResult quick = memsim("sweep " + q(file) + " --vary batch.micro_batch=1,2 --csv /dev/null", dir);
  CHECK(quick.status == 0);
  CHECK(quick.err.empty());
  // 6000 gpt2-small points on one thread: several seconds here (about 0.6 ms a point), so
  // longer than the second after which progress shows.
  const fs::path gpt2 = dir.write("gpt2.yaml", "model: {preset: gpt2-small}\nbatch: {micro_batch: 1, seq_len: 256}\n");
  const auto t0 = std::chrono::steady_clock::now();
  const CliResult slow = memsim("sweep " + q(gpt2) + " --vary batch.micro_batch=1..600 --vary "
                                "batch.seq_len=64,128,192,256,320,384,448,512,576,640 -j 1 --csv /dev/null", dir);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(slow.status == 0);
  if (seconds > 1.5) {
    CHECK(has(slow.err, "memsim: sweep: 100% (6000/6000 points"));
    CHECK(!has(slow.err, "\r"));
  } else {
    WARN("the sweep took " << seconds << " s: too fast to show progress on this machine");
  }
}

TEST_CASE("every verb's --help is current and exits 0", "[cli_finish]") {
  Dir dir;
  for (const char* verb : {"run", "compare", "optimize", "sweep", "replay", "check"}) {
    INFO(verb);
    const CliResult r = memsim(std::string(verb) + " --help", dir);
    CHECK(r.status == 0);
    CHECK(has(r.out, "Exit status:"));
    if (std::string(verb) != "replay") CHECK(has(r.out, "standard input"));
  }
  const CliResult top = memsim("--help", dir);
  CHECK(top.status == 0);
  CHECK(has(top.out, "--version"));
  CHECK(has(top.out, "completion"));
}

TEST_CASE("bash completion from `memsim completion bash` and tools/completion/memsim.bash", "[cli_finish]") {
  Dir dir;
  const CliResult script = memsim("completion bash", dir);
  REQUIRE(script.status == 0);
  const fs::path generated = dir.write("memsim.bash", script.out);
  // Completes COMP_LINE (cursor at its end) and prints the candidates, one per line.
  const fs::path driver = dir.write("complete.sh",
                                    "source \"$1\"\n"
                                    "COMP_LINE=\"$2\"; COMP_POINT=${#COMP_LINE}; COMP_WORDBREAKS='=:;|&('\n"
                                    "_memsim\n"
                                    "printf '%s\\n' \"${COMPREPLY[@]}\"\n");
  auto complete = [&](const fs::path& source, const std::string& line) {
    return memsim_test::run_shell("MEMSIM='" + std::string(MEMSIM_BINARY_DIR) + "/memsim' bash --norc " +
                                  q(driver) + " " + q(source) + " '" + line + "'")
        .out;
  };
  CHECK(complete(generated, "memsim ru") == "run\n");
  CHECK(has(complete(generated, "memsim run x.yaml --se"), "--set\n"));
  CHECK(has(complete(generated, "memsim sweep x.yaml --"), "--vary\n"));
  CHECK(complete(generated, "memsim run x.yaml --set batch.micro_b") == "batch.micro_batch=\n");
  // After '=' (a word break) bash replaces only what follows it.
  CHECK(complete(generated, "memsim run x.yaml --set device.preset=h1") == "h100-80gb\n");
  CHECK(complete(generated, "memsim compare x.yaml --policies none,fu") == "none,full\n");
  // The shipped loader evals the binary's own script.
  const fs::path shipped = fs::path(MEMSIM_SOURCE_DIR) / "tools/completion/memsim.bash";
  CHECK(complete(shipped, "memsim opt") == "optimize\n");
}
