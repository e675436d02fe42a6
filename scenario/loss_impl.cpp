#include "scenario/loss_impl.h"

#include <charconv>

namespace memsim {

namespace {
constexpr std::string_view kChunked = "chunked:";
}

std::optional<LossConfig> parse_loss_impl(std::string_view text) {
  LossConfig l;
  if (text == "torch") l.impl = LossFunction::torch;
  else if (text == "torch-float") l.impl = LossFunction::torch_float;
  else if (text == "cs336") l.impl = LossFunction::cs336;
  else if (text == "one-hot") l.impl = LossFunction::one_hot;
  else if (text == "liger") l.impl = LossFunction::liger;
  else if (text.substr(0, kChunked.size()) == kChunked) {
    const std::string_view n = text.substr(kChunked.size());
    int64_t chunks = 0;
    const auto [end, ec] = std::from_chars(n.data(), n.data() + n.size(), chunks);
    if (n.empty() || ec != std::errc() || end != n.data() + n.size() || chunks < 1)
      return std::nullopt;
    l.impl = LossFunction::chunked;
    l.chunks = chunks;
  } else {
    return std::nullopt;
  }
  return l;
}

std::string loss_impl_label(const LossConfig& l) {
  switch (l.impl) {
    case LossFunction::automatic: return "automatic";
    case LossFunction::torch: return "torch";
    case LossFunction::torch_float: return "torch-float";
    case LossFunction::cs336: return "cs336";
    case LossFunction::one_hot: return "one-hot";
    case LossFunction::chunked: return "chunked:" + std::to_string(l.chunks);
    case LossFunction::liger: return "liger";
  }
  return "automatic";
}

const char* loss_impl_spellings() {
  return "torch, torch-float, cs336, one-hot, chunked:N, liger";
}

std::string loss_impl_refusal(ModelFamily family, LossFunction impl) {
  const bool hidden_state_loss = impl == LossFunction::chunked || impl == LossFunction::liger;
  switch (family) {
    case ModelFamily::cs336:
      if (hidden_state_loss)
        return "needs the model's last hidden state and head weight, but cs336_basics' "
               "TransformerLM.forward returns logits only (no chunked output, no Liger patch "
               "for it); use torch, torch-float, cs336 or one-hot";
      return "";
    case ModelFamily::hf_llama:
    case ModelFamily::hf_gpt2:
      if (impl == LossFunction::cs336 || impl == LossFunction::one_hot)
        return "is a cs336-family option (the staff scripts' hand-written cross entropies); "
               "use torch, torch-float, chunked:N or liger, or leave loss.impl out for the "
               "model's own loss";
      return "";
    case ModelFamily::megatron:
      return "megatron computes its loss inside the model (vocab_parallel_cross_entropy on "
             "the tensor-parallel logits shard, with its own fp32 softmax); loss.impl is not "
             "modelled for it: remove the key";
  }
  return "";
}

LossConfig torchtune_default_loss() {
  LossConfig l;
  l.impl = LossFunction::chunked;
  l.chunks = 8;
  return l;
}

}  // namespace memsim
