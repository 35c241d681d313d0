"""The C-level kernel driver (tests/c/kernel_driver.c), built and run.

The driver links the C sources of csrc/ directly (no Python) and checks, on
every SIMD variant the CPU runs, attention cases (plain, causal, window,
GQA, bool and float masks, decoding over more than one key chunk, rows with
no allowed key, float16 and bfloat16 k and v, softcap with ALiBi and sinks),
their gradients, and softmax rows against double-precision C, across thread
counts, and the variants against each other; see its header. The build is kept in the
source tree's build/ under a key of the sources, the compiler and the flags,
so only a change rebuilds it. Skipped where there is no C compiler or no
csrc/ (the installed wheel tested from outside the source tree).
"""
import hashlib
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from fastattn import _core

from conftest import C_COMPILER, ROOT

CSRC = ROOT / "csrc"
DRIVER = ROOT / "tests" / "c" / "kernel_driver.c"
# setup.py's floating-point flags (the bits of the build), at a lower -O to
# build in less time
FLAGS = ["-O2", "-std=c99", "-ffp-contract=off", "-fno-math-errno", "-fno-trapping-math"]

pytestmark = [
    pytest.mark.skipif(not (CSRC / "fastattn.h").exists() or not DRIVER.exists(),
                       reason="needs the source tree's csrc/ and tests/c/"),
    pytest.mark.skipif(C_COMPILER is None or sys.platform == "win32",
                       reason="needs a C compiler (cc, gcc or clang) to build the C driver"),
]


def _compile(sources, exe, flags):
    """Compile each source to an object (in parallel), then link `exe`;
    None when that worked, else the compiler's error text."""
    def one(src):
        # (an object name from the source's path: two folders may hold the same name)
        obj = exe.parent / ("_".join(src.relative_to(ROOT).with_suffix(".o").parts))
        proc = subprocess.run([C_COMPILER, "-c", *flags, "-I", str(CSRC), str(src), "-o",
                               str(obj)], capture_output=True, text=True)
        return obj, proc

    with ThreadPoolExecutor(max(1, os.cpu_count() or 1)) as pool:
        compiled = list(pool.map(one, sources))
    for _, proc in compiled:
        if proc.returncode:
            return proc.stderr
    proc = subprocess.run([C_COMPILER, *flags, *(str(obj) for obj, _ in compiled), "-o", str(exe),
                           "-lm"], capture_output=True, text=True)
    return proc.stderr if proc.returncode else None


def _library_files(pattern):
    """csrc's files matching `pattern`, in its subfolders too (but for any
    tests/ folder: drivers of their own), in a fixed order."""
    return sorted(p for p in CSRC.rglob(pattern)
                  if p.is_file() and "tests" not in p.relative_to(CSRC).parts)


@pytest.fixture(scope="module")
def kernel_driver():
    """The driver's executable, built from every C source of csrc/ (whatever
    files are there) and the driver, with OpenMP where the compiler has it."""
    sources = _library_files("*.c") + [DRIVER]
    key = hashlib.sha256()
    version = subprocess.run([C_COMPILER, "--version"], capture_output=True, text=True).stdout
    key.update(f"{C_COMPILER}\n{version}\n{FLAGS}\n".encode())
    for path in _library_files("*") + [DRIVER]:
        key.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    where = ROOT / "build" / f"kernel_driver-{key.hexdigest()[:16]}"
    exe = where / "kernel_driver"
    if not exe.exists():
        where.mkdir(parents=True, exist_ok=True)
        error = _compile(sources, exe, FLAGS + ["-fopenmp"])
        if error is not None:  # a compiler without OpenMP: the kernels' one-thread build
            error = _compile(sources, exe, FLAGS)
        assert error is None, error
        for old in where.parent.glob("kernel_driver-*"):  # earlier sources' builds
            if old != where:
                for f in old.iterdir():
                    f.unlink()
                old.rmdir()
    return exe


def test_every_variant_matches_double_precision_and_the_others(kernel_driver):
    proc = subprocess.run([str(kernel_driver)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    assert "all checks passed" in proc.stdout
    # the driver ran each variant the Python build offers on this CPU
    lines = proc.stdout.splitlines()
    for variant in _core.simd_available():
        assert any(line.split()[0] == variant for line in lines[1:-1]), (variant, proc.stdout)
