"""The build's OpenMP probe (setup.py): a compiler that cannot build OpenMP
code stops the build with a message saying how to get OpenMP, unless
FASTATTN_DISABLE_OPENMP=1 asks for a single-threaded core; no compiler at all
is reported as such first. The compilers are simulated with small wrappers
around the real one, so this runs in about a second.

The test needs the source tree's setup.py and a C compiler; it is skipped
where either is missing (the installed wheel tested from outside the tree).
"""
import stat
import sys

import pytest

from conftest import C_COMPILER, SETUP_PY, build_compiler

pytestmark = [
    pytest.mark.skipif(not SETUP_PY.exists(), reason="needs the source tree's setup.py"),
    pytest.mark.skipif(C_COMPILER is None, reason="needs a C compiler"),
    pytest.mark.skipif(sys.platform == "win32", reason="the wrappers are POSIX shell scripts"),
]


def _wrapper(tmp_path, body):
    path = tmp_path / "cc"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def _compiler(cc):
    compiler = build_compiler(cc)
    if compiler.compiler_type != "unix":
        pytest.skip("the wrappers stand in for a unix compiler")
    # the probes link plain executables with the same wrapper
    compiler.set_executable("linker_exe", [cc])
    return compiler


NO_FOPENMP = ('for a in "$@"; do case "$a" in *fopenmp*) '
              'echo "cc: error: unsupported option \'$a\'" >&2; exit 1;; esac; done\n'
              f'exec "{C_COMPILER}" "$@"\n')


def test_compiler_without_openmp_fails_with_how_to(setup_module_, tmp_path):
    compiler = _compiler(_wrapper(tmp_path, NO_FOPENMP))
    with pytest.raises(SystemExit) as info:
        setup_module_.openmp_build_flags(compiler, environ={})
    message = str(info.value)
    assert "cannot build OpenMP code" in message
    assert "brew install libomp" in message          # macOS
    assert "/openmp" in message                       # MSVC
    assert "gcc" in message
    assert "FASTATTN_DISABLE_OPENMP=1" in message     # the opt-out
    # the failing step, as the compiler tooling reports it (its wording differs
    # between setuptools versions: the source file, or the command that failed)
    last = message.splitlines()[-1]
    assert "probe.c" in last or "failed" in last, last


def test_compiler_without_openmp_with_opt_out_builds_single_threaded(setup_module_, tmp_path,
                                                                      capsys):
    compiler = _compiler(_wrapper(tmp_path, NO_FOPENMP))
    flags = setup_module_.openmp_build_flags(compiler,
                                             environ={"FASTATTN_DISABLE_OPENMP": "1"})
    assert flags == ([], [])
    assert "single-threaded" in capsys.readouterr().out


def test_no_compiler_says_so_first(setup_module_, tmp_path):
    missing = str(tmp_path / "no-such-cc")
    compiler = _compiler(missing)
    with pytest.raises(SystemExit) as info:
        setup_module_.openmp_build_flags(compiler, environ={"FASTATTN_DISABLE_OPENMP": "1"})
    message = str(info.value)
    assert message.startswith("fastattn: no working C compiler was found")
    assert "OpenMP" not in message.splitlines()[0]


def test_working_openmp_compiler_gets_the_flags(setup_module_, tmp_path):
    compiler = _compiler(C_COMPILER)
    try:
        flags = setup_module_.openmp_build_flags(compiler, environ={})
    except SystemExit as exc:  # this machine's compiler has no OpenMP
        pytest.skip(f"the compiler here has no OpenMP: {str(exc).splitlines()[0]}")
    assert "-fopenmp" in flags[0] or "-Xpreprocessor" in flags[0]
