"""fastattn's command line.

``python -m fastattn`` (the main job): checks the compiled kernels against the
pure-NumPy reference on shipped inputs, times fastattn against the reference
(and PyTorch when it is installed), prints both tables and exits 1 if any
check fails. ``python -m fastattn bench`` measures the grid of long-sequence
speed targets; ``bench --models`` the grid of model shapes against PyTorch and
ONNX Runtime; with a shape option (``-L 4096 --causal`` ...) it times a shape
of one's own.
"""
import argparse
import os
import sys

import numpy as np

import fastattn
from fastattn import reference
from fastattn._bench import (
    backward_grid,
    KV_DTYPES,
    LAYOUTS,
    MODEL_CASES,
    options_grid,
    grid,
    models,
    print_times,
    time_sdpa,
)
from fastattn._realinput import max_abs_err, real_input_checks
from fastattn._threads import MAX_THREADS

SEED = 20261129  # of the random-input checks
RTOL, ATOL = 1e-4, 1e-5  # float32 kernels against the float64 reference


# ----------------------------------------------------------------------------
# Checks


def _worked_example():
    """The worked example of the user guide, against the values every textbook prints."""
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


def run_checks(out=None):
    """Print one line per check (the worked example, random inputs from a fixed
    seed, real MiniLM activations of every layer) to `out` (default sys.stdout
    at call time); return True when all pass."""
    out = sys.stdout if out is None else out
    ok, err = _worked_example()
    rows = [("worked example (user guide)", ok, err)]
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
    shape_given = any(getattr(args, name) is not None for name in
                      ("batch", "heads", "kv_heads", "L", "S", "D", "window", "kv_dtype",
                       "layout")) or args.causal
    if args.options:
        ignored = [flag for flag, on in (
            ("--models", args.models), ("--backward", args.backward), ("--case", args.case),
            ("--batch", args.batch),
            ("--kv-heads", args.kv_heads), ("-S", args.S), ("--causal", args.causal),
            ("--window", args.window), ("--kv-dtype", args.kv_dtype),
            ("--layout", args.layout), ("--reference", args.reference)) if on]
        if ignored:
            print(f"bench: --options takes only -H, -L, -D, --threads and --repeat, not "
                  f"{', '.join(ignored)}", file=sys.stderr)
            return 2
        options_grid(repeat=args.repeat, L=args.L or 4096, heads=args.heads or 8,
                     D=args.D or 128, threads=args.threads or 2)
        return 0
    if args.backward:
        if shape_given or args.models or args.case or args.reference or args.no_torch:
            print("bench: --backward takes only --threads, --repeat and --no-memory",
                  file=sys.stderr)
            return 2
        backward_grid(repeat=args.repeat, threads=args.threads or 2, memory=not args.no_memory)
        return 0
    if args.models:
        if shape_given:
            print("bench: --models takes no shape options", file=sys.stderr)
            return 2
        models(repeat=args.repeat, threads=args.threads or 2, cases=args.case)
        fastattn.set_num_threads(None)
        return 0
    if args.case:
        print("bench: --case selects cases of --models", file=sys.stderr)
        return 2
    if args.threads is not None:
        fastattn.set_num_threads(args.threads)
    if not shape_given:
        grid(repeat=args.repeat, memory=not args.no_memory)
        return 0
    B, H = args.batch or 1, args.heads or 8
    Hkv = H if args.kv_heads is None else args.kv_heads
    if H % Hkv:
        print(f"bench: --heads ({H}) must be a multiple of --kv-heads ({Hkv})", file=sys.stderr)
        return 2
    L = args.L or 1024
    S = L if args.S is None else args.S
    D = args.D or 64
    window = None if args.window is None else (args.window - 1, 0)  # window_size W
    peers = [p for p, on in (("reference", args.reference), ("torch", not args.no_torch)) if on]
    kv, layout = args.kv_dtype or "float32", args.layout or "bhld"
    # Refused before anything is allocated: q, k, v and the output in float32,
    # about three times over (the peers' copies, the float32 twin of a
    # half-precision k and v); the reference's float64 scores and their
    # intermediates, four (B, H, L, S) arrays at its peak (tracemalloc).
    need = 3 * 4 * (B * H * L * (D + D) + 2 * B * Hkv * S * D)
    have = _memory_bytes()
    if have is not None and need > 0.75 * have:
        print(f"bench: this shape needs about {_gib(need)} of arrays, more than 3/4 of this "
              f"machine's {_gib(have)}", file=sys.stderr)
        return 2
    if args.reference and have is not None and 4 * 8 * B * H * L * S > 0.75 * have:
        print(f"bench: --reference forms the (B, H, L, S) scores in float64: about "
              f"{_gib(4 * 8 * B * H * L * S)} for this shape, more than 3/4 of this "
              f"machine's {_gib(have)}; not timed", file=sys.stderr)
        peers.remove("reference")
    if kv == "bfloat16":
        try:
            import ml_dtypes  # noqa: F401
        except ImportError:
            print("bench: --kv-dtype bfloat16 needs ml_dtypes (pip install ml_dtypes)",
                  file=sys.stderr)
            return 2
    try:
        times = time_sdpa(B, H, L, S, D, causal=args.causal, window=window, repeat=args.repeat,
                          peers=peers, kv_heads=Hkv, kv=kv, layout=layout)
    except MemoryError as exc:  # (what the estimate above let through)
        print(f"bench: out of memory for this shape: {exc}", file=sys.stderr)
        return 1
    label = (f"sdpa B={B} H={H}" + (f"/{Hkv}" if Hkv != H else "") + f" L={L} S={S} D={D}"
             + (" causal" if args.causal else "")
             + (f" window={args.window}" if window else "")
             + (f" kv={kv}" if kv != "float32" else "") + (f" {layout}" if layout != "bhld" else ""))
    print_times([(label, times)])
    return 0


def _count(minimum, maximum=None):
    """An argparse type: an int >= minimum (and <= maximum when given)."""
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum or (maximum is not None and value > maximum):
            within = f"in [{minimum}, {maximum}]" if maximum is not None else f">= {minimum}"
            raise argparse.ArgumentTypeError(f"expected an integer {within}, got {value}")
        return value
    return parse


def _memory_bytes():
    """This machine's physical memory in bytes, or None where it is not known."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def _gib(n):
    return f"{n / 2**30:.1f} GiB"


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m fastattn",
        description="Check fastattn's compiled kernels against the NumPy reference and "
                    "time them (the main job), or time a shape of your own (bench).")
    parser.add_argument("--repeat", type=_count(1), default=3,
                        help="timed runs per case (best kept)")
    sub = parser.add_subparsers(dest="command")
    b = sub.add_parser(
        "bench", help="time attention: the grid of speed targets, or a shape you name",
        description="Without shape options: measure the grid of speed targets (SDPA against "
                    "PyTorch, FLOP rate against NumPy's matmul, causal and sliding-window "
                    "speed-ups, GQA decoding, softmax, thread scaling, peak memory) and print "
                    "one row per target. With any shape option: time "
                    "fastattn.scaled_dot_product_attention on q (B, H, L, D), k and v "
                    "(B, HKV, S, D) against PyTorch (when installed) and optionally the "
                    "reference.")
    b.add_argument("--options", action="store_true",
                   help="softcap, ALiBi and sinks against none, segment ids against dense "
                        "masks, varlen_attention against separate calls and padding "
                        "(causal, -H/-L/-D, 2 threads by default)")
    b.add_argument("--models", action="store_true",
                   help="time the grid of model shapes (encoders, ViT, Whisper, LLM decode and "
                        "prefill, a tiny call) against the reference, PyTorch and ONNX Runtime "
                        "(2 threads for each unless --threads)")
    b.add_argument("--backward", action="store_true",
                   help="time attention_backward against PyTorch's CPU backward on four long "
                        "shapes (2 threads by default) and measure its peak memory")
    b.add_argument("--case", action="append", choices=[n for n, _ in MODEL_CASES],
                   metavar="NAME", help="--models: time only this case (repeatable)")
    b.add_argument("--batch", "-B", type=_count(1), help="batch size (default 1)")
    b.add_argument("--heads", "-H", type=_count(1), help="heads (default 8)")
    b.add_argument("--kv-heads", type=_count(1), metavar="HKV",
                   help="heads of k and v (default: --heads); fewer: grouped-query "
                        "attention (enable_gqa=True)")
    b.add_argument("-L", type=_count(1), help="queries (default 1024)")
    b.add_argument("-S", type=_count(0), help="keys (default: L)")
    b.add_argument("-D", type=_count(1), help="head dimension (default 64)")
    b.add_argument("--causal", action="store_true", help="causal attention")
    b.add_argument("--window", type=_count(1), metavar="W",
                   help="sliding window of W keys: window=(W-1, 0)")
    b.add_argument("--kv-dtype", choices=KV_DTYPES, default=None,
                   help="dtype of k and v (default float32; bfloat16 needs ml_dtypes; "
                        "q8_0, q4_0: GGUF blocks, fastattn.quantize_kv); also times the "
                        "float32 call on the same values (column f32/fa)")
    b.add_argument("--layout", choices=LAYOUTS, default=None,
                   help="bhld (default): q, k, v as contiguous (B, H, L, D); blhd: "
                        "(B, L, H, D) arrays viewed as (B, H, L, D), read in place; "
                        "also times the contiguous call (column f32/fa)")
    b.add_argument("--threads", type=_count(1, MAX_THREADS), default=None,
                   help="fastattn (and torch) threads (default: OpenMP's)")
    b.add_argument("--repeat", type=_count(1), default=3,
                   help="timed sweeps, the implementations compared run in turn (the "
                        "best kept); --options: sweeps of the calls compared (at least 7; "
                        "medians kept)")
    b.add_argument("--reference", action="store_true",
                   help="also time the NumPy reference (O(L*S) memory: not timed where its float64 "
                        "scores would take more than 3/4 of the memory)")
    b.add_argument("--no-torch", action="store_true", help="do not time PyTorch")
    b.add_argument("--no-memory", action="store_true",
                   help="grid: skip the peak-memory run (causal L=16384, ~10 s)")
    args = parser.parse_args(argv)
    if args.command == "bench":
        return bench(args)
    return main_job(args)


if __name__ == "__main__":
    sys.exit(main())
