#include "sim/check/numeric_check.h"

#include "scenario/arch_checks.h"

#include <cmath>
#include <sstream>

#include "graph/numeric/numeric.h"
#include "sim/megatron/megatron_step.h"
#include "sim/optim/numeric_adafactor.h"
#include "sim/optim/numeric_adam8bit.h"
#include "sim/optim/numeric_optimizer.h"
#include "sim/step/checkpoint_policy.h"
#include "sim/step/model_family.h"
#include "sim/step/schedule.h"

namespace memsim {

using Eigen::ArrayXd;

// Parameter counts of the tiny models (numeric mode's size limit; the rows'
// numeric_parameters, sim/step/model_family.h).
namespace family_builders {

int64_t cs336_numeric_parameters(const Scenario& s) {
  const int64_t D = s.model.d_model, F = s.model.d_ff, V = s.model.vocab, L = s.model.layers;
  return 2 * V * D + L * (4 * D * D + 3 * D * F + 2 * D) + D;
}

int64_t hf_llama_numeric_parameters(const Scenario& s) {
  const int64_t D = s.model.d_model, F = s.model.d_ff, V = s.model.vocab, L = s.model.layers;
  const int64_t kvD = (s.model.kv_heads > 0 ? s.model.kv_heads : s.model.heads) *
                      (s.model.heads > 0 ? D / s.model.heads : 0);
  const int64_t head = s.model.tied_embeddings ? 0 : V * D;
  return V * D + head + L * (2 * D * D + 2 * kvD * D + 3 * D * F + 2 * D) + D;
}

int64_t hf_gpt2_numeric_parameters(const Scenario& s) {
  const int64_t D = s.model.d_model, F = s.model.d_ff, V = s.model.vocab, L = s.model.layers;
  const int64_t head = s.model.tied_embeddings ? 0 : V * D;
  return V * D + head + s.model.context_length * D +
         L * (4 * D * D + 2 * D * F + 9 * D + F) + 2 * D;
}

int64_t megatron_numeric_parameters(const Scenario& s) {
  return graph::megatron_parameter_count(megatron_shape(s));
}

}  // namespace family_builders

graph::NumericModel numeric_model(const Scenario& s) {
  graph::NumericModel m;
  m.family = family_build(s.model.family).numeric;
  m.batch = s.batch.micro_batch;
  m.seq = s.batch.seq_len;
  m.d_model = s.model.d_model;
  m.heads = s.model.heads;
  m.kv_heads = s.model.kv_heads > 0 ? s.model.kv_heads : s.model.heads;
  m.d_ff = s.model.d_ff;
  m.vocab = s.model.vocab;
  m.context = s.model.context_length > 0 ? s.model.context_length : s.batch.seq_len;
  m.tied = s.model.tied_embeddings;
  m.elem = static_cast<uint64_t>(dtype_bytes(s.precision.params));
  m.dropout = s.model.dropout;
  return m;
}

namespace {

// One numeric run of the whole program.
struct RunOut {
  double loss = 0;
  std::vector<ArrayXd> grads, init_params, final_params;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<std::string> names;
  std::string error;  // first violation or NumericError
  size_t violations = 0;
  int optimizer_steps = 0;
  double optimizer_err = 0;
  int optimizer_8bit_params = 0;
  int64_t quantisations = 0;
  double quantisation_margin = 0;
};

double max_abs(const ArrayXd& a) { return a.size() == 0 ? 0.0 : a.abs().maxCoeff(); }

RunOut run_once(const Scenario& s, const TrainingScript& script, const NumericCheckOptions& o,
                const std::vector<ArrayXd>* init) {
  RunOut out;
  graph::NumericContext ctx(numeric_model(s));
  ctx.test_drop_save = o.test_drop_save;
  ctx.test_drop_optimizer_state = o.test_drop_optimizer_state;
  if (init != nullptr) ctx.set_initial_params(*init);
  const bool decay_after = script.cs336_revision == graph::Cs336Revision::v2025;
  NumericOptimizer modelled(s.optimizer, decay_after, false);
  NumericOptimizer reference(s.optimizer, decay_after, true);
  // Adafactor and bitsandbytes 8-bit Adam(W): modelled kernels on the schedule's state
  // buffers (sim/optim/numeric_adafactor.h, sim/optim/numeric_adam8bit.h), independent references.
  const OptimizerType type = s.optimizer.type;
  NumericAdafactor adafactor;
  AdafactorReference adafactor_ref;
  adafactor.test_step_offset = o.test_optimizer_step_offset;
  const double wd8 = type == OptimizerType::adamw8bit ? numeric_hyper_8bit_weight_decay : 0.0;
  NumericAdam8bit adam8(wd8);
  Adam8bitReference adam8_ref(wd8);
  adam8.test_step_offset = o.test_optimizer_step_offset;
  const bool no_decay_1d = family_row(s.model.family).numeric_no_decay_1d;
  ctx.optimizer_step = [&](graph::Runtime& rt, graph::NumericContext& c) {
    const size_t n = rt.parameters().size();
    if (no_decay_1d) {  // Megatron's param groups: 1-D parameters (biases, norms) do not decay
      std::vector<bool> no_decay(n);
      for (size_t i = 0; i < n; ++i) no_decay[i] = c.param_shapes().at(i).size() == 1;
      modelled.set_no_decay(no_decay);
      reference.set_no_decay(std::move(no_decay));
    }
    std::vector<ArrayXd> before(n), grads(n), ref(n);
    std::vector<ArrayXd*> mp(n, nullptr), rp(n, nullptr);
    std::vector<const ArrayXd*> g(n, nullptr);
    for (size_t i = 0; i < n; ++i) {
      const ArrayXd* gv = c.grad_values(rt, static_cast<int32_t>(i));
      if (gv != nullptr) {
        grads[i] = *gv;
        g[i] = &grads[i];
      }
      before[i] = c.param_values(rt, static_cast<int32_t>(i));
      ref[i] = before[i];
      mp[i] = &c.param_values_mut(rt, static_cast<int32_t>(i));
      rp[i] = &ref[i];
    }
    if (type == OptimizerType::adafactor) {
      adafactor.step(rt, c, mp, g);
      adafactor_ref.step(c.param_shapes(), rp, g);
    } else if (type == OptimizerType::adam8bit || type == OptimizerType::adamw8bit) {
      adam8.step(rt, c, mp, g);
      adam8_ref.step(rp, g);
      out.optimizer_8bit_params = static_cast<int>(adam8.quantised_params);
      out.quantisations = adam8.decisions;
      out.quantisation_margin = adam8.min_margin;
    } else {
      modelled.step(mp, g);
      reference.step(rp, g);
    }
    for (size_t i = 0; i < n; ++i) {
      if (g[i] == nullptr) continue;
      const ArrayXd dm = *mp[i] - before[i], dr = ref[i] - before[i];
      const double scale = std::max(max_abs(dr), 1e-300);
      double err = max_abs(dm - dr) / scale;
      if (!std::isfinite(err)) err = INFINITY;
      out.optimizer_err = std::max(out.optimizer_err, err);
    }
    ++out.optimizer_steps;
  };
  try {
    build_program(s, script, &ctx);
  } catch (const graph::NumericError& e) {
    out.error = e.what();
  }
  out.violations = ctx.violation_count();
  if (out.error.empty() && !ctx.violations().empty()) out.error = ctx.violations().front();
  out.loss = ctx.have_first() ? ctx.first_loss() : NAN;
  out.grads = ctx.first_grads();
  out.init_params = ctx.initial_params();
  out.shapes = ctx.param_shapes();
  out.names = ctx.param_names();
  for (size_t i = 0; i < out.names.size(); ++i) out.final_params.push_back(ctx.current_param(i));
  return out;
}

bool all_finite(const RunOut& r) {
  if (!std::isfinite(r.loss)) return false;
  for (const ArrayXd& g : r.grads)
    if (!g.allFinite()) return false;
  for (const ArrayXd& p : r.final_params)
    if (!p.allFinite()) return false;
  return true;
}

// Bitwise comparison (NaN never equals): returns the largest |difference|, or inf.
double diff(const RunOut& a, const RunOut& b, bool& identical) {
  identical = a.loss == b.loss && a.grads.size() == b.grads.size() &&
              a.final_params.size() == b.final_params.size();
  double d = std::isfinite(a.loss - b.loss) ? std::abs(a.loss - b.loss) : INFINITY;
  if (!identical) return d == 0 ? INFINITY : d;
  auto cmp = [&](const std::vector<ArrayXd>& x, const std::vector<ArrayXd>& y) {
    for (size_t i = 0; i < x.size(); ++i) {
      if (x[i].size() != y[i].size()) {
        identical = false;
        d = INFINITY;
        continue;
      }
      for (Eigen::Index j = 0; j < x[i].size(); ++j) {
        if (!(x[i][j] == y[i][j])) identical = false;
        const double e = std::abs(x[i][j] - y[i][j]);
        d = std::max(d, std::isfinite(e) ? e : INFINITY);
      }
    }
  };
  cmp(a.grads, b.grads);
  cmp(a.final_params, b.final_params);
  return d;
}

std::vector<std::string> default_policies(int64_t layers) {
  std::vector<std::string> p = {"none", "full", "uniform:2", "block:1", "modules",
                                "selective", "sqrt"};
  if (layers < 2) p[2] = "uniform:1";
  p.push_back(layers >= 2 ? "custom:0,1.mlp" : "custom:0.attention");
  p.push_back("full+reentrant");
  p.push_back("full+no-early-stop");
  return p;
}

}  // namespace

void validate_numeric_scenario(const Scenario& s) {
  const std::string where = s.source + ": ";
  const ModelFamily f = s.model.family;
  const FamilyRow& row = family_row(f);
  if (row.tensor_parallel) {
    if (s.parallel.tensor > 1 || s.parallel.sequence || s.parallel.pipeline > 1)
      throw ScenarioError(where + "parallel: numeric mode runs megatron with tensor 1, "
                          "pipeline 1 and no sequence parallelism");
  }
  if (s.precision.params != DType::fp32 || s.precision.autocast || s.precision.master_weights)
    throw ScenarioError(where + "precision: numeric mode needs fp32 parameters without "
                        "autocast or master weights");
  if (s.loss.impl == LossFunction::one_hot || s.loss.positions != LossPositions::all ||
      s.optimizer.impl == OptimizerImpl::out_of_place)
    throw ScenarioError(where + "loss.impl / loss.positions / optimizer.impl: numeric mode "
                        "has no kernels for the one-hot loss, the last-position select and the "
                        "out-of-place Adam");
  // loss.impl on the hf families, chunked:N and liger (docs/losses.md): no numeric kernels.
  if (s.loss.impl == LossFunction::chunked || s.loss.impl == LossFunction::liger ||
      (!row.staff_model && s.loss.impl != LossFunction::automatic))
    throw ScenarioError(where + "loss.impl: numeric mode checks the model's own loss "
                        "(hf-*) and the cs336 script losses only");
  if (s.model.softmax != SoftmaxImpl::staff || s.model.sdpa != SdpaImpl::staff)
    throw ScenarioError(where + "model.softmax / model.sdpa: numeric mode checks the staff "
                        "softmax and attention only");
  if (!row.staff_model) {
    // hf-llama's flash and mem-efficient kernels have numeric kernels (causal, no dropout);
    // hf-gpt2 models eager attention only.
    if (!row.numeric_fused_attention && s.model.attention != AttentionImpl::eager)
      throw ScenarioError(where + "model.attention: hf-gpt2 is modelled with eager attention "
                          "only (not '" + to_string(s.model.attention) + "')");
    // SDPA's cuDNN kernel and 5.x's grouped (enable_gqa) SDPA call have no numeric kernels
    // (graph/ops/ops_sdpa_cudnn.h, docs/sdpa-gqa.md).
    if (s.model.attention == AttentionImpl::cudnn)
      throw ScenarioError(where + "model.attention: numeric mode has no cuDNN attention kernel "
                          "(use flash: the same arithmetic)");
    if (s.model.attention != AttentionImpl::eager && s.model.arch.sdpa_gqa &&
        s.model.kv_heads < s.model.heads)
      throw ScenarioError(where + "model.transformers: numeric mode has no kernel for 5.x's "
                          "enable_gqa SDPA call with grouped KV heads (use 4, or eager)");
    // Dropout masks are deterministic in numeric mode (NumericContext::dropout_mask); the
    // SDPA kernels' internal dropout has no numeric kernel.
    if (s.model.dropout > 0.0 && s.model.attention != AttentionImpl::eager)
      throw ScenarioError(where + "model.dropout: numeric mode has no dropout inside the "
                          "SDPA / fused attention kernels (use attention eager or dropout 0)");
    if (s.lora.rank > 0)
      throw ScenarioError(where + "lora.rank: numeric mode has no LoRA / QLoRA kernels");
    if (const char* key = first_arch_knob(s))
      throw ScenarioError(where + key + ": numeric mode has kernels for the llama and gpt2 "
                          "architecture rows only (not '" + s.model.arch.architecture + "')");
  }
  // Adafactor and 8-bit Adam(W) have numeric kernels on the state the schedules allocate
  // (sim/optim/numeric_adafactor.h, sim/optim/numeric_adam8bit.h) where memsim models them.
  const OptimizerType ot = s.optimizer.type;
  if (ot == OptimizerType::adafactor && !row.numeric_adafactor)
    throw ScenarioError(where + "optimizer.type: numeric mode runs adafactor on hf-llama and "
                        "hf-gpt2 only (family '" + to_string(f) + "')");
  if ((ot == OptimizerType::adam8bit || ot == OptimizerType::adamw8bit) && !row.numeric_adam8bit)
    throw ScenarioError(where + "optimizer.type: numeric mode runs " + to_string(ot) +
                        " on cs336, hf-llama and hf-gpt2 only (family '" + to_string(f) + "')");
  if (s.parallel.data > 1 || s.parallel.sharding != Sharding::none)
    throw ScenarioError(where + "parallel: numeric mode runs a single process (data 1, no FSDP)");
  const int64_t D = s.model.d_model, H = s.model.heads;
  const int64_t KV = s.model.kv_heads > 0 ? s.model.kv_heads : H;
  if (H <= 0 || D % H != 0 || (D / H) % 2 != 0 || KV <= 0 || H % KV != 0)
    throw ScenarioError(where + "model.heads: d_model must split into heads of even size "
                        "(and heads into kv_heads groups)");
  const int64_t params = family_build(f).numeric_parameters(s);
  const int64_t tokens = s.batch.micro_batch * s.batch.seq_len;
  if (params > 200000 || tokens > 256 || s.model.layers > 8 || s.step.warmup_steps > 8 ||
      s.batch.grad_accum > 4)
    throw ScenarioError(where + "numeric mode is for tiny configurations (at most 200000 "
                        "parameters, 256 tokens per micro-batch, 8 layers, 8 warm-up steps, "
                        "grad_accum 4); this one has " + std::to_string(params) +
                        " parameters and " + std::to_string(tokens) + " tokens");
}

NumericCheckReport run_numeric_check(const Scenario& scenario, const NumericCheckOptions& o) {
  validate_numeric_scenario(scenario);
  NumericCheckReport rep;
  const TrainingScript script = default_script(scenario);
  std::vector<std::string> policies = o.policies.empty() ? default_policies(scenario.model.layers)
                                                         : o.policies;
  // The reference run: the scenario as written, no checkpointing.
  Scenario base = scenario;
  base.checkpoint = CheckpointConfig{};
  const RunOut ref = run_once(base, script, o, nullptr);
  rep.loss = ref.loss;
  for (const ArrayXd& p : ref.init_params) rep.parameters += p.size();
  rep.optimizer = numeric_optimizer_name(scenario.optimizer,
                                         script.cs336_revision == graph::Cs336Revision::v2025);
  if (family_row(scenario.model.family).numeric_no_decay_1d)
    rep.optimizer = "Megatron " + rep.optimizer.substr(rep.optimizer.find(' ') + 1) +
                    ", 1-D parameters (biases, norms) not decayed";
  rep.optimizer_steps = ref.optimizer_steps;
  rep.optimizer_max_rel_error = ref.optimizer_err;
  rep.optimizer_8bit_params = ref.optimizer_8bit_params;
  rep.quantisations = ref.quantisations;
  rep.quantisation_margin = ref.quantisation_margin;
  if (!ref.error.empty())
    rep.failures.push_back("policy none: " + ref.error + " (" + std::to_string(ref.violations) +
                           " violations)");
  else if (!all_finite(ref))
    rep.failures.push_back("policy none: the loss, a gradient or a parameter is not finite");
  if (!(rep.optimizer_max_rel_error <= o.optimizer_tolerance))
    rep.failures.push_back("optimizer: the modelled update differs from the reference by " +
                           std::to_string(rep.optimizer_max_rel_error) + " (relative)");

  // Finite differences of the first loss (forward + backward only, no warm-up).
  {
    Scenario fd = base;
    fd.step.warmup_steps = 0;
    fd.step.kind = StepKind::forward_backward;
    const TrainingScript fd_script = default_script(fd);
    for (size_t i = 0; i < ref.init_params.size() && ref.error.empty(); ++i) {
      const ArrayXd& g = ref.grads[i];
      if (g.size() == 0) continue;
      std::vector<Eigen::Index> picks;
      Eigen::Index top = 0;
      g.abs().maxCoeff(&top);
      picks.push_back(top);
      for (int k = 0; k < o.fd_samples; ++k)
        picks.push_back(static_cast<Eigen::Index>((static_cast<uint64_t>(k) * 7919u + i * 31u + 1u) %
                                                  static_cast<uint64_t>(g.size())));
      for (Eigen::Index j : picks) {
        // Fourth-order central differences: (8 (L(+h) - L(-h)) - (L(+2h) - L(-2h))) / 12h.
        // Truncation O(h^4) and rounding (1e-16 |L| / h) both stay near 1e-12 at h 1e-3,
        // well below the smallest gradients a tiny model has (~1e-5).
        auto loss_at = [&](double delta) {
          std::vector<ArrayXd> p = ref.init_params;
          p[i][j] += delta;
          return run_once(fd, fd_script, o, &p).loss;
        };
        const double h = o.fd_step;
        const double num = (8.0 * (loss_at(h) - loss_at(-h)) - (loss_at(2 * h) - loss_at(-2 * h))) /
                           (12.0 * h);
        // Relative, with an absolute floor at the differences' own noise (~1e-10).
        // The floor scales with |loss|: the differences' rounding noise does (megatron's
        // loss is a sum over tokens, ~70 for the tiny model, not a mean).
        double rel = std::abs(num - g[j]) /
                     (std::max(std::abs(num), std::abs(g[j])) + 1e-6 * std::max(1.0, std::abs(ref.loss)));
        if (!std::isfinite(rel)) rel = INFINITY;
        ++rep.fd_points;
        if (rel >= rep.fd_max_rel_error) {
          rep.fd_max_rel_error = rel;
          std::ostringstream w;
          w.precision(10);
          w << ref.names[i] << "[" << j << "]: analytic " << g[j] << ", finite difference " << num;
          rep.fd_worst = w.str();
        }
      }
    }
    if (!(rep.fd_max_rel_error <= o.fd_tolerance))
      rep.failures.push_back("finite differences: max relative error " +
                             std::to_string(rep.fd_max_rel_error) + " at " + rep.fd_worst);
  }

  // Every policy against the reference, bit for bit.
  for (const std::string& spec : policies) {
    PolicyCheck pc;
    pc.policy = spec;
    Scenario s = scenario;
    TrainingScript sc = script;
    std::string name = spec;
    const size_t plus = spec.find('+');
    if (plus != std::string::npos) {
      name = spec.substr(0, plus);
      const std::string variant = spec.substr(plus + 1);
      if (variant == "reentrant") s.checkpoint.reentrant = true;
      else if (variant == "no-early-stop") sc.checkpoint_early_stop = false;
      else throw ScenarioError("--policies: unknown variant '+" + variant +
                               "' (known: +reentrant, +no-early-stop)");
    }
    const std::optional<bool> reentrant = s.checkpoint.reentrant;
    try {
      s.checkpoint = parse_policy(name);
    } catch (const PolicyError& e) {
      throw ScenarioError(std::string("--policies: ") + e.what());
    }
    s.checkpoint.reentrant = reentrant;
    const RunOut r = run_once(s, sc, o, nullptr);
    pc.error = r.error;
    pc.max_abs_diff = diff(r, ref, pc.identical);
    if (!r.error.empty()) pc.identical = false;
    if (!pc.identical)
      rep.failures.push_back("policy " + spec + ": " +
                             (r.error.empty() ? "results differ from policy none by " +
                                                    std::to_string(pc.max_abs_diff)
                                              : r.error));
    rep.policies.push_back(pc);
  }
  return rep;
}

}  // namespace memsim
