// Worker threads for independent tasks: sweep points, pipeline stages, optimize's candidate
// Programs. Results go to slots indexed by task, so output never depends on scheduling.
//
// Contract:
//  - worker_count(threads, count): the number of workers run_parallel starts for `count`
//    tasks: `threads`, or for 0 the process default (set_default_threads, from the command
//    line's -j), or for 0 there too all cores (std::thread::hardware_concurrency()); never
//    more than `count`, at least 1. Called from inside a task it is 1: nested work (a
//    sweep point's pipeline stages) stays on its worker's thread.
//  - run_parallel_workers() runs tasks 0..count-1 on that many std::threads (the calling
//    thread is worker 0), telling each task its worker so that it can use that worker's
//    buffers; `progress` (optional) is called after each task, serialized, with
//    (done, count). The first exception a task throws stops handing out work and is
//    rethrown on the calling thread once every worker has stopped.
#pragma once

#include <cstddef>
#include <functional>

namespace memsim {

using SweepProgress = std::function<void(size_t done, size_t total)>;

void set_default_threads(unsigned threads);  // 0: all cores
unsigned default_threads();                  // the value set (0: all cores)

unsigned worker_count(unsigned threads, size_t count);

void run_parallel(size_t count, const std::function<void(size_t task)>& task, unsigned threads,
                  const SweepProgress& progress = {});
// Same, telling each task its worker (0 .. worker_count(threads, count) - 1).
void run_parallel_workers(size_t count,
                          const std::function<void(size_t task, unsigned worker)>& task,
                          unsigned threads, const SweepProgress& progress = {});

}  // namespace memsim
