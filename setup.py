"""Build of fastattn._core: Cython over the C99 kernels in csrc/.

OpenMP is probed for the compiler in use (-fopenmp on gcc/clang, /openmp on
MSVC, -Xpreprocessor -fopenmp -lomp on Apple clang with libomp). When the probe
fails the core is built single-threaded with a warning; set
FASTATTN_REQUIRE_OPENMP=1 to make that an error (release builds), or
FASTATTN_DISABLE_OPENMP=1 to build without OpenMP on purpose.
No host-specific tuning flags and no fast-math flags: wheels must run on any
CPU of their architecture, and the masking rules rely on IEEE -inf and NaN. The flags used
keep IEEE results: -fno-math-errno (libm need not set errno) and
-fno-trapping-math (no floating-point traps are enabled, so the compiler may
turn the kernels' selects into vector blends).
"""
import os
import shlex
import sys
import tempfile
import textwrap
import warnings

from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

SOURCES = ["src/fastattn/_core.pyx", "csrc/rowwise.c", "csrc/attention.c", "csrc/config.c",
           "csrc/dispatch.c", "csrc/kernels_generic.c", "csrc/kernels_avx2.c", "csrc/merge.c",
           "csrc/peak.c"]

OPENMP_PROBE = textwrap.dedent(
    """
    #include <omp.h>
    int main(void) {
        int n = 0;
        #pragma omp parallel reduction(+:n)
        n += 1;
        return n > 0 ? 0 : 1;
    }
    """
)


def _flag(name):
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _openmp_flags(compiler):
    """(compile_args, link_args) that enable OpenMP for this compiler."""
    if compiler.compiler_type == "msvc":
        return ["/openmp"], []
    if sys.platform == "darwin":
        return ["-Xpreprocessor", "-fopenmp"], ["-lomp"]
    return ["-fopenmp"], ["-fopenmp"]


def _compiles_and_links(compiler, source, compile_args, link_args):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "probe.c")
        with open(path, "w") as f:
            f.write(source)
        try:
            objects = compiler.compile([path], output_dir=tmp, extra_postargs=compile_args)
            # LDFLAGS (e.g. -L of Homebrew's libomp on macOS) reach the
            # extension's link but not link_executable's: pass them here.
            compiler.link_executable(
                objects, "probe", output_dir=tmp,
                extra_preargs=(shlex.split(os.environ.get("LDFLAGS", ""))
                               if compiler.compiler_type != "msvc" else None),
                extra_postargs=link_args,
            )
        except Exception:  # any compiler or linker failure means "no"
            return False
    return True


class BuildExt(build_ext):
    def build_extensions(self):
        compiler = self.compiler
        if compiler.compiler_type == "msvc":
            base = ["/O2", "/fp:precise"]
        else:
            base = ["-O3", "-std=c99", "-fno-math-errno", "-fno-trapping-math", "-Wall", "-Wextra",
                    "-Wno-unused-function", "-Wno-unreachable-code"]
        omp_compile, omp_link = [], []
        if _flag("FASTATTN_DISABLE_OPENMP"):
            print("fastattn: OpenMP disabled by FASTATTN_DISABLE_OPENMP; single-threaded build")
        else:
            omp_compile, omp_link = _openmp_flags(compiler)
            if not _compiles_and_links(compiler, OPENMP_PROBE, omp_compile, omp_link):
                message = ("fastattn: the compiler cannot build OpenMP code; building the "
                           "single-threaded core")
                if _flag("FASTATTN_REQUIRE_OPENMP"):
                    raise RuntimeError(message + " (FASTATTN_REQUIRE_OPENMP is set)")
                warnings.warn(message)
                omp_compile, omp_link = [], []
        for ext in self.extensions:
            ext.extra_compile_args = base + omp_compile
            ext.extra_link_args = omp_link
        super().build_extensions()


extensions = [
    Extension(
        "fastattn._core",
        sources=SOURCES,
        include_dirs=["csrc"],
        depends=["csrc/fastattn.h", "csrc/fa_internal.h", "csrc/fa_kernels.h", "csrc/kernels.inc",
                 "src/fastattn/_core.pxd"],
    )
]

setup(
    ext_modules=cythonize(extensions, compiler_directives={"language_level": "3"}),
    cmdclass={"build_ext": BuildExt},
)
