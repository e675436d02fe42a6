// The malloc/free hot path of the caching-allocator emulator (§3, §4, §5 of
// shared/docs/pytorch-allocator.md) and the public CachingAllocator wrappers.
// Nothing here allocates heap memory per event once the block table and the free-set
// arenas are warm, logs, or builds strings; the trace observer is only called when set.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "allocator/allocator_impl.h"

namespace memsim {

void detail::stat_overflow(int64_t current, int64_t amount) {
  throw std::overflow_error(
      "allocator statistics out of range: adding " + std::to_string(amount) + " to " +
      std::to_string(current) + " leaves the int64 range of PyTorch's memory_stats (a size of "
      "2^63 bytes or more, or a sum past 2^63 - 1): no device holds that much");
}

using detail::Block;
using detail::kNoSegment;
using detail::Pool;

CachingAllocator::Impl::Impl(const AllocatorConfig& cfg, DeviceMemory& dev)
    : config(cfg), device(dev) {
  small_pool_.small = true;
  // §2: memory_stats()["max_split_size"] is captured at construction; -1 = unlimited.
  stats.max_split_size = config.max_split_size == AllocatorConfig::kUnlimited
                             ? -1
                             : static_cast<int64_t>(config.max_split_size);
  plain_rounding = std::all_of(config.roundup_power2_divisions.begin(),
                               config.roundup_power2_divisions.end(),
                               [](uint32_t d) { return d <= 1; });
}

namespace {

inline unsigned floor_log2(uint64_t v) { return 63u - static_cast<unsigned>(__builtin_clzll(v)); }

// §3.3: round up to the next of `divisions` equal steps between two powers of two.
uint64_t roundup_power2_next_division(uint64_t size, uint64_t divisions) {
  if ((size & (size - 1)) == 0) return size;
  const uint64_t power2_floor = uint64_t{1} << floor_log2(size);
  // A non-power-of-two division count acts as the power of two below it.
  const uint64_t step = power2_floor >> floor_log2(divisions);
  if (step == 0) return power2_floor << 1;
  const uint64_t floored = size & ~(step - 1);
  return floored == size ? size : floored + step;
}

}  // namespace

// §3.1
uint64_t CachingAllocator::Impl::round_size(uint64_t size) const {
  if (size < kMinBlockSize) return kMinBlockSize;
  if (!plain_rounding) {
    const unsigned log_size = floor_log2(size);
    size_t index = log_size > 20 ? log_size - 20 : 0;  // §3.2: entry 0 covers < 2 MiB
    index = std::min<size_t>(index, 15);
    const uint64_t divisions = config.roundup_power2_divisions[index];
    if (divisions > 1 && size > kMinBlockSize * divisions)
      return roundup_power2_next_division(size, divisions);
  }
  return (size + kMinBlockSize - 1) / kMinBlockSize * kMinBlockSize;
}

// §3.5
uint64_t CachingAllocator::Impl::allocation_size(uint64_t rounded) {
  if (rounded <= kSmallSize) return kSmallBuffer;
  if (rounded < kMinLargeAlloc) return kLargeBuffer;
  return (rounded + kRoundLarge - 1) / kRoundLarge * kRoundLarge;
}

uint64_t CachingAllocator::Impl::allowed_memory_maximum() const {
  if (!config.memory_fraction) return device.total_bytes();
  // PyTorch: static_cast<size_t>(fraction * device_total)
  return static_cast<uint64_t>(*config.memory_fraction *
                               static_cast<double>(device.total_bytes()));
}

void CachingAllocator::Impl::pool_insert(BlockId id) {
  Block& b = blocks[id];
  Pool& pool = pool_of(b.small);
  pool.blocks.of(b.stream).insert(detail::FreeEntry{b.size, b.ptr, id});
  b.in_pool = true;
  b.gc_count_base = pool.get_free_blocks_call_count;  // §4.4: age restarts on insert
}

void CachingAllocator::Impl::pool_erase(BlockId id) {
  Block& b = blocks[id];
  pool_of(b.small).blocks.of(b.stream).erase(b.size, b.ptr);
  b.in_pool = false;
}

void CachingAllocator::Impl::unmapped_insert(BlockId id) {
  Block& b = blocks[id];
  b.upos = pool_of(b.small).unmapped.set().insert(detail::FreeKey{b.stream, b.size, b.ptr, id}).first;
}

void CachingAllocator::Impl::unmapped_erase(BlockId id) {
  Block& b = blocks[id];
  pool_of(b.small).unmapped.set().erase(b.upos);
}

// §4: the exact decision order.
AllocResult CachingAllocator::Impl::malloc(uint64_t orig, StreamId stream) {
  if (orig >= (uint64_t{1} << 60)) {
    // PyTorch raises before touching any state (no trace, no num_ooms).
    AllocResult result;
    OutOfMemory oom;
    oom.requested_bytes = orig;
    oom.device_total = device.total_bytes();
    oom.device_free = device.free_bytes();
    oom.message = "CUDA out of memory. Tried to allocate more than 1EB memory.";
    result.oom = std::move(oom);
    return result;
  }
  const uint64_t size = round_size(orig);
  Pool& pool = pool_of(size <= kSmallSize);  // §3.4: inclusive
  const uint64_t alloc_size = allocation_size(size);

  TakenEntry taken;
  BlockId id = get_free_block(pool, size, stream, taken);
  if (id == kNoBlock) {
    if (gc_active()) garbage_collect_cached_blocks();
    id = alloc_block(pool, size, alloc_size, stream, false);
    if (id == kNoBlock && release_available_cached_blocks(pool, size, stream))
      id = alloc_block(pool, size, alloc_size, stream, false);
    if (id == kNoBlock) {
      release_cached_blocks();
      id = alloc_block(pool, size, alloc_size, stream, true);
    }
    if (id == kNoBlock) {
      AllocResult result;
      result.oom = make_oom(orig, size, alloc_size, stream);
      return result;
    }
  }
  return alloc_found_block(id, size, orig, should_split(blocks[id], size), taken);
}

// §4.2
// The found entry stays in the index (recorded in `taken`); alloc_found_block() removes it.
BlockId CachingAllocator::Impl::get_free_block(Pool& pool, uint64_t size, StreamId stream,
                                               TakenEntry& taken) {
  if (gc_active()) ++pool.get_free_blocks_call_count;
  // One index per stream: a search never sees another stream's blocks (§1).
  detail::FreeIndex* index = pool.blocks.find(stream);
  if (index == nullptr) return kNoBlock;
  detail::FreeIndex::Pos it = index->lower_bound(size, 0);
  if (!index->valid(it)) return kNoBlock;

  // Only blocks of expandable segments need a look at the block itself; without any
  // such segment the block table is not touched here.
  if (!expandable_segments.empty() && blocks[index->id_at(it)].expandable != kNoSegment) {
    if (config.expandable_segments) {
      // Best fit counts the unmapped space after a block as part of its size, so the
      // growing tail of a reservation is passed over for the next-larger block.
      auto expandable_size = [this](BlockId b) {
        const Block& blk = blocks[b];
        uint64_t s = blk.size;
        if (blk.next != kNoBlock && !blocks[blk.next].mapped) s += blocks[blk.next].size;
        return s;
      };
      detail::FreeIndex::Pos next = index->next(it);
      while (blocks[index->at(it).id].expandable != kNoSegment && index->valid(next) &&
             expandable_size(index->at(next).id) < expandable_size(index->at(it).id)) {
        it = next;
        next = index->next(next);
      }
    } else {
      // Expandable segments switched off: only ordinary blocks qualify.
      do {
        it = index->next(it);
      } while (index->valid(it) && blocks[index->at(it).id].expandable != kNoSegment);
      if (!index->valid(it)) return kNoBlock;
    }
  }

  // Oversize rules; the search does not continue past a rejected candidate.
  const uint64_t found_size = index->size_at(it);
  const uint64_t max_split = config.max_split_size;
  if (size < max_split && found_size >= max_split) return kNoBlock;
  if (size >= max_split && found_size >= size + config.max_non_split_rounding) return kNoBlock;

  taken.index = index;
  taken.pos = it;
  return index->id_at(it);
}

// §4.5
BlockId CachingAllocator::Impl::alloc_block(Pool& pool, uint64_t size, uint64_t alloc_size,
                                            StreamId stream, bool is_retry) {
  if (is_retry) ++stats.num_alloc_retries;
  if (config.memory_fraction && total_allocated_memory + alloc_size > allowed_memory_maximum())
    return kNoBlock;
  if (config.expandable_segments) return try_allocate_expandable_block(pool, size, stream);

  const std::optional<uint64_t> ptr = device.cuda_malloc(alloc_size);
  if (!ptr) return kNoBlock;
  total_allocated_memory += alloc_size;
  const BlockId id = blocks.create();
  Block& b = blocks[id];
  b.ptr = *ptr;
  b.size = alloc_size;
  b.stream = stream;
  b.small = pool.small;
  detail::stat_increase(stats.segment, pool.small, 1);
  detail::stat_increase(stats.reserved_bytes, pool.small, static_cast<int64_t>(alloc_size));
  if (alloc_size >= config.max_split_size) detail::stat_increase(stats.oversize_segments, 1);
  ++stats.num_device_alloc;
  trace(TraceAction::segment_alloc, *ptr, alloc_size, stream);
  return id;
}

// §4.8
bool CachingAllocator::Impl::should_split(const Block& block, uint64_t size) const {
  const uint64_t remaining = block.size - size;
  if (block.small || config.expandable_segments) return remaining >= kMinBlockSize;
  return size < config.max_split_size && remaining > kSmallSize;
}

// §4.8: the returned piece is a NEW block object at the low address; the original
// object keeps the high remainder (and its stale requested_size, §9.3).
AllocResult CachingAllocator::Impl::alloc_found_block(BlockId id, uint64_t size, uint64_t orig,
                                                      bool split, const TakenEntry& taken) {
  const bool small = blocks[id].small;
  const bool already_split = blocks[id].is_split();
  const bool expandable = blocks[id].expandable != kNoSegment;
  if (split) {
    const BlockId rem_id = id;
    id = blocks.create();  // may move the table: take references afterwards
    Block& rem = blocks[rem_id];
    Block& nb = blocks[id];
    nb.ptr = rem.ptr;
    nb.size = size;
    nb.stream = rem.stream;
    nb.small = small;
    nb.expandable = rem.expandable;
    nb.prev = rem.prev;
    if (nb.prev != kNoBlock) blocks[nb.prev].next = id;
    nb.next = rem_id;
    rem.prev = id;
    rem.ptr += size;
    rem.size -= size;
    // The remainder keeps the found block's object, pool and stream, so it belongs in the
    // same index; re-keying in place equals erase + insert whenever it succeeds.
    // Otherwise (the remainder moved to a smaller size class: most splits) it is erased
    // and inserted into that same index, which pool_insert would look up again by stream.
    if (taken.index != nullptr) {
      if (!taken.index->rekey(taken.pos, rem.size, rem.ptr)) {
        taken.index->erase(taken.pos);
        taken.index->insert(detail::FreeEntry{rem.size, rem.ptr, rem_id});
      }
      rem.gc_count_base = pool_of(small).get_free_blocks_call_count;  // as pool_insert does
    } else {
      pool_insert(rem_id);
    }
    if (!expandable) {  // §8: expandable blocks never count in inactive_split*
      if (already_split) {
        detail::stat_decrease_hot(stats.inactive_split_bytes, small, static_cast<int64_t>(size));
      } else {
        detail::stat_increase(stats.inactive_split_bytes, small, static_cast<int64_t>(rem.size));
        detail::stat_count_increase(stats.inactive_split, small, 1);
      }
    }
  } else {
    if (taken.index != nullptr) {
      taken.index->erase(taken.pos);
      blocks[id].in_pool = false;
    }
    if (already_split && !expandable) {
      detail::stat_decrease_hot(stats.inactive_split_bytes, small, static_cast<int64_t>(blocks[id].size));
      detail::stat_decrease_hot(stats.inactive_split, small, 1);
    }
  }

  Block& b = blocks[id];
  b.allocated = true;
  b.requested_size = orig;
  trace(TraceAction::alloc, b.ptr, orig, b.stream);
  const auto bytes = static_cast<int64_t>(b.size);
  detail::stat_increase(stats.allocated_bytes, small, bytes);
  detail::stat_count_increase(stats.allocation, small, 1);
  detail::stat_increase(stats.requested_bytes, small, static_cast<int64_t>(orig));
  detail::stat_copy_touched(stats.active, stats.allocation, small);
  detail::stat_copy_touched(stats.active_bytes, stats.allocated_bytes, small);
  if (b.size >= config.max_split_size) detail::stat_increase_unchecked(stats.oversize_allocations, 1);
  if (index_enabled) index_insert(id);

  AllocResult result;
  result.block = id;
  result.address = b.ptr;
  result.size = b.size;
  return result;
}

// §5.1
void CachingAllocator::Impl::free(BlockId id) {
  Block& b = blocks[id];
  b.allocated = false;
  detail::stat_decrease_hot(stats.allocation, b.small, 1);
  detail::stat_decrease_hot(stats.allocated_bytes, b.small, static_cast<int64_t>(b.size));
  trace(TraceAction::free_requested, b.ptr, b.requested_size, b.stream);
  if (b.size >= config.max_split_size) detail::stat_decrease_unchecked(stats.oversize_allocations, 1);
  if (index_enabled) index_erase(id);
  free_block(id);
}

// §5.2: merging keeps the freed block's object; neighbours are destroyed.
void CachingAllocator::Impl::free_block(BlockId id) {
  Block& b = blocks[id];  // the table never moves below: only destroy() is called
  trace(TraceAction::free_completed, b.ptr, b.requested_size, b.stream);
  const uint64_t requested = b.requested_size;
  int64_t net_blocks = 0;
  int64_t net_bytes = 0;
  const BlockId prev = b.prev;
  const BlockId next = b.next;
  if (const uint64_t subsumed = try_merge(id, prev); subsumed > 0) {
    net_blocks -= 1;
    net_bytes -= static_cast<int64_t>(subsumed);
  }
  if (const uint64_t subsumed = try_merge(id, next); subsumed > 0) {
    net_blocks -= 1;
    net_bytes -= static_cast<int64_t>(subsumed);
  }
  pool_insert(id);
  if (b.is_split()) {
    net_blocks += 1;
    net_bytes += static_cast<int64_t>(b.size);
  }
  const bool small = b.small;
  if (b.expandable == kNoSegment) {
    // The net change is applied as one increase or one decrease (§8).
    if (net_blocks > 0) detail::stat_count_increase(stats.inactive_split, small, net_blocks);
    else if (net_blocks < 0) detail::stat_decrease_hot(stats.inactive_split, small, -net_blocks);
    if (net_bytes > 0) detail::stat_increase(stats.inactive_split_bytes, small, net_bytes);
    else if (net_bytes < 0) detail::stat_decrease_hot(stats.inactive_split_bytes, small, -net_bytes);
  }
  // active / active_bytes: free() decreased allocation / allocated_bytes by the same
  // amounts (1, original_size), see stat_copy_touched.
  detail::stat_copy_touched(stats.active, stats.allocation, small);
  detail::stat_copy_touched(stats.active_bytes, stats.allocated_bytes, small);
  detail::stat_decrease_hot(stats.requested_bytes, small, static_cast<int64_t>(requested));
}

// try_merge_blocks: merges free `src` into `dst` (which is in no set) when both have the
// same mapped state. Returns the bytes subsumed, 0 if no merge.
uint64_t CachingAllocator::Impl::try_merge(BlockId dst, BlockId src) {
  if (src == kNoBlock) return 0;
  Block& s = blocks[src];
  Block& d = blocks[dst];
  if (s.allocated || s.mapped != d.mapped) return 0;
  if (d.prev == src) {
    d.ptr = s.ptr;
    d.prev = s.prev;
    if (d.prev != kNoBlock) blocks[d.prev].next = dst;
  } else {
    d.next = s.next;
    if (d.next != kNoBlock) blocks[d.next].prev = dst;
  }
  const uint64_t subsumed = s.size;
  d.size += subsumed;
  if (s.mapped) pool_erase(src);
  else unmapped_erase(src);
  blocks.destroy(src);
  return subsumed;
}

// ---------------------------------------------------------------------------------
// Public wrappers.

CachingAllocator::CachingAllocator(const AllocatorConfig& config, DeviceMemory& device)
    : impl_(std::make_unique<Impl>(config, device)) {}
CachingAllocator::~CachingAllocator() = default;

// malloc and free are flattened (issue #20, the allocator's per-call cost): every call
// they make into this file (get_free_block, alloc_found_block, free_block, pool_insert,
// pool_erase, round_size, ...) is inlined into one frame. Each of those calls cost a
// prologue and epilogue of six saved registers and reloaded the block table and the stats
// after it; for the common case (a cached block found) the whole call is now one function.
// The cold paths in other files (release, expandable segments, the OOM report) stay calls.
__attribute__((flatten)) AllocResult CachingAllocator::malloc(uint64_t bytes, StreamId stream) {
  return impl_->malloc(bytes, stream);
}
__attribute__((flatten)) void CachingAllocator::free(BlockId block) { impl_->free(block); }
bool CachingAllocator::free_at(uint64_t address) { return impl_->free_at(address); }
void CachingAllocator::empty_cache() { impl_->empty_cache(); }
std::vector<BlockId> CachingAllocator::seed_segment(const SegmentInfo& segment) {
  return impl_->seed_segment(segment);
}
const MemoryStats& CachingAllocator::stats() const { return impl_->stats; }
void CachingAllocator::reset_peak_stats() {
  MemoryStats& s = impl_->stats;
  for (StatArray* a : {&s.allocation, &s.segment, &s.active, &s.inactive_split,
                       &s.allocated_bytes, &s.reserved_bytes, &s.active_bytes,
                       &s.inactive_split_bytes, &s.requested_bytes}) {
    a->all.reset_peak();
    a->small_pool.reset_peak();
    a->large_pool.reset_peak();
  }
  s.oversize_allocations.reset_peak();
  s.oversize_segments.reset_peak();
}
std::vector<SegmentInfo> CachingAllocator::segments() const { return impl_->segments(); }
std::vector<SegmentInfo> CachingAllocator::snapshot() {
  std::vector<SegmentInfo> result = impl_->segments();
  uint64_t total_active = 0;
  for (const SegmentInfo& s : result) total_active += s.active_size;
  impl_->trace(TraceAction::snapshot, 0, total_active, 0);
  return result;
}
const AllocatorConfig& CachingAllocator::config() const { return impl_->config; }
void CachingAllocator::set_trace_observer(TraceObserver* observer) { impl_->observer = observer; }
uint64_t CachingAllocator::round_size(uint64_t bytes) const { return impl_->round_size(bytes); }
uint64_t CachingAllocator::allocation_size(uint64_t rounded) {
  return Impl::allocation_size(rounded);
}
uint64_t CachingAllocator::total_allocated_memory() const {
  return impl_->total_allocated_memory;
}
uint64_t CachingAllocator::block_address(BlockId block) const { return impl_->blocks[block].ptr; }

}  // namespace memsim
