// DecoderModel's forwards for losses computed outside the ForCausalLM head (loss.impl
// chunked:N and liger; graph/models/decoder.h, docs/losses.md): torchtune's chunked
// output and Liger-Kernel's patched causal-LM forward.
#include <vector>

#include "graph/autocast.h"
#include "graph/models/chunked_loss.h"
#include "graph/models/decoder.h"
#include "graph/ops/ops_liger.h"
#include "graph/ops/ops_nn.h"

namespace memsim::graph {

std::vector<Tensor> DecoderModel::forward_chunked(const Tensor& ids, int64_t chunks,
                                                  std::vector<uint64_t>& seq_pieces) {
  Tensor head_w;
  Tensor hidden = forward_hidden(ids, head_w);
  rt_.ctx.module = Module::head;
  seq_pieces = tensor_split_sizes(s_.seq, static_cast<uint64_t>(chunks));
  const uint64_t B = s_.batch, D = s_.d_model;
  const uint64_t he = hidden.bytes / (s_.rows() * D);
  // F.linear on a (B, S_i, D) piece folds it to (B*S_i, D): a copy (reshape -> clone) when
  // the piece is not contiguous, i.e. B > 1 and more than one piece; none when autocast
  // hands F.linear a fresh (contiguous) low-precision cast of it instead.
  const bool cast_first = autocast_on() && he != ac_->low_elem();
  const bool copies = B > 1 && seq_pieces.size() > 1 && !cast_first;
  // h.tensor_split(N, dim=1) makes all N slices (N SliceBackward0 nodes) before the list
  // comprehension runs the head on any of them: the slices' sequence numbers are below
  // every head mm's, so the backward runs every chunk's MmBackward0 before the first
  // SliceBackward0 (each piece's input grad waits; H200 trace, torch 2.11, stacks_loss_chunked8).
  std::vector<Tensor> pieces;
  pieces.reserve(seq_pieces.size());
  for (uint64_t p : seq_pieces)
    pieces.push_back(slice_seq(rt_, hidden, B * p * D * he));  // tensor_split: at::slice
  std::vector<Tensor> out;
  out.reserve(seq_pieces.size());
  for (size_t i = 0; i < seq_pieces.size(); ++i) {
    const uint64_t rows = B * seq_pieces[i];
    Tensor piece = std::move(pieces[i]);
    if (copies) piece = clone(rt_, piece);
    out.push_back(arch().code == ModelCode::gpt2 ? gpt2_head(piece, head_w, rows)
                                                 : head_projection(piece, head_w, rows));
  }
  hidden.reset();  // a local of the model's forward
  rt_.ctx.module = Module::none;
  return out;
}

Tensor DecoderModel::forward_liger(const Tensor& ids, const Tensor& /*labels*/) {
  Tensor head_w;
  Tensor hidden = forward_hidden(ids, head_w);
  if (!head_w.defined()) head_w = rt_.param(lm_head_);  // self.lm_head.weight (untied)
  ModuleScope module_scope(rt_, Module::loss);
  const uint64_t B = s_.batch, S = s_.seq, D = s_.d_model, rows = s_.rows();
  // A tied head: the lm_head use's grad is Liger's grad_weight, a dense buffer nothing
  // else holds once the node's saved variables are released, so the InputBuffer of the
  // tied weight adds the embedding's grad into it in place (graph/ops/ops_nn.h TiedWeight).
  if (s_.tied && head_w.grad_fn >= 0) rt_.node(head_w.grad_fn).flags |= kTiedSumInPlace;
  // LigerForCausalLMLoss: labels = pad(labels, (0, 1), value=-100);
  // shift_labels = labels[..., 1:].contiguous(); hidden_states.view(-1, H) (a view).
  Tensor padded = new_tensor(rt_, B * (S + 1) * 8, OpKind::other, TensorKind::temporary);
  Tensor shift_labels = new_tensor(rt_, rows * 8, OpKind::clone, TensorKind::temporary);
  LigerShape ls;
  ls.rows = rows;
  ls.hidden = D;
  ls.vocab = s_.vocab;
  ls.in_elem = hidden.bytes / (rows * D);
  ls.w_elem = head_w.bytes / (s_.vocab * D);
  Tensor loss = liger_fused_linear_cross_entropy(rt_, hidden, head_w, shift_labels, ls);
  // LigerForCausalLMLoss returns: its locals die in order (the padded labels, then the
  // shifted ones); lce_forward's hidden_states when it returns.
  padded.reset();
  shift_labels.reset();
  module_scope.restore();
  hidden.reset();
  return loss;
}

}  // namespace memsim::graph
