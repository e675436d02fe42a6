// What each tensor of a Program is called in the reports (issue #19 item 1: "every tensor
// named by what it is, everywhere").
//
// Where names come from:
//  - a name given while the Program was built (TensorInfo::name != 0): parameters by
//    their module path ("model.layers.3.mlp.up_proj.weight"); with TensorInfo::role a
//    parameter's derivative, spelled here: "grad of P", "exp_avg of P",
//    "bf16 autocast copy of P", "saved input of model.layers.3.self_attn.o_proj",
//    "logits.float()", FSDP/ZeRO/DDP buffers ("FSDP all-gather of block 7"), ...;
//  - otherwise one composed here from the alloc event and TensorInfo::module: what the op
//    made (by kind: "silu output", "MmBackward0 temporary") and where ("in
//    model.layers.3.mlp", from Program::module_path, else the layer and module label),
//    plus " (recomputed)" for a checkpoint re-run's tensors.
// Names are built at report time, once per Program (TensorNames), never while events are
// executed: the hot loops touch only the 4-byte ids.
//
// Contract:
//  - TensorNames(program) indexes every tensor's alloc event in one pass; name(t) is the
//    same string for every call and every event of tensor t (alloc and free).
//  - A tensor without a given name, whose alloc op is "" (a replayed trace block), is "".
//  - name_pattern() turns each purely numeric dotted component (".3.") or trailing
//    number after a space ("block 7") into "N": the key that collapses repeats
//    ("32 x model.layers.N.mlp.up_proj.weight").
//  - snapshot_category() is the category memory_viz colours by: the lower-case names of
//    torch.profiler._memory_profiler.Category that _memory_viz._profile_to_snapshot
//    writes (pytorch/pytorch torch/cuda/_memory_viz.py), "unknown" for the rest.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "program/program.h"

namespace memsim {

class TensorNames {
 public:
  explicit TensorNames(const Program& program);
  // Tensor t's name ("" for an id out of range).
  const std::string& name(uint32_t tensor) const;
  // The module path it was allocated in ("model.layers.3.mlp"; "" when unknown).
  std::string module_path(uint32_t tensor) const;
  // Index of tensor t's alloc event (SIZE_MAX when it has none).
  size_t alloc_event(uint32_t tensor) const {
    return tensor < alloc_.size() ? alloc_[tensor] : SIZE_MAX;
  }

 private:
  const Program& program_;
  std::vector<size_t> alloc_;       // tensor -> its alloc event
  std::vector<uint32_t> name_of_;   // tensor -> index into names_
  std::vector<std::string> names_;  // distinct names ("" first)
};

// Tensor t's name, built alone (no table): `alloc` is its alloc event. For a few tensors
// (the live set at the peak); TensorNames for all of them.
std::string tensor_name(const Program& program, uint32_t tensor, const MemoryEvent& alloc);
// The same from a copy of the tensor's TensorInfo (a streamed run recycles ids: a dead
// tensor's entry in Program::tensors may belong to another tensor now).
std::string tensor_name(const Program& program, const TensorInfo& info, const MemoryEvent& alloc);
// The same appended to `out` (a buffer reused for many tensors: no allocation per name).
void append_tensor_name(std::string& out, const Program& program, const TensorInfo& info,
                        const MemoryEvent& alloc);

// The path of (layer, module code): Program::module_path; else, in a layer, the common
// prefix of that layer's module paths ("model.layers.3"), or "layers.<L>"; outside the
// layers the module's label ("loss", from Program::module_label); "" when none is known.
std::string module_path_text(const Program& program, int32_t layer, uint8_t module);

std::string name_pattern(std::string_view name);
// The same appended to `out`.
void append_name_pattern(std::string& out, std::string_view name);

// The longest common dotted module path of two parameter names' modules
// ("model.layers.3.self_attn.q_proj.weight", "model.layers.3.self_attn.k_proj.weight" ->
// "model.layers.3.self_attn"; "" when they share none). A first argument that is already a
// module path stays whole where the second lies under it.
std::string common_module_path(std::string_view a, std::string_view b);

const char* snapshot_category(TensorKind kind);

}  // namespace memsim
