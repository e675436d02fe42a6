#include "tools/cli/serve_report.h"

#include <algorithm>
#include <cinttypes>
#include <string>
#include <vector>

#include "tools/cli/html_report.h"  // html_escape

namespace memsim::cli {

namespace {

constexpr double kGiB = 1073741824.0;

std::string gib(double bytes) {
  char b[48];
  std::snprintf(b, sizeof b, "%.2f GiB", bytes / kGiB);
  return b;
}
std::string commas(int64_t n) {
  const bool neg = n < 0;
  std::string d = std::to_string(neg ? -n : n), out;
  for (size_t i = 0; i < d.size(); ++i) {
    if (i > 0 && (d.size() - i) % 3 == 0) out += ',';
    out += d[i];
  }
  return neg ? "-" + out : out;
}
std::string fixed(double v, int digits) {
  char b[48];
  std::snprintf(b, sizeof b, "%.*f", digits, v);
  return b;
}

void line(std::FILE* out, const std::string& label, const std::string& value, const std::string& note = "") {
  std::fprintf(out, "  %-46s %14s%s%s\n", label.c_str(), value.c_str(), note.empty() ? "" : "   ",
               note.c_str());
}

void model_lines(std::FILE* out, const Scenario& s, const serve::ServePlan& p) {
  const serve::ServedModel& m = p.model;
  std::fprintf(out, "  model       %s: %" PRId64 " layers, %" PRId64 " heads / %" PRId64
                    " KV heads x %" PRId64 ", d_model %" PRId64 ", vocab %" PRId64 " (padded %" PRId64
                    "), %s weights%s\n",
               m.architecture.c_str(), m.layers, m.heads, m.kv_heads, m.head_dim, m.d_model, m.vocab,
               m.padded_vocab, to_string(s.precision.params),
               m.quant == WeightQuant::none ? "" : (std::string(", quantization ") + to_string(m.quant)).c_str());
  std::fprintf(out, "  per rank    tensor_parallel %" PRId64 ": %" PRId64 " heads, %" PRId64
                    " KV heads%s, d_ff %" PRId64 "; KV layers: %s; KV dtype %s (%" PRId64 " B)\n",
               m.tp, m.q_heads_rank, m.kv_heads_rank,
               m.kv_heads < m.tp ? " (replicated: kv_heads < TP)" : "", m.d_ff_rank,
               serve::describe_layers(m.kv).c_str(), to_string(s.serve.kv_cache_dtype), m.kv_elem);
  if (m.mla.enabled())
    std::fprintf(out, "  MLA         %s, kv_lora_rank %" PRId64 " + rope %" PRId64 " = %" PRId64
                      "-wide latent per token and layer (not split by TP), qk %" PRId64 " + %" PRId64
                      " / v %" PRId64 " per head\n",
                 m.mla.q_lora_rank > 0 ? ("q_lora_rank " + std::to_string(m.mla.q_lora_rank)).c_str() : "q_proj",
                 m.mla.kv_lora_rank, m.mla.qk_rope, m.mla.latent(), m.mla.qk_nope, m.mla.qk_rope, m.mla.v_head);
}

void vllm_text(std::FILE* out, const serve::ServePlan& p) {
  const serve::ServeSettings& st = p.settings;
  const serve::ServedModel& m = p.model;
  std::fprintf(out, "  settings    max_model_len %s%s, max_num_batched_tokens %s%s, max_num_seqs %s%s, "
                    "block_size %" PRId64 ", %s\n",
               commas(st.max_model_len).c_str(), st.default_len ? " (model context)" : "",
               commas(st.max_num_batched_tokens).c_str(), st.default_tokens ? " (vLLM default)" : "",
               commas(st.max_num_seqs).c_str(), st.default_seqs ? " (vLLM default)" : "",
               st.block_size, st.compiled ? "torch.compile + CUDA graphs" : "enforce_eager");
  std::fprintf(out, "\n  vLLM V1 planner (gpu_worker.py determine_available_memory, kv_cache_utils.py)\n");
  line(out, "total_gpu_memory", gib(static_cast<double>(p.total_memory)), commas(static_cast<int64_t>(p.total_memory)) + " B");
  line(out, "x gpu_memory_utilization " + fixed(st.utilization, 2) + " = requested", gib(p.requested_memory));
  line(out, "- model weights (\"Model loading took\")", gib(static_cast<double>(p.weights_bytes)),
       commas(static_cast<int64_t>(p.weights_bytes)) + " B");
  line(out, "- PyTorch activation peak (profile run)", gib(static_cast<double>(*p.activation_peak_bytes)),
       commas(static_cast<int64_t>(*p.activation_peak_bytes)) + " B: " + commas(st.max_num_batched_tokens) +
           " tokens over " + commas(st.requests) + " requests; forward " +
           gib(static_cast<double>(p.forward_peak_bytes)) + ", sampler " +
           gib(static_cast<double>(p.sampler_peak_bytes)));
  line(out, "- non-torch memory", gib(static_cast<double>(p.non_torch_bytes)),
       "CUDA context " + gib(static_cast<double>(p.cuda_context_bytes)) +
           (m.tp > 1 ? " + NCCL " + gib(static_cast<double>(p.nccl_bytes)) : ""));
  line(out, "= Available KV cache memory", gib(static_cast<double>(p.available_kv_bytes)),
       commas(p.available_kv_bytes) + " B");
  if (p.available_kv_bytes <= 0 || p.kv.page_bytes == 0) return;
  const serve::KvLayer& l0 = m.kv.front();
  if (l0.mla)  // MLAAttentionSpec: one latent per token, no separate K and V
    line(out, "page size (block x latent x B)", commas(p.kv.page_bytes) + " B",
         std::to_string(st.block_size) + " x " + std::to_string(l0.head_dim) + " x " +
             std::to_string(l0.elem_bytes));
  else
    line(out, "page size (2 x block x KV heads x head x B)",
         commas(p.kv.page_bytes) + " B",
         "2 x " + std::to_string(st.block_size) + " x " + std::to_string(l0.kv_heads) + " x " +
             std::to_string(l0.head_dim) + " x " + std::to_string(l0.elem_bytes));
  if (p.kv.groups > 1)
    line(out, "hybrid KV groups", std::to_string(p.kv.groups) + " x " + std::to_string(p.kv.group_size),
         std::to_string(p.kv.padding_layers) + " padding layer(s)");
  line(out, "# GPU blocks (available // page // " + std::to_string(p.kv.group_size) + ")",
       commas(p.kv.num_gpu_blocks));
  line(out, "GPU KV cache size", commas(p.kv.kv_cache_tokens) + " tokens");
  line(out, "Maximum concurrency for " + commas(st.max_model_len) + " tokens per request",
       fixed(p.kv.max_concurrency, 2) + "x");
  line(out, "KV cache tensors", gib(static_cast<double>(p.kv.kv_cache_bytes)),
       commas(p.kv.kv_cache_bytes) + " B");
}

void sglang_text(std::FILE* out, const serve::ServePlan& p) {
  const serve::ServeSettings& st = p.settings;
  std::fprintf(out, "  settings    context_length %s%s, page_size %" PRId64 "\n",
               commas(st.max_model_len).c_str(), st.default_len ? " (model context)" : "", st.block_size);
  std::fprintf(out, "\n  SGLang planner (model_runner.py profile_max_num_token)\n");
  line(out, "total_gpu_memory (free after init)", fixed(p.sglang_total_gib, 2) + " GB",
       "capacity " + gib(static_cast<double>(p.total_memory)) + " - non-torch " +
           gib(static_cast<double>(p.non_torch_bytes)));
  line(out, "weights (reserved segments)", gib(static_cast<double>(p.weights_reserved)),
       "allocated " + gib(static_cast<double>(p.weights_bytes)));
  line(out, "available_gpu_memory after weights", fixed(p.sglang_avail_gib, 2) + " GB");
  line(out, "mem_fraction_static", fixed(st.utilization, 3), st.default_frac ? "SGLang's TP default" : "");
  line(out, "rest = available - total x (1 - fraction)", fixed(p.sglang_rest_gib, 2) + " GB");
  line(out, "cell size (KV heads x head x layers x 2 x B)", commas(p.cell_bytes) + " B");
  line(out, "max_total_num_tokens", commas(p.kv.kv_cache_tokens));
  line(out, "KV cache tensors", gib(static_cast<double>(p.kv.kv_cache_bytes)), commas(p.kv.kv_cache_bytes) + " B");
  line(out, "sequences of " + commas(st.max_model_len) + " tokens at once", fixed(p.kv.max_concurrency, 2) + "x");
}

}  // namespace

void write_serve_text(std::FILE* out, const Scenario& s, const serve::ServePlan& p,
                      const ServeInverse& inv) {
  const std::string title = s.name.empty() ? s.source : s.name;
  std::fprintf(out, "memsim serve: %s\n", title.c_str());
  std::fprintf(out, "  engine      %s on %s\n", to_string(p.engine),
               s.device.preset.empty() ? "a device of the given capacity" : s.device.preset.c_str());
  model_lines(out, s, p);
  if (p.engine == ServeEngine::vllm) vllm_text(out, p);
  else sglang_text(out, p);
  line(out, "max_model_len that fits one request", commas(p.kv.max_model_len_that_fits));
  if (inv.seqs_len)
    line(out, "sequences of " + commas(*inv.seqs_len) + " tokens that fit", commas(inv.seqs_that_fit));
  if (inv.min_tp_asked) {
    line(out, "smallest tensor_parallel that serves it",
         inv.min_tp.tp ? std::to_string(*inv.min_tp.tp) : "none up to " + std::to_string(inv.min_tp_max));
    for (const auto& [tp, why] : inv.min_tp.tried)
      std::fprintf(out, "    TP %" PRId64 ": %s\n", tp, why.c_str());
  }
  std::fprintf(out, "\n  %s\n", p.fits ? "fits: the engine starts with this KV cache"
                                       : ("does not start: " + p.failure).c_str());
}

Json serve_json(const Scenario& s, const serve::ServePlan& p, const ServeInverse& inv) {
  Json j = Json::object();
  j["scenario"] = s.name;
  j["scenario_file"] = s.source;
  j["engine"] = to_string(p.engine);
  j["fits"] = p.fits;
  j["failure"] = p.fits ? Json(nullptr) : Json(p.failure);
  j["weights_bytes"] = p.weights_bytes;
  j["activation_peak_bytes"] = p.activation_peak_bytes ? Json(*p.activation_peak_bytes) : Json(nullptr);
  j["non_torch_bytes"] = p.non_torch_bytes;
  j["kv_cache_bytes"] = p.kv.kv_cache_bytes;
  j["num_gpu_blocks"] = p.kv.num_gpu_blocks;
  j["kv_cache_tokens"] = p.kv.kv_cache_tokens;
  j["max_concurrency"] = p.kv.max_concurrency;
  j["max_model_len_that_fits"] = p.kv.max_model_len_that_fits;
  j["available_kv_cache_bytes"] = p.available_kv_bytes;
  j["total_gpu_memory_bytes"] = p.total_memory;
  j["requested_memory_bytes"] = p.requested_memory;
  j["cuda_context_bytes"] = p.cuda_context_bytes;
  j["nccl_bytes"] = p.nccl_bytes;
  j["page_size_bytes"] = p.kv.page_bytes;
  j["kv_cache_groups"] = p.kv.groups;
  j["settings"] = {{"max_model_len", p.settings.max_model_len},
                   {"max_num_batched_tokens", p.settings.max_num_batched_tokens},
                   {"max_num_seqs", p.settings.max_num_seqs},
                   {"block_size", p.settings.block_size},
                   {"profile_requests", p.settings.requests},
                   {p.engine == ServeEngine::vllm ? "gpu_memory_utilization" : "mem_fraction_static",
                    p.settings.utilization},
                   {"tensor_parallel", p.model.tp},
                   {"kv_cache_dtype", to_string(s.serve.kv_cache_dtype)},
                   {"quantization", to_string(p.model.quant)}};
  if (p.engine == ServeEngine::vllm) {
    j["forward_peak_bytes"] = p.forward_peak_bytes;
    j["sampler_peak_bytes"] = p.sampler_peak_bytes;
  }
  if (inv.seqs_len) j["sequences_that_fit"] = {{"len", *inv.seqs_len}, {"count", inv.seqs_that_fit}};
  if (inv.min_tp_asked) j["min_tensor_parallel"] = inv.min_tp.tp ? Json(*inv.min_tp.tp) : Json(nullptr);
  return j;
}

void write_serve_html(std::FILE* out, const Scenario& s, const serve::ServePlan& p) {
  const std::string title = "memsim serve: " + (s.name.empty() ? s.source : s.name);
  struct Part {
    std::string label;
    double bytes;
    const char* color;
  };
  const double total = static_cast<double>(p.total_memory);
  const double kv = static_cast<double>(std::max<int64_t>(p.kv.kv_cache_bytes, 0));
  const double act = p.activation_peak_bytes ? static_cast<double>(*p.activation_peak_bytes) : 0.0;
  std::vector<Part> parts = {{"weights", static_cast<double>(p.weights_bytes), "#4e79a7"},
                             {"activation peak", act, "#f28e2b"},
                             {"non-torch", static_cast<double>(p.non_torch_bytes), "#9c755f"},
                             {"KV cache", kv, "#59a14f"}};
  double used = 0;
  for (const Part& x : parts) used += x.bytes;
  parts.push_back({"outside the budget", std::max(0.0, total - used), "#d3d3d3"});
  std::fprintf(out, "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>%s</title>\n"
                    "<style>body{font-family:sans-serif;margin:2em}td,th{padding:2px 10px;text-align:right}"
                    "th:first-child,td:first-child{text-align:left}</style></head><body>\n<h1>%s</h1>\n",
               html_escape(title).c_str(), html_escape(title).c_str());
  std::fprintf(out, "<p>%s planner on %s; %s</p>\n", html_escape(to_string(p.engine)).c_str(),
               html_escape(s.device.preset.empty() ? "a device of the given capacity" : s.device.preset).c_str(),
               html_escape(p.fits ? "fits: the engine starts with this KV cache" : "does not start: " + p.failure).c_str());
  // One stacked bar of the device's memory (inline SVG).
  const double W = 900, H = 40;
  std::fprintf(out, "<svg width=\"%.0f\" height=\"%.0f\" role=\"img\" aria-label=\"KV budget\">\n", W, H + 20);
  double x = 0;
  for (const Part& part : parts) {
    const double w = total > 0 ? part.bytes / total * W : 0;
    if (w <= 0) continue;
    std::fprintf(out, "<rect x=\"%.1f\" y=\"0\" width=\"%.1f\" height=\"%.0f\" fill=\"%s\"><title>%s: %s</title></rect>\n",
                 x, w, H, part.color, html_escape(part.label).c_str(), html_escape(gib(part.bytes)).c_str());
    x += w;
  }
  if (p.engine == ServeEngine::vllm) {
    const double rx = total > 0 ? p.requested_memory / total * W : 0;
    std::fprintf(out, "<line x1=\"%.1f\" y1=\"0\" x2=\"%.1f\" y2=\"%.0f\" stroke=\"black\" stroke-dasharray=\"4\"/>"
                      "<text x=\"%.1f\" y=\"%.0f\" font-size=\"12\" text-anchor=\"end\">gpu_memory_utilization</text>\n",
                 rx, rx, H + 4, rx, H + 16);
  }
  std::fprintf(out, "</svg>\n<table><tr><th>term</th><th>GiB</th><th>bytes</th></tr>\n");
  for (const Part& part : parts)
    std::fprintf(out, "<tr><td><span style=\"color:%s\">&#9632;</span> %s</td><td>%s</td><td>%s</td></tr>\n",
                 part.color, html_escape(part.label).c_str(), html_escape(fixed(part.bytes / kGiB, 2)).c_str(),
                 html_escape(commas(static_cast<int64_t>(part.bytes))).c_str());
  std::fprintf(out, "</table>\n<table>\n");
  const std::vector<std::pair<std::string, std::string>> facts = {
      {"available KV cache memory", gib(static_cast<double>(p.available_kv_bytes))},
      {"# GPU blocks", commas(p.kv.num_gpu_blocks)},
      {"GPU KV cache size", commas(p.kv.kv_cache_tokens) + " tokens"},
      {"maximum concurrency at " + commas(p.settings.max_model_len) + " tokens", fixed(p.kv.max_concurrency, 2) + "x"},
      {"max_model_len that fits one request", commas(p.kv.max_model_len_that_fits)}};
  for (const auto& [k, v] : facts)
    std::fprintf(out, "<tr><td>%s</td><td>%s</td></tr>\n", html_escape(k).c_str(), html_escape(v).c_str());
  std::fprintf(out, "</table>\n</body></html>\n");
}

}  // namespace memsim::cli
