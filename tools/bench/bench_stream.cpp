// Streaming execution's figures (issue #20 item 1; docs/engine.md): whole-process `memsim
// run` timings and peak memory, each a child process measured with wait4's rusage.
//  1. a cold `run` of scenarios/cs336-xl-train-ctx512.yaml (60,613 events; it fits, so the
//     whole Program is built and executed): wall and CPU milliseconds, min over repetitions;
//  2. max RSS against the number of events (cs336-xl with 8..512 layers, unlimited
//     device; then 32 layers with 0..40 warm-up steps: more events, the same live state),
//     streamed (a plain `run`) and stored (`--timeline /dev/null` keeps the per-event
//     arrays);
//  3. the 2048-layer GPT-3 job on 64 pipeline stages (t8 x p64, 1F1B, 16 micro-batches):
//     64 stage Programs are built and executed to pick the worst stage;
//  4. flat memory (issue #20): max RSS of a plain run with 1..64 micro-batches per step and
//     1..64 warm-up steps (same live state, more events);
//  5. a run that runs out of memory early (the build stops there, tools/cli/plain_run.h).
// With a second binary (e.g. the build before the change) every row is measured for both,
// in the same process, alternating, so that they share the machine's load.
// Usage: bench_stream MEMSIM [BASELINE_MEMSIM] [repetitions=10]   (run from the source root)
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

struct Sample {
  double wall_ms = 0;
  double cpu_ms = 0;
  long max_rss_kb = 0;
  int status = 0;
  std::string out;  // the child's stdout
};

Sample run_child(const std::vector<std::string>& argv) {
  int fds[2];
  if (pipe(fds) != 0) std::abort();
  const auto t0 = std::chrono::steady_clock::now();
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], 1);
    close(fds[0]);
    close(fds[1]);
    std::freopen("/dev/null", "w", stderr);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  close(fds[1]);
  Sample s;
  char buf[65536];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof buf)) > 0) s.out.append(buf, static_cast<size_t>(n));
  close(fds[0]);
  struct rusage ru {};
  wait4(pid, &s.status, 0, &ru);
  s.wall_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  s.cpu_ms = (static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e3 +
              static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e3);
  s.max_rss_kb = ru.ru_maxrss;
  return s;
}

// Min wall, min CPU and max RSS over `reps` runs.
Sample best_of(const std::vector<std::string>& argv, int reps) {
  Sample best;
  best.wall_ms = best.cpu_ms = 1e30;
  for (int r = 0; r < reps; ++r) {
    Sample s = run_child(argv);
    best.wall_ms = std::min(best.wall_ms, s.wall_ms);
    best.cpu_ms = std::min(best.cpu_ms, s.cpu_ms);
    best.max_rss_kb = std::max(best.max_rss_kb, s.max_rss_kb);
    best.status = s.status;
    best.out = std::move(s.out);
  }
  return best;
}

long json_number(const std::string& json, const std::string& key) {
  const size_t at = json.find("\"" + key + "\":");
  return at == std::string::npos ? -1 : std::atol(json.c_str() + at + key.size() + 3);
}

std::vector<std::string> with(std::vector<std::string> v, const std::vector<std::string>& more) {
  v.insert(v.end(), more.begin(), more.end());
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: bench_stream MEMSIM [BASELINE_MEMSIM] [repetitions]\n");
    return 2;
  }
  std::vector<std::pair<std::string, std::string>> bins = {{"memsim", argv[1]}};
  if (argc > 2 && std::string(argv[2]) != "-") bins.emplace_back("baseline", argv[2]);
  const int reps = argc > 3 ? std::max(1, std::atoi(argv[3])) : 10;
  const std::string xl = "scenarios/cs336-xl-train-ctx512.yaml";

  std::printf("1. cold `memsim run %s` (whole process, min of %d)\n", xl.c_str(), reps);
  std::printf("| binary | wall ms | CPU ms | max RSS MiB |\n|---|---:|---:|---:|\n");
  for (const auto& [label, bin] : bins) {
    const Sample s = best_of({bin, "run", xl}, reps);
    std::printf("| %s | %.2f | %.2f | %.1f |\n", label.c_str(), s.wall_ms, s.cpu_ms,
                static_cast<double>(s.max_rss_kb) / 1024.0);
  }

  std::printf("\n2. max RSS against events (cs336-xl, unlimited device; min CPU of 3)\n");
  std::printf("| binary | output | layers | events | CPU ms | max RSS MiB | RSS bytes per event |\n"
              "|---|---|---:|---:|---:|---:|---:|\n");
  for (const auto& [label, bin] : bins) {
    for (bool stored : {false, true}) {
      for (int layers : {8, 32, 128, 512}) {
        std::vector<std::string> args = {bin, "run", xl, "--set", "model.layers=" + std::to_string(layers),
                                         "--set", "device.capacity=64TiB", "--json", "-"};
        if (stored) args = with(args, {"--timeline", "/dev/null"});
        const Sample s = best_of(args, 3);
        const long events = json_number(s.out, "events");
        std::printf("| %s | %s | %d | %ld | %.1f | %.1f | %.0f |\n", label.c_str(),
                    stored ? "--timeline (stored)" : "plain run", layers, events, s.cpu_ms,
                    static_cast<double>(s.max_rss_kb) / 1024.0,
                    events > 0 ? static_cast<double>(s.max_rss_kb) * 1024.0 / static_cast<double>(events) : 0.0);
      }
    }
  }

  std::printf("\n2b. max RSS against events from more steps (cs336-xl 32 layers, warm-up steps; min CPU of 3)\n");
  std::printf("| binary | output | warm-up steps | events | CPU ms | max RSS MiB |\n"
              "|---|---|---:|---:|---:|---:|\n");
  for (const auto& [label, bin] : bins) {
    for (bool stored : {false, true}) {
      for (int steps : {0, 10, 40}) {
        std::vector<std::string> args = {bin, "run", xl, "--set", "step.warmup_steps=" + std::to_string(steps),
                                         "--json", "-"};
        if (stored) args = with(args, {"--timeline", "/dev/null"});
        const Sample s = best_of(args, 3);
        std::printf("| %s | %s | %d | %ld | %.1f | %.1f |\n", label.c_str(),
                    stored ? "--timeline (stored)" : "plain run", steps, json_number(s.out, "events"),
                    s.cpu_ms, static_cast<double>(s.max_rss_kb) / 1024.0);
      }
    }
  }

  std::printf("\n3. GPT-3 175B with 2048 layers, t8 x p64 (1F1B, 16 micro-batches), whole process\n");
  std::printf("| binary | wall s | CPU s | max RSS MiB | exit |\n|---|---:|---:|---:|---:|\n");
  for (const auto& [label, bin] : bins) {
    const Sample s = best_of({bin, "run", "scenarios/gpt3-175b-tp8-pp8-64xh100.yaml", "--set",
                              "model.layers=2048", "--set", "parallel.pipeline=64"},
                             1);
    std::printf("| %s | %.2f | %.2f | %.1f | %d |\n", label.c_str(), s.wall_ms / 1e3,
                s.cpu_ms / 1e3, static_cast<double>(s.max_rss_kb) / 1024.0,
                WIFEXITED(s.status) ? WEXITSTATUS(s.status) : -1);
  }

  // Issue #20's "memory of a run without per-event outputs flat in events": the same model
  // and live state, more events (micro-batches per step, then steps). Tensor ids are
  // recycled in a streamed build (program/program.h), so a plain run's RSS should not move.
  std::printf("\n4. flat memory: max RSS against events, same live state (cs336-xl, plain run; "
              "min CPU of 3)\n");
  std::printf("| binary | setting | events | CPU ms | max RSS MiB | RSS bytes per event over the first row |\n"
              "|---|---|---:|---:|---:|---:|\n");
  for (const auto& [label, bin] : bins) {
    for (const char* key : {"batch.grad_accum", "step.warmup_steps"}) {
      long first_events = -1, first_rss = 0;
      for (int n : {1, 4, 16, 64}) {
        // An unlimited device: more micro-batches would run out of memory (and the OOM
        // report's advice candidates are section 5's case).
        const Sample s = best_of({bin, "run", xl, "--set", std::string(key) + "=" + std::to_string(n),
                                  "--set", "device.capacity=64TiB", "--json", "-"},
                                 3);
        const long events = json_number(s.out, "events");
        if (first_events < 0) {
          first_events = events;
          first_rss = s.max_rss_kb;
        }
        const double per_event =
            events > first_events
                ? static_cast<double>(s.max_rss_kb - first_rss) * 1024.0 / static_cast<double>(events - first_events)
                : 0.0;
        std::printf("| %s | %s=%d | %ld | %.1f | %.1f | %.1f |\n", label.c_str(), key, n, events,
                    s.cpu_ms, static_cast<double>(s.max_rss_kb) / 1024.0, per_event);
      }
    }
  }

  // A run stopped at its first out-of-memory (tools/cli/plain_run.h): cs336-xl with 64
  // micro-batches on a 24 GiB card runs out of memory in the first forward; the report
  // still needs one complete build on an unlimited device (oom.needed_bytes).
  std::printf("\n5. an OOM run (cs336-xl, batch.grad_accum=64, device.capacity=24GiB; min of %d)\n", reps);
  std::printf("| binary | exit | wall ms | CPU ms | max RSS MiB |\n|---|---:|---:|---:|---:|\n");
  for (const auto& [label, bin] : bins) {
    const Sample s = best_of({bin, "run", xl, "--set", "batch.grad_accum=64", "--set",
                              "device.capacity=24GiB", "--set", "batch.micro_batch=16"},
                             reps);
    std::printf("| %s | %d | %.1f | %.1f | %.1f |\n", label.c_str(),
                WIFEXITED(s.status) ? WEXITSTATUS(s.status) : -1, s.wall_ms, s.cpu_ms,
                static_cast<double>(s.max_rss_kb) / 1024.0);
  }

  return 0;
}
