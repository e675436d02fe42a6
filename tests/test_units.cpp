#include <catch2/catch.hpp>

#include "allocator/units.h"

using namespace memsim;

TEST_CASE("torch_format_size matches PyTorch's bounds", "[units]") {
  CHECK(torch_format_size(1024) == "1024 bytes");
  CHECK(torch_format_size(1025) == "1.00 KiB");
  CHECK(torch_format_size(1048576) == "1024.00 KiB");
  CHECK(torch_format_size(2097152) == "2.00 MiB");
  CHECK(torch_format_size(20971520) == "20.00 MiB");
  CHECK(torch_format_size(1073741824) == "1024.00 MiB");
  CHECK(torch_format_size(1073741825) == "1.00 GiB");
}

TEST_CASE("parse_size accepts the units scenario files use", "[units]") {
  CHECK(parse_size("80GiB") == 80 * GiB);
  CHECK(parse_size("500MiB") == 500 * MiB);
  CHECK(parse_size("80GB") == 80'000'000'000ull);
  CHECK(parse_size("4096") == 4096u);
  CHECK(parse_size(" 1.5 GiB ") == GiB + GiB / 2);
  CHECK_FALSE(parse_size("-1GiB").has_value());
  CHECK_FALSE(parse_size("12 parsecs").has_value());
  CHECK_FALSE(parse_size("99999999999999999999").has_value());
  CHECK_FALSE(parse_size("100000000000EiB").has_value());
  CHECK_FALSE(parse_size("").has_value());
}
