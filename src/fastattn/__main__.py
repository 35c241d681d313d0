"""fastattn's command line.

``python -m fastattn`` (the main job): checks the compiled kernels against the
pure-NumPy reference on shipped inputs, times fastattn against the reference
(and PyTorch when it is installed), prints both tables and exits 1 if any
check fails. ``python -m fastattn bench ...`` times a shape of one's own.
"""
import argparse
import sys
import time

import numpy as np

import fastattn
from fastattn import reference
from fastattn._realinput import max_abs_err, real_input_checks

SEED = 20261129
RTOL, ATOL = 1e-4, 1e-5  # float32 kernels against the float64 reference


# ----------------------------------------------------------------------------
# Checks


def _worked_example():
    """The SPEC's worked example, against the values every textbook prints."""
    q = np.array([[1.0, 0.0]])
    k = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    v = np.array([[10.0, 0.0], [0.0, 10.0], [5.0, 5.0]])
    w = fastattn.attention_weights(q, k)
    o = fastattn.scaled_dot_product_attention(q, k, v)
    ok = (o.shape == (1, 2)
          and np.allclose(w, [[0.4011, 0.1978, 0.4011]], atol=5e-5)
          and abs(float(w.sum()) - 1.0) < 1e-6
          and np.allclose(o, [[6.0167, 3.9833]], atol=5e-5))
    err = max(max_abs_err(w, reference.attention_weights(q, k)),
              max_abs_err(o, reference.scaled_dot_product_attention(q, k, v)))
    return ok, err


def _close(got, want):
    got, want = np.asarray(got), np.asarray(want)
    return got.shape == want.shape and np.allclose(got, want, rtol=RTOL, atol=ATOL,
                                                   equal_nan=True)


def _random_cases(rng):
    """(name, function name, args, kwargs) of the random-input checks."""
    def qkv(batch, L, S, D, Dv, kv_batch=None):
        kv_batch = batch if kv_batch is None else kv_batch
        return (rng.standard_normal(batch + (L, D), dtype=np.float32),
                rng.standard_normal(kv_batch + (S, D), dtype=np.float32),
                rng.standard_normal(kv_batch + (S, Dv), dtype=np.float32))

    q, k, v = qkv((2, 4), 77, 77, 32, 32)
    qs, ks, vs = qkv((2, 4), 45, 130, 24, 17)
    qg, kg, vg = qkv((2, 8), 50, 50, 16, 16, kv_batch=(2, 2))
    pad = np.arange(130) < rng.integers(60, 130, size=(2, 1, 1, 1))  # per-batch padding
    fmask = np.where(rng.random((45, 130)) < 0.2, -np.inf,
                     rng.standard_normal((45, 130))).astype(np.float32)
    x = (rng.standard_normal((64, 1000)) * 8).astype(np.float32)
    sdpa = "scaled_dot_product_attention"
    return [
        ("sdpa", sdpa, (q, k, v), {"return_lse": True}),
        ("sdpa causal", sdpa, (q, k, v), {"is_causal": True, "return_lse": True}),
        ("sdpa L!=S causal", sdpa, (qs, ks, vs), {"is_causal": True, "return_lse": True}),
        ("sdpa L!=S window (16, 3)", sdpa, (qs, ks, vs), {"window": (16, 3)}),
        ("sdpa bool padding mask", sdpa, (qs, ks, vs, pad), {"return_lse": True}),
        ("sdpa float mask + causal", sdpa, (qs, ks, vs, fmask), {"is_causal": True}),
        ("sdpa GQA 8/2 causal", sdpa, (qg, kg, vg), {"enable_gqa": True, "is_causal": True}),
        ("sliding window 8", "sliding_window_attention", (q, k, v, 8), {}),
        ("attention_weights causal", "attention_weights", (qs, ks), {"is_causal": True}),
        ("softmax", "softmax", (x,), {}),
        ("log_softmax axis 0", "log_softmax", (x,), {"axis": 0}),
        ("logsumexp", "logsumexp", (x,), {}),
    ]


def run_checks(out=sys.stdout):
    """Print one line per check (the worked example, random inputs from a fixed
    seed, real MiniLM activations of every layer); return True when all pass."""
    ok, err = _worked_example()
    rows = [("worked example (SPEC)", ok, err)]
    for name, fn, args, kwargs in _random_cases(np.random.default_rng(SEED)):
        got = getattr(fastattn, fn)(*args, **kwargs)
        want = getattr(reference, fn)(*args, **kwargs)
        if not isinstance(got, tuple):
            got, want = (got,), (want,)
        ok = all(_close(g, w) for g, w in zip(got, want))
        rows.append((name, ok, max(max_abs_err(g, w) for g, w in zip(got, want))))
    rows += real_input_checks(rtol=RTOL, atol=ATOL)
    print(f"{'check (compiled vs reference)':<34}{'max abs err':>12}  result", file=out)
    for name, ok, err in rows:
        print(f"{name:<34}{err:>12.2e}  {'ok' if ok else 'FAIL'}", file=out)
    return all(ok for _, ok, _ in rows)


# ----------------------------------------------------------------------------
# Timing


def _best_time(fn, repeat):
    fn()  # warm up: page in the output, start the threads
    best = np.inf
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


def time_sdpa(batch, heads, L, S, D, causal=False, window=None, threads=None, repeat=3,
              peers=("reference", "torch")):
    """Best-of-`repeat` seconds of fastattn and its peers on one shape: a dict
    implementation -> seconds (None where a peer is not installed or cannot
    run the case)."""
    rng = np.random.default_rng(SEED)
    q = rng.standard_normal((batch, heads, L, D), dtype=np.float32)
    k = rng.standard_normal((batch, heads, S, D), dtype=np.float32)
    v = rng.standard_normal((batch, heads, S, D), dtype=np.float32)
    kw = {"is_causal": causal, "window": window}
    if threads is not None:
        fastattn.set_num_threads(threads)
    try:
        times = {"fastattn": _best_time(
            lambda: fastattn.scaled_dot_product_attention(q, k, v, **kw), repeat)}
        if "reference" in peers:
            times["reference"] = _best_time(
                lambda: reference.scaled_dot_product_attention(q, k, v, **kw), 1)
        torch = _torch() if "torch" in peers else None
        if torch is not None and window is None and (not causal or L == S):
            torch.set_num_threads(fastattn.get_num_threads())
            tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))

            def run_torch():
                with torch.no_grad():
                    torch.nn.functional.scaled_dot_product_attention(tq, tk, tv,
                                                                     is_causal=causal)
            times["torch"] = _best_time(run_torch, repeat)
        elif "torch" in peers:
            times["torch"] = None
    finally:
        if threads is not None:
            fastattn.set_num_threads(None)
    return times


def print_times(rows, out=sys.stdout):
    """rows: (label, times dict); one line each, with speed-up columns."""
    print(f"{'case':<42}{'fastattn':>10}{'reference':>11}{'torch':>10}"
          f"{'ref/fa':>8}{'torch/fa':>9}", file=out)

    def cell(t):
        return f"{t * 1e3:>8.1f}ms" if t else f"{'-':>10}"

    for label, t in rows:
        fa, ref, tor = t["fastattn"], t.get("reference"), t.get("torch")
        print(f"{label:<42}{cell(fa)}{cell(ref):>11}{cell(tor)}"
              f"{(f'{ref / fa:7.1f}x' if ref else '       -'):>8}"
              f"{(f'{tor / fa:8.1f}x' if tor else '        -'):>9}", file=out)


def main_job(args):
    fastattn.show_config()
    print()
    ok = run_checks()
    print()
    rows = []
    for causal in (False, True):
        label = f"sdpa B=1 H=8 L=S=1024 D=64{' causal' if causal else ''}"
        rows.append((label, time_sdpa(1, 8, 1024, 1024, 64, causal=causal,
                                      repeat=args.repeat)))
    print_times(rows)
    if not ok:
        print("\nFAILED: a compiled kernel disagrees with the reference", file=sys.stderr)
    return 0 if ok else 1


def bench(args):
    window = None
    if args.window is not None:
        window = (args.window - 1, 0)  # sliding_window_attention's window_size
    peers = [p for p, on in (("reference", args.reference), ("torch", not args.no_torch)) if on]
    times = time_sdpa(args.batch, args.heads, args.L, args.S or args.L, args.D,
                      causal=args.causal, window=window, threads=args.threads,
                      repeat=args.repeat, peers=peers)
    label = (f"sdpa B={args.batch} H={args.heads} L={args.L} S={args.S or args.L} D={args.D}"
             + (" causal" if args.causal else "") + (f" window={args.window}" if window else ""))
    print_times([(label, times)])
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m fastattn",
        description="Check fastattn's compiled kernels against the NumPy reference and "
                    "time them (the main job), or time a shape of your own (bench).")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per case (best kept)")
    sub = parser.add_subparsers(dest="command")
    b = sub.add_parser("bench", help="time scaled_dot_product_attention on a shape you name",
                       description="Time fastattn.scaled_dot_product_attention on q (B, H, L, D), "
                                   "k and v (B, H, S, D), against PyTorch when installed.")
    b.add_argument("--batch", "-B", type=int, default=1, help="batch size (default 1)")
    b.add_argument("--heads", "-H", type=int, default=8, help="heads (default 8)")
    b.add_argument("-L", type=int, default=1024, help="queries (default 1024)")
    b.add_argument("-S", type=int, default=None, help="keys (default: L)")
    b.add_argument("-D", type=int, default=64, help="head dimension (default 64)")
    b.add_argument("--causal", action="store_true", help="causal attention")
    b.add_argument("--window", type=int, default=None, metavar="W",
                   help="sliding window of W keys: window=(W-1, 0)")
    b.add_argument("--threads", type=int, default=None,
                   help="fastattn (and torch) threads (default: OpenMP's)")
    b.add_argument("--repeat", type=int, default=3, help="timed runs (best kept)")
    b.add_argument("--reference", action="store_true",
                   help="also time the NumPy reference (O(L*S) memory)")
    b.add_argument("--no-torch", action="store_true", help="do not time PyTorch")
    args = parser.parse_args(argv)
    if args.command == "bench":
        return bench(args)
    return main_job(args)


if __name__ == "__main__":
    sys.exit(main())
