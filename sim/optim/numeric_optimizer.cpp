#include "sim/optim/numeric_optimizer.h"

#include <cmath>

namespace memsim {

NumericHyper numeric_hyper(const OptimizerConfig& config) {
  NumericHyper h;
  switch (config.type) {
    case OptimizerType::adamw: h.weight_decay = 0.1; break;
    case OptimizerType::adam: h.weight_decay = 0.0; break;
    case OptimizerType::sgd: h.lr = 0.1; h.momentum = config.momentum; break;
    case OptimizerType::none: break;
    default: break;  // Adafactor / 8-bit: sim/optim/numeric_adafactor.h, sim/optim/numeric_adam8bit.h
  }
  return h;
}

std::string numeric_optimizer_name(const OptimizerConfig& config, bool cs336_decay_after) {
  if (config.type == OptimizerType::none) return "none";
  if (config.type == OptimizerType::adafactor)
    return "transformers Adafactor (defaults: relative step, scale_parameter, factored)";
  if (config.type == OptimizerType::adam8bit || config.type == OptimizerType::adamw8bit)
    return std::string("bitsandbytes ") +
           (config.type == OptimizerType::adamw8bit ? "AdamW8bit" : "Adam8bit") +
           " (block-wise 256, min_8bit_size 4096)";
  if (config.type == OptimizerType::sgd)
    return "torch SGD (momentum " + std::to_string(config.momentum) + ")";
  const std::string t = config.type == OptimizerType::adamw ? "AdamW" : "Adam";
  if (config.impl == OptimizerImpl::cs336)
    return "cs336 " + t + (cs336_decay_after ? " (decay after update)" : " (decay before update)");
  return "torch " + t + " (" + to_string(config.impl) + ")";
}

NumericOptimizer::NumericOptimizer(const OptimizerConfig& config, bool cs336_decay_after,
                                   bool reference)
    : config_(config), h_(numeric_hyper(config)), decay_after_(cs336_decay_after),
      reference_(reference) {}

void NumericOptimizer::step(const std::vector<Eigen::ArrayXd*>& params,
                            const std::vector<const Eigen::ArrayXd*>& grads) {
  if (m_.size() < params.size()) {
    m_.resize(params.size());
    v_.resize(params.size());
    t_.resize(params.size(), 0);
  }
  for (size_t i = 0; i < params.size(); ++i) {
    if (grads[i] == nullptr) continue;
    if (m_[i].size() == 0) {
      m_[i] = Eigen::ArrayXd::Zero(grads[i]->size());
      v_[i] = Eigen::ArrayXd::Zero(grads[i]->size());
    }
    ++t_[i];
    if (reference_) textbook(i, *params[i], *grads[i]);
    else modelled(i, *params[i], *grads[i]);
  }
}

// As the implementations write it (see the header).
void NumericOptimizer::modelled(size_t i, Eigen::ArrayXd& p, const Eigen::ArrayXd& g) {
  const double lr = h_.lr, b1 = h_.beta1, b2 = h_.beta2, eps = h_.eps, wd = decay(i);
  const double t = static_cast<double>(t_[i]);
  Eigen::ArrayXd& m = m_[i];
  Eigen::ArrayXd& v = v_[i];
  if (config_.type == OptimizerType::sgd) {
    if (h_.momentum == 0.0) {
      p -= lr * g;  // param.add_(grad, alpha=-lr)
      return;
    }
    if (t_[i] == 1) m = g;  // buf = torch.clone(grad).detach()
    else m = m * h_.momentum + g;  // buf.mul_(momentum).add_(grad, alpha=1 - dampening)
    p -= lr * m;
    return;
  }
  if (config_.impl == OptimizerImpl::cs336) {
    if (!decay_after_) p -= lr * wd * p;  // p.data -= lr * weight_decay * p.data
    m = b1 * m + (1 - b1) * g;
    v = b2 * v + (1 - b2) * g.square();
    const double lr_t = lr * std::sqrt(1 - std::pow(b2, t)) / (1 - std::pow(b1, t));
    p -= lr_t * m / (v.sqrt() + eps);
    if (decay_after_) p -= lr * wd * p;
    return;
  }
  // torch _single_tensor_adam (foreach / fused: the same math per element).
  if (config_.type == OptimizerType::adamw) p *= 1 - lr * wd;  // param.mul_(1 - lr*wd)
  m += (g - m) * (1 - b1);                                      // exp_avg.lerp_(grad, 1-b1)
  v = v * b2 + (1 - b2) * g * g;                                // mul_(b2).addcmul_(...)
  const double bc1 = 1 - std::pow(b1, t), bc2 = 1 - std::pow(b2, t);
  const double step_size = lr / bc1;
  const Eigen::ArrayXd denom = v.sqrt() / std::sqrt(bc2) + eps;
  p += -step_size * (m / denom);                                // addcdiv_(..., -step_size)
}

// Textbook forms.
void NumericOptimizer::textbook(size_t i, Eigen::ArrayXd& p, const Eigen::ArrayXd& g) {
  const double lr = h_.lr, b1 = h_.beta1, b2 = h_.beta2, eps = h_.eps, wd = decay(i);
  const int64_t t = t_[i];
  if (config_.type == OptimizerType::sgd) {
    // v_t = mu * v_{t-1} + g_t (v_1 = g_1), theta -= lr * v_t
    if (h_.momentum != 0.0) {
      m_[i] = t == 1 ? g : Eigen::ArrayXd(h_.momentum * m_[i] + g);
      p = p - lr * m_[i];
    } else {
      p = p - lr * g;
    }
    return;
  }
  m_[i] = b1 * m_[i] + (1 - b1) * g;
  v_[i] = b2 * v_[i] + (1 - b2) * g * g;
  double c1 = 1, c2 = 1;
  for (int64_t k = 0; k < t; ++k) { c1 *= b1; c2 *= b2; }
  if (config_.impl == OptimizerImpl::cs336) {
    // CS336 handout Algorithm 1: alpha_t = alpha sqrt(1-b2^t)/(1-b1^t); the update uses
    // the raw m and v; decoupled decay alpha*lambda*theta before or after it.
    const double at = lr * std::sqrt(1 - c2) / (1 - c1);
    if (!decay_after_) p = p - lr * wd * p;
    p = p - at * m_[i] / (v_[i].sqrt() + eps);
    if (decay_after_) p = p - lr * wd * p;
    return;
  }
  // Adam(W): m_hat = m/(1-b1^t), v_hat = v/(1-b2^t); theta -= lr*(m_hat/(sqrt(v_hat)+eps)
  // + wd*theta) (decoupled decay, AdamW only).
  const Eigen::ArrayXd mh = m_[i] / (1 - c1), vh = v_[i] / (1 - c2);
  const double decay = config_.type == OptimizerType::adamw ? wd : 0.0;
  p = p - lr * (mh / (vh.sqrt() + eps) + decay * p);
}

}  // namespace memsim
