// PYTORCH_CUDA_ALLOC_CONF parsing (§2, §3.2), following CUDAAllocatorConfig::parseArgs
// of v2.6: the lexer splits on , : [ ] and drops spaces; each option is `key:value`.
// Errors are ConfigErrors whose text names the option.
#include <cstdlib>
#include <string_view>
#include <vector>

#include "allocator/allocator_config.h"

namespace memsim {

namespace {

constexpr uint64_t kMiB = 1024 * 1024;
constexpr uint64_t kLargeBufferMiB = 20;  // kLargeBuffer / 1 MiB

std::vector<std::string> lex(const std::string& conf) {
  std::vector<std::string> tokens;
  std::string buf;
  for (char ch : conf) {
    if (ch == ',' || ch == ':' || ch == '[' || ch == ']') {
      if (!buf.empty()) tokens.push_back(std::move(buf));
      buf.clear();
      tokens.emplace_back(1, ch);
    } else if (ch != ' ') {
      buf.push_back(ch);
    }
  }
  if (!buf.empty()) tokens.push_back(std::move(buf));
  return tokens;
}

bool is_power_of_two(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }
unsigned floor_log2(uint64_t v) { return 63u - static_cast<unsigned>(__builtin_clzll(v)); }

class Parser {
 public:
  explicit Parser(std::vector<std::string> tokens) : t_(std::move(tokens)) {}

  AllocatorConfig run() {
    AllocatorConfig c;
    for (i_ = 0; i_ < t_.size(); ++i_) {
      const std::string key = t_[i_];
      if (key == "max_split_size_mb") {
        const uint64_t mb = integer_value(key);
        if (mb <= kLargeBufferMiB)
          fail(key, "CachingAllocator option max_split_size_mb too small, must be > 20");
        c.max_split_size = mb > UINT64_MAX / kMiB ? AllocatorConfig::kUnlimited : mb * kMiB;
      } else if (key == "max_non_split_rounding_mb") {
        const uint64_t mb = integer_value(key);
        if (mb <= kLargeBufferMiB)
          fail(key, "CachingAllocator option max_non_split_rounding_mb too small, must be > 20");
        c.max_non_split_rounding = mb > UINT64_MAX / kMiB ? UINT64_MAX : mb * kMiB;
      } else if (key == "garbage_collection_threshold") {
        const double v = double_value(key);
        if (!(v > 0)) fail(key, "garbage_collect_threshold too small, set it 0.0~1.0");
        if (!(v < 1.0)) fail(key, "garbage_collect_threshold too big, set it 0.0~1.0");
        c.garbage_collection_threshold = v;
      } else if (key == "roundup_power2_divisions") {
        parse_divisions(key, c.roundup_power2_divisions);
      } else if (key == "expandable_segments") {
        c.expandable_segments = bool_value(key);
      } else if (key == "backend") {
        const std::string v = word_value(key);
        if (v == "cudaMallocAsync")
          fail(key, "backend:cudaMallocAsync bypasses the caching allocator; memsim emulates "
                    "only backend:native");
        if (v != "native") fail(key, "Unknown allocator backend, options are native and cudaMallocAsync");
      } else if (key == "release_lock_on_cudamalloc" || key == "release_lock_on_hipmalloc" ||
                 key == "pinned_use_cuda_host_register" ||
                 key == "pinned_use_hip_host_register") {
        bool_value(key);  // no effect on device memory (§2)
      } else if (key == "pinned_num_register_threads") {
        const uint64_t v = integer_value(key);
        if (!is_power_of_two(v))
          fail(key, "Number of register threads has to be power of 2");
      } else if (key == "per_process_memory_fraction") {
        // newer PyTorch [new]; same meaning as set_per_process_memory_fraction
        const double v = double_value(key);
        if (!(v >= 0.0 && v <= 1.0)) fail(key, "per_process_memory_fraction must be in [0, 1]");
        c.memory_fraction = v;
      } else {
        fail(key, "Unrecognized CachingAllocator option: " + key);
      }
      if (i_ + 1 < t_.size()) expect(key, ",");
    }
    return c;
  }

 private:
  [[noreturn]] void fail(const std::string& option, const std::string& what) const {
    throw ConfigError("PYTORCH_CUDA_ALLOC_CONF option '" + option + "': " + what);
  }
  void expect(const std::string& option, const char* token) {
    ++i_;
    if (i_ >= t_.size() || t_[i_] != token)
      fail(option, std::string("Error parsing CachingAllocator settings, expected ") + token);
  }
  const std::string& next_value(const std::string& option) {
    expect(option, ":");
    ++i_;
    if (i_ >= t_.size()) fail(option, "expecting a value");
    return t_[i_];
  }
  static bool parse_u64(const std::string& s, uint64_t& out) {
    if (s.empty() || s.size() > 19) return false;
    uint64_t v = 0;
    for (char ch : s) {
      if (ch < '0' || ch > '9') return false;
      v = v * 10 + static_cast<uint64_t>(ch - '0');
    }
    out = v;
    return true;
  }
  uint64_t integer_value(const std::string& option) {
    const std::string& s = next_value(option);
    uint64_t v = 0;
    if (!parse_u64(s, v)) fail(option, "expected a non-negative integer, got '" + s + "'");
    return v;
  }
  double double_value(const std::string& option) {
    const std::string& s = next_value(option);
    char* end = nullptr;
    const double v = std::strtod(s.c_str(), &end);
    if (s.empty() || end != s.c_str() + s.size())
      fail(option, "expected a number, got '" + s + "'");
    return v;
  }
  bool bool_value(const std::string& option) {
    const std::string& s = next_value(option);
    if (s == "True") return true;
    if (s == "False") return false;
    fail(option, "Expected a single True/False argument for " + option);
  }
  std::string word_value(const std::string& option) { return next_value(option); }

  // §3.2: single power of two for all 16 entries, or [K:D, ..., >:D] where K (MiB) is
  // the lower bound of the interval it sets, the first K also fills the entries below
  // it, and `>` fills from the last K's entry (inclusive) to the end.
  void parse_divisions(const std::string& option, std::array<uint32_t, 16>& div) {
    const std::string& first = next_value(option);
    if (first != "[") {
      uint64_t v = 0;
      if (!parse_u64(first, v)) fail(option, "expected a power of 2, got '" + first + "'");
      if (!is_power_of_two(v)) fail(option, "For roundups, the divisons has to be power of 2");
      div.fill(static_cast<uint32_t>(v));
      return;
    }
    bool first_value = true;
    size_t last_index = 0;
    while (++i_ < t_.size() && t_[i_] != "]") {
      const std::string interval = t_[i_];
      const uint64_t d = integer_value(option);
      if (d != 0 && !is_power_of_two(d))
        fail(option, "For roundups, the divisons has to be power of 2 or 0 to disable roundup");
      if (d > UINT32_MAX) fail(option, "division count too large");
      if (interval == ">") {
        for (size_t k = last_index; k < div.size(); ++k) div[k] = static_cast<uint32_t>(d);
      } else {
        uint64_t k_mb = 0;
        if (!parse_u64(interval, k_mb) || !is_power_of_two(k_mb))
          fail(option, "For roundups, the intervals have to be power of 2, got '" + interval + "'");
        size_t index = floor_log2(k_mb);
        if (index > div.size() - 1) index = div.size() - 1;
        if (first_value) {
          for (size_t k = 0; k < index; ++k) div[k] = static_cast<uint32_t>(d);
          first_value = false;
        }
        div[index] = static_cast<uint32_t>(d);
        last_index = index;
      }
      if (i_ + 1 >= t_.size()) fail(option, "missing ']'");
      if (t_[i_ + 1] != "]") expect(option, ",");
    }
    if (i_ >= t_.size()) fail(option, "missing ']'");
  }

  std::vector<std::string> t_;
  size_t i_ = 0;
};

}  // namespace

AllocatorConfig AllocatorConfig::parse(const std::string& conf) {
  return Parser(lex(conf)).run();
}

std::string AllocatorConfig::to_string() const {
  std::string out;
  auto add = [&out](const std::string& item) {
    if (!out.empty()) out += ',';
    out += item;
  };
  if (max_split_size != kUnlimited)
    add("max_split_size_mb:" + std::to_string(max_split_size / kMiB));
  if (max_non_split_rounding != 20 * kMiB)
    add("max_non_split_rounding_mb:" + std::to_string(max_non_split_rounding / kMiB));
  bool any_division = false, uniform = true;
  for (uint32_t d : roundup_power2_divisions) {
    any_division = any_division || d != 0;
    uniform = uniform && d == roundup_power2_divisions[0];
  }
  if (any_division) {
    if (uniform && is_power_of_two(roundup_power2_divisions[0])) {
      add("roundup_power2_divisions:" + std::to_string(roundup_power2_divisions[0]));
    } else {
      std::string list = "roundup_power2_divisions:[";
      for (size_t i = 0; i < roundup_power2_divisions.size(); ++i) {
        if (i > 0) list += ',';
        list += std::to_string(uint64_t{1} << i) + ":" + std::to_string(roundup_power2_divisions[i]);
      }
      add(list + "]");
    }
  }
  if (garbage_collection_threshold > 0) {
    std::string v = std::to_string(garbage_collection_threshold);
    while (v.size() > 1 && v.back() == '0') v.pop_back();
    add("garbage_collection_threshold:" + v);
  }
  if (expandable_segments) add("expandable_segments:True");
  return out;
}

}  // namespace memsim
