// tools/cli/host_malloc.h: after tune_host_malloc(), blocks from 128 KiB (glibc's default
// mmap threshold) up to just under 32 MiB come from the heap, not from mmap (so freeing
// them unmaps nothing), and freeing them does not shrink the heap.
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "shared_dir_test_support.h"
#include "test_paths.h"
#include "tools/cli/host_malloc.h"

#if defined(__GLIBC__)
#include <fcntl.h>
#include <malloc.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
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

TEST_CASE("huge_page_pad: the distance to the next 2 MiB boundary", "[host-malloc]") {
  using memsim::cli::huge_page_pad;
  using memsim::cli::kHugePageBytes;
  CHECK(huge_page_pad(0) == 0);
  CHECK(huge_page_pad(kHugePageBytes) == 0);
  CHECK(huge_page_pad(kHugePageBytes * 7) == 0);
  CHECK(huge_page_pad(1) == kHugePageBytes - 1);
  CHECK(huge_page_pad(kHugePageBytes * 3 + 4096) == kHugePageBytes - 4096);
  CHECK(huge_page_pad(uintptr_t{0x55d1a31f7000}) == 0x9000);
}

#if defined(__GLIBC__) && defined(__linux__)
namespace {

// The kernel's transparent huge page mode: the text between brackets of
// /sys/kernel/mm/transparent_hugepage/enabled ("always", "madvise" or "never").
std::string thp_mode() {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  std::getline(in, line);
  const size_t a = line.find('['), b = line.find(']');
  return a == std::string::npos || b == std::string::npos ? "" : line.substr(a + 1, b - a - 1);
}

// A /proc/vmstat counter (0 when absent).
uint64_t vmstat(const std::string& key) {
  std::ifstream in("/proc/vmstat");
  std::string k;
  uint64_t v = 0;
  while (in >> k >> v)
    if (k == key) return v;
  return 0;
}

}  // namespace

// The executable's heap (tune_host_malloc from its .preinit_array): a cold cs336-xl run
// touched ~545 pages before, ~285 with its main heap in huge pages (docs/engine.md "Fewer
// page faults"). Counted by the child's rusage, spawned directly (no shell's pages).
TEST_CASE("memsim's heap is in huge pages: a cold run's page faults", "[host-malloc]") {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  // Built with the sanitizers (MEMSIM_SANITIZE), as the executable is: their allocator
  // replaces glibc's, and tune_host_malloc leaves it alone.
  MEMSIM_SKIP("sanitizer build: the executable's heap is the sanitizer's");
  return;
#endif
  const std::string mode = thp_mode();
  if (mode != "madvise" && mode != "always") {
    MEMSIM_SKIP("transparent huge pages are '" << mode << "' here: the heap keeps 4 KiB pages");
    return;
  }
  const std::string binary = MEMSIM_BINARY_DIR + "/memsim";
  const std::string scenario = MEMSIM_SOURCE_DIR + "/scenarios/cs336-xl-train-ctx512.yaml";
  std::vector<std::string> words = {binary, "run", scenario};
  std::vector<char*> argv;
  for (std::string& w : words) argv.push_back(w.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  const uint64_t fallback_before = vmstat("thp_fault_fallback");
  pid_t pid = 0;
  REQUIRE(posix_spawn(&pid, binary.c_str(), &fa, nullptr, argv.data(), environ) == 0);
  posix_spawn_file_actions_destroy(&fa);
  int status = 0;
  struct rusage usage {};
  REQUIRE(wait4(pid, &status, 0, &usage) == pid);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  if (vmstat("thp_fault_fallback") != fallback_before) {
    MEMSIM_SKIP("the kernel had no free huge page during the run (thp_fault_fallback grew)");
    return;
  }
  INFO("minor page faults of a cold cs336-xl run: " << usage.ru_minflt);
  CHECK(usage.ru_minflt < 420);
}
#endif
