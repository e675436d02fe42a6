// NumericContext: the buffer store and the Runtime hooks (see graph/numeric/numeric.h). The op
// kernels are in graph/numeric/numeric_ops.cpp.
#include "graph/numeric/numeric.h"

#include <cmath>
#include <limits>

#include "graph/ops/op_helpers.h"

namespace memsim::graph {


namespace detail {
void numeric_forward_impl(Runtime& rt, OpKind k, std::initializer_list<const Tensor*> in,
                          std::initializer_list<const Tensor*> out) {
  rt.numeric->forward(rt, k, in, out);
}
}  // namespace detail

namespace {
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// splitmix64: deterministic, platform-independent values for parameters and tokens.
uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
double uniform(uint64_t seed, uint64_t salt, uint64_t i) {  // in [-1, 1)
  const uint64_t r = mix(mix(seed * 1000003ull + salt) + i);
  return static_cast<double>(r >> 11) * (2.0 / 9007199254740992.0) - 1.0;
}
}  // namespace

NumericBuffer& NumericContext::buf(uint32_t id) {
  if (id == kNoStorage) throw NumericError("numeric: " + where_ + ": a tensor with no storage");
  if (id >= store_.size()) store_.resize(static_cast<size_t>(id) + 1);
  return store_[id];
}

void NumericContext::restore(uint32_t id) {
  auto it = stash_.find(id);
  if (it == stash_.end()) return;
  buf(id) = std::move(it->second);
  stash_.erase(it);
}

void NumericContext::violation(const std::string& what) {
  ++violation_count_;
  if (violations_.size() < 20) violations_.push_back(what);
}

const NumericBuffer& NumericContext::read(uint32_t id, const char* what) {
  if (id == kNoStorage)
    throw NumericError("numeric: " + where_ + ": " + what +
                       " was neither saved nor recomputed by the schedule");
  NumericBuffer& b = buf(id);
  switch (b.state) {
    case NumericBuffer::State::live: break;
    case NumericBuffer::State::freed:
      // Poisoned values flow on (NaN): the check then also sees them in the results.
      violation(where_ + " reads " + what + " (tensor #" + std::to_string(id) +
                ") after the schedule freed it");
      break;
    case NumericBuffer::State::absent:
    case NumericBuffer::State::allocated:
      throw NumericError("numeric: " + where_ + ": " + what + " (tensor #" +
                         std::to_string(id) + ") was never computed (no kernel wrote it)");
  }
  return b;
}

NumericBuffer& NumericContext::write(uint32_t id, std::vector<int64_t> shape, uint64_t esize) {
  NumericBuffer& b = buf(id);
  if (b.state == NumericBuffer::State::absent)
    throw NumericError("numeric: " + where_ + " writes tensor #" + std::to_string(id) +
                       ", which the schedule never allocated");
  if (b.state == NumericBuffer::State::freed)
    violation(where_ + " writes tensor #" + std::to_string(id) + " after the schedule freed it");
  b.shape = std::move(shape);
  const uint64_t want = static_cast<uint64_t>(b.numel()) * esize;
  if (esize != 0 && want != b.bytes)
    throw NumericError("numeric: " + where_ + ": tensor #" + std::to_string(id) + " holds " +
                       std::to_string(b.numel()) + " elements (" + std::to_string(want) +
                       " B) but the schedule allocated " + std::to_string(b.bytes) + " B");
  if (b.state != NumericBuffer::State::freed) b.state = NumericBuffer::State::live;
  b.v.resize(b.numel());
  return b;
}

void NumericContext::on_alloc(uint32_t id, uint64_t bytes) {
  NumericBuffer& b = buf(id);
  b = NumericBuffer{};
  b.state = NumericBuffer::State::allocated;
  b.bytes = bytes;
}

void NumericContext::on_free(uint32_t id) {
  NumericBuffer& b = buf(id);
  b.state = NumericBuffer::State::freed;
  b.v.setConstant(kNaN);  // poison: a premature free shows downstream
}

void NumericContext::on_parameter(int32_t index, uint32_t storage, std::string_view name) {
  const NumericParamInit init = numeric_param_init(m_, name);
  const std::vector<int64_t>& shape = init.shape;
  const double scale = init.scale, offset = init.offset;
  where_ = "parameter " + std::string(name);
  NumericBuffer& b = write(storage, shape, m_.elem);
  const size_t i = static_cast<size_t>(index);
  if (i < override_.size() && override_[i].size() == b.v.size()) {
    b.v = override_[i];
  } else {
    for (Eigen::Index j = 0; j < b.v.size(); ++j)
      b.v[j] = offset + scale * uniform(m_.seed, 17 + i, static_cast<uint64_t>(j));
  }
  if (init_params_.size() <= i) {
    init_params_.resize(i + 1);
    param_shapes_.resize(i + 1);
    param_names_.resize(i + 1);
    param_storage_.resize(i + 1);
  }
  param_storage_[i] = storage;
  init_params_[i] = b.v;
  param_shapes_[i] = shape;
  param_names_[i] = std::string(name);
}

void NumericContext::init_rope_buffer(const Tensor& t) {
  // (2, ctx, h/2): cos and sin of pos * theta^(-2i/h) (cs336-model.md §1).
  const int64_t h = m_.d_model / m_.heads, half = h / 2, ctx = m_.context;
  where_ = "RotaryEmbedding buffer";
  NumericBuffer& b = write(t.storage, {2, ctx, half}, 4);
  for (int64_t p = 0; p < ctx; ++p)
    for (int64_t i = 0; i < half; ++i) {
      const double inv = std::pow(m_.rope_theta, -static_cast<double>(2 * i) / static_cast<double>(h));
      const double a = static_cast<double>(p) * inv;
      b.v[p * half + i] = std::cos(a);
      b.v[ctx * half + p * half + i] = std::sin(a);
    }
  rope_buffer_ = t.storage;
}

void NumericContext::fill_tokens(const Tensor& t, uint64_t salt) {
  where_ = "token batch";
  const uint64_t n = t.bytes / 8;
  const uint64_t rows = static_cast<uint64_t>(m_.batch * m_.seq);
  if (n % rows != 0) throw NumericError("numeric: a token batch of " + std::to_string(n) +
                                        " ids is not a multiple of batch*seq");
  NumericBuffer& b = write(t.storage, {static_cast<int64_t>(n / static_cast<uint64_t>(m_.seq)), m_.seq}, 8);
  for (Eigen::Index j = 0; j < b.v.size(); ++j) {
    const double u = (uniform(m_.seed, 1000 + salt, static_cast<uint64_t>(j)) + 1.0) / 2.0;
    b.v[j] = std::floor(u * static_cast<double>(m_.vocab));
  }
}

bool numeric_hint_applies(NumericHint h, OpKind k, bool new_tensor) {
  switch (h) {
    case NumericHint::none: return false;
    case NumericHint::split_heads: return k == OpKind::view;
    case NumericHint::merge_heads: return k == OpKind::clone;
    case NumericHint::transpose_b: return k == OpKind::bmm;
    case NumericHint::scalar: return k == OpKind::mul_scalar || k == OpKind::add_scalar;
    case NumericHint::cube: return k == OpKind::pow2;
    case NumericHint::mask_slice: return k == OpKind::add;
    case NumericHint::shift_logits: return k == OpKind::clone;
    case NumericHint::qkv_piece: return k == OpKind::clone || k == OpKind::view;
    case NumericHint::param:
      return k == OpKind::megatron_embedding || k == OpKind::megatron_linear ||
             k == OpKind::fused_layer_norm || k == OpKind::bias_dropout_add ||
             k == OpKind::bias_gelu;
    case NumericHint::labels: return k == OpKind::vocab_parallel_ce;
    case NumericHint::megatron_v: return k == OpKind::bmm;
    case NumericHint::fill_scalar:
    case NumericHint::unread:
    case NumericHint::causal_tril:
    case NumericHint::causal_mask:
    case NumericHint::rope_cos:
    case NumericHint::rope_sin:
    case NumericHint::shift_labels: return new_tensor;
  }
  return false;
}

void NumericContext::fill_megatron_batch(const Tensor& tokens, const Tensor& labels,
                                         const Tensor& loss_mask, const Tensor& position_ids) {
  fill_tokens(tokens, 0);
  fill_tokens(labels, 1);
  where_ = "megatron batch";
  write(loss_mask.storage, {m_.batch * m_.seq}, 4).v.setOnes();
  NumericBuffer& p = write(position_ids.storage, {m_.batch, m_.seq}, 8);
  for (int64_t b = 0; b < m_.batch; ++b)
    for (int64_t s = 0; s < m_.seq; ++s) p.v[b * m_.seq + s] = static_cast<double>(s);
}

void NumericContext::forward(Runtime& rt, OpKind k, std::initializer_list<const Tensor*> in,
                             std::initializer_list<const Tensor*> out) {
  where_ = std::string(forward_name(k)) + (rt.recomputing ? " (recompute)" : "");
  // A hint is consumed by the first forward of a kind it applies to (see NumericHint).
  const bool applies = numeric_hint_applies(hint, k, in.size() == 0);
  last_fwd_.kind = k;
  last_fwd_.hint = applies ? hint : NumericHint::none;
  last_fwd_.scalar = applies ? hint_scalar : 0.0;
  last_fwd_.bias = applies && hint == NumericHint::param ? hint_bias : -1;
  last_fwd_.in_shapes.clear();
  for (const Tensor* t : in) last_fwd_.in_shapes.push_back(buf(t->storage).shape);
  const uint32_t aux = hint_storage;
  if (applies) {
    hint = NumericHint::none;
    hint_storage = kNoStorage;
  }
  last_aux_ = applies ? aux : kNoStorage;
  // Dropout keys (dropout_mask): a new forward pass, or a checkpoint re-run's first op.
  if (!rt.recomputing && rt.current_graph() != pass_graph_) {
    pass_graph_ = rt.current_graph();
    ++pass_;
    fwd_counts_.clear();
  }
  if (rt.recomputing && backward_since_forward_) rec_counts_.clear();
  backward_since_forward_ = false;
  NumericKernels::forward(*this, rt, k, in, out);
}

Eigen::ArrayXd NumericContext::dropout_mask(Runtime& rt, int64_t n) {
  auto& counts = rt.recomputing ? rec_counts_ : fwd_counts_;
  const int64_t where = (static_cast<int64_t>(rt.ctx.layer) + 1) * kModuleCount +
                        static_cast<int64_t>(rt.ctx.module);
  uint32_t ordinal = 0;
  bool found = false;
  for (auto& c : counts)
    if (c.first == where) {
      ordinal = c.second++;
      found = true;
    }
  if (!found) counts.emplace_back(where, 1);
  const uint64_t key = mix(mix(mix(pass_) + static_cast<uint64_t>(where)) + ordinal);
  Eigen::ArrayXd keep(n);
  for (int64_t i = 0; i < n; ++i)
    keep[i] = (uniform(m_.seed, key, static_cast<uint64_t>(i)) + 1.0) / 2.0 >= m_.dropout ? 1.0 : 0.0;
  return keep;
}

void NumericContext::on_node(int32_t id, OpKind k) {
  if (nodes_.size() <= static_cast<size_t>(id)) nodes_.resize(static_cast<size_t>(id) + 1);
  nodes_[id] = last_fwd_.kind == k ? last_fwd_ : NodeInfo{k, NumericHint::none, 0.0, -1, {}};
}

void NumericContext::on_root_grad(uint32_t grad, uint32_t loss) {
  where_ = "backward root";
  const NumericBuffer& l = read(loss, "the loss");
  if (!first_done_) first_loss_ = l.v.size() == 1 ? l.v[0] : kNaN;
  write(grad, {}, 0).v.setOnes();
}

void NumericContext::backward_begin(Runtime& rt, int32_t id, const Node& n,
                                    const uint32_t* saved) {
  where_ = backward_name(n.kind);
  cur_node_ = id;
  backward_since_forward_ = true;
  for (bool& s : pending_set_) s = false;
  static const NodeInfo kNone;
  const NodeInfo& info = static_cast<size_t>(id) < nodes_.size() ? nodes_[id] : kNone;
  NumericKernels::backward(*this, rt, n, saved, info);
}

void NumericContext::backward_end(const Grad out[3]) {
  for (int i = 0; i < 3; ++i) {
    if (out[i].storage == kNoStorage) continue;
    if (!pending_set_[i])
      throw NumericError("numeric: " + where_ + ": no numeric gradient for input " +
                         std::to_string(i));
    // A view (expand, pass-through of a view) is a different logical shape on the same
    // storage: its bytes are not the storage's.
    write(out[i].storage, pending_shape_[i], out[i].is_view ? 0 : m_.elem).v = pending_[i];
  }
}

void NumericContext::accumulate(uint32_t dst, uint32_t src) {
  where_ = "grad accumulation";
  const NumericBuffer& s = read(src, "an incoming grad");
  NumericBuffer& d = buf(dst);
  const NumericBuffer& dr = read(dst, "the buffered grad");
  (void)dr;
  if (d.v.size() != s.v.size()) throw NumericError("numeric: accumulating grads of different sizes");
  d.v += s.v;
}

void NumericContext::add_into(uint32_t dst, uint32_t a, uint32_t b) {
  where_ = "grad accumulation";
  const NumericBuffer& x = read(a, "the buffered grad");
  const NumericBuffer& y = read(b, "an incoming grad");
  if (x.v.size() != y.v.size()) throw NumericError("numeric: adding grads of different sizes");
  Eigen::ArrayXd sum = x.v + y.v;
  std::vector<int64_t> shape = x.shape;
  write(dst, std::move(shape), m_.elem).v = std::move(sum);
}

void NumericContext::copy(uint32_t dst, uint32_t src) {
  where_ = "AccumulateGrad";
  const NumericBuffer& s = read(src, "the incoming grad");
  Eigen::ArrayXd v = s.v;
  std::vector<int64_t> shape = s.shape;
  write(dst, std::move(shape), m_.elem).v = std::move(v);
}

void NumericContext::on_backward_done(Runtime& rt) {
  if (first_done_) return;
  first_done_ = true;
  first_grads_.assign(rt.parameters().size(), Eigen::ArrayXd());
  for (size_t i = 0; i < rt.parameters().size(); ++i) {
    const Eigen::ArrayXd* g = grad_values(rt, static_cast<int32_t>(i));
    if (g != nullptr) first_grads_[i] = *g;
  }
}

void NumericContext::zero_main_grads() {
  main_grad_.resize(param_shapes_.size());
  for (size_t i = 0; i < main_grad_.size(); ++i)
    main_grad_[i] = Eigen::ArrayXd::Zero(init_params_[i].size());
}

void NumericContext::add_main_grad(int32_t param, const Eigen::ArrayXd& g) {
  const size_t i = static_cast<size_t>(param);
  if (i >= main_grad_.size() || main_grad_[i].size() != g.size())
    throw NumericError("numeric: " + where_ + ": a main_grad of " + std::to_string(g.size()) +
                       " elements for parameter #" + std::to_string(param) +
                       " (zero_main_grads not called, or a wrong parameter)");
  main_grad_[i] += g;
}

const Eigen::ArrayXd& NumericContext::param_values(const Runtime& rt, int32_t i) const {
  return store_.at(rt.parameters()[static_cast<size_t>(i)].storage).v;
}

Eigen::ArrayXd& NumericContext::param_values_mut(const Runtime& rt, int32_t i) {
  return buf(rt.parameters()[static_cast<size_t>(i)].storage).v;
}

const Eigen::ArrayXd* NumericContext::grad_values(const Runtime& rt, int32_t i) {
  if (m_.family == NumericFamily::megatron)  // main_grad, not .grad
    return static_cast<size_t>(i) < main_grad_.size() ? &main_grad_[static_cast<size_t>(i)] : nullptr;
  const uint32_t g = rt.parameters()[static_cast<size_t>(i)].grad;
  if (g == kNoStorage) return nullptr;
  where_ = "reading .grad of " + param_names_.at(static_cast<size_t>(i));
  return &read(g, ".grad").v;
}

}  // namespace memsim::graph
