"""`pip install .`: builds memsim's Python module with the project's own CMake (the same
build as the command line, with Debian's pybind11-dev and python3-dev; tools/install-deps.sh)
and installs the `memsim` package (tools/python/memsim/). docs/python.md is the guide.

Offline by design: there is no pyproject.toml, so pip fetches no build requirements and
builds with the setuptools already installed (Debian's python3-setuptools). Debian's
system Python is "externally managed" (PEP 668): install into a virtual environment
(`python3 -m venv --system-site-packages ENV; ENV/bin/pip install --no-index .`), or
use the CMake route (PYTHONPATH=build/python after tools/build.sh).

The CMake build goes to build-python/ in the source tree (compiled objects are reused by
the next install, and by ccache when it is installed). MEMSIM_CMAKE_ARGS adds arguments.
"""

import glob
import os
import shlex
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

SOURCE = os.path.dirname(os.path.abspath(__file__))


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build = os.path.join(SOURCE, "build-python")
        configure = ["cmake", "-S", SOURCE, "-B", build, "-DCMAKE_BUILD_TYPE=Release",
                     "-DMEMSIM_PYTHON=ON", "-DMEMSIM_BUILD_TESTS=OFF",
                     "-DPython_EXECUTABLE=" + sys.executable]
        if shutil.which("ninja"):
            configure += ["-G", "Ninja"]
        if shutil.which("ccache"):
            configure += ["-DCMAKE_CXX_COMPILER_LAUNCHER=ccache"]
        configure += shlex.split(os.environ.get("MEMSIM_CMAKE_ARGS", ""))
        subprocess.check_call(configure)
        subprocess.check_call(["cmake", "--build", build, "--target", "_memsim", "-j",
                               str(os.cpu_count() or 1)])
        built = glob.glob(os.path.join(build, "python", "memsim", "_memsim*.so"))
        if not built:
            raise RuntimeError("the CMake build made no _memsim module in " + build)
        target = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copyfile(built[0], target)


def version():
    with open(os.path.join(SOURCE, "CMakeLists.txt")) as f:
        for line in f:
            if line.startswith("project(memsim VERSION "):
                return line.split()[2]
    return "0"


setup(
    name="memsim",
    version=version(),
    description="Predicts the GPU memory of transformer training without a GPU",
    packages=["memsim"],
    package_dir={"memsim": "tools/python/memsim"},
    ext_modules=[CMakeExtension("memsim._memsim")],
    cmdclass={"build_ext": CMakeBuild},
    python_requires=">=3.7",
    zip_safe=False,
)
