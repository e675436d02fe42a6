// Expandable segments (§7): one virtual reservation per (pool kind, stream), backed page
// by page. Unmapped ranges are free blocks with mapped = false kept in the pool's
// `unmapped` set ordered by (stream, address).
#include <algorithm>

#include "allocator/allocator_impl.h"

namespace memsim {

using detail::Block;
using detail::ExpandableSegment;
using detail::kNoSegment;
using detail::Pool;

// §7.1: N = ceil(1.125 x device total / page) pages; the whole range starts as one
// unmapped block. No trace entry, no statistic.
uint32_t CachingAllocator::Impl::create_expandable_segment(bool small, StreamId stream,
                                                           uint64_t base) {
  ExpandableSegment seg;
  seg.page = small ? kSmallBuffer : kLargeBuffer;
  const uint64_t total = device.total_bytes();
  seg.num_pages = (total + total / 8 + seg.page - 1) / seg.page;
  if (seg.num_pages == 0) seg.num_pages = 1;
  seg.base = base != 0 ? base : device.reserve_address_space(seg.num_pages * seg.page);
  seg.stream = stream;
  seg.small = small;
  seg.alive = true;
  seg.mapped_pages.clear();  // grown as pages are mapped (ExpandableSegment::set_mapped)
  const auto index = static_cast<uint32_t>(expandable_segments.size());
  expandable_segments.push_back(std::move(seg));

  const BlockId id = blocks.create();
  Block& b = blocks[id];
  b.ptr = expandable_segments[index].base;
  b.size = expandable_segments[index].num_pages * expandable_segments[index].page;
  b.stream = stream;
  b.small = small;
  b.mapped = false;
  b.expandable = index;
  unmapped_insert(id);
  return index;
}

// §7.2 step 1: the lowest-addressed run of free/unmapped blocks (starting at an unmapped
// block, or at the free block just before it) that adds up to `size`.
BlockId CachingAllocator::Impl::find_expandable_block(Pool& pool, uint64_t size,
                                                      StreamId stream) {
  auto allocatable = [this](BlockId b) { return b != kNoBlock && !blocks[b].allocated; };
  auto has_space = [&](BlockId b) {
    uint64_t bytes = 0;
    while (bytes < size && allocatable(b)) {
      bytes += blocks[b].size;
      b = blocks[b].next;
    }
    return bytes >= size;
  };
  auto& set = pool.unmapped.set();
  for (auto it = set.lower_bound(detail::FreeKey{stream, 0, 0, 0});
       it != set.end() && it->stream == stream; ++it) {
    BlockId c = it->id;
    if (allocatable(blocks[c].prev)) c = blocks[c].prev;
    if (has_space(c)) return c;
  }
  const uint32_t seg = create_expandable_segment(pool.small, stream, 0);
  // The new reservation's single unmapped block is the last one created.
  auto it = set.lower_bound(detail::FreeKey{stream, 0, expandable_segments[seg].base, 0});
  return it->id;
}

// §7.2
BlockId CachingAllocator::Impl::try_allocate_expandable_block(Pool& pool, uint64_t size,
                                                              StreamId stream) {
  BlockId c = find_expandable_block(pool, size, stream);
  if (!blocks[c].mapped && !map_block(c, std::min(blocks[c].size, size))) return kNoBlock;
  while (blocks[c].size < size) {
    // invariant: c is free and mapped, its next is unmapped; mapping merges c into it.
    const uint64_t remaining = size - blocks[c].size;
    const BlockId next = blocks[c].next;
    if (!map_block(next, std::min(remaining, blocks[next].size))) return kNoBlock;
    c = next;
  }
  pool_erase(c);
  return c;
}

// §7.2 step 3: map whole pages at the start of unmapped block `id`; the mapped part
// becomes a free block merged with free mapped neighbours.
bool CachingAllocator::Impl::map_block(BlockId id, uint64_t size) {
  const uint32_t seg_index = blocks[id].expandable;
  ExpandableSegment& seg = expandable_segments[seg_index];
  const uint64_t ptr = blocks[id].ptr;
  const uint64_t begin = (ptr - seg.base) / seg.page;
  const uint64_t end = (ptr + size - seg.base + seg.page - 1) / seg.page;
  if (begin >= end) return false;
  const uint64_t bytes = (end - begin) * seg.page;
  if (!device.map_pages(seg.base + begin * seg.page, bytes)) return false;
  seg.set_mapped(begin, end, true);

  unmapped_erase(id);
  blocks[id].mapped = true;
  if (bytes < blocks[id].size) {
    const BlockId rest = blocks.create();  // may move the table
    Block& b = blocks[id];
    Block& r = blocks[rest];
    r.ptr = b.ptr + bytes;
    r.size = b.size - bytes;
    r.stream = b.stream;
    r.small = b.small;
    r.mapped = false;
    r.expandable = seg_index;
    r.prev = id;
    r.next = b.next;
    if (r.next != kNoBlock) blocks[r.next].prev = rest;
    b.next = rest;
    b.size = bytes;
    unmapped_insert(rest);
  }
  try_merge(id, blocks[id].prev);
  try_merge(id, blocks[id].next);
  pool_insert(id);

  const bool small = blocks[id].small;
  total_allocated_memory += bytes;
  detail::stat_increase(stats.reserved_bytes, small, static_cast<int64_t>(bytes));
  ++stats.num_device_alloc;
  trace(TraceAction::segment_map, ptr, bytes, blocks[id].stream);
  return true;
}

// §7.5: unmap the pages lying entirely inside free block `id`; partial pages at either
// end stay mapped as new free blocks.
void CachingAllocator::Impl::unmap_block(BlockId id) {
  const uint32_t seg_index = blocks[id].expandable;
  ExpandableSegment& seg = expandable_segments[seg_index];
  const uint64_t ptr = blocks[id].ptr;
  const uint64_t size = blocks[id].size;
  const uint64_t begin = (ptr - seg.base + seg.page - 1) / seg.page;
  const uint64_t end = (ptr + size - seg.base) / seg.page;
  if (begin >= end) return;
  const uint64_t uptr = seg.base + begin * seg.page;
  const uint64_t usize = (end - begin) * seg.page;
  device.unmap_pages(uptr, usize);
  seg.set_mapped(begin, end, false);
  pool_erase(id);

  const uint64_t before = uptr - ptr;
  if (before > 0) {
    const BlockId bf = blocks.create();
    Block& b = blocks[id];
    Block& f = blocks[bf];
    f.ptr = ptr;
    f.size = before;
    f.stream = b.stream;
    f.small = b.small;
    f.expandable = seg_index;
    f.prev = b.prev;
    f.next = id;
    if (f.prev != kNoBlock) blocks[f.prev].next = bf;
    b.prev = bf;
    pool_insert(bf);
  }
  const uint64_t after = size - (before + usize);
  if (after > 0) {
    const BlockId af = blocks.create();
    Block& b = blocks[id];
    Block& f = blocks[af];
    f.ptr = uptr + usize;
    f.size = after;
    f.stream = b.stream;
    f.small = b.small;
    f.expandable = seg_index;
    f.prev = id;
    f.next = b.next;
    if (f.next != kNoBlock) blocks[f.next].prev = af;
    b.next = af;
    pool_insert(af);
  }
  Block& b = blocks[id];
  b.ptr = uptr;
  b.size = usize;
  b.mapped = false;
  try_merge(id, b.prev);
  try_merge(id, blocks[id].next);
  unmapped_insert(id);

  const bool small = blocks[id].small;
  total_allocated_memory -= usize;
  detail::stat_decrease(stats.reserved_bytes, small, static_cast<int64_t>(usize));
  ++stats.num_device_free;
  trace(TraceAction::segment_unmap, uptr, usize, blocks[id].stream);
}

// A reservation that is entirely unmapped is destroyed (no trace entry).
void CachingAllocator::Impl::release_expandable_segment(BlockId id) {
  Block& b = blocks[id];
  if (b.mapped) return;
  expandable_segments[b.expandable].alive = false;
  unmapped_erase(id);
  blocks.destroy(id);
}

}  // namespace memsim
