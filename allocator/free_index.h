// Internal to the allocator emulator: the ordered index of free blocks of one pool and
// one stream, ordered by (size, address) (§1: a pool is ordered by (stream, size,
// address); one FreeIndex per stream gives the same order and the same "never another
// stream's block" search).
//
// Contract: exactly the order and answers of a std::set<(size, address)>: lower_bound,
// in-order iteration (next/prev), insert, erase by position or by exact key. Positions
// are invalidated by any modification (insert, erase, a successful rekey).
//
// Why this shape: the emulator must run >= 20 M events/s, and every malloc/free does one
// to three searches here. Free blocks are bucketed into size classes (TLSF-style: the
// power of two, then kSubBits more bits of the size, so classes are monotone in size and
// a class spans at most 1/16 of its size), and each class keeps its few entries as a
// small sorted array of packed (size, address) keys. Then
//  - "first block >= size" = a search in one small array, or, when that class has none,
//    a find-first-set in a two-level bitmap of non-empty classes and its first entry;
//  - insert / erase by key = a search and a shift of the shorter side in one small array
//    (no tree walk, no node allocation; a class array only grows, so a warm index never
//    allocates).
// Exact best fit is preserved because classes partition the size axis in order and each
// class is kept fully sorted by (size, address).
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
  static constexpr unsigned kSubBits = 4;                  // 16 classes per power of two
  static constexpr unsigned kSub = 1u << kSubBits;
  static constexpr unsigned kGroups = 64 - kSubBits + 1;  // first-level bitmap entries
  static constexpr uint32_t kClasses = kGroups * kSub;

  // Class of a size: monotone non-decreasing in size, < kClasses.
  // For size >= kSub, with shift = floor(log2(size)) - kSubBits: (shift + 1) * kSub +
  // (size >> shift) - kSub = shift * kSub + (size >> shift); for size < kSub it is size
  // itself, which the same formula gives with shift 0. `size | kSub` makes shift 0 there
  // without a branch (and keeps __builtin_clzll's argument non-zero).
  static uint32_t class_of(uint64_t size) {
    const unsigned shift = 63u - kSubBits - static_cast<unsigned>(__builtin_clzll(size | kSub));
    return (shift << kSubBits) + static_cast<uint32_t>(size >> shift);
  }

  struct Pos {
    uint32_t cls;   // kClasses: the end position
    uint32_t slot;
  };

  FreeIndex() : classes_(kClasses) {}
  ~FreeIndex() {
    for (Class& c : classes_)
      if (c.cap != 0) delete[] c.base();
  }
  FreeIndex(const FreeIndex&) = delete;
  FreeIndex& operator=(const FreeIndex&) = delete;

  bool empty() const { return count_ == 0; }
  size_t size() const { return count_; }
  Pos begin() const { return {next_nonempty(0), 0}; }
  Pos end() const { return {kClasses, 0}; }
  bool valid(Pos p) const { return p.cls < kClasses; }
  FreeEntry at(Pos p) const {
    const Class& c = classes_[p.cls];
    return {static_cast<uint64_t>(c.key[p.slot] >> 64), static_cast<uint64_t>(c.key[p.slot]),
            c.ids()[p.slot]};
  }
  uint32_t id_at(Pos p) const { return classes_[p.cls].ids()[p.slot]; }
  uint64_t size_at(Pos p) const { return static_cast<uint64_t>(classes_[p.cls].key[p.slot] >> 64); }

  Pos next(Pos p) const {
    if (p.slot + 1 < classes_[p.cls].n) return {p.cls, p.slot + 1};
    return {p.cls + 1 < kClasses ? next_nonempty(p.cls + 1) : kClasses, 0};
  }
  // Precondition: p is valid or the end position; returns false at the very first entry.
  bool prev(Pos& p) const {
    if (p.cls < kClasses && p.slot > 0) {
      --p.slot;
      return true;
    }
    if (p.cls == 0) return false;
    const uint32_t c = prev_nonempty(p.cls - 1);
    if (c == kClasses) return false;
    p = {c, classes_[c].n - 1};
    return true;
  }

  // First entry with (size, ptr) >= the key; the end position if none.
  Pos lower_bound(uint64_t size, uint64_t ptr) const {
    const uint32_t c = class_of(size);
    const Class& cl = classes_[c];
    if (cl.n != 0) {
      const uint32_t s = search(cl.key, cl.n, pack_key(size, ptr));
      if (s < cl.n) return {c, s};
    }
    return {c + 1 < kClasses ? next_nonempty(c + 1) : kClasses, 0};
  }

  void insert(const FreeEntry& entry) {
    const FreeKey128 key = pack_key(entry.size, entry.ptr);
    const uint32_t c = class_of(entry.size);
    Class& cl = classes_[c];
    const uint32_t s = search(cl.key, cl.n, key);
    // Shift whichever side of the insertion point is shorter, making room there first.
    const bool down = s < cl.n - s;
    if (down ? cl.front == 0 : cl.front + cl.n == cl.cap) make_room(cl);
    FreeKey128* k = cl.key;
    uint32_t* id = cl.ids();
    if (down) {
      FreeKey128* const k_dst = k - 1;
      uint32_t* const id_dst = id - 1;
      for (uint32_t i = 0; i < s; ++i) {
        k_dst[i] = k[i];
        id_dst[i] = id[i];
      }
      --cl.front;
      --cl.key;
      --cl.id;
    } else {
      for (uint32_t i = cl.n; i > s; --i) {
        k[i] = k[i - 1];
        id[i] = id[i - 1];
      }
    }
    cl.key[s] = key;  // the same index either way: a down shift moved `key` back by one
    cl.ids()[s] = entry.id;
    if (cl.n++ == 0) mark(c);
    ++count_;
  }

  void erase(Pos p) {
    Class& cl = classes_[p.cls];
    FreeKey128* k = cl.key;
    uint32_t* id = cl.ids();
    const uint32_t s = p.slot;
    if (s < cl.n - 1 - s) {  // close the gap from the shorter side
      for (uint32_t i = s; i > 0; --i) {
        k[i] = k[i - 1];
        id[i] = id[i - 1];
      }
      ++cl.front;
      ++cl.key;
      ++cl.id;
    } else {
      for (uint32_t i = s; i + 1 < cl.n; ++i) {
        k[i] = k[i + 1];
        id[i] = id[i + 1];
      }
    }
    if (--cl.n == 0) {
      FreeKey128* const base = cl.base();
      uint32_t* const id_base = cl.id - cl.front;
      cl.front = cl.cap / 2;  // room on both sides for the next insert
      cl.key = base + cl.front;
      cl.id = id_base + cl.front;
      unmark(p.cls);
    }
    --count_;
  }

  // Gives the entry at p the key (size, ptr) in place when that keeps the order, i.e. the
  // new key stays in p's class and lies strictly between p's neighbours; false (nothing
  // changed) otherwise. Exact: the entries then hold the same keys in the same order as
  // erase(p) followed by insert() would leave.
  bool rekey(Pos p, uint64_t size, uint64_t ptr) {
    if (class_of(size) != p.cls) return false;
    Class& cl = classes_[p.cls];
    const FreeKey128 key = pack_key(size, ptr);
    if (p.slot > 0 && !(cl.key[p.slot - 1] < key)) return false;
    if (p.slot + 1 < cl.n && !(key < cl.key[p.slot + 1])) return false;
    cl.key[p.slot] = key;
    return true;
  }

  // Erases the entry with exactly this key; false if absent.
  bool erase(uint64_t size, uint64_t ptr) {
    const uint32_t c = class_of(size);
    const Class& cl = classes_[c];
    const FreeKey128 key = pack_key(size, ptr);
    const uint32_t s = search(cl.key, cl.n, key);
    if (s == cl.n || cl.key[s] != key) return false;
    erase(Pos{c, s});
    return true;
  }

  template <class F>
  void for_each(F&& f) const {
    for (Pos p = begin(); valid(p); p = next(p)) f(at(p));
  }

 private:
  // One size class: its entries sorted by key in the middle of a buffer of `cap` keys
  // followed by `cap` ids, entries at [front, front + n). The keys and ids are separate
  // arrays because the searches touch only the keys. Free room at both ends lets insert
  // and erase shift the shorter side: PyTorch's best fit takes the lowest address of a
  // size and blocks tend to come back where they were taken, so the busy end of a class
  // of many equal sizes (whole 2 MiB small-pool segments) costs no shifting. Capacity
  // only grows.
  struct Class {
    FreeKey128* key = nullptr;  // the first entry's key (base() + front)
    uint32_t* id = nullptr;     // the first entry's id
    uint32_t front = 0;
    uint32_t n = 0;
    uint32_t cap = 0;
    FreeKey128* base() const { return key - front; }
    uint32_t* ids() const { return id; }
  };
  static size_t buffer_keys(uint32_t cap) {  // keys plus ids, in FreeKey128 units
    return cap + (cap * sizeof(uint32_t) + sizeof(FreeKey128) - 1) / sizeof(FreeKey128);
  }

  // Re-centres the entries so that both ends have room, in a buffer twice as large when
  // the class is at least half full (so each end then has >= cap / 4 room, and re-centring
  // costs O(1) amortised per insert).
  // Out of line and cold: it runs O(log n) times per class, and keeping it out of
  // insert() lets insert() inline into the callers.
  __attribute__((noinline, cold)) static void make_room(Class& cl) {
    const uint32_t cap = cl.n * 2 >= cl.cap ? (cl.cap == 0 ? 4 : cl.cap * 2) : cl.cap;
    const uint32_t front = (cap - cl.n) / 2;
    FreeKey128* const old_base = cl.base();
    uint32_t* const old_ids = cl.id - cl.front;
    if (cap == cl.cap) {
      std::memmove(old_base + front, cl.key, cl.n * sizeof(FreeKey128));
      std::memmove(old_ids + front, cl.id, cl.n * sizeof(uint32_t));
      cl.key = old_base + front;
      cl.id = old_ids + front;
      cl.front = front;
      return;
    }
    FreeKey128* buffer = new FreeKey128[buffer_keys(cap)];
    uint32_t* const ids = reinterpret_cast<uint32_t*>(buffer + cap);
    if (cl.n != 0) {
      std::memcpy(buffer + front, cl.key, cl.n * sizeof(FreeKey128));
      std::memcpy(ids + front, cl.id, cl.n * sizeof(uint32_t));
    }
    delete[] (cl.cap == 0 ? nullptr : old_base);
    cl.key = buffer + front;
    cl.id = ids + front;
    cl.front = front;
    cl.cap = cap;
  }

  // Branch-free lower_bound (conditional moves): the comparisons are data-dependent and
  // would mispredict as branches. The two ends are tested first: the key often sorts
  // before every entry (a request for the size the class holds: lower_bound(size, 0)
  // among equal sizes; a block freed below the others) or after every one (a block freed
  // above them). A third of the searches of a cs336-xl run are in classes of 32 to 127
  // entries, mostly equal sizes (one tensor shape per layer), where this saves 5-7 steps.
  static uint32_t search(const FreeKey128* first, uint32_t n, FreeKey128 key) {
    if (n == 0 || !(first[0] < key)) return 0;
    if (first[n - 1] < key) return n;
    const FreeKey128* base = first;
    while (n > 1) {
      const uint32_t half = n / 2;
      base = base[half - 1] < key ? base + half : base;
      n -= half;
    }
    return static_cast<uint32_t>(base - first) + (*base < key ? 1u : 0u);
  }

  // Two-level bitmap of non-empty classes: group_map_ bit g <=> class_map_[g] != 0.
  void mark(uint32_t c) {
    class_map_[c >> kSubBits] |= 1u << (c & (kSub - 1));
    group_map_ |= uint64_t{1} << (c >> kSubBits);
  }
  void unmark(uint32_t c) {
    const uint32_t g = c >> kSubBits;
    class_map_[g] &= ~(1u << (c & (kSub - 1)));
    if (class_map_[g] == 0) group_map_ &= ~(uint64_t{1} << g);
  }
  // Smallest non-empty class >= c (c < kClasses), or kClasses.
  uint32_t next_nonempty(uint32_t c) const {
    const uint32_t g = c >> kSubBits;
    const uint32_t in_group = class_map_[g] & (~0u << (c & (kSub - 1)));
    if (in_group != 0) return (g << kSubBits) | static_cast<uint32_t>(__builtin_ctz(in_group));
    const uint64_t groups = g + 1 < 64 ? group_map_ & (~uint64_t{0} << (g + 1)) : 0;
    if (groups == 0) return kClasses;
    const uint32_t g2 = static_cast<uint32_t>(__builtin_ctzll(groups));
    return (g2 << kSubBits) | static_cast<uint32_t>(__builtin_ctz(class_map_[g2]));
  }
  // Largest non-empty class <= c (c < kClasses), or kClasses.
  uint32_t prev_nonempty(uint32_t c) const {
    const uint32_t g = c >> kSubBits;
    const uint32_t in_group = class_map_[g] & ((2u << (c & (kSub - 1))) - 1u);
    if (in_group != 0) return (g << kSubBits) | (31u - static_cast<uint32_t>(__builtin_clz(in_group)));
    const uint64_t groups = group_map_ & ((uint64_t{1} << g) - 1u);
    if (groups == 0) return kClasses;
    const uint32_t g2 = 63u - static_cast<uint32_t>(__builtin_clzll(groups));
    return (g2 << kSubBits) | (31u - static_cast<uint32_t>(__builtin_clz(class_map_[g2])));
  }

  std::vector<Class> classes_;
  uint32_t class_map_[kGroups] = {};
  uint64_t group_map_ = 0;
  size_t count_ = 0;
};

// A pool's free blocks: one FreeIndex per stream, streams in ascending order, so that
// iterating streams then entries visits blocks in (stream, size, address) order.
class StreamFreeIndex {
 public:
  // The last stream found is kept as (stream, index pointer): a run on one stream pays a
  // compare and a load per lookup. The FreeIndex objects are heap-allocated, so the
  // pointer stays valid when streams_ grows.
  FreeIndex* find(uint64_t stream) {
    if (last_index_ != nullptr && last_stream_ == stream) return last_index_;
    for (size_t i = 0; i < streams_.size(); ++i) {
      if (streams_[i].first == stream) return remember(stream, streams_[i].second.get());
    }
    return nullptr;
  }
  FreeIndex& of(uint64_t stream) {
    if (FreeIndex* f = find(stream)) return *f;
    size_t i = 0;
    while (i < streams_.size() && streams_[i].first < stream) ++i;
    streams_.emplace(streams_.begin() + static_cast<std::ptrdiff_t>(i), stream,
                     std::make_unique<FreeIndex>());
    return *remember(stream, streams_[i].second.get());
  }
  // (stream, index) pairs in ascending stream order.
  const std::vector<std::pair<uint64_t, std::unique_ptr<FreeIndex>>>& streams() const {
    return streams_;
  }

 private:
  FreeIndex* remember(uint64_t stream, FreeIndex* index) {
    last_stream_ = stream;
    last_index_ = index;
    return index;
  }

  std::vector<std::pair<uint64_t, std::unique_ptr<FreeIndex>>> streams_;
  uint64_t last_stream_ = 0;
  FreeIndex* last_index_ = nullptr;
};

}  // namespace memsim::detail
