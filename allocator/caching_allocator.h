// An emulator of PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp,
// reference v2.6), byte-exact for a sequence of malloc/free requests on known streams.
// The rules are specified in shared/docs/pytorch-allocator.md; section numbers (§) below
// refer to it.
//
// Contract:
//  - malloc() returns either a block (address, rounded size) or an OOM result carrying
//    PyTorch's numbers and message; it never throws for out-of-memory.
//  - Physical memory comes from a DeviceMemory (cudaMalloc/cudaFree model): a simulated
//    device with a capacity, or, when replaying a real trace, the trace's own addresses.
//  - BlockId handles are stable while the block is allocated; free() takes the handle,
//    so the hot path needs no address lookup. free_at(address) exists for callers that
//    only know addresses (it costs a hash lookup).
//  - Not thread-safe; one instance models one device.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "allocator/allocator_config.h"
#include "allocator/memory_stats.h"

namespace memsim {

using StreamId = uint64_t;  // cudaStream_t as an integer; 0 = default stream
using BlockId = uint32_t;
inline constexpr BlockId kNoBlock = UINT32_MAX;

// Model of cudaMalloc / cudaFree / cuMemCreate underneath the allocator (§12).
class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  // Returns the address of a new `bytes`-long range, or nullopt when the device is full.
  virtual std::optional<uint64_t> cuda_malloc(uint64_t bytes) = 0;
  virtual void cuda_free(uint64_t address, uint64_t bytes) = 0;
  // cudaMemGetInfo: bytes free and the device total (used by the OOM message).
  virtual uint64_t free_bytes() const = 0;
  virtual uint64_t total_bytes() const = 0;

  // Expandable segments (§7, §12). A reservation is virtual address space only; pages
  // are backed one map at a time. The defaults hand out reservations in a high address
  // range, accept a map iff free_bytes() covers it, and do no accounting; models that
  // track capacity (SimulatedDevice, the replay device) override them.
  virtual uint64_t reserve_address_space(uint64_t bytes);
  virtual bool map_pages(uint64_t address, uint64_t bytes);
  virtual void unmap_pages(uint64_t address, uint64_t bytes);
  // A cudaMalloc made before the allocator was seeded (seed_segment): account for it.
  virtual void adopt(uint64_t address, uint64_t bytes);

 private:
  uint64_t next_reservation_ = 0x7f0000000000ull;
};

// A device with `total` bytes of which `reserved_outside` (CUDA context, other
// processes, NCCL) is unavailable to the allocator. Hands out 2 MiB-aligned addresses.
class SimulatedDevice final : public DeviceMemory {
 public:
  SimulatedDevice(uint64_t total, uint64_t reserved_outside);
  std::optional<uint64_t> cuda_malloc(uint64_t bytes) override;
  void cuda_free(uint64_t address, uint64_t bytes) override;
  uint64_t free_bytes() const override;
  uint64_t total_bytes() const override { return total_; }
  uint64_t reserve_address_space(uint64_t bytes) override;
  bool map_pages(uint64_t address, uint64_t bytes) override;
  void unmap_pages(uint64_t address, uint64_t bytes) override;
  void adopt(uint64_t address, uint64_t bytes) override;

 private:
  uint64_t total_;
  uint64_t used_;
  uint64_t next_address_;
  uint64_t next_reservation_ = 0x7f0000000000ull;
};

// The failing request of an out-of-memory (§4.7).
struct OutOfMemory {
  uint64_t requested_bytes = 0;   // what the caller asked for
  uint64_t rounded_bytes = 0;     // round_size(requested): what the `oom` trace prints
  uint64_t alloc_size = 0;        // would-be segment: what "Tried to allocate" prints
  uint64_t device_total = 0;
  uint64_t device_free = 0;
  uint64_t allocated_bytes = 0;   // after the cache flush
  uint64_t reserved_bytes = 0;    // after the cache flush
  std::string message;            // PyTorch's OutOfMemoryError text, verbatim
};

// std::optional's interface for the OOM details, stored out of line: malloc() returns an
// AllocResult per event, and an inline OutOfMemory (strings and eight counters) made each
// result ~120 bytes to zero and destroy on the hot path. Empty = one null pointer.
// Copies are deep, as std::optional's.
class OomDetails {
 public:
  OomDetails() = default;
  OomDetails(const OomDetails& other)
      : p_(other.p_ ? std::make_unique<OutOfMemory>(*other.p_) : nullptr) {}
  OomDetails(OomDetails&&) noexcept = default;
  OomDetails& operator=(const OomDetails& other) {
    if (this != &other) p_ = other.p_ ? std::make_unique<OutOfMemory>(*other.p_) : nullptr;
    return *this;
  }
  OomDetails& operator=(OomDetails&&) noexcept = default;
  OomDetails& operator=(OutOfMemory oom) {
    p_ = std::make_unique<OutOfMemory>(std::move(oom));
    return *this;
  }
  bool has_value() const { return p_ != nullptr; }
  explicit operator bool() const { return p_ != nullptr; }
  OutOfMemory& operator*() { return *p_; }
  const OutOfMemory& operator*() const { return *p_; }
  OutOfMemory* operator->() { return p_.get(); }
  const OutOfMemory* operator->() const { return p_.get(); }
  const OutOfMemory& value() const {
    if (!p_) throw std::bad_optional_access();
    return *p_;
  }
  void reset() { p_.reset(); }

 private:
  std::unique_ptr<OutOfMemory> p_;
};

struct AllocResult {
  BlockId block = kNoBlock;       // kNoBlock on OOM
  uint64_t address = 0;
  uint64_t size = 0;              // rounded block size as handed out (may exceed request)
  OomDetails oom;                 // set on OOM only
  bool ok() const { return block != kNoBlock; }
};

// One entry of the allocator's trace (§9.4), emitted to an optional observer.
enum class TraceAction : uint8_t {
  alloc, free_requested, free_completed, segment_alloc, segment_free,
  segment_map, segment_unmap, oom, snapshot
};
const char* to_string(TraceAction action);
struct TraceEntry {
  TraceAction action;
  uint64_t address;  // for oom: device_free
  uint64_t size;
  StreamId stream;
};
class TraceObserver {
 public:
  virtual ~TraceObserver() = default;
  virtual void on_trace(const TraceEntry& entry) = 0;
};

// Snapshot-level view of the allocator state (§9.2).
enum class BlockState : uint8_t { active_allocated, active_pending_free, inactive };
const char* to_string(BlockState state);
struct BlockInfo {
  uint64_t address = 0;
  uint64_t size = 0;
  uint64_t requested_size = 0;  // stale for inactive blocks, as PyTorch keeps it (§9.3)
  BlockState state = BlockState::inactive;
};
struct SegmentInfo {
  uint64_t address = 0;
  uint64_t total_size = 0;
  uint64_t allocated_size = 0;
  uint64_t active_size = 0;
  uint64_t requested_size = 0;
  StreamId stream = 0;
  bool is_small = false;        // segment_type 'small' / 'large'
  bool is_expandable = false;
  std::vector<BlockInfo> blocks;  // address order
};

class CachingAllocator {
 public:
  // `device` must outlive the allocator.
  CachingAllocator(const AllocatorConfig& config, DeviceMemory& device);
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // torch's malloc (§4). `bytes` > 0.
  AllocResult malloc(uint64_t bytes, StreamId stream = 0);
  // torch's free (§5) of a block returned by malloc.
  void free(BlockId block);
  // Frees the allocated block starting at `address`; false if there is none.
  bool free_at(uint64_t address);
  // torch.cuda.empty_cache() (§6.1).
  void empty_cache();

  // Seeds state for a trace that starts warm (replay): adds a segment that cudaMalloc
  // returned earlier, tiled by `blocks` (address order; allocated blocks get BlockIds,
  // returned in order for the allocated ones). Adjacent inactive blocks are merged, as
  // the allocator would have. Statistics count the segment and its blocks as if they had
  // been allocated; no trace entries are emitted; the device is told via adopt().
  // An expandable segment (is_expandable) is a mapped run: the first run seeded for a
  // (pool kind, stream) starts a new reservation at its address (§7.1, sized from the
  // device total); a later run inside that reservation is placed into it.
  std::vector<BlockId> seed_segment(const SegmentInfo& segment);

  const MemoryStats& stats() const;
  void reset_peak_stats();
  std::vector<SegmentInfo> segments() const;  // address order
  // torch.cuda.memory._snapshot()'s segment walk: segments(), then a `snapshot` trace entry
  // (address 0, size = total active bytes, stream 0) as PyTorch records it (§9.4).
  std::vector<SegmentInfo> snapshot();
  const AllocatorConfig& config() const;
  // Bytes obtained from the device (segments plus mapped pages): what the memory
  // fraction and garbage collection compare against (§1).
  uint64_t total_allocated_memory() const;
  // Address of a block returned by malloc (valid while it is allocated).
  uint64_t block_address(BlockId block) const;

  // Optional observer of every trace entry (pass nullptr to detach). Not owned.
  void set_trace_observer(TraceObserver* observer);

  // Rounding helpers (§3), exposed for tests and reports.
  uint64_t round_size(uint64_t bytes) const;
  static uint64_t allocation_size(uint64_t rounded);

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace memsim
