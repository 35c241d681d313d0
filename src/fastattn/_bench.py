"""Timing for ``python -m fastattn bench``: one shape of the user's, the grid
of long-sequence speed targets, or the grid of model shapes (``--models``),
side by side with the NumPy reference and the peers PyTorch, ONNX Runtime,
OpenVINO and JAX.

Every figure is the best of a few runs in this process; compare the ratios,
which hold better than the times on a shared machine. The peers are timed when
installed (all optional): PyTorch's ``scaled_dot_product_attention`` under
``torch.no_grad()``, and ONNX Runtime's CPU ``com.microsoft`` contrib ops
``MultiHeadAttention`` (same heads for q and kv) and ``GroupQueryAttention``
(grouped heads, causal with the new rows last) in a one-node graph, inputs in
their ``(B, L, heads * D)`` layout prepared outside the timed call;
OpenVINO's ``ScaledDotProductAttention`` (opset 13) in a one-node model
compiled for the CPU with an f32 precision hint, a latency hint and the thread
count; JAX's ``jax.nn.dot_product_attention`` under ``jax.jit``, inputs in its
``(B, L, heads, D)`` layout on the device before the timed call. Every
implementation gets the same thread count, checked before it is timed (JAX,
whose CPU backend sizes its pool from the machine, runs with every thread of
the process pinned to that many cores where the machine has more), and each
peer's result is checked against fastattn's before it is timed. NumPy's matmul and the float32 FMA
peak (``tools/fma_peak.c``'s loop) are the FLOP-rate yardsticks (unset
OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE in the command for a fair matmul: they slow
a current OpenBLAS).
"""
import contextlib
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

import fastattn
from fastattn import _core, reference

SEED = 20261129


def best_time(fn, repeat, min_time=0.0, warm_up=True):
    """Best wall time of `repeat` runs of fn(), after one warm-up run (unless
    not warm_up); with min_time, more runs (up to 1000) until they add up to
    min_time seconds.
    A call of some microseconds right after another library's (whose threads
    spin on the cores for a while after its own work) reads up to 1.5x its
    time in a loop: more runs let every implementation show its time in a
    loop of calls, as a model's layers make them."""
    if warm_up:
        fn()  # page in the output, start the threads
    best, total, n = np.inf, 0.0, 0
    while n < max(1, repeat) or (total < min_time and n < 1000):
        t0 = time.perf_counter()
        fn()
        t = time.perf_counter() - t0
        best, total, n = min(best, t), total + t, n + 1
    return best


def ratios_alternated(fns, rounds):
    """Times of fns run in turn over `rounds` rounds (after one warm-up
    round), the first of each round rotating: per fn, the median of its
    times and the median over the rounds of its time over fns[0]'s time in
    the same round. The host's speed changes in steps; a step between two
    rounds falls on both terms of a round's ratio alike, where the best of
    each over all rounds can pair a fast phase of one with a slow phase of
    the other."""
    for fn in fns:
        fn()
    rounds = max(1, rounds)
    times = np.empty((rounds, len(fns)))
    for r in range(rounds):
        for n in range(len(fns)):
            m = (n + r) % len(fns)
            t0 = time.perf_counter()
            fns[m]()
            times[r, m] = time.perf_counter() - t0
    ratios = np.median(times / times[:, :1], axis=0)
    return list(np.median(times, axis=0)), list(ratios)


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


def onnxruntime_or_none():
    try:
        import onnx  # noqa: F401  (builds the one-node graphs)
        import onnxruntime
    except ImportError:
        return None
    return onnxruntime


def _ort_session(ort, model, threads):
    """An ONNX Runtime CPU session of `model` on `threads` intra-op threads
    (checked), one inter-op thread."""
    model.ir_version = 9
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])
    got = sess.get_session_options().intra_op_num_threads
    if got != threads:
        raise RuntimeError(f"onnxruntime runs {got} threads, not {threads}")
    return sess


def onnxruntime_softmax(x, threads, out=None):
    """A call of ONNX Runtime's Softmax (opset 13, last axis) on the float32
    array x, or None without onnxruntime. Its result comes from ONNX Runtime's
    own memory arena, which keeps the pages of earlier results mapped; with
    `out`, it writes into that array instead (IO binding), as
    fastattn.softmax(x, out=out) does."""
    ort = onnxruntime_or_none()
    if ort is None:
        return None
    from onnx import TensorProto, helper

    info = [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(x.shape)) for n in "xy"]
    graph = helper.make_graph([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], "softmax",
                              info[:1], info[1:])
    sess = _ort_session(ort, helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]),
                        threads)
    if out is None:
        return lambda: sess.run(["y"], {"x": x})[0]
    io = sess.io_binding()
    io.bind_cpu_input("x", x)
    io.bind_output("y", "cpu", 0, np.float32, list(out.shape), out.ctypes.data)

    def run():
        sess.run_with_iobinding(io)
        return out
    return run


def openvino_or_none():
    try:
        import openvino
    except Exception:  # (not installed, or an install that fails to import)
        return None
    return openvino


def jax_or_none():
    try:
        import jax
    except Exception:  # (not installed, or jax and jaxlib that do not match)
        return None
    return jax


class PinnedThreads:
    """Every thread of this process pinned to `threads` of its cores (Linux),
    as a context: for a peer whose thread pool follows the machine's cores
    (JAX's CPU backend). A no-op where the process may use no more cores than
    that, or where affinity cannot be set; `pinned` says which."""

    def __init__(self, threads):
        self.threads = threads
        self.saved = {}
        self.pinned = False

    @staticmethod
    def _tasks():
        try:
            return [int(t) for t in os.listdir("/proc/self/task")]
        except OSError:
            return []

    def __enter__(self):
        if not hasattr(os, "sched_getaffinity"):
            return self
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) <= self.threads:
            return self
        keep = set(cpus[:self.threads])
        self.full = set(cpus)
        for tid in self._tasks():
            try:
                self.saved[tid] = os.sched_getaffinity(tid)
                os.sched_setaffinity(tid, keep)
            except OSError:  # (a thread that ended meanwhile)
                pass
        self.pinned = True
        return self

    def check(self):
        """Raise unless every thread of the process runs on at most `threads`
        cores (new threads inherit their creator's cores)."""
        if not hasattr(os, "sched_getaffinity"):
            return
        for tid in self._tasks():
            try:
                n = len(os.sched_getaffinity(tid))
            except OSError:
                continue
            if n > self.threads:
                raise RuntimeError(f"thread {tid} may run on {n} cores, not {self.threads}")

    def __exit__(self, *exc):
        if not self.pinned:
            return
        for tid in self._tasks():  # (threads started meanwhile: the process's cores)
            try:
                os.sched_setaffinity(tid, self.saved.get(tid, self.full))
            except OSError:
                pass
        self.saved = {}
        self.pinned = False


IMPLEMENTATIONS = ("fastattn", "reference", "torch", "onnxruntime", "openvino", "jax")
PEERS = ("torch", "onnxruntime", "openvino", "jax")
_REFERENCE_MAX_SCORES = 2**24  # the reference's float64 score matrices, at most, per timed call


@dataclass(frozen=True)
class Problem:
    """One attention call: q (B, H, L, D), k and v (B, Hkv, S, D); `causal`
    bottom-right aligned (query i sees keys j <= i + S - L), `padding` a bool
    key-padding mask (B, 1, 1, S) with a fixed valid length per batch item."""
    B: int
    H: int
    Hkv: int
    L: int
    S: int
    D: int
    causal: bool = False
    padding: bool = False
    window: Optional[tuple] = None

    @property
    def gqa(self):
        return self.H != self.Hkv

    def label(self):
        heads = f"{self.H}/{self.Hkv}" if self.gqa else f"{self.H}"
        return (f"({self.B}, {heads}, {self.L}, {self.S}, {self.D})"
                + (" causal" if self.causal else "") + (" pad" if self.padding else "")
                + (f" window={self.window}" if self.window else ""))

    def flops(self):
        """Multiply-adds x 2 of the two products over the allowed keys."""
        if self.causal:
            p0 = self.S - self.L  # row i sees min(S, i + p0 + 1) keys
            keys = sum(min(self.S, i + p0 + 1) for i in range(self.L))
        else:
            keys = self.L * self.S
        return 4.0 * self.B * self.H * keys * self.D

    def inputs(self, seed=0):
        """q, k, v and the mask (None without padding), from a fixed seed."""
        q = _randn((self.B, self.H, self.L, self.D), seed)
        k = _randn((self.B, self.Hkv, self.S, self.D), seed + 1)
        v = _randn((self.B, self.Hkv, self.S, self.D), seed + 2)
        mask = None
        if self.padding:  # batch item b keeps its first S - (b * S) // (2 B) keys
            valid = self.S - (np.arange(self.B) * self.S) // (2 * self.B)
            mask = (np.arange(self.S) < valid[:, None])[:, None, None, :]
        return q, k, v, mask

    def runner(self, impl, threads, seed=0):
        """(fn, factor): a no-argument callable running this call with `impl` on
        `threads` threads, and the factor its time is multiplied by (> 1 where
        the reference, O(L S) in memory, runs on a slice of the heads); None
        where `impl` is not installed or cannot express the call."""
        q, k, v, mask = self.inputs(seed)
        if impl == "fastattn":
            fastattn.set_num_threads(threads)
            kw = {"is_causal": self.causal, "enable_gqa": self.gqa, "window": self.window}
            return (lambda: fastattn.scaled_dot_product_attention(q, k, v, mask, **kw)), 1.0
        if impl == "reference":
            return self._reference(q, k, v, mask, threads)
        if impl == "torch":
            return self._torch(q, k, v, mask, threads)
        if impl == "onnxruntime":
            return self._onnxruntime(q, k, v, mask, threads)
        if impl == "openvino":
            return self._openvino(q, k, v, mask, threads)
        if impl == "jax":
            return self._jax(q, k, v, mask, threads)
        raise ValueError(f"unknown implementation {impl!r}; expected one of {IMPLEMENTATIONS}")

    def _reference(self, q, k, v, mask, threads):
        from threadpoolctl import threadpool_limits

        group = self.H // self.Hkv
        kv_heads = max(1, min(self.Hkv, _REFERENCE_MAX_SCORES // (self.L * self.S * group)))
        batch = max(1, min(self.B, _REFERENCE_MAX_SCORES // (self.L * self.S * group * kv_heads)))
        if kv_heads < self.Hkv:
            batch = 1
        q, k, v = q[:batch, :kv_heads * group], k[:batch, :kv_heads], v[:batch, :kv_heads]
        mask = None if mask is None else mask[:batch]
        kw = {"is_causal": self.causal, "enable_gqa": self.gqa, "window": self.window}

        def run():
            with threadpool_limits(threads, user_api="blas"):
                return reference.scaled_dot_product_attention(q, k, v, mask, **kw)
        return run, (self.B * self.H) / (batch * kv_heads * group)

    def _torch(self, q, k, v, mask, threads):
        torch = torch_or_none()
        if torch is None or self.window is not None:
            return None
        torch.set_num_threads(threads)
        if torch.get_num_threads() != threads:
            raise RuntimeError(f"torch runs {torch.get_num_threads()} threads, not {threads}")
        tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))
        kw = {"enable_gqa": self.gqa}
        if mask is not None:
            kw["attn_mask"] = torch.from_numpy(mask)
            if self.causal:
                return None
        elif self.causal and self.L == self.S:
            kw["is_causal"] = True
        elif self.causal:  # torch's is_causal is top-left: an explicit bottom-right mask
            kw["attn_mask"] = torch.from_numpy(
                np.arange(self.S)[None, :] <= np.arange(self.L)[:, None] + (self.S - self.L))
        sdpa = torch.nn.functional.scaled_dot_product_attention

        def run():
            with torch.no_grad():
                return sdpa(tq, tk, tv, **kw)
        return run, 1.0

    def _onnxruntime(self, q, k, v, mask, threads):
        ort = onnxruntime_or_none()
        if ort is None or self.window is not None:
            return None
        from onnx import TensorProto, helper

        B, H, Hkv, L, S, D = self.B, self.H, self.Hkv, self.L, self.S, self.D

        def bld(a):  # (B, heads, n, D) -> (B, n, heads * D)
            return np.ascontiguousarray(a.transpose(0, 2, 1, 3).reshape(a.shape[0], a.shape[2], -1))

        def info(name, elem, shape):
            return helper.make_tensor_value_info(name, elem, shape)

        F, I32 = TensorProto.FLOAT, TensorProto.INT32
        scale = 1.0 / math.sqrt(D)
        if not self.gqa:
            if self.causal and (L != S or mask is not None):
                return None  # unidirectional is top-left, and not with a padding mask here
            names = ["query", "key", "value"]
            ins = [info("query", F, [B, L, H * D]), info("key", F, [B, S, H * D]),
                   info("value", F, [B, S, H * D])]
            feed = {"query": bld(q), "key": bld(k), "value": bld(v)}
            if mask is not None:
                names += ["", "key_padding_mask"]
                ins.append(info("key_padding_mask", I32, [B, S]))
                feed["key_padding_mask"] = np.ascontiguousarray(mask[:, 0, 0, :], np.int32)
            node = helper.make_node("MultiHeadAttention", names, ["output"],
                                    domain="com.microsoft", num_heads=H, scale=scale,
                                    unidirectional=int(self.causal))
            outs = ["output"]
        else:
            if mask is not None or not (self.causal or L == 1):
                return None  # GroupQueryAttention: causal, the L new rows last
            P = S - L  # the cache before the new rows
            names = ["query", "key", "value", "past_key", "past_value", "seqlens_k",
                     "total_sequence_length"]
            ins = [info("query", F, [B, L, H * D]), info("key", F, [B, L, Hkv * D]),
                   info("value", F, [B, L, Hkv * D]), info("past_key", F, [B, Hkv, P, D]),
                   info("past_value", F, [B, Hkv, P, D]), info("seqlens_k", I32, [B]),
                   info("total_sequence_length", I32, [])]
            feed = {"query": bld(q), "key": bld(k[:, :, P:]), "value": bld(v[:, :, P:]),
                    "past_key": np.ascontiguousarray(k[:, :, :P]),
                    "past_value": np.ascontiguousarray(v[:, :, :P]),
                    "seqlens_k": np.full(B, S - 1, np.int32),
                    "total_sequence_length": np.array(S, np.int32)}
            node = helper.make_node("GroupQueryAttention", names,
                                    ["output", "present_key", "present_value"],
                                    domain="com.microsoft", num_heads=H, kv_num_heads=Hkv,
                                    scale=scale)
            outs = ["output", "present_key", "present_value"]
        graph = helper.make_graph([node], "attention", ins,
                                  [helper.make_tensor_value_info(n, F, None) for n in outs])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                        helper.make_opsetid("com.microsoft", 1)])
        sess = _ort_session(ort, model, threads)
        return (lambda: sess.run(["output"], feed)), 1.0

    def _bottom_right(self):
        """The causal mask (L, S), bottom-right aligned (True: allowed)."""
        return np.arange(self.S)[None, :] <= np.arange(self.L)[:, None] + (self.S - self.L)

    def _openvino(self, q, k, v, mask, threads):
        ov = openvino_or_none()
        if ov is None or self.window is not None:
            return None
        import openvino.opset13 as ops

        B, H, Hkv, L, S, D = self.B, self.H, self.Hkv, self.L, self.S, self.D
        G = H // Hkv
        # grouped heads: q as (B, Hkv, G, L, D) against k and v (B, Hkv, 1, S, D),
        # which broadcast over the group (no copies of k and v)
        qs, ks = ((B, Hkv, G, L, D), (B, Hkv, 1, S, D)) if self.gqa else ((B, H, L, D),
                                                                           (B, H, S, D))
        pq, pk, pv = (ops.parameter(shape, np.float32) for shape in (qs, ks, ks))
        allowed = None
        if mask is not None:
            allowed = mask if not self.causal else mask & self._bottom_right()
        elif self.causal and L != S:
            allowed = self._bottom_right()
        if allowed is not None and self.gqa and allowed.ndim == 4:
            allowed = allowed[:, :, None]  # (B, 1, 1, S) -> (B, 1, 1, 1, S)
        args = [pq, pk, pv] + ([ops.constant(np.ascontiguousarray(allowed))] if allowed is not None
                               else [])
        node = ops.scaled_dot_product_attention(*args, causal=self.causal and allowed is None)
        model = ov.Model([node], [pq, pk, pv])
        compiled = ov.Core().compile_model(model, "CPU", {
            "INFERENCE_PRECISION_HINT": "f32", "PERFORMANCE_HINT": "LATENCY",
            "INFERENCE_NUM_THREADS": threads})
        got = int(compiled.get_property("INFERENCE_NUM_THREADS"))
        if got != threads:
            raise RuntimeError(f"openvino runs {got} threads, not {threads}")
        request = compiled.create_infer_request()
        feed = [np.ascontiguousarray(a.reshape(shape)) for a, shape in ((q, qs), (k, ks), (v, ks))]
        for i, a in enumerate(feed):  # (set once, read in place: an infer() with inputs
            request.set_input_tensor(i, ov.Tensor(a, shared_memory=True))  # took 0.1 ms more)

        def run(feed=feed):  # (feed: the tensors' memory lives as long as run)
            request.infer()
            return request.get_output_tensor(0).data
        return run, 1.0

    def _jax(self, q, k, v, mask, threads):
        jax = jax_or_none()
        if jax is None or self.window is not None:
            return None
        allowed = None
        if mask is not None:
            allowed = mask if not self.causal else mask & self._bottom_right()
        elif self.causal and self.L != self.S:  # (is_causal would be top-left)
            allowed = self._bottom_right()[None, None]
        is_causal = self.causal and allowed is None
        cpu = jax.devices("cpu")[0]  # (the CPU even where a GPU build of jaxlib is installed)
        blhd = [jax.device_put(np.ascontiguousarray(a.transpose(0, 2, 1, 3)), cpu)
                for a in (q, k, v)]
        if allowed is not None:
            blhd.append(jax.device_put(allowed, cpu))
        f = jax.jit(lambda q, k, v, m=None: jax.nn.dot_product_attention(
            q, k, v, mask=m, is_causal=is_causal))
        def run():  # (time it inside PinnedThreads(threads): time_problem does)
            return f(*blhd).block_until_ready()
        return run, 1.0


def as_bhld(impl, result, problem):
    """A result of `impl` as a NumPy array (B, H, L, D): ONNX Runtime's list
    of (B, L, H * D), JAX's (B, L, H, D), OpenVINO's (B, Hkv, H / Hkv, L, D)
    for grouped heads, PyTorch's tensor."""
    p = problem
    if impl == "onnxruntime":
        return np.asarray(result[0]).reshape(p.B, p.L, p.H, p.D).transpose(0, 2, 1, 3)
    if impl == "jax":
        return np.asarray(result).transpose(0, 2, 1, 3)
    got = np.asarray(result)
    return got.reshape(p.B, p.H, p.L, p.D) if impl == "openvino" else got


def check_peer(impl, result, want, problem, rtol=1e-4, atol=1e-4):
    """Raise unless a result of `impl` (one call) equals fastattn's `want`
    within float32 rounding (a wrong mask or layout is far beyond it)."""
    got = as_bhld(impl, result, problem)
    if not np.allclose(got, want, rtol=rtol, atol=atol):
        raise RuntimeError(f"{impl} does not compute fastattn's result on {problem.label()} "
                           f"(max |difference| {np.abs(got - want).max():.3g})")


def time_problem(problem, impls=IMPLEMENTATIONS, threads=2, repeat=3, min_time=0.05):
    """Seconds of each implementation on `problem`: a dict impl -> seconds or
    None (not installed, or no equivalent). The reference runs once. Each
    peer's result is checked against fastattn's first (check_peer). The
    others are timed in `repeat` sweeps, each implementation in turn within a
    sweep (after one warm-up call each): a turn gives each its best call of
    a run of at least one call and min_time seconds, and the result is each
    one's best over the sweeps. A phase of the host's (another
    virtual machine taking a core for a while) then falls on one sweep of
    every implementation rather than on all the calls of one."""
    times: Dict[str, Optional[float]] = {}
    timed = []  # (impl, fn, factor): the implementations timed in sweeps
    want = None
    for impl in impls:
        if impl in PEERS and want is None:
            q, k, v, mask = problem.inputs()
            want = fastattn.scaled_dot_product_attention(
                q, k, v, mask, is_causal=problem.causal, enable_gqa=problem.gqa,
                window=problem.window)
        try:
            r = problem.runner(impl, threads)
            if r is None:
                times[impl] = None
                continue
            fn, factor = r
            with _pinned_for(impl, threads) as pin:
                if pin is not None:
                    pin.check()
                if impl in PEERS:
                    check_peer(impl, fn(), want, problem)
                if impl == "reference":
                    times[impl] = best_time(fn, 1) * factor
                    continue
                fn()  # warm up: page in the output, start the threads
            timed.append((impl, fn, factor))
            times[impl] = np.inf
        except Exception as exc:  # a peer that fails, disagrees or cannot set its threads
            if impl not in PEERS:
                raise
            _not_timed(impl, problem, exc)
            times[impl] = None
    for _ in range(max(1, repeat)):
        for impl, fn, factor in timed:
            if times[impl] is None:  # (failed in an earlier sweep)
                continue
            # Each library's worker threads spin for a while after its calls
            # (ONNX Runtime's and JAX's some milliseconds): the next one's
            # threads would share the cores with them (OpenVINO's calls took
            # twice their time right after ONNX Runtime's). Let them settle;
            # and a fastattn thread kept waiting by them counts the machine as
            # loaded, keeping fastattn's next calls to one thread for a while:
            # that load is this command's own, so it is forgotten.
            time.sleep(0.1)
            if impl == "fastattn":
                _core.set_machine_busy(0)
            try:
                with _pinned_for(impl, threads):
                    t = best_time(fn, 1, min_time=min_time, warm_up=False)
                times[impl] = min(times[impl], t * factor)
            except Exception as exc:
                if impl not in PEERS:
                    raise
                _not_timed(impl, problem, exc)
                times[impl] = None
    return times


def _pinned_for(impl, threads):
    """PinnedThreads(threads) for JAX, whose pool follows the machine's
    cores; else a context that does nothing (and gives None)."""
    return PinnedThreads(threads) if impl == "jax" else contextlib.nullcontext()


def _not_timed(impl, problem, exc):
    first = str(exc).strip().splitlines()
    print(f"  {impl} not timed on {problem.label()}: {type(exc).__name__}: "
          f"{first[-1] if first else ''}", file=sys.stderr, flush=True)


def vs_faster_peer(times):
    """(ratio, peer): the faster peer's time over fastattn's, or (None, None)."""
    peers = [(times[p], p) for p in PEERS if times.get(p)]
    if not peers:
        return None, None
    t, p = min(peers)
    return t / times["fastattn"], p


def geomean(values):
    values = [v for v in values if v]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


# The model grid: (case, Problem).
MODEL_CASES = (
    ("sentence encoder", Problem(8, 12, 12, 32, 32, 32, padding=True)),
    ("BERT-base", Problem(16, 12, 12, 256, 256, 64, padding=True)),
    ("ViT-L/14", Problem(4, 16, 16, 257, 257, 64)),
    ("Whisper-small encoder", Problem(1, 12, 12, 1500, 1500, 64)),
    ("cross-attention decode", Problem(1, 12, 12, 1, 1500, 64)),
    ("cross-attn, 8 heads", Problem(1, 8, 8, 1, 1500, 64)),
    ("MHA decode", Problem(1, 12, 12, 1, 1024, 64)),
    ("small LLM decode", Problem(1, 14, 2, 1, 256, 64)),
    ("small LLM prefill", Problem(1, 14, 2, 1024, 1024, 64, causal=True)),
    ("8B-class decode", Problem(1, 32, 8, 1, 8192, 128)),
    ("batched decode", Problem(8, 32, 8, 1, 2048, 128)),
    ("chunked prefill", Problem(1, 32, 8, 64, 2048, 128, causal=True)),
    ("D = 96", Problem(1, 32, 32, 2048, 2048, 96, causal=True)),
    ("tiny call", Problem(1, 1, 1, 4, 4, 8)),
)


def cpu_name():
    """The CPU's model name (Linux /proc/cpuinfo; else platform.processor())."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def fma_peaks(threads, iters=20_000_000):
    """{'AVX2': GFLOP/s, 'AVX-512': GFLOP/s} of float32 FMAs on `threads`
    threads (best of three), the widths this CPU lacks left out."""
    peaks = {}
    for name, lanes in (("AVX2", 8), ("AVX-512", 16)):
        got = [_core.fma_peak(lanes, threads, iters) for _ in range(3)]
        if got[0] is not None:
            peaks[name] = max(g for g in got if g is not None)
    return peaks


def environment_line(threads):
    peers = (("torch", torch_or_none()), ("onnxruntime", onnxruntime_or_none()),
             ("openvino", openvino_or_none()), ("jax", jax_or_none()))
    versions = ", ".join(f"{name} {str(getattr(m, '__version__', 'absent')).split('-')[0]}"
                         for name, m in peers)  # (openvino's: "2025.3.0-19807-<hash>-...")
    return (f"{cpu_name()}; fastattn {fastattn.__version__} "
            f"({fastattn.show_config(mode='dicts')['simd']} kernels), {versions}; "
            f"{threads} threads for each")


_FIRST_CALL_SCRIPT = """
import time, numpy as np, fastattn
q = np.ones((1, 1, 4, 8), np.float32)
t0 = time.perf_counter(); fastattn.scaled_dot_product_attention(q, q, q)
t1 = time.perf_counter(); fastattn.scaled_dot_product_attention(q, q, q)
t2 = time.perf_counter()
print(t1 - t0, t2 - t1)
"""


def first_call_extra(runs=3):
    """Seconds the first call in a fresh process (fastattn imported) costs
    above the second, best of `runs` processes."""
    best = np.inf
    for _ in range(runs):
        res = subprocess.run([sys.executable, "-c", _FIRST_CALL_SCRIPT], capture_output=True,
                             text=True, check=True)
        first, second = (float(x) for x in res.stdout.split())
        best = min(best, first - second)
    return best


_SHORT = {"torch": "torch", "onnxruntime": "onnxrt", "openvino": "openvino", "jax": "jax"}


def models(repeat=3, threads=2, cases=None, out=None):
    """Time the model grid (MODEL_CASES, or those named in `cases`) with every
    implementation on `threads` threads and print one row per case: times,
    fastattn's speed-up over the fastest peer (PyTorch, ONNX Runtime, OpenVINO, JAX) and
    over the reference; then the geometric mean and the per-call targets.
    Returns the rows (case, problem, times)."""
    out = sys.stdout if out is None else out
    chosen = [(n, p) for n, p in MODEL_CASES if cases is None or n in cases]
    rows = []
    for name, prob in chosen:
        t = time_problem(prob, threads=threads, repeat=repeat)
        rows.append((name, prob, t))
        print(f"  {name}: " + ", ".join(f"{k} {v * 1e3:.3f} ms" for k, v in t.items() if v),
              file=sys.stderr, flush=True)
    print(environment_line(threads), file=out)

    def cell(t):
        return f"{'-':>11}" if not t else (f"{t * 1e6:>9.0f}us" if t < 1e-3 else
                                            f"{t * 1e3:>9.2f}ms")

    print(f"{'case':<23}{'(B, heads, L, S, D)':<31}{'fastattn':>11}{'reference':>11}"
          f"{'torch':>11}{'onnxrt':>11}{'openvino':>11}{'jax':>11}  {'vs faster peer':<17}"
          f"{'vs ref':>7}", file=out)
    ratios = []
    for name, prob, t in rows:
        r, peer = vs_faster_peer(t)
        ratios.append(r)
        ref = t["reference"] / t["fastattn"] if t.get("reference") else None
        print(f"{name:<23}{prob.label():<31}{cell(t['fastattn'])}{cell(t['reference'])}"
              f"{cell(t['torch'])}{cell(t['onnxruntime'])}{cell(t.get('openvino'))}"
              f"{cell(t.get('jax'))}"
              f"  {(f'{r:.2f}x ' + _SHORT[peer]) if r else '-':<17}"
              f"{(f'{ref:.1f}x' if ref else '-'):>7}",
              file=out)
    g = geomean(ratios)
    met = [r >= 1.0 for r in ratios if r]
    print(f"geometric mean vs the faster peer: {g:.2f}x (goal >= 1.4x); cases >= 1.0x: "
          f"{sum(met)} of {len(met)}" if g else "no peer installed: no ratios", file=out)
    tiny = [t for n, _, t in rows if n == "tiny call"]
    if tiny and tiny[0].get("torch"):
        r = tiny[0]["fastattn"] / tiny[0]["torch"]
        print(f"tiny call: {r:.2f}x PyTorch's time (goal <= 1.5x)", file=out)
    if cases is None or "tiny call" in cases:
        fastattn.set_num_threads(None)
        extra = first_call_extra()
        print(f"first call in a fresh process: {extra * 1e3:.2f} ms more than a warm one "
              f"(goal <= 2 ms)", file=out)
    return rows


KV_DTYPES = ("float32", "float16", "bfloat16", "q8_0", "q4_0")
QUANTIZED = ("q8_0", "q4_0")  # GGUF block formats (fastattn.quantize_kv)
LAYOUTS = ("bhld", "blhd")


def kv_dtype(name):
    """The NumPy dtype named by --kv-dtype (bfloat16: ml_dtypes', which must be installed)."""
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def kv_operand(a, kv, layout):
    """`a` (float32 (B, H, n, D)) as fastattn is handed k or v: converted to
    `kv` (a dtype name of KV_DTYPES, or a block format of QUANTIZED:
    quantized along D), in `layout` (see as_layout; a quantized (B, n, H, D)
    cache is viewed as (B, H, n, D) the same way)."""
    if kv in QUANTIZED:
        if layout == "bhld":
            return fastattn.quantize_kv(a, kv)
        return fastattn.quantize_kv(np.ascontiguousarray(a.swapaxes(1, 2)), kv).swapaxes(1, 2)
    return as_layout(a.astype(kv_dtype(kv)), layout)


def as_layout(a, layout):
    """`a` (B, H, n, D) as the kernel is handed it: itself ("bhld"), or a
    (B, n, H, D) array viewed as (B, H, n, D) ("blhd", a projection's output
    layout; read in place, not copied)."""
    if layout == "bhld":
        return a
    return np.ascontiguousarray(a.swapaxes(1, 2)).swapaxes(1, 2)


def time_sdpa(batch, heads, L, S, D, causal=False, window=None, repeat=3,
              peers=("reference", "torch"), kv_heads=None, kv="float32", layout="bhld"):
    """Seconds of fastattn and its peers on q (batch, heads, L, D), k and v
    (batch, kv_heads, S, D) (kv_heads < heads: grouped-query attention,
    enable_gqa=True): a dict implementation -> seconds, None where a peer
    is not installed or has no equivalent (PyTorch: windows, causal L != S).

    `kv` (KV_DTYPES: "float32", "float16", "bfloat16", or a GGUF block
    format, "q8_0", "q4_0") is the dtype of k and v and `layout` ("bhld",
    "blhd": see as_layout) that of q, k and v for fastattn;
    when either differs from float32 "bhld", "fastattn-f32" is also timed, on
    the same values as contiguous float32 arrays (the peers always get those).
    The two fastattn calls alternate, so that a drift of the machine's speed
    moves both."""
    kv_heads = heads if kv_heads is None else kv_heads
    q, k, v = _randn((batch, heads, L, D), 0), _randn((batch, kv_heads, S, D), 1), \
        _randn((batch, kv_heads, S, D), 2)
    gqa = kv_heads != heads
    kw = {"is_causal": causal, "window": window, "enable_gqa": gqa}
    qa, ka, va = as_layout(q, layout), kv_operand(k, kv, layout), kv_operand(v, kv, layout)
    if kv != "float32":  # the same values for every implementation
        k, v = (np.ascontiguousarray(np.asarray(x, dtype=np.float32)) for x in (ka, va))
    base = kv != "float32" or layout != "bhld"
    runs = {"fastattn": lambda: fastattn.scaled_dot_product_attention(qa, ka, va, **kw)}
    if base:
        runs["fastattn-f32"] = lambda: fastattn.scaled_dot_product_attention(q, k, v, **kw)
    times: Dict[str, Optional[float]] = {name: np.inf for name in runs}
    for fn in runs.values():
        fn()  # warm up
    for _ in range(max(1, repeat)):
        for name, fn in runs.items():
            times[name] = min(times[name], best_time(fn, 1))
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
    """rows: (label, times dict); one line each, with speed-up columns (and,
    where a row has "fastattn-f32", the float32 contiguous call's time and its
    ratio to fastattn's); to `out` (default: sys.stdout at call time)."""
    out = sys.stdout if out is None else out
    base = any(t.get("fastattn-f32") for _, t in rows)
    print(f"{'case':<42}{'fastattn':>10}{'reference':>11}{'torch':>10}"
          f"{'ref/fa':>8}{'torch/fa':>9}" + (f"{'fa-f32':>10}{'f32/fa':>8}" if base else ""),
          file=out)

    def cell(t):
        return f"{t * 1e3:>8.1f}ms" if t else f"{'-':>10}"

    for label, t in rows:
        fa, ref, tor = t["fastattn"], t.get("reference"), t.get("torch")
        f32 = t.get("fastattn-f32")
        print(f"{label:<42}{cell(fa)}{cell(ref):>11}{cell(tor)}"
              f"{(f'{ref / fa:7.1f}x' if ref else '       -'):>8}"
              f"{(f'{tor / fa:8.1f}x' if tor else '        -'):>9}"
              + ((f"{cell(f32)}" + (f"{f32 / fa:7.2f}x" if f32 else "       -")) if base else ""),
              file=out)


def _status_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise OSError(f"{field} not in /proc/self/status")


def extra_peak_kib(call):
    """KiB by which ``call()`` raises this process's peak resident set size
    above its resident size just before the call.

    On Linux the peak is VmHWM in /proc/self/status, first reset to the
    current size (by writing 5 to /proc/self/clear_refs, see proc(5)):
    getrusage's ru_maxrss cannot be reset, and a process started with fork
    or vfork and exec begins with its parent's peak in it. Elsewhere the
    growth of ru_maxrss (bytes on macOS, KiB on other systems), which only
    sees a peak above every earlier one."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        before = _status_kib("VmRSS")
        call()
        return _status_kib("VmHWM") - before
    except OSError:
        import resource
        unit = 1024 if sys.platform == "darwin" else 1
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // unit
        call()
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // unit - before


_PEAK_SCRIPT = """
import sys
import numpy as np, fastattn
from fastattn._bench import extra_peak_kib
L = int(sys.argv[1])
rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal((1, 8, L, 64), dtype=np.float32) for _ in range(3))
out = np.ones_like(q)
print(extra_peak_kib(lambda: fastattn.causal_attention(q, k, v, out=out)))
"""


def peak_extra_mib(L=16384):
    """MiB that causal attention (B=1, H=8, L=S, D=64) adds to the peak RSS of
    a process that already holds its inputs and output."""
    res = subprocess.run([sys.executable, "-c", _PEAK_SCRIPT, str(L)], capture_output=True,
                         text=True, check=True)
    return int(res.stdout.strip()) / 1024


# The backward's shapes: (B, H, L, S, D, causal).
BACKWARD_CASES = [(1, 8, 2048, 2048, 64, True), (1, 8, 2048, 2048, 64, False),
                  (1, 8, 2048, 2048, 128, True), (1, 12, 1500, 1500, 64, False)]

_BACKWARD_PEAK_SCRIPT = """
import sys
import numpy as np, fastattn
from fastattn._bench import extra_peak_kib
L = int(sys.argv[1])
rng = np.random.default_rng(0)
q, k, v, do = (rng.standard_normal((1, 4, L, 64), dtype=np.float32) for _ in range(4))
out = np.ones_like(q)
o, lse = fastattn.scaled_dot_product_attention(q, k, v, is_causal=True, return_lse=True)
print(extra_peak_kib(lambda: fastattn.causal_attention(q, k, v, out=out)),
      extra_peak_kib(lambda: fastattn.attention_backward(do, q, k, v, o, lse, is_causal=True)))
"""


def backward_peak_extra_mib(L=8192):
    """(MiB the causal forward adds to the peak RSS of a process that holds
    its inputs, MiB the backward adds: B=1, H=4, L=S, D=64)."""
    res = subprocess.run([sys.executable, "-c", _BACKWARD_PEAK_SCRIPT, str(L)],
                         capture_output=True, text=True, check=True)
    forward, backward = (int(x) / 1024 for x in res.stdout.split())
    return forward, backward


def time_backward(B, H, L, S, D, causal, repeat=3, threads=2):
    """Seconds of fastattn.attention_backward and of PyTorch's backward of
    its scaled_dot_product_attention (forward + backward minus forward; None
    without torch) on `threads` threads, each checked against the other's
    gradients first."""
    q, k, v, do = (_randn(shape, SEED + n) for n, shape in
                   enumerate([(B, H, L, D), (B, H, S, D), (B, H, S, D), (B, H, L, D)]))
    fastattn.set_num_threads(threads)
    try:
        o, lse = fastattn.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                       return_lse=True)
        grads = fastattn.attention_backward(do, q, k, v, o, lse, is_causal=causal)
        fa = best_time(lambda: fastattn.attention_backward(do, q, k, v, o, lse,
                                                           is_causal=causal), repeat)
    finally:
        fastattn.set_num_threads(None)
    torch = torch_or_none()
    if torch is None:
        return fa, None
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        tq, tk, tv = (torch.from_numpy(x).requires_grad_() for x in (q, k, v))
        tdo = torch.from_numpy(do)
        sdpa = torch.nn.functional.scaled_dot_product_attention

        def forward():
            with torch.no_grad():
                sdpa(tq, tk, tv, is_causal=causal)

        def both():
            for x in (tq, tk, tv):
                x.grad = None
            sdpa(tq, tk, tv, is_causal=causal).backward(tdo)

        both()
        for mine, theirs in zip(grads, (tq.grad, tk.grad, tv.grad)):
            theirs = theirs.numpy()
            np.testing.assert_allclose(mine, theirs, rtol=1e-3,
                                       atol=1e-4 * float(np.max(np.abs(theirs))))
        tb = best_time(both, repeat) - best_time(forward, repeat)
    finally:
        torch.set_num_threads(before)
    return fa, tb


def backward_grid(repeat=3, threads=2, memory=True, out=None):
    """Time the backward's shapes against PyTorch's CPU backward and print
    one row each: times, the speed-up, the FLOP rate (the backward counted
    as 2.5 times the forward's products, as FlashAttention counts it) and
    its fraction of the FMA peak; then the peak memory of a long causal
    backward next to the forward's."""
    out = sys.stdout if out is None else out
    peak = max(fma_peaks(threads).values() or [float("nan")])
    print(environment_line(threads), file=out)
    print(f"FMA peak: {peak:.0f} GFLOP/s on {threads} threads", file=out)
    print(f"{'(B, H, L, S, D)':<28}{'fastattn':>10}{'torch':>10}{'speed-up':>10}"
          f"{'GFLOP/s':>9}{'of peak':>9}", file=out)
    ups = []
    for B, H, L, S, D, causal in BACKWARD_CASES:
        fa, tb = time_backward(B, H, L, S, D, causal, repeat, threads)
        rate = 2.5 * 4 * B * H * L * S * D * (0.5 if causal else 1.0) / fa / 1e9
        if tb:
            ups.append(tb / fa)
        print(f"{str((B, H, L, S, D)) + (' causal' if causal else ''):<28}"
              f"{fa * 1e3:8.1f}ms" + (f"{tb * 1e3:8.1f}ms{tb / fa:9.2f}x" if tb else
                                      f"{'-':>10}{'-':>10}")
              + f"{rate:9.0f}{rate / peak:9.0%}", file=out)
    if ups:
        print(f"geometric mean speed-up over torch: {geomean(ups):.2f}x", file=out)
    if memory:
        fwd, bwd = backward_peak_extra_mib()
        grads = 3 * 4 * 8192 * 64 * 4 / 2**20  # dq, dk, dv of that shape
        print(f"peak memory, causal L=S=8192 (H=4, D=64) above the inputs: forward "
              f"{fwd:.0f} MiB, backward {bwd:.0f} MiB (of which the gradients: {grads:.0f} "
              f"MiB)", file=out)


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

    sdpa, ratios = {}, []
    for D in (64, 128):
        for L in (1024, 4096):
            for causal in (False, True):
                t = time_problem(Problem(1, 8, 8, L, L, D, causal=causal),
                                 impls=("fastattn",) + PEERS, threads=threads,
                                 repeat=repeat)
                sdpa[D, L, causal] = t["fastattn"]
                label = f"SDPA H=8 D={D} L=S={L}{' causal' if causal else ''}"
                r, peer = vs_faster_peer(t)
                ratios.append(r)
                if r:
                    row(label + " vs faster peer", f"{t['fastattn'] * 1e3:.0f} ms, {r:.2f}x {peer}",
                        ">= 1.0x", r >= 1.0)
                else:
                    row(label, f"{t['fastattn'] * 1e3:.0f} ms (no peer installed)", ">= 1.0x",
                        None)
    g = geomean(ratios)
    row("SDPA grid: geometric mean vs faster peer", f"{g:.2f}x" if g else "-", ">= 1.15x",
        g >= 1.15 if g else None)
    peaks = fma_peaks(threads)
    rate = Problem(1, 8, 8, 4096, 4096, 128).flops() / sdpa[128, 4096, False]
    for name, peak in peaks.items():
        row(f"SDPA L=S=4096 D=128 / {name} FMA peak",
            f"{rate / 1e9:.1f} / {peak:.1f} GFLOP/s = {rate / 1e9 / peak:.0%}", ">= 72%",
            rate / 1e9 / peak >= 0.72)
    a = _randn((4096, 4096), 3)
    t_mm = best_time(lambda: a @ a, repeat)
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
            row(f"softmax {shape} vs torch", f"{t_t / t_sm:.2f}x", "-", None)
        if shape == (16384, 2048) and onnxruntime_or_none() is not None:
            # A new result each call: ONNX Runtime's memory comes from its
            # arena, fastattn's from the memory of the results before it
            # (set_result_cache), both already mapped. Into the same array
            # both write the same bytes.
            # (Each timed on its own: on two cores the threads one library
            # leaves spinning slow the other's next call.)
            dst = np.zeros_like(x)
            f_ort, f_ort_out = onnxruntime_softmax(x, threads), onnxruntime_softmax(x, threads, dst)
            np.testing.assert_allclose(f_ort(), fastattn.softmax(x), rtol=1e-5, atol=1e-7)
            t_o, t_o_out = best_time(f_ort, repeat), best_time(f_ort_out, repeat)
            time.sleep(0.1)
            t_fa = best_time(lambda: fastattn.softmax(x), repeat)
            t_fa_out = best_time(lambda: fastattn.softmax(x, out=dst), repeat)
            row(f"softmax {shape} vs onnxruntime", f"{t_o / t_fa:.2f}x", "-", None)
            row(f"softmax {shape} into an array vs onnxruntime", f"{t_o_out / t_fa_out:.2f}x",
                ">= 1.0x", t_o_out / t_fa_out >= 1.0)

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

    print(environment_line(threads), file=out)
    print("FMA peaks (tools/fma_peak.c's loop): " + (", ".join(
        f"{name} {g:.1f} GFLOP/s" for name, g in peaks.items()) or "none measured"), file=out)
    if os.environ.get("OPENBLAS_CORETYPE") or os.environ.get("OPENBLAS_L2_SIZE"):
        print("note: OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE are set; NumPy's matmul is slowed",
              file=out)
    width = max(len(r[0]) for r in rows)
    print(f"{'target':<{width}}  {'measured':<34}{'goal':<10}met", file=out)
    for case, measured, goal, met in rows:
        print(f"{case:<{width}}  {measured:<34}{goal:<10}{met}", file=out)
    return rows


def options_grid(repeat=3, L=4096, heads=8, D=128, threads=2, out=None):
    """Causal attention with softcap, ALiBi and sinks against none; 16 packed
    documents by segment ids against dense bool masks; varlen_attention over
    16 sequences of 16..L/4 tokens against separate calls and the padded
    batch. Each group ends with its floor, the same work as contiguous
    separate problems (the documents as one batch; each sequence's own
    arrays), which no packed form can beat by more than its layout's cost:
    the padded batch over that floor bounds varlen's gain. Each group of
    calls compared runs in turn over max(7, repeat) rounds
    (ratios_alternated): a row's time is its median, its ratio the median of
    the per-round ratios. Prints (seconds, ratio) rows; returns them as a
    list."""
    out = sys.stdout if out is None else out
    rounds = max(7, repeat)
    fastattn.set_num_threads(threads)
    q, k, v = (_randn((1, heads, L, D), s) for s in range(3))
    options: List[Tuple[str, Dict[str, Any]]] = [
        ("softcap=30", {"softcap": 30.0}),
        ("alibi_slopes", {"alibi_slopes": 2.0 ** -np.arange(1, heads + 1)}),
        ("sinks", {"sinks": np.zeros(heads)})]
    times, ratios = ratios_alternated(
        [lambda: fastattn.causal_attention(q, k, v)]
        + [lambda kw=kw: fastattn.causal_attention(q, k, v, **kw) for _, kw in options], rounds)
    rows = [("causal, no option", times[0], 1.0)]
    for (name, _), t, r in zip(options, times[1:], ratios[1:]):
        rows.append((name, t, r))
    doc = max(1, L // 16)
    ids = np.arange(L) // doc
    dense = ids[:, None] == ids[None, :]
    both = dense & np.tri(L, dtype=bool)
    # the floor: the same documents as a batch of separate causal calls
    docs = [np.ascontiguousarray(x[0, :, :16 * doc].reshape(heads, 16, doc, D).swapaxes(0, 1))
            for x in (q, k, v)]
    times, ratios = ratios_alternated(
        [lambda: fastattn.causal_attention(q, k, v, segment_ids=ids),
         lambda: fastattn.causal_attention(q, k, v, dense),
         lambda: fastattn.scaled_dot_product_attention(q, k, v, both),
         lambda: fastattn.causal_attention(*docs)], rounds)
    rows.append((f"segment_ids, documents of {doc}", times[0], 1.0))
    rows.append(("dense document mask + is_causal (x slower)", times[1], ratios[1]))
    rows.append(("one dense document-and-causal mask (x slower)", times[2], ratios[2]))
    rows.append((f"floor: the documents as a batch (16, {heads}, {doc}, {D})", times[3],
                 ratios[3]))
    lens = np.round(np.geomspace(16, max(16, L // 4), 16)).astype(int)
    cu = np.concatenate([[0], np.cumsum(lens)])
    qp, kp, vp = (_randn((int(cu[-1]), heads, D), s) for s in range(3))
    pad = _randn((16, heads, int(lens[-1]), D), 3)

    # the floor: each sequence as its own contiguous (1, H, L_b, D) arrays
    copies = [[np.ascontiguousarray(x[cu[b]:cu[b + 1]].swapaxes(0, 1)) for x in (qp, kp, vp)]
              for b in range(16)]

    def separate():
        for b in range(16):
            r = slice(cu[b], cu[b + 1])
            fastattn.causal_attention(qp[r].swapaxes(0, 1), kp[r].swapaxes(0, 1),
                                      vp[r].swapaxes(0, 1))

    def separate_copies():
        for c in copies:
            fastattn.causal_attention(*c)
    times, ratios = ratios_alternated(
        [lambda: fastattn.varlen_attention(qp, kp, vp, cu, cu, is_causal=True), separate,
         lambda: fastattn.causal_attention(pad, pad, pad), separate_copies], rounds)
    rows.append((f"varlen_attention, 16 sequences of {lens[0]}..{lens[-1]}", times[0], 1.0))
    rows.append(("separate calls (x slower)", times[1], ratios[1]))
    ratio = 16 * float(lens[-1]) ** 2 / float(np.sum(lens.astype(float) ** 2))
    rows.append((f"padded batch (x slower; padding ratio {ratio:.1f}x)", times[2], ratios[2]))
    rows.append(("floor: separate calls on contiguous copies", times[3], ratios[3]))
    fastattn.set_num_threads(None)
    print(f"score options, document masks, packed batches: H={heads} L=S={L} D={D}, "
          f"{threads} threads; medians of {rounds} rounds", file=out)
    for name, t, r in rows:
        print(f"  {name:<52} {t * 1e3:10.1f} ms  {r:6.2f}x", file=out)
    return rows
