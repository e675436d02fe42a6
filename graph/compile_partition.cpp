// The min-cut partitioner (graph/compile_partition.h): torch's rules, memsim's max-flow.
#include "graph/compile_partition.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace memsim::graph {

namespace {

constexpr double kInf = 1e300;
constexpr uint32_t kFar = 1000000000;  // torch's int(1e9): not needed by the backward

// Dinic's max-flow on a small dense-enough graph (two nodes per vertex + source + sink).
class MaxFlow {
 public:
  explicit MaxFlow(size_t n) : head_(n, -1), level_(n), it_(n) {}
  void add(int u, int v, double cap) {
    edges_.push_back({v, head_[u], cap});
    head_[u] = static_cast<int>(edges_.size() - 1);
    edges_.push_back({u, head_[v], 0});
    head_[v] = static_cast<int>(edges_.size() - 1);
  }
  void run(int s, int t) {
    while (bfs(s, t)) {
      it_ = head_;
      while (dfs(s, t, kInf) > 0) {
      }
    }
  }
  // After run(): vertices reachable from s in the residual graph.
  std::vector<uint8_t> reachable(int s) {
    std::vector<uint8_t> seen(head_.size(), 0);
    std::vector<int> stack{s};
    seen[s] = 1;
    while (!stack.empty()) {
      const int u = stack.back();
      stack.pop_back();
      for (int e = head_[u]; e >= 0; e = edges_[e].next)
        if (edges_[e].cap > eps(edges_[e].cap) && !seen[edges_[e].to]) {
          seen[edges_[e].to] = 1;
          stack.push_back(edges_[e].to);
        }
    }
    return seen;
  }

 private:
  struct E {
    int to, next;
    double cap;
  };
  static double eps(double) { return 1e-9; }
  bool bfs(int s, int t) {
    std::fill(level_.begin(), level_.end(), -1);
    std::vector<int> q{s};
    level_[s] = 0;
    for (size_t i = 0; i < q.size(); ++i)
      for (int e = head_[q[i]]; e >= 0; e = edges_[e].next)
        if (edges_[e].cap > eps(edges_[e].cap) && level_[edges_[e].to] < 0) {
          level_[edges_[e].to] = level_[q[i]] + 1;
          q.push_back(edges_[e].to);
        }
    return level_[t] >= 0;
  }
  double dfs(int u, int t, double f) {
    if (u == t) return f;
    for (int& e = it_[u]; e >= 0; e = edges_[e].next) {
      E& ed = edges_[e];
      if (ed.cap <= eps(ed.cap) || level_[ed.to] != level_[u] + 1) continue;
      const double d = dfs(ed.to, t, std::min(f, ed.cap));
      if (d > 0) {
        ed.cap -= d;
        edges_[e ^ 1].cap += d;
        return d;
      }
    }
    return 0;
  }
  std::vector<E> edges_;
  std::vector<int> head_, level_, it_;
};

struct Options {
  bool ban_materialized_backward = true;
  bool ban_not_in_allowlist = true;
  bool ban_reduction = true;
  uint32_t max_dist = 1000;  // bans dist in (max_dist, 1000); 1.13 inductor: dist > 4
  bool torch113 = false;
};

struct Graph {
  const std::vector<PartVertex>& v;
  std::vector<std::vector<uint32_t>> users;  // forward users
  std::vector<uint32_t> dist;
};

// Every user is fusible with it: forward users by class, backward readers by the
// flag, a forward output's user is the graph's `output` node (never fusible).
bool materialized(const Graph& g, uint32_t i) {
  const PartVertex& x = g.v[i];
  if (x.cls == PartClass::primal) return true;
  if (x.output) return true;
  if (x.needed_by_backward && !(x.backward_fusible && part_fusible(x.cls))) return true;
  for (uint32_t u : g.users[i])
    if (!(part_fusible(x.cls) && part_fusible(g.v[u].cls))) return true;
  return false;
}

bool should_ban(const Graph& g, uint32_t i, const Options& o) {
  const PartVertex& x = g.v[i];
  if (x.cls == PartClass::primal) return false;  // banned by the primal rule instead
  if (o.ban_not_in_allowlist || o.torch113) {
    if (x.cls != PartClass::recomputable) return true;
  } else if (x.cls == PartClass::random || x.cls == PartClass::compute) {
    return true;
  }
  if (!o.torch113 && o.ban_materialized_backward &&
      (x.output || (x.needed_by_backward && !(x.backward_fusible && part_fusible(x.cls)))))
    return true;
  // torch 1.13's graph reads a Linear's 3-D input through aten._reshape_alias and an
  // attention matmul's operands through aten.transpose: views its inductor allowlist
  // lacks, on the forward path, so they are banned and the operand is saved as them.
  if (o.torch113 && x.read_through_unlisted_view_113) return true;
  if (o.torch113 ? g.dist[i] > o.max_dist : (g.dist[i] < 1000 && g.dist[i] > o.max_dist))
    return true;
  if (o.ban_reduction) {
    uint64_t in = 0;
    for (uint32_t a : x.inputs) in += g.v[a].bytes;
    return x.bytes * 4 < in;
  }
  return false;
}

// One solve_min_cut: the cut vertices and the vertices it banned.
void solve(const Graph& g, const Options& o, const std::vector<uint8_t>& dont_ban,
           PartitionResult& r) {
  const size_t n = g.v.size();
  const int source = static_cast<int>(2 * n), sink = source + 1;
  MaxFlow f(2 * n + 2);
  r.banned.assign(n, 0);
  for (uint32_t i = 0; i < n; ++i) {
    const PartVertex& x = g.v[i];
    const int in = static_cast<int>(2 * i), out = in + 1;
    if (g.dist[i] >= kFar && !x.output && !x.needed_by_backward) continue;  // dead code
    const bool ban = x.cls == PartClass::primal || should_ban(g, i, o);
    if (ban && !dont_ban[i]) {
      r.banned[i] = 1;
      f.add(source, in, kInf);
    }
    double w = static_cast<double>(x.bytes);
    w = std::floor(w * std::pow(1.1, std::max<uint32_t>(std::min<uint32_t>(g.dist[i], 100), 1)));
    if (!materialized(g, i)) w *= 2;
    f.add(in, out, w);
    if (x.needed_by_backward) f.add(out, sink, kInf);
    for (uint32_t u : g.users[i]) f.add(out, static_cast<int>(2 * u), kInf);
  }
  f.run(source, sink);
  const std::vector<uint8_t> reach = f.reachable(source);
  r.saved.assign(n, 0);
  // A dead vertex (no path to the backward or the outputs) has no `_in -> _out` edge:
  // it is not cut, whatever its `_in` side.
  for (uint32_t i = 0; i < n; ++i)
    r.saved[i] = reach[2 * i] && !reach[2 * i + 1] &&
                 !(g.dist[i] >= kFar && !g.v[i].output && !g.v[i].needed_by_backward);
}

uint64_t saved_bytes(const Graph& g, const std::vector<uint8_t>& saved) {
  uint64_t b = 0;
  for (size_t i = 0; i < saved.size(); ++i)
    if (saved[i]) b += g.v[i].bytes;
  return b;
}

}  // namespace

PartitionResult partition(const std::vector<PartVertex>& vertices, double budget,
                          PartitionerVersion version) {
  Graph g{vertices, {}, {}};
  const size_t n = vertices.size();
  g.users.resize(n);
  for (uint32_t i = 0; i < n; ++i)
    for (uint32_t a : vertices[i].inputs)
      if (a != i && (g.users[a].empty() || g.users[a].back() != i)) g.users[a].push_back(i);
  // dist_from_bw: a backward reader or the output node is at distance 0.
  g.dist.assign(n, kFar);
  for (size_t k = n; k-- > 0;) {
    uint32_t d = (vertices[k].needed_by_backward || vertices[k].output) ? 1 : kFar;
    for (uint32_t u : g.users[k]) d = std::min(d, g.dist[u] == kFar ? kFar : g.dist[u] + 1);
    g.dist[k] = d;
  }
  PartitionResult r;
  std::vector<uint8_t> none(n, 0);
  Options o;
  if (version == PartitionerVersion::torch113_inductor) {
    o.torch113 = true;
    o.max_dist = 4;
    solve(g, o, none, r);
    r.dist_from_bw = g.dist;
    return r;
  }
  r.dist_from_bw = g.dist;
  uint64_t min_act = 0;
  for (const PartVertex& x : vertices)
    if (x.cls == PartClass::primal) min_act += x.bytes;
  if (budget <= 0) {  // memory_budget == 0: save the inputs
    r.saved.assign(n, 0);
    r.banned.assign(n, 0);
    for (uint32_t i = 0; i < n; ++i)
      r.saved[i] = vertices[i].cls == PartClass::primal && g.dist[i] < kFar;
    return r;
  }
  solve(g, o, none, r);
  if (budget >= 1) return r;
  const uint64_t max_act = saved_bytes(g, r.saved);
  if (max_act <= min_act) return r;
  const double span = static_cast<double>(max_act - min_act);
  auto ratio = [&](const std::vector<uint8_t>& s) {
    return (static_cast<double>(saved_bytes(g, s)) - static_cast<double>(min_act)) / span;
  };
  o.ban_materialized_backward = false;  // more aggressive (far-apart and long-chain bans: n/m)
  PartitionResult more;
  solve(g, o, none, more);
  if (ratio(more.saved) < budget) return more;
  o.ban_not_in_allowlist = false;  // aggressive
  PartitionResult aggressive;
  solve(g, o, none, aggressive);
  if (ratio(aggressive.saved) < budget) return aggressive;
  // The knapsack over the banned vertices that the backward needs and that are not inputs,
  // in torch's order (by size, largest first, stable): keep (save) the most runtime the
  // budget allows, let the rest be recomputed.
  // Only values the backward needs (torch's `dist_from_bw < int(1e9)`): torch's joint
  // graph gives its output node distance 1e9, so a value that reaches only the forward's
  // outputs (the logits of torch.compile(model)) is no knapsack item, unlike g.dist here
  // that puts outputs at 1 to keep them alive in the cut.
  std::vector<uint32_t> bw_dist(n, kFar);
  for (size_t k = n; k-- > 0;) {
    uint32_t d = vertices[k].needed_by_backward ? 1 : kFar;
    for (uint32_t u : g.users[k]) d = std::min(d, bw_dist[u] == kFar ? kFar : bw_dist[u] + 1);
    bw_dist[k] = d;
  }
  std::vector<uint32_t> items;
  for (uint32_t i = 0; i < n; ++i)
    if (aggressive.banned[i] && bw_dist[i] < kFar && vertices[i].cls != PartClass::primal)
      items.push_back(i);
  std::stable_sort(items.begin(), items.end(),
                   [&](uint32_t a, uint32_t b) { return vertices[a].bytes > vertices[b].bytes; });
  if (items.empty()) {
    r.saved.assign(n, 0);
    for (uint32_t i = 0; i < n; ++i)
      r.saved[i] = vertices[i].cls == PartClass::primal && g.dist[i] < kFar;
    return r;
  }
  // torch's default solver (config.activation_memory_budget_solver = "dp"): dp_knapsack
  // in torch/_functorch/_activation_checkpointing/knapsack.py. Memories quantised to
  // round(m * 10000) (Python's round: half to even), the budget likewise; a float32 table
  // of the best saved runtime per capacity; backtracking from the full budget marks an
  // item saved where its row differs from the previous one. The rest may be recomputed.
  constexpr double kScale = 10000;
  const size_t m = items.size();
  std::vector<int64_t> q(m);
  for (size_t k = 0; k < m; ++k)
    q[k] = static_cast<int64_t>(std::nearbyint(static_cast<double>(vertices[items[k]].bytes) / span * kScale));
  const int64_t cap = static_cast<int64_t>(std::nearbyint(budget * kScale));
  const size_t width = static_cast<size_t>(cap) + 1;
  std::vector<float> dp((m + 1) * width, 0.0f);
  for (size_t i = 1; i <= m; ++i) {
    const float* prev = &dp[(i - 1) * width];
    float* row = &dp[i * width];
    const float rt = static_cast<float>(std::max(vertices[items[i - 1]].runtime, 1.0));
    const int64_t w = q[i - 1];
    for (size_t j = 0; j < width; ++j) row[j] = prev[j];
    if (w == 0) {
      for (size_t j = 0; j < width; ++j) row[j] = prev[j] + rt;
    } else {
      for (int64_t j = w; j < static_cast<int64_t>(width); ++j)
        row[j] = std::max(prev[j], prev[j - w] + rt);
    }
  }
  std::vector<uint8_t> dont_ban(n, 0);
  int64_t j = cap;
  for (size_t i = m; i >= 1; --i) {
    if (dp[i * width + static_cast<size_t>(j)] != dp[(i - 1) * width + static_cast<size_t>(j)]) {
      j -= q[i - 1];  // saved
    } else {
      dont_ban[items[i - 1]] = 1;
    }
  }
  PartitionResult last;
  solve(g, o, dont_ban, last);
  last.dist_from_bw = g.dist;
  return last;
}

}  // namespace memsim::graph
