#include "sim/search/workers.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace memsim {

namespace {
std::atomic<unsigned> g_default_threads{0};
// True on a thread while it runs tasks: work started from inside a task (a sweep point's
// pipeline stages) runs on that thread alone instead of multiplying the threads.
thread_local bool t_in_worker = false;
}  // namespace

void set_default_threads(unsigned threads) { g_default_threads.store(threads); }
unsigned default_threads() { return g_default_threads.load(); }

unsigned worker_count(unsigned threads, size_t count) {
  if (t_in_worker) return 1;
  if (threads == 0) threads = default_threads();
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  return static_cast<unsigned>(std::min<size_t>(threads, std::max<size_t>(count, 1)));
}

void run_parallel(size_t count, const std::function<void(size_t)>& task, unsigned threads,
                  const SweepProgress& progress) {
  run_parallel_workers(
      count, [&](size_t i, unsigned) { task(i); }, threads, progress);
}

void run_parallel_workers(size_t count, const std::function<void(size_t, unsigned)>& task,
                          unsigned threads, const SweepProgress& progress) {
  threads = worker_count(threads, count);
  std::atomic<size_t> next{0};
  std::mutex progress_mutex;
  size_t done = 0;
  std::exception_ptr failure;
  auto worker = [&](unsigned id) {
    const bool outer = t_in_worker;
    t_in_worker = true;
    struct Restore {
      bool value;
      ~Restore() { t_in_worker = value; }
    } restore{outer};
    for (;;) {
      const size_t i = next.fetch_add(1);
      if (i >= count) return;
      try {
        task(i, id);
      } catch (...) {
        // Stop handing out work and rethrow on the caller's thread.
        std::lock_guard<std::mutex> lock(progress_mutex);
        if (!failure) failure = std::current_exception();
        next.store(count);
        return;
      }
      if (progress) {
        std::lock_guard<std::mutex> lock(progress_mutex);
        progress(++done, count);
      }
    }
  };
  std::vector<std::thread> pool;
  for (unsigned t = 1; t < threads; ++t) pool.emplace_back(worker, t);
  worker(0);  // the calling thread works too
  for (std::thread& t : pool) t.join();
  if (failure) std::rethrow_exception(failure);
}

}  // namespace memsim
