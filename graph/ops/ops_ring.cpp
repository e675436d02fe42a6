#include "graph/ops/ops_ring.h"

#include "graph/ops/op_helpers.h"

// The event sequence of torch's ring attention on one rank; graph/ops/ops_ring.h states the
// rules and cites the source. Each Tensor below is a Python name of
// _templated_ring_attention(_backward) or of an object it holds: assigning a handle is
// rebinding the name (the old storage dies when its last name goes), so the frees fall
// where CPython's reference counting puts them.
namespace memsim::graph {

namespace {

uint64_t round_up(uint64_t x, uint64_t m) { return (x + m - 1) / m * m; }
// The ring's node is an sdpa_flash node (the aten op the ring runs under) marked by this
// flag (the one bit of Node::flags no op library uses).
constexpr uint8_t kRingNode = 128;

// The backward node's sizes: size[0] = B*H, size[1] = L, size[2] = hd,
// size[3] = e | N << 8 | r << 24 | alltoall << 40 | (B > 1) << 41 | kv_contiguous << 42 |
// (H > 1) << 43.
struct RingNode {
  uint64_t bh, len, hd, elem;
  RingSpec ring;
  bool strided_halves;  // B > 1: a sequence half of grad_out / out is not contiguous
  bool multi_head;      // H > 1: the (B,L,H,hd) transpose of a contiguous out is not
};
void pack(Node& n, const SdpaShape& s, const RingSpec& r) {
  n.flags |= kRingNode;
  n.size[0] = s.batch * s.heads;
  n.size[1] = s.seq;
  n.size[2] = s.head_dim;
  n.size[3] = s.elem | (static_cast<uint64_t>(r.degree) << 8) |
              (static_cast<uint64_t>(r.rank) << 24) | (static_cast<uint64_t>(r.alltoall) << 40) |
              (static_cast<uint64_t>(s.batch > 1) << 41) |
              (static_cast<uint64_t>(r.kv_contiguous) << 42) |
              (static_cast<uint64_t>(s.heads > 1) << 43);
}
RingNode unpack(const Node& n) {
  RingNode r{n.size[0], n.size[1], n.size[2], n.size[3] & 0xff, {}, ((n.size[3] >> 41) & 1) != 0,
             ((n.size[3] >> 43) & 1) != 0};
  r.ring.kv_contiguous = ((n.size[3] >> 42) & 1) != 0;
  r.ring.degree = static_cast<uint32_t>((n.size[3] >> 8) & 0xffff);
  r.ring.rank = static_cast<uint32_t>((n.size[3] >> 24) & 0xffff);
  r.ring.alltoall = ((n.size[3] >> 40) & 1) != 0;
  return r;
}

// Names of the ring's storages (program/tensor_names.h), so a timeline or a test can find
// them.
struct Names {
  uint32_t k_contig, v_contig, kv_send, kv_gathered, kv_received, block_out, block_lse,
      block_out_f32, merge_tmp, acc_out, acc_lse, dq_acc, dk_acc, dv_acc, dkv_send,
      dkv_received, lse_half, grad_copy, dq_block, dkv_block, scratch;
};
Names names(Runtime& rt) {
  Program& p = rt.program();
  return {p.intern("CP ring: key.contiguous()"),
          p.intern("CP ring: value.contiguous()"),
          p.intern("CP ring: K/V send buffer (cat)"),
          p.intern("CP ring: all-gathered K/V (allgather rotater)"),
          p.intern("CP ring: received K/V (permute_tensor)"),
          p.intern("CP ring: block out"),
          p.intern("CP ring: block logsumexp"),
          p.intern("CP ring: block out fp32 (merger)"),
          p.intern("CP ring: merge temporary"),
          p.intern("CP ring: merged out fp32 (merger)"),
          p.intern("CP ring: merged logsumexp fp32 (merger)"),
          p.intern("CP ring: grad_query fp32 accumulator"),
          p.intern("CP ring: grad_key fp32 accumulator"),
          p.intern("CP ring: grad_value fp32 accumulator"),
          p.intern("CP ring: dK/dV send buffer (cat)"),
          p.intern("CP ring: received dK/dV (permute_tensor)"),
          p.intern("CP ring: logsumexp half .contiguous()"),
          p.intern("CP ring: grad_out/out half .contiguous()"),
          p.intern("CP ring: block dq"),
          p.intern("CP ring: block dk/dv"),
          p.intern("CP ring: flash backward scratch")};
}

// One storage of `bytes` made by op `k`, named.
Tensor make(Runtime& rt, uint64_t bytes, OpKind k, uint32_t name,
            TensorKind kind = TensorKind::temporary) {
  Tensor t = rt.alloc(bytes, kind, k);
  rt.name(t.storage, name);
  return t;
}

}  // namespace

double ring_forward_flops(const SdpaShape& s, const RingSpec& ring) {
  const double full = 4.0 * s.batch * s.heads * s.seq * s.seq * s.head_dim;
  return full + (ring.degree - 1) * full / 2;
}

Tensor sdpa_ring_flash(Runtime& rt, const Tensor& q, const Tensor& k, const Tensor& v,
                       const SdpaShape& s, const RingSpec& ring) {
  const OpKind op = OpKind::sdpa_flash;
  const Names nm = names(rt);
  const uint64_t bh = s.batch * s.heads, L = s.seq, hd = s.head_dim, e = s.elem;
  const uint64_t X = bh * L * hd * e, Xf = bh * L * hd * 4, l = bh * L * 4;
  const uint32_t N = ring.degree, r = ring.rank;
  const bool grad = detail::wants_grad(rt, {&q, &k, &v});
  Tensor out, lse;
  {
    // key = key.contiguous(); value = value.contiguous(): copies unless already contiguous
    // (then the names alias the inputs, which the caller holds anyway).
    Tensor key = ring.kv_contiguous ? k : make(rt, X, op, nm.k_contig);
    Tensor value = ring.kv_contiguous ? v : make(rt, X, op, nm.v_contig);
    Tensor kk, vv;                 // the names k, v of the step's kernel call
    Tensor block_out, block_lse;   // out, logsumexp
    Tensor acc_out, acc_lse;       // sdpa_merger._out, ._lse
    Tensor gathered, received;     // the rotater's buffer (allgather / alltoall)
    Tensor in_flight;              // the collective's input, kept until its wait
    for (uint32_t i = 0; i < N; ++i) {
      if (i > 0) {  // rotater.next_buffer(): wait; key, value = views of the buffer
        in_flight.reset();
        const Tensor& buf = ring.alltoall ? received : gathered;
        key = buf;
        value = buf;
      }
      if (i + 1 < N) {  // next_kv = torch.cat([key.flatten(), value.flatten()])
        Tensor next_kv = make(rt, 2 * X, op, nm.kv_send);
        if (ring.alltoall) {  // self._buffer = permute_tensor(next_kv)
          received = make(rt, 2 * X, op, nm.kv_received);
          in_flight = next_kv;
        } else if (!gathered.defined()) {  // all_gather_tensor, once
          gathered = make(rt, 2 * X * N, op, nm.kv_gathered);
          in_flight = next_kv;
        }
      }  // next_kv = rotater.exchange_buffers(...) is None
      // q, k, v, partial = ...: step 0 full; i <= r: k/v first halves (views);
      // i > r: q's second half (a view), partial.
      const bool partial = i > r;
      const uint64_t lq = partial ? L / 2 : L;
      kk = key;
      vv = value;
      // out, logsumexp, *rest = op(q, k, v, is_causal=...)
      {
        Tensor o = make(rt, bh * lq * hd * e, op, nm.block_out);
        Tensor m = make(rt, bh * lq * 4, op, nm.block_lse);
        block_out = std::move(o);
        block_lse = std::move(m);
      }
      // sdpa_merger.step(out, logsumexp, partial)
      Tensor block_f = e == 4 ? block_out : make(rt, bh * lq * hd * 4, op, nm.block_out_f32);
      if (!acc_lse.defined()) {
        acc_lse = block_lse;
        acc_out = block_f;
      } else {
        const uint64_t xq = bh * lq * hd * 4, lqb = bh * lq * 4;
        Tensor new_out, new_lse;
        {  // out - F.sigmoid(block_lse - lse) * (out - block_out)
          Tensor sig;
          {
            Tensor d = make(rt, lqb, op, nm.merge_tmp);
            sig = make(rt, lqb, op, nm.merge_tmp);
          }
          Tensor prod;
          {
            Tensor d = make(rt, xq, op, nm.merge_tmp);
            prod = make(rt, xq, op, nm.merge_tmp);
            sig.reset();
          }
          new_out = make(rt, xq, op, partial ? nm.merge_tmp : nm.acc_out);
        }
        {  // lse - F.logsigmoid(lse - block_lse)
          Tensor ls;
          {
            Tensor d = make(rt, lqb, op, nm.merge_tmp);
            ls = make(rt, lqb, op, nm.merge_tmp);
          }
          new_lse = make(rt, lqb, op, partial ? nm.merge_tmp : nm.acc_lse);
        }
        if (partial) {  // _partial_update: torch.cat of the untouched half and the new one
          acc_lse = make(rt, l, op, nm.acc_lse);
          acc_out = make(rt, Xf, op, nm.acc_out);
        } else {
          acc_lse = std::move(new_lse);
          acc_out = std::move(new_out);
        }
      }  // _merge_one's locals, then step()'s fp32 block out
    }
    // results(): out = self._out.to(out dtype); lse = self._lse (already fp32)
    out = e == 4 ? acc_out : detail::out_tensor(rt, X, op);
    lse = acc_lse;
    // The function returns: the merger, the last block results, the rotater, the names.
    acc_out.reset();
    acc_lse.reset();
    block_out.reset();
    block_lse.reset();
  }
  if (grad) {
    int32_t n = rt.make_node(OpKind::sdpa_flash, {&q, &k, &v});
    Node& node = rt.node(n);
    pack(node, s, ring);
    const double f = ring_forward_flops(s, ring);
    node.flops = 2.5 * f;
    node.gemm_bytes = static_cast<float>(N * (2 * (q.bytes + k.bytes + v.bytes) + 2 * out.bytes + lse.bytes));
    rt.save(n, q);
    rt.save(n, k);
    rt.save(n, v);
    rt.save(n, out);
    rt.save(n, lse);
    out.grad_fn = n;
  }
  rt.add_flops_forward(ring_forward_flops(s, ring),
                       static_cast<double>(N * (q.bytes + k.bytes + v.bytes + out.bytes + lse.bytes)));
  return out;
}

bool run_ring_backward(Runtime& rt, Node& n, const Grad in[2], Grad out[3]) {
  if (n.kind != OpKind::sdpa_flash || (n.flags & kRingNode) == 0) return false;
  if (in[0].storage == kNoStorage) return true;
  const OpKind op = n.kind;
  const Names nm = names(rt);
  const RingNode rn = unpack(n);
  const uint64_t bh = rn.bh, L = rn.len, hd = rn.hd, e = rn.elem;
  const uint64_t X = bh * L * hd * e, Xf = bh * L * hd * 4;
  const uint32_t N = rn.ring.degree, r = rn.ring.rank;
  const bool alltoall = rn.ring.alltoall;
  // B > 1: the second half of grad_out / out along the sequence (a (B, L/2, H, hd) slice
  // of the kernel's (B, L, H, hd) layout) is not contiguous.
  const bool strided_halves = rn.strided_halves;
  // A contiguous (B,H,L,hd) merged output (ring_output_contiguous): its (B,L,H,hd)
  // transpose is not contiguous when H > 1, its sequence half when B*H > 1.
  const bool out_contiguous = ring_output_contiguous(rn.ring);
  const bool out_copy_full = out_contiguous && rn.multi_head;
  const bool out_copy_half = out_contiguous ? bh > 1 : strided_halves;
  uint32_t dq_out = kNoStorage, dkv_out = kNoStorage;
  {
    Tensor grad_query = make(rt, Xf, op, nm.dq_acc);  // zeros_like(query, dtype=float32)
    Tensor grad_key = make(rt, Xf, op, nm.dk_acc);
    Tensor grad_value = make(rt, Xf, op, nm.dv_acc);
    // key.contiguous(), value.contiguous(): the saved k / v themselves when contiguous
    // (nothing allocated; the node's saved tensors outlive the call).
    Tensor key, value;
    if (!rn.ring.kv_contiguous) {
      key = make(rt, X, op, nm.k_contig);
      value = make(rt, X, op, nm.v_contig);
    }
    Tensor kk, vv, lse_half;               // the step's k, v, lse names
    Tensor next_kv, gathered, received, kv_in_flight;
    Tensor dkv_received, dkv_in_flight, next_grad_kv;
    Tensor dq_block, dk_block, dv_block;   // grad_query_, grad_key_, grad_value_
    for (uint32_t i = 0; i < N; ++i) {
      if (i > 0) {  // buffer = kv_rotater.next_buffer()
        kv_in_flight.reset();
        const Tensor& buf = alltoall ? received : gathered;
        key = buf;
        value = buf;
      }
      if (i + 1 != N) {  // next_kv = cat(...); kv_rotater.exchange_buffers(next_kv)
        next_kv = make(rt, 2 * X, op, nm.kv_send);
        if (alltoall) {
          received = make(rt, 2 * X, op, nm.kv_received);
          kv_in_flight = next_kv;
        } else if (!gathered.defined()) {
          gathered = make(rt, 2 * X * N, op, nm.kv_gathered);
          kv_in_flight = next_kv;
        }
      }
      const bool partial = i > r;  // q's second half; else k/v's first half (i > 0)
      const uint64_t lq = partial ? L / 2 : L, lk = (i == 0 || partial) ? L : L / 2;
      {  // q, k, v, out_, dout, lse = ...
        Tensor new_lse;
        if (partial && bh > 1) new_lse = make(rt, bh * lq * 4, op, nm.lse_half);
        kk = key;
        vv = value;
        lse_half = std::move(new_lse);
      }
      {  // grad_query_, grad_key_, grad_value_, *rest = op(...): the flash backward
        // contiguous_grad_out = grad_out.contiguous(); contiguous_out = out.contiguous()
        Tensor dout_c, out_c;
        if (partial && strided_halves) dout_c = make(rt, bh * lq * hd * e, op, nm.grad_copy);
        if (partial ? out_copy_half : out_copy_full)
          out_c = make(rt, bh * lq * hd * e, op, nm.grad_copy);
        Tensor dq = make(rt, bh * lq * hd * e, op, nm.dq_block);
        Tensor dk = make(rt, bh * lk * hd * e, op, nm.dkv_block);
        Tensor dv = make(rt, bh * lk * hd * e, op, nm.dkv_block);
        if (rt.kernel_scratch) {
          const uint64_t sr = round_up(lq, 128);
          Tensor softmax_d = make(rt, bh * sr * 4, op, nm.scratch);
          Tensor dq_accum = make(rt, bh * sr * round_up(hd, 32) * 4, op, nm.scratch);
          dq_accum.reset();
        }
        out_c.reset();
        dout_c.reset();
        dq_block = std::move(dq);
        dk_block = std::move(dk);
        dv_block = std::move(dv);
      }
      if (i > 0) {
        // next_grad_kv = dkv_rotater.next_buffer(): the wait releases the sent cat
        dkv_in_flight.reset();
        next_grad_kv = dkv_received;
        grad_key = dkv_received;  // views of the received buffer
        grad_value = dkv_received;
        if (!partial) {  // _partial_update(add=True): a torch.cat each
          grad_key = make(rt, Xf, op, nm.dk_acc);
          grad_value = make(rt, Xf, op, nm.dv_acc);
        }
      }  // else (and i == 0): += in place
      // next_grad_kv = cat([grad_key, grad_value]); dkv_rotater.exchange_buffers(...)
      next_grad_kv = make(rt, 2 * Xf, op, nm.dkv_send);
      dkv_received = make(rt, 2 * Xf, op, nm.dkv_received);
      dkv_in_flight = next_grad_kv;
      if (partial) grad_query = make(rt, Xf, op, nm.dq_acc);  // _partial_update: cat
    }
    // grad_query = grad_query.to(query.dtype)
    if (e != 4) {
      Tensor dq = rt.alloc(X, TensorKind::temporary, op);
      grad_query = std::move(dq);
    }
    // next_grad_kv = dkv_rotater.next_buffer().to(key.dtype); grad_key, grad_value = views
    dkv_in_flight.reset();
    if (e != 4) {
      Tensor dkv = rt.alloc(2 * X, TensorKind::temporary, op);
      next_grad_kv = std::move(dkv);
    } else {
      next_grad_kv = dkv_received;
    }
    grad_key = next_grad_kv;
    grad_value = next_grad_kv;
    dq_out = grad_query.storage;
    dkv_out = next_grad_kv.storage;
    rt.retain(dq_out);
    rt.retain(dkv_out);
    rt.retain(dkv_out);
  }  // the function returns: its locals and the rotaters' buffers die
  auto needs = [&](int i) { return n.next[i].node >= 0; };
  if (needs(0)) out[0] = Grad{dq_out, false, false};
  else rt.release(dq_out);
  if (needs(1)) out[1] = Grad{dkv_out, true, false};
  else rt.release(dkv_out);
  if (needs(2)) out[2] = Grad{dkv_out, true, false};
  else rt.release(dkv_out);
  return true;
}

}  // namespace memsim::graph
