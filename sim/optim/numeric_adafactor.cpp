#include "sim/optim/numeric_adafactor.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace memsim {
namespace {

using Eigen::ArrayXd;

// Adafactor._rms: tensor.norm(2) / (tensor.numel() ** 0.5)
double rms(const ArrayXd& x) {
  return std::sqrt(x.square().sum()) / std::sqrt(static_cast<double>(x.size()));
}

// The state buffer `name` of parameter i: zero-filled on the first step (torch.zeros),
// afterwards it must hold what the previous step left (read checks it is live).
Eigen::ArrayXd& state(graph::NumericContext& c, int32_t i, const char* name, int64_t n,
                      bool first) {
  const uint32_t id = c.optimizer_state(i, name);
  if (id == graph::kNoStorage)
    throw graph::NumericError("numeric: Adafactor: the schedule allocated no " +
                              std::string(name) + " for parameter " + c.param_names().at(i));
  if (first) {
    graph::NumericBuffer& b = c.write(id, {n}, 4);
    b.v.setZero();
    return b.v;
  }
  c.read(id, name);
  return c.buf(id).v;
}

}  // namespace

void NumericAdafactor::step(graph::Runtime& rt, graph::NumericContext& c,
                            const std::vector<ArrayXd*>& params,
                            const std::vector<const ArrayXd*>& grads) {
  (void)rt;
  if (step_.size() < params.size()) step_.resize(params.size(), 0);
  for (size_t k = 0; k < params.size(); ++k) {
    if (grads[k] == nullptr) continue;
    const auto i = static_cast<int32_t>(k);
    c.set_where("Adafactor step of " + c.param_names().at(k));
    const std::vector<int64_t>& shape = c.param_shapes().at(k);
    const bool factored = shape.size() >= 2;  // len(grad_shape) >= 2
    ArrayXd& p = *params[k];
    const ArrayXd& grad = *grads[k];
    const bool first = step_[k] == 0;
    ++step_[k];  // state["step"] += 1
    const double t = static_cast<double>(step_[k] + test_step_offset);
    // state["RMS"] = self._rms(p_data_fp32): into the 0-d tensor the schedule allocated.
    const uint32_t rms_id = c.optimizer_state(i, "RMS");
    if (rms_id == graph::kNoStorage)
      throw graph::NumericError("numeric: Adafactor: the schedule allocated no RMS for " +
                                c.param_names().at(k));
    c.write(rms_id, {}, 4).v[0] = rms(p);
    // _get_lr: relative step min(1e-2, 1/sqrt(step)), times max(eps2, RMS).
    const double rel_step_sz = std::min(1e-2, 1.0 / std::sqrt(t));
    const double param_scale = std::max(h_.eps2, c.read(rms_id, "RMS").v[0]);
    const double lr = param_scale * rel_step_sz;
    const double beta2t = 1.0 - std::pow(t, h_.decay_rate);
    ArrayXd update = grad.square() + h_.eps1;  // (grad**2) + eps[0]
    if (factored) {
      // Row-major (..., rows, cols) -> (R, C); every numeric parameter has 2 dims.
      const int64_t C = shape.back(), R = grad.size() / C;
      using RowMat = Eigen::Array<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
      Eigen::Map<const RowMat> u(update.data(), R, C);
      ArrayXd& row = state(c, i, "exp_avg_sq_row", R, first);
      ArrayXd& col = state(c, i, "exp_avg_sq_col", C, first);
      // exp_avg_sq_row.mul_(beta2t).add_(update.mean(dim=-1), alpha=1 - beta2t)
      row = row * beta2t + (1.0 - beta2t) * ArrayXd(u.rowwise().mean());
      col = col * beta2t + (1.0 - beta2t) * ArrayXd(u.colwise().mean().transpose());
      // _approx_sq_grad: (row / row.mean()).rsqrt() (R,1) * col.rsqrt() (1,C), .mul_(grad)
      const ArrayXd r_factor = (row / row.mean()).rsqrt();
      const ArrayXd c_factor = col.rsqrt();
      for (int64_t r = 0; r < R; ++r)
        for (int64_t j = 0; j < C; ++j) update[r * C + j] = r_factor[r] * c_factor[j] * grad[r * C + j];
    } else {
      ArrayXd& sq = state(c, i, "exp_avg_sq", grad.size(), first);
      sq = sq * beta2t + (1.0 - beta2t) * update;  // mul_(beta2t).add_(update, alpha=1-beta2t)
      update = sq.rsqrt() * grad;                  // exp_avg_sq.rsqrt().mul_(grad)
    }
    update /= std::max(rms(update) / h_.clip_threshold, 1.0);  // .clamp_(min=1.0)
    update *= lr;
    p += -update;  // p_data_fp32.add_(-update); weight_decay 0, no first moment
  }
}

void AdafactorReference::step(const std::vector<std::vector<int64_t>>& shapes,
                              const std::vector<ArrayXd*>& params,
                              const std::vector<const ArrayXd*>& grads) {
  if (t_.size() < params.size()) {
    t_.resize(params.size(), 0);
    R_.resize(params.size());
    C_.resize(params.size());
    V_.resize(params.size());
  }
  for (size_t k = 0; k < params.size(); ++k) {
    if (grads[k] == nullptr) continue;
    const ArrayXd& G = *grads[k];
    ArrayXd& X = *params[k];
    const int64_t t = ++t_[k];
    const int64_t N = G.size();
    // rho_t = min(1e-2, 1/sqrt(t)); alpha_t = max(eps2, RMS(X_{t-1})) rho_t
    double ss = 0;
    for (int64_t j = 0; j < N; ++j) ss += X[j] * X[j];
    const double alpha = std::max(h_.eps2, std::sqrt(ss / N)) *
                         std::min(1e-2, 1.0 / std::sqrt(static_cast<double>(t)));
    const double b2 = 1.0 - std::pow(static_cast<double>(t), h_.decay_rate);  // 1 - t^-0.8
    ArrayXd U(N);
    if (shapes.at(k).size() >= 2) {
      const int64_t n = shapes[k].back(), m = N / n;  // m rows, n columns
      if (R_[k].size() == 0) {
        R_[k] = ArrayXd::Zero(m);
        C_[k] = ArrayXd::Zero(n);
      }
      // R_t = b2 R + (1 - b2)(G^2 + eps1) 1_n;  C_t = b2 C + (1 - b2) 1_m^T (G^2 + eps1)
      for (int64_t a = 0; a < m; ++a) {
        double s = 0;
        for (int64_t b = 0; b < n; ++b) s += G[a * n + b] * G[a * n + b] + h_.eps1;
        R_[k][a] = b2 * R_[k][a] + (1 - b2) * s;
      }
      for (int64_t b = 0; b < n; ++b) {
        double s = 0;
        for (int64_t a = 0; a < m; ++a) s += G[a * n + b] * G[a * n + b] + h_.eps1;
        C_[k][b] = b2 * C_[k][b] + (1 - b2) * s;
      }
      double total = 0;
      for (int64_t a = 0; a < m; ++a) total += R_[k][a];
      // V_t = R_t C_t / (1_m^T R_t);  U_t = G_t / sqrt(V_t)
      for (int64_t a = 0; a < m; ++a)
        for (int64_t b = 0; b < n; ++b)
          U[a * n + b] = G[a * n + b] / std::sqrt(R_[k][a] * C_[k][b] / total);
    } else {
      if (V_[k].size() == 0) V_[k] = ArrayXd::Zero(N);
      for (int64_t j = 0; j < N; ++j) {
        V_[k][j] = b2 * V_[k][j] + (1 - b2) * (G[j] * G[j] + h_.eps1);
        U[j] = G[j] / std::sqrt(V_[k][j]);
      }
    }
    // U_hat = U / max(1, RMS(U) / d);  X_t = X_{t-1} - alpha_t U_hat
    double su = 0;
    for (int64_t j = 0; j < N; ++j) su += U[j] * U[j];
    const double clip = std::max(1.0, std::sqrt(su / N) / h_.clip_threshold);
    for (int64_t j = 0; j < N; ++j) X[j] -= alpha * U[j] / clip;
  }
}

}  // namespace memsim
