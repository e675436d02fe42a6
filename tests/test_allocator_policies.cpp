// Garbage collection (§4.4), streams (§1), empty_cache (§6), seeding and the flat stats
// map (§8): hand-derived sequences with exact addresses and trace entries.
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
constexpr uint64_t A = 0x100000000ull, B = 0x200000000ull, C = 0x300000000ull,
                   D = 0x400000000ull, E = 0x500000000ull;

// a, b = 100 MiB, c = 300 MiB; free a; d = 120 MiB; free b; then e = 150 MiB.
// Ages at e (get_free_block calls since caching): a = 2, b = 1.
std::vector<std::string> gc_sequence(const AllocatorConfig& cfg) {
  ScriptedDevice dev({A, B, C, D, E}, 1000 * MiB_);
  CachingAllocator alloc(cfg, dev);
  TraceRecorder rec;
  alloc.set_trace_observer(&rec);
  AllocResult a = alloc.malloc(100 * MiB_);
  AllocResult b = alloc.malloc(100 * MiB_);
  REQUIRE(alloc.malloc(300 * MiB_).ok());
  alloc.free(a.block);
  REQUIRE(alloc.malloc(120 * MiB_).address == D);  // 500 MiB <= threshold: no GC yet
  alloc.free(b.block);
  rec.clear();
  AllocResult e = alloc.malloc(150 * MiB_);
  REQUIRE(e.ok());
  return rec.lines();
}
}  // namespace

TEST_CASE("Garbage collection frees cached segments of at least average age, in passes", "[allocator]") {
  AllocatorConfig cfg = AllocatorConfig::parse("garbage_collection_threshold:0.5");
  cfg.memory_fraction = 1.0;
  // total 620 MiB > 500 MiB: target 120 MiB. Pass 1 (average 1.5) frees a (age 2) only;
  // 100 < 120, so pass 2 (average 1) frees b; then the cudaMalloc.
  CHECK(gc_sequence(cfg) == std::vector<std::string>{line(TA::segment_free, A, 100 * MiB_),
                                                     line(TA::segment_free, B, 100 * MiB_),
                                                     line(TA::segment_alloc, E, 150 * MiB_),
                                                     line(TA::alloc, E, 150 * MiB_)});
}

TEST_CASE("Garbage collection is inert without a memory fraction", "[allocator]") {
  const AllocatorConfig cfg = AllocatorConfig::parse("garbage_collection_threshold:0.5");
  CHECK(gc_sequence(cfg) == std::vector<std::string>{line(TA::segment_alloc, E, 150 * MiB_),
                                                     line(TA::alloc, E, 150 * MiB_)});
}

TEST_CASE("Streams never share cached blocks, and empty_cache frees in (stream, size, address) order", "[allocator]") {
  ScriptedDevice dev({A, B, C});
  CachingAllocator alloc(AllocatorConfig{}, dev);
  TraceRecorder rec;
  alloc.set_trace_observer(&rec);
  AllocResult s2 = alloc.malloc(1000, 2);
  AllocResult s1 = alloc.malloc(1000, 1);
  CHECK(s2.address == A);
  CHECK(s1.address == B);
  alloc.free(s1.block);
  alloc.free(s2.block);
  // Stream 7 has no cached block of its own: a new segment although two are free.
  AllocResult s7 = alloc.malloc(1000, 7);
  CHECK(s7.address == C);
  alloc.free(s7.block);
  AllocResult again = alloc.malloc(3000, 1);
  CHECK(again.address == B);
  alloc.free(again.block);
  auto segs = alloc.segments();
  REQUIRE(segs.size() == 3);
  CHECK(segs[0].stream == 2);
  CHECK(segs[1].stream == 1);
  CHECK(segs[2].stream == 7);
  CHECK(segs[1].blocks[0].requested_size == 3000);
  rec.clear();
  alloc.empty_cache();
  CHECK(rec.lines() == std::vector<std::string>{line(TA::segment_free, B, 2 * MiB_),
                                                line(TA::segment_free, A, 2 * MiB_),
                                                line(TA::segment_free, C, 2 * MiB_)});
  CHECK(alloc.stats().num_sync_all_streams == 1);
  CHECK(alloc.stats().reserved_bytes.all.current == 0);
}

TEST_CASE("empty_cache keeps split segments that still hold a live block", "[allocator]") {
  ScriptedDevice dev({A, B});
  CachingAllocator alloc(AllocatorConfig{}, dev);
  AllocResult live = alloc.malloc(2 * MiB_);  // 20 MiB segment A, split
  AllocResult gone = alloc.malloc(20 * MiB_);  // 18 MiB hole too small: own segment B
  alloc.free(gone.block);
  alloc.empty_cache();
  CHECK(alloc.stats().reserved_bytes.all.current == 20 * MiB_);
  CHECK(alloc.stats().inactive_split_bytes.all.current == 18 * MiB_);
  CHECK(alloc.stats().num_device_free == 1);
  alloc.free(live.block);
  CHECK(alloc.stats().inactive_split.all.current == 0);
  alloc.empty_cache();
  CHECK(alloc.stats().reserved_bytes.all.current == 0);
  CHECK(alloc.stats().num_sync_all_streams == 2);
}

TEST_CASE("Best fit picks the smallest block, then the lowest address", "[allocator]") {
  ScriptedDevice dev({A, B, C});
  CachingAllocator alloc(AllocatorConfig{}, dev);
  AllocResult x = alloc.malloc(12 * MiB_);  // A
  AllocResult y = alloc.malloc(12 * MiB_);  // B
  AllocResult z = alloc.malloc(14 * MiB_);  // C
  alloc.free(z.block);
  alloc.free(y.block);
  alloc.free(x.block);
  // 11 MiB: both 12 MiB blocks fit best; lower address A wins; leftover 1 MiB: no split.
  AllocResult r = alloc.malloc(11 * MiB_);
  CHECK(r.address == A);
  CHECK(r.size == 12 * MiB_);
  // 12.5 MiB: only C fits; leftover 1.5 MiB > 1 MiB: split.
  AllocResult q = alloc.malloc(12 * MiB_ + MiB_ / 2);
  CHECK(q.address == C);
  CHECK(q.size == 12 * MiB_ + MiB_ / 2);
  CHECK(alloc.stats().inactive_split_bytes.large_pool.current == static_cast<int64_t>(MiB_ + MiB_ / 2));
}

TEST_CASE("free_at frees by address, and seed_segment rebuilds a warm state", "[allocator]") {
  ScriptedDevice dev({B});
  CachingAllocator alloc(AllocatorConfig{}, dev);
  SegmentInfo seg;
  seg.address = A;
  seg.total_size = 20 * MiB_;
  seg.blocks = {{A, 4 * MiB_, 4000000, BlockState::active_allocated},
                {A + 4 * MiB_, 6 * MiB_, 777, BlockState::inactive},
                {A + 10 * MiB_, 2 * MiB_, 0, BlockState::inactive},
                {A + 12 * MiB_, 8 * MiB_, 8 * MiB_, BlockState::active_allocated}};
  std::vector<BlockId> ids = alloc.seed_segment(seg);
  REQUIRE(ids.size() == 2);
  const MemoryStats& s = alloc.stats();
  CHECK(s.reserved_bytes.large_pool.current == 20 * MiB_);
  CHECK(s.allocated_bytes.all.current == 12 * MiB_);
  CHECK(s.requested_bytes.all.current == 4000000 + 8 * MiB_);
  CHECK(s.inactive_split.all.current == 1);  // the two free blocks merge
  CHECK(s.inactive_split_bytes.all.current == 8 * MiB_);
  // Best fit uses the merged 8 MiB hole.
  AllocResult r = alloc.malloc(7 * MiB_);
  CHECK(r.address == A + 4 * MiB_);
  CHECK(r.size == 8 * MiB_);  // leftover exactly 1 MiB: not split (§4.8)
  CHECK(alloc.free_at(A));
  CHECK_FALSE(alloc.free_at(A + 1));
  alloc.free(ids[1]);
  alloc.free(r.block);
  auto segs = alloc.segments();
  REQUIRE(segs.size() == 1);
  REQUIRE(segs[0].blocks.size() == 1);
  CHECK(segs[0].blocks[0].size == 20 * MiB_);
  CHECK(s.allocated_bytes.all.current == 0);
  CHECK(s.inactive_split.all.current == 0);
}

TEST_CASE("memory_stats flattening uses PyTorch's keys", "[allocator]") {
  ScriptedDevice dev({A});
  CachingAllocator alloc(AllocatorConfig{}, dev);
  alloc.malloc(1000);
  auto m = alloc.stats().to_flat_map();
  CHECK(m.size() == 122u);
  CHECK(m.at("allocation.all.current") == 1);
  CHECK(m.at("allocated_bytes.small_pool.peak") == 1024);
  CHECK(m.at("reserved_bytes.large_pool.current") == 0);
  CHECK(m.at("oversize_segments.peak") == 0);
  CHECK(m.at("max_split_size") == -1);
  CHECK(m.at("num_device_alloc") == 1);
  CHECK(m.begin()->first == "active.all.allocated");
}

TEST_CASE("snapshot() records a snapshot trace entry with the total active bytes", "[allocator]") {
  ScriptedDevice dev({A, B});
  CachingAllocator alloc(AllocatorConfig{}, dev);
  TraceRecorder rec;
  alloc.set_trace_observer(&rec);
  alloc.malloc(1000);
  alloc.malloc(5 * MiB_);
  rec.clear();
  auto segs = alloc.snapshot();
  REQUIRE(segs.size() == 2);
  CHECK(rec.lines() == std::vector<std::string>{line(TA::snapshot, 0, 1024 + 5 * MiB_)});
}
