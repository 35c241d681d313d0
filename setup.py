"""Build of fastattn._core: Cython over the C99 kernels in csrc/.

First a plain C program is compiled and linked, so that a missing compiler is
reported as such. Then OpenMP is probed for the compiler in use (-fopenmp on
gcc/clang, /openmp on MSVC, -Xpreprocessor -fopenmp -lomp on Apple clang with
libomp). When that probe fails the build stops with a message that says how to
get OpenMP; FASTATTN_DISABLE_OPENMP=1 builds a single-threaded core on purpose
(as scikit-learn's SKLEARN_NO_OPENMP does), and ``fastattn.show_config()``
then says so.
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

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

SOURCES = ["src/fastattn/_core.pyx", "csrc/rowwise.c", "csrc/attention.c", "csrc/config.c",
           "csrc/dispatch.c", "csrc/kernels_generic.c", "csrc/kernels_avx2.c", "csrc/kernels_avx512.c",
           "csrc/merge.c",
           "csrc/peak.c"]

PLAIN_PROBE = "int main(void) { return 0; }\n"

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

NO_COMPILER = """\
fastattn: no working C compiler was found (a trivial C program did not
compile and link with {compiler}). fastattn's core is C, so building it from
source needs one:
  - Linux: gcc (Debian/Ubuntu: apt-get install gcc python3-dev; Fedora: dnf
    install gcc python3-devel), or clang;
  - macOS: Apple's command line tools (xcode-select --install), plus Homebrew's
    libomp for threads (brew install libomp);
  - Windows: the Microsoft C++ Build Tools (MSVC).
Or install a binary wheel, which needs no compiler.
The failing step (the compiler's own output is above):
{detail}"""

NO_OPENMP = """\
fastattn: the C compiler ({compiler}) cannot build OpenMP code with {flags}.
fastattn runs its kernels on OpenMP threads; to build them:
  - Linux: gcc has OpenMP built in (libgomp); clang needs LLVM's libomp
    (Debian/Ubuntu: apt-get install libomp-dev);
  - macOS: Apple's clang has no OpenMP runtime: brew install libomp, then
      export CPPFLAGS="-I$(brew --prefix libomp)/include"
      export LDFLAGS="-L$(brew --prefix libomp)/lib -Wl,-rpath,$(brew --prefix libomp)/lib"
    (or build with Homebrew's gcc: CC=gcc-14);
  - Windows: MSVC's /openmp flag is used; it needs the Microsoft C++ Build
    Tools (vcomp, MSVC's OpenMP runtime, comes with them).
To build a single-threaded core on purpose, set FASTATTN_DISABLE_OPENMP=1
(fastattn.show_config() then reports openmp: False).
The failing step (the compiler's own output is above):
{detail}"""


class BuildConfigError(SystemExit):
    """The build cannot go on; the message says why and what to do."""


def _flag(name, environ=None):
    environ = os.environ if environ is None else environ
    return environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _openmp_flags(compiler):
    """(compile_args, link_args) that enable OpenMP for this compiler."""
    if compiler.compiler_type == "msvc":
        return ["/openmp"], []
    if sys.platform == "darwin":
        return ["-Xpreprocessor", "-fopenmp"], ["-lomp"]
    return ["-fopenmp"], ["-fopenmp"]


def _compiler_name(compiler):
    if compiler.compiler_type == "msvc":
        return "MSVC"
    cmd = getattr(compiler, "compiler_so", None) or getattr(compiler, "compiler", None) or ["cc"]
    return cmd[0]


def _try_build(compiler, source, compile_args, link_args):
    """None when `source` compiles and links with these flags, else the error text."""
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
        except Exception as exc:  # any compiler or linker failure means "no"
            return str(exc) or type(exc).__name__
    return None


def openmp_build_flags(compiler, environ=None):
    """(compile_args, link_args) for OpenMP, or ([], []) when it is disabled.

    Raises BuildConfigError when there is no working C compiler, or when the
    compiler cannot build OpenMP code and FASTATTN_DISABLE_OPENMP is not set.
    """
    error = _try_build(compiler, PLAIN_PROBE, [], [])
    if error is not None:
        raise BuildConfigError(NO_COMPILER.format(compiler=_compiler_name(compiler),
                                                  detail=textwrap.indent(error, "    ")))
    if _flag("FASTATTN_DISABLE_OPENMP", environ):
        print("fastattn: OpenMP disabled by FASTATTN_DISABLE_OPENMP=1; building a "
              "single-threaded core")
        return [], []
    compile_args, link_args = _openmp_flags(compiler)
    error = _try_build(compiler, OPENMP_PROBE, compile_args, link_args)
    if error is not None:
        raise BuildConfigError(NO_OPENMP.format(compiler=_compiler_name(compiler),
                                                flags=" ".join(dict.fromkeys(compile_args + link_args)),
                                                detail=textwrap.indent(error, "    ")))
    return compile_args, link_args


class BuildExt(build_ext):
    def build_extensions(self):
        compiler = self.compiler
        if compiler.compiler_type == "msvc":
            base = ["/O2", "/fp:precise"]
        else:
            # -ffp-contract=off: a * b + c stays two roundings wherever the
            # kernels write it so (the SIMD kernels fuse only where they say
            # so), whatever the compiler's default.
            base = ["-O3", "-std=c99", "-ffp-contract=off", "-fno-math-errno", "-fno-trapping-math",
                    "-Wall", "-Wextra", "-Wno-unused-function", "-Wno-unreachable-code"]
        omp_compile, omp_link = openmp_build_flags(compiler)
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
                 "csrc/kernels_avx2.c",
                 "src/fastattn/_core.pxd"],
    )
]

if __name__ == "__main__":  # (tests import this file for openmp_build_flags)
    from Cython.Build import cythonize

    setup(
        ext_modules=cythonize(extensions, compiler_directives={"language_level": "3"}),
        cmdclass={"build_ext": BuildExt},
    )
