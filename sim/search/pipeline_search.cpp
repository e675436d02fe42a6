// The dynamic program of memsim optimize on pipeline scenarios (sim/search/optimize_pipeline.h,
// "Search"). One call allocates its level arrays once and reuses its scratch from layer to
// layer; nothing is allocated per state.
#include <algorithm>
#include <climits>

#include "sim/search/optimize_pipeline.h"

namespace memsim {

namespace {

constexpr int64_t kNone = INT64_MIN;
constexpr int64_t kNoLimit = INT64_MAX;

// floor(num / a) for a > 0 (num may be negative).
int64_t floor_div(int64_t num, int64_t a) {
  return num >= 0 ? num / a : -((-num + a - 1) / a);
}

struct State {
  int64_t stored, recompute, limit;  // prefix bytes P, recompute R, upper limit U on S
  int32_t parent;
  uint8_t choice;
};

// Applies the constraints of one moment type (the gaps at level l, or a choice's window in
// layer l) to a state with prefix P and limit U: false when an a = 0 constraint fails.
template <typename Get>
bool constrain(int32_t depth, int64_t bound, int64_t P, int64_t& U, Get get) {
  for (int32_t a = 0; a < depth; ++a) {
    const int64_t x = get(a);
    if (x == kNone) continue;
    if (a == 0) {
      if (P + x > bound) return false;
    } else {
      U = std::min(U, floor_div(bound - P - x, a));
    }
  }
  return true;
}

// Prefix maximum over a Fenwick tree (1-based): "the largest U among kept states whose
// recompute rank is <= r".
class MaxFenwick {
 public:
  void reset(size_t n) { tree_.assign(n + 1, INT64_MIN); }
  void update(size_t i, int64_t v) {
    for (; i < tree_.size(); i += i & (~i + 1)) tree_[i] = std::max(tree_[i], v);
  }
  int64_t query(size_t i) const {
    int64_t best = INT64_MIN;
    for (; i > 0; i -= i & (~i + 1)) best = std::max(best, tree_[i]);
    return best;
  }

 private:
  std::vector<int64_t> tree_;
};

}  // namespace

SearchResult search_pipeline_plan(const PipelineCosts& c, int64_t bound) {
  const int32_t L = c.layers;
  const size_t C = c.choices.size();
  // The least bytes layers l.. can store (prunes states whose limit is already too low).
  std::vector<int64_t> min_suffix(static_cast<size_t>(L) + 1, 0);
  for (int32_t l = L - 1; l >= 0; --l) {
    int64_t least = INT64_MAX;
    for (size_t k = 0; k < C; ++k) least = std::min(least, c.stored[k][l]);
    min_suffix[l] = min_suffix[l + 1] + least;
  }
  std::vector<std::vector<State>> levels(static_cast<size_t>(L) + 1);
  levels[0].push_back({0, 0, kNoLimit, -1, 0});
  std::vector<State> cand;
  std::vector<uint32_t> order;
  std::vector<int64_t> ranks;  // distinct recompute values of the layer's candidates
  MaxFenwick fenwick;
  for (int32_t l = 0; l < L; ++l) {
    const std::vector<State>& cur = levels[l];
    std::vector<State>& next = levels[l + 1];
    cand.clear();
    for (size_t i = 0; i < cur.size(); ++i) {
      const State& s = cur[i];
      int64_t U = s.limit;
      if (!constrain(c.depth, bound, s.stored, U, [&](int32_t a) { return c.gap[a][l]; })) continue;
      if (U < s.stored + min_suffix[l]) continue;
      for (size_t k = 0; k < C; ++k) {
        int64_t Uk = U;
        if (!constrain(c.depth, bound, s.stored, Uk,
                       [&](int32_t a) { return c.window[a][k][l]; }))
          continue;
        const int64_t P = s.stored + c.stored[k][l];
        if (Uk < P + min_suffix[l + 1]) continue;
        cand.push_back({P, s.recompute + c.flops[k], Uk, static_cast<int32_t>(i),
                        static_cast<uint8_t>(k)});
      }
    }
    if (cand.empty()) return {};
    // Pareto front on (P, R, U): by P, then R, then U descending, a candidate survives when
    // no earlier survivor has R no larger and U no smaller. Full ties: candidate order.
    order.resize(cand.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<uint32_t>(i);
    std::sort(order.begin(), order.end(), [&cand](uint32_t ia, uint32_t ib) {
      const State& a = cand[ia];
      const State& b = cand[ib];
      if (a.stored != b.stored) return a.stored < b.stored;
      if (a.recompute != b.recompute) return a.recompute < b.recompute;
      if (a.limit != b.limit) return a.limit > b.limit;
      return ia < ib;
    });
    ranks.clear();
    for (const State& s : cand) ranks.push_back(s.recompute);
    std::sort(ranks.begin(), ranks.end());
    ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
    fenwick.reset(ranks.size());
    for (uint32_t i : order) {
      const State& s = cand[i];
      const size_t r =
          static_cast<size_t>(std::lower_bound(ranks.begin(), ranks.end(), s.recompute) -
                              ranks.begin()) + 1;
      if (fenwick.query(r) >= s.limit) continue;
      fenwick.update(r, s.limit);
      next.push_back(s);
    }
  }
  // Complete plans: the gaps after the last layer, then S itself against the limit.
  std::vector<uint8_t> idx(static_cast<size_t>(L)), best_idx;
  auto reconstruct = [&](int32_t pick) {
    for (int32_t l = L; l > 0; --l) {
      const State& s = levels[l][pick];
      idx[l - 1] = s.choice;
      pick = s.parent;
    }
  };
  SearchResult r;
  for (size_t i = 0; i < levels[L].size(); ++i) {
    const State& s = levels[L][i];
    int64_t U = s.limit;
    if (!constrain(c.depth, bound, s.stored, U, [&](int32_t a) { return c.gap[a][L]; })) continue;
    if (s.stored > U) continue;
    if (r.feasible && s.recompute > r.recompute) continue;
    // Equal recompute: the lower modelled peak (each costs O(L * depth), no allocation).
    reconstruct(static_cast<int32_t>(i));
    const int64_t peak = pipeline_model_peak(c, idx.data());
    if (!r.feasible || s.recompute < r.recompute || peak < r.peak) {
      r.feasible = true;
      r.recompute = s.recompute;
      r.peak = peak;
      best_idx = idx;
    }
  }
  if (r.feasible) {
    r.plan.layers.resize(static_cast<size_t>(L));
    for (int32_t l = 0; l < L; ++l) r.plan.layers[l] = c.choices[best_idx[l]];
  }
  return r;
}

SearchResult smallest_pipeline_peak_plan(const PipelineCosts& c) {
  return smallest_peak_by_bisection(
      [&c](int64_t bound) { return search_pipeline_plan(c, bound); });
}

}  // namespace memsim
