// Peak finding on a memory curve (allocated bytes after each event).
//
// A "peak" here is a distinct local maximum: a hill of the curve, reported at the first
// event where the hill's top value is reached. Adjacent events on one plateau, or tiny
// zig-zags of a temporary allocated and freed while memory sits near a top, are not
// separate peaks: a candidate counts only if its topographic prominence (how far the curve
// must descend from it, on both sides, before reaching higher ground or the range's edge)
// is at least `min_prominence` bytes. The range's edges count as unknown ground, not as a
// descent: the first event of a measured step is not a peak just because it starts high.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace memsim {

struct CurvePeak {
  size_t index = 0;         // absolute index into the curve
  uint64_t value = 0;
  uint64_t prominence = 0;  // value minus the higher of the two bases around it
};

// The `n` highest distinct peaks of values[begin, end), highest first (ties: earlier
// first). The range's highest point is always included when the range is non-empty, even
// if its prominence is below `min_prominence` (a flat curve still has a peak).
// O(end - begin) time and memory.
std::vector<CurvePeak> find_top_peaks(const std::vector<uint64_t>& values, size_t begin,
                                      size_t end, size_t n, uint64_t min_prominence);

}  // namespace memsim
