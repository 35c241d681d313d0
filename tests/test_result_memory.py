"""The memory of large result arrays: reused once freed (set_result_cache),
never while an array is on it, counted by tracemalloc, bounded by the limit."""
import gc
import threading

import numpy as np
import pytest

import fastattn
from fastattn import reference as ref

from conftest import traced_peak

MIB = 1 << 20
SHAPE = (1024, 2048)  # 8 MiB of float32: above the 4 MiB from which results are cached


@pytest.fixture
def cache_limit():
    """Sets the cache's limit for one test (emptied first, after the results
    that earlier tests left in reference cycles are gone); restores it after."""
    gc.collect()
    previous = fastattn.set_result_cache(0)
    yield fastattn.set_result_cache
    fastattn.set_result_cache(previous)


def held():
    return fastattn.show_config(mode="dicts")["result_cache"]["held_bytes"]


def data(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)


def test_a_freed_result_gives_its_memory_to_the_next(cache_limit):
    cache_limit(512 * MIB)
    x1, x2 = data(SHAPE, 0), data(SHAPE, 1)
    r1 = fastattn.softmax(x1)
    at = r1.ctypes.data
    del r1
    assert held() == 8 * MIB
    r2 = fastattn.softmax(x2)
    assert r2.ctypes.data == at
    assert held() == 0
    np.testing.assert_allclose(r2, ref.softmax(x2), rtol=2e-6, atol=1e-9)
    assert np.array_equal(r2, fastattn.softmax(x2, out=np.empty_like(x2)))


def test_memory_an_array_is_on_is_never_reused(cache_limit):
    cache_limit(512 * MIB)
    x = data(SHAPE, 2)
    r = fastattn.softmax(x)
    view = r[::3, 5:]
    want = view.copy()
    del r  # (the view keeps the memory)
    assert held() == 0
    others = [fastattn.softmax(data(SHAPE, 3 + i)) for i in range(3)]
    for o in others:
        assert not np.shares_memory(view, o)
    del others
    others = [fastattn.log_softmax(data(SHAPE, 9))]
    assert not np.shares_memory(view, others[0])
    assert np.array_equal(view, want)


def test_results_look_like_numpy_arrays(cache_limit):
    cache_limit(512 * MIB)
    big = fastattn.softmax(data(SHAPE, 4))
    assert big.dtype == np.float32 and big.shape == SHAPE
    assert big.flags.c_contiguous and big.flags.writeable and big.flags.aligned
    assert not big.flags.owndata  # (the memory belongs to the cache's block)
    assert big.ctypes.data % (2 * MIB) == 0
    big[0, 0] = 5.0
    assert big[0, 0] == 5.0
    small = fastattn.softmax(data((4, 8), 5))  # below 4 MiB: numpy.empty's array
    assert small.flags.owndata


def test_attention_outputs_reuse_memory_with_the_same_bits(cache_limit):
    cache_limit(512 * MIB)
    q, k, v = (data((1, 4, 1024, 256), 10 + i) for i in range(3))  # an output of 4 MiB
    want = fastattn.scaled_dot_product_attention(q, k, v, out=np.empty_like(q))
    o1 = fastattn.scaled_dot_product_attention(q, k, v)
    at = o1.ctypes.data
    del o1
    o2 = fastattn.scaled_dot_product_attention(q, k, v)
    assert o2.ctypes.data == at and not o2.flags.owndata
    assert np.array_equal(o2, want)
    o3, lse = fastattn.scaled_dot_product_attention(q[:, :, :1], k, v, return_lse=True)
    assert o3.flags.owndata and lse.flags.owndata  # (small: numpy.empty's)


def test_a_result_along_another_axis_is_on_kept_memory(cache_limit):
    cache_limit(512 * MIB)
    x = data((2048, 1024), 13)
    r = fastattn.softmax(x, axis=0)
    assert not r.flags.owndata and r.flags.c_contiguous
    np.testing.assert_allclose(r, ref.softmax(x, axis=0), rtol=2e-6, atol=1e-9)


def test_releasing_a_memoryview_does_not_free_a_result(cache_limit):
    cache_limit(512 * MIB)
    r = fastattn.softmax(data(SHAPE, 14))
    want = r.copy()
    views = [memoryview(r)]
    base = r
    while base is not None:  # (every object the array's memory hangs on)
        if isinstance(base, memoryview):
            views.append(base)
        else:
            try:
                views.append(memoryview(base))
            except TypeError:
                pass
        base = getattr(base, "base", None)
    for m in views:
        m.release()
    del views, base
    assert held() == 0
    other = fastattn.softmax(data(SHAPE, 15))
    assert not np.shares_memory(r, other)
    assert np.array_equal(r, want)


def test_out_arrays_are_untouched_by_the_cache(cache_limit):
    cache_limit(512 * MIB)
    x = data(SHAPE, 6)
    out = np.empty_like(x)
    assert fastattn.softmax(x, out=out) is out
    del out
    assert held() == 0


def test_a_zero_limit_keeps_nothing(cache_limit):
    cache_limit(512 * MIB)
    r = fastattn.softmax(data(SHAPE, 7))
    del r
    assert held() == 8 * MIB
    assert fastattn.set_result_cache(0) == 512 * MIB  # frees what it held
    assert held() == 0
    r = fastattn.softmax(data(SHAPE, 8))
    del r
    assert held() == 0
    assert fastattn.show_config(mode="dicts")["result_cache"] == {"max_bytes": 0,
                                                                  "held_bytes": 0}


def test_the_cache_keeps_to_its_limit_and_four_blocks(cache_limit):
    cache_limit(20 * MIB)
    rs = [fastattn.softmax(data(SHAPE, i)) for i in range(3)]  # 3 x 8 MiB
    del rs
    assert held() == 16 * MIB  # two fit under 20 MiB
    cache_limit(12 * MIB)  # a lower limit frees the oldest at once
    assert held() == 8 * MIB
    cache_limit(1 << 30)
    rs = [fastattn.softmax(data((512 + 128 * i, 2048), i)) for i in range(6)]  # 4 + i MiB
    for i in range(6):  # freed in this order
        rs[i] = None
    assert held() == (6 + 8 + 8 + 10) * MIB  # the last four freed, in blocks of 2 MiB


def test_set_result_cache_checks_its_argument(cache_limit):
    with pytest.raises(ValueError, match="max_bytes must be >= 0, got -1"):
        fastattn.set_result_cache(-1)
    for bad in (1.5, True, "1", None):
        with pytest.raises(TypeError, match="max_bytes must be an int"):
            fastattn.set_result_cache(bad)
    assert fastattn.set_result_cache(np.int64(3 * MIB)) == 0
    assert fastattn.set_result_cache(2**70) == 3 * MIB  # (beyond any memory: no limit)


def test_tracemalloc_counts_a_cached_result(cache_limit):
    cache_limit(512 * MIB)
    x = data(SHAPE, 11)
    assert traced_peak(lambda: fastattn.softmax(x)) >= x.nbytes


def test_results_made_in_several_threads_are_right(cache_limit):
    # (the calls reach the cache with the GIL held, one at a time)
    cache_limit(64 * MIB)
    xs = [data((512 + 64 * (i % 3), 2048), 20 + i) for i in range(6)]
    want = [fastattn.softmax(x, out=np.empty_like(x)) for x in xs]
    bad = []

    def work(i):
        for _ in range(10):
            r = fastattn.softmax(xs[i])
            if not np.array_equal(r, want[i]):
                bad.append(i)

    ts = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not bad
