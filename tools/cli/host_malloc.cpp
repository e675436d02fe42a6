#include "tools/cli/host_malloc.h"

#include <cstdlib>  // defines __GLIBC__ with glibc

#if defined(__GLIBC__)
#include <malloc.h>
#include <sys/mman.h>
#include <unistd.h>
#endif

namespace memsim::cli {

namespace {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;  // the sanitizers' allocators replace glibc's
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

#if defined(__GLIBC__)
// The heap's first kHugeHeapBytes on 2 MiB boundaries and advised for transparent huge
// pages. Only before the heap's first block: glibc's main arena grows the break
// contiguously from where it finds it, so the padding (never touched: no page) lies below
// it. The kernel maps a huge page only into a 2 MiB range none of whose pages is mapped
// yet, and glibc writes its first chunk headers (the tcache, the top chunk) as it extends
// the heap, before the advice can be given: so the heap starts one page below a boundary,
// that page takes those headers, and the huge pages start at the boundary. The first
// extension is made that large by M_TOP_PAD, then the pad goes back to glibc's default
// (DEFAULT_TOP_PAD, 131072 in glibc's malloc-machine.h; strace shows the heap growing in
// steps of 128 KiB and a page without this).
void huge_page_heap() {
  if (mallinfo2().arena != 0) return;  // the heap is in use: its start is where it is
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto brk = reinterpret_cast<uintptr_t>(sbrk(0));
  if (brk == static_cast<uintptr_t>(-1) || page == 0 || page >= kHugePageBytes) return;
  const size_t pad = huge_page_pad(brk + page);  // brk + pad + page: a boundary
  if (pad != 0 && sbrk(static_cast<intptr_t>(pad)) == reinterpret_cast<void*>(-1)) return;
  mallopt(M_TOP_PAD, static_cast<int>(kHugeHeapBytes));
  // The first extension, [brk + pad, brk + pad + page + ~4 MiB). volatile: a malloc/free
  // pair the compiler can see would be removed.
  void* volatile first = std::malloc(1);
  std::free(first);
  mallopt(M_TOP_PAD, 128 << 10);
  const uintptr_t start = brk + pad + page;
  const auto end = reinterpret_cast<uintptr_t>(sbrk(0));
  if (end == static_cast<uintptr_t>(-1) || end <= start) return;
  // A hint: where the kernel has no huge page free it maps 4 KiB pages as before.
  madvise(reinterpret_cast<void*>(start), end - start, MADV_HUGEPAGE);
}
#endif

}  // namespace

void tune_host_malloc() {
#if defined(__GLIBC__)
  if (kSanitized) return;
  // Measured on a cold cs336-xl `run` (docs/engine.md, "A cold run under 5 ms"): 12
  // munmaps -> 3, the drain ~0.2 ms and the exit ~0.4 ms earlier.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's maximum on 64-bit (HEAP_MAX_SIZE / 2)
  mallopt(M_TRIM_THRESHOLD, 64 << 20);
  huge_page_heap();
#endif
}

}  // namespace memsim::cli
