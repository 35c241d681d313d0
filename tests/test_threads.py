"""Thread control and determinism ("Determinism" and "Threads" in the docs).

Threads: OpenMP's default count (OMP_NUM_THREADS honoured, read at call
time), threadpoolctl's limits and fastattn.set_num_threads / get_num_threads,
which take precedence; small problems run on one thread; calls from several
Python threads at once are safe. Determinism: the bits of a result do not
depend on the thread count, nor a query row's on the other rows, batch items
or heads of the call."""

import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import threadpoolctl

import fastattn
from fastattn import _core

from conftest import assert_same_bits, per_thread_count, qkv, randn

sdpa = fastattn.scaled_dot_product_attention
# where the fastattn under test lives (an in-place build or site-packages)
FASTATTN_PATH = os.path.dirname(os.path.dirname(os.path.abspath(fastattn.__file__)))
OPENMP = _core.build_info()["openmp"]


def _assert_all_same(results):
    first = results[0] if isinstance(results[0], tuple) else (results[0],)
    for r in results[1:]:
        for a, b in zip(first, r if isinstance(r, tuple) else (r,)):
            assert_same_bits(b, a)


# ------------------------------------------------------------ thread control

def test_default_thread_count_at_least_one(threads):
    assert isinstance(fastattn.get_num_threads(), int)
    assert fastattn.get_num_threads() >= 1


@pytest.mark.parametrize("n", [1, 2, 3, 7])
def test_set_then_get(threads, n):
    threads(n)
    assert fastattn.get_num_threads() == n


def test_set_numpy_int(threads):
    threads(np.int64(2))
    assert fastattn.get_num_threads() == 2


def test_set_none_restores_default(threads):
    default = fastattn.get_num_threads()
    threads(default + 2)
    assert fastattn.get_num_threads() == default + 2
    threads(None)
    assert fastattn.get_num_threads() == default


@pytest.mark.parametrize("n", [0, -1])
def test_set_num_threads_invalid_value(threads, n):
    before = fastattn.get_num_threads()
    with pytest.raises(ValueError):
        fastattn.set_num_threads(n)
    assert fastattn.get_num_threads() == before


@pytest.mark.parametrize("n", [1.5, 2.0, "2"])
def test_set_num_threads_invalid_type(threads, n):
    with pytest.raises(TypeError):
        fastattn.set_num_threads(n)


def test_absurd_thread_counts_are_rejected_at_set_time():
    with pytest.raises(ValueError, match="n must be"):
        fastattn.set_num_threads(2**40)
    assert fastattn.softmax(np.ones(3, np.float32)).shape == (3,)


def test_threadpoolctl_limits_apply(threads):
    outside = fastattn.get_num_threads()
    assert outside >= 1
    with threadpoolctl.threadpool_limits(1, user_api="openmp"):
        assert fastattn.get_num_threads() == 1
    assert fastattn.get_num_threads() == outside


@pytest.mark.skipif(not OPENMP, reason="built without OpenMP")
def test_threadpoolctl_sees_the_openmp_runtime(threads):
    openmp = [info for info in threadpoolctl.threadpool_info() if info["user_api"] == "openmp"]
    assert openmp
    runtime = fastattn.show_config(mode="dicts")["openmp_runtime"]
    assert runtime is not None
    assert runtime["filepath"] in {info["filepath"] for info in openmp}
    # the runtime threadpoolctl controls is the one fastattn's kernels read
    limit = _core.omp_max_threads() + 1
    with threadpoolctl.threadpool_limits(limit, user_api="openmp"):
        assert _core.omp_max_threads() == limit


def test_set_num_threads_takes_priority_over_threadpoolctl(threads):
    threads(3)
    with threadpoolctl.threadpool_limits(1, user_api="openmp"):
        assert fastattn.get_num_threads() == 3


@pytest.mark.parametrize("n", ["1", "3"])
def test_omp_num_threads_is_honoured(n):
    env = dict(os.environ, OMP_NUM_THREADS=n, PYTHONPATH=FASTATTN_PATH)
    res = subprocess.run([sys.executable, "-c", "import fastattn; print(fastattn.get_num_threads())"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    # a build without OpenMP runs on one thread whatever OMP_NUM_THREADS says
    assert res.stdout.strip() == (n if OPENMP else "1")


# ------------------------------------------------- bitwise across threads

ATTN_KW = {
    "plain": {},
    "causal": {"is_causal": True},
    "window": {"window": (37, 5)},
    "causal+window": {"is_causal": True, "window": (100, None)},
    "bool-mask": {"mask": "bool"},
    "float-mask": {"mask": "float"},
    "gqa": {"enable_gqa": True},
}


@pytest.mark.parametrize("case", list(ATTN_KW))
def test_sdpa_bitwise_equal_for_any_thread_count(rng, threads, case):
    B, H, L, S, D = 2, 3, 300, 300, 32
    kw = dict(ATTN_KW[case])
    q, k, v = qkv(rng, (B, H, L, D), (B, 1 if case == "gqa" else H, S, D),
                  (B, 1 if case == "gqa" else H, S, D))
    mask = None
    kind = kw.pop("mask", None)
    if kind == "bool":
        mask = rng.random((L, S)) < 0.8
    elif kind == "float":
        mask = randn(rng, B, 1, L, S)
        mask[..., ::7] = -np.inf
    results = per_thread_count(threads, lambda: sdpa(q, k, v, mask, return_lse=True, **kw))
    _assert_all_same(results)
    assert np.isfinite(results[0][1][..., -1]).all()


def test_sdpa_bitwise_equal_for_any_thread_count_l_ne_s(rng, threads):
    q, k, v = qkv(rng, (2, 2, 150, 24), (2, 2, 333, 24), (2, 2, 333, 40))
    _assert_all_same(per_thread_count(threads, lambda: sdpa(q, k, v, is_causal=True, return_lse=True)))


def test_attention_weights_bitwise_equal_for_any_thread_count(rng, threads):
    q, k = randn(rng, 2, 3, 200, 32), randn(rng, 2, 3, 250, 32)
    _assert_all_same(per_thread_count(threads, lambda: fastattn.attention_weights(q, k, is_causal=True)))


@pytest.mark.parametrize("name", ["softmax", "log_softmax", "logsumexp"])
@pytest.mark.parametrize("axis", [-1, 0])
def test_rowwise_bitwise_equal_for_any_thread_count(rng, threads, name, axis):
    x = randn(rng, 2000, 500, scale=3.0)
    _assert_all_same(per_thread_count(threads, lambda: getattr(fastattn, name)(x, axis=axis)))


def test_threadpoolctl_limit_gives_same_bits(rng, threads):
    q, k, v = qkv(rng, (2, 3, 300, 32), (2, 3, 300, 32), (2, 3, 300, 32))
    free = sdpa(q, k, v, is_causal=True)
    with threadpoolctl.threadpool_limits(1, user_api="openmp"):
        limited = sdpa(q, k, v, is_causal=True)
    assert_same_bits(limited, free)


# ------------------------------------------- independence of other rows

@pytest.mark.parametrize("mask_kind", [None, "bool", "float"])
def test_query_row_alone_equals_row_in_larger_call(rng, threads, mask_kind):
    B, H, L, S, D = 2, 3, 64, 100, 32
    q, k, v = qkv(rng, (B, H, L, D), (B, H, S, D), (B, H, S, 20))
    mask = None
    if mask_kind == "bool":
        mask = rng.random((L, S)) < 0.7
    elif mask_kind == "float":
        mask = randn(rng, L, S)
    threads(3)
    full, full_lse = sdpa(q, k, v, mask, return_lse=True)
    threads(1)
    for i in (0, 1, 17, 40, 63):
        row_mask = None if mask is None else mask[i:i + 1]
        o, lse = sdpa(q[..., i:i + 1, :], k, v, row_mask, return_lse=True)
        assert_same_bits(o, full[..., i:i + 1, :])
        assert_same_bits(lse, full_lse[..., i:i + 1])


@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("group", [1, 2, 3, 4])
def test_decoding_rows_keep_the_bits_of_prefill_rows(rng, simd, D, group):
    # one query row a kv head (and 2-4 of a GQA group) takes the few-rows
    # kernels, whose float32 scores at D = 64 and 128 run two key blocks at
    # once for 1-3 rows (4: one block, for contrast); each row must keep the
    # bits it has among 64 rows (the tiled kernels), for every length of the
    # last tile (S = 1 .. 79) and a second key chunk (1100)
    H = 2 * group
    for S in list(range(1, 80)) + [1100]:
        q, k, v = qkv(rng, (1, H, 64, D), (1, 2, S, D), (1, 2, S, D))
        full, full_lse = sdpa(q, k, v, enable_gqa=group > 1, return_lse=True)
        for i in (0, 63):
            o, lse = sdpa(q[..., i:i + 1, :], k, v, enable_gqa=group > 1, return_lse=True)
            assert_same_bits(o, full[..., i:i + 1, :])
            assert_same_bits(lse, full_lse[..., i:i + 1])


@pytest.mark.parametrize("padding", [False, True], ids=["no-mask", "key-padding"])
def test_rows_of_long_full_attention_keep_their_bits_in_wider_units(rng, threads, padding):
    # Full attention whose k and v rows (S (D + Dv) floats a head) take more
    # than half of a core's level-2 cache runs in units of 192 query rows
    # rather than 96 where that still leaves 8 units a thread (2 heads of
    # 1536 rows: 16 units). Each row keeps the bits it has in a short call
    # (units of at most 96 rows), on 1 or 2 threads.
    D = 16
    S = _core.l2_cache_bytes() // (2 * 2 * D * 4) + 64
    if S > 65536:
        pytest.skip("a level-2 cache this large needs a longer call than this test makes")
    q, k, v = qkv(rng, (1, 2, 1536, D), (1, 2, S, D), (1, 2, S, D))
    mask = (np.arange(S) < S - 100)[None, None, None, :] if padding else None
    want = np.concatenate([sdpa(q[:, :, i:i + 64], k, v, mask) for i in range(0, 1536, 64)],
                          axis=2)
    for n in (1, 2):
        threads(n)
        assert_same_bits(sdpa(q, k, v, mask), want)


@pytest.mark.parametrize("kw", [{"is_causal": True}, {"window": (20, 0)}, {"is_causal": True, "window": (5, 3)}],
                         ids=str)
def test_last_query_alone_equals_last_row_with_causal_or_window(rng, kw):
    # bottom-right alignment: the last query sits at p = S - 1 whatever L is
    # (one decoding step with a KV cache)
    q, k, v = qkv(rng, (2, 3, 50, 16), (2, 3, 90, 16), (2, 3, 90, 8))
    full, full_lse = sdpa(q, k, v, return_lse=True, **kw)
    o, lse = sdpa(q[..., -1:, :], k, v, return_lse=True, **kw)
    assert_same_bits(o, full[..., -1:, :])
    assert_same_bits(lse, full_lse[..., -1:])


def test_batch_element_alone_equals_it_in_batch(rng, threads):
    q, k, v = qkv(rng, (4, 3, 70, 32), (4, 3, 120, 32), (4, 3, 120, 16))
    mask = rng.random((4, 1, 70, 120)) < 0.8
    threads(3)
    full, full_lse = sdpa(q, k, v, mask, is_causal=True, return_lse=True)
    threads(1)
    for b in range(4):
        o, lse = sdpa(q[b], k[b], v[b], mask[b], is_causal=True, return_lse=True)
        assert_same_bits(o, full[b])
        assert_same_bits(lse, full_lse[b])
        o1, _ = sdpa(q[b:b + 1, 1:2], k[b:b + 1, 1:2], v[b:b + 1, 1:2], mask[b:b + 1], is_causal=True,
                     return_lse=True)
        assert_same_bits(o1, full[b:b + 1, 1:2])


def test_softmax_row_alone_equals_row_in_larger_call(rng, threads):
    x = randn(rng, 1000, 300, scale=2.0)
    threads(3)
    full = fastattn.softmax(x)
    threads(1)
    for i in (0, 1, 500, 999):
        assert_same_bits(fastattn.softmax(x[i:i + 1]), full[i:i + 1])


# ------------------------------------------------- calls from many threads

def test_concurrent_calls_from_python_threads(rng):
    problems = [qkv(rng, (2, 2, 120, 32), (2, 2, 150, 32), (2, 2, 150, 32)) for _ in range(6)]
    xs = [randn(rng, 300, 200) for _ in range(6)]
    serial = [sdpa(q, k, v, is_causal=True) for q, k, v in problems]
    serial_sm = [fastattn.softmax(x) for x in xs]
    with ThreadPoolExecutor(max_workers=4) as pool:
        par = list(pool.map(lambda p: sdpa(*p, is_causal=True), problems * 2))
        par_sm = list(pool.map(fastattn.softmax, xs * 2))
    for a, b in zip(par, serial * 2):
        assert_same_bits(a, b)
    for a, b in zip(par_sm, serial_sm * 2):
        assert_same_bits(a, b)


# ------------------------- decoding: one unit's key chunks split over threads

DECODE_CASES = {
    "plain": {},
    "causal": {"is_causal": True},
    "window": {"window": (1500, 0)},
    "bool-mask, NaN in masked v rows": {"mask": "bool"},
    "float-mask": {"mask": "float"},
    "NaN key": {"nan_key": True},
    "+inf score": {"mask": "inf"},
}


@pytest.mark.parametrize("case", list(DECODE_CASES))
def test_decode_split_over_key_chunks_gives_the_same_bits(rng, threads, case):
    # B=1, one kv head for 8 query heads, L=1: a single work unit. With more
    # than one thread fastattn splits it by chunks of 1024 keys (S = 3000 is
    # not a multiple) and folds the chunks in order: the bits must be those of
    # one thread, and of the same query as the last row of a long call (not split).
    kw = dict(DECODE_CASES[case])
    S = 3000
    q, k, v = qkv(rng, (1, 8, 200, 64), (1, 1, S, 64), (1, 1, S, 48))
    mask = None
    kind = kw.pop("mask", None)
    if kind == "bool":
        mask = rng.random((200, S)) < 0.7
        mask[:, 2500] = False
        v[..., 2500, :] = np.nan  # a key no row may see: must not reach the output
    elif kind == "float":
        mask = randn(rng, 200, S)
    elif kind == "inf":
        mask = np.zeros((200, S), np.float32)
        mask[:, 1100] = np.inf  # in the second chunk: the row's max is +inf
    if kw.pop("nan_key", False):
        k[..., 2100, 0] = np.nan  # a NaN score in the third chunk
    last = slice(199, 200)
    row_mask = None if mask is None else mask[last]

    def decode():
        return sdpa(q[..., last, :], k, v, row_mask, return_lse=True, enable_gqa=True, **kw)

    results = per_thread_count(threads, decode)
    _assert_all_same(results)
    full, full_lse = sdpa(q, k, v, mask, return_lse=True, enable_gqa=True, **kw)
    assert_same_bits(results[0][0], full[..., last, :])
    assert_same_bits(results[0][1], full_lse[..., last])
    want, want_lse = fastattn.reference.scaled_dot_product_attention(
        q[..., last, :], k, v, row_mask, return_lse=True, enable_gqa=True, **kw)
    np.testing.assert_allclose(results[0][0], want, rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(results[0][1], want_lse, rtol=2e-5, atol=2e-6)
    if case == "NaN key":
        assert np.isnan(results[0][0]).all() and np.isnan(results[0][1]).all()
    elif case == "+inf score":
        assert np.isnan(results[0][0]).all() and (results[0][1] == np.inf).all()
    else:
        assert np.isfinite(results[0][0]).all() and np.isfinite(results[0][1]).all()


# ------------------------------------------------------------- the thread policy

MIN_WORK = 1048576.0  # csrc/fa_internal.h: FA_MIN_WORK_PER_THREAD
BUSY_WORK = 268435456.0  # FA_BUSY_WORK


@pytest.fixture
def idle_policy():
    """The thread policy with the machine counted as idle, before and after."""
    _core.set_machine_busy(0)
    yield
    _core.set_machine_busy(0)


def test_threads_follow_the_work(idle_policy):
    # (only a threaded call of this process can count the machine as loaded)
    assert _core.threads_for(8, 2 * MIN_WORK - 1, 100) == 1
    assert _core.threads_for(8, 2 * MIN_WORK, 100) == 2
    assert _core.threads_for(8, 5.5 * MIN_WORK, 100) == 5
    assert _core.threads_for(8, 100 * MIN_WORK, 100) == 8
    assert _core.threads_for(8, 100 * MIN_WORK, 3) == 3    # no more than the work items
    assert _core.threads_for(1, 100 * MIN_WORK, 100) == 1  # no more than the cap


def test_a_loaded_machine_runs_small_calls_on_one_thread(idle_policy):
    _core.set_machine_busy(60)
    assert _core.machine_busy()
    assert _core.threads_for(2, 16 * MIN_WORK, 100) == 1
    assert _core.threads_for(2, BUSY_WORK - 1, 100) == 1
    assert _core.threads_for(2, BUSY_WORK, 100) == 2  # a call long enough to gain anyway
    _core.set_machine_busy(0)
    assert not _core.machine_busy()


# On Linux a late thread's word is weighed against /proc/loadavg; elsewhere
# (or without it) one late call counts as it stands.
ONE_LATE_CALL_COUNTS = not (sys.platform.startswith("linux") and os.path.exists("/proc/loadavg"))
ALONE = 1 << 20  # (a call's own threads: more than any others that run)


def tripped():
    """True if a window of load has opened since the policy was reset (the
    record, not the clock: a slow test machine cannot flip it)."""
    return _core.busy_window()[0] != 0


def test_a_late_thread_counts_while_the_threads_are_awake_or_the_cores_full(idle_policy):
    # A thread late to a call that follows the last one closely was kept off
    # its core: the machine is loaded, where it happens twice in a row (once
    # may be the host of a virtual machine taking the core for a moment) or,
    # on Linux, where other threads fill the cores. After a pause the threads
    # sleep, and waking one may take as long on an idle machine: then (on
    # Linux) the late thread counts only if other threads fill the cores.
    t = _core.clock()
    if t == 0.0:
        pytest.skip("a build without OpenMP has no threads to time")
    _core.note_wait(t, 0.0)              # a threaded call ends now
    _core.note_wait(t, 0.0005, ALONE)    # the next (begun before that end: close), on time
    assert not tripped()
    _core.note_wait(t, 0.005, ALONE)     # the next, its thread 5 ms late
    assert tripped() == ONE_LATE_CALL_COUNTS
    _core.note_wait(t, 0.0, ALONE)       # on time again
    _core.note_wait(t, 0.005, ALONE)     # late once more, but not twice in a row
    assert tripped() == ONE_LATE_CALL_COUNTS
    _core.note_wait(t, 0.005, ALONE)     # twice in a row
    assert tripped()
    _core.set_machine_busy(0)
    _core.note_wait(t, 0.0)
    _core.note_wait(t, 0.005, -ALONE)    # once, where other threads fill the cores (the
    # running threads less the call's own: on Linux, more than the cores)
    assert tripped()
    _core.set_machine_busy(0)
    _core.note_wait(_core.clock(), 0.0)
    time.sleep(0.05)
    # 5 ms late after 50 ms idle, the call's own threads outnumbering any
    # others that run: on Linux no load; elsewhere the late thread counts
    _core.note_wait(_core.clock(), 0.005, ALONE)
    assert tripped() == ONE_LATE_CALL_COUNTS


def test_a_late_wake_after_a_pause_is_not_the_first_of_two(idle_policy):
    # the threads were asleep: a late call then says nothing of the next one
    t = _core.clock()
    if t == 0.0:
        pytest.skip("a build without OpenMP has no threads to time")
    _core.note_wait(t, 0.0)
    _core.note_wait(t, 0.005, ALONE)     # late while the threads were awake
    _core.set_machine_busy(0)            # (a reset forgets it)
    _core.note_wait(t, 0.005, ALONE)
    assert tripped() == ONE_LATE_CALL_COUNTS
    _core.set_machine_busy(0)
    _core.note_wait(_core.clock(), 0.0)
    time.sleep(0.05)
    _core.note_wait(_core.clock(), 0.005, ALONE)  # late after a pause: waking up
    _core.note_wait(_core.clock() - 0.001, 0.005, ALONE)  # then late at once
    assert tripped() == ONE_LATE_CALL_COUNTS


def test_a_window_of_load_grows_while_the_load_stays():
    # 20 ms after a while without load (a moment's stall of a virtual
    # machine's host costs no more), four times the last window where the
    # load is back within that window's length after it ended (or while it
    # is open), up to half a second
    lo, hi, t = 20_000, 500_000, 10**9
    assert _core.busy_span(t, 0, 0) == lo                    # the first
    assert _core.busy_span(t + 1, t, lo) == 4 * lo           # back at once
    assert _core.busy_span(t - 1, t, lo) == 4 * lo           # the window still open
    assert _core.busy_span(t + lo - 1, t, lo) == 4 * lo      # back within a window's length
    assert _core.busy_span(t + lo, t, lo) == lo              # later: a new first
    assert _core.busy_span(t + 1, t, 4 * lo) == 16 * lo
    assert _core.busy_span(t + 1, t, 16 * lo) == hi          # no longer than half a second
    assert _core.busy_span(t + 1, t, hi) == hi
    assert _core.busy_span(2**62, 2**62 - 1, 2**62) == hi    # (no overflow)


def test_each_late_call_under_load_lengthens_the_window(idle_policy):
    t = _core.clock()
    if t == 0.0:
        pytest.skip("a build without OpenMP has no threads to time")
    spans = []
    _core.note_wait(t, 0.0)
    for _ in range(5):  # late where other threads fill the cores, call after call
        _core.note_wait(_core.clock(), 0.005, -ALONE)
        spans.append(_core.busy_window()[1])
    assert spans == [20_000, 80_000, 320_000, 500_000, 500_000]
    _core.set_machine_busy(0)
    _core.note_wait(_core.clock(), 0.005, -ALONE)
    assert _core.busy_window()[1] == 20_000  # after a reset: the first again


def test_a_late_call_opens_a_short_window_first(idle_policy):
    t = _core.clock()
    if t == 0.0:
        pytest.skip("a build without OpenMP has no threads to time")
    _core.note_wait(t, 0.0)
    _core.note_wait(t, 0.005, -ALONE)  # late where other threads fill the cores
    assert _core.busy_window()[1] == 20_000
    time.sleep(0.06)  # (the 20 ms window and as long again have passed)
    assert not _core.machine_busy()


def test_a_loaded_machine_gives_the_same_bits(rng, threads, idle_policy):
    q, k, v = qkv(rng, (4, 128, 64), (4, 128, 64), (4, 128, 64))
    threads(2)
    want = fastattn.scaled_dot_product_attention(q, k, v, is_causal=True)
    _core.set_machine_busy(60)
    assert_same_bits(fastattn.scaled_dot_product_attention(q, k, v, is_causal=True), want)
