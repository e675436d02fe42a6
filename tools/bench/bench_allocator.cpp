// Throughput of the caching-allocator emulator: 10 million malloc/free events (argument:
// another count) with a transformer-like size mix (55% small tensors, 35% 1-10 MiB
// activations, 9% 10-100 MiB, 1% 100-500 MiB) and LIFO-ish lifetimes in growing and
// shrinking waves (forward/backward-like). Two size mixes are measured:
//  - "48 shapes": a training step allocates the same few dozen tensor shapes over and
//    over, so 90% of requests come from a fixed catalog of 48 sizes, 10% are odd sizes;
//  - "random": every size drawn fresh (no repetition: the allocator's worst case).
// The event stream is generated before timing; only malloc/free calls are timed. Wall
// and thread-CPU time are both printed (on a loaded machine wall time measures the
// neighbours). Prints figures only; never asserts.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <vector>

#include "allocator/caching_allocator.h"

using namespace memsim;

namespace {

double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

struct Rng {
  uint64_t s = 0x9E3779B97F4A7C15ull;
  uint64_t next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  }
  uint64_t below(uint64_t n) { return next() % n; }
};

uint64_t draw_fresh_size(Rng& rng) {
  const uint64_t p = rng.below(1000);
  if (p < 550) return 4 + rng.below(1 << 20);                   // small pool
  if (p < 900) return (1 << 20) + rng.below(9ull << 20);        // 1-10 MiB
  if (p < 990) return (10ull << 20) + rng.below(90ull << 20);   // 10-100 MiB
  return (100ull << 20) + rng.below(400ull << 20);              // 100-500 MiB
}

struct SizeMix {
  const char* name;
  std::vector<uint64_t> catalog;  // empty: every size fresh
  uint64_t draw(Rng& rng) const {
    if (catalog.empty() || rng.below(100) < 10) return draw_fresh_size(rng);
    return catalog[rng.below(catalog.size())];
  }
};

struct Op {
  uint64_t bytes;  // 0 = free
  uint32_t slot;   // handle slot to fill (alloc) or free
};

std::vector<Op> make_stream(size_t events, const SizeMix& mix, uint32_t& slots_needed) {
  Rng rng;
  std::vector<Op> ops;
  ops.reserve(events);
  std::vector<uint32_t> live;  // stack of live slots
  std::vector<uint32_t> free_slots;
  uint32_t next_slot = 0;
  while (ops.size() < events) {
    // Waves: 4000 events growing (60% allocs), 4000 shrinking (40% allocs).
    const size_t phase = (ops.size() / 4000) % 2;
    const bool alloc = live.empty() || (phase == 0 ? rng.below(100) < 60 : rng.below(100) < 40);
    if (alloc && live.size() < 2000) {
      uint32_t slot;
      if (!free_slots.empty()) {
        slot = free_slots.back();
        free_slots.pop_back();
      } else {
        slot = next_slot++;
      }
      ops.push_back({mix.draw(rng), slot});
      live.push_back(slot);
    } else {
      // LIFO-ish: usually the top, sometimes one a few below it.
      const size_t depth = rng.below(100) < 80 ? 0 : rng.below(live.size() < 8 ? live.size() : 8);
      const size_t index = live.size() - 1 - depth;
      const uint32_t slot = live[index];
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(index));
      ops.push_back({0, slot});
      free_slots.push_back(slot);
    }
  }
  slots_needed = next_slot;
  return ops;
}

void run(const std::vector<Op>& ops, uint32_t slots, const SizeMix& mix, const char* conf) {
  SimulatedDevice device(64ull << 40, 0);  // never runs out: measures the search paths
  CachingAllocator alloc(AllocatorConfig::parse(conf), device);
  std::vector<BlockId> handles(slots, kNoBlock);
  uint64_t checksum = 0;
  const double c0 = cpu_seconds();
  const auto t0 = std::chrono::steady_clock::now();
  for (const Op& op : ops) {
    if (op.bytes != 0) {
      const AllocResult r = alloc.malloc(op.bytes);
      handles[op.slot] = r.block;
      checksum += r.address;
    } else {
      alloc.free(handles[op.slot]);
    }
  }
  const auto t1 = std::chrono::steady_clock::now();
  const double cpu = cpu_seconds() - c0;
  const double wall = std::chrono::duration<double>(t1 - t0).count();
  size_t free_blocks = 0;
  for (const SegmentInfo& seg : alloc.segments())
    for (const BlockInfo& b : seg.blocks) free_blocks += b.state == BlockState::inactive;
  const double n = static_cast<double>(ops.size());
  std::printf("bench_allocator [%s | %s]: %zu events: wall %.3f s = %.1f M events/s, "
              "CPU %.3f s = %.1f M events/s (cudaMallocs %lld, free blocks at end %zu, "
              "peak reserved %.2f GiB, checksum %llx)\n",
              mix.name, conf[0] ? conf : "default", ops.size(), wall, n / wall / 1e6, cpu,
              n / cpu / 1e6, static_cast<long long>(alloc.stats().num_device_alloc), free_blocks,
              static_cast<double>(alloc.stats().reserved_bytes.all.peak) / double(1ull << 30),
              static_cast<unsigned long long>(checksum));
}

}  // namespace

int main(int argc, char** argv) {
  const size_t events = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 10'000'000;
  SizeMix shapes{"48 shapes", {}};
  Rng catalog_rng;
  catalog_rng.s = 12345;
  for (int i = 0; i < 48; ++i) shapes.catalog.push_back(draw_fresh_size(catalog_rng));
  const SizeMix random{"random", {}};
  for (const SizeMix* mix : {static_cast<const SizeMix*>(&shapes), &random}) {
    uint32_t slots = 0;
    const std::vector<Op> ops = make_stream(events, *mix, slots);
    for (const char* conf : {"", "expandable_segments:True", "max_split_size_mb:200"})
      run(ops, slots, *mix, conf);
  }
  return 0;
}
