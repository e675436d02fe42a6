// Internal to the allocator emulator: the state and operations behind CachingAllocator.
// One device, default pools only (no CUDA graphs / MemPools, no record_stream), so every
// block is either allocated or free; `active_pending_free` never occurs.
//
// The member functions are spread over files by concern:
//   caching_allocator.cpp    malloc/free hot path, splitting, merging (§4, §5)
//   allocator_release.cpp    release_cached_blocks, release_available_cached_blocks,
//                            garbage collection, OOM result (§4.4, §4.6, §4.7, §6)
//   expandable_segments.cpp  expandable segments (§7)
//   allocator_state.cpp      segments(), seeding, address index (§9.2, §9.3)
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "allocator/block_pool.h"
#include "allocator/free_index.h"
#include "allocator/caching_allocator.h"

namespace memsim {

inline constexpr uint64_t kMinBlockSize = 512;
inline constexpr uint64_t kSmallSize = 1048576;
inline constexpr uint64_t kSmallBuffer = 2097152;
inline constexpr uint64_t kLargeBuffer = 20971520;
inline constexpr uint64_t kMinLargeAlloc = 10485760;
inline constexpr uint64_t kRoundLarge = 2097152;

namespace detail {

// One free-block pool kind (§1): the mapped free blocks and, in expandable mode, the
// unmapped remainders of its reservations.
struct Pool {
  StreamFreeIndex blocks;
  UnmappedSet unmapped;
  uint64_t get_free_blocks_call_count = 0;  // §4.4
  bool small = false;
};

// One virtual address reservation of expandable mode (§7.1).
struct ExpandableSegment {
  uint64_t base = 0;
  uint64_t page = 0;       // 2 MiB (small pool) or 20 MiB (large pool)
  uint64_t num_pages = 0;
  StreamId stream = 0;
  bool small = false;
  bool alive = false;
  // Which pages are mapped, grown on demand up to the highest page mapped so far (pages
  // past its end are unmapped): sized to num_pages up front it cost gigabytes of host
  // memory for an "unlimited" device of 2^60 bytes (num_pages = 1.125 x total / page).
  std::vector<bool> mapped_pages;
  void set_mapped(uint64_t begin, uint64_t end, bool mapped) {
    if (end > mapped_pages.size()) {
      if (!mapped) end = mapped_pages.size();
      else mapped_pages.resize(end, false);
    }
    for (uint64_t p = begin; p < end; ++p) mapped_pages[p] = mapped;
  }
};

// Checked updates of the int64 statistics (memory_stats.h). c10 trusts its inputs;
// memsim's come from files (snapshots, scenarios), so a byte count of 2^63 or more (cast
// to a negative int64) or a sum past 2^63 - 1 throws std::overflow_error instead of
// wrapping into negative or tiny peaks. Every update in the allocator goes through these.
//
// One overflow test per update (issue #20, the per-event cost): stats change only here,
// from zero, by amounts >= 0, so current = allocated - freed with allocated, freed in
// [0, 2^63). Hence current + amount <= allocated + amount (an increase overflows current
// only if it overflows `allocated`) and current - amount >= -(freed + amount) (a decrease
// overflows current only if it overflows `freed`). For a StatArray the pool's sums never
// exceed the `all` sums, so testing `all` covers both. The same updates throw, with the
// same message (the first Stat tested is `all`, as before), as testing all four sums.
[[noreturn]] void stat_overflow(int64_t current, int64_t amount);
inline void stat_increase_unchecked(Stat& s, int64_t amount) {
  s.current += amount;
  s.allocated += amount;
  if (s.current > s.peak) s.peak = s.current;
}
inline void stat_decrease_unchecked(Stat& s, int64_t amount) {
  s.current -= amount;
  s.freed += amount;
}
inline void stat_increase(Stat& s, int64_t amount) {
  int64_t allocated;
  if (amount < 0 || __builtin_add_overflow(s.allocated, amount, &allocated))
    stat_overflow(s.current, amount);
  stat_increase_unchecked(s, amount);
}
inline void stat_decrease(Stat& s, int64_t amount) {
  int64_t freed;
  if (amount < 0 || __builtin_add_overflow(s.freed, amount, &freed))
    stat_overflow(s.current, -amount);
  stat_decrease_unchecked(s, amount);
}
inline void stat_increase(StatArray& a, bool small, int64_t amount) {
  stat_increase(a.all, amount);
  stat_increase_unchecked(small ? a.small_pool : a.large_pool, amount);
}
inline void stat_decrease(StatArray& a, bool small, int64_t amount) {
  stat_decrease(a.all, amount);
  stat_decrease_unchecked(small ? a.small_pool : a.large_pool, amount);
}

// The malloc/free hot path's updates (issue #20, the allocator's per-call cost): only the
// tests that can fire are made.
//  - A count (allocation, active, inactive_split, oversize_*) grows by at most 2 per call:
//    its sums cannot reach 2^63 (2^62 calls), so counts are added unchecked.
//  - A decrease takes away what an increase added before (a block's size, requested
//    bytes, a split remainder): amount <= current <= allocated - freed, so freed + amount
//    <= allocated < 2^63. Decreases on the hot path are unchecked.
//  - Byte sums that grow (allocated_bytes, requested_bytes, inactive_split_bytes,
//    reserved_bytes) keep their test: the sizes come from files.
// Seeding (allocator_state.cpp) and the release paths keep the checked updates above.
inline void stat_count_increase(StatArray& a, bool small, int64_t n) {
  stat_increase_unchecked(a.all, n);
  stat_increase_unchecked(small ? a.small_pool : a.large_pool, n);
}
inline void stat_decrease_hot(StatArray& a, bool small, int64_t amount) {
  stat_decrease_unchecked(a.all, amount);
  stat_decrease_unchecked(small ? a.small_pool : a.large_pool, amount);
}
// active / active_bytes equal allocation / allocated_bytes at every step of this
// emulator: without record_stream a block is active exactly while it is allocated (§8; no
// pending frees), the two are changed together by the same amounts everywhere (malloc,
// free, seeding) and reset together. The hot path updates allocation and allocated_bytes
// and copies the two Stats it touched (all and the pool) instead of updating twice more.
inline void stat_copy_touched(StatArray& to, const StatArray& from, bool small) {
  to.all = from.all;
  if (small) to.small_pool = from.small_pool;
  else to.large_pool = from.large_pool;
}

}  // namespace detail

class CachingAllocator::Impl {
 public:
  Impl(const AllocatorConfig& config, DeviceMemory& device);

  // --- public operations (CachingAllocator forwards here) ---
  AllocResult malloc(uint64_t bytes, StreamId stream);
  void free(BlockId id);
  bool free_at(uint64_t address);
  void empty_cache();
  std::vector<BlockId> seed_segment(const SegmentInfo& segment);
  std::vector<SegmentInfo> segments() const;
  uint64_t round_size(uint64_t bytes) const;
  static uint64_t allocation_size(uint64_t rounded);

  AllocatorConfig config;
  MemoryStats stats;
  TraceObserver* observer = nullptr;

  // --- used across the implementation files ---
  detail::Pool& pool_of(bool small) { return small ? small_pool_ : large_pool_; }
  void trace(TraceAction action, uint64_t address, uint64_t size, StreamId stream) {
    if (observer != nullptr) observer->on_trace(TraceEntry{action, address, size, stream});
  }
  void pool_insert(BlockId id);
  void pool_erase(BlockId id);
  void unmapped_insert(BlockId id);
  void unmapped_erase(BlockId id);
  uint64_t try_merge(BlockId dst, BlockId src);

  // malloc steps
  // Where get_free_block() found its block: the entry is left in the index for
  // alloc_found_block() to erase or, when splitting, to re-key in place as the remainder
  // (saves a search and two shifts when the remainder sorts where the block did). `pos`
  // stays valid: malloc() calls nothing that touches a free index in between.
  struct TakenEntry {
    detail::FreeIndex* index = nullptr;  // nullptr: the block is in no free index
    detail::FreeIndex::Pos pos{};
  };
  BlockId get_free_block(detail::Pool& pool, uint64_t size, StreamId stream, TakenEntry& taken);
  BlockId alloc_block(detail::Pool& pool, uint64_t size, uint64_t alloc_size, StreamId stream,
                      bool is_retry);
  bool should_split(const detail::Block& block, uint64_t size) const;
  AllocResult alloc_found_block(BlockId id, uint64_t size, uint64_t orig, bool split,
                                const TakenEntry& taken);
  void free_block(BlockId id);

  // release paths (allocator_release.cpp)
  void garbage_collect_cached_blocks();
  bool release_available_cached_blocks(detail::Pool& pool, uint64_t size, StreamId stream);
  void release_cached_blocks();
  void release_blocks(detail::Pool& pool);
  void release_block(BlockId id);
  OutOfMemory make_oom(uint64_t orig, uint64_t size, uint64_t alloc_size, StreamId stream);

  // expandable segments (expandable_segments.cpp)
  BlockId try_allocate_expandable_block(detail::Pool& pool, uint64_t size, StreamId stream);
  BlockId find_expandable_block(detail::Pool& pool, uint64_t size, StreamId stream);
  bool map_block(BlockId id, uint64_t size);
  void unmap_block(BlockId id);
  void release_expandable_segment(BlockId id);
  uint32_t create_expandable_segment(bool small, StreamId stream, uint64_t base);
  std::vector<BlockId> seed_expandable_run(const SegmentInfo& segment);
  // Creates the blocks of a seeded run `tiling` starting at `start`, linked after `prev`
  // (kNoBlock for a segment's first block): free blocks go to their pool, allocated
  // ones are counted in the stats and appended to `allocated`. `count_inactive_split`:
  // free blocks of a split cudaMalloc segment count as inactive splits (not for
  // expandable runs, as PyTorch). Returns the last block created.
  BlockId create_seeded_blocks(const std::vector<BlockInfo>& tiling, uint64_t start,
                               BlockId prev, const SegmentInfo& segment, uint32_t expandable,
                               bool count_inactive_split, std::vector<BlockId>& allocated);

  bool gc_active() const {
    return config.memory_fraction.has_value() && config.garbage_collection_threshold > 0.0;
  }
  uint64_t allowed_memory_maximum() const;

  void index_insert(BlockId id);
  void index_erase(BlockId id);

  DeviceMemory& device;
  detail::BlockTable blocks;
  detail::Pool small_pool_;
  detail::Pool large_pool_;
  std::vector<detail::ExpandableSegment> expandable_segments;
  uint64_t total_allocated_memory = 0;
  bool plain_rounding = true;  // no roundup_power2_divisions entry > 1: 512-rounding only

  // address -> allocated block, built on the first free_at() and maintained after that,
  // so callers that use BlockIds pay nothing for it.
  bool index_enabled = false;
  std::unordered_map<uint64_t, BlockId> address_index;
};

}  // namespace memsim
