#include "sim/optim/numeric_adam8bit.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "sim/optim/optimizer_8bit.h"

namespace memsim {
namespace {

using Eigen::ArrayXd;

constexpr double kLr = 1e-2, kBeta1 = 0.9, kBeta2 = 0.999, kEps = 1e-8;  // numeric_hyper's

// torch 1.13's CPU linspace(0.1, 1, n) in float32 (RangeFactoriesKernel.cpp): the scalar
// lambda is start + step*idx below halfway, end - step*(n-idx-1) above (compiled to a
// fused multiply-add); the vectorised lambda, two AVX2 vectors (8 floats) at a time, is
// Vectorized::arange(scalar(idx), step): base + j*step, rounded twice.
std::vector<float> torch_linspace(int64_t n) {
  const float start = 0.1f, end = 1.0f;
  const float step = (end - start) / static_cast<float>(n - 1);
  const int64_t halfway = n / 2;
  auto scalar = [&](int64_t idx) {
    return idx < halfway ? std::fma(step, static_cast<float>(idx), start)
                         : std::fma(-step, static_cast<float>(n - idx - 1), end);
  };
  std::vector<float> out(static_cast<size_t>(n));
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {  // vectorized_loop: two vectors per iteration
    for (int64_t v = i; v < i + 16; v += 8) {
      const float base = scalar(v);
      for (int64_t j = 0; j < 8; ++j) {
        volatile float prod = step * static_cast<float>(j);  // no contraction into an fma
        out[static_cast<size_t>(v + j)] = base + prod;
      }
    }
  }
  for (; i < n; ++i) out[static_cast<size_t>(i)] = scalar(i);
  return out;
}

// bitsandbytes' quantize_2D<SIGNED> (csrc/kernels.cu): a binary search over the sorted
// map from pivot 127, then the nearer of the two neighbours by a float32 midpoint.
// NaN (a block of zeros, 0/0) compares false throughout, as on the GPU.
}  // namespace

uint8_t bnb_quantize_2d(const ArrayXd& code, bool is_signed, double x) {
  int pivot = 127, upper_pivot = 255, lower_pivot = 0;
  double lower = is_signed ? -1.0 : 0.0, upper = 1.0;
  double val = code[pivot];
  for (int i = 64; i > 0; i >>= 1) {
    if (x > val) {
      lower_pivot = pivot;
      lower = val;
      pivot += i;
    } else {
      upper_pivot = pivot;
      upper = val;
      pivot -= i;
    }
    val = code[pivot];
  }
  auto mid = [](double a, double b) {  // (a + b) * 0.5f in float32
    return static_cast<double>(static_cast<float>(static_cast<float>(a) + static_cast<float>(b)) * 0.5f);
  };
  if (x > val) return static_cast<uint8_t>(x > mid(upper, val) ? upper_pivot : pivot);
  return static_cast<uint8_t>(x < mid(lower, val) ? lower_pivot : pivot);
}

namespace {

// The schedule's buffer `name` of parameter i (kNoStorage: a NumericError).
uint32_t state_id(graph::NumericContext& c, int32_t i, const char* name) {
  const uint32_t id = c.optimizer_state(i, name);
  if (id == graph::kNoStorage)
    throw graph::NumericError("numeric: 8-bit Adam: the schedule allocated no " +
                              std::string(name) + (i < 0 ? std::string() : " for parameter " +
                                                   c.param_names().at(static_cast<size_t>(i))));
  return id;
}

// On the first step: zeros (torch.zeros_like) of n elements of esize bytes; after: the
// live buffer (a read of a freed or re-created one is a violation / NumericError).
ArrayXd& state(graph::NumericContext& c, int32_t i, const char* name, int64_t n, uint64_t esize,
               bool first) {
  const uint32_t id = state_id(c, i, name);
  if (first) {
    graph::NumericBuffer& b = c.write(id, {n}, esize);
    b.v.setZero();
    return b.v;
  }
  c.read(id, name);
  return c.buf(id).v;
}

}  // namespace

std::array<float, 256> bnb_dynamic_map(bool is_signed) {
  // create_dynamic_map(signed, max_exponent_bits=7, total_bits=8): non_sign_bits = 7,
  // no additional items; exponent i = 0..6 scales 10^(i-6) the means of linspace(0.1, 1).
  static const double kScale[7] = {1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0};
  std::vector<float> data;
  for (int i = 0; i < 7; ++i) {
    const int64_t items = is_signed ? (int64_t{1} << i) + 1 : (int64_t{1} << (i + 1)) + 1;
    const std::vector<float> b = torch_linspace(items);
    const float scale = static_cast<float>(kScale[i]);  // the Python scalar, as float32
    std::vector<float> means;
    for (size_t k = 0; k + 1 < b.size(); ++k) means.push_back((b[k] + b[k + 1]) / 2.0f);
    for (float m : means) data.push_back(m * scale);
    if (is_signed)
      for (float m : means) data.push_back(m * -scale);
  }
  data.push_back(0.0f);
  data.push_back(1.0f);
  std::sort(data.begin(), data.end());
  std::array<float, 256> out{};
  std::copy(data.begin(), data.end(), out.begin());
  return out;
}

void NumericAdam8bit::step(graph::Runtime& rt, graph::NumericContext& c,
                           const std::vector<ArrayXd*>& params,
                           const std::vector<const ArrayXd*>& grads) {
  (void)rt;
  if (step_.size() < params.size()) step_.resize(params.size(), 0);
  quantised_params = 0;
  const double lr = kLr, b1 = kBeta1, b2 = kBeta2, eps = kEps, wd = wd_;
  for (size_t k = 0; k < params.size(); ++k) {
    if (grads[k] == nullptr) continue;
    const auto i = static_cast<int32_t>(k);
    c.set_where("8-bit Adam step of " + c.param_names().at(k));
    ArrayXd& p = *params[k];
    const ArrayXd& g = *grads[k];
    const int64_t n = g.size();
    const bool first = step_[k] == 0;
    ++step_[k];  // state["step"] += 1 (a Python int)
    const double t = static_cast<double>(step_[k] + test_step_offset);
    const double c1 = 1.0 - std::pow(b1, t), c2 = std::sqrt(1.0 - std::pow(b2, t));
    const double step_size = -lr * c2 / c1;
    if (static_cast<uint64_t>(n) < kBnbMin8bitSize) {  // kOptimizer32bit2State
      ArrayXd& s1 = state(c, i, "state1", n, 4, first);
      ArrayXd& s2 = state(c, i, "state2", n, 4, first);
      for (int64_t j = 0; j < n; ++j) {
        s1[j] = s1[j] * b1 + (1.0 - b1) * g[j];
        s2[j] = s2[j] * b2 + (1.0 - b2) * (g[j] * g[j]);
        p[j] = p[j] + step_size * (s1[j] / (std::sqrt(s2[j]) + eps * c2));
        if (wd > 0.0) p[j] = p[j] * (1.0 - lr * wd);
      }
      continue;
    }
    ++quantised_params;
    // The shared maps, moved to the device by the first 8-bit parameter.
    const uint32_t q1 = state_id(c, -1, "qmap1"), q2 = state_id(c, -1, "qmap2");
    if (!maps_written_) {
      maps_written_ = true;
      const std::array<float, 256> m1 = bnb_dynamic_map(true), m2 = bnb_dynamic_map(false);
      ArrayXd& v1 = c.write(q1, {256}, 4).v;
      ArrayXd& v2 = c.write(q2, {256}, 4).v;
      for (int j = 0; j < 256; ++j) {
        v1[j] = m1[static_cast<size_t>(j)];
        v2[j] = m2[static_cast<size_t>(j)];
      }
    }
    const ArrayXd code1 = c.read(q1, "qmap1").v, code2 = c.read(q2, "qmap2").v;
    const int64_t B = static_cast<int64_t>(kBnbBlockSize), blocks = (n + B - 1) / B;
    ArrayXd& st1 = state(c, i, "state1", n, 1, first);
    ArrayXd& st2 = state(c, i, "state2", n, 1, first);
    ArrayXd& am1 = state(c, i, "absmax1", blocks, 4, first);
    ArrayXd& am2 = state(c, i, "absmax2", blocks, 4, first);
    ArrayXd s1(B), s2(B);
    auto margin = [&](const ArrayXd& code, double x, int q) {
      if (!(std::abs(x) < 1.0) || x == 0.0) return;  // exact in float32 too (or NaN)
      double d = HUGE_VAL;
      if (q > 0) d = std::min(d, std::abs(x - 0.5 * (code[q] + code[q - 1])));
      if (q < 255) d = std::min(d, std::abs(x - 0.5 * (code[q] + code[q + 1])));
      min_margin = std::min(min_margin, d / std::abs(x));
      ++decisions;
    };
    for (int64_t blk = 0; blk < blocks; ++blk) {
      const int64_t base = blk * B, valid = std::min(B, n - base);
      double max1 = -HUGE_VAL, max2 = -HUGE_VAL;
      for (int64_t j = 0; j < B; ++j) {
        // Padding slots of a partial block load state1 code 128, state2 code 0, grad 0.
        const bool in = j < valid;
        const double gv = in ? g[base + j] : 0.0;
        const auto c1s = static_cast<int64_t>(in ? st1[base + j] : 128.0);
        const auto c2s = static_cast<int64_t>(in ? st2[base + j] : 0.0);
        s1[j] = code1[c1s] * am1[blk];
        s1[j] = s1[j] * b1 + (1.0 - b1) * gv;
        s2[j] = code2[c2s] * am2[blk];
        s2[j] = s2[j] * b2 + (1.0 - b2) * gv * gv;
        max1 = std::max(max1, std::abs(s1[j]));
        max2 = std::max(max2, std::abs(s2[j]));
      }
      am1[blk] = max1;
      am2[blk] = max2;
      for (int64_t j = 0; j < valid; ++j) {
        double& pv = p[base + j];
        pv = pv + step_size * (s1[j] / (std::sqrt(s2[j]) + c2 * eps));
        if (wd > 0.0) pv = pv * (1.0 - lr * wd);
        const double x1 = s1[j] / max1, x2 = s2[j] / max2;
        uint8_t q1s = bnb_quantize_2d(code1, true, x1);
        const uint8_t q2s = bnb_quantize_2d(code2, false, x2);
        margin(code1, x1, q1s);
        margin(code2, x2, q2s);
        // Keep m's sign: the index moves one step when the code's sign differs.
        if (std::signbit(code1[q1s]) != std::signbit(s1[j])) {
          if (s1[j] > 0.0) ++q1s;
          else --q1s;  // unsigned char arithmetic, as the kernel's
        }
        st1[base + j] = q1s;
        st2[base + j] = q2s;
      }
    }
  }
}

Adam8bitReference::Adam8bitReference(double weight_decay)
    : wd_(weight_decay), map1_(bnb_dynamic_map(true)), map2_(bnb_dynamic_map(false)) {}

void Adam8bitReference::step(const std::vector<ArrayXd*>& params,
                             const std::vector<const ArrayXd*>& grads) {
  if (t_.size() < params.size()) {
    t_.resize(params.size(), 0);
    m_.resize(params.size());
    v_.resize(params.size());
  }
  // The nearest code value to x (a linear scan), times scale; for m a code of m's sign.
  auto nearest = [](const std::array<float, 256>& map, double x, bool keep_sign) {
    double best = 0, dist = HUGE_VAL;
    for (float q : map) {
      if (keep_sign && q != 0.0f && (q < 0) != (x < 0)) continue;
      if (keep_sign && q == 0.0f && x < 0) continue;  // a negative m stays negative
      const double d = std::abs(static_cast<double>(q) - x);
      if (d < dist) {
        dist = d;
        best = q;
      }
    }
    return best;
  };
  for (size_t k = 0; k < params.size(); ++k) {
    if (grads[k] == nullptr) continue;
    const ArrayXd& g = *grads[k];
    ArrayXd& p = *params[k];
    const int64_t n = g.size();
    if (m_[k].size() == 0) {
      m_[k] = ArrayXd::Zero(n);
      v_[k] = ArrayXd::Zero(n);
    }
    const int64_t t = ++t_[k];
    double pb1 = 1, pb2 = 1;
    for (int64_t s = 0; s < t; ++s) {
      pb1 *= kBeta1;
      pb2 *= kBeta2;
    }
    m_[k] = kBeta1 * m_[k] + (1 - kBeta1) * g;
    v_[k] = kBeta2 * v_[k] + (1 - kBeta2) * g * g;
    // theta = (theta - lr m_hat / (sqrt(v_hat) + eps)) (1 - lr wd)
    for (int64_t j = 0; j < n; ++j) {
      const double mh = m_[k][j] / (1 - pb1), vh = v_[k][j] / (1 - pb2);
      p[j] = (p[j] - kLr * mh / (std::sqrt(vh) + kEps)) * (1 - kLr * wd_);
    }
    if (static_cast<uint64_t>(n) < kBnbMin8bitSize) continue;  // fp32 state
    // Block-wise quantisation of the stored state: value = code * max |block|.
    const int64_t B = static_cast<int64_t>(kBnbBlockSize);
    for (int64_t base = 0; base < n; base += B) {
      const int64_t len = std::min(B, n - base);
      const double a1 = m_[k].segment(base, len).abs().maxCoeff();
      const double a2 = v_[k].segment(base, len).abs().maxCoeff();
      for (int64_t j = base; j < base + len; ++j) {
        m_[k][j] = a1 == 0 ? 0.0 : nearest(map1_, m_[k][j] / a1, true) * a1;
        v_[k][j] = a2 == 0 ? 0.0 : nearest(map2_, v_[k][j] / a2, false) * a2;
      }
    }
  }
}

}  // namespace memsim
