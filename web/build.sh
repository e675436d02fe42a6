#!/usr/bin/env bash
# Builds memsim's web page (docs/web.md): the simulator compiled to WebAssembly with Debian's
# emscripten, inlined with web/index.html and web/app.js into one self-contained file,
# OUT/memsim.html (default OUT: build/web), which works opened from disk (file://) or from
# any static host: the wasm is embedded (emcc -sSINGLE_FILE=1), nothing is fetched.
#
#   web/build.sh [OUT]
#
# Needs emscripten (tools/install-deps.sh emscripten). yaml-cpp has no wasm build in Debian:
# its Debian source (the version libyaml-cpp-dev is built from) is downloaded into OUT once,
# with a private apt configuration (the machine's apt sources are not touched). Set
# YAML_CPP_ORIG=path/to/yaml-cpp_*.orig.tar.xz to use a tarball already on disk.
# Incremental: a second run rebuilds only what changed.
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
out="$(mkdir -p "${1:-$src/build/web}" && cd "${1:-$src/build/web}" && pwd)"

if ! command -v emcmake >/dev/null || ! command -v em++ >/dev/null; then
  echo "web/build.sh: emscripten is not installed (tools/install-deps.sh emscripten)" >&2
  exit 1
fi
# Debian's emscripten runs its JavaScript tools with `node` and finds acorn in Debian's
# /usr/share/nodejs; a node from elsewhere (nodesource) does not look there by itself.
export NODE_PATH="/usr/share/nodejs${NODE_PATH:+:$NODE_PATH}"

# --- yaml-cpp's Debian source ---------------------------------------------------------
yaml_src="$out/yaml-cpp-src"
if [ ! -f "$yaml_src/CMakeLists.txt" ]; then
  orig="${YAML_CPP_ORIG:-}"
  if [ -z "$orig" ]; then
    apt_dir="$out/apt"
    mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$apt_dir/download"
    echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm main" \
      >"$apt_dir/sources.list"
    apt_opts=(-o "Dir::Etc::SourceList=$apt_dir/sources.list" -o "Dir::Etc::SourceParts=$apt_dir/none"
              -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache"
              -o "Debug::NoLocking=1" -o "APT::Sandbox::User=$(id -un)")
    echo "web/build.sh: fetching yaml-cpp's Debian source" >&2
    apt-get "${apt_opts[@]}" -qq update
    # The version libyaml-cpp-dev (the native build's) was built from, when the archive
    # still has it; else the suite's current one.
    want="yaml-cpp"
    native="$(dpkg-query -W -f='${source:Version}' libyaml-cpp-dev 2>/dev/null || true)"
    [ -n "$native" ] && want="yaml-cpp=$native"
    (cd "$apt_dir/download" && { apt-get "${apt_opts[@]}" -qq source --download-only "$want" ||
                                 apt-get "${apt_opts[@]}" -qq source --download-only yaml-cpp; })
    rm -rf "$apt_dir/lists"  # 20 MB of package lists, needed only for the download
    orig="$(ls "$apt_dir"/download/yaml-cpp_*.orig.tar.* | head -n1)"
  fi
  rm -rf "$yaml_src" "$out/yaml-cpp-unpack"
  mkdir -p "$out/yaml-cpp-unpack"
  tar -xf "$orig" -C "$out/yaml-cpp-unpack"
  mv "$out/yaml-cpp-unpack"/* "$yaml_src"
  rmdir "$out/yaml-cpp-unpack"
fi

# --- Debian's header-only libraries, without the rest of /usr/include ----------------
# (the host's libc headers must not shadow emscripten's)
inc="$out/include"
mkdir -p "$inc"
for dir in /usr/include/eigen3/Eigen /usr/include/spdlog /usr/include/fmt /usr/include/nlohmann \
           /usr/include/CLI; do
  [ -d "$dir" ] || { echo "web/build.sh: $dir is missing (tools/install-deps.sh)" >&2; exit 1; }
  ln -sfn "$dir" "$inc/$(basename "$dir")"
done

# --- the module -------------------------------------------------------------------------
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
if [ ! -f "$out/wasm/CMakeCache.txt" ]; then
  emcmake cmake -S "$src/web" -B "$out/wasm" "${generator[@]}" "${launcher[@]}" \
    -DCMAKE_BUILD_TYPE=Release -DMEMSIM_SOURCE_DIR="$src" -DYAML_CPP_SOURCE_DIR="$yaml_src" \
    -DMEMSIM_SYSTEM_HEADERS="$inc" >/dev/null
fi
cmake --build "$out/wasm" -j"$(nproc)" --target memsim_web

# --- the page: index.html with its scripts inlined ------------------------------------
page="$out/memsim.html"
python3 - "$src/web/index.html" "$src/web/app.js" "$out/wasm/memsim_web.js" "$page.tmp" <<'EOF'
import sys
html, app, module, out = sys.argv[1:]
text = open(html, encoding="utf-8").read()
for name, path in (("app.js", app), ("memsim_web.js", module)):
    tag = '<script src="%s"></script>' % name
    body = open(path, encoding="utf-8").read()
    if tag not in text:
        sys.exit("web/build.sh: %s has no %s" % (html, tag))
    if "</script" in body.lower():
        sys.exit("web/build.sh: %s contains </script and cannot be inlined" % path)
    text = text.replace(tag, "<script>\n" + body + "\n</script>")
open(out, "w", encoding="utf-8").write(text)
EOF
mv "$page.tmp" "$page"
echo "web/build.sh: $page"
