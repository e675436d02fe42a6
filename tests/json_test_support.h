// Reading a JSON fixture in tests: the test fails (naming the file) when it cannot be
// opened, rather than failing later on an empty document.
#pragma once

#include <filesystem>
#include <fstream>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

namespace memsim_test {

inline nlohmann::json load_json(const std::filesystem::path& path) {
  std::ifstream in(path);
  INFO("fixture " << path.string());
  REQUIRE(in.good());
  return nlohmann::json::parse(in);
}

}  // namespace memsim_test
