// Internal to the allocator emulator: block storage and the ordered free-block pools
// (shared/docs/pytorch-allocator.md §1). Not part of the public contract.
//
// Why this shape: the emulator must sustain >= 20 M malloc/free events per second, so
//  - blocks live in one pooled vector indexed by BlockId (a free list of slots recycles
//    them; no heap allocation per event once warm), and
//  - the free pools are size-class indexes (FreeIndex, free_index.h); the rarely used
//    unmapped sets of expandable mode are std::sets whose nodes come from a per-set free
//    list (NodeArena), and each unmapped block remembers its set iterator.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <set>
#include <vector>

#include "allocator/caching_allocator.h"

namespace memsim::detail {

// Recycles fixed-size nodes for one std::set. Nodes are carved from 64 KiB chunks and
// returned to a singly linked free list; memory is released when the arena dies.
class NodeArena {
 public:
  NodeArena() = default;
  NodeArena(const NodeArena&) = delete;
  NodeArena& operator=(const NodeArena&) = delete;

  void* get(std::size_t bytes) {
    if (node_size_ == 0) node_size_ = bytes < sizeof(void*) ? sizeof(void*) : bytes;
    if (bytes > node_size_) return ::operator new(bytes);  // never happens for std::set
    if (free_ != nullptr) {
      void* p = free_;
      free_ = *static_cast<void**>(free_);
      return p;
    }
    if (chunk_left_ < node_size_) refill();
    void* p = chunk_pos_;
    chunk_pos_ += node_size_;
    chunk_left_ -= node_size_;
    return p;
  }
  void put(void* p, std::size_t bytes) {
    if (bytes > node_size_) { ::operator delete(p); return; }
    *static_cast<void**>(p) = free_;
    free_ = p;
  }

 private:
  void refill() {
    constexpr std::size_t kChunk = 64 * 1024;
    std::size_t align = alignof(std::max_align_t);
    std::size_t stride = (node_size_ + align - 1) / align * align;
    node_size_ = stride;
    chunks_.emplace_back(new std::max_align_t[kChunk / sizeof(std::max_align_t)]);
    chunk_pos_ = reinterpret_cast<char*>(chunks_.back().get());
    chunk_left_ = kChunk;
  }

  std::size_t node_size_ = 0;
  void* free_ = nullptr;
  char* chunk_pos_ = nullptr;
  std::size_t chunk_left_ = 0;
  std::vector<std::unique_ptr<std::max_align_t[]>> chunks_;
};

template <class T>
struct ArenaAllocator {
  using value_type = T;
  NodeArena* arena;
  explicit ArenaAllocator(NodeArena* a) : arena(a) {}
  template <class U>
  ArenaAllocator(const ArenaAllocator<U>& other) : arena(other.arena) {}  // NOLINT
  T* allocate(std::size_t n) { return static_cast<T*>(arena->get(n * sizeof(T))); }
  void deallocate(T* p, std::size_t n) { arena->put(p, n * sizeof(T)); }
  template <class U>
  bool operator==(const ArenaAllocator<U>& o) const { return arena == o.arena; }
  template <class U>
  bool operator!=(const ArenaAllocator<U>& o) const { return arena != o.arena; }
};

// An entry of a free pool. `id` is payload, not part of the order.
struct FreeKey {
  StreamId stream;
  uint64_t size;
  uint64_t ptr;
  BlockId id;
};
// §1/§7.1: unmapped (expandable) blocks ordered by (stream, address).
struct ByAddressOrder {
  bool operator()(const FreeKey& a, const FreeKey& b) const {
    if (a.stream != b.stream) return a.stream < b.stream;
    return a.ptr < b.ptr;
  }
};

template <class Order>
class FreeSet {
 public:
  using Set = std::set<FreeKey, Order, ArenaAllocator<FreeKey>>;
  using iterator = typename Set::iterator;

  FreeSet() : arena_(std::make_unique<NodeArena>()), set_(Order{}, ArenaAllocator<FreeKey>(arena_.get())) {}

  Set& set() { return set_; }
  const Set& set() const { return set_; }

 private:
  std::unique_ptr<NodeArena> arena_;  // declared first: outlives set_
  Set set_;
};
using UnmappedSet = FreeSet<ByAddressOrder>;

inline constexpr uint32_t kNoSegment = UINT32_MAX;

// PyTorch's Block (§1), minus what only matters for record_stream/graphs.
struct Block {
  uint64_t ptr = 0;
  uint64_t size = 0;
  uint64_t requested_size = 0;  // stale after free (§9.3)
  StreamId stream = 0;
  uint64_t gc_count_base = 0;   // §4.4
  UnmappedSet::iterator upos{};  // where it sits in the unmapped set, when unmapped
  BlockId prev = kNoBlock;
  BlockId next = kNoBlock;
  uint32_t expandable = kNoSegment;  // index of its ExpandableSegment, or kNoSegment
  bool small = false;      // pool kind
  bool allocated = false;
  bool mapped = true;      // false only for unmapped expandable ranges
  bool in_pool = false;    // in the pool's free index (mapped free blocks)
  bool live = false;       // slot in use

  bool is_split() const { return prev != kNoBlock || next != kNoBlock; }
};

// Pooled storage of blocks; BlockIds are slot indices, recycled LIFO.
class BlockTable {
 public:
  // Room for kInitialBlocks set aside at construction (288 KiB of address space, written
  // only as slots are used): the table then comes from the constructing thread's heap (a
  // streamed run's main thread, whose heap the memsim executable puts in huge pages:
  // tools/cli/host_malloc.h) instead of the consumer thread's, and is not copied through
  // 1, 2, 4, ... 2048 slots as it grows. A cold cs336-xl run holds 1,879 blocks; growing
  // to them wrote ~290 KiB of fresh pages (71 page faults on the consumer's thread).
  static constexpr std::size_t kInitialBlocks = 4096;
  BlockTable() {
    blocks_.reserve(kInitialBlocks);
    free_slots_.reserve(kInitialBlocks);
  }

  BlockId create() {
    BlockId id;
    if (!free_slots_.empty()) {
      id = free_slots_.back();
      free_slots_.pop_back();
      blocks_[id] = Block{};
    } else {
      id = static_cast<BlockId>(blocks_.size());
      blocks_.emplace_back();
    }
    blocks_[id].live = true;
    return id;
  }
  void destroy(BlockId id) {
    blocks_[id].live = false;
    free_slots_.push_back(id);
  }
  Block& operator[](BlockId id) { return blocks_[id]; }
  const Block& operator[](BlockId id) const { return blocks_[id]; }
  std::size_t capacity() const { return blocks_.size(); }
  bool valid(BlockId id) const { return id < blocks_.size() && blocks_[id].live; }

 private:
  std::vector<Block> blocks_;
  std::vector<BlockId> free_slots_;
};

}  // namespace memsim::detail
