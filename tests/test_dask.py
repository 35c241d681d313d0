"""fastattn.dask: attention over chunked Dask arrays.

Held here: equality with the in-memory result across chunkings (uneven,
single-element, every axis), the same bits on every scheduler (synchronous,
threads, a real 2-process distributed.LocalCluster), the graph pruning of causal
and windowed attention, GQA with head chunks, broadcast masks, return_lse and the
errors for input that cannot work.
"""
import numpy as np
import pytest

da = pytest.importorskip("dask.array")
distributed = pytest.importorskip("distributed")
import dask  # noqa: E402

import fastattn  # noqa: E402
import fastattn.dask as fdask  # noqa: E402

from conftest import randn  # noqa: E402

TOL = dict(rtol=3e-5, atol=3e-6)


@pytest.fixture(scope="module")
def client():
    """A LocalCluster of 2 worker processes (1 thread each), closed after the module."""
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                       dashboard_address=None, memory_limit="1GiB",
                                       silence_logs=50)
    c = distributed.Client(cluster, timeout="60s")
    try:
        c.wait_for_workers(2, timeout=60)
        yield c
    finally:
        c.close(timeout=30)
        cluster.close(timeout=30)


def _blocks(arr):
    """The number of attention tasks (block pairs) in the graph of `arr`."""
    names = [n for n in arr.dask.layers if n.startswith("fastattn-sdpa-block-")]
    assert len(names) == 1
    return len(arr.dask.layers[names[0]])


def _check(o_lse, q, k, v, mask=None, **kw):
    """The dask result equals the in-memory one to float32 rounding."""
    want, want_lse = fastattn.scaled_dot_product_attention(q, k, v, mask, return_lse=True, **kw)
    o, lse = dask.compute(*o_lse, scheduler="sync")
    assert o.dtype == np.float32 and o.shape == want.shape and lse.shape == want_lse.shape
    np.testing.assert_allclose(o, want, **TOL)
    np.testing.assert_allclose(lse, want_lse, **TOL)
    return o, lse


CHUNKINGS = {
    "one_block": ((-1, -1, -1, -1), (-1, -1, -1, -1)),
    "uneven": ((1, 3, 13, -1), (2, 1, 11, -1)),
    "single_elements": ((1, 1, 1, -1), (1, 1, 1, -1)),
    "every_axis": ((1, 2, 16, -1), (1, 2, 8, -1)),
}


@pytest.mark.parametrize("chunking", list(CHUNKINGS))
@pytest.mark.parametrize("kw", [{}, dict(is_causal=True), dict(window=(5, 3)),
                                dict(is_causal=True, window=(9, None)), dict(window=(None, 0))],
                         ids=["full", "causal", "window", "causal_window", "right0"])
def test_equals_in_memory(rng, chunking, kw):
    B, H, L, S, D, Dv = 2, 4, 20, 33, 8, 5
    if chunking == "single_elements":
        L, S = 3, 5
    q, k, v = randn(rng, B, H, L, D), randn(rng, B, H, S, D), randn(rng, B, H, S, Dv)
    cq, ck = CHUNKINGS[chunking]
    dq = da.from_array(q, chunks=cq)
    dk, dv = da.from_array(k, chunks=ck), da.from_array(v, chunks=ck)
    _check(fdask.scaled_dot_product_attention(dq, dk, dv, return_lse=True, **kw), q, k, v, **kw)


@pytest.mark.parametrize("L, S", [(1, 40), (40, 1), (40, 40), (7, 40)])
def test_alignment_is_global(rng, L, S):
    """Bottom-right alignment over the whole L and S, not per block."""
    q, k, v = randn(rng, L, 4), randn(rng, S, 4), randn(rng, S, 3)
    for kw in (dict(is_causal=True), dict(window=(3, 2)), dict(window=(0, 0))):
        res = fdask.scaled_dot_product_attention(da.from_array(q, chunks=(3, -1)),
                                                 da.from_array(k, chunks=(5, -1)),
                                                 da.from_array(v, chunks=(5, -1)),
                                                 return_lse=True, **kw)
        _check(res, q, k, v, **kw)


def test_bits_do_not_depend_on_the_scheduler(rng, client):
    q, k, v = randn(rng, 2, 3, 40, 16), randn(rng, 2, 3, 50, 16), randn(rng, 2, 3, 50, 8)
    dq, dk, dv = (da.from_array(x, chunks=(1, 3, 9, -1)) for x in (q, k, v))
    o, lse = fdask.scaled_dot_product_attention(dq, dk, dv, is_causal=True, return_lse=True,
                                                split_every=2)  # trees of 3 levels
    ref = [x.tobytes() for x in dask.compute(o, lse, scheduler="sync")]
    assert [x.tobytes() for x in dask.compute(o, lse, scheduler="threads", num_workers=3)] == ref
    assert [x.tobytes() for x in client.compute([o, lse], sync=True)] == ref
    # and the tree of merges agrees with the in-memory call
    _check((o, lse), q, k, v, is_causal=True)


def test_distributed_with_masks_and_gqa(rng, client):
    B, Hq, Hkv, L, S, D = 2, 4, 2, 24, 30, 8
    q, k, v = randn(rng, B, Hq, L, D), randn(rng, B, Hkv, S, D), randn(rng, B, Hkv, S, D)
    mask = rng.random((B, 1, L, S)) < 0.7
    dq = da.from_array(q, chunks=(1, 2, 8, -1))
    dk, dv = (da.from_array(x, chunks=(1, 1, 10, -1)) for x in (k, v))
    dm = da.from_array(mask, chunks=(1, 1, 12, 15))
    o, lse = fdask.scaled_dot_product_attention(dq, dk, dv, dm, enable_gqa=True, is_causal=True,
                                                return_lse=True)
    want, want_lse = fastattn.scaled_dot_product_attention(q, k, v, mask, enable_gqa=True,
                                                           is_causal=True, return_lse=True)
    got, got_lse = client.compute([o, lse], sync=True)
    np.testing.assert_allclose(got, want, **TOL)
    np.testing.assert_allclose(got_lse, want_lse, **TOL)


def test_set_worker_threads(client):
    assert set(client.run(fastattn.get_num_threads).values()) == {1}  # the nanny's default
    try:
        assert fdask.set_worker_threads(client, 2) == 2
        assert set(client.run(fastattn.get_num_threads).values()) == {2}
        n = fdask.set_worker_threads(client)  # the cores shared out over 2 workers
        assert n >= 1 and set(client.run(fastattn.get_num_threads).values()) == {n}
    finally:
        fdask.set_worker_threads(client, 1)
    with pytest.raises(ValueError, match="4096"):
        fdask.FastattnThreads(0)
    with pytest.raises(TypeError, match="client must be a dask.distributed.Client, got NoneType"):
        fdask.set_worker_threads(None, 2)


def test_set_worker_threads_leaves_a_threaded_clusters_caller_alone():
    # workers that are threads of this process share its setting: the plugin
    # does not change it there, and set_worker_threads says so
    fastattn.set_num_threads(3)
    try:
        with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                                      dashboard_address=":0", silence_logs=50) as cluster, \
                distributed.Client(cluster) as c:
            with pytest.warns(RuntimeWarning, match="share its fastattn thread count"):
                assert fdask.set_worker_threads(c, 1) == 1
            assert fastattn.get_num_threads() == 3
            assert set(c.run(fastattn.get_num_threads).values()) == {3}
    finally:
        fastattn.set_num_threads(None)


def test_threads_plugin_leaves_the_clients_setting():
    # the plugin checks n in the client but sets nothing there: the setting
    # is for the workers
    fastattn.set_num_threads(3)
    try:
        assert fdask.FastattnThreads(2).n == 2
        assert fastattn.get_num_threads() == 3
        with pytest.raises(ValueError, match="4096"):
            fdask.FastattnThreads(0)
        with pytest.raises(TypeError, match="None"):
            fdask.FastattnThreads(None)
        with pytest.raises(TypeError, match="float"):
            fdask.FastattnThreads(2.0)
        assert fastattn.get_num_threads() == 3
    finally:
        fastattn.set_num_threads(None)


@pytest.mark.parametrize("n", [4, 8])
def test_causal_graph_is_about_half(rng, n):
    L = S = 8 * n
    q = da.zeros((L, 8), chunks=(8, -1), dtype=np.float32)
    k = v = da.zeros((S, 8), chunks=(8, -1), dtype=np.float32)
    full = fdask.scaled_dot_product_attention(q, k, v)
    causal = fdask.scaled_dot_product_attention(q, k, v, is_causal=True)
    window = fdask.scaled_dot_product_attention(q, k, v, window=(7, 0))
    assert _blocks(full) == n * n
    assert _blocks(causal) == n * (n + 1) // 2  # the blocks on and below the diagonal
    assert _blocks(window) == 2 * n - 1         # the diagonal and the one below it
    # L != S: bottom-right aligned, the top query blocks see fewer key blocks
    qs = da.zeros((16, 8), chunks=(8, -1), dtype=np.float32)
    assert _blocks(fdask.scaled_dot_product_attention(qs, k, v, is_causal=True)) == 2 * n - 1


def test_query_block_without_allowed_keys(rng):
    """A window that leaves query blocks no key block at all: 0 and -inf there."""
    L, S = 16, 4
    q, k, v = randn(rng, L, 4), randn(rng, S, 4), randn(rng, S, 2)
    res = fdask.scaled_dot_product_attention(da.from_array(q, chunks=(4, -1)), k, v,
                                             window=(0, 0), return_lse=True)
    o, lse = _check(res, q, k, v, window=(0, 0))
    assert (o[:12] == 0).all() and (lse[:12] == -np.inf).all()


def test_gqa_with_head_chunks(rng):
    B, Hq, Hkv, L, S, D = 1, 8, 2, 12, 20, 8
    q, k, v = randn(rng, B, Hq, L, D), randn(rng, B, Hkv, S, D), randn(rng, B, Hkv, S, D)
    for q_heads, kv_heads in ((1, 1), (3, 2), (4, 1), (8, 2)):
        dq = da.from_array(q, chunks=(1, q_heads, 5, -1))
        dk, dv = (da.from_array(x, chunks=(1, kv_heads, 7, -1)) for x in (k, v))
        res = fdask.scaled_dot_product_attention(dq, dk, dv, enable_gqa=True, is_causal=True,
                                                 return_lse=True)
        assert all(c % (Hq // Hkv) == 0 for c in res[0].chunks[1])  # whole groups per block
        _check(res, q, k, v, enable_gqa=True, is_causal=True)


def test_mqa_by_broadcasting(rng):
    q, k, v = randn(rng, 2, 4, 10, 8), randn(rng, 2, 1, 14, 8), randn(rng, 2, 1, 14, 8)
    res = fdask.scaled_dot_product_attention(da.from_array(q, chunks=(1, 2, 4, -1)),
                                             da.from_array(k, chunks=(2, 1, 5, -1)), v,
                                             return_lse=True)
    assert res[0].chunks[:2] == ((1, 1), (2, 2))
    _check(res, q, k, v)


@pytest.mark.parametrize("shape", [(12, 15), (1, 15), (12, 1), (2, 1, 12, 15), (3, 1, 1)])
@pytest.mark.parametrize("kind", ["bool", "float"])
def test_broadcast_masks(rng, shape, kind):
    q, k, v = randn(rng, 2, 3, 12, 4), randn(rng, 2, 3, 15, 4), randn(rng, 2, 3, 15, 4)
    if kind == "bool":
        mask = rng.random(shape) < 0.6
    else:
        mask = randn(rng, *shape)
        mask[rng.random(shape) < 0.3] = -np.inf
    dq = da.from_array(q, chunks=(1, 2, 5, -1))
    dk, dv = (da.from_array(x, chunks=(2, 1, 4, -1)) for x in (k, v))
    dm = da.from_array(mask, chunks=tuple(max(1, n // 2) for n in shape))
    res = fdask.scaled_dot_product_attention(dq, dk, dv, dm, is_causal=True, return_lse=True)
    _check(res, q, k, v, mask, is_causal=True)
    # a NumPy mask works the same
    res = fdask.scaled_dot_product_attention(dq, dk, dv, mask, is_causal=True, return_lse=True)
    _check(res, q, k, v, mask, is_causal=True)


def test_numpy_inputs_and_options(rng):
    q, k, v = randn(rng, 3, 9, 6), randn(rng, 3, 11, 6), randn(rng, 3, 11, 2)
    o = fdask.scaled_dot_product_attention(q, k, v, scale=0.3)  # NumPy in: one block each
    assert isinstance(o, da.Array) and o.chunks == ((3,), (9,), (2,))
    np.testing.assert_allclose(o.compute(scheduler="sync"),
                               fastattn.scaled_dot_product_attention(q, k, v, scale=0.3), **TOL)
    # float64 dask inputs, k and v chunked differently on S (aligned by a rechunk)
    dk = da.from_array(k.astype(np.float64), chunks=(1, 4, -1))
    dv = da.from_array(v.astype(np.float16).astype(np.float64), chunks=(2, 3, -1))
    res = fdask.scaled_dot_product_attention(q, dk, dv, return_lse=True, split_every=3)
    assert res[0].chunks == ((1, 1, 1), (9,), (2,))
    _check(res, q, k, v.astype(np.float16).astype(np.float64))


def test_empty_axes(rng):
    for L, S in ((0, 5), (5, 0), (0, 0)):
        q, k, v = randn(rng, 2, L, 3), randn(rng, 2, S, 3), randn(rng, 2, S, 4)
        _check(fdask.scaled_dot_product_attention(q, k, v, return_lse=True), q, k, v)


def test_bad_input(rng):
    q = da.zeros((2, 8, 4), chunks=(1, 4, -1), dtype=np.float32)
    k = v = da.zeros((2, 6, 4), chunks=(1, 3, -1), dtype=np.float32)
    sdpa = fdask.scaled_dot_product_attention
    with pytest.raises(ValueError, match=r"q's last axis \(D=4\) must be one chunk"):
        sdpa(q.rechunk((1, 4, 2)), k, v)
    with pytest.raises(ValueError, match=r"v's last axis \(Dv=4\) must be one chunk"):
        sdpa(q, k, v.rechunk((1, 3, 1)))
    unknown = k[da.ones(2, dtype=bool, chunks=1)]  # boolean indexing: unknown chunk sizes
    with pytest.raises(ValueError, match="k has unknown chunk sizes"):
        sdpa(q, unknown, v)
    with pytest.raises(TypeError, match="q must have a real floating dtype"):
        sdpa(q.astype(np.int32), k, v)
    with pytest.raises(TypeError, match="attn_mask must be a bool or real floating"):
        sdpa(q, k, v, da.zeros((8, 6), dtype=np.int8))
    with pytest.raises(ValueError, match="does not broadcast"):
        sdpa(q, k, v, np.ones((8, 5), bool))
    with pytest.raises(ValueError, match="must have as many rows as k"):
        sdpa(q, k, v[:, :5])
    with pytest.raises(ValueError, match="do not broadcast"):
        sdpa(q, k[:1].repeat(3, axis=0), v[:1].repeat(3, axis=0))
    with pytest.raises(ValueError, match="multiple of"):
        sdpa(q.reshape(1, 2, 8, 4), k.reshape(1, 2, 6, 4)[:, :1].repeat(3, axis=1),
             v.reshape(1, 2, 6, 4)[:, :1].repeat(3, axis=1), enable_gqa=True)
    with pytest.raises(ValueError, match="window"):
        sdpa(q, k, v, window=(-1, 0))
    with pytest.raises(ValueError, match="scale must be finite"):
        sdpa(q, k, v, scale=float("inf"))
    with pytest.raises(TypeError, match="is_causal must be a bool"):
        sdpa(q, k, v, is_causal=1)
    with pytest.raises(TypeError, match="out is not supported"):
        sdpa(q, k, v, out=np.empty((2, 8, 4), np.float32))
    with pytest.raises(ValueError, match="split_every"):
        sdpa(q, k, v, split_every=1)


def test_docstring_examples():
    import doctest

    result = doctest.testmod(fdask, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0


def test_half_precision_kv_pass_through(rng):
    """float16 k and v reach each task as stored (the in-memory call reads them
    in place): the same as the in-memory call on the whole arrays."""
    q = randn(rng, 2, 10, 8)
    k, v = randn(rng, 2, 21, 8).astype(np.float16), randn(rng, 2, 21, 4).astype(np.float16)
    res = fdask.scaled_dot_product_attention(da.from_array(q, chunks=(1, 4, -1)),
                                             da.from_array(k, chunks=(1, 6, -1)),
                                             da.from_array(v, chunks=(1, 6, -1)),
                                             is_causal=True, return_lse=True)
    _check(res, q, k, v, is_causal=True)


SCORE_OPTIONS = [dict(softcap=2.0), dict(alibi_slopes="slopes"), dict(sinks="sinks"),
                 dict(segment_ids="ids"), dict(alibi_slopes="slopes", window=(6, 2)),
                 dict(alibi_slopes="slopes", sinks="sinks", softcap=3.0, segment_ids="ids",
                      is_causal=True)]


@pytest.mark.parametrize("kw", SCORE_OPTIONS, ids=lambda kw: "+".join(kw))
@pytest.mark.parametrize("with_mask", [False, True])
def test_score_options_pass_through(rng, kw, with_mask):
    """softcap, ALiBi (global distances, also on blocks off the diagonal), sinks
    (counted once per row) and segment ids, sliced per block, with GQA heads."""
    B, Hq, Hkv, L, S, D = 2, 4, 2, 30, 41, 8
    q, k, v = randn(rng, B, Hq, L, D), randn(rng, B, Hkv, S, D), randn(rng, B, Hkv, S, 5)
    values = dict(slopes=rng.random(Hq).astype(np.float32),
                  sinks=randn(rng, B, Hq),
                  ids=(np.repeat(np.arange(3), [10, 12, 8])[None, None].repeat(B, 0),
                       np.repeat(np.arange(3), [15, 16, 10])[None, None].repeat(B, 0)))
    mem = {name: values.get(val, val) if isinstance(val, str) else val
           for name, val in kw.items()}
    lazy = dict(mem)
    if "sinks" in lazy:
        lazy["sinks"] = da.from_array(lazy["sinks"], chunks=(1, 1))
    if "segment_ids" in lazy:
        lazy["segment_ids"] = (da.from_array(lazy["segment_ids"][0], chunks=(1, 1, 6)),
                               lazy["segment_ids"][1])
    mask = rng.random((L, S)) < 0.8 if with_mask else None
    res = fdask.scaled_dot_product_attention(
        da.from_array(q, chunks=(1, 2, 7, -1)), da.from_array(k, chunks=(2, 1, 9, -1)),
        da.from_array(v, chunks=(1, 1, 9, -1)),
        None if mask is None else da.from_array(mask, chunks=(14, 9)),
        enable_gqa=True, return_lse=True, **lazy)
    _check(res, q, k, v, mask, enable_gqa=True, **mem)


def test_alibi_off_the_diagonal_forms_no_mask_of_rows_and_keys(rng):
    """A block pair off the diagonal gets ALiBi's global distances from the
    kernel (its rows' positions shifted), not as a float mask of (heads, rows,
    keys): here such a mask is 4 MiB a task, the whole computation's traced
    peak stays under 1.5 MiB (also: the large blocks take the rows-as-lanes
    kernels, whose ALiBi term then carries the shift)."""
    import tracemalloc
    H, L, D = 16, 768, 8
    q, k, v = randn(rng, H, L, D), randn(rng, H, L, D), randn(rng, H, L, D)
    slopes = rng.random(H).astype(np.float32)
    res = fdask.scaled_dot_product_attention(
        da.from_array(q, chunks=(-1, 256, -1)), da.from_array(k, chunks=(-1, 256, -1)),
        da.from_array(v, chunks=(-1, 256, -1)), is_causal=True, alibi_slopes=slopes,
        return_lse=True)
    tracemalloc.start()
    try:
        o, lse = dask.compute(*res, scheduler="sync")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1.5 * 2**20, peak
    want, want_lse = fastattn.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                           alibi_slopes=slopes, return_lse=True)
    np.testing.assert_allclose(o, want, **TOL)
    np.testing.assert_allclose(lse, want_lse, **TOL)


def test_sinks_on_rows_without_keys(rng):
    """A query block with no key block still gets its sink: o = 0, lse = sink."""
    q, k, v = randn(rng, 4, 16, 4), randn(rng, 4, 4, 4), randn(rng, 4, 4, 2)
    sinks = np.array([0.5, -np.inf, np.nan, np.inf], np.float32)
    res = fdask.scaled_dot_product_attention(da.from_array(q, chunks=(1, 4, -1)), k, v,
                                             window=(0, 0), sinks=sinks, return_lse=True)
    o, lse = dask.compute(*res, scheduler="sync")
    want, want_lse = fastattn.scaled_dot_product_attention(q, k, v, window=(0, 0), sinks=sinks,
                                                           return_lse=True)
    np.testing.assert_allclose(o, want, **TOL)
    np.testing.assert_allclose(lse, want_lse, **TOL)
    assert (o[:2, :12] == 0).all() and (lse[0, :12] == np.float32(0.5)).all()
    assert (lse[1, :12] == -np.inf).all() and np.isnan(lse[2]).all() and np.isnan(o[2]).all()
    assert (lse[3] == np.inf).all() and (o[3] == 0).all()  # an infinite sink takes all weight


def test_segment_ids_one_array(rng):
    ids = np.repeat(np.arange(4), [5, 9, 1, 9])
    q, k, v = randn(rng, 24, 8), randn(rng, 24, 8), randn(rng, 24, 8)
    res = fdask.scaled_dot_product_attention(da.from_array(q, chunks=(7, -1)),
                                             da.from_array(k, chunks=(5, -1)), v,
                                             is_causal=True, segment_ids=ids, return_lse=True)
    _check(res, q, k, v, is_causal=True, segment_ids=ids)


def test_zero_d_segment_ids_and_empty_numpy_inputs(rng):
    """A 0-d id serves every row and key (as in memory); NumPy inputs with a
    zero-sized axis give empty results (no auto-chunking of an empty array)."""
    q = randn(rng, 2, 10, 8)
    dq = da.from_array(q, chunks=(1, 5, 8))
    o = fdask.scaled_dot_product_attention(dq, dq, dq, segment_ids=(3, 3)).compute(
        scheduler="sync")
    np.testing.assert_allclose(o, fastattn.scaled_dot_product_attention(q, q, q), **TOL)
    for shape in [(0, 4, 20, 8), (2, 0, 20, 8)]:
        e = np.ones(shape, np.float32)
        o = fdask.scaled_dot_product_attention(e, e, e).compute(scheduler="sync")
        assert o.shape == shape


def test_masked_arrays_are_refused():
    q = da.zeros((2, 8, 4), chunks=(1, 4, -1), dtype=np.float32)
    sdpa = fdask.scaled_dot_product_attention
    ids = np.ma.masked_array(np.arange(8) // 3, mask=np.arange(8) % 2 == 0)
    with pytest.raises(TypeError, match="segment_ids must be a plain array, not a masked array"):
        sdpa(q, q, q, segment_ids=ids)
    with pytest.raises(TypeError, match="alibi_slopes must be a plain array"):
        sdpa(q, q, q, alibi_slopes=np.ma.masked_array([0.5, 1.0], mask=[False, True]))
    with pytest.raises(TypeError, match="q must be a plain array"):
        sdpa(da.from_array(np.ma.masked_array(np.zeros((2, 8, 4), np.float32)),
                           chunks=(1, 4, -1)), q, q)


def test_bad_score_options():
    q = k = v = da.zeros((2, 8, 4), chunks=(1, 4, -1), dtype=np.float32)
    sdpa = fdask.scaled_dot_product_attention
    with pytest.raises(ValueError, match="softcap"):
        sdpa(q, k, v, softcap=-1.0)
    with pytest.raises(ValueError, match=r"alibi_slopes of shape \(3,\) does not broadcast"):
        sdpa(q, k, v, alibi_slopes=np.ones(3))
    with pytest.raises(TypeError, match="sinks must have a real floating dtype"):
        sdpa(q, k, v, sinks=np.ones(2, np.int32))
    with pytest.raises(TypeError, match=r"segment_ids\[0\] \(q_ids\) must have an integer dtype"):
        sdpa(q, k, v, segment_ids=np.zeros((2, 8)))
    with pytest.raises(ValueError, match="does not broadcast"):
        sdpa(q, k, v, segment_ids=(np.zeros((2, 8), int), np.zeros((2, 7), int)))
    with pytest.raises(ValueError, match="alibi_slopes must be finite"):
        sdpa(q, k[:, :4], v[:, :4], alibi_slopes=np.array([1.0, np.inf])).compute(
            scheduler="sync")
