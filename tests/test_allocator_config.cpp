// PYTORCH_CUDA_ALLOC_CONF parsing (§2) and roundup_power2_divisions list semantics (§3.2).
#include <catch2/catch.hpp>

#include "allocator/allocator_config.h"
#include "allocator/caching_allocator.h"
#include "tests/allocator_test_support.h"

using namespace memsim;
using memsim::testing::ScriptedDevice;

namespace {
std::string error_of(const std::string& conf) {
  try {
    AllocatorConfig::parse(conf);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("Config defaults and simple options", "[allocator]") {
  const AllocatorConfig d = AllocatorConfig::parse("");
  CHECK(d.max_split_size == AllocatorConfig::kUnlimited);
  CHECK(d.max_non_split_rounding == 20971520);
  CHECK_FALSE(d.expandable_segments);
  CHECK(d.to_string().empty());

  const AllocatorConfig c = AllocatorConfig::parse(
      " expandable_segments : True , max_split_size_mb:128,garbage_collection_threshold:0.6,"
      "max_non_split_rounding_mb:64,release_lock_on_cudamalloc:False,backend:native");
  CHECK(c.expandable_segments);
  CHECK(c.max_split_size == 128ull << 20);
  CHECK(c.max_non_split_rounding == 64ull << 20);
  CHECK(c.garbage_collection_threshold == Approx(0.6));
  CHECK(c.to_string() ==
        "max_split_size_mb:128,max_non_split_rounding_mb:64,garbage_collection_threshold:0.6,"
        "expandable_segments:True");
  CHECK(AllocatorConfig::parse(c.to_string()).max_split_size == c.max_split_size);
}

TEST_CASE("roundup_power2_divisions: keys are interval lower bounds, '>' overwrites the last key", "[allocator]") {
  const auto d = AllocatorConfig::parse("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]")
                     .roundup_power2_divisions;
  for (int i = 0; i <= 8; ++i) CHECK(d[i] == 1u);
  CHECK(d[9] == 2u);
  for (int i = 10; i < 16; ++i) CHECK(d[i] == 8u);

  const auto single = AllocatorConfig::parse("roundup_power2_divisions:4").roundup_power2_divisions;
  for (uint32_t v : single) CHECK(v == 4u);

  // The first key fills below it; a key past 32768 MiB clamps to the last entry.
  const auto e = AllocatorConfig::parse("roundup_power2_divisions:[4:2,65536:16]")
                     .roundup_power2_divisions;
  CHECK(e[0] == 2u);
  CHECK(e[1] == 2u);
  CHECK(e[2] == 2u);
  CHECK(e[3] == 0u);
  CHECK(e[15] == 16u);

  // Divisions <= 1 mean plain 512 rounding (issue #161139); 0 is allowed in lists.
  ScriptedDevice dev({});
  CachingAllocator ones(AllocatorConfig::parse("roundup_power2_divisions:[1:0,>:1]"), dev);
  CHECK(ones.round_size(5000000) == 5000192);
  // [256:1,512:2,...,>:8]: 600 MiB is in entry 9 (2 divisions): rounds to 768 MiB.
  CachingAllocator list(AllocatorConfig::parse("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]"), dev);
  CHECK(list.round_size(600ull << 20) == 768ull << 20);
  CHECK(list.round_size(300ull << 20) == 300ull << 20);
  CHECK(list.round_size((1ull << 30) + 1) == (1ull << 30) + (128ull << 20));
}

TEST_CASE("Config errors name the option", "[allocator]") {
  CHECK(error_of("max_split_size_mb:20").find("max_split_size_mb") != std::string::npos);
  CHECK(error_of("max_split_size_mb:20").find("must be > 20") != std::string::npos);
  CHECK(error_of("max_split_size_mb:abc").find("max_split_size_mb") != std::string::npos);
  CHECK(error_of("max_non_split_rounding_mb:8").find("max_non_split_rounding_mb") != std::string::npos);
  CHECK(error_of("foo:1").find("Unrecognized CachingAllocator option: foo") != std::string::npos);
  CHECK(error_of("expandable_segments:true").find("expandable_segments") != std::string::npos);
  CHECK(error_of("garbage_collection_threshold:1.0").find("too big") != std::string::npos);
  CHECK(error_of("garbage_collection_threshold:0").find("too small") != std::string::npos);
  CHECK(error_of("roundup_power2_divisions:3").find("roundup_power2_divisions") != std::string::npos);
  CHECK(error_of("roundup_power2_divisions:[3:4]").find("intervals have to be power of 2") != std::string::npos);
  CHECK(error_of("roundup_power2_divisions:[256:3]").find("power of 2 or 0") != std::string::npos);
  CHECK(error_of("roundup_power2_divisions:[256:2").find("roundup_power2_divisions") != std::string::npos);
  CHECK(error_of("max_split_size_mb 128").find("max_split_size_mb128") != std::string::npos);
  CHECK(error_of("backend:cudaMallocAsync").find("backend") != std::string::npos);
  CHECK(error_of("expandable_segments:True max_split_size_mb:100").find("expandable_segments") != std::string::npos);
}
