// The plain fuzz-corpus driver (docs/fuzzing.md): runs every file under the given
// folders (recursively, in name order) through one fuzz entry point (tools/fuzz/
// entries.h), the way libFuzzer would run them, without clang or libFuzzer. ctest runs
// the kept corpora and crash reproducers with it.
//
//   fuzz_corpus snapshot|scenario DIR_OR_FILE...
//
// Exit 0 when every input is handled; 1 naming the first input whose entry threw (a
// crash or a sanitizer report ends the process on its own, after the "running" line
// names the input); 2 on bad usage or when no input was found.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "tools/fuzz/entries.h"

namespace fs = std::filesystem;

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: fuzz_corpus snapshot|scenario DIR_OR_FILE...\n");
    return 2;
  }
  const std::string target = argv[1];
  void (*entry)(const uint8_t*, size_t) = nullptr;
  if (target == "snapshot") entry = memsim::fuzz::snapshot_entry;
  else if (target == "scenario") entry = memsim::fuzz::scenario_entry;
  else {
    std::fprintf(stderr, "fuzz_corpus: unknown target '%s' (snapshot or scenario)\n", argv[1]);
    return 2;
  }
  std::vector<fs::path> files;
  for (int i = 2; i < argc; ++i) {
    const fs::path p = argv[i];
    if (fs::is_regular_file(p)) {
      files.push_back(p);
    } else if (fs::is_directory(p)) {
      for (const auto& e : fs::recursive_directory_iterator(p))
        if (e.is_regular_file()) files.push_back(e.path());
    } else {
      std::fprintf(stderr, "fuzz_corpus: %s: no such file or folder\n", argv[i]);
      return 2;
    }
  }
  std::sort(files.begin(), files.end());
  if (files.empty()) {
    std::fprintf(stderr, "fuzz_corpus: no inputs found\n");
    return 2;
  }
  for (const fs::path& f : files) {
    std::ifstream in(f, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::fprintf(stderr, "running %s (%zu bytes)\n", f.string().c_str(), bytes.size());
    try {
      entry(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "fuzz_corpus: %s: %s input %s threw: %s\n", target.c_str(),
                   target.c_str(), f.string().c_str(), e.what());
      return 1;
    }
  }
  std::printf("fuzz_corpus %s: %zu inputs handled\n", target.c_str(), files.size());
  return 0;
}
