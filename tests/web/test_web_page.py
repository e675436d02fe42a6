#!/usr/bin/env python3
"""The web page in headless Chromium against the command line (docs/web.md; ctest web_page).

    test_web_page.py PAGE.html MEMSIM

A real page load (file://, as a user opens build/web/memsim.html), then values changed as a
user changes them (an <input>'s value set and an 'input' event dispatched, a <select>'s and a
'change' event): after each, what the page shows is compared with `memsim run` of the same
arguments (the page prints its command line; the scenario.yaml / config.json it ran are
written to a temporary folder and the native binary is run there):
  - the verdict line shown equals the CLI's ("FITS  peak allocated ..." / "OUT OF MEMORY ..."),
  - the breakdown table's bytes equal the CLI's --json breakdown_at_peak, the verdict's
    peak allocated / reserved bytes equal its peak_allocated_bytes / peak_reserved_bytes,
  - the page's report (the --json document, memory_stats and the time model's floats
    included) equals the CLI's, the text report shown equals
    the CLI's stdout, and the exit status is the CLI's,
  - bad input (a --set value out of range, a broken config.json) shows the CLI's stderr text.

Chromium is driven through the DevTools protocol over --remote-debugging-pipe (fds 3 and 4,
NUL-terminated JSON), with nothing but the standard library. Prints "SKIPPED: why" and exits
77 (ctest's SKIP_RETURN_CODE) when the page was not built or chromium is not installed.
"""
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

SKIP = 77


def skip(why):
    print("SKIPPED: " + why)
    sys.exit(SKIP)


class Chromium:
    """Headless Chromium with one page, driven over the DevTools pipe."""

    def __init__(self, exe, url, profile):
        to_chrome_r, self.to_chrome = os.pipe()
        self.from_chrome, from_chrome_w = os.pipe()
        # Above 10 so that dup2 onto 3 and 4 never lands on one of them.
        hi_r = fcntl.fcntl(to_chrome_r, fcntl.F_DUPFD_CLOEXEC, 10)
        hi_w = fcntl.fcntl(from_chrome_w, fcntl.F_DUPFD_CLOEXEC, 10)

        def child_fds():
            os.dup2(hi_r, 3)  # inheritable copies: what Chromium reads / writes
            os.dup2(hi_w, 4)

        self.proc = subprocess.Popen(
            [exe, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-extensions", "--remote-debugging-pipe", "--user-data-dir=" + profile,
             "--window-size=1280,1000", url],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=child_fds, close_fds=False)
        for fd in (to_chrome_r, from_chrome_w, hi_r, hi_w):
            os.close(fd)
        self.buf = b""
        self.next_id = 0
        self.session = None
        deadline = time.time() + 30
        while self.session is None:
            targets = self.call("Target.getTargets")["targetInfos"]
            pages = [t for t in targets if t["type"] == "page"]
            if pages:
                self.session = self.call("Target.attachToTarget",
                                         {"targetId": pages[0]["targetId"], "flatten": True})["sessionId"]
            elif time.time() > deadline:
                raise RuntimeError("Chromium opened no page")
            else:
                time.sleep(0.2)

    def call(self, method, params=None, session=None):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.to_chrome, json.dumps(msg).encode() + b"\0")
        while True:
            while b"\0" not in self.buf:
                chunk = os.read(self.from_chrome, 1 << 20)
                if not chunk:
                    raise RuntimeError("Chromium closed the DevTools pipe")
                self.buf += chunk
            raw, self.buf = self.buf.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError("%s: %s" % (method, reply["error"]))
                return reply["result"]

    def js(self, expression):
        """The value of a page expression (JSON-serialisable), or raise on a page exception."""
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                "awaitPromise": True}, self.session)
        if "exceptionDetails" in result:
            raise RuntimeError("page: %s\n%s" % (expression, json.dumps(result["exceptionDetails"])[:2000]))
        return result["result"].get("value")

    def wait(self, expression, timeout=120):
        deadline = time.time() + timeout
        while not self.js(expression):
            if time.time() > deadline:
                raise RuntimeError("timed out waiting for " + expression)
            time.sleep(0.1)

    def close(self):
        try:
            self.call("Browser.close")
        except Exception:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


FAILURES = []


def check(ok, what):
    print(("ok    " if ok else "FAIL  ") + what)
    if not ok:
        FAILURES.append(what)


# What the page shows after its last run, read from the DOM (and the answer it keeps).
READ_PAGE = """(() => {
  const v = document.getElementById('verdict');
  const rows = [...document.querySelectorAll('#breakdown tr[data-kind]')];
  return {
    runs: memsimPage.runs,
    request: memsimPage.last.request,
    command: document.getElementById('command').textContent,
    status: memsimPage.last.status,
    report: memsimPage.last.report,
    verdict: v.textContent,
    verdict_class: v.className,
    peak_allocated: v.getAttribute('data-peak-allocated'),
    peak_reserved: v.getAttribute('data-peak-reserved'),
    breakdown: Object.fromEntries(rows.map(r => [r.dataset.kind, r.dataset.bytes])),
    summary: document.getElementById('summary').textContent,
    error: document.getElementById('error').hidden ? null : document.getElementById('error').textContent,
    timeline_paths: document.querySelectorAll('#timeline path').length,
    ms: memsimPage.last.ms,
  };
})()"""


def cli_run(memsim, page, workdir):
    """`memsim run` of the page's request in `workdir`: (status, stdout, stderr, json or None)."""
    req = page["request"]
    for name in ("scenario.yaml", "config.json", "report.json"):
        if os.path.exists(os.path.join(workdir, name)):
            os.remove(os.path.join(workdir, name))
    with open(os.path.join(workdir, "scenario.yaml"), "w", encoding="utf-8") as f:
        f.write(req["scenario"])
    args = [memsim, "run", "scenario.yaml"]
    if req["config"] is not None:
        with open(os.path.join(workdir, "config.json"), "w", encoding="utf-8") as f:
            f.write(req["config"])
        args += ["--model", "config.json"]
    for s in req["sets"]:
        args += ["--set", s]
    args += ["--json", "report.json"]
    p = subprocess.run(args, cwd=workdir, capture_output=True, text=True, env=dict(os.environ, NO_COLOR="1"))
    report = None
    if os.path.exists(os.path.join(workdir, "report.json")):
        with open(os.path.join(workdir, "report.json"), encoding="utf-8") as f:
            report = json.load(f)
    return p.returncode, p.stdout, p.stderr, report


def same_json(a, b, path=""):
    """The paths where two documents differ (none: equal, floats included, keys in order)."""
    if isinstance(a, dict) and isinstance(b, dict):
        if list(a) != list(b):
            return [path + " keys"]
        return [d for k in a for d in same_json(a[k], b[k], path + "." + k)]
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [path + " length"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in same_json(x, y, "%s[%d]" % (path, i))]
    return [] if a == b else [path]


def compare_with_cli(memsim, page, workdir, label):
    status, out, err, report = cli_run(memsim, page, workdir)
    print("--- %s: %s (page %.0f ms)" % (label, page["command"], page["ms"]))
    check(page["status"] == status, "%s: exit status %s, CLI %s" % (label, page["status"], status))
    if status in (0, 3):
        verdict = [l for l in out.split("\n") if l.startswith(("FITS", "OUT OF MEMORY"))]
        check(verdict and page["verdict"] == verdict[0],
              "%s: verdict shown %r, CLI %r" % (label, page["verdict"], verdict[:1]))
        check(page["peak_allocated"] == str(report["peak_allocated_bytes"]) and
              page["peak_reserved"] == str(report["peak_reserved_bytes"]),
              "%s: peaks shown %s / %s, CLI %s / %s" % (label, page["peak_allocated"], page["peak_reserved"],
                                                      report["peak_allocated_bytes"], report["peak_reserved_bytes"]))
        cli_breakdown = {k: str(v) for k, v in report["breakdown_at_peak"].items()}
        cli_breakdown["total"] = str(sum(report["breakdown_at_peak"].values()))
        check(page["breakdown"] == cli_breakdown,
              "%s: breakdown shown %s, CLI %s" % (label, page["breakdown"], cli_breakdown))
        diffs = same_json(page["report"], report)
        check(not diffs, "%s: the page's report equals the CLI's --json%s" % (label, (" (differs at %s)" % diffs[:5]) if diffs else ""))
        check(page["summary"] == out, "%s: the text report shown equals the CLI's stdout" % label)
        check(page["timeline_paths"] == 2, "%s: timeline drawn (allocated band, reserved line)" % label)
    else:
        check(page["error"] == err, "%s: error shown %r, CLI stderr %r" % (label, page["error"], err))
    return status


def set_control(browser, control_id, value, event):
    before = browser.js("memsimPage.runs")
    browser.js("""(() => { const e = document.getElementById(%s); e.value = %s;
                 e.dispatchEvent(new Event(%s, {bubbles: true})); })()"""
               % (json.dumps(control_id), json.dumps(value), json.dumps(event)))
    browser.wait("memsimPage.runs > %d && !document.getElementById('verdict').classList.contains('busy')" % before)
    return browser.js(READ_PAGE)


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: test_web_page.py PAGE.html MEMSIM")
    page_path, memsim = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    if not os.path.exists(page_path):
        skip("the web page was not built (%s; web/build.sh needs emscripten: "
             "tools/install-deps.sh emscripten, then web/build.sh)" % page_path)
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        skip("chromium is not installed (apt-get install chromium to run this check)")
    with tempfile.TemporaryDirectory(prefix="memsim-web-") as tmp:
        workdir = os.path.join(tmp, "cli")
        os.mkdir(workdir)
        browser = Chromium(exe, "file://" + page_path, os.path.join(tmp, "profile"))
        try:
            browser.wait("typeof memsimPage !== 'undefined' && memsimPage.ready && memsimPage.runs >= 1 && "
                         "!document.getElementById('verdict').classList.contains('busy')")
            page = browser.js(READ_PAGE)
            check(page["status"] == 0 and page["verdict_class"] == "fits", "the page loads and shows a verdict")
            compare_with_cli(memsim, page, workdir, "loaded")

            page = set_control(browser, "micro_batch", "16", "input")
            check("batch.micro_batch=16" in page["request"]["sets"], "micro-batch 16 reached the run")
            compare_with_cli(memsim, page, workdir, "micro-batch 16")

            page = set_control(browser, "checkpoint", "full", "change")
            compare_with_cli(memsim, page, workdir, "checkpoint full")

            page = set_control(browser, "device", "v100-16gb", "change")
            page = set_control(browser, "micro_batch", "64", "input")
            check(page["status"] == 3 and page["verdict"].startswith("OUT OF MEMORY"),
                  "micro-batch 64 on a V100 16GB is out of memory")
            compare_with_cli(memsim, page, workdir, "out of memory")

            page = set_control(browser, "seq_len", "0", "input")
            check(page["status"] == 1 and page["error"] and "batch.seq_len" in page["error"],
                  "seq_len 0 shows an error naming the key")
            compare_with_cli(memsim, page, workdir, "bad --set value")

            page = set_control(browser, "seq_len", "512", "input")
            config = '{"model_type": "llama", "hidden_size": 256,\n "num_attention_heads": "four"}\n'
            page = set_control(browser, "config", config, "input")
            check(page["status"] == 1 and page["error"] and "config.json" in page["error"],
                  "a broken config.json shows an error naming the file")
            compare_with_cli(memsim, page, workdir, "bad config.json")

            config = json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"],
                                 "hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 4,
                                 "num_attention_heads": 8, "num_key_value_heads": 4, "vocab_size": 32000,
                                 "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
                                 "tie_word_embeddings": False, "torch_dtype": "bfloat16"}, indent=1)
            page = set_control(browser, "config", config, "input")
            check(page["request"]["config"] is not None and
                  not any(x.startswith("model.preset=") for x in page["request"]["sets"]),
                  "a pasted config.json replaces the preset")
            compare_with_cli(memsim, page, workdir, "pasted config.json")
            page = set_control(browser, "micro_batch", "4", "input")
            check(page["status"] == 0, "the pasted model fits with micro-batch 4")
            compare_with_cli(memsim, page, workdir, "pasted config.json, micro-batch 4")
        finally:
            browser.close()
    if FAILURES:
        print("%d check(s) failed" % len(FAILURES))
        sys.exit(1)
    print("all checks passed")


if __name__ == "__main__":
    main()
