// memsim command line entry point: parses the command line (CLI11), sets up logging and
// maps errors to the exit statuses of shared/docs/design.md:
//   0 done and fits, 3 done and out of memory, 1 bad input, 2 bad usage,
//   4 `memsim check` found a numeric failure. 3 also when compare, sweep or optimize find
//   nothing that fits.
// The subcommands and report writers live in tools/cli/.
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <new>
#include <string>

#include <CLI/CLI.hpp>

#include "allocator/allocator_config.h"
#include "allocator/snapshot/snapshot.h"
#include "scenario/scenario.h"
#include "sim/search/workers.h"
#include "tools/cli/commands.h"
#include "tools/cli/errors.h"
#include "tools/cli/host_malloc.h"
#include "tools/cli/logging.h"
#include "tools/cli/terminal_text.h"
#include "tools/cli/version.h"

namespace {

int fail(const char* what) {
  std::fflush(stdout);
  // Messages quote input (a scenario value, a file name): no raw control characters.
  std::fprintf(stderr, "memsim: error: %s\n", memsim::cli::printable(what, true).c_str());
  return memsim::cli::kExitBadInput;
}

// A report that did not reach stdout (a full disk, `> /dev/full`) is a failure, not a
// success with nothing written: status 1 and a message on stderr.
int finish_stdout(int status) {
  errno = 0;
  const bool flush_failed = std::fflush(stdout) != 0;
  const int saved = errno;
  if (!flush_failed && std::ferror(stdout) == 0) return status;
  std::fprintf(stderr, "memsim: error: cannot write to stdout%s%s\n", saved != 0 ? ": " : "",
               saved != 0 ? std::strerror(saved) : "");
  return status == memsim::cli::kExitFits || status == memsim::cli::kExitOom
             ? memsim::cli::kExitBadInput
             : status;
}

// Host malloc settings before the heap's first block (tools/cli/host_malloc.h): the
// executable's .preinit_array runs after the C library is set up and before any static
// constructor (the C++ runtime's, CLI11's, spdlog's), which allocate.
void tune_host_malloc_first(int, char**, char**) { memsim::cli::tune_host_malloc(); }
__attribute__((section(".preinit_array"), used)) void (*tune_host_malloc_entry)(int, char**, char**) =
    tune_host_malloc_first;

}  // namespace

int main(int argc, char** argv) {
  using namespace memsim::cli;
  CLI::App app{"memsim: predicts the GPU memory of transformer training without a GPU"};
  app.require_subcommand(1);
  app.footer("SCENARIO may be - to read the scenario from standard input. Exit status: 0 done and it "
             "fits, 3 done and nothing fits (out of memory; compare, sweep, optimize: no policy, "
             "point or plan fits), 1 bad input, 2 bad usage, 4 memsim check failed. "
             "`memsim VERB --help` describes each verb.");
  // Options of the main app (-v) are accepted after the subcommand too.
  app.fallthrough();
  int verbosity = 0;
  app.add_flag("-v,--verbose", verbosity, "More log output on stderr (-v info, -vv debug)");
  // Worker threads for independent work (pipeline stages, sweep points, optimize's
  // candidate Programs; sim/search/workers.h). Results do not depend on it.
  int threads = 0;
  app.add_option("-j,--threads", threads, "Worker threads (default 0: all cores)")
      ->check(CLI::Range(0, 1024));
  app.set_version_flag("--version", std::string(version_text()), "Print the version and git commit, then exit");

  // `memsim run ...` (the verb first): only run's subcommand is set up. The others' options
  // were 0.5 M instructions of a cold run's start (issue #20; docs/engine.md "Fewer page
  // faults, no teardown of the parser"), and none of them can match once the first word
  // is "run" (require_subcommand(1): one verb; later words are run's). Any other first
  // word (an option, another verb, a typo, --help) sets all of them up, as before.
  const bool run_only = argc > 1 && std::strcmp(argv[1], "run") == 0;
  RunArgs run_args;
  CLI::App* run = add_run_command(app, run_args);
  ReplayArgs replay_args;
  CLI::App* replay = run_only ? nullptr : add_replay_command(app, replay_args);
  CLI::App* presets = run_only ? nullptr : add_presets_command(app);
  CompareArgs compare_args;
  CLI::App* compare = run_only ? nullptr : add_compare_command(app, compare_args);
  OptimizeArgs optimize_args;
  CLI::App* optimize = run_only ? nullptr : add_optimize_command(app, optimize_args);
  SweepArgs sweep_args;
  CLI::App* sweep = run_only ? nullptr : add_sweep_command(app, sweep_args);
  CheckArgs check_args;
  CLI::App* check = run_only ? nullptr : add_check_command(app, check_args);
  CompletionArgs completion_args;
  CLI::App* completion = run_only ? nullptr : add_completion_command(app, completion_args);
  ServeArgs serve_args;
  // issue #17 (tools/cli/serve_command.cpp)
  CLI::App* serve = run_only ? nullptr : add_serve_command(app, serve_args);
  auto parsed = [](const CLI::App* verb) { return verb != nullptr && verb->parsed(); };

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // Prints the message (stderr) or the help text (stdout); help is success, anything
    // else is bad usage.
    return app.exit(e) == 0 ? 0 : kExitUsage;
  }

  setup_logging(verbosity);
  memsim::set_default_threads(static_cast<unsigned>(threads));
  const int status = finish_stdout([&]() -> int {
    try {
      if (parsed(run)) return run_run(run_args);
      if (parsed(replay)) return run_replay(replay_args);
      if (parsed(presets)) return run_presets();
      if (parsed(compare)) return run_compare(compare_args);
      if (parsed(optimize)) return run_optimize(optimize_args);
      if (parsed(sweep)) return run_sweep(sweep_args);
      if (parsed(check)) return run_check(check_args);
      if (parsed(completion)) return run_completion(app, completion_args);
      if (parsed(serve)) return run_serve(serve_args);
      return kExitUsage;  // unreachable: require_subcommand(1)
    } catch (const UsageError& e) {
      std::fflush(stdout);
      std::fprintf(stderr, "memsim: error: %s\nRun with --help for more information.\n",
                   printable(e.what(), true).c_str());
      return kExitUsage;
    } catch (const memsim::ScenarioError& e) {
      return fail(e.what());
    } catch (const memsim::SnapshotError& e) {
      return fail(e.what());
    } catch (const memsim::ConfigError& e) {
      return fail(e.what());
    } catch (const InputError& e) {
      return fail(e.what());
    } catch (const std::bad_alloc&) {
      return fail("out of host memory");
    } catch (const std::exception& e) {
      // Any other failure (e.g. a model family the scheduler does not build yet): still a
      // clean message and status 1, never a crash.
      return fail(e.what());
    }
  }());
  // Every report is written and checked by now (finish_stdout; a file report's Output
  // closes and checks its file in the verb's scope, tools/cli/output.h; stderr is
  // unbuffered): end the process without the destructors of the command-line parser and
  // of static objects, which only free memory the kernel takes back anyway (0.15 M
  // instructions of a cold cs336-xl run, issue #20; docs/engine.md "Fewer page faults").
  // Worker threads are joined by the verbs themselves.
  std::fflush(stderr);
  std::_Exit(status);
}
