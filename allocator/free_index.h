// Internal to the allocator emulator: the ordered index of free blocks of one pool and
// one stream, ordered by (size, address) (§1: a pool is ordered by (stream, size,
// address); one FreeIndex per stream gives the same order and the same "never another
// stream's block" search).
//
// Why not std::set: the emulator must run >= 20 M events/s, and a red-black tree with
// hundreds to thousands of free blocks spends its time in cache misses. This is a
// two-level B-tree: sorted buckets of at most kCap entries, plus a contiguous array of
// each bucket's last key for the first-level binary search. Insert/erase shift at most
// one bucket; positions are (bucket, slot) and are invalidated by any modification.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

namespace memsim::detail {

struct FreeEntry {
  uint64_t size;
  uint64_t ptr;
  uint32_t id;
};

// (size, address) packed as one 128-bit unsigned key, so an ordered comparison is a
// single compare instead of two dependent branches.
__extension__ typedef unsigned __int128 FreeKey128;
inline FreeKey128 pack_key(uint64_t size, uint64_t ptr) {
  return (static_cast<FreeKey128>(size) << 64) | ptr;
}

class FreeIndex {
 public:
  static constexpr uint32_t kCap = 32;

  struct Pos {
    uint32_t bucket;
    uint32_t slot;
  };

  bool empty() const { return order_.empty(); }
  size_t size() const { return count_; }
  Pos begin() const { return {0, 0}; }
  bool valid(Pos p) const { return p.bucket < order_.size(); }
  FreeEntry at(Pos p) const {
    const Bucket& bk = bucket(p.bucket);
    return {static_cast<uint64_t>(bk.key[p.slot] >> 64), static_cast<uint64_t>(bk.key[p.slot]),
            bk.id[p.slot]};
  }
  Pos next(Pos p) const {
    if (p.slot + 1 < bucket(p.bucket).n) return {p.bucket, p.slot + 1};
    return {p.bucket + 1, 0};
  }
  // Precondition: p is valid or the end position; returns false at the very first entry.
  bool prev(Pos& p) const {
    if (p.bucket < order_.size() && p.slot > 0) {
      --p.slot;
      return true;
    }
    if (p.bucket == 0) return false;
    --p.bucket;
    p.slot = bucket(p.bucket).n - 1;
    return true;
  }

  // First entry with (size, ptr) >= the key; invalid (end) if none.
  Pos lower_bound(uint64_t size, uint64_t ptr) const {
    const FreeKey128 key = pack_key(size, ptr);
    const uint32_t b = search(last_.data(), static_cast<uint32_t>(last_.size()), key);
    if (b == order_.size()) return {b, 0};
    const Bucket& bk = bucket(b);
    return {b, search(bk.key, bk.n, key)};  // < n: the bucket's last key >= key
  }

  void insert(const FreeEntry& entry) {
    ++count_;
    const FreeKey128 key = pack_key(entry.size, entry.ptr);
    if (order_.empty()) {
      const uint32_t id = new_bucket();
      order_.push_back(id);
      last_.push_back(key);
      storage_[id].key[0] = key;
      storage_[id].id[0] = entry.id;
      storage_[id].n = 1;
      return;
    }
    uint32_t b = search(last_.data(), static_cast<uint32_t>(last_.size()), key);
    if (b == order_.size()) b = static_cast<uint32_t>(order_.size() - 1);
    if (bucket(b).n == kCap) {
      split(b);
      if (last_[b] < key) ++b;
    }
    Bucket& bk = bucket(b);
    const uint32_t lo = search(bk.key, bk.n, key);
    std::memmove(&bk.key[lo + 1], &bk.key[lo], (bk.n - lo) * sizeof(FreeKey128));
    std::memmove(&bk.id[lo + 1], &bk.id[lo], (bk.n - lo) * sizeof(uint32_t));
    bk.key[lo] = key;
    bk.id[lo] = entry.id;
    ++bk.n;
    if (lo + 1 == bk.n) last_[b] = key;
  }

  void erase(Pos p) {
    --count_;
    Bucket& bk = bucket(p.bucket);
    std::memmove(&bk.key[p.slot], &bk.key[p.slot + 1], (bk.n - p.slot - 1) * sizeof(FreeKey128));
    std::memmove(&bk.id[p.slot], &bk.id[p.slot + 1], (bk.n - p.slot - 1) * sizeof(uint32_t));
    --bk.n;
    if (bk.n == 0) {
      free_buckets_.push_back(order_[p.bucket]);
      order_.erase(order_.begin() + p.bucket);
      last_.erase(last_.begin() + p.bucket);
      return;
    }
    if (p.slot == bk.n) last_[p.bucket] = bk.key[bk.n - 1];
    // Keep buckets reasonably full so the first level stays short.
    if (bk.n < kCap / 4 && p.bucket + 1 < order_.size() &&
        bk.n + bucket(p.bucket + 1).n <= kCap / 2)
      merge_with_next(p.bucket);
  }

  // Gives the entry at p the key (size, ptr) in place when that keeps the order, i.e. the
  // new key lies strictly between p's neighbours; false (nothing changed) otherwise.
  // Exact: the entries then hold the same keys in the same order as erase(p) followed by
  // insert() would leave (only the bucket layout, which nothing observes, may differ).
  bool rekey(Pos p, uint64_t size, uint64_t ptr) {
    const FreeKey128 key = pack_key(size, ptr);
    Bucket& bk = bucket(p.bucket);
    if (p.slot > 0 ? !(bk.key[p.slot - 1] < key) : p.bucket > 0 && !(last_[p.bucket - 1] < key))
      return false;
    const bool last_in_bucket = p.slot + 1 == bk.n;
    if (!last_in_bucket ? !(key < bk.key[p.slot + 1])
                        : p.bucket + 1 < order_.size() && !(key < bucket(p.bucket + 1).key[0]))
      return false;
    bk.key[p.slot] = key;
    if (last_in_bucket) last_[p.bucket] = key;
    return true;
  }

  // Erases the entry with exactly this key; false if absent.
  bool erase(uint64_t size, uint64_t ptr) {
    const Pos p = lower_bound(size, ptr);
    if (!valid(p) || bucket(p.bucket).key[p.slot] != pack_key(size, ptr)) return false;
    erase(p);
    return true;
  }

  template <class F>
  void for_each(F&& f) const {
    for (uint32_t b = 0; b < order_.size(); ++b)
      for (uint32_t i = 0; i < bucket(b).n; ++i) f(at({b, i}));
  }

 private:
  // Structure of arrays: the searches touch only the keys.
  struct Bucket {
    FreeKey128 key[kCap];
    uint32_t id[kCap];
    uint32_t n = 0;
  };

  Bucket& bucket(uint32_t b) { return storage_[order_[b]]; }
  const Bucket& bucket(uint32_t b) const { return storage_[order_[b]]; }

  // Branch-free lower_bound (conditional moves): the comparisons are data-dependent and
  // would mispredict as branches.
  static uint32_t search(const FreeKey128* first, uint32_t n, FreeKey128 key) {
    if (n == 0) return 0;
    const FreeKey128* base = first;
    while (n > 1) {
      const uint32_t half = n / 2;
      base = base[half - 1] < key ? base + half : base;
      n -= half;
    }
    return static_cast<uint32_t>(base - first) + (*base < key ? 1u : 0u);
  }

  uint32_t new_bucket() {
    if (!free_buckets_.empty()) {
      const uint32_t id = free_buckets_.back();
      free_buckets_.pop_back();
      storage_[id].n = 0;
      return id;
    }
    storage_.emplace_back();
    return static_cast<uint32_t>(storage_.size() - 1);
  }

  void split(uint32_t b) {
    const uint32_t upper_id = new_bucket();  // may move storage_: take references after
    Bucket& lower = bucket(b);
    Bucket& upper = storage_[upper_id];
    const uint32_t keep = lower.n / 2;
    upper.n = lower.n - keep;
    std::memcpy(upper.key, &lower.key[keep], upper.n * sizeof(FreeKey128));
    std::memcpy(upper.id, &lower.id[keep], upper.n * sizeof(uint32_t));
    lower.n = keep;
    const FreeKey128 upper_last = last_[b];
    last_[b] = lower.key[keep - 1];
    order_.insert(order_.begin() + b + 1, upper_id);
    last_.insert(last_.begin() + b + 1, upper_last);
  }

  void merge_with_next(uint32_t b) {
    Bucket& lower = bucket(b);
    Bucket& upper = bucket(b + 1);
    std::memcpy(&lower.key[lower.n], upper.key, upper.n * sizeof(FreeKey128));
    std::memcpy(&lower.id[lower.n], upper.id, upper.n * sizeof(uint32_t));
    lower.n += upper.n;
    last_[b] = last_[b + 1];
    free_buckets_.push_back(order_[b + 1]);
    order_.erase(order_.begin() + b + 1);
    last_.erase(last_.begin() + b + 1);
  }

  std::vector<Bucket> storage_;
  std::vector<uint32_t> free_buckets_;
  std::vector<uint32_t> order_;    // bucket ids in key order
  std::vector<FreeKey128> last_;   // last key of each bucket, in key order
  size_t count_ = 0;
};

// A pool's free blocks: one FreeIndex per stream, streams in ascending order, so that
// iterating streams then entries visits blocks in (stream, size, address) order.
class StreamFreeIndex {
 public:
  FreeIndex* find(uint64_t stream) {
    if (last_ < streams_.size() && streams_[last_].first == stream) return streams_[last_].second.get();
    for (size_t i = 0; i < streams_.size(); ++i) {
      if (streams_[i].first == stream) {
        last_ = i;
        return streams_[i].second.get();
      }
    }
    return nullptr;
  }
  FreeIndex& of(uint64_t stream) {
    if (FreeIndex* f = find(stream)) return *f;
    size_t i = 0;
    while (i < streams_.size() && streams_[i].first < stream) ++i;
    streams_.emplace(streams_.begin() + static_cast<std::ptrdiff_t>(i), stream,
                     std::make_unique<FreeIndex>());
    last_ = i;
    return *streams_[i].second;
  }
  // (stream, index) pairs in ascending stream order.
  const std::vector<std::pair<uint64_t, std::unique_ptr<FreeIndex>>>& streams() const {
    return streams_;
  }

 private:
  std::vector<std::pair<uint64_t, std::unique_ptr<FreeIndex>>> streams_;
  size_t last_ = 0;
};

}  // namespace memsim::detail
