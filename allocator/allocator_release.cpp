// Giving memory back to the device, and the out-of-memory result
// (§4.4 garbage collection, §4.6 release_available_cached_blocks, §4.7 OOM,
// §6 release_cached_blocks / empty_cache).
#include <vector>

#include "allocator/allocator_impl.h"
#include "allocator/units.h"

namespace memsim {

using detail::Block;
using detail::kNoSegment;
using detail::Pool;

// §6.2: one cudaFree of a whole, free, ordinary segment.
void CachingAllocator::Impl::release_block(BlockId id) {
  Block& b = blocks[id];
  ++stats.num_device_free;
  trace(TraceAction::segment_free, b.ptr, b.size, b.stream);
  device.cuda_free(b.ptr, b.size);
  total_allocated_memory -= b.size;
  detail::stat_decrease(stats.segment, b.small, 1);
  detail::stat_decrease(stats.reserved_bytes, b.small, static_cast<int64_t>(b.size));
  if (b.size >= config.max_split_size) detail::stat_decrease(stats.oversize_segments, 1);
  pool_erase(id);
  blocks.destroy(id);
}

// §6.1 step 2: whole ordinary segments are freed in (stream, size, address) order;
// free blocks of expandable segments are gathered first, then unmapped (§7.5).
void CachingAllocator::Impl::release_blocks(Pool& pool) {
  // Releasing a whole segment removes only that block from the pool, so gathering the
  // pool's order first and then releasing is the same as PyTorch's erase-while-walking.
  std::vector<BlockId> order;
  for (const auto& [stream, index] : pool.blocks.streams())
    index->for_each([&order](const detail::FreeEntry& e) { order.push_back(e.id); });
  std::vector<BlockId> to_unmap;
  for (BlockId id : order) {
    const Block& b = blocks[id];
    if (b.expandable != kNoSegment) {
      to_unmap.push_back(id);
    } else if (!b.is_split()) {
      release_block(id);
    }
  }
  for (BlockId id : to_unmap) {
    unmap_block(id);
    if (!blocks[id].is_split()) release_expandable_segment(id);
  }
}

// §6.1 (no MemPools, no cross-stream events: synchronising only counts).
void CachingAllocator::Impl::release_cached_blocks() {
  ++stats.num_sync_all_streams;
  release_blocks(large_pool_);
  release_blocks(small_pool_);
}

void CachingAllocator::Impl::empty_cache() { release_cached_blocks(); }

// §4.6: only with a max_split_size set; frees one big enough cached block, or several
// oversize ones, largest first.
bool CachingAllocator::Impl::release_available_cached_blocks(Pool& pool, uint64_t size,
                                                             StreamId stream) {
  const uint64_t max_split = config.max_split_size;
  if (max_split == AllocatorConfig::kUnlimited) return false;
  const uint64_t key_size = size < max_split ? max_split : size;
  detail::FreeIndex* index = pool.blocks.find(stream);
  if (index == nullptr || index->empty()) return false;
  detail::FreeIndex::Pos it = index->lower_bound(key_size, 0);
  if (!index->valid(it) || blocks[index->at(it).id].expandable != kNoSegment) {
    // No single block is big enough: release oversize blocks, largest first. Walk back
    // from the search position (staying on this stream), then release in that order.
    std::vector<BlockId> victims;
    uint64_t released = 0;
    if (!index->prev(it)) return false;
    while (released < key_size && index->at(it).size >= max_split) {
      const detail::FreeEntry e = index->at(it);
      if (blocks[e.id].expandable == kNoSegment) {
        // v2.6 reads the size after freeing the block; the intent is this size.
        victims.push_back(e.id);
        released += e.size;
      }
      if (!index->prev(it)) break;
    }
    for (BlockId id : victims) release_block(id);
    if (released < key_size) return false;
  } else {
    release_block(index->at(it).id);
  }
  return true;
}

// §4.4: free whole cached large segments whose age (get_free_block calls since they were
// cached) is at least the average, until the fraction's threshold is met.
void CachingAllocator::Impl::garbage_collect_cached_blocks() {
  const auto gc_threshold = static_cast<uint64_t>(
      config.garbage_collection_threshold * static_cast<double>(allowed_memory_maximum()));
  if (total_allocated_memory <= gc_threshold) return;
  const uint64_t target = total_allocated_memory - gc_threshold;
  uint64_t reclaimed = 0;

  const uint64_t calls = large_pool_.get_free_blocks_call_count;
  auto large_blocks_in_order = [this]() {
    std::vector<BlockId> order;
    for (const auto& [stream, index] : large_pool_.blocks.streams())
      index->for_each([&order](const detail::FreeEntry& e) { order.push_back(e.id); });
    return order;
  };
  uint64_t total_age = 0;
  int64_t freeable = 0;
  for (BlockId id : large_blocks_in_order()) {
    const Block& b = blocks[id];
    if (!b.is_split()) {
      total_age += calls - b.gc_count_base;
      ++freeable;
    }
  }
  if (freeable == 0) return;

  bool freed = true;
  while (reclaimed < target && freed && freeable > 0) {
    const double age_threshold = static_cast<double>(total_age) / static_cast<double>(freeable);
    freed = false;
    // The pass does not stop when the target is reached.
    for (BlockId id : large_blocks_in_order()) {
      const Block& b = blocks[id];
      const uint64_t age = calls - b.gc_count_base;
      if (!b.is_split() && b.expandable == kNoSegment &&
          static_cast<double>(age) >= age_threshold) {
        freed = true;
        reclaimed += b.size;
        total_age -= age;
        --freeable;
        release_block(id);
      }
    }
  }
}

// §4.7: reached after the whole cache was flushed; emits the `oom` trace entry.
OutOfMemory CachingAllocator::Impl::make_oom(uint64_t orig, uint64_t size, uint64_t alloc_size,
                                             StreamId stream) {
  OutOfMemory oom;
  oom.requested_bytes = orig;
  oom.rounded_bytes = size;
  oom.alloc_size = alloc_size;
  oom.device_free = device.free_bytes();
  oom.device_total = device.total_bytes();
  trace(TraceAction::oom, oom.device_free, size, stream);
  ++stats.num_ooms;
  oom.allocated_bytes = static_cast<uint64_t>(stats.allocated_bytes.all.current);
  oom.reserved_bytes = static_cast<uint64_t>(stats.reserved_bytes.all.current);
  // No private pools are modelled, so nothing is "allocated in private pools".
  std::string allowed_info;
  if (config.memory_fraction)
    allowed_info = torch_format_size(allowed_memory_maximum()) + " allowed; ";
  oom.message = "CUDA out of memory. Tried to allocate " + torch_format_size(alloc_size) +
                ". GPU 0 has a total capacity of " + torch_format_size(oom.device_total) +
                " of which " + torch_format_size(oom.device_free) + " is free. " +
                allowed_info + "Of the allocated memory " +
                torch_format_size(oom.allocated_bytes) + " is allocated by PyTorch, and " +
                torch_format_size(oom.reserved_bytes - oom.allocated_bytes) +
                " is reserved by PyTorch but unallocated. If reserved but unallocated memory "
                "is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to "
                "avoid fragmentation.  See documentation for Memory Management  "
                "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)";
  return oom;
}

}  // namespace memsim
