"""Timing for ``python -m fastattn``: one shape of the user's, or the grid of
speed targets, side by side with the NumPy reference and PyTorch.

Every figure is the best of a few runs in this process; compare the ratios,
which hold better than the times on a shared machine. PyTorch is timed when it
is installed (``torch.no_grad()``, the same thread count as fastattn); NumPy's
matmul is the FLOP-rate yardstick (unset OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE in
the command for a fair one: they slow a current OpenBLAS).
"""
import os
import subprocess
import sys
import time

import numpy as np

import fastattn
from fastattn import reference

SEED = 20261129


def best_time(fn, repeat):
    """Best wall time of `repeat` runs of fn(), after one warm-up run."""
    fn()  # warm up: page in the output, start the threads
    best = np.inf
    for _ in range(max(1, repeat)):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def torch_or_none():
    try:
        import torch
    except ImportError:
        return None
    return torch


def _randn(shape, seed):
    return np.random.default_rng(SEED + seed).standard_normal(shape, dtype=np.float32)


def _torch_sdpa(torch, q, k, v, **kw):
    tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))

    def run():
        with torch.no_grad():
            torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, **kw)
    return run


def time_sdpa(batch, heads, L, S, D, causal=False, window=None, repeat=3,
              peers=("reference", "torch"), kv_heads=None):
    """Seconds of fastattn and its peers on q (batch, heads, L, D), k and v
    (batch, kv_heads, S, D) (kv_heads < heads: grouped-query attention,
    enable_gqa=True): a dict implementation -> seconds, None where a peer
    is not installed or has no equivalent (PyTorch: windows, causal L != S)."""
    kv_heads = heads if kv_heads is None else kv_heads
    q, k, v = _randn((batch, heads, L, D), 0), _randn((batch, kv_heads, S, D), 1), \
        _randn((batch, kv_heads, S, D), 2)
    gqa = kv_heads != heads
    kw = {"is_causal": causal, "window": window, "enable_gqa": gqa}
    times = {"fastattn": best_time(
        lambda: fastattn.scaled_dot_product_attention(q, k, v, **kw), repeat)}
    if "reference" in peers:
        times["reference"] = best_time(
            lambda: reference.scaled_dot_product_attention(q, k, v, **kw), 1)
    if "torch" in peers:
        torch = torch_or_none()
        times["torch"] = None
        if torch is not None and window is None and (not causal or L == S):
            torch.set_num_threads(fastattn.get_num_threads())
            times["torch"] = best_time(_torch_sdpa(torch, q, k, v, is_causal=causal,
                                                   enable_gqa=gqa), repeat)
    return times


def print_times(rows, out=None):
    """rows: (label, times dict); one line each, with speed-up columns; to `out`
    (default: sys.stdout at call time)."""
    out = sys.stdout if out is None else out
    print(f"{'case':<42}{'fastattn':>10}{'reference':>11}{'torch':>10}"
          f"{'ref/fa':>8}{'torch/fa':>9}", file=out)

    def cell(t):
        return f"{t * 1e3:>8.1f}ms" if t else f"{'-':>10}"

    for label, t in rows:
        fa, ref, tor = t["fastattn"], t.get("reference"), t.get("torch")
        print(f"{label:<42}{cell(fa)}{cell(ref):>11}{cell(tor)}"
              f"{(f'{ref / fa:7.1f}x' if ref else '       -'):>8}"
              f"{(f'{tor / fa:8.1f}x' if tor else '        -'):>9}", file=out)


_PEAK_SCRIPT = """
import resource, sys
import numpy as np, fastattn
L = int(sys.argv[1])
rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal((1, 8, L, 64), dtype=np.float32) for _ in range(3))
out = np.ones_like(q)
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
fastattn.causal_attention(q, k, v, out=out)
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base)
"""


def peak_extra_mib(L=16384):
    """MiB that causal attention (B=1, H=8, L=S, D=64) adds to the peak RSS of
    a process that already holds its inputs and output."""
    res = subprocess.run([sys.executable, "-c", _PEAK_SCRIPT, str(L)], capture_output=True,
                         text=True, check=True)
    return int(res.stdout.strip()) / 1024


def grid(repeat=3, memory=True, out=None):
    """Measure the speed targets and print one row per target:
    what was measured, the goal, and whether it is met (to `out`, default
    sys.stdout at call time)."""
    out = sys.stdout if out is None else out
    torch = torch_or_none()
    threads = fastattn.get_num_threads()
    rows = []

    def row(case, measured, goal, met):
        rows.append((case, measured, goal, "yes" if met else ("NO" if met is not None else "-")))
        print(f"  {case}: {measured}", file=sys.stderr, flush=True)

    sdpa = {}
    for D in (64, 128):
        for L in (1024, 4096):
            for causal in (False, True):
                t = time_sdpa(1, 8, L, L, D, causal=causal, repeat=repeat, peers=("torch",))
                sdpa[D, L, causal] = t["fastattn"]
                label = f"SDPA H=8 D={D} L=S={L}{' causal' if causal else ''}"
                if t["torch"]:
                    r = t["torch"] / t["fastattn"]
                    row(label + " vs torch", f"{t['fastattn'] * 1e3:.0f} ms, {r:.2f}x",
                        ">= 1.5x", r >= 1.5)
                else:
                    row(label, f"{t['fastattn'] * 1e3:.0f} ms (torch absent)", ">= 1.5x", None)
    a = _randn((4096, 4096), 3)
    t_mm = best_time(lambda: a @ a, repeat)
    rate = 4 * 8 * 4096 * 4096 * 128 / sdpa[128, 4096, False]
    mm_rate = 2 * 4096**3 / t_mm
    row("SDPA L=S=4096 D=128 FLOP rate / numpy matmul",
        f"{rate / 1e9:.1f} / {mm_rate / 1e9:.1f} GFLOP/s = {rate / mm_rate:.0%}", ">= 55%",
        rate / mm_rate >= 0.55)
    for D in (64, 128):
        r = sdpa[D, 4096, False] / sdpa[D, 4096, True]
        row(f"causal speed-up, L=S=4096 D={D}", f"{r:.2f}x", ">= 1.8x", r >= 1.8)

    win = {}
    for L in (4096, 16384):
        q, k, v = (_randn((1, 8, L, 64), s) for s in range(3))
        win[L] = best_time(lambda: fastattn.sliding_window_attention(q, k, v, 256), repeat)
    full = best_time(lambda: fastattn.causal_attention(q, k, v), 1)
    r = win[16384] / win[4096]
    row("window 256: time 16384 / time 4096", f"{r:.2f}x", "<= 4.5x", r <= 4.5)
    r = full / win[16384]
    row("window 256 vs full causal, L=16384", f"{r:.1f}x faster", ">= 10x", r >= 10)

    q, k, v = _randn((1, 32, 1, 128), 0), _randn((1, 8, 16384, 128), 1), \
        _randn((1, 8, 16384, 128), 2)
    t_fa = best_time(lambda: fastattn.scaled_dot_product_attention(q, k, v, enable_gqa=True),
                     repeat * 3)
    t_copy = best_time(lambda: (k.copy(), v.copy()), repeat * 3)
    row("decode GQA 32/8 S=16384 D=128 / copy of k, v", f"{t_fa / t_copy:.2f}x", "<= 2x",
        t_fa / t_copy <= 2)
    if torch is not None:
        torch.set_num_threads(threads)
        t_t = best_time(_torch_sdpa(torch, q, k, v, enable_gqa=True), repeat * 3)
        row("decode GQA vs torch", f"{t_fa * 1e3:.1f} ms, {t_t / t_fa:.2f}x", ">= 2x",
            t_t / t_fa >= 2)

    for shape in ((16384, 2048), (64, 32768)):
        x = _randn(shape, 4)
        t_sm = best_time(lambda: fastattn.softmax(x), repeat)
        t_cp = best_time(x.copy, repeat)
        row(f"softmax {shape} / x.copy()", f"{t_sm / t_cp:.2f}x", "<= 1.5x", t_sm / t_cp <= 1.5)
        if torch is not None:
            tx = torch.from_numpy(x)
            t_t = best_time(lambda: torch.softmax(tx, dim=-1), repeat)
            row(f"softmax {shape} vs torch", f"{t_t / t_sm:.2f}x", ">= 3x", t_t / t_sm >= 3)

    q, k, v = (_randn((1, 8, 4096, 64), s) for s in range(3))
    per_thread = {}
    for n in (1, 2):
        fastattn.set_num_threads(n)
        per_thread[n] = best_time(lambda: fastattn.scaled_dot_product_attention(q, k, v), repeat)
    fastattn.set_num_threads(None)
    r = per_thread[1] / per_thread[2]
    row("thread scaling, SDPA L=S=4096: 1 / 2 threads", f"{r:.2f}x", ">= 1.8x", r >= 1.8)

    if memory:
        extra = peak_extra_mib()
        row("peak memory, causal L=S=16384 D=64", f"inputs + output + {extra:.0f} MiB",
            "<= +64 MB", extra * 2**20 <= 64e6)

    print(f"fastattn {fastattn.__version__}, {fastattn.show_config(print_=False)['simd']} "
          f"kernels, {threads} threads; torch {getattr(torch, '__version__', 'absent')}",
          file=out)
    if os.environ.get("OPENBLAS_CORETYPE") or os.environ.get("OPENBLAS_L2_SIZE"):
        print("note: OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE are set; NumPy's matmul is slowed",
              file=out)
    width = max(len(r[0]) for r in rows)
    print(f"{'target':<{width}}  {'measured':<34}{'goal':<10}met", file=out)
    for case, measured, goal, met in rows:
        print(f"{case:<{width}}  {measured:<34}{goal:<10}{met}", file=out)
    return rows
