// The worked examples E1-E6 of shared/docs/pytorch-allocator.md §14a, with exact
// addresses, statistics and trace entries.
#include <catch2/catch.hpp>

#include "allocator/caching_allocator.h"
#include "tests/allocator_test_support.h"

using namespace memsim;
using memsim::testing::line;
using memsim::testing::ScriptedDevice;
using memsim::testing::TraceRecorder;
using TA = TraceAction;

namespace {
constexpr uint64_t A = 0x7f1200000000ull;
constexpr uint64_t B = 0x7f1400000000ull;
constexpr uint64_t C = 0x7f1600000000ull;
constexpr uint64_t MiB_ = 1048576;
}  // namespace

TEST_CASE("E1: small pool split, stats, merge keeps the freed object, empty_cache", "[allocator]") {
  ScriptedDevice dev({A});
  CachingAllocator alloc(AllocatorConfig{}, dev);
  TraceRecorder rec;
  alloc.set_trace_observer(&rec);

  AllocResult r1 = alloc.malloc(1000);
  REQUIRE(r1.ok());
  CHECK(r1.address == A);
  CHECK(r1.size == 1024);
  CHECK(rec.lines() == std::vector<std::string>{line(TA::segment_alloc, A, 2097152),
                                                line(TA::alloc, A, 1000)});
  const MemoryStats& s = alloc.stats();
  for (const Stat* st : {&s.segment.all, &s.segment.small_pool}) CHECK(st->current == 1);
  CHECK(s.segment.large_pool.current == 0);
  CHECK(s.reserved_bytes.all.current == 2097152);
  CHECK(s.reserved_bytes.small_pool.current == 2097152);
  CHECK(s.allocation.small_pool.current == 1);
  CHECK(s.allocated_bytes.all.current == 1024);
  CHECK(s.active.all.current == 1);
  CHECK(s.active_bytes.small_pool.current == 1024);
  CHECK(s.requested_bytes.all.current == 1000);
  CHECK(s.inactive_split.all.current == 1);
  CHECK(s.inactive_split_bytes.all.current == 2096128);
  CHECK(s.inactive_split_bytes.small_pool.current == 2096128);

  AllocResult r2 = alloc.malloc(1000);
  CHECK(r2.address == A + 1024);
  CHECK(s.inactive_split.all.current == 1);
  CHECK(s.inactive_split_bytes.all.current == 2095104);

  rec.clear();
  alloc.free(r1.block);
  CHECK(rec.lines() == std::vector<std::string>{line(TA::free_requested, A, 1000),
                                                line(TA::free_completed, A, 1000)});
  CHECK(s.inactive_split.all.current == 2);
  CHECK(s.inactive_split_bytes.all.current == 2096128);
  CHECK(s.allocated_bytes.all.current == 1024);

  alloc.free(r2.block);
  CHECK(s.inactive_split.all.current == 0);
  CHECK(s.inactive_split_bytes.all.current == 0);
  auto segs = alloc.segments();
  REQUIRE(segs.size() == 1);
  CHECK(segs[0].address == A);
  CHECK(segs[0].total_size == 2097152);
  CHECK(segs[0].is_small);
  REQUIRE(segs[0].blocks.size() == 1);
  CHECK(segs[0].blocks[0].state == BlockState::inactive);
  CHECK(segs[0].blocks[0].size == 2097152);
  CHECK(segs[0].blocks[0].requested_size == 1000);  // stale, from the surviving object

  rec.clear();
  alloc.empty_cache();
  CHECK(rec.lines() == std::vector<std::string>{line(TA::segment_free, A, 2097152)});
  CHECK(s.reserved_bytes.all.current == 0);
  CHECK(s.segment.all.current == 0);
  CHECK(s.num_device_free == 1);
  CHECK(s.num_sync_all_streams == 1);
  CHECK(s.num_device_alloc == 1);
  CHECK(alloc.segments().empty());
}

TEST_CASE("E2: 20 MiB segments for 1-10 MiB, exact-size reuse, >= 10 MiB own segment", "[allocator]") {
  ScriptedDevice dev({B, C});
  CachingAllocator alloc(AllocatorConfig{}, dev);
  TraceRecorder rec;
  alloc.set_trace_observer(&rec);

  AllocResult a = alloc.malloc(5242880);
  CHECK(a.address == B);
  CHECK(alloc.stats().inactive_split.large_pool.current == 1);
  CHECK(alloc.stats().inactive_split_bytes.large_pool.current == 15 * MiB_);
  AllocResult b = alloc.malloc(15728640);
  CHECK(b.address == B + 5 * MiB_);
  CHECK(b.size == 15728640);
  CHECK(alloc.stats().inactive_split.large_pool.current == 0);
  CHECK(alloc.stats().inactive_split_bytes.large_pool.current == 0);
  AllocResult c = alloc.malloc(12582912);
  CHECK(c.address == C);
  CHECK(c.size == 12582912);
  CHECK(rec.lines() == std::vector<std::string>{
                           line(TA::segment_alloc, B, 20971520), line(TA::alloc, B, 5242880),
                           line(TA::alloc, B + 5 * MiB_, 15728640),
                           line(TA::segment_alloc, C, 12582912), line(TA::alloc, C, 12582912)});
  CHECK(alloc.stats().reserved_bytes.large_pool.current == 20971520 + 12582912);
  CHECK(alloc.stats().segment.large_pool.current == 2);
}

TEST_CASE("E3: a large leftover of <= 1 MiB is not split", "[allocator]") {
  ScriptedDevice dev({B});
  CachingAllocator alloc(AllocatorConfig{}, dev);
  TraceRecorder rec;
  alloc.set_trace_observer(&rec);
  AllocResult a = alloc.malloc(26214401);
  CHECK(alloc.round_size(26214401) == 26214912);
  CHECK(a.size == 27262976);
  CHECK(rec.lines() == std::vector<std::string>{line(TA::segment_alloc, B, 27262976),
                                                line(TA::alloc, B, 26214401)});
  CHECK(alloc.stats().allocated_bytes.all.current == 27262976);
  CHECK(alloc.stats().requested_bytes.all.current == 26214401);
  CHECK(alloc.stats().inactive_split.all.current == 0);
  auto segs = alloc.segments();
  REQUIRE(segs.size() == 1);
  REQUIRE(segs[0].blocks.size() == 1);
  CHECK(segs[0].blocks[0].requested_size == 26214401);
}

TEST_CASE("E4: max_split_size_mb:100 oversize rules and release_available_cached_blocks", "[allocator]") {
  const AllocatorConfig cfg = AllocatorConfig::parse("max_split_size_mb:100");
  REQUIRE(cfg.max_split_size == 104857600);

  SECTION("oversize request rejects a block wasting >= 20 MiB; cudaMalloc fails; D is released") {
    ScriptedDevice dev({A, B, C}, 400 * MiB_);
    CachingAllocator alloc(cfg, dev);
    TraceRecorder rec;
    alloc.set_trace_observer(&rec);
    AllocResult d = alloc.malloc(300 * MiB_);
    CHECK(d.address == A);
    CHECK(alloc.stats().oversize_segments.current == 1);
    CHECK(alloc.stats().oversize_allocations.current == 1);
    alloc.free(d.block);
    CHECK(alloc.stats().oversize_allocations.current == 0);
    rec.clear();
    AllocResult r = alloc.malloc(157286400);
    REQUIRE(r.ok());
    CHECK(r.address == B);
    CHECK(rec.lines() == std::vector<std::string>{line(TA::segment_free, A, 300 * MiB_),
                                                  line(TA::segment_alloc, B, 157286400),
                                                  line(TA::alloc, B, 157286400)});
    CHECK(alloc.stats().num_alloc_retries == 0);  // not the full-flush retry
    CHECK(alloc.stats().num_sync_all_streams == 0);
    CHECK(alloc.stats().oversize_segments.current == 1);
  }
  SECTION("a normal request never takes an oversize block") {
    ScriptedDevice dev({A, B});
    CachingAllocator alloc(cfg, dev);
    AllocResult d = alloc.malloc(300 * MiB_);
    alloc.free(d.block);
    AllocResult r = alloc.malloc(52428800);
    CHECK(r.address == B);
    CHECK(r.size == 52428800);
    CHECK(alloc.stats().segment.all.current == 2);
  }
  SECTION("an oversize request takes an oversize block wasting < 20 MiB, unsplit") {
    ScriptedDevice dev({A, B});
    CachingAllocator alloc(cfg, dev);
    AllocResult d = alloc.malloc(300 * MiB_);
    alloc.free(d.block);
    AllocResult r = alloc.malloc(290 * MiB_);
    CHECK(r.address == A);
    CHECK(r.size == 300 * MiB_);
    CHECK(alloc.stats().segment.all.current == 1);
  }
}

TEST_CASE("E5: roundup_power2_divisions:4", "[allocator]") {
  ScriptedDevice dev({A});
  CachingAllocator alloc(AllocatorConfig::parse("roundup_power2_divisions:4"), dev);
  CHECK(alloc.round_size(5000000) == 5242880);
  CHECK(alloc.round_size(1200) == 1536);
  CHECK(alloc.round_size(4194304) == 4194304);
  CHECK(alloc.round_size(2049) == 2560);  // 2049 > 512*4, P=2048, step 512
  CHECK(alloc.round_size(100) == 512);
  AllocResult r = alloc.malloc(5000000);
  CHECK(r.size == 5242880);
}

TEST_CASE("E6: expandable segments map 20 MiB pages, reuse the tail, unmap on empty_cache", "[allocator]") {
  ScriptedDevice dev({});
  CachingAllocator alloc(AllocatorConfig::parse("expandable_segments:True"), dev);
  TraceRecorder rec;
  alloc.set_trace_observer(&rec);
  AllocResult a = alloc.malloc(31457280);
  REQUIRE(a.ok());
  const uint64_t X = a.address;
  CHECK(rec.lines() == std::vector<std::string>{line(TA::segment_map, X, 41943040),
                                                line(TA::alloc, X, 31457280)});
  const MemoryStats& s = alloc.stats();
  CHECK(s.reserved_bytes.all.current == 41943040);
  CHECK(s.reserved_bytes.large_pool.current == 41943040);
  CHECK(s.segment.all.current == 0);
  CHECK(s.num_device_alloc == 1);
  CHECK(s.inactive_split.all.current == 0);

  AllocResult b = alloc.malloc(8388608);
  CHECK(b.address == X + 30 * MiB_);
  CHECK(b.size == 8388608);
  CHECK(dev.malloc_calls == 0);

  alloc.free(a.block);
  alloc.free(b.block);
  auto segs = alloc.segments();
  REQUIRE(segs.size() == 1);
  CHECK(segs[0].is_expandable);
  CHECK(segs[0].address == X);
  CHECK(segs[0].total_size == 41943040);
  REQUIRE(segs[0].blocks.size() == 1);
  CHECK(segs[0].blocks[0].state == BlockState::inactive);
  CHECK(segs[0].blocks[0].requested_size == 8388608);

  rec.clear();
  alloc.empty_cache();
  CHECK(rec.lines() == std::vector<std::string>{line(TA::segment_unmap, X, 41943040)});
  CHECK(s.reserved_bytes.all.current == 0);
  CHECK(s.num_device_free == 1);
  CHECK(alloc.segments().empty());
  CHECK(alloc.total_allocated_memory() == 0);

  // A new request creates a fresh reservation and maps again.
  rec.clear();
  AllocResult c = alloc.malloc(1000);
  REQUIRE(c.ok());
  CHECK(rec.lines() == std::vector<std::string>{line(TA::segment_map, c.address, 2097152),
                                                line(TA::alloc, c.address, 1000)});
}
