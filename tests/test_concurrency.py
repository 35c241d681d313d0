"""Calls from many Python threads at once, and from forked and spawned workers.

- 8 Python threads x 200 calls of mixed shapes and functions give the same bits
  as the same calls made one after the other.
- After fastattn has run on several OpenMP threads in the parent, a child made
  by multiprocessing with `fork` and one made with `spawn` compute correctly,
  within a timeout (a hang in the OpenMP runtime after fork fails the test).
"""
import multiprocessing as mp
import threading

import numpy as np
import pytest

import fastattn

from conftest import assert_same_bits

sdpa = fastattn.scaled_dot_product_attention
N_THREADS, N_CALLS = 8, 200


def _problems(seed=0):
    """Mixed shapes and options, small enough for 1600 calls to take a few seconds;
    the last ones are large enough to run on several OpenMP threads."""
    rng = np.random.default_rng(seed)
    calls = []
    for i in range(24):
        L, S = (int(n) for n in rng.integers(1, 90, 2))
        D, Dv = int(rng.choice([1, 8, 17, 32, 64])), int(rng.choice([1, 5, 16, 64]))
        H = int(rng.choice([1, 2, 4]))
        q = rng.standard_normal((2, H, L, D)).astype(np.float32)
        k = rng.standard_normal((2, 1, S, D)).astype(np.float32)
        v = rng.standard_normal((2, 1, S, Dv)).astype(np.float32)
        kind = i % 6
        if kind == 0:
            calls.append((sdpa, (q, k, v), {"is_causal": True, "return_lse": True}))
        elif kind == 1:
            calls.append((sdpa, (q, k, v, rng.random((L, S)) < 0.6), {"window": (7, 3)}))
        elif kind == 2:
            calls.append((fastattn.attention_weights, (q, k), {"is_causal": True}))
        elif kind == 3:
            x = (rng.standard_normal((int(rng.integers(1, 300)), int(rng.integers(1, 300)))) * 5
                 ).astype(np.float32)
            calls.append((fastattn.log_softmax, (x,), {"axis": int(rng.integers(0, 2))}))
        elif kind == 4:
            calls.append((fastattn.sliding_window_attention, (q, k, v, 9), {}))
        else:
            calls.append((sdpa, (q, k, v, rng.standard_normal((L, S)).astype(np.float32)),
                          {"enable_gqa": True}))
    q = rng.standard_normal((2, 4, 257, 64)).astype(np.float32)
    kv = rng.standard_normal((2, 2, 301, 64)).astype(np.float32)
    calls.append((sdpa, (q, kv, kv), {"is_causal": True, "enable_gqa": True}))
    calls.append((fastattn.softmax, (rng.standard_normal((2000, 700)).astype(np.float32),), {}))
    return calls


def _as_tuple(r):
    return r if isinstance(r, tuple) else (r,)


def test_8_threads_x_200_mixed_calls_equal_serial_calls(threads):
    threads(2)  # each call may itself use OpenMP threads: teams nest under Python threads
    calls = _problems()
    serial = [_as_tuple(f(*a, **kw)) for f, a, kw in calls]
    results = [[] for _ in range(N_THREADS)]
    errors = []
    barrier = threading.Barrier(N_THREADS)

    def worker(t):
        try:
            barrier.wait()
            for n in range(N_CALLS):
                i = (t * 7 + n * 5) % len(calls)
                f, a, kw = calls[i]
                results[t].append((i, _as_tuple(f(*a, **kw))))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    pool = [threading.Thread(target=worker, args=(t,)) for t in range(N_THREADS)]
    for th in pool:
        th.start()
    for th in pool:
        th.join(timeout=300)
    assert not any(th.is_alive() for th in pool), "a thread hung"
    assert not errors, errors
    assert sum(len(r) for r in results) == N_THREADS * N_CALLS
    for per_thread in results:
        for i, got in per_thread:
            for g, s in zip(got, serial[i]):
                assert_same_bits(g, s)


# --------------------------------------------------------- fork and spawn

def _child_problem():
    rng = np.random.default_rng(11)
    q = rng.standard_normal((2, 4, 300, 48)).astype(np.float32)
    kv = rng.standard_normal((2, 2, 333, 48)).astype(np.float32)
    x = rng.standard_normal((3000, 400)).astype(np.float32)
    return q, kv, x


def _child_compute(nthreads):
    """Runs in the child: the problem on `nthreads` OpenMP threads."""
    import fastattn as fa  # already imported after fork; a fresh import after spawn
    fa.set_num_threads(nthreads)
    q, kv, x = _child_problem()
    o = fa.scaled_dot_product_attention(q, kv, kv, is_causal=True, enable_gqa=True)
    return o, fa.softmax(x), fa.get_num_threads()


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_child_process_computes_correctly_after_parent_used_threads(threads, method):
    if method not in mp.get_all_start_methods():
        pytest.skip(f"no {method} start method on this platform")
    threads(2)
    q, kv, x = _child_problem()
    want = sdpa(q, kv, kv, is_causal=True, enable_gqa=True)   # the parent's OpenMP pool is up
    want_sm = fastattn.softmax(x)
    ctx = mp.get_context(method)
    with ctx.Pool(1) as pool:
        o, sm, n = pool.apply_async(_child_compute, (2,)).get(timeout=60)
        o1, sm1, _ = pool.apply_async(_child_compute, (1,)).get(timeout=60)
    # GNU libgomp cannot run threads in a forked child: fastattn falls back to one
    # (fastattn._threads._runtime_survives_fork); elsewhere, and in a build without
    # OpenMP whatever runtime another package (PyTorch) loaded, the child uses 2.
    config = fastattn.show_config(mode="dicts")
    gomp = config["openmp"] and "libgomp" in ((config["openmp_runtime"] or {})
                                              .get("filepath") or "")
    assert n == (1 if method == "fork" and gomp else 2)
    for got in (o, o1):
        assert_same_bits(got, want)
    for got in (sm, sm1):
        assert_same_bits(got, want_sm)
