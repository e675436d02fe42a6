// OnlinePeaks: find_top_peaks (sim/analysis/peaks.h) over a curve that arrives one value
// at a time and is never stored (the streaming run, sim/analysis/stream_run.h; issue #20).
//
// How: find_top_peaks computes, for every point, its left base (the lowest value back to
// the nearest point at least as high, or to the range's start) and its right base (the
// lowest value on to the nearest strictly higher point, or to the end) with two monotonic
// stack passes. One left-to-right stack gives both: when a value arrives, the entries it
// pops (lower than it) have found their strictly higher ground on the right, so their
// right base is known; the entry it stops at (at least as high) is its own left
// higher ground. Entries still on the stack at the end descend to the range's end. A
// point is a candidate only if its prominence (value minus the higher base) is positive
// and at least the threshold; the threshold grows with the curve's maximum, so a point
// dropped against the running threshold would also fail the final one.
//
// Contract: after push()ing values[begin..end) with their indices, top(n) returns exactly
// find_top_peaks(values, begin, end, n, floor(max * fraction)) (max: the largest value
// pushed), each peak with the `Extra` pushed with its value (what a report says about
// that moment, e.g. the event's op and the reserved bytes there). Memory: the stack (a non-increasing staircase of the
// curve, small next to the curve) and the candidates above the running threshold.
//
// Cost (issue #20: a push per event on the streamed run's critical thread): a stack entry
// keeps its Extra only when it can still become a candidate, i.e. when its value minus its
// left base reaches the running threshold (its prominence can only be lower, and the
// threshold only grows); the others, most of a training curve's small steps, push and pop
// 32 bytes, not the Extra too.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "sim/analysis/peaks.h"

namespace memsim {

struct NoExtra {};

template <class Extra = NoExtra>
class OnlinePeaks {
 public:
  struct Peak {
    CurvePeak peak;
    Extra extra;
  };

  explicit OnlinePeaks(double min_prominence_fraction = 0.0)
      : fraction_(std::max(0.0, min_prominence_fraction)) {
    reset();
  }

  // Forgets every value (a new range begins).
  void reset() {
    stack_.clear();
    extras_.clear();
    candidates_.clear();
    edge_min_ = kNone;
    prune_at_ = 1024;
    count_ = 0;
    max_ = 0;
    threshold_ = 0;
    min_ = kNone;
  }

  void push(size_t index, uint64_t value, const Extra& extra = Extra{}) {
    // A repeat of the value just pushed changes nothing: its left base is itself (the
    // point before it is as high), so its prominence is 0, and for the points before it,
    // an equal value is neither higher ground nor a lower base.
    if (count_ > 0 && value == last_) return;
    last_ = value;
    if (count_ == 0 || value > max_) {
      max_ = value;
      threshold_ = static_cast<uint64_t>(std::floor(static_cast<double>(max_) * fraction_));
      top_ = Peak{CurvePeak{index, value, 0}, extra};
    }
    min_ = std::min(min_, value);
    ++count_;
    // Entries lower than `value` found their strictly higher ground: their right base is
    // the min of their own value and everything after them (`run`, folded top-down).
    uint64_t run = kNone;
    const uint64_t t = threshold();
    while (!stack_.empty() && stack_.back().value < value) {
      const Entry& e = stack_.back();
      run = std::min({run, e.value, e.gap_min});
      if (e.index & kKeepsExtra) {
        consider(e, extras_.back(), run, candidates_, t);
        extras_.pop_back();
      }
      stack_.pop_back();
    }
    uint64_t left;
    if (stack_.empty()) {
      edge_min_ = std::min(edge_min_, run);
      left = std::min(edge_min_, value);
    } else {
      stack_.back().gap_min = std::min(stack_.back().gap_min, run);
      left = std::min(stack_.back().gap_min, value);
    }
    // value >= left. Below t its prominence can never reach the threshold: no Extra kept.
    const bool keep = value - left >= t;
    stack_.push_back(Entry{keep ? index | kKeepsExtra : index, value, left, kNone});
    if (keep) extras_.push_back(extra);
    if (candidates_.size() >= prune_at_) prune();
  }

  // The curve so far is the range: its `n` highest distinct peaks, highest first (ties:
  // earlier first), as find_top_peaks. Does not change the state.
  std::vector<Peak> top(size_t n) const {
    std::vector<Peak> peaks;
    if (count_ == 0 || n == 0) return peaks;
    const uint64_t min_prominence = threshold();
    for (const Peak& p : candidates_)
      if (p.peak.prominence >= min_prominence) peaks.push_back(p);
    // What is still on the stack descends to the end of the range.
    uint64_t run = kNone;
    size_t kept = extras_.size();  // extras_[kept - 1]: the next kept one down the stack
    for (size_t k = stack_.size(); k-- > 0;) {
      const Entry& e = stack_[k];
      run = std::min({run, e.value, e.gap_min});
      if (e.index & kKeepsExtra) consider(e, extras_[--kept], run, peaks, min_prominence);
    }
    // The highest hill (its first point) descends to the bottom of the range.
    const size_t top_index = top_.peak.index;
    peaks.erase(std::remove_if(peaks.begin(), peaks.end(),
                               [&](const Peak& p) { return p.peak.index == top_index; }),
                peaks.end());
    Peak highest = top_;
    highest.peak.prominence = max_ > min_ ? max_ - min_ : 0;
    peaks.push_back(highest);
    auto higher = [](const Peak& a, const Peak& b) {
      return a.peak.value != b.peak.value ? a.peak.value > b.peak.value
                                          : a.peak.index < b.peak.index;
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

  bool empty() const { return count_ == 0; }

 private:
  static constexpr uint64_t kNone = std::numeric_limits<uint64_t>::max();
  // Set in Entry::index when the entry's Extra is in extras_: size_t's top bit (indices stay
  // below it: 2^32 events at most on 64-bit hosts, and the web build's 32-bit wasm runs out
  // of its 4 GiB address space long before 2^31 events).
  static constexpr size_t kKeepsExtra = size_t{1} << (std::numeric_limits<size_t>::digits - 1);
  struct Entry {
    size_t index;  // | kKeepsExtra
    uint64_t value;
    uint64_t left_base;
    uint64_t gap_min;  // min of the values strictly between this entry and the next one up
  };

  // As analyze() computes it from the measured maximum (sim/analysis/analysis.cpp);
  // computed when the maximum changes, not at every value (a libm call per event).
  uint64_t threshold() const { return threshold_; }
  // Only for entries that kept their Extra: the others' prominence is below any threshold
  // from their push on.
  static void consider(const Entry& e, const Extra& extra, uint64_t right_base,
                       std::vector<Peak>& out, uint64_t min_prominence) {
    const uint64_t base = std::max(e.left_base, right_base);
    const uint64_t prominence = e.value > base ? e.value - base : 0;
    if (prominence > 0 && prominence >= min_prominence)
      out.push_back(Peak{CurvePeak{e.index & ~kKeepsExtra, e.value, prominence}, extra});
  }
  // Candidates below the running threshold can never pass the final one (it only grows).
  void prune() {
    const uint64_t t = threshold();
    candidates_.erase(std::remove_if(candidates_.begin(), candidates_.end(),
                                     [t](const Peak& p) { return p.peak.prominence < t; }),
                      candidates_.end());
    prune_at_ = std::max<size_t>(1024, 2 * candidates_.size());
  }

  double fraction_;
  std::vector<Entry> stack_;
  std::vector<Extra> extras_;  // the Extra of each entry with kKeepsExtra, bottom to top
  uint64_t edge_min_ = kNone;  // min of the values between the range's start and stack_[0]
  std::vector<Peak> candidates_;  // resolved points above the running threshold
  size_t prune_at_ = 1024;
  size_t count_ = 0;
  uint64_t max_ = 0;
  uint64_t threshold_ = 0;  // floor(max_ * fraction_)
  uint64_t min_ = kNone;
  uint64_t last_ = 0;  // the last value pushed
  Peak top_{};  // the first point of the maximum
};

}  // namespace memsim
