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
// Contract: tune_host_malloc() makes blocks below 32 MiB come from the heap (the largest
// threshold glibc accepts), and keeps up to 64 MiB of free heap top mapped instead of
// returning it, from the call on; nothing else changes (what memsim computes or prints is
// independent of it). Call it first thing in main. A no-op where the C library is not
// glibc. The Python module and the tests do not call it (a library does not tune its
// host's allocator).
#pragma once

namespace memsim::cli {

void tune_host_malloc();

}  // namespace memsim::cli
