// Inspecting and seeding the allocator state: segments() as torch.cuda.memory._snapshot()
// reports it (§9.2, §9.3), seed_segment() for warm starts, and the lazily built
// address index behind free_at().
#include <algorithm>

#include "allocator/allocator_impl.h"

namespace memsim {

using detail::Block;
using detail::kNoSegment;

// §9.2: one entry per block with no mapped prev, walking `next` while mapped.
std::vector<SegmentInfo> CachingAllocator::Impl::segments() const {
  std::vector<SegmentInfo> result;
  for (BlockId id = 0; id < blocks.capacity(); ++id) {
    const Block& head = blocks[id];
    if (!head.live || !head.mapped) continue;
    if (head.prev != kNoBlock && blocks[head.prev].mapped) continue;
    SegmentInfo seg;
    seg.address = head.ptr;
    seg.stream = head.stream;
    seg.is_small = head.small;
    seg.is_expandable = head.expandable != kNoSegment;
    for (BlockId b = id; b != kNoBlock && blocks[b].mapped; b = blocks[b].next) {
      const Block& blk = blocks[b];
      BlockInfo info;
      info.address = blk.ptr;
      info.size = blk.size;
      info.requested_size = blk.requested_size;
      info.state = blk.allocated ? BlockState::active_allocated : BlockState::inactive;
      seg.total_size += blk.size;
      if (blk.allocated) {
        seg.allocated_size += blk.size;
        seg.active_size += blk.size;
        seg.requested_size += blk.requested_size;
      }
      seg.blocks.push_back(info);
    }
    result.push_back(std::move(seg));
  }
  std::sort(result.begin(), result.end(),
            [](const SegmentInfo& a, const SegmentInfo& b) { return a.address < b.address; });
  return result;
}

namespace {

// The seeded tiling with adjacent inactive blocks merged (free neighbours always merge;
// the merged block keeps the first one's stale requested_size).
std::vector<BlockInfo> merged_tiling(const SegmentInfo& segment) {
  std::vector<BlockInfo> out;
  if (segment.blocks.empty()) {
    BlockInfo whole;
    whole.address = segment.address;
    whole.size = segment.total_size;
    out.push_back(whole);
    return out;
  }
  for (const BlockInfo& b : segment.blocks) {
    const bool free_block = b.state == BlockState::inactive;
    if (free_block && !out.empty() && out.back().state == BlockState::inactive) {
      out.back().size += b.size;
    } else {
      out.push_back(b);
    }
  }
  return out;
}

}  // namespace

std::vector<BlockId> CachingAllocator::Impl::seed_segment(const SegmentInfo& segment) {
  if (segment.is_expandable) return seed_expandable_run(segment);
  const std::vector<BlockInfo> tiling = merged_tiling(segment);
  uint64_t total = 0;
  for (const BlockInfo& b : tiling) total += b.size;
  const bool small = segment.is_small;

  device.adopt(segment.address, total);
  total_allocated_memory += total;
  detail::stat_increase(stats.segment, small, 1);
  detail::stat_increase(stats.reserved_bytes, small, static_cast<int64_t>(total));
  if (total >= config.max_split_size) detail::stat_increase(stats.oversize_segments, 1);
  ++stats.num_device_alloc;

  std::vector<BlockId> allocated;
  create_seeded_blocks(tiling, segment.address, kNoBlock, segment, kNoSegment,
                       /*count_inactive_split=*/tiling.size() > 1, allocated);
  return allocated;
}

BlockId CachingAllocator::Impl::create_seeded_blocks(const std::vector<BlockInfo>& tiling,
                                                     uint64_t start, BlockId prev,
                                                     const SegmentInfo& segment,
                                                     uint32_t expandable,
                                                     bool count_inactive_split,
                                                     std::vector<BlockId>& allocated) {
  const bool small = segment.is_small;
  uint64_t ptr = start;
  for (const BlockInfo& info : tiling) {
    const BlockId id = blocks.create();
    Block& b = blocks[id];
    b.ptr = ptr;
    b.size = info.size;
    b.requested_size = info.requested_size;
    b.stream = segment.stream;
    b.small = small;
    b.expandable = expandable;
    b.prev = prev;
    if (prev != kNoBlock) blocks[prev].next = id;
    prev = id;
    ptr += info.size;
    if (info.state == BlockState::inactive) {
      pool_insert(id);
      if (count_inactive_split) {
        detail::stat_increase(stats.inactive_split, small, 1);
        detail::stat_increase(stats.inactive_split_bytes, small, static_cast<int64_t>(info.size));
      }
      continue;
    }
    blocks[id].allocated = true;
    const auto bytes = static_cast<int64_t>(info.size);
    detail::stat_increase(stats.allocation, small, 1);
    detail::stat_increase(stats.allocated_bytes, small, bytes);
    detail::stat_increase(stats.active, small, 1);
    detail::stat_increase(stats.active_bytes, small, bytes);
    detail::stat_increase(stats.requested_bytes, small, static_cast<int64_t>(info.requested_size));
    if (info.size >= config.max_split_size) detail::stat_increase(stats.oversize_allocations, 1);
    if (index_enabled) index_insert(id);
    allocated.push_back(id);
  }
  return prev;
}

// A mapped run of an expandable reservation: carve it out of the unmapped block that
// contains it (creating the reservation at the run's address if none contains it).
std::vector<BlockId> CachingAllocator::Impl::seed_expandable_run(const SegmentInfo& segment) {
  const bool small = segment.is_small;
  const std::vector<BlockInfo> tiling = merged_tiling(segment);
  uint64_t total = 0;
  for (const BlockInfo& b : tiling) total += b.size;
  const uint64_t start = segment.address;
  const uint64_t end = start + total;

  uint32_t seg_index = kNoSegment;
  for (uint32_t i = 0; i < expandable_segments.size(); ++i) {
    const detail::ExpandableSegment& s = expandable_segments[i];
    if (s.alive && s.small == small && s.stream == segment.stream && start >= s.base &&
        end <= s.base + s.num_pages * s.page)
      seg_index = i;
  }
  if (seg_index == kNoSegment) seg_index = create_expandable_segment(small, segment.stream, start);
  detail::ExpandableSegment& seg = expandable_segments[seg_index];
  const uint64_t first_page = (start - seg.base) / seg.page;
  const uint64_t last_page = (end - seg.base + seg.page - 1) / seg.page;
  seg.set_mapped(first_page, last_page, true);

  // The unmapped block holding [start, end).
  BlockId hole = kNoBlock;
  for (const auto& key : pool_of(small).unmapped.set()) {
    if (key.stream == segment.stream && key.ptr <= start && end <= key.ptr + key.size &&
        blocks[key.id].expandable == seg_index)
      hole = key.id;
  }
  if (hole == kNoBlock) return {};  // overlaps mapped memory: caller error
  unmapped_erase(hole);
  const uint64_t hole_ptr = blocks[hole].ptr;
  const uint64_t hole_end = hole_ptr + blocks[hole].size;
  BlockId before = kNoBlock;
  BlockId after = blocks[hole].next;
  BlockId prev_of_run = blocks[hole].prev;
  if (hole_ptr < start) {  // keep `hole` as the unmapped part before the run
    blocks[hole].size = start - hole_ptr;
    unmapped_insert(hole);
    before = hole;
    prev_of_run = hole;
  } else {
    blocks.destroy(hole);
  }
  if (end < hole_end) {
    const BlockId rest = blocks.create();
    Block& r = blocks[rest];
    r.ptr = end;
    r.size = hole_end - end;
    r.stream = segment.stream;
    r.small = small;
    r.mapped = false;
    r.expandable = seg_index;
    r.next = after;
    if (after != kNoBlock) blocks[after].prev = rest;
    unmapped_insert(rest);
    after = rest;
  }
  (void)before;

  device.adopt(start, total);
  total_allocated_memory += total;
  detail::stat_increase(stats.reserved_bytes, small, static_cast<int64_t>(total));
  ++stats.num_device_alloc;

  std::vector<BlockId> allocated;
  const BlockId prev = create_seeded_blocks(tiling, start, prev_of_run, segment, seg_index,
                                            /*count_inactive_split=*/false, allocated);
  blocks[prev].next = after;
  if (after != kNoBlock) blocks[after].prev = prev;
  return allocated;
}

void CachingAllocator::Impl::index_insert(BlockId id) { address_index[blocks[id].ptr] = id; }
void CachingAllocator::Impl::index_erase(BlockId id) { address_index.erase(blocks[id].ptr); }

bool CachingAllocator::Impl::free_at(uint64_t address) {
  if (!index_enabled) {
    index_enabled = true;
    for (BlockId id = 0; id < blocks.capacity(); ++id)
      if (blocks[id].live && blocks[id].allocated) index_insert(id);
  }
  auto it = address_index.find(address);
  if (it == address_index.end()) return false;
  free(it->second);
  return true;
}

}  // namespace memsim
