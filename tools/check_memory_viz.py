#!/usr/bin/env python3
"""What PyTorch's memory_viz shows for a snapshot pickle, read in headless Chromium.

    check_memory_viz.py MEMORYVIZ_JS D3_JS PICKLE [--expect-frames]

Issue #19 asks that pytorch.org/memory_viz show where each block of a `memsim run --snapshot`
came from. This loads PICKLE through MemoryViz.js's own loader, `add_local_files([{name,
base64}], view)` (what torch/cuda/_memory_viz.py's trace_plot page calls; pytorch.org/
memory_viz's drag-and-drop ends in the same finished_loading -> unpickle -> annotate_snapshot),
in two of its views, and prints what a user sees when pointing at a block:
  - "Active Memory Timeline": the category legend and, for the largest drawn allocations,
    the context text (address, size, the frames as `filename:line:name`) and the category
    each polygon is coloured as;
  - "Allocator State History": for the blocks live at the trace's last event, the block text
    (the frames) shown under the segment map.
The user supplies MemoryViz.js (pytorch/pytorch torch/utils/viz/MemoryViz.js) and a d3 v5
bundle (its imports are https://cdn.skypack.dev/d3@5 and the d3-axis/-scale/-zoom/-brush
modules that d3 v5 bundles; `npm pack d3@5` gives dist/d3.min.js): nothing is fetched here.
The copy loaded takes its five imports from the d3 global of that bundle; nothing else in
MemoryViz.js is changed.

With --expect-frames it fails (exit 1) when a page error is thrown, a view draws nothing, no
category legend is shown, or any drawn block shows "<block was allocated before
_record_history was enabled>". Without it, it only reports (for a real snapshot as a control).
Chromium is driven as tests/web/test_web_page.py drives it (the DevTools pipe); exit 77 when
chromium is not installed.
"""
import base64
import json
import os
import re
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "web"))
from test_web_page import Chromium  # noqa: E402  (the project's DevTools pipe driver)

NO_FRAMES = "<block was allocated before _record_history was enabled>"
IMPORT = re.compile(r'^import (.+) from "https://cdn\.skypack\.dev/d3[^"]*";$', re.M)


def local_copy(js):
    """MemoryViz.js with its d3 imports taken from the d3 global (a UMD bundle loaded first)."""
    def repl(m):
        what = m.group(1).strip()
        if what.startswith("* as "):
            return "const %s = window.d3;" % what[5:].strip()
        if what.startswith("{") and what.endswith("}"):
            return "const %s = window.d3;" % what
        raise SystemExit("check_memory_viz: unexpected import in MemoryViz.js: " + m.group(0))
    out, n = IMPORT.subn(repl, js)
    if n == 0 or re.search(r"^import ", out, re.M):
        raise SystemExit("check_memory_viz: MemoryViz.js imports are not the d3 ones this check knows")
    return out


PAGE = """<!DOCTYPE html><html><head><meta charset="utf-8"></head><body>
<script>window.__errors = [];
window.addEventListener('error', e => window.__errors.push(String(e.message)));
window.addEventListener('unhandledrejection', e => window.__errors.push(String(e.reason)));</script>
<script src="d3.js"></script>
<script src="snapshot.js"></script>
<script type="module">
MODULE
</script>
</body></html>
"""

# The Active Memory Timeline: legend, and each drawn allocation's text as the page shows it
# on mouseover (ContextViewer), largest first.
READ_TIMELINE = r"""(() => {
  const legend = [...document.querySelectorAll('text[font-family=helvetica]')].map(t => t.textContent);
  const polys = [...document.querySelectorAll('polygon')].filter(p => p.__data__ && p.__data__.elem !== 'summarized');
  polys.sort((a, b) => b.__data__.size - a.__data__.size);
  const pres = () => [...document.querySelectorAll('pre')];
  const shown = [];
  let no_frames = 0;
  for (const [i, p] of polys.entries()) {
    p.dispatchEvent(new MouseEvent('mouseover', {bubbles: true}));
    const text = pres().map(x => x.textContent).join('\n');
    if (text.includes('allocated before _record_history')) no_frames++;
    if (i < N_SHOWN) shown.push({text, fill: p.getAttribute('fill'),
                                 category: legend[p.__data__.color] ?? null});
  }
  return {legend, polygons: polys.length, no_frames, shown};
})()"""

# The Allocator State History at its last event: each block's text on mouseover.
READ_STATE = r"""(() => {
  const rects = [...document.querySelectorAll('rect')].filter(r => r.__data__ && 'requested_size' in r.__data__ && 'segment' in r.__data__);
  const blocks = rects.filter(r => r.getAttribute('fill') !== 'red' || r.__data__.free_requested);
  blocks.sort((a, b) => b.__data__.requested_size - a.__data__.requested_size);
  const trace = document.querySelector('pre[style*="grid-column: 1 / 3"]');
  const shown = [];
  let no_frames = 0;
  for (const [i, r] of blocks.entries()) {
    r.dispatchEvent(new MouseEvent('mouseover', {bubbles: true}));
    const text = trace.textContent;
    if (text.includes('allocated before _record_history')) no_frames++;
    if (i < N_SHOWN) shown.push({text});
  }
  const events = document.querySelectorAll('div[style*="font-family: monospace"] > pre').length;
  return {events, blocks: blocks.length, no_frames, shown};
})()"""


def view(exe, tmp, name, read, n_shown):
    with open(os.path.join(tmp, "view.js"), "w") as f:
        f.write("window.__view = %s;\n" % json.dumps(name))
    browser = Chromium(exe, "file://" + os.path.join(tmp, "page.html"), os.path.join(tmp, "profile-" + name[:6]))
    try:
        browser.wait("window.__errors && (window.__errors.length > 0 || window.__loaded === true)", timeout=120)
        errors = browser.js("window.__errors")
        if errors:
            return {"errors": errors}
        # The segment view draws on the next animation frame; the timeline at once.
        browser.wait("document.querySelectorAll('%s').length > 0 || window.__errors.length > 0" %
                     ("polygon" if "Timeline" in name else "rect"), timeout=120)
        result = browser.js(read.replace("N_SHOWN", str(n_shown)))
        result["errors"] = browser.js("window.__errors")
        return result
    finally:
        browser.close()


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    expect = "--expect-frames" in sys.argv
    if len(args) != 3:
        print(__doc__)
        return 2
    memviz, d3, pickle_path = args
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if not exe:
        print("SKIPPED: chromium is not installed")
        return 77
    with open(memviz, encoding="utf-8") as f:
        js = local_copy(f.read())
    with tempfile.TemporaryDirectory(prefix="memsim-memviz-") as tmp:
        shutil.copy(d3, os.path.join(tmp, "d3.js"))
        with open(pickle_path, "rb") as f:
            b64 = base64.b64encode(f.read()).decode()
        with open(os.path.join(tmp, "snapshot.js"), "w") as f:
            f.write("window.__snapshot = %s;\n" % json.dumps(b64))
        # The module, inline (Chromium loads no module script from file://): MemoryViz.js
        # (imports from the d3 global), then its own loader.
        if "</script" in js:
            raise SystemExit("check_memory_viz: MemoryViz.js cannot be inlined")
        module = js + ("\nadd_local_files([{name: %s, base64: window.__snapshot}], window.__view);\n"
                       "window.__loaded = true;\n" % json.dumps(os.path.basename(pickle_path)))
        page = PAGE.replace('<script src="snapshot.js"></script>',
                            '<script src="snapshot.js"></script>\n<script src="view.js"></script>')
        page = page.replace("MODULE", module)
        with open(os.path.join(tmp, "page.html"), "w") as f:
            f.write(page)
        failures = []
        timeline = view(exe, tmp, "Active Memory Timeline", READ_TIMELINE, 3)
        print("== Active Memory Timeline")
        if timeline.get("errors"):
            print("page errors: %s" % timeline["errors"])
            failures.append("timeline: page error")
        if "polygons" in timeline:
            print("category legend: %s" % timeline["legend"])
            print("drawn allocations: %d; showing %r: %d" % (timeline["polygons"], NO_FRAMES, timeline["no_frames"]))
            for s in timeline["shown"]:
                print("-- category %s (fill %s)\n%s" % (s["category"], s["fill"], s["text"]))
            if timeline["polygons"] == 0:
                failures.append("timeline: nothing drawn")
            if not timeline["legend"]:
                failures.append("timeline: no category legend")
            if timeline["no_frames"]:
                failures.append("timeline: %d allocations without frames" % timeline["no_frames"])
        state = view(exe, tmp, "Allocator State History", READ_STATE, 3)
        print("== Allocator State History (last event)")
        if state.get("errors"):
            print("page errors: %s" % state["errors"])
            failures.append("state: page error")
        if "blocks" in state:
            print("events listed: %d; blocks drawn: %d; showing %r: %d" %
                  (state["events"], state["blocks"], NO_FRAMES, state["no_frames"]))
            for s in state["shown"]:
                print("--\n" + s["text"])
            if state["blocks"] == 0:
                failures.append("state: no block drawn")
            if state["no_frames"]:
                failures.append("state: %d blocks without frames" % state["no_frames"])
    if expect and failures:
        print("FAIL: " + "; ".join(failures))
        return 1
    print("ok" if not failures else "reported (no --expect-frames): " + "; ".join(failures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
