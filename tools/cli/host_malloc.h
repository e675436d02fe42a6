// Host malloc settings of the memsim executable (issue #20: a cold `memsim run` under 5 ms).
//
// glibc serves blocks of 128 KiB and more with mmap and returns them with munmap, and
// trims the heap's free top with brk. A pipelined run (sim/analysis/stream_run.h) has two
// threads on two cores in one address space, so each munmap or shrinking brk flushes the
// other core's TLB by an inter-processor interrupt (expensive on a VM), and each fresh
// mapping is faulted in page by page again. The builder's and the consumer's vectors
// (chunks of events, the allocator's tables, the tensor table) grow through those sizes
// in a cold run, and the process unmapped a dozen of them at exit.
//
// A first touch of a 4 KiB page costs ~1.2 us on this VM (allocate, zero, map: 512 pages
// 0.6-0.7 ms), a 2 MiB transparent huge page ~55-95 us; a cold cs336-xl run touched ~270
// pages of the main heap (the builder's thread) and ~110 of the consumer thread's arena,
// most of its ~545 page faults. Hence a main heap whose first 4 MiB are advised for huge
// pages (MADV_HUGEPAGE: the kernel's THP mode here is `madvise`). The consumer's arena
// (glibc maps one per thread, 64 MiB aligned) keeps 4 KiB pages: glibc gives no hook to
// advise it, and one arena for both threads (M_ARENA_MAX 1) was measured and not kept
// (docs/engine.md, "Fewer page faults": a run's CPU time doubled in a third of the runs).
//
// Contract: tune_host_malloc() makes blocks below 32 MiB come from the heap (the largest
// threshold glibc accepts), and keeps up to 64 MiB of free heap top mapped instead of
// returning it, from the call on; called before the heap's first allocation (the
// executable's .preinit_array, tools/memsim.cpp) it also places the heap's start one page
// below a 2 MiB boundary, extends it by a page and kHugeHeapBytes, and advises those
// kHugeHeapBytes for huge pages (skipped when the heap is already in use). Nothing else
// changes (what memsim computes or prints is independent of it). A no-op where the C
// library is not glibc or under the sanitizers. The Python module and the tests do not
// call it (a library does not tune its host's allocator).
#pragma once

#include <cstddef>
#include <cstdint>

namespace memsim::cli {

inline constexpr size_t kHugePageBytes = size_t{2} << 20;
inline constexpr size_t kHugeHeapBytes = size_t{4} << 20;

// Bytes to move the program break by so that it sits on a huge-page boundary.
constexpr size_t huge_page_pad(uintptr_t brk) { return (kHugePageBytes - brk % kHugePageBytes) % kHugePageBytes; }

void tune_host_malloc();

}  // namespace memsim::cli
