// memsim in the browser: the page's logic (docs/web.md). Loaded before memsim_web.js, whose
// emscripten runtime reads the `Module` defined here.
//
// Every change of a control re-runs `memsim run scenario.yaml [--model config.json]
// [--set KEY=VALUE]...` inside the WebAssembly module (tools/web/memsim_web.cpp calls the command
// line's own run_run) and shows: the verdict line of the CLI's report, the breakdown at the
// peak (the --json report's breakdown_at_peak), the allocated / reserved timeline (an SVG of
// the --timeline CSV's envelope), the CLI's whole text report, and on bad input the CLI's
// error text. window.memsimPage holds the last request and answer (the browser test reads it
// beside the DOM).
"use strict";

var memsimPage = { ready: false, runs: 0, last: null };

var Module = {
  noInitialRun: true,
  captured: null,  // {out: [], err: []} while a run is in progress
  print: function (text) {
    if (Module.captured) Module.captured.out.push(text);
  },
  printErr: function (text) {
    if (Module.captured) Module.captured.err.push(text);
    else if (typeof console !== "undefined") console.warn(text);
  },
  onRuntimeInitialized: function () { memsimInit(); },
};

// allocator/units.cpp's human_bytes: "19.98 GiB", "0 B".
function humanBytes(bytes) {
  var units = [["TiB", Math.pow(1024, 4)], ["GiB", Math.pow(1024, 3)], ["MiB", 1024 * 1024], ["KiB", 1024]];
  for (var i = 0; i < units.length; i++) {
    if (bytes >= units[i][1]) return (bytes / units[i][1]).toFixed(2) + " " + units[i][0];
  }
  return String(bytes) + " B";
}

function byId(id) { return document.getElementById(id); }

function option(select, value, text) {
  var o = document.createElement("option");
  o.value = value;
  o.textContent = text === undefined ? value : text;
  select.appendChild(o);
  return o;
}

function memsimInit() {
  var presets = JSON.parse(Module.ccall("memsim_web_presets", "string", [], []));
  byId("version").textContent = presets.version + " (WebAssembly)";
  var model = byId("model");
  presets.models.forEach(function (p) { option(model, p.name).title = p.summary; });
  model.value = "gpt2-small";
  var device = byId("device");
  option(device, "", "(default: unlimited)");
  presets.devices.forEach(function (p) { option(device, p.name).title = p.summary; });
  device.value = "a100-80gb";
  var form = byId("controls");
  var timer = null;
  // Typing in a number or a text box waits for a pause; a select recomputes at once.
  form.addEventListener("input", function (e) {
    if (e.target.tagName === "SELECT") return;
    clearTimeout(timer);
    timer = setTimeout(recompute, 250);
  });
  form.addEventListener("change", function () { clearTimeout(timer); recompute(); });
  memsimPage.ready = true;
  recompute();
}

// The command line's arguments for the controls' values.
function currentRequest() {
  var config = byId("config").value;
  var sets = [];
  if (config.trim() === "") {
    config = null;
    sets.push("model.preset=" + byId("model").value);
  }
  var keyed = document.querySelectorAll("#controls [data-key]");
  for (var i = 0; i < keyed.length; i++) {
    var value = keyed[i].value.trim();
    if (value !== "") sets.push(keyed[i].getAttribute("data-key") + "=" + value);
  }
  byId("sets").value.split("\n").forEach(function (line) {
    if (line.trim() !== "") sets.push(line.trim());
  });
  return { scenario: byId("scenario").value, config: config, sets: sets };
}

function shellQuote(s) {
  return /^[A-Za-z0-9_.,:=\/+-]+$/.test(s) ? s : "'" + s.replace(/'/g, "'\\''") + "'";
}

function commandLine(req) {
  var args = ["memsim", "run", "scenario.yaml"];
  if (req.config !== null) args.push("--model", "config.json");
  req.sets.forEach(function (s) { args.push("--set", shellQuote(s)); });
  return args.join(" ");
}

function recompute() {
  var req = currentRequest();
  var verdict = byId("verdict");
  verdict.classList.add("busy");
  // Let the browser paint the busy state before the (synchronous) simulation.
  setTimeout(function () { runAndShow(req); }, 0);
}

function runAndShow(req) {
  Module.captured = { out: [], err: [] };
  var answer;
  var started = performance.now();
  try {
    answer = JSON.parse(Module.ccall("memsim_web_run", "string", ["string"], [JSON.stringify(req)]));
  } catch (e) {
    answer = { status: 1, report: null, timeline: null };
    Module.captured.err.push("memsim: error: " + e);
  }
  var stdout = Module.captured.out.join("\n") + (Module.captured.out.length ? "\n" : "");
  var stderr = Module.captured.err.join("\n") + (Module.captured.err.length ? "\n" : "");
  Module.captured = null;
  memsimPage.runs += 1;
  memsimPage.last = { request: req, command: commandLine(req), status: answer.status,
                      report: answer.report, stdout: stdout, stderr: stderr,
                      ms: performance.now() - started };
  show(answer, stdout, stderr, req);
}

function show(answer, stdout, stderr, req) {
  var verdict = byId("verdict");
  verdict.classList.remove("busy", "fits", "oom", "error");
  byId("command").textContent = commandLine(req);
  var error = byId("error"), warnings = byId("warnings");
  var ok = answer.status === 0 || answer.status === 3;
  // The CLI's stderr: an error (status 1, 2), else warnings.
  error.hidden = ok || stderr === "";
  error.textContent = ok ? "" : stderr;
  warnings.hidden = !ok || stderr === "";
  warnings.textContent = ok ? stderr : "";
  byId("summary").textContent = ok ? stdout : "";
  if (!ok) {
    verdict.className = "error";
    verdict.textContent = "bad input (exit status " + answer.status + "): nothing simulated";
    byId("breakdown").textContent = "";
    byId("timeline").textContent = "";
    verdict.setAttribute("data-status", String(answer.status));
    return;
  }
  // The verdict line of the CLI's report ("FITS  peak allocated ...", "OUT OF MEMORY ...").
  var line = stdout.split("\n").filter(function (l) { return /^(FITS|OUT OF MEMORY)/.test(l); })[0];
  var r = answer.report;
  verdict.className = r.fits ? "fits" : "oom";
  verdict.textContent = line || (r.fits ? "FITS" : "OUT OF MEMORY");
  verdict.setAttribute("data-status", String(answer.status));
  verdict.setAttribute("data-peak-allocated", String(r.peak_allocated_bytes));
  verdict.setAttribute("data-peak-reserved", String(r.peak_reserved_bytes));
  showBreakdown(r);
  showTimeline(answer.timeline, r);
}

var kindColors = { parameters: "#4e79a7", gradients: "#f28e2b", optimizer_state: "#e15759",
                   activations: "#76b7b2", temporaries: "#59a14f", input: "#edc948",
                   loss: "#b07aa1", other: "#9c755f" };

function showBreakdown(r) {
  var table = byId("breakdown");
  table.textContent = "";
  var b = r.breakdown_at_peak || {};
  var total = 0;
  Object.keys(b).forEach(function (k) { total += b[k]; });
  var head = table.insertRow();
  ["kind", "bytes", "share"].forEach(function (t) {
    var th = document.createElement("th");
    th.textContent = t;
    head.appendChild(th);
  });
  function row(kind, bytes, cls) {
    var tr = table.insertRow();
    if (cls) tr.className = cls;
    tr.setAttribute("data-kind", kind);
    tr.setAttribute("data-bytes", String(bytes));
    var name = tr.insertCell();
    if (kindColors[kind]) {
      var sw = document.createElement("span");
      sw.className = "swatch";
      sw.style.background = kindColors[kind];
      name.appendChild(sw);
    }
    name.appendChild(document.createTextNode(kind));
    var cell = tr.insertCell();
    cell.textContent = humanBytes(bytes);
    cell.title = bytes.toLocaleString("en-US") + " bytes";
    tr.insertCell().textContent = (total ? (100 * bytes / total) : 0).toFixed(1) + "%";
  }
  Object.keys(b).forEach(function (k) { row(k, b[k], ""); });
  row("total", total, "total");
}

var svgNS = "http://www.w3.org/2000/svg";
function el(name, attrs, parent) {
  var e = document.createElementNS(svgNS, name);
  Object.keys(attrs).forEach(function (k) { e.setAttribute(k, attrs[k]); });
  if (parent) parent.appendChild(e);
  return e;
}

// The allocated band (least..most per bucket of events), the reserved line, the usable
// capacity, the phase marks and the peak.
function showTimeline(t, r) {
  var box = byId("timeline");
  box.textContent = "";
  if (!t || !t.points.length) return;
  var W = 1000, H = 260, L = 70, R = 10, T = 10, B = 24;
  var usable = r.device && r.device.usable_bytes;
  var top = 0;
  t.points.forEach(function (p) { top = Math.max(top, p[2], p[3]); });
  if (usable && usable < 1.6 * top) top = Math.max(top, usable);
  top = top * 1.05 || 1;
  var n = Math.max(t.events, 1);
  function x(i) { return L + (W - L - R) * i / n; }
  function y(v) { return T + (H - T - B) * (1 - v / top); }
  var svg = el("svg", { viewBox: "0 0 " + W + " " + H, preserveAspectRatio: "none", role: "img" }, box);
  for (var k = 0; k <= 4; k++) {
    var v = top * k / 4;
    el("line", { x1: L, x2: W - R, y1: y(v), y2: y(v), stroke: "#e3e6ea" }, svg);
    var label = el("text", { x: L - 6, y: y(v) + 4, "text-anchor": "end", "font-size": 11, fill: "#68707d" }, svg);
    label.textContent = humanBytes(v);
  }
  var pts = t.points;
  var last = [n, pts[pts.length - 1][1], pts[pts.length - 1][2], pts[pts.length - 1][3]];
  var upper = "", lower = "", reserved = "";
  pts.concat([last]).forEach(function (p, i) {
    upper += (i ? "L" : "M") + x(p[0]).toFixed(1) + "," + y(p[2]).toFixed(1);
    reserved += (i ? "L" : "M") + x(p[0]).toFixed(1) + "," + y(p[3]).toFixed(1);
  });
  for (var i = pts.length; i >= 0; i--) {
    var p = i === pts.length ? last : pts[i];
    lower += "L" + x(p[0]).toFixed(1) + "," + y(p[1]).toFixed(1);
  }
  el("path", { d: upper + lower + "Z", fill: "#4e79a7", "fill-opacity": 0.45, stroke: "#4e79a7",
               "stroke-width": 1, id: "timeline-allocated" }, svg);
  el("path", { d: reserved, fill: "none", stroke: "#e15759", "stroke-width": 1.5, id: "timeline-reserved" }, svg);
  if (usable && usable <= top) {
    el("line", { x1: L, x2: W - R, y1: y(usable), y2: y(usable), stroke: "#8a1414", "stroke-dasharray": "6 4" }, svg);
    var cap = el("text", { x: W - R - 4, y: y(usable) - 4, "text-anchor": "end", "font-size": 11, fill: "#8a1414" }, svg);
    cap.textContent = "usable " + humanBytes(usable);
  }
  var shown = t.marks.filter(function (m) { return !/^(layer|step_\d)/.test(m[1]); }).slice(0, 16);
  shown.forEach(function (m) {
    el("line", { x1: x(m[0]), x2: x(m[0]), y1: T, y2: H - B, stroke: "#b0b6bf", "stroke-dasharray": "2 3" }, svg);
    var tx = el("text", { x: x(m[0]) + 2, y: H - 8, "font-size": 10, fill: "#68707d" }, svg);
    tx.textContent = m[1];
  });
  if (r.peak_event) {
    el("circle", { cx: x(r.peak_event.index), cy: y(r.peak_event.allocated_bytes), r: 4, fill: "#1d2330" }, svg);
  }
  // Hover: the column under the pointer, in the CLI's units.
  var hover = el("line", { y1: T, y2: H - B, stroke: "#1d2330", "stroke-width": 0.5, visibility: "hidden" }, svg);
  var tip = document.createElement("div");
  tip.className = "hint";
  tip.id = "timeline-hover";
  tip.textContent = "\u00a0";
  svg.addEventListener("mousemove", function (ev) {
    var box2 = svg.getBoundingClientRect();
    var px = (ev.clientX - box2.left) * W / box2.width;
    var c = Math.min(pts.length - 1, Math.max(0, Math.floor((px - L) / (W - L - R) * pts.length)));
    var p = pts[c], end = c + 1 < pts.length ? pts[c + 1][0] - 1 : n - 1;
    hover.setAttribute("x1", x(p[0]));
    hover.setAttribute("x2", x(p[0]));
    hover.setAttribute("visibility", "visible");
    tip.textContent = "events " + p[0] + "-" + end + ": allocated " + humanBytes(p[1]) + " to " +
        humanBytes(p[2]) + ", reserved up to " + humanBytes(p[3]);
  });
  svg.addEventListener("mouseleave", function () { hover.setAttribute("visibility", "hidden"); });
  box.appendChild(tip);
  var legend = document.createElement("p");
  legend.className = "hint";
  legend.textContent = "events 0-" + (n - 1) + " (each of " + pts.length +
      " columns spans " + Math.ceil(n / pts.length) + " events): blue = allocated (least..most), red = reserved, " +
      "dot = peak allocated (event " + (r.peak_event ? r.peak_event.index : "-") + ")";
  box.appendChild(legend);
}
