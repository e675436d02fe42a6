// The size-class free-block index (allocator/free_index.h) against a std::set reference:
// random insert / erase / lower_bound / rekey / iteration in both directions must give
// exactly the std::set<(size, address)> answers, including around class and bitmap-group
// boundaries (sizes near powers of two) and with many entries of one size.
#include <catch2/catch.hpp>

#include <cstdint>
#include <iterator>
#include <random>
#include <set>
#include <tuple>
#include <vector>

#include "allocator/free_index.h"

using memsim::detail::FreeEntry;
using memsim::detail::FreeIndex;

namespace {

using Key = std::tuple<uint64_t, uint64_t, uint32_t>;  // (size, ptr, id); id is payload
struct KeyLess {
  bool operator()(const Key& a, const Key& b) const {
    return std::tie(std::get<0>(a), std::get<1>(a)) < std::tie(std::get<0>(b), std::get<1>(b));
  }
};
using Reference = std::set<Key, KeyLess>;

Key key_of(const FreeEntry& e) { return {e.size, e.ptr, e.id}; }

void require_same(const FreeIndex& index, const Reference& ref) {
  REQUIRE(index.size() == ref.size());
  REQUIRE(index.empty() == ref.empty());
  std::vector<Key> forward;
  index.for_each([&forward](const FreeEntry& e) { forward.push_back(key_of(e)); });
  REQUIRE(forward == std::vector<Key>(ref.begin(), ref.end()));
  // Backwards from the end position.
  std::vector<Key> backward;
  FreeIndex::Pos p = index.end();
  while (index.prev(p)) backward.push_back(key_of(index.at(p)));
  REQUIRE(backward == std::vector<Key>(ref.rbegin(), ref.rend()));
}

// Sizes that hit class boundaries, wide ranges, and repeats.
uint64_t draw_size(std::mt19937_64& rng) {
  switch (rng() % 5) {
    case 0: return 512 * (1 + rng() % 64);                        // few distinct small sizes
    case 1: {                                                     // around a power of two
      const uint64_t p = uint64_t{1} << (9 + rng() % 40);
      return p - 2 + rng() % 5;
    }
    case 2: return 1 + rng() % 100;                               // below the first group
    case 3: return (rng() >> (rng() % 64)) | 1;                   // any magnitude
    default: return 2097152;                                      // one size, many blocks
  }
}

}  // namespace

TEST_CASE("class_of is monotone and within range", "[allocator][free_index]") {
  uint32_t last = 0;
  for (uint64_t s = 0; s < 70000; ++s) {
    const uint32_t c = FreeIndex::class_of(s);
    REQUIRE(c >= last);
    REQUIRE(c < FreeIndex::kClasses);
    last = c;
  }
  for (unsigned b = 1; b < 64; ++b) {
    const uint64_t p = uint64_t{1} << b;
    REQUIRE(FreeIndex::class_of(p - 1) <= FreeIndex::class_of(p));
    REQUIRE(FreeIndex::class_of(p) <= FreeIndex::class_of(p + 1));
  }
  REQUIRE(FreeIndex::class_of(~uint64_t{0}) == FreeIndex::kClasses - 1);
}

// The classes as first defined (TLSF: sizes below kSub are their own class; above, the
// power of two, then kSubBits more bits); class_of computes them without a branch.
TEST_CASE("class_of equals the two-branch definition of the classes", "[allocator][free_index]") {
  auto reference = [](uint64_t size) -> uint32_t {
    if (size < FreeIndex::kSub) return static_cast<uint32_t>(size);
    const unsigned log2 = 63u - static_cast<unsigned>(__builtin_clzll(size));
    const unsigned shift = log2 - FreeIndex::kSubBits;
    return ((shift + 1) << FreeIndex::kSubBits) +
           static_cast<uint32_t>((size >> shift) - FreeIndex::kSub);
  };
  for (uint64_t s = 0; s < 70000; ++s) REQUIRE(FreeIndex::class_of(s) == reference(s));
  for (unsigned b = 0; b < 64; ++b) {
    for (int d = -3; d <= 3; ++d) {
      const uint64_t s = (uint64_t{1} << b) + static_cast<uint64_t>(static_cast<int64_t>(d));
      REQUIRE(FreeIndex::class_of(s) == reference(s));
    }
  }
  std::mt19937_64 rng(7);
  for (int i = 0; i < 200000; ++i) {
    const uint64_t s = rng() >> (rng() % 64);
    REQUIRE(FreeIndex::class_of(s) == reference(s));
  }
  REQUIRE(FreeIndex::class_of(~uint64_t{0}) == reference(~uint64_t{0}));
}

TEST_CASE("FreeIndex matches a std::set under random operations", "[allocator][free_index]") {
  std::mt19937_64 rng(GENERATE(1u, 2u, 3u, 4u));
  FreeIndex index;
  Reference ref;
  uint32_t next_id = 0;
  for (int step = 0; step < 20000; ++step) {
    const unsigned op = static_cast<unsigned>(rng() % 10);
    if (op < 4 || ref.empty()) {
      const uint64_t size = draw_size(rng);
      const uint64_t ptr = (rng() % 4096) * 512;
      const Key k{size, ptr, next_id};
      if (ref.insert(k).second) index.insert(FreeEntry{size, ptr, next_id});
      ++next_id;
    } else if (op < 6) {
      // Erase by key: present or (sometimes) absent.
      auto it = ref.begin();
      std::advance(it, static_cast<long>(rng() % ref.size()));
      Key k = *it;
      if (rng() % 4 == 0) std::get<1>(k) += 1;  // usually absent
      const bool present = ref.erase(k) == 1;
      REQUIRE(index.erase(std::get<0>(k), std::get<1>(k)) == present);
    } else if (op < 8) {
      // lower_bound, then erase by position or rekey in place (the split remainder case).
      const uint64_t size = draw_size(rng);
      const uint64_t ptr = rng() % 3 == 0 ? (rng() % 4096) * 512 : 0;
      FreeIndex::Pos p = index.lower_bound(size, ptr);
      auto it = ref.lower_bound(Key{size, ptr, 0});
      REQUIRE(index.valid(p) == (it != ref.end()));
      if (it == ref.end()) continue;
      REQUIRE(key_of(index.at(p)) == *it);
      REQUIRE(index.id_at(p) == std::get<2>(*it));
      REQUIRE(index.size_at(p) == std::get<0>(*it));
      if (rng() % 2 == 0 || std::get<0>(*it) < 2) {
        index.erase(p);
        ref.erase(it);
      } else {
        const uint64_t old_size = std::get<0>(*it);
        const uint64_t cut = 1 + rng() % (old_size - 1);
        const Key moved{old_size - cut, std::get<1>(*it) + cut, std::get<2>(*it)};
        const bool fresh = ref.count(moved) == 0;
        if (index.rekey(p, std::get<0>(moved), std::get<1>(moved))) {
          // Only allowed when erase + insert would leave the same order in place.
          REQUIRE(fresh);
          ref.erase(it);
          ref.insert(moved);
          auto pos = ref.find(moved);
          REQUIRE(key_of(index.at(index.lower_bound(std::get<0>(moved), std::get<1>(moved)))) == *pos);
        } else if (fresh) {
          index.erase(p);
          ref.erase(it);
          index.insert(FreeEntry{std::get<0>(moved), std::get<1>(moved), std::get<2>(moved)});
          ref.insert(moved);
        }
      }
    } else {
      // Walk a few steps both ways from a lower_bound.
      const uint64_t size = draw_size(rng);
      FreeIndex::Pos p = index.lower_bound(size, 0);
      auto it = ref.lower_bound(Key{size, 0, 0});
      for (int k = 0; k < 3 && it != ref.end(); ++k) {
        REQUIRE(index.valid(p));
        REQUIRE(key_of(index.at(p)) == *it);
        p = index.next(p);
        ++it;
      }
      REQUIRE(index.valid(p) == (it != ref.end()));
      for (int k = 0; k < 5; ++k) {
        const bool moved = index.prev(p);
        REQUIRE(moved == (it != ref.begin()));
        if (!moved) break;
        --it;
        REQUIRE(key_of(index.at(p)) == *it);
      }
    }
    if (step % 1000 == 0) require_same(index, ref);
  }
  require_same(index, ref);
  // Drain completely: the bitmaps must say empty again.
  while (!ref.empty()) {
    const Key k = *ref.begin();
    REQUIRE(index.erase(std::get<0>(k), std::get<1>(k)));
    ref.erase(ref.begin());
  }
  require_same(index, ref);
  REQUIRE_FALSE(index.valid(index.begin()));
  REQUIRE_FALSE(index.valid(index.lower_bound(0, 0)));
}

TEST_CASE("FreeIndex with many blocks of one size, taken and returned at either end",
          "[allocator][free_index]") {
  // Whole 2 MiB small-pool segments: one class, hundreds of entries, inserts and erases
  // at the front, the back and the middle (each end of the buffer fills up and is
  // re-centred or grown).
  FreeIndex index;
  Reference ref;
  std::mt19937_64 rng(7);
  uint32_t id = 0;
  auto add = [&](uint64_t ptr) {
    if (ref.insert(Key{2097152, ptr, id}).second) index.insert(FreeEntry{2097152, ptr, id});
    ++id;
  };
  for (uint64_t i = 0; i < 300; ++i) add((10000 + i) << 21);      // ascending: at the back
  for (uint64_t i = 0; i < 300; ++i) add((9999 - i) << 21);       // descending: at the front
  require_same(index, ref);
  for (int step = 0; step < 5000; ++step) {
    const unsigned where = static_cast<unsigned>(rng() % 3);
    if (rng() % 2 == 0 && !ref.empty()) {
      auto it = where == 0 ? ref.begin() : where == 1 ? std::prev(ref.end()) : ref.begin();
      if (where == 2) std::advance(it, static_cast<long>(rng() % ref.size()));
      const FreeIndex::Pos p = index.lower_bound(std::get<0>(*it), std::get<1>(*it));
      REQUIRE(key_of(index.at(p)) == *it);
      index.erase(p);
      ref.erase(it);
    } else {
      const uint64_t lo = ref.empty() ? 5000 : std::get<1>(*ref.begin()) >> 21;
      const uint64_t hi = ref.empty() ? 5000 : std::get<1>(*ref.rbegin()) >> 21;
      add((where == 0 ? lo - 1 : where == 1 ? hi + 1 : lo + rng() % (hi - lo + 1)) << 21);
    }
    if (step % 250 == 0) require_same(index, ref);
  }
  require_same(index, ref);
}
