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
import hashlib
import json
import os
import re
import shlex
import shutil
import sys
import sysconfig
import tempfile
import textwrap
from pathlib import Path
from concurrent.futures import ThreadPoolExecutor

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


def kernel_variants(path="csrc/variants.def"):
    """The SIMD variants' names, in the order of csrc/variants.def (the list
    the run-time dispatch reads too): each is compiled from
    csrc/kernels_<name>.c."""
    with open(path) as f:
        text = re.sub(r"/\*.*?\*/", "", f.read(), flags=re.S)  # (the comments)
    return re.findall(r"^\s*FA_VARIANT\(\s*(\w+)\s*,", text, flags=re.M)


# Slowest first: the sources are compiled in parallel in this order, so the
# kernel variants (the most capable first) start at once.
SOURCES = ([f"csrc/kernels_{name}.c" for name in reversed(kernel_variants())]
           + ["src/fastattn/_core.pyx", "csrc/attention.c", "csrc/rowwise.c", "csrc/config.c",
              "csrc/dispatch.c", "csrc/merge.c", "csrc/peak.c", "csrc/backward.c", "csrc/results.c"])

CYTHON_DIRECTIVES = {"language_level": "3"}

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


def build_jobs(n_sources, parallel=None, environ=None):
    """How many sources to compile at once.

    FASTATTN_BUILD_JOBS when set, else build_ext's --parallel (-j), else the
    CPUs this process may run on; never more than there are sources.
    """
    environ = os.environ if environ is None else environ
    value = environ.get("FASTATTN_BUILD_JOBS", "").strip()
    if value:
        jobs = int(value) if value.isdigit() else 0
        if jobs < 1:
            raise BuildConfigError(f"fastattn: FASTATTN_BUILD_JOBS={value!r}: give the number of "
                                   "sources to compile at once, a whole number of at least 1")
    elif parallel and parallel is not True:
        jobs = int(parallel)
    elif hasattr(os, "process_cpu_count"):  # Python >= 3.13: affinity and -X cpu_count
        jobs = os.process_cpu_count() or 1
    elif hasattr(os, "sched_getaffinity"):  # the CPUs this process may run on, not the machine's
        jobs = len(os.sched_getaffinity(0))
    else:
        jobs = os.cpu_count() or 1
    return max(1, min(jobs, n_sources))


_INCLUDE = re.compile(rb'^[ \t]*#[ \t]*include[ \t]*([<"])([^">]+)[">]', re.MULTILINE)


def included_files(source, include_dirs):
    """{path: bytes} of `source` and of every file it may #include, transitively.

    Every #include line counts, whatever #if it sits under, so that the set
    covers each configuration. A quoted name is looked up beside the file
    that includes it, then in include_dirs, an angled one in include_dirs
    only; names found in none of them (the C library's headers) are left out.
    """
    found = {}
    todo = [os.path.normpath(source)]
    while todo:
        path = todo.pop()
        if path in found:
            continue
        with open(path, "rb") as f:
            found[path] = f.read()
        for kind, name in _INCLUDE.findall(found[path]):
            dirs = ([os.path.dirname(path)] if kind == b'"' else []) + list(include_dirs)
            for directory in dirs:
                candidate = os.path.normpath(os.path.join(directory, os.fsdecode(name)))
                if os.path.isfile(candidate):
                    todo.append(candidate)
                    break
    return found


def _compiler_identity(compiler):
    """What names this compiler and its fixed flags: a changed CC, CFLAGS or
    compiler binary changes it."""
    command = (getattr(compiler, "compiler_so", None) or [getattr(compiler, "cc", None) or ""])
    program = shutil.which(command[0]) if command[0] else None
    stat = os.stat(program) if program else None
    return [compiler.compiler_type, sys.version, sysconfig.get_platform(),
            [getattr(compiler, name, None) for name in
             ("compiler_so", "cc", "compile_options", "compile_options_debug", "macros",
              "include_dirs")],
            program, stat and (stat.st_size, stat.st_mtime_ns)]


def object_key(compiler, source, macros, include_dirs, debug, extra_preargs, extra_postargs):
    """A hash of all that goes into compiling `source`: the compiler and its
    flags, and the contents of the source and of every file it may include."""
    digest = hashlib.sha256()
    digest.update(repr([_compiler_identity(compiler), source, macros, include_dirs, debug,
                        extra_preargs, extra_postargs]).encode())
    for path, data in sorted(included_files(source, list(include_dirs or [])
                                            + list(compiler.include_dirs)).items()):
        digest.update(f"\0{path}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()


def _read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _file_hash(path):
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None


def parallel_reusing_compile(compiler, jobs, order=(), force=False):
    """compiler.compile, one source per call on `jobs` threads, that keeps an
    object whose key (object_key) is the one it was compiled with.

    Sources start in `order` (those not in it after), so that the slowest can
    be started first: build_ext hands them over sorted by name.

    Each object's key is written next to it (<object>.key) once it is
    compiled. pip builds in the source tree's build/ but in a new isolated
    environment each time, so nothing else tells it that an object is still
    good: without this every `pip install .` compiled everything again.
    """
    one_at_a_time = compiler.compile
    if getattr(compiler, "initialized", True) is False:
        compiler.initialize()  # MSVC: once here, not in each thread

    def compile(sources, output_dir=None, macros=None, include_dirs=None, debug=False,
                extra_preargs=None, extra_postargs=None, depends=None):
        objects = compiler.object_filenames(sources, strip_dir=False, output_dir=output_dir)
        todo, kept = [], []
        for source, obj in zip(sources, objects):
            key = object_key(compiler, source, macros, include_dirs, debug, extra_preargs,
                             extra_postargs)
            if not force and os.path.isfile(obj) and _read(obj + ".key") == key:
                kept.append(source)
                continue
            if os.path.exists(obj + ".key"):
                os.remove(obj + ".key")
            # made here: the compiler's own mkpath would run in several threads
            os.makedirs(os.path.dirname(obj) or os.curdir, exist_ok=True)
            todo.append((source, obj, key))
        rank = {source: i for i, source in enumerate(order)}
        todo.sort(key=lambda item: rank.get(item[0], len(rank)))

        def build(source, obj, key):
            one_at_a_time([source], output_dir=output_dir, macros=macros,
                          include_dirs=include_dirs, debug=debug, extra_preargs=extra_preargs,
                          extra_postargs=extra_postargs, depends=depends)
            with open(obj + ".key", "w") as f:
                f.write(key)

        if kept:
            print(f"fastattn: objects kept (same source, includes and flags as they were "
                  f"compiled with, under {output_dir}): {' '.join(kept)}")
        if todo:
            print(f"fastattn: compiling {len(todo)} of {len(sources)} sources, "
                  f"{min(jobs, len(todo))} at a time")
        errors = []
        with ThreadPoolExecutor(max_workers=max(1, min(jobs, len(todo)))) as pool:
            futures = [pool.submit(build, *item) for item in todo]
            for future in futures:
                try:
                    future.result()
                except Exception as exc:  # the others still running finish; none starts
                    errors.append(exc)
                    for pending in futures:
                        pending.cancel()
        if errors:
            raise errors[0]
        return objects

    compiler.compile = compile


def cythonize_once(ext, build_base, force=False):
    """Turn ext's .pyx sources into .c ones, running Cython only when its
    inputs changed.

    The inputs are the .pyx, .pxd and .pxi files beside each .pyx, the Cython
    version and the directives; their hash and that of the .c files made are
    kept in <build_base>/fastattn-cython.json. Cython's own up-to-date check
    compares times with its bundled .pxd files, which are new in each of pip's
    isolated build environments, so it would regenerate the .c (and so
    recompile it) on every install.
    """
    pyx = [source for source in ext.sources if source.endswith(".pyx")]
    if not pyx:
        return
    import Cython
    from Cython.Build import cythonize

    inputs = sorted({os.path.join(os.path.dirname(source), name)
                     for source in pyx for name in os.listdir(os.path.dirname(source) or os.curdir)
                     if name.endswith((".pyx", ".pxd", ".pxi"))})
    digest = hashlib.sha256(repr([Cython.__version__, CYTHON_DIRECTIVES, inputs]).encode())
    for path in inputs:
        with open(path, "rb") as f:
            digest.update(f.read())
    outputs = [os.path.splitext(source)[0] + ".c" for source in ext.sources]
    made = [output for source, output in zip(ext.sources, outputs) if source.endswith(".pyx")]
    stamp_path = os.path.join(build_base, "fastattn-cython.json")
    stamp = {"inputs": digest.hexdigest(), "outputs": {path: _file_hash(path) for path in made}}
    if not force and None not in stamp["outputs"].values() and _read(stamp_path) == json.dumps(stamp):
        print(f"fastattn: {', '.join(made)} up to date (same Cython, same .pyx and .pxd)")
        ext.sources = [output if source.endswith(".pyx") else source
                       for source, output in zip(ext.sources, outputs)]
        return
    ext.sources = cythonize([ext], force=True, compiler_directives=CYTHON_DIRECTIVES)[0].sources
    stamp["outputs"] = {path: _file_hash(path) for path in made}
    os.makedirs(build_base, exist_ok=True)
    with open(stamp_path, "w") as f:
        f.write(json.dumps(stamp))


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
        forced = bool(self.force)  # build_ext --force: compile and cythonize everything
        build_base = self.get_finalized_command("build").build_base
        # the sources as listed (Cython puts its .c first, build_ext sorts them)
        order = [os.path.splitext(source)[0] + ".c" if source.endswith(".pyx") else source
                 for ext in self.extensions for source in ext.sources]
        for ext in self.extensions:
            ext.extra_compile_args = base + omp_compile
            ext.extra_link_args = omp_link
            cythonize_once(ext, build_base, force=forced)
        parallel_reusing_compile(
            compiler, build_jobs(max(len(ext.sources) for ext in self.extensions), self.parallel),
            order=order, force=forced)
        # The objects' keys decide what is compiled: build_ext's own check
        # (the extension against its sources' times) knows nothing of the
        # flags, and would keep a threaded core when FASTATTN_DISABLE_OPENMP=1
        # asks for another. The link, a second or so, is always done.
        self.force = compiler.force = True
        super().build_extensions()


extensions = [
    Extension(
        "fastattn._core",
        sources=SOURCES,
        include_dirs=["csrc"],
        depends=sorted(str(p) for p in Path("csrc").glob("*") if p.suffix in (".h", ".inc", ".def"))
        + ["src/fastattn/_core.pxd"],
    )
]

if __name__ == "__main__":  # (tests import this file for openmp_build_flags)
    # Cython is a build requirement: without it setuptools would quietly
    # compile whatever _core.c an earlier build left, however old.
    import Cython  # noqa: F401

    setup(ext_modules=extensions, cmdclass={"build_ext": BuildExt})
