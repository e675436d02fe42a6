#include "graph/models/moe_routing.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <stdexcept>

namespace memsim::graph {

namespace {

std::vector<int64_t> skewed(int64_t E, int64_t T, int64_t K, double alpha) {
  const double total = static_cast<double>(T * K);
  std::vector<double> w(static_cast<size_t>(E)), share(static_cast<size_t>(E), 0.0);
  for (int64_t e = 0; e < E; ++e) w[e] = std::pow(static_cast<double>(e + 1), -alpha);
  std::vector<uint8_t> capped(static_cast<size_t>(E), 0);
  for (bool again = true; again;) {  // water-filling: cap at T, re-spread the rest
    again = false;
    double left = total, weight = 0.0;
    for (int64_t e = 0; e < E; ++e) {
      if (capped[e]) left -= static_cast<double>(T);
      else weight += w[e];
    }
    for (int64_t e = 0; e < E; ++e) {
      if (capped[e]) { share[e] = static_cast<double>(T); continue; }
      share[e] = weight > 0 ? left * w[e] / weight : 0.0;
      if (share[e] > static_cast<double>(T)) { capped[e] = 1; again = true; }
    }
  }
  std::vector<int64_t> c(static_cast<size_t>(E));
  int64_t sum = 0;
  for (int64_t e = 0; e < E; ++e) {
    c[e] = std::min<int64_t>(T, static_cast<int64_t>(std::floor(share[e] + 1e-9)));
    sum += c[e];
  }
  std::vector<int64_t> order(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) order[e] = e;
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return share[a] - std::floor(share[a] + 1e-9) > share[b] - std::floor(share[b] + 1e-9);
  });
  for (size_t i = 0; sum < T * K; i = (i + 1) % order.size()) {
    const int64_t e = order[i];
    if (c[e] < T) { ++c[e]; ++sum; }
  }
  return c;
}

}  // namespace

std::vector<int64_t> routed_tokens(const MoeSpec& m, int64_t tokens, int64_t moe_layer) {
  const int64_t E = m.experts, K = m.top_k, T = tokens;
  if (E <= 0 || K <= 0 || K > E) throw std::invalid_argument("routed_tokens: top_k must be in [1, experts]");
  std::vector<int64_t> c(static_cast<size_t>(E), 0);
  switch (m.routing) {
    case MoeRouting::balanced:
      for (int64_t e = 0; e < E; ++e) c[e] = T * K / E + (e < (T * K) % E ? 1 : 0);
      return c;
    case MoeRouting::worst_case:
      for (int64_t e = 0; e < K; ++e) c[e] = T;
      return c;
    case MoeRouting::skew:
      return skewed(E, T, K, m.skew_alpha);
    case MoeRouting::counts: {
      const size_t n = m.counts.size(), row = static_cast<size_t>(E);
      const size_t first = n == row ? 0 : static_cast<size_t>(moe_layer) * row;
      if (n % row != 0 || first + row > n)
        throw std::invalid_argument("routed_tokens: counts do not cover this MoE layer");
      int64_t sum = 0;
      for (int64_t e = 0; e < E; ++e) {
        c[e] = m.counts[first + e];
        if (c[e] < 0 || c[e] > T) throw std::invalid_argument("routed_tokens: a count outside [0, tokens]");
        sum += c[e];
      }
      if (sum != T * K) throw std::invalid_argument("routed_tokens: counts do not sum to tokens x top_k");
      return c;
    }
  }
  return c;
}

std::string describe_routing(const MoeSpec& m) {
  switch (m.routing) {
    case MoeRouting::balanced: return "balanced";
    case MoeRouting::worst_case: return "worst-case";
    case MoeRouting::skew: {
      char buf[48];
      std::snprintf(buf, sizeof buf, "skew:%g", m.skew_alpha);
      return buf;
    }
    case MoeRouting::counts: {
      std::string s = "counts:[";
      for (size_t i = 0; i < m.counts.size(); ++i) s += (i ? "," : "") + std::to_string(m.counts[i]);
      return s + "]";
    }
  }
  return "";
}

}  // namespace memsim::graph
