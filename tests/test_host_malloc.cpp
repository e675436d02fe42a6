// tools/cli/host_malloc.h: after tune_host_malloc(), blocks from 128 KiB (glibc's default
// mmap threshold) up to just under 32 MiB come from the heap, not from mmap (so freeing
// them unmaps nothing), and freeing them does not shrink the heap.
#include <cstdlib>

#include <catch2/catch.hpp>

#include "tools/cli/host_malloc.h"

#if defined(__GLIBC__)
#include <malloc.h>
#endif

TEST_CASE("tune_host_malloc: mid-size blocks come from the heap and stay mapped", "[host-malloc]") {
#if defined(__GLIBC__)
  memsim::cli::tune_host_malloc();
  const struct mallinfo2 before = mallinfo2();
  for (size_t bytes : {size_t{256} << 10, size_t{4} << 20, (size_t{32} << 20) - 4096}) {
    void* p = std::malloc(bytes);
    REQUIRE(p != nullptr);
    const struct mallinfo2 held = mallinfo2();
    CHECK(held.hblks == before.hblks);  // not a mapping of its own
    CHECK(held.hblkhd == before.hblkhd);
    std::free(p);
  }
  // Freed (at the top of the heap or not): the heap keeps its size (below the 64 MiB trim
  // threshold), nothing is returned.
  void* p = std::malloc(size_t{16} << 20);
  REQUIRE(p != nullptr);
  const size_t arena = mallinfo2().arena;
  std::free(p);
  CHECK(mallinfo2().arena == arena);
#else
  SUCCEED("not glibc: tune_host_malloc is a no-op");
#endif
}
