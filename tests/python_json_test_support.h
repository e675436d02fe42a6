// Reading a JSON file written by Python's json module (tools/gpu/measure_*.py), which writes
// a float NaN as the bare token NaN that JSON lacks: read here as null. Used where a run
// records values that can be NaN (the fake process group's garbage losses of the
// context-parallel runs).
#pragma once

#include <catch2/catch.hpp>

#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>

namespace memsim_test {

inline nlohmann::json load_python_json(const std::string& path) {
  std::ifstream in(path);
  REQUIRE(in.good());
  std::string body((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (size_t at = body.find("NaN"); at != std::string::npos; at = body.find("NaN", at))
    body.replace(at, 3, "null");
  return nlohmann::json::parse(body);
}

}  // namespace memsim_test
