// Numeric mode: the graph layer's op stream executed with real numbers (double, Eigen),
// strictly in the order of the Program's alloc/free events, to prove the schedule.
//
// Contract:
//  - A NumericContext attached to a Runtime (rt.numeric) holds one buffer per storage id.
//    A buffer exists only between its alloc and free events: on free its values are
//    poisoned (NaN). Reading a freed buffer, a never-written one, or a saved slot that
//    was never recomputed is a *violation*: it is recorded (first messages kept) and the
//    poisoned values flow on, so a premature free shows in the loss and the gradients.
//  - Forward kernels run right after an op allocates its output (before it records its
//    node), reading inputs only through the store. Backward kernels read the incoming
//    grads and the node's *saved slots* (what the schedule saved or recomputed) when the
//    engine starts the node, and write the results into the storages the schedule's
//    backward allocated for them.
//  - Shapes are tracked per storage (they survive a free; values do not). Each written
//    float buffer is checked against the bytes the schedule allocated for it.
//  - Kernels exist for the cs336, hf-llama, hf-gpt2 and megatron families (fp32, no
//    LoRA, one process; dropout with deterministic masks, dropout_mask()); ops without
//    one raise NumericError.
//  - megatron's parameter grads go to main_grad (not .grad): the context keeps one
//    main_grad array per parameter, zeroed by zero_main_grads() and read by grad_values().
//  - With rt.numeric == nullptr (every normal run) none of this code is reached.
#pragma once

#include <Eigen/Core>
#include <cstdint>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "graph/runtime.h"

namespace memsim::graph {

class NumericError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// How the next op reads its operands where byte sizes cannot tell (set by a builder via
// numeric_hint(), right before the op). A hint applies to the next forward kernel of the
// op kinds it names (below); forward kernels of other kinds leave it pending.
enum class NumericHint : uint8_t {
  none,
  split_heads,  // view (B,S,H*h) -> (B,H,S,h), H = last dim / head_dim (q, or GQA k/v)
  merge_heads,  // clone (B,H,S,h) -> (B,S,D)
  transpose_b,  // bmm(a, b) = a @ b^T over the last two dims
  // --- Hugging Face families (graph/numeric/numeric_ops_nn.cpp) ---
  scalar,       // mul_scalar / add_scalar by NumericContext::hint_scalar
  cube,         // pow2 is pow(x, 3.0) (GPT-2's NewGELU)
  fill_scalar,  // a new 0-d tensor holding hint_scalar (torch.full([], v))
  unread,       // a new tensor no numeric kernel reads (left unwritten)
  causal_tril,  // a new (P,P) bool tril(ones) (GPT-2's `bias` buffer)
  causal_mask,  // a new (S,S+1) float mask: 0 where key <= query, else finfo.min (LLaMA)
  mask_slice,   // add(scores (...,S,S), mask (S,T)): mask[:, :S] (LLaMA eager)
  rope_cos,     // a new (S,hd) cos(pos * inv_freq), emb = cat(freqs, freqs) (LLaMA)
  rope_sin,     // the same with sin
  shift_logits, // clone(logits[:, :-1, :]) of a slice view: (B,S-1,V)
  shift_labels, // a new labels[:, 1:].contiguous() of hint_storage: (B,S-1)
  qkv_piece,    // GPT-2: view/clone of piece hint_scalar (0 q, 1 k, 2 v) of the fused
                // (B,S,3D) projection, heads split: (B,H,S,h)
  // --- megatron (graph/numeric/numeric_ops_fused.cpp) ---
  param,        // a fused op's parameter: index hint_scalar (a bias: the next index; -1 none)
  labels,       // vocab-parallel cross entropy against hint_storage
  megatron_v,   // bmm(probs, v) with v the value piece of the fused QKV output
};

enum class NumericFamily : uint8_t { cs336, hf_llama, hf_gpt2, megatron };

struct NumericModel {
  NumericFamily family = NumericFamily::cs336;
  int64_t batch = 1, seq = 1, d_model = 0, heads = 1, d_ff = 0, vocab = 0, context = 0;
  int64_t kv_heads = 0;       // 0: heads (hf-llama GQA: fewer)
  bool tied = false;          // hf: lm_head is the token embedding
  uint64_t elem = 4;          // bytes of a float element in the schedule
  double rms_eps = 1e-5;      // cs336 / LLaMA RMSNorm, GPT-2 LayerNorm
  double rope_theta = 10000.0;
  double dropout = 0.0;       // hf / megatron dropout probability (graph/numeric/numeric.cpp masks)
  uint64_t seed = 1;          // parameters and token ids
  int64_t head_dim() const { return d_model / (heads > 0 ? heads : 1); }
};

struct NumericBuffer {
  enum class State : uint8_t { absent, allocated, live, freed };
  State state = State::absent;
  uint64_t bytes = 0;
  std::vector<int64_t> shape;
  Eigen::ArrayXd v;
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

class NumericContext {
 public:
  explicit NumericContext(NumericModel m) : m_(m) {}

  // --- Runtime hooks (graph/runtime.cpp) ---------------------------------------------
  void on_alloc(uint32_t id, uint64_t bytes);
  void on_free(uint32_t id);
  void on_parameter(int32_t index, uint32_t storage, std::string_view name);
  void on_root_grad(uint32_t grad, uint32_t loss);  // backward(): ones_like(loss)
  void backward_begin(Runtime& rt, int32_t id, const Node& n, const uint32_t* saved);
  void backward_end(const Grad out[3]);
  void accumulate(uint32_t dst, uint32_t src);              // dst += src (in place)
  void add_into(uint32_t dst, uint32_t a, uint32_t b);      // dst = a + b
  void copy(uint32_t dst, uint32_t src);                    // dst = src
  void on_backward_done(Runtime& rt);
  // megatron: main_grad.zero_() of every parameter (the step's zero_grad).
  void zero_main_grads();
  void add_main_grad(int32_t param, const Eigen::ArrayXd& g);
  void on_node(int32_t id, OpKind k);
  // After the schedule's optimizer step (sim/step/schedule.cpp): runs optimizer_step if set.
  void on_optimizer_step(Runtime& rt) {
    if (optimizer_step) optimizer_step(rt, *this);
  }
  std::function<void(Runtime&, NumericContext&)> optimizer_step;  // binds the last forward's operand shapes to a node

  // --- optimizer state (sim/optim/optimizer_adafactor.cpp, sim/optim/optimizer_8bit.cpp) ----------
  // The schedule's optimizer registers every state tensor it allocates, by parameter
  // index (-1: shared by all, bitsandbytes' quantisation maps) and name; the numeric
  // optimizer kernels (sim/optim/numeric_adafactor.h, sim/optim/numeric_adam8bit.h) keep their state
  // only in these buffers, so a state the schedule frees or re-creates shows.
  void on_optimizer_state(int32_t param, std::string_view name, uint32_t storage) {
    opt_state_[{param, std::string(name)}] = storage;
  }
  uint32_t optimizer_state(int32_t param, std::string_view name) const {  // kNoStorage: none
    auto it = opt_state_.find({param, std::string(name)});
    return it == opt_state_.end() ? kNoStorage : it->second;
  }
  // Test-only: the optimizer frees the k-th state tensor it registers right after creating
  // it (0-based over the run), a schedule bug the check must see.
  int64_t test_drop_optimizer_state = -1;
  int64_t optimizer_states_registered = 0;
  // Names the code running now in violation / error messages (the optimizer kernels).
  void set_where(std::string w) { where_ = std::move(w); }

  // --- op hooks (graph/ops/ops.cpp) -----------------------------------------------------
  void forward(Runtime& rt, OpKind k, std::initializer_list<const Tensor*> in,
               std::initializer_list<const Tensor*> out);
  void init_rope_buffer(const Tensor& t);            // the cs336 RoPE buffer
  void fill_tokens(const Tensor& t, uint64_t salt);  // a (B,S) batch of token ids
  // megatron's per-micro-batch inputs: tokens (salt 0), labels (salt 1), loss_mask ones,
  // position_ids arange(S) per row.
  void fill_megatron_batch(const Tensor& tokens, const Tensor& labels, const Tensor& loss_mask,
                           const Tensor& position_ids);

  NumericHint hint = NumericHint::none;
  double hint_scalar = 0;              // NumericHint::scalar / fill_scalar / qkv_piece
  uint32_t hint_storage = UINT32_MAX;  // NumericHint::shift_labels: the labels
  int32_t hint_bias = -1;              // NumericHint::param: the bias parameter (-1: none)

  // Dropout (graph/numeric/numeric.cpp): the keep-mask of the dropout op running now, 1 keep /
  // 0 drop, a function of a structural key (forward pass, layer, module, ordinal of the
  // dropout within them), never of values: a checkpoint re-run regenerates the mask its
  // forward drew (torch restores the RNG state for that), and finite differences see
  // fixed masks.
  Eigen::ArrayXd dropout_mask(Runtime& rt, int64_t n);

  // --- results ----------------------------------------------------------------------
  const std::vector<std::string>& violations() const { return violations_; }
  size_t violation_count() const { return violation_count_; }
  // The first backward's loss and the parameters' .grad right after it.
  bool have_first() const { return first_done_; }
  double first_loss() const { return first_loss_; }
  const std::vector<Eigen::ArrayXd>& first_grads() const { return first_grads_; }
  // Initial parameter values (index order); override before the run for FD.
  std::vector<Eigen::ArrayXd>& initial_params() { return init_params_; }
  const std::vector<std::vector<int64_t>>& param_shapes() const { return param_shapes_; }
  const std::vector<std::string>& param_names() const { return param_names_; }
  void set_initial_params(std::vector<Eigen::ArrayXd> p) { override_ = std::move(p); }
  // Current values of parameter i (its storage).
  const Eigen::ArrayXd& param_values(const Runtime& rt, int32_t i) const;
  Eigen::ArrayXd& param_values_mut(const Runtime& rt, int32_t i);
  const Eigen::ArrayXd* grad_values(const Runtime& rt, int32_t i);  // nullptr: no .grad
  // Parameter i's values now (after the run: the final parameters).
  const Eigen::ArrayXd& current_param(size_t i) const { return store_.at(param_storage_.at(i)).v; }
  const NumericModel& model() const { return m_; }
  // Copied into Runtime::test_drop_save when the schedule attaches this context.
  int64_t test_drop_save = -1;
  void violation(const std::string& what);

  // Selective checkpointing (graph/checkpoint.h): a cached op output's values as the op
  // wrote them, kept while the region's cache holds the storage (the kernels re-lay out a
  // view's storage in place, which would otherwise change what the re-run gets back).
  void stash(uint32_t id) { stash_[id] = buf(id); }
  void restore(uint32_t id);
  void drop_stash(uint32_t id) { stash_.erase(id); }
  // References to storage `id` that a region's cache holds (0 or 1): not Python names.
  int32_t stashed(uint32_t id) const { return stash_.count(id) ? 1 : 0; }

  // Kernel access (graph/numeric/numeric_ops.cpp).
  NumericBuffer& buf(uint32_t id);
  const NumericBuffer& read(uint32_t id, const char* what);
  NumericBuffer& write(uint32_t id, std::vector<int64_t> shape, uint64_t esize);

 private:
  NumericModel m_;
  std::vector<NumericBuffer> store_;
  std::unordered_map<uint32_t, NumericBuffer> stash_;  // selective checkpointing's cache
  std::vector<std::string> violations_;
  size_t violation_count_ = 0;
  std::vector<Eigen::ArrayXd> init_params_, override_, first_grads_;
  std::vector<std::vector<int64_t>> param_shapes_;
  std::vector<std::string> param_names_;
  std::vector<uint32_t> param_storage_;
  std::vector<Eigen::ArrayXd> main_grad_;  // megatron
  std::map<std::pair<int32_t, std::string>, uint32_t> opt_state_;
  bool first_done_ = false;
  double first_loss_ = 0;
  uint32_t loss_storage_ = kNoStorage;
  // backward_begin's results, written by backward_end.
  std::vector<int64_t> pending_shape_[3];
  Eigen::ArrayXd pending_[3];
  bool pending_set_[3] = {false, false, false};
  uint32_t rope_buffer_ = kNoStorage;

 public:
  // What backward needs of the forward that are not values: operand shapes, the hint.
  friend struct NumericKernels;  // graph/numeric/numeric_ops.cpp
  struct NodeInfo {
    OpKind kind = OpKind::other;
    NumericHint hint = NumericHint::none;
    double scalar = 0;
    int32_t bias = -1;  // NumericHint::param
    std::vector<std::vector<int64_t>> in_shapes;
  };
  // GPT-2's fused QKV split: memsim buffers the k and v pieces' grads in one slot of the
  // split node (summed), so their ViewBackward kernels also keep each part here, keyed by
  // the split node; SplitBackward checks the slot against their sum and concatenates.
  struct SplitParts {
    int32_t node = -1;
    Eigen::ArrayXd part[3];
    bool set[3] = {false, false, false};
  };
  std::vector<SplitParts> split_parts_;

 private:
  NodeInfo last_fwd_;          // the forward being run (its effective hint)
  uint32_t last_aux_ = kNoStorage;  // its hint_storage, if its hint applies
  int32_t cur_node_ = -1;           // the node whose backward is running
  // Dropout keys: the forward pass (its graph), per (layer, module) ordinals of the pass
  // and of the current checkpoint re-run (reset at a re-run's first op).
  uint32_t pass_graph_ = 0;
  uint64_t pass_ = 0;
  std::vector<std::pair<int64_t, uint32_t>> fwd_counts_, rec_counts_;
  bool backward_since_forward_ = true;
  std::vector<NodeInfo> nodes_;
  std::string where_;  // the op being run, for violation messages

};

// The op kernels (graph/numeric/numeric_ops.cpp).
struct NumericKernels {
  static void forward(NumericContext& c, Runtime& rt, OpKind k,
                      std::initializer_list<const Tensor*> in,
                      std::initializer_list<const Tensor*> out);
  static void backward(NumericContext& c, Runtime& rt, const Node& n, const uint32_t* saved,
                       const NumericContext::NodeInfo& info);
  // A tensor made from no operands (graph/ops/ops.cpp new_tensor).
  static void new_tensor(NumericContext& c, Runtime& rt, OpKind k,
                         const std::vector<const Tensor*>& out);
  // Backward result for input i of the node being run.
  static void set_grad(NumericContext& c, int i, std::vector<int64_t> shape, Eigen::ArrayXd v);
  // The Hugging Face families' ops (graph/numeric/numeric_ops_nn.cpp): false if k has no kernel.
  static bool forward_nn(NumericContext& c, Runtime& rt, OpKind k,
                         const std::vector<const Tensor*>& in,
                         const std::vector<const Tensor*>& out);
  static void new_tensor_nn(NumericContext& c, const std::vector<const Tensor*>& out);
  static bool backward_nn(NumericContext& c, Runtime& rt, const Node& n, const uint32_t* saved,
                          const NumericContext::NodeInfo& info);
  // Megatron's fused ops (graph/numeric/numeric_ops_fused.cpp): false if k has no kernel.
  static bool forward_fused(NumericContext& c, Runtime& rt, OpKind k,
                            const std::vector<const Tensor*>& in,
                            const std::vector<const Tensor*>& out);
  static bool backward_fused(NumericContext& c, Runtime& rt, const Node& n,
                             const uint32_t* saved, const NumericContext::NodeInfo& info);
  // GPT-2: a k or v piece's grad, kept for SplitBackward (see SplitParts).
  static void keep_split_part(NumericContext& c, const Node& n,
                              const NumericContext::NodeInfo& info, const Eigen::ArrayXd& g);
  static void stash_split_part(NumericContext& c, int32_t split_node, int which,
                               const Eigen::ArrayXd& g);
  static NumericContext::SplitParts take_split_parts(NumericContext& c);
};

// Builder-side hints (no-op in normal runs).
inline void numeric_hint(Runtime& rt, NumericHint h, double scalar = 0) {
  if (rt.numeric == nullptr) return;
  rt.numeric->hint = h;
  rt.numeric->hint_scalar = scalar;
}
// megatron: the parameters a fused op uses (indices into rt.parameters(); -1: none).
inline void numeric_param_hint(Runtime& rt, int32_t param, int32_t bias = -1) {
  if (rt.numeric == nullptr) return;
  rt.numeric->hint = NumericHint::param;
  rt.numeric->hint_scalar = param;
  rt.numeric->hint_bias = bias;
}
inline void numeric_hint(Runtime& rt, NumericHint h, const Tensor& operand) {
  if (rt.numeric == nullptr) return;
  rt.numeric->hint = h;
  rt.numeric->hint_storage = operand.storage;
}
// The schedule's optimizer: state tensor t of parameter `param` was just created
// (NumericContext::on_optimizer_state; no-op in normal runs).
inline void numeric_optimizer_state(Runtime& rt, int32_t param, const char* name, Tensor& t) {
  if (rt.numeric == nullptr) return;
  rt.numeric->on_optimizer_state(param, name, t.storage);
  if (rt.numeric->test_drop_optimizer_state == rt.numeric->optimizer_states_registered++)
    t.reset();
}
// Whether hint h applies to a forward of kind k (new: a tensor made from no operands).
bool numeric_hint_applies(NumericHint h, OpKind k, bool new_tensor);
// Parameter `name`'s shape and initial values' scale/offset in family m.family
// (graph/numeric/numeric_params.cpp); throws NumericError for an unknown name.
struct NumericParamInit {
  std::vector<int64_t> shape;
  double scale = 1.0, offset = 0.0;
};
NumericParamInit numeric_param_init(const NumericModel& m, std::string_view name);

}  // namespace memsim::graph
