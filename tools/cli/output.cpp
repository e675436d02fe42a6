#include "tools/cli/output.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "tools/cli/errors.h"

namespace memsim::cli {

Output::Output(const std::string& path) : path_(path) {
  if (path == "-") {
    file_ = stdout;
    return;
  }
  file_ = std::fopen(path.c_str(), "wb");
  if (file_ == nullptr) {
    throw InputError("cannot write " + path + ": " + std::strerror(errno));
  }
  owned_ = true;
}

Output::~Output() {
  if (owned_ && file_ != nullptr) std::fclose(file_);
}

void Output::write(const std::string& text) {
  if (!text.empty()) std::fwrite(text.data(), 1, text.size(), file_);
}

void Output::finish() {
  const bool failed = std::fflush(file_) != 0 || std::ferror(file_) != 0;
  const int saved = errno;
  if (owned_) {
    const bool close_failed = std::fclose(file_) != 0;
    file_ = nullptr;
    owned_ = false;
    if (failed || close_failed) {
      throw InputError("cannot write " + path_ + ": " + std::strerror(failed ? saved : errno));
    }
  } else if (failed) {
    throw InputError("cannot write to stdout");
  }
}

void check_input_file(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) throw InputError(path + ": is a directory");
}

void check_stdout_reports(const std::string& json, const std::string& timeline) {
  if (json == "-" && timeline == "-") {
    throw UsageError("--json - and --timeline - cannot both write to stdout");
  }
}

}  // namespace memsim::cli
