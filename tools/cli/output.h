// Where reports go: a named file, or stdout for "-".
#pragma once

#include <cstdio>
#include <string>

namespace memsim::cli {

// An output stream opened for one report. "-" is stdout (not closed here). Opening or
// finishing a file that cannot be written throws InputError naming the file, so a full
// disk or a missing folder is reported, not silently truncated.
class Output {
 public:
  explicit Output(const std::string& path);
  ~Output();
  Output(const Output&) = delete;
  Output& operator=(const Output&) = delete;

  std::FILE* file() const { return file_; }
  void write(const std::string& text);
  // Flushes and closes; throws InputError if anything failed to be written.
  void finish();

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
  bool owned_ = false;
};

// Throws InputError "PATH: is a directory" when an input path names a folder: the
// readers would otherwise fail with a stream error that does not name the path.
void check_input_file(const std::string& path);

// At most one report may go to stdout ("-"); throws UsageError otherwise. When one does,
// the terminal summary is not printed, so stdout stays machine-readable.
void check_stdout_reports(const std::string& json, const std::string& timeline);

}  // namespace memsim::cli
