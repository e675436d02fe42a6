#include "graph/models/lora.h"

#include "graph/ops/ops.h"
#include "graph/ops/ops_lora.h"
#include "graph/ops/ops_nn.h"

namespace memsim::graph {

namespace {
Tensor named(Runtime& rt, Tensor t, const std::string& name) {
  rt.program().tensors[t.storage].name = rt.program().intern(name);
  return t;
}
}  // namespace

int32_t LoraModules::add_base_weight(uint64_t out, uint64_t in, const std::string& name,
                                     bool conv1d_layout) {
  const uint64_t n = out * in;
  if (!quantized()) {
    const int32_t id = rt_.add_parameter(n * s_.elem, name);
    rt_.parameters()[id].rows = conv1d_layout ? in : out;
    return id;
  }
  // quantize_4bit(blocksize=64, compress_statistics=True, quant_type="nf4"): the packed
  // codes, then the double-quantised statistics kept in the weight's QuantState.
  const int32_t id = rt_.add_parameter(nf4_packed_bytes(n), name);
  if (!dynamic_map_.defined())
    dynamic_map_ = named(rt_, rt_.alloc(256 * 4, TensorKind::parameter, OpKind::other),
                         "bnb dynamic map");
  const uint64_t blocks = nf4_blocks(n);
  Nf4State q;
  q.absmax_q = named(rt_, rt_.alloc(blocks, TensorKind::parameter, OpKind::other),
                     name + ".quant_state.absmax");
  q.absmax2 = named(rt_, rt_.alloc((blocks + 255) / 256 * 4, TensorKind::parameter, OpKind::other),
                    name + ".quant_state.state2.absmax");
  q.offset = named(rt_, rt_.alloc(4, TensorKind::parameter, OpKind::other),
                   name + ".quant_state.offset");
  q.code = named(rt_, rt_.alloc(16 * 4, TensorKind::parameter, OpKind::other),
                 name + ".quant_state.code");
  nf4_.push_back(std::move(q));
  nf4_ids_.push_back(id);
  return id;
}

void LoraModules::freeze_all() {
  for (Parameter& p : rt_.parameters()) p.frozen = true;
}

// PEFT 5d602fdb src/peft/utils/other.py prepare_model_for_kbit_training: `for param in
// model.parameters(): if param.dtype in (float16, bfloat16) and param.__class__.__name__ !=
// "Params4bit": param.data = param.data.to(torch.float32)`, then torch.cuda.empty_cache()
// (auto_clear_cache=True). Every parameter so far is the loaded model's (the adapters come
// after, from get_peft_model) and in the load dtype but for the Params4bit codes.
void LoraModules::prepare_kbit_upcast() {
  const uint64_t from = s_.lora.upcast_from_elem;
  if (from == 0) return;
  Program& program = rt_.program();
  const uint32_t op = program.intern("prepare_model_for_kbit_training (param.data.to(float32))");
  size_t next_nf4 = 0;
  std::vector<Parameter>& params = rt_.parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    if (next_nf4 < nf4_ids_.size() && nf4_ids_[next_nf4] == static_cast<int32_t>(i)) {
      ++next_nf4;
      continue;
    }
    Parameter& p = params[i];
    const uint64_t bytes = p.bytes / from * s_.elem;
    const uint32_t loaded = p.storage;
    const uint32_t fp32 = rt_.alloc_raw(bytes, TensorKind::parameter, OpKind::other);
    program.tensors[fp32].name = program.tensors[loaded].name;  // the parameter's name
    program.tensors[fp32].module = program.tensors[loaded].module;
    p.storage = fp32;  // `param.data =`: the module's reference moves to the copy
    p.bytes = bytes;
    program.free(loaded, Phase::setup, op, rt_.ctx.layer);
  }
  program.empty_cache(Phase::setup);
}

LoraAdapter add_lora_parameters(Runtime& rt, uint64_t rank, uint64_t out, uint64_t in, uint64_t elem,
                                const std::string& module) {
  LoraAdapter ad;
  ad.a = rt.add_parameter(rank * in * elem, module + ".lora_A.default.weight");
  ad.b = rt.add_parameter(out * rank * elem, module + ".lora_B.default.weight");
  rt.parameters()[ad.a].rows = rank;
  rt.parameters()[ad.b].rows = out;
  rt.parameters()[ad.a].elem = static_cast<uint8_t>(elem);
  rt.parameters()[ad.b].elem = static_cast<uint8_t>(elem);
  return ad;
}

LoraAdapter LoraModules::add_adapter(uint64_t out, uint64_t in, const std::string& module_name) {
  return add_lora_parameters(rt_, static_cast<uint64_t>(s_.lora.rank), out, in, s_.lora.adapter_elem,
                             module_name);
}

Tensor LoraModules::base_linear(const Tensor& x, int32_t w, uint64_t in, uint64_t out,
                                LinearInput input) {
  const double flops = 2.0 * static_cast<double>(s_.rows()) * in * out;
  if (!quantized()) return mm_linear(rt_, x, rt_.param(w), s_.rows() * out * s_.elem, flops, input);
  // Linear4bit.forward: x.to(compute_dtype), the 4-bit matmul in it, .to(inp_dtype).
  const uint64_t e = s_.elem;
  const uint64_t c = s_.lora.compute_elem > 0 ? s_.lora.compute_elem : e;
  const uint64_t q = s_.lora.quant_elem > 0 ? s_.lora.quant_elem : e;
  Nf4Sizes deq;
  deq.absmax_fp32 = nf4_blocks(in * out) * 4;
  deq.weight = in * out * q;
  deq.weight_cast = q == c ? 0 : in * out * c;
  if (c == e) return matmul_4bit(rt_, x, rt_.param(w), deq, s_.rows() * out * e, flops);
  Tensor xc = to_copy(rt_, x, x.bytes / e * c);  // `x = x.to(self.compute_dtype)`
  Tensor y = matmul_4bit(rt_, xc, rt_.param(w), deq, s_.rows() * out * c, flops);
  Tensor result = to_copy(rt_, y, s_.rows() * out * e);  // `.to(inp_dtype)`
  y.reset();   // the expression's compute-dtype output
  xc.reset();  // forward's local x, at return (MatMul4Bit saved nothing of it)
  return result;
}

Tensor LoraModules::add_adapter_path(const Tensor& x, Tensor result, const LoraAdapter& ad,
                                     uint64_t in, uint64_t out, LinearInput input) {
  if (!ad.defined()) return result;
  const uint64_t rows = s_.rows(), r = static_cast<uint64_t>(s_.lora.rank);
  const uint64_t a = s_.lora.adapter_elem, e = s_.elem;
  // PEFT rebinds `x = x.to(lora_A.weight.dtype)`: that copy lives until forward returns.
  Tensor xa = a == e ? x : to_copy(rt_, x, x.bytes / e * a);
  Tensor sum;
  {
    Tensor xd = s_.lora.dropout > 0.0 ? native_dropout(rt_, xa, a) : xa;
    // lora_A reads x itself only without dropout and dtype copy; otherwise its input is
    // the copy's or dropout's output, read by nothing else.
    const LinearInput a_input = a == e && s_.lora.dropout <= 0.0 ? input : LinearInput::folded;
    Tensor h = mm_linear(rt_, xd, rt_.param(ad.a), rows * r * a, 2.0 * rows * in * r, a_input);
    xd.reset();
    Tensor y = mm_linear(rt_, h, rt_.param(ad.b), rows * out * a, 2.0 * rows * r * out);
    h.reset();
    Tensor ys = mul_scalar(rt_, y);  // * scaling
    y.reset();
    sum = add(rt_, result, ys);      // promotes to the wider dtype
  }
  result.reset();                    // `result = result + ...` drops the base output
  if (a != e) sum = to_copy(rt_, sum, rows * out * e);  // result.to(torch_result_dtype)
  return sum;
}

// PEFT 5d602fdb src/peft/tuners/lora/bnb.py, Linear4bit.forward (outside autocast, vanilla
// LoRA, one adapter):
//   result = self.base_layer(x); result = result.clone()
//   x = self._cast_input_dtype(x, lora_A.weight.dtype)      # a copy when the dtypes differ
//   output = lora_B(lora_A(dropout(x))) * scaling
//   output = output.to(expected_dtype)                      # a copy when the dtypes differ
//   result = result + output
// CloneBackward0 and the add's backward save nothing; the casts' backward is a cast of the
// grad (ToCopyBackward0, as in add_adapter_path).
Tensor LoraModules::add_adapter_path_4bit(const Tensor& x, Tensor result, const LoraAdapter& ad,
                                          uint64_t in, uint64_t out, LinearInput input) {
  if (!ad.defined()) return result;
  const uint64_t rows = s_.rows(), r = static_cast<uint64_t>(s_.lora.rank);
  const uint64_t a = s_.lora.adapter_elem, e = s_.elem;
  {
    Tensor c = clone(rt_, result);
    result = std::move(c);  // the base output dies here (MatMul4Bit saved nothing of it)
  }
  Tensor xa = a == e ? x : to_copy(rt_, x, x.bytes / e * a);
  Tensor sum;
  {
    Tensor xd = s_.lora.dropout > 0.0 ? native_dropout(rt_, xa, a) : xa;
    const LinearInput a_input = a == e && s_.lora.dropout <= 0.0 ? input : LinearInput::folded;
    Tensor h = mm_linear(rt_, xd, rt_.param(ad.a), rows * r * a, 2.0 * rows * in * r, a_input);
    xd.reset();
    Tensor y = mm_linear(rt_, h, rt_.param(ad.b), rows * out * a, 2.0 * rows * r * out);
    h.reset();
    Tensor ys = mul_scalar(rt_, y);  // * scaling, in the adapters' dtype
    y.reset();
    if (a != e) ys = to_copy(rt_, ys, rows * out * e);  // output.to(expected_dtype)
    sum = add(rt_, result, ys);
  }
  result.reset();
  return sum;
}

}  // namespace memsim::graph
