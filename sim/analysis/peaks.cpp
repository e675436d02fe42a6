#include "sim/analysis/peaks.h"

#include <algorithm>
#include <limits>

namespace memsim {
namespace {

constexpr uint64_t kNone = std::numeric_limits<uint64_t>::max();

// For every i in the range, the lowest value between i and the nearest "higher ground"
// on one side (inclusive of i, exclusive of the higher point), or between i and the
// range's edge when that side has none: what lies beyond the edge is unknown, so the
// edge counts as no descent. Looking left, an equal value counts as higher ground,
// looking right it does not: so of a plateau, only its first event keeps a prominence.
//
// A monotonic stack keeps the candidates for "nearest higher ground"; each entry carries
// the minimum of the values between it and the entry above it, so popped stretches fold
// their minima into the survivor and every value is touched O(1) times.
void bases(const std::vector<uint64_t>& v, size_t begin, size_t end, bool look_left,
           std::vector<uint64_t>& out) {
  struct Entry {
    size_t index;
    uint64_t gap_min;  // min of values strictly between this entry and the next one up
  };
  std::vector<Entry> stack;
  uint64_t edge_min = kNone;  // min of the values between the edge and the stack's bottom
  const size_t n = end - begin;
  for (size_t k = 0; k < n; ++k) {
    const size_t i = look_left ? begin + k : end - 1 - k;
    const uint64_t x = v[i];
    uint64_t m = kNone;
    while (!stack.empty()) {
      const uint64_t top = v[stack.back().index];
      const bool higher = look_left ? top >= x : top > x;
      if (higher) break;
      m = std::min({m, top, stack.back().gap_min});
      stack.pop_back();
    }
    if (stack.empty()) {
      edge_min = std::min(edge_min, m);
      out[i - begin] = std::min(edge_min, x);
    } else {
      stack.back().gap_min = std::min(stack.back().gap_min, m);
      out[i - begin] = std::min(stack.back().gap_min, x);
    }
    stack.push_back(Entry{i, kNone});
  }
}

}  // namespace

std::vector<CurvePeak> find_top_peaks(const std::vector<uint64_t>& values, size_t begin,
                                      size_t end, size_t n, uint64_t min_prominence) {
  std::vector<CurvePeak> peaks;
  end = std::min(end, values.size());
  if (begin >= end || n == 0) return peaks;
  const size_t len = end - begin;

  std::vector<uint64_t> left(len), right(len);
  bases(values, begin, end, /*look_left=*/true, left);
  bases(values, begin, end, /*look_left=*/false, right);
  const uint64_t range_min = *std::min_element(values.begin() + begin, values.begin() + end);

  size_t top = begin;  // first index of the range's maximum
  for (size_t i = begin; i < end; ++i) {
    if (values[i] > values[top]) top = i;
  }

  for (size_t k = 0; k < len; ++k) {
    const size_t i = begin + k;
    // The highest hill descends to the bottom of the range; any other to the higher of
    // its two bases.
    const uint64_t base = i == top ? range_min : std::max(left[k], right[k]);
    const uint64_t prominence = values[i] > base ? values[i] - base : 0;
    if (i == top || (prominence > 0 && prominence >= min_prominence)) {
      peaks.push_back(CurvePeak{i, values[i], prominence});
    }
  }

  auto higher = [](const CurvePeak& a, const CurvePeak& b) {
    return a.value != b.value ? a.value > b.value : a.index < b.index;
  };
  if (peaks.size() > n) {
    std::partial_sort(peaks.begin(), peaks.begin() + static_cast<std::ptrdiff_t>(n),
                      peaks.end(), higher);
    peaks.resize(n);
  } else {
    std::sort(peaks.begin(), peaks.end(), higher);
  }
  return peaks;
}

}  // namespace memsim
