// CompileEngine (graph/compile.h): record a region, partition it, rewrite its events.
#include "graph/compile.h"

#include <algorithm>
#include <utility>

namespace memsim::graph {

namespace {

// The partitioner's op lists (torch/_functorch/partitioners.py get_default_op_list at
// c28ba8e5) applied to memsim's ops, after Inductor's decompositions: layer_norm,
// softmax, log_softmax, embedding and the composite RoPE decompose into allowlisted ops
// (var_mean / amax / exp / sum / index / mul / cat...), so they are recomputable.
PartClass op_class(OpKind k, PartitionerVersion v) {
  // functorch 1.13's aot_module applies no decomposition table: native_layer_norm stays
  // one op, which its allowlist lacks.
  if (v == PartitionerVersion::torch113_inductor && k == OpKind::layer_norm) return PartClass::other;
  // LitGPT's `torch.cat((q_roped, q[..., rope_n_elem:]), dim=-1)` (OpKind::rope_litgpt): 1.13
  // traces aten.cat, which its recomputable list lacks (functorch/_src/partitioners.py):
  // banned, like every op of that list's complement.
  if (v == PartitionerVersion::torch113_inductor && k == OpKind::rope_litgpt) return PartClass::other;
  switch (k) {
    case OpKind::bmm:
    case OpKind::linear:
    case OpKind::addmm:
    case OpKind::mm_linear:
    case OpKind::sdpa_flash:
    case OpKind::sdpa_efficient:
    case OpKind::sdpa_cudnn:
    case OpKind::megatron_linear:
    case OpKind::baddbmm:
    case OpKind::fused_attention:
    case OpKind::matmul_4bit:
      return PartClass::compute;
    case OpKind::native_dropout:
    case OpKind::dropout:
    case OpKind::bias_dropout_add:
      return PartClass::random;
    case OpKind::pow2:
    case OpKind::mean_dim:
    case OpKind::mean_all:
    case OpKind::add_scalar:
    case OpKind::add:
    case OpKind::sub:
    case OpKind::mul:
    case OpKind::div:
    case OpKind::div_scalar:
    case OpKind::rsqrt:
    case OpKind::sigmoid:
    case OpKind::exp:
    case OpKind::log:
    case OpKind::neg:
    case OpKind::max_dim:
    case OpKind::sum_dim:
    case OpKind::where_scalar:
    case OpKind::gather:
    case OpKind::clone:
    case OpKind::view:
    case OpKind::rope:
    case OpKind::embedding:
    case OpKind::log_softmax:
    case OpKind::layer_norm:
    case OpKind::embedding_nn:
    case OpKind::softmax:
    case OpKind::tanh:
    case OpKind::silu:
    case OpKind::mul_scalar:
    case OpKind::add_bcast:
    case OpKind::to_copy:
    case OpKind::slice_seq:
    case OpKind::expand_clone:
    case OpKind::rope_hf:
    case OpKind::split_qkv:
    case OpKind::arange:
    case OpKind::compare:
    case OpKind::scalar_tensor:
    case OpKind::fill:
    case OpKind::select_dim:
    case OpKind::gelu:
    case OpKind::cat2:
    case OpKind::chunk2:
    case OpKind::qkv_split:
    // nn.RMSNorm's aten._fused_rms_norm (torch >= 2.9; torchtitan's norms): in
    // core_aten_decompositions (torch/_decomp/__init__.py), decomposed by
    // torch/_decomp/decompositions.py _fused_rms_norm into to / pow / mean / add / rsqrt /
    // mul, so recomputable and fused like layer_norm.
    case OpKind::fused_rms_norm:
    // torchtune's RotaryPositionalEmbeddings (OpKind::rope_pairs): x.float().reshape(..., -1,
    // 2), the cache's view, mul / sub / add, torch.stack (Inductor: unsqueeze + cat),
    // flatten, type_as: every op in get_default_op_list's recomputable and view lists
    // (pytorch c28ba8e5 torch/_functorch/partitioners.py), all pointwise for Inductor.
    case OpKind::rope_pairs:
    // LitGPT's apply_rope + `torch.cat((q_roped, q[..., rope_n_elem:]), dim=-1)` (Llama:
    // rope_n_elem = head size, the second piece empty; OpKind::rope_litgpt is the cat, its
    // temporaries -x2, cat((-x2, x1)), x * cos, rotated * sin, the sum and .to(dtype) carry
    // their own ops). Inductor's decomposition of aten.cat (torch/_inductor/decomposition.py
    // `cat`: "Eliminate cat when there is only one tensor input" after dropping empty ones)
    // makes it a clone of q_roped, which get_default_op_list lists; the rotate's cat of two
    // pointwise inputs is lowered as a pointwise cat (fused). Recomputable and fusible.
    case OpKind::rope_litgpt:
    // nll_loss_forward / nll_loss_backward: decomposed for Inductor (torch/_decomp/
    // decompositions.py: gather, where, sum; the backward's zeros + scatter read only the
    // input's shape), so the log-probabilities it reads are recomputable and fusible.
    // Only the compiled loss (CompileScope::loss) records it in a region.
    case OpKind::nll_loss:
      return PartClass::recomputable;
    // torchtitan's apply_rotary_emb (OpKind::rope_complex: view_as_complex, complex mul,
    // view_as_real, flatten): view_as_complex / view_as_real are in none of the
    // partitioner's lists (get_default_op_list), so the chain is banned from recompute
    // and what reads it is saved after it; Inductor generates no code for complex tensors
    // (torch/_inductor/lowering.py unsupported_input_tensor / fallback_node_due_to_
    // unsupported_type: a FallbackKernel, realised inputs and output), so it is not fusible.
    case OpKind::rope_complex:
    default:
      return PartClass::other;
  }
}

bool fusible(OpKind k) { return part_fusible(op_class(k, PartitionerVersion::torch25)); }

// Readers that torch 1.13's trace reaches through an unlisted view (see PartVertex).
bool reads_through_unlisted_view_113(OpKind k) {
  return k == OpKind::mm_linear || k == OpKind::linear || k == OpKind::bmm;
}

}  // namespace

CompileEngine::CompileEngine(Runtime& rt, CompileOptions options)
    : rt_(rt), options_(options) {
  rt_.compile = this;
}

CompileEngine::~CompileEngine() {
  if (rt_.compile == this) rt_.compile = nullptr;
}

bool CompileEngine::wants(CompileScope scope) const {
  // A forward under no_grad records no autograd graph, so there is nothing to partition
  // and no reader information for fusion: it runs eagerly (docs/compile.md, limits).
  const bool on = options_.scope == scope || (scope == CompileScope::loss && options_.compile_loss);
  return !recording_ && on && rt_.grad_enabled;
}

Tensor CompileEngine::run(const std::function<Tensor()>& fn) {
  vertices_.clear();
  nodes_.clear();
  saves_.clear();
  pending_ = 0;
  rerun_ = rt_.recomputing;
  packed_ = false;
  // The region's events are rewritten when it ends (finish_region): a streaming Program
  // (program/event_sink.h) must not hand them on before; `begin` indexes its tail.
  Program& program = rt_.program();
  program.hold();
  const size_t begin = program.events.size();
  const int32_t layer = rt_.ctx.layer;
  recording_ = true;
  Tensor out;
  try {
    out = fn();
  } catch (...) {
    recording_ = false;
    // A checkpoint re-run ends by an exception once its last saved value is recomputed
    // (early stop: graph/checkpoint.cpp); its locals died while unwinding, so the
    // recorded region is complete and is rewritten like any other.
    if (rerun_) finish_region(begin, layer);
    program.unhold();
    for (const Vertex& v : vertices_) vertex_of_[v.storage] = 0;
    throw;
  }
  recording_ = false;
  finish_region(begin, layer);
  program.unhold();
  for (const Vertex& v : vertices_) vertex_of_[v.storage] = 0;
  return out;
}

void CompileEngine::on_alloc(uint32_t storage, uint64_t bytes, OpKind op) {
  if (!recording_) return;
  if (vertex_of_.size() <= storage) vertex_of_.resize(storage + 1, 0);
  vertices_.push_back({storage, bytes, op, -1});
  vertex_of_[storage] = static_cast<uint32_t>(vertices_.size());
}

void CompileEngine::on_node(int32_t node, OpKind kind, std::initializer_list<const Tensor*> inputs) {
  if (!recording_) return;
  RecNode n;
  n.id = node;
  n.kind = kind;
  n.event = rt_.program().events.size();
  for (const Tensor* t : inputs)
    if (t != nullptr && t->defined() && t->storage != kNoStorage) n.inputs.push_back(t->storage);
  // The op's outputs were allocated just before its node (memsim's ops allocate first);
  // an allocation of another op since the last node had no node (grad off: a constant).
  // A composite pointwise op whose temporaries carry their own aten op (torchtune's RoPE:
  // x.float(), the mul / sub / add halves, the stack, type_as) has one node for all of
  // them: they are its products, computed from its inputs.
  const bool composite = kind == OpKind::rope_pairs;
  for (size_t i = pending_; i < vertices_.size(); ++i)
    if (composite || vertices_[i].op == kind)
      vertices_[i].producer = static_cast<int32_t>(nodes_.size());
  pending_ = vertices_.size();
  nodes_.push_back(std::move(n));
}

void CompileEngine::on_save(int32_t node, uint32_t storage) {
  if (!recording_) return;
  saves_.push_back({node, rt_.node(node).saved_count - 1, storage});
}

bool CompileEngine::read_up_to(uint32_t storage, int32_t node) const {
  for (const RecNode& n : nodes_) {
    if (n.id > node) break;  // nodes_ is in creation order
    for (uint32_t s : n.inputs)
      if (s == storage) return true;
  }
  return false;
}

void CompileEngine::on_fill(int32_t node, uint32_t slot, uint32_t storage) {
  if (!recording_ || !rerun_) return;
  saves_.push_back({node, slot, storage});
}

void CompileEngine::on_pack(int32_t node, uint32_t slot, uint32_t storage) {
  if (!recording_ || rerun_ || !options_.checkpoint_outside) return;
  saves_.push_back({node, slot, storage});
  packed_ = true;
}

void CompileEngine::finish_region(size_t begin, int32_t layer) {
  Program& program = rt_.program();
  // A checkpoint re-run of a block compiled inside an eager checkpoint (4c) is the
  // compiled forward again: partitioned as a forward, not as 4b's recompute graph.
  const bool tagged_rerun = rerun_ && !options_.checkpoint_outside;
  // --- the partitioner's graph: primals (storages from outside the region) first ---
  std::vector<uint32_t> part_of;  // storage -> part index + 1
  auto index_of = [&](uint32_t s) -> uint32_t {
    return s < part_of.size() ? part_of[s] : 0;
  };
  std::vector<PartVertex> g;
  std::vector<uint32_t> storage_of;
  auto add_primal = [&](uint32_t s) {
    if (s < vertex_of_.size() && vertex_of_[s] != 0) return;
    if (part_of.size() <= s) part_of.resize(s + 1, 0);
    if (part_of[s] != 0) return;
    PartVertex p;
    p.cls = PartClass::primal;
    p.bytes = program.tensors[s].bytes;
    g.push_back(p);
    storage_of.push_back(s);
    part_of[s] = static_cast<uint32_t>(g.size());
  };
  for (const RecNode& n : nodes_)
    for (uint32_t s : n.inputs) add_primal(s);
  for (const Save& sv : saves_) add_primal(sv.storage);
  const uint32_t first_region = static_cast<uint32_t>(g.size());
  for (const Vertex& v : vertices_) {
    if (part_of.size() <= v.storage) part_of.resize(v.storage + 1, 0);
    PartVertex p;
    p.bytes = v.bytes;
    p.cls = op_class(v.op, options_.partitioner);
    if (v.producer >= 0) {
      const RecNode& n = nodes_[v.producer];
      for (uint32_t s : n.inputs) {
        const uint32_t k = index_of(s);
        if (k != 0 && s != v.storage) p.inputs.push_back(k - 1);
      }
      if (p.cls == PartClass::compute) p.runtime = std::max(1.0, rt_.node(n.id).flops / 2);
    }
    g.push_back(std::move(p));
    storage_of.push_back(v.storage);
    part_of[v.storage] = static_cast<uint32_t>(g.size());
  }
  // Inductor decomposes native_dropout into a random mask (bool: the random op, banned)
  // and `x * mask * scale` (pointwise): the output is recomputable from x and the mask.
  // Needs the mask allocated first, as CUDA's kernel does (graph/ops/ops_nn.cpp).
  for (uint32_t k = first_region + 1; k < g.size(); ++k) {
    const Vertex& out = vertices_[k - first_region];
    const Vertex& mask = vertices_[k - 1 - first_region];
    if (out.op == OpKind::native_dropout && mask.op == OpKind::native_dropout &&
        out.producer >= 0 && out.producer == mask.producer && mask.bytes < out.bytes) {
      g[k].cls = PartClass::recomputable;
      g[k].inputs.push_back(k - 1);
    }
  }
  // What the backward reads, and what outlives the region.
  std::vector<uint32_t> save_refs(g.size(), 0);
  for (const Save& sv : saves_) {
    const uint32_t k = index_of(sv.storage) - 1;
    g[k].needed_by_backward = true;
    if (!part_fusible(op_class(rt_.node(sv.node).kind, options_.partitioner))) g[k].backward_fusible = false;
    if (!packed_) ++save_refs[k];  // a placeholder holds no reference
  }
  for (uint32_t k = first_region; k < g.size(); ++k)
    g[k].output = rt_.refs(storage_of[k]) > static_cast<int32_t>(save_refs[k]);
  for (const RecNode& n : nodes_)
    for (uint32_t s : n.inputs) {
      const uint32_t k = index_of(s);
      if (k == 0) continue;
      // So is a GQA copy, whoever reads it: LitGPT's repeat_interleave ends in flatten,
      // which 1.13 traces as _reshape_alias of the clone (its CPU fixture,
      // tests/data/compile/partition_litgpt_*.json, saves the repeated k and v, not k
      // before the copy); HF's attention matmuls reach theirs through transpose / reshape.
      const bool gqa_copy = k - 1 >= first_region && vertices_[k - 1 - first_region].op == OpKind::expand_clone;
      if (reads_through_unlisted_view_113(n.kind) || gqa_copy) g[k - 1].read_through_unlisted_view_113 = true;
    }

  std::vector<uint8_t> reader_not_fusible(g.size(), 0), has_reader(g.size(), 0);
  std::vector<size_t> last_read(g.size(), 0);
  for (const RecNode& n : nodes_)
    for (uint32_t s : n.inputs) {
      const uint32_t k = index_of(s);
      if (k == 0) continue;
      has_reader[k - 1] = 1;
      if (!fusible(n.kind)) reader_not_fusible[k - 1] = 1;
      last_read[k - 1] = std::max(last_read[k - 1], n.event);
    }

  PartitionResult part;
  if (!tagged_rerun) {
    part = partition(g, options_.memory_budget, options_.partitioner);
  } else {
    // The recompute part of a compiled checkpointed block's backward graph (file comment,
    // 4b): what the backward reads stays a buffer when it is a buffer anyway (an input, a
    // matmul / attention / unlisted op's output, the input of a matmul in the re-run) or a
    // backward reader needs it materialised (not fusible); the rest is recomputed inside
    // the backward's kernels.
    part.saved.assign(g.size(), 0);
    part.banned.assign(g.size(), 0);
    for (uint32_t k = 0; k < g.size(); ++k)
      part.saved[k] = g[k].needed_by_backward &&
                      (k < first_region || !part_fusible(g[k].cls) || !g[k].backward_fusible ||
                       reader_not_fusible[k]);
  }

  // --- fusion: values inside one fused kernel are never allocated ---
  std::vector<uint8_t> virt(g.size(), 0);
  CompiledRegionStats st;
  st.layer = layer;
  st.recompute = rerun_;  // 4c's re-run: the forward's partition, made again in backward
  st.vertices = static_cast<uint32_t>(g.size() - first_region);
  for (uint32_t k = first_region; k < g.size(); ++k) {
    const Vertex& v = vertices_[k - first_region];
    // A value with no autograd node of its own is a composite op's temporary (HF RoPE's
    // x * cos, -x2, ...) when nothing reads it: fused as well. Other node-less values
    // (masks, tables made under no_grad) stay materialised.
    const bool produced = v.producer >= 0 || (!has_reader[k] && !g[k].needed_by_backward);
    virt[k] = produced && part_fusible(g[k].cls) && !part.saved[k] && !g[k].output &&
              !reader_not_fusible[k];
    if (virt[k]) {
      ++st.fused_away;
      st.fused_away_bytes += v.bytes;
    }
  }

  // --- saved values the recomputation starts from: held until their readers ran ---
  // For each recomputed value, the saved vertices its recomputation reads.
  std::vector<uint8_t> dead_at_end(g.size(), 0);
  for (uint32_t k = first_region; k < g.size(); ++k)
    dead_at_end[k] = rt_.refs(storage_of[k]) == 0;
  std::vector<int32_t> hold_index(g.size(), -1);
  std::vector<uint8_t> revived(g.size(), 0);
  std::vector<uint32_t> stack, seen_stamp(g.size(), 0);
  uint32_t stamp = 0;
  // 4c's forward: the placeholders hold nothing; the re-run refills them and holds then.
  for (uint32_t k = 0; k < g.size() && !packed_; ++k) {
    if (!g[k].needed_by_backward || part.saved[k]) continue;
    // The nodes that read k in the backward.
    std::vector<int32_t> readers;
    for (const Save& sv : saves_)
      if (index_of(sv.storage) - 1 == k &&
          std::find(readers.begin(), readers.end(), sv.node) == readers.end())
        readers.push_back(sv.node);
    ++stamp;
    stack.assign(1, k);
    seen_stamp[k] = stamp;
    while (!stack.empty()) {
      const uint32_t x = stack.back();
      stack.pop_back();
      for (uint32_t a : g[x].inputs) {
        if (seen_stamp[a] == stamp) continue;
        seen_stamp[a] = stamp;
        // Recomputed from the nearest values that exist: the saved ones in a forward, any
        // materialised one (not fused away) in a re-run.
        if (tagged_rerun ? virt[a] == 1 : !part.saved[a]) {
          stack.push_back(a);
          continue;
        }
        if (hold_index[a] < 0) {
          const uint32_t s = storage_of[a];
          if (dead_at_end[a]) {
            rt_.revive_storage(s);  // its free in the tail is removed below
            revived[a] = 1;
          } else {
            rt_.retain(s);
          }
          hold_index[a] = static_cast<int32_t>(held_.size());
          held_.push_back({s, 0});
        }
        for (int32_t node : readers) {
          if (node_holds_.size() <= static_cast<size_t>(node)) node_holds_.resize(node + 1);
          node_holds_[node].push_back(static_cast<uint32_t>(hold_index[a]));
          ++held_[hold_index[a]].dependents;
        }
      }
    }
  }

  // --- eager saves the partition does not keep: released now, recomputed in backward ---
  std::vector<int32_t> recompute_index(g.size(), -1);
  const OpContext ctx = rt_.ctx;
  for (const Save& sv : saves_) {
    const uint32_t k = index_of(sv.storage) - 1;
    if (part.saved[k] || packed_) continue;
    if (recompute_index[k] < 0) {
      Recompute r;
      r.storage = sv.storage;
      r.bytes = g[k].bytes;
      r.op = k >= first_region ? vertices_[k - first_region].op : OpKind::other;
      recompute_index[k] = static_cast<int32_t>(recompute_.size());
      recompute_.push_back(std::move(r));
    }
    Recompute& r = recompute_[recompute_index[k]];
    if (!fusible(rt_.node(sv.node).kind)) r.materialise = true;
    r.slots.emplace_back(sv.node, sv.slot);
    if (node_recompute_.size() <= static_cast<size_t>(sv.node)) node_recompute_.resize(sv.node + 1);
    auto& list = node_recompute_[sv.node];
    if (std::find(list.begin(), list.end(), static_cast<uint32_t>(recompute_index[k])) == list.end())
      list.push_back(static_cast<uint32_t>(recompute_index[k]));
    rt_.release_saved_slot(rt_.node(sv.node), sv.slot);
  }
  rt_.ctx = ctx;

  // --- the region's events, rewritten ---
  auto& events = program.events;
  const size_t end = events.size();
  std::vector<std::vector<MemoryEvent>> anchored(end - begin + 1);
  std::vector<MemoryEvent> tail;
  tail.reserve(end - begin);
  auto vertex_at = [&](uint32_t tensor) -> int64_t {
    const uint32_t k = index_of(tensor);
    return k > first_region ? static_cast<int64_t>(k - 1) : -1;
  };
  // 4c's forward: the saved set is the compiled graph's output, alive until
  // CompiledFunction has packed it (then ctx.to_save's tuple dies, last element first).
  std::vector<MemoryEvent> at_end;
  for (size_t i = begin; i < end; ++i) {
    const MemoryEvent& e = events[i];
    if (e.type != EventType::alloc && e.type != EventType::free) continue;
    const int64_t k = vertex_at(e.tensor);
    if (k < 0 || e.type != EventType::free || virt[k] || revived[k]) continue;
    if (packed_ && part.saved[k]) {
      at_end.push_back(e);
      virt[k] = 2;  // its original free is skipped below
      continue;
    }
    // Inductor frees a buffer after its last reader: move the free up to there.
    if (has_reader[k] && last_read[k] < i && last_read[k] >= begin) {
      anchored[last_read[k] - begin].push_back(e);
      virt[k] = 2;  // its original free is skipped below
    }
  }
  for (size_t i = begin; i <= end; ++i) {
    for (const MemoryEvent& e : anchored[i - begin]) tail.push_back(e);
    if (i == end) break;
    const MemoryEvent& e = events[i];
    if (e.type == EventType::alloc || e.type == EventType::free) {
      const int64_t k = vertex_at(e.tensor);
      if (k >= 0) {
        if (virt[k] == 1) continue;                                  // fused away
        if (virt[k] == 2 && e.type == EventType::free) continue;     // moved
        if (revived[k] && e.type == EventType::free) continue;       // held for backward
      }
    }
    tail.push_back(e);
  }
  std::sort(at_end.begin(), at_end.end(), [&](const MemoryEvent& a, const MemoryEvent& b) {
    return vertex_at(a.tensor) > vertex_at(b.tensor);
  });
  tail.insert(tail.end(), at_end.begin(), at_end.end());
  events.resize(begin);
  events.insert(events.end(), tail.begin(), tail.end());

  // --- stats: activations only (parameters and module buffers are alive anyway) ---
  for (uint32_t k = 0; k < g.size(); ++k) {
    const TensorKind kind = program.tensors[storage_of[k]].kind;
    if (k < first_region && (kind == TensorKind::parameter || kind == TensorKind::other)) continue;
    if (g[k].needed_by_backward) st.eager_saved_bytes += g[k].bytes;
    if (!part.saved[k]) continue;
    ++st.saved;
    st.saved_bytes += g[k].bytes;
    st.saved_values.push_back({k >= first_region ? vertices_[k - first_region].op : OpKind::other,
                               g[k].bytes, k < first_region});
  }
  stats_.push_back(st);
}

void CompileEngine::unpack(int32_t node) {
  if (static_cast<size_t>(node) >= node_recompute_.size()) return;
  for (uint32_t ri : node_recompute_[node]) {
    Recompute& r = recompute_[ri];
    if (!r.materialise || r.live != 0) continue;
    // Materialised once for every reader of the region still to run.
    const bool was = rt_.recomputing;
    rt_.recomputing = true;
    const uint32_t s = rt_.alloc_raw(r.bytes, TensorKind::activation, r.op);
    rt_.recomputing = was;
    for (const auto& [n, slot] : r.slots) {
      const Node& nd = rt_.node(n);
      if (slot < nd.saved_count) {  // not yet run (a node that ran has no saved slots left)
        rt_.fill_saved(n, slot, s);
        ++r.live;
      }
    }
    rt_.release(s);
  }
}

void CompileEngine::released(int32_t node) {
  if (static_cast<size_t>(node) < node_recompute_.size()) node_recompute_[node].clear();
  if (static_cast<size_t>(node) >= node_holds_.size()) return;
  for (uint32_t h : node_holds_[node]) {
    Held& held = held_[h];
    if (held.dependents > 0 && --held.dependents == 0) rt_.release(held.storage);
  }
  node_holds_[node].clear();
}

Tensor compile_region(Runtime& rt, CompileScope scope, const std::function<Tensor()>& fn,
                      int32_t layer) {
  if (rt.compile == nullptr || !rt.compile->wants(scope)) return fn();
  // The block's pre-forward hooks (FSDP2's unshard + copy-out, and the previous block's
  // post-forward reshard before it) run before the graph: their buffers are no vertex of
  // the region and their events stay outside the rewritten tail.
  if (layer >= 0) rt.run_layer_hooks(layer);
  return rt.compile->run(fn);
}

}  // namespace memsim::graph
