// Out-of-memory path (§4 steps 4c-4e, §4.7): flush before OOM, retry counter, `oom`
// trace entry, and PyTorch's message text byte for byte (double spaces included).
#include <catch2/catch.hpp>

#include "allocator/caching_allocator.h"
#include "tests/allocator_test_support.h"

using namespace memsim;
using memsim::testing::line;
using memsim::testing::ScriptedDevice;
using memsim::testing::TraceRecorder;
using TA = TraceAction;

namespace {
constexpr uint64_t MiB_ = 1048576;
constexpr uint64_t A = 0x100000000ull, B = 0x200000000ull, C = 0x300000000ull, D = 0x400000000ull;
}  // namespace

TEST_CASE("OOM flushes the whole cache first, then reports PyTorch's message", "[allocator]") {
  ScriptedDevice dev({A, B, C, D}, 64 * MiB_);
  CachingAllocator alloc(AllocatorConfig{}, dev);
  TraceRecorder rec;
  alloc.set_trace_observer(&rec);

  AllocResult a = alloc.malloc(20 * MiB_);  // own 20 MiB segment at A
  AllocResult b = alloc.malloc(4 * MiB_);   // 20 MiB segment at B, split
  AllocResult c = alloc.malloc(1000);       // 2 MiB small segment at C
  REQUIRE((a.address == A && b.address == B && c.address == C));
  alloc.free(c.block);
  alloc.free(a.block);
  rec.clear();

  AllocResult r = alloc.malloc(50 * MiB_);
  REQUIRE_FALSE(r.ok());
  REQUIRE(r.oom.has_value());
  // Large pool first, in (stream, size, address) order; the split B segment stays.
  CHECK(rec.lines() == std::vector<std::string>{line(TA::segment_free, A, 20 * MiB_),
                                                line(TA::segment_free, C, 2 * MiB_),
                                                line(TA::oom, 44 * MiB_, 50 * MiB_)});
  const MemoryStats& s = alloc.stats();
  CHECK(s.num_ooms == 1);
  CHECK(s.num_alloc_retries == 1);
  CHECK(s.num_sync_all_streams == 1);
  CHECK(s.num_device_free == 2);
  CHECK(r.oom->alloc_size == 50 * MiB_);
  CHECK(r.oom->rounded_bytes == 50 * MiB_);
  CHECK(r.oom->device_free == 44 * MiB_);
  CHECK(r.oom->allocated_bytes == 4 * MiB_);
  CHECK(r.oom->reserved_bytes == 20 * MiB_);
  CHECK(r.oom->message ==
        "CUDA out of memory. Tried to allocate 50.00 MiB. GPU 0 has a total capacity of "
        "64.00 MiB of which 44.00 MiB is free. Of the allocated memory 4.00 MiB is allocated "
        "by PyTorch, and 16.00 MiB is reserved by PyTorch but unallocated. If reserved but "
        "unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
        "to avoid fragmentation.  See documentation for Memory Management  "
        "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)");
  // The allocator stays usable: the split segment still serves a fitting request.
  AllocResult again = alloc.malloc(16 * MiB_);
  CHECK(again.address == B + 4 * MiB_);
}

TEST_CASE("OOM under a memory fraction prints the allowed size and the segment size", "[allocator]") {
  AllocatorConfig cfg;
  cfg.memory_fraction = 0.5;
  ScriptedDevice dev({A, B, C}, 64 * MiB_);
  CachingAllocator alloc(cfg, dev);
  TraceRecorder rec;
  alloc.set_trace_observer(&rec);
  REQUIRE(alloc.malloc(30 * MiB_).ok());
  REQUIRE(alloc.malloc(1000).ok());
  REQUIRE(alloc.malloc(1000).ok());
  const int cuda_calls = dev.malloc_calls;
  rec.clear();
  AllocResult r = alloc.malloc(2 * MiB_);  // would need a 20 MiB segment: over the limit
  REQUIRE(r.oom.has_value());
  CHECK(dev.malloc_calls == cuda_calls);  // the fraction check makes no CUDA call
  CHECK(rec.lines() == std::vector<std::string>{line(TA::oom, 32 * MiB_, 2 * MiB_)});
  CHECK(r.oom->message ==
        "CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of "
        "64.00 MiB of which 32.00 MiB is free. 32.00 MiB allowed; Of the allocated memory "
        "30.00 MiB is allocated by PyTorch, and 2.00 MiB is reserved by PyTorch but "
        "unallocated. If reserved but unallocated memory is large try setting "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
        "documentation for Memory Management  "
        "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)");
  CHECK(alloc.stats().num_alloc_retries == 1);
  CHECK(alloc.stats().num_ooms == 1);
}

TEST_CASE("A small request that cannot get a segment says 2.00 MiB, and oom trace has the rounded size", "[allocator]") {
  ScriptedDevice dev({A}, 20 * MiB_);
  CachingAllocator alloc(AllocatorConfig{}, dev);
  TraceRecorder rec;
  alloc.set_trace_observer(&rec);
  AllocResult big = alloc.malloc(19 * MiB_ + 1);  // 20 MiB segment, whole device
  REQUIRE(big.ok());
  rec.clear();
  AllocResult r = alloc.malloc(700);
  REQUIRE(r.oom.has_value());
  CHECK(rec.lines() == std::vector<std::string>{line(TA::oom, 0, 1024)});
  CHECK(r.oom->message.rfind("CUDA out of memory. Tried to allocate 2.00 MiB. GPU 0 has a total "
                             "capacity of 20.00 MiB of which 0 bytes is free. Of the allocated "
                             "memory 20.00 MiB is allocated by PyTorch, and 0 bytes is reserved",
                             0) == 0);
}

TEST_CASE("Requests of 2^60 bytes or more fail before touching state", "[allocator]") {
  ScriptedDevice dev({A});
  CachingAllocator alloc(AllocatorConfig{}, dev);
  AllocResult r = alloc.malloc(uint64_t{1} << 60);
  REQUIRE(r.oom.has_value());
  CHECK(r.oom->message == "CUDA out of memory. Tried to allocate more than 1EB memory.");
  CHECK(alloc.stats().num_ooms == 0);
  CHECK(dev.malloc_calls == 0);
}
