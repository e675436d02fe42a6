// Issue #19 item 2 (docs/advice.md), end to end through the built binary: an OOM's
// needed bytes, `run --advise` (each entry the same numbers as a separate run with its
// --set), the FITS warnings (near capacity, cache flush), the TIME line of an OOM run.
// Item 5: the HTML report's per-layer view and zoom.
#include <catch2/catch.hpp>

#include "tests/cli_test_support.h"
#include "tests/shared_dir_test_support.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include "test_paths.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

using Result = memsim_test::CliResult;

struct TempDir : memsim_test::TempDir {
  TempDir() : memsim_test::TempDir("memsim_advise") {}
};

Result run_cli(const std::string& args, const TempDir& dir) { return memsim_test::run_memsim(args, dir); }

std::string q(const fs::path& p) { return "'" + p.string() + "'"; }

std::string shipped(const std::string& name) {
  return q(fs::path(MEMSIM_SOURCE_DIR) / "scenarios" / name);
}

// Llama 2 7B cut to two layers at sequence 256 on an A100 preset: every change of the
// hf-llama family applies, and each simulates in a fraction of a second.
const std::string kLlama = shipped("llama2-7b-full-finetune-a100.yaml") +
                           " --set model.layers=2 --set batch.seq_len=256 --set batch.micro_batch=2";

json run_json(const std::string& args, const TempDir& dir, int expect_status = -1) {
  const Result r = run_cli("run " + args + " --json -", dir);
  INFO("memsim run " << args << "\n" << r.err);
  if (expect_status >= 0) REQUIRE(r.status == expect_status);
  REQUIRE((r.status == 0 || r.status == 3));
  return json::parse(r.out);
}

uint64_t u64(const json& j) { return j.get<uint64_t>(); }

std::string capacity(uint64_t bytes) { return " --set device.capacity=" + std::to_string(bytes); }

// The needed bytes of kLlama (its peak reserved on a 1 TiB device, CUDA context 0).
uint64_t llama_needed(const TempDir& dir) {
  const json big = run_json(kLlama + " --set device.cuda_context=0 --set device.capacity=1TiB", dir, 0);
  return u64(big["peak_reserved_bytes"]);
}

}  // namespace

TEST_CASE("an OOM's needed_bytes is the peak reserved of a 1 TiB run, and that much fits", "[advise]") {
  TempDir dir;
  for (const std::string& variant : {std::string(), std::string(" --set allocator.expandable_segments=true")}) {
    INFO("variant:" << variant);
    const std::string base = shipped("llama2-7b-full-finetune-a100-master.yaml") + variant;  // OOM on an A100
    const json oom = run_json(base, dir, 3);
    const json big = run_json(base + " --set device.capacity=1TiB", dir, 0);
    REQUIRE(oom["oom"].is_object());
    const uint64_t needed = u64(oom["oom"]["needed_bytes"]);
    CHECK(needed == u64(big["peak_reserved_bytes"]));
    const uint64_t usable = u64(oom["device"]["usable_bytes"]);
    CHECK(u64(oom["oom"]["usable_bytes"]) == usable);
    CHECK(needed > usable);
    CHECK(u64(oom["oom"]["over_bytes"]) == needed - usable);
    const uint64_t cap = u64(oom["oom"]["needed_capacity_bytes"]);
    CHECK(cap == needed + u64(oom["device"]["cuda_context_bytes"]));
    // needed + context as the device total: the run fits, with no room to spare.
    const json fits = run_json(base + capacity(cap), dir, 0);
    CHECK(fits["fits"] == true);
    CHECK(u64(fits["peak_reserved_bytes"]) == needed);
    CHECK(oom["warnings"].empty());
  }
  // With allocator.memory_fraction the limit is fraction x total (PyTorch's
  // allowed_memory_maximum), and no single device total is named.
  const json frac = run_json(shipped("llama2-7b-full-finetune-a100.yaml") + " --set allocator.memory_fraction=0.05", dir, 3);
  const uint64_t total = u64(frac["device"]["capacity_bytes"]);
  CHECK(u64(frac["oom"]["usable_bytes"]) == static_cast<uint64_t>(0.05 * static_cast<double>(total)));
  CHECK(frac["oom"]["needed_capacity_bytes"].is_null());
  CHECK(u64(frac["oom"]["over_bytes"]) == u64(frac["oom"]["needed_bytes"]) - u64(frac["oom"]["usable_bytes"]));
  // The text: "needs X reserved, Y over the Z usable", and a TIME line that says which run.
  const Result text = run_cli("run " + shipped("llama2-7b-full-finetune-a100-master.yaml"), dir);
  CHECK(text.status == 3);
  CHECK(text.out.find(" reserved, ") != std::string::npos);
  CHECK(text.out.find(" over the ") != std::string::npos);
  CHECK(text.out.find("TIME  with unlimited memory: ") != std::string::npos);
  CHECK(text.out.find("ADVICE") != std::string::npos);  // the short list, without --advise
  CHECK(text.out.find("memsim run --advise lists every change") != std::string::npos);
}

TEST_CASE("run --advise: each entry is a separate run with the same --set", "[advise]") {
  TempDir dir;
  const uint64_t needed = llama_needed(dir);
  // 90% of what it needs: out of memory, so some changes fit and some do not.
  const std::string base = kLlama + " --set device.cuda_context=0" + capacity(needed / 10 * 9);
  const json j = run_json(base + " --advise", dir, 3);
  REQUIRE(j["advice"].is_array());
  REQUIRE(j["advice_skipped"].is_array());
  std::vector<std::string> keys;
  bool any_fits = false, any_oom = false;
  for (const json& a : j["advice"]) {
    std::string sets;
    for (const auto& [key, value] : a["set"].items()) {
      sets += " --set " + key + "=" + value.get<std::string>();
      keys.push_back(key);
    }
    INFO(a["change"].get<std::string>() << ":" << sets);
    const json alone = run_json(base + sets, dir);
    CHECK(a["fits"] == alone["fits"]);
    CHECK(a["peak_reserved_bytes"] == alone["peak_reserved_bytes"]);
    CHECK(a["peak_allocated_bytes"] == alone["peak_allocated_bytes"]);
    CHECK(a["estimated_step_seconds"] == alone["estimated_step_seconds"]["total"]);
    if (a["fits"] == true) {
      any_fits = true;
      CHECK(a["needed_bytes"].is_null());
    } else {
      any_oom = true;
      CHECK(a["needed_bytes"] == alone["oom"]["needed_bytes"]);
    }
  }
  CHECK(any_fits);
  CHECK(any_oom);
  // Sorted by effect: fitting changes by peak reserved, then the others by needed bytes.
  for (size_t i = 1; i < j["advice"].size(); ++i) {
    const json& a = j["advice"][i - 1];
    const json& b = j["advice"][i];
    if (a["fits"] == b["fits"]) {
      const char* key = a["fits"] == true ? "peak_reserved_bytes" : "needed_bytes";
      CHECK(u64(a[key]) <= u64(b[key]));
    } else {
      CHECK(a["fits"] == true);
    }
  }
  // The changes the issue names, each one applicable to this hf-llama scenario.
  for (const char* key : {"optimizer.impl", "optimizer.type", "checkpoint.policy", "batch.micro_batch",
                          "batch.grad_accum", "loss.impl", "allocator.expandable_segments",
                          "parallel.data", "parallel.sharding"})
    CHECK(std::find(keys.begin(), keys.end(), key) != keys.end());
  // A skipped change is one memsim refuses when asked for it directly.
  for (const json& s : j["advice_skipped"]) {
    std::string sets;
    for (const auto& [key, value] : s["set"].items()) sets += " --set " + key + "=" + value.get<std::string>();
    const Result alone = run_cli("run " + base + sets, dir);
    INFO(sets << ": " << alone.err);
    CHECK(alone.status == 1);
    CHECK(alone.err.find(s["reason"].get<std::string>()) != std::string::npos);
  }
  // The text and the HTML page list every change.
  const fs::path html = dir.path / "advice.html";
  const Result text = run_cli("run " + base + " --advise --html " + q(html), dir);
  CHECK(text.status == 3);
  const std::string page = memsim_test::slurp(html);
  for (const json& a : j["advice"]) {
    CHECK(text.out.find(a["change"].get<std::string>()) != std::string::npos);
    CHECK(page.find("Advice: " + a["change"].get<std::string>()) != std::string::npos);
  }
  CHECK(page.find("Out of memory: needs ") != std::string::npos);
}

TEST_CASE("run --advise on a run that fits keeps exit 0 and its own numbers", "[advise]") {
  TempDir dir;
  const json plain = run_json(kLlama, dir, 0);
  const json advised = run_json(kLlama + " --advise", dir, 0);
  CHECK(advised["peak_reserved_bytes"] == plain["peak_reserved_bytes"]);
  CHECK(!advised["advice"].empty());
  CHECK(!plain.contains("advice"));  // a run that fits lists changes only when asked
  CHECK(plain["warnings"].empty());
  // A family without the hf-only changes: no chunked loss or sac-op offered to cs336.
  const json cs336 = run_json(shipped("cs336-small-train-ctx512.yaml") + " --advise", dir);
  for (const json& a : cs336["advice"]) {
    CHECK(!a["set"].contains("loss.impl"));
    CHECK(a["set"].value("checkpoint.policy", "") != "sac-op");
  }
}

TEST_CASE("FITS warns within 3% of the usable memory", "[advise]") {
  TempDir dir;
  const uint64_t needed = llama_needed(dir);
  const std::string base = kLlama + " --set device.cuda_context=0";
  // 98.5% of the usable bytes: fits without a flush, within 3%.
  const uint64_t near = static_cast<uint64_t>(static_cast<double>(needed) / 0.985);
  const json j = run_json(base + capacity(near), dir, 0);
  REQUIRE(j["warnings"].size() == 1);
  CHECK(j["warnings"][0]["kind"] == "near_capacity");
  CHECK(j["memory_stats"]["num_alloc_retries"] == 0);
  const Result text = run_cli("run " + base + capacity(near), dir);
  CHECK(text.status == 0);
  CHECK(text.out.find("FITS (warning: within 3% of capacity)") != std::string::npos);
  CHECK(text.out.find("warning: peak reserved") != std::string::npos);
  // 90% of it: no warning, a plain FITS.
  const uint64_t roomy = static_cast<uint64_t>(static_cast<double>(needed) / 0.9);
  const json ok = run_json(base + capacity(roomy), dir, 0);
  CHECK(ok["warnings"].empty());
  const Result plain = run_cli("run " + base + capacity(roomy), dir);
  CHECK(plain.out.find("FITS  peak allocated") != std::string::npos);
}

TEST_CASE("FITS warns when it fits only after a cache flush", "[advise]") {
  TempDir dir;
  const uint64_t needed = llama_needed(dir);
  const std::string base = kLlama + " --set device.cuda_context=0";
  // The smallest capacity (to 1 MiB) that fits: below `needed`, so only a flush lets it fit.
  const json big = run_json(base + " --set device.capacity=1TiB", dir, 0);
  uint64_t lo = u64(big["peak_allocated_bytes"]), hi = needed;
  while (hi - lo > (uint64_t{1} << 20)) {
    const uint64_t mid = lo + (hi - lo) / 2;
    (run_json(base + capacity(mid), dir)["fits"] == true ? hi : lo) = mid;
  }
  REQUIRE(hi < needed);
  const json j = run_json(base + capacity(hi), dir, 0);
  CHECK(j["memory_stats"]["num_alloc_retries"].get<int64_t>() > 0);
  bool flush = false;
  for (const json& w : j["warnings"]) flush = flush || w["kind"] == "cache_flush";
  CHECK(flush);
  const Result text = run_cli("run " + base + capacity(hi), dir);
  CHECK(text.status == 0);
  CHECK(text.out.find("FITS (warning: fits only after cache flushes") != std::string::npos);
  CHECK(text.out.find("num_alloc_retries") != std::string::npos);
}

TEST_CASE("run --html has the per-layer view at the peak and the zoom", "[advise][reports]") {
  TempDir dir;
  const fs::path html = dir.path / "r.html";
  const json j = run_json(kLlama + " --html " + q(html), dir, 0);
  const std::string page = memsim_test::slurp(html);
  // The per-layer data, as JSON: one entry per layer, and with the outside part they add
  // up to the bytes live at the peak.
  const std::string open = "<script type=\"application/json\" id=\"memsim-layers\">";
  const size_t at = page.find(open);
  REQUIRE(at != std::string::npos);
  const size_t end = page.find("</script>", at);
  REQUIRE(end != std::string::npos);
  const json layers = json::parse(page.substr(at + open.size(), end - at - open.size()));
  CHECK(layers["event"] == j["peak_event"]["index"]);
  REQUIRE(layers["layers"].size() == 2);
  uint64_t total = 0;
  for (const json& l : layers["layers"])
    for (const json& b : l["bytes"]) total += u64(b);
  for (const json& l : layers["layers"]) CHECK(u64(l["bytes"][0]) > 0);  // each layer's weights
  for (const json& b : layers["outside"]) total += u64(b);
  CHECK(total == u64(j["live_at_peak"]["bytes"]));
  CHECK(page.find("Bytes per layer at the peak") != std::string::npos);
  CHECK(page.find("Advice:") == std::string::npos);  // a run that fits, without --advise
  // The zoom: the script, its controls and the SVG it drives.
  for (const char* id : {"id=\"memsim-timeline\"", "id=\"memsim-zoom\"", "id=\"memsim-zoom-reset\"",
                         "id=\"memsim-brush\"", "id=\"memsim-xcaption\""})
    CHECK(page.find(id) != std::string::npos);
  CHECK(page.find("http") == std::string::npos);  // nothing external
  // Well-formed enough to count: every element opened is closed.
  for (const char* tag : {"svg", "script", "table", "details", "g", "p", "h2"}) {
    size_t opened = 0, closed = 0;
    const std::string o = std::string("<") + tag, c = std::string("</") + tag + ">";
    for (size_t p = page.find(o); p != std::string::npos; p = page.find(o, p + 1)) {
      const char next = page[p + o.size()];
      if (next == ' ' || next == '>') ++opened;
    }
    for (size_t p = page.find(c); p != std::string::npos; p = page.find(c, p + 1)) ++closed;
    INFO(tag);
    CHECK(opened == closed);
  }
}

TEST_CASE("the HTML zoom runs in headless Chromium", "[advise][chromium]") {
  if (std::system("command -v chromium >/dev/null 2>&1") != 0) {
    MEMSIM_SKIP("chromium is not installed (apt-get install chromium to run this check)");
    return;
  }
  TempDir dir;
  const fs::path html = dir.path / "r.html";
  REQUIRE(run_cli("run " + kLlama + " --html " + q(html), dir).status == 0);
  // "#zoom=A,B" starts the page zoomed (tools/cli/html_zoom.h): the script ran if the
  // dumped DOM carries its transform and the caption it rewrote.
  const memsim_test::CommandResult dom = memsim_test::run_shell(
      "chromium --headless --no-sandbox --disable-gpu --dump-dom 'file://" + html.string() +
      "#zoom=0.25,0.5' 2>/dev/null");
  REQUIRE(dom.status == 0);
  CHECK(dom.out.find("data-zoom=\"0.2500,0.5000\"") != std::string::npos);
  CHECK(dom.out.find("scale(4,1)") != std::string::npos);
  CHECK(dom.out.find("(double-click or reset zoom to see the whole run)") != std::string::npos);
}
