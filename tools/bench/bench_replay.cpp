// Throughput of snapshot replay: the replay loop (start-state seeding plus every traced
// request through the emulator), then reading the file (read_snapshot_file: the pickle
// parse and the snapshot reader) and prepare_replay, each the minimum over 20 rounds in
// this process (a cold `memsim replay` also pays for first touching its memory: time the
// whole process for that, docs/engine.md).
// Usage: bench_replay [SNAPSHOT.pickle | DIRECTORY]; a directory (default
// ../shared/groundtruth/snapshots, relative to the current directory) means its largest
// snapshot. Prints figures only.
#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <filesystem>
#include <string>

#include "allocator/snapshot/snapshot.h"
#include "replay/replay.h"

using namespace memsim;

namespace {
// CPU seconds of this thread: on a shared, loaded machine wall time mostly measures
// the neighbours, so both are printed.
double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}
}  // namespace
namespace fs = std::filesystem;

int main(int argc, char** argv) {
  std::string path = argc > 1 ? argv[1] : "../shared/groundtruth/snapshots";
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    std::string best;
    uintmax_t best_size = 0;
    for (const auto& entry : fs::recursive_directory_iterator(path, ec)) {
      if (entry.path().extension() != ".pickle") continue;
      const uintmax_t size = entry.file_size(ec);
      if (size > best_size) {
        best_size = size;
        best = entry.path().string();
      }
    }
    path = best;
  }
  if (path.empty() || !fs::exists(path, ec)) {
    std::fprintf(stderr, "bench_replay: no snapshot found (pass a .pickle or a directory)\n");
    return 1;
  }
  const Snapshot snapshot = read_snapshot_file(path);
  ReplayOptions options;
  options.check_final_state = false;
  const PreparedReplay prepared = prepare_replay(snapshot, options);

  // Repeat until ~1 s has passed so short traces give a stable figure.
  size_t runs = 0, events = 0, requests = 0, mismatches = 0;
  const double c0 = cpu_seconds();
  const auto t0 = std::chrono::steady_clock::now();
  double seconds = 0;
  while (seconds < 1.0) {
    const ReplayReport r = run_replay(prepared, options);
    events += r.events;
    requests += r.allocs + r.frees;
    mismatches += r.mismatches;
    ++runs;
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  const double cpu = cpu_seconds() - c0;
  std::printf("bench_replay: %s\n  %zu trace events x %zu runs: wall %.3f s = %.1f M events/s "
              "(%.1f M malloc+free/s); CPU %.3f s = %.1f M events/s (%.1f M malloc+free/s); "
              "mismatches %zu\n",
              path.c_str(), prepared.trace_events, runs, seconds, events / seconds / 1e6,
              requests / seconds / 1e6, cpu, events / cpu / 1e6, requests / cpu / 1e6, mismatches);
  double read_cpu = 1e30, prepare_cpu = 1e30;
  for (int i = 0; i < 20; ++i) {
    const double r0 = cpu_seconds();
    const Snapshot again = read_snapshot_file(path);
    const double r1 = cpu_seconds();
    const PreparedReplay p = prepare_replay(again, options);
    const double r2 = cpu_seconds();
    read_cpu = std::min(read_cpu, r1 - r0);
    prepare_cpu = std::min(prepare_cpu, r2 - r1);
    if (p.trace_events != prepared.trace_events) return 1;
  }
  std::printf("  read_snapshot_file %.2f ms CPU, prepare_replay %.2f ms CPU (min of 20)\n",
              read_cpu * 1e3, prepare_cpu * 1e3);
  return 0;
}
