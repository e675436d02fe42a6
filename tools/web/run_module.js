// The web page's module (build/web/wasm/memsim_web.js) in node, as `memsim run` (docs/web.md,
// "Same numbers as the native build"): for comparing the WebAssembly build with the native
// binary run by run.
//
//   node tools/web/run_module.js MODULE.js SCENARIO.yaml [--set KEY=VALUE]... --json OUT.json --timeline OUT.csv
//
// The scenario's folder is copied into the module's in-memory disk (its .yaml and .json files,
// sub-folders included) so that relative paths in it (model.hf_config) resolve as they do for
// the CLI. Writes the module's --json report and --timeline CSV, prints its stdout and stderr,
// and exits with its status. `cmp` against `memsim run` of the same arguments: only the JSON's
// "scenario" (a file without a name is named after it) and "scenario_file" (the module runs
// scenario.yaml) may differ.
"use strict";
const fs = require("fs"), path = require("path"), vm = require("vm");

const argv = process.argv.slice(2);
if (argv.length < 2) {
  console.error("usage: node run_module.js MODULE.js SCENARIO.yaml [--set KEY=VALUE]... --json OUT --timeline OUT");
  process.exit(2);
}
const [modulePath, scenario] = argv;
const sets = [];
let jsonOut = null, timelineOut = null;
for (let i = 2; i < argv.length; i += 2) {
  if (argv[i] === "--set") sets.push(argv[i + 1]);
  else if (argv[i] === "--json") jsonOut = argv[i + 1];
  else if (argv[i] === "--timeline") timelineOut = argv[i + 1];
  else { console.error("run_module.js: unknown argument " + argv[i]); process.exit(2); }
}

globalThis.require = require;
globalThis.__dirname = path.dirname(path.resolve(modulePath));
globalThis.Module = {
  print: (t) => process.stdout.write(t + "\n"),
  printErr: (t) => process.stderr.write(t + "\n"),
  onRuntimeInitialized() {
    const FS = Module.FS;
    Module.ccall("memsim_web_presets", "string", [], []);  // makes the module's folders
    const copy = (src, dst) => {
      try { FS.mkdir(dst); } catch (e) { /* exists */ }
      for (const f of fs.readdirSync(src)) {
        const s = path.join(src, f);
        if (fs.statSync(s).isDirectory()) copy(s, dst + "/" + f);
        else if (/\.(json|yaml|yml)$/.test(f)) FS.writeFile(dst + "/" + f, fs.readFileSync(s));
      }
    };
    copy(path.dirname(path.resolve(scenario)), "/memsim");
    const request = { scenario: fs.readFileSync(scenario, "utf8"), config: null, sets: sets };
    const answer = JSON.parse(Module.ccall("memsim_web_run", "string", ["string"], [JSON.stringify(request)]));
    const take = (from, to) => {
      if (to === null) return;
      try { fs.writeFileSync(to, FS.readFile(from, { encoding: "utf8" })); } catch (e) { /* not written */ }
    };
    take("/memsim-out/report.json", jsonOut);
    take("/memsim-out/timeline.csv", timelineOut);
    process.exitCode = answer.status;
  },
};
vm.runInThisContext(fs.readFileSync(modulePath, "utf8"), { filename: modulePath });
