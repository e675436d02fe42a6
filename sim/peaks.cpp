#include "sim/peaks.h"

#include <algorithm>
#include <limits>

namespace memsim {
namespace {

constexpr uint64_t kNone = std::numeric_limits<uint64_t>::max();

// For every i in the range, the lowest value between i and the nearest "higher ground"
// on one side (inclusive of i, exclusive of the higher point), or kNone when that side
// has no higher ground. `step` is +1 (look left, scanning forward) or -1 (look right,
// scanning backward). Looking left, an equal value counts as higher ground, looking
// right it does not: so of a plateau, only its first event keeps a prominence.
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
      out[i - begin] = kNone;
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
    const uint64_t lb = left[k], rb = right[k];
    uint64_t base;
    if (lb == kNone && rb == kNone) {
      base = range_min;  // the highest hill: it descends to the bottom of the range
    } else if (lb == kNone) {
      base = rb;  // no higher ground on the left: only the right side constrains it
    } else if (rb == kNone) {
      base = lb;
    } else {
      base = std::max(lb, rb);
    }
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
