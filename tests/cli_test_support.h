// Running the built `memsim` binary from tests: the one place that spawns a command and
// captures what it prints. Test files wrap it with their own stderr handling.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "test_paths.h"

namespace memsim_test {

struct CommandResult {
  int status = -1;  // exit status; -1 when the command did not exit normally
  std::string out;  // what it wrote to stdout
};

// Runs `command` through the shell and captures its stdout.
inline CommandResult run_shell(const std::string& command) {
  CommandResult r;
  std::FILE* pipe = ::popen(command.c_str(), "r");
  REQUIRE(pipe != nullptr);
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) r.out.append(buf, n);
  const int wait_status = ::pclose(pipe);
  r.status = WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : -1;
  return r;
}

// The shell words that start the built binary, without colour: append the arguments.
inline std::string memsim_command() {
  return std::string("NO_COLOR=1 '") + MEMSIM_BINARY_DIR + "/memsim' ";
}

// `memsim run FILE SETS --json -`: its JSON report, the run required to exit 0 (it fits).
inline nlohmann::json run_json(const std::string& file, const std::string& sets = "") {
  const CommandResult r =
      run_shell(memsim_command() + "run '" + file + "' " + sets + " --json - 2>/dev/null");
  REQUIRE(r.status == 0);
  return nlohmann::json::parse(r.out);
}

inline std::string slurp(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// A fresh temporary folder (named after `prefix`, the process and a counter), removed
// with everything in it when the object goes out of scope.
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& prefix) {
    static int counter = 0;
    path = std::filesystem::temp_directory_path() /
           (prefix + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::filesystem::path write(const std::string& name, const std::string& text) const {
    std::ofstream(path / name, std::ios::binary) << text;
    return path / name;
  }
};

struct CliResult {
  int status = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

// Runs `memsim ARGS` through the shell: stdout through popen, stderr through a file in `dir`.
inline CliResult run_memsim(const std::string& args, const TempDir& dir) {
  const std::filesystem::path err = dir.path / "stderr.txt";
  const CommandResult ran = run_shell(memsim_command() + args + " 2>'" + err.string() + "'");
  CliResult r;
  r.status = ran.status;
  r.out = ran.out;
  r.err = slurp(err);
  return r;
}

}  // namespace memsim_test
