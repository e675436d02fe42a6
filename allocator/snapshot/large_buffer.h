// Storage for the snapshot reader's large arrays (the file's bytes, the pickle's nodes and
// container items): malloc'd and never zero-filled; from 2 MiB up aligned to 2 MiB and
// advised as transparent huge pages (Linux madvise(MADV_HUGEPAGE), honoured when
// /sys/kernel/mm/transparent_hugepage/enabled is "madvise" or "always").
//
// Why: replaying a 4 MB snapshot first-touches about 10 MB of such arrays; in 4 KiB pages
// that is some 2,500 page faults, a fifth of the replay's CPU time. In 2 MiB pages it is a
// handful (the pages are still zeroed by the kernel). Where THP is off the advice is
// ignored and nothing else changes.
//
// Contract: allocate_large(bytes) returns storage for `bytes` bytes (at least 1), freed
// with std::free (LargeBuffer's deleter); throws std::bad_alloc when there is none.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <memory>

namespace memsim {

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
template <class T>
using LargeBuffer = std::unique_ptr<T[], FreeDeleter>;

void* allocate_large(size_t bytes);

template <class T>
LargeBuffer<T> allocate_large_array(size_t count) {
  return LargeBuffer<T>(static_cast<T*>(allocate_large(count * sizeof(T))));
}

}  // namespace memsim
