// graph/ IR: the vocabulary shared by the op library, the autograd emulation and the
// model-family builders.
//
// DESIGN NOTE (read this first). memsim's graph layer is a *symbolic eager PyTorch*:
//  - A builder (graph/models/cs336.h, later hf-gpt2 / hf-llama / megatron) is written like the
//    model's Python forward, one op call per aten op, against graph::Runtime.
//  - Every op call emits the allocator requests PyTorch eager would make, in the same
//    order, straight into a sim::Program (no graph is materialised first; the Program
//    IS the op-by-op trace).
//  - Storages are reference counted exactly like c10::StorageImpl. References are held
//    by (a) graph::Tensor handles, which stand for Python names and temporaries: C++
//    scopes mirror Python lifetimes, and builders reset() a handle where Python rebinds
//    or drops a name; (b) autograd saved tensors (SavedVariable); (c) gradient buffers.
//    A storage is freed when its count reaches 0, so every free lands where PyTorch's
//    would (aten-saved-tensors.md §A.1).
//  - With grad mode on, each differentiable op records one autograd Node (OpKind +
//    byte sizes + saved storages + next edges). Runtime::backward() then emulates the
//    autograd engine: highest sequence number first, saved tensors released after each
//    node, grads accumulated in place or out of place like InputBuffer::accumulate,
//    AccumulateGrad stealing or cloning into .grad (aten-saved-tensors.md §E).
//  - Ops are typed (OpKind) and every event carries phase, layer, Module and a region
//    id, so a checkpointing pass can re-invoke a layer's forward emitter, and a numeric
//    executor can interpret the same op stream.
#pragma once

#include <cstdint>

#include "graph/ops/op_table.h"

namespace memsim::graph {

// Element types of device tensors.
enum class ScalarType : uint8_t { f32, bf16, f16, i64, b8 };
inline constexpr uint64_t element_size(ScalarType t) {
  switch (t) {
    case ScalarType::f32: return 4;
    case ScalarType::bf16: return 2;
    case ScalarType::f16: return 2;
    case ScalarType::i64: return 8;
    case ScalarType::b8: return 1;
  }
  return 4;
}

// Which part of the model an op belongs to (for reports and checkpoint policies).
enum class Module : uint8_t { none, embedding, attention, mlp, norm, head, loss, optimizer };
inline constexpr int kModuleCount = 8;
const char* to_string(Module m);

// The op library: one row per op in graph/ops/op_table.h (kind, library, forward and
// backward names); forward semantics and backward recipes are in the library's file.
enum class OpKind : uint8_t {
#define MEMSIM_OP_KIND(kind, library, fwd, bwd) kind,
  MEMSIM_OP_TABLE(MEMSIM_OP_KIND)
#undef MEMSIM_OP_KIND
};
inline constexpr int kOpKindCount = 0
#define MEMSIM_OP_COUNT(kind, library, fwd, bwd) +1
    MEMSIM_OP_TABLE(MEMSIM_OP_COUNT)
#undef MEMSIM_OP_COUNT
    ;
// Which file emits an op and runs its backward.
enum class OpLibrary : uint8_t { core, nn, fused, autocast, lora, liger, float8, moe };  // moe: graph/ops/ops_moe.h  // liger: graph/ops/ops_liger.h; float8: graph/ops/ops_float8.h
OpLibrary op_library(OpKind k);
const char* forward_name(OpKind k);   // aten op name, e.g. "bmm"
const char* backward_name(OpKind k);  // autograd node name, e.g. "BmmBackward0"

}  // namespace memsim::graph
