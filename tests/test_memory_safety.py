"""Memory safety: no input may corrupt memory, write into a caller's array
(other than `out` and the cache being appended to), half-apply a KV-cache
update or give a wrong answer without an error. The inputs are chosen as an
attacker would choose them.

Each group holds one class of fault: window sides beyond int64, index arrays
read after their checks, sizes that overflow, `out` overlapping a caller's
array that fastattn converted, masked arrays, block ids beyond int32, block
ids or cache rows written twice, arguments that fastattn.dask checked late or
differently, result sizes beyond memory, and segment ids read as a pair. The
kernels' own bounds checks are driven directly through fastattn._core.
"""
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import fastattn
from fastattn import _core
from fastattn import reference as ref
from fastattn.flash_attn import (flash_attn_func, flash_attn_varlen_func,
                                 flash_attn_with_kvcache)

from conftest import assert_close, assert_same_bits, randn

try:
    import ml_dtypes
except ImportError:  # pragma: no cover - ml_dtypes is in the test extra
    ml_dtypes = None

try:
    import dask.array as da
    import fastattn.dask as fdask
except ImportError:  # pragma: no cover - dask is in the test extra
    da = fdask = None

HUGE = [sys.maxsize, 2**62, 2**63, 2**70]


def run_isolated(code):
    """Run `code` in a fresh interpreter (a crash there fails the test, not
    the suite); returns its stdout."""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, (proc.returncode, proc.stdout[-2000:], proc.stderr[-4000:])
    return proc.stdout


def paged_setup(rng, block_size=16, B=2, H=2, D=8, nblocks=12, dtype=np.float32):
    k_cache = randn(rng, nblocks, block_size, H, D).astype(dtype)
    v_cache = randn(rng, nblocks, block_size, H, D).astype(dtype)
    table = rng.permutation(nblocks)[:B * (nblocks // B)].reshape(B, -1).astype(np.int32)
    q = randn(rng, B, 1, H, D)
    k = randn(rng, B, 1, H, D)
    v = randn(rng, B, 1, H, D)
    return q, k_cache, v_cache, k, v, table


# --------------------------------------------------------------------------
# Window sides beyond any query-key distance: unbounded, on every path


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("block_size", [16, 64])  # (merged partials; the kernel's pages)
@pytest.mark.parametrize("side", HUGE)
def test_kvcache_paged_huge_window_is_unbounded(rng, block_size, side, causal):
    q, kc, vc, k, v, table = paged_setup(rng, block_size)
    kw = dict(k=k, v=v, cache_seqlens=np.array([3, 2 * block_size + 5], np.int32),
              block_table=table, return_softmax_lse=True, causal=causal)
    want = flash_attn_with_kvcache(q, kc.copy(), vc.copy(), **kw)
    for window in [(side, side), (side, 0), (0, side)]:
        got = flash_attn_with_kvcache(q, kc.copy(), vc.copy(), window_size=window, **kw)
        if window[0] == 0:  # a window of the query's own key only
            assert np.isfinite(got[1]).all()
            continue
        assert_same_bits(got[0], want[0])
        assert_same_bits(got[1], want[1])


@pytest.mark.parametrize("side", HUGE)
def test_huge_window_everywhere(rng, side):
    q, k, v = randn(rng, 2, 5, 3, 8), randn(rng, 2, 7, 3, 8), randn(rng, 2, 7, 3, 4)
    want = flash_attn_func(q, k, v, causal=True)
    assert_same_bits(flash_attn_func(q, k, v, causal=True, window_size=(side, side)), want)
    qq, kk, vv = (x.swapaxes(1, 2) for x in (q, k, v))
    want = fastattn.scaled_dot_product_attention(qq, kk, vv)
    for window in [(side, side), (side, None), (None, side)]:
        assert_same_bits(fastattn.scaled_dot_product_attention(qq, kk, vv, window=window),
                         want)
        assert_same_bits(fastattn.scaled_dot_product_attention(qq, kk, vv, window=window,
                                                                softcap=5.0),
                         fastattn.scaled_dot_product_attention(qq, kk, vv, softcap=5.0))
    cu = np.array([0, 2, 5])
    pq, pk = randn(rng, 5, 2, 8), randn(rng, 5, 2, 8)
    assert_same_bits(fastattn.varlen_attention(pq, pk, pk, cu, cu, window=(side, side)),
                     fastattn.varlen_attention(pq, pk, pk, cu, cu))
    assert_same_bits(flash_attn_varlen_func(pq, pk, pk, cu, cu, 3, 3, window_size=(side, 0)),
                     flash_attn_varlen_func(pq, pk, pk, cu, cu, 3, 3, window_size=(-1, 0)))


def test_broadcast_view_mask_shape_is_checked_as_given(rng):
    q, k = randn(rng, 8, 4), randn(rng, 6, 4)
    for mask in (np.broadcast_to(np.ones((1, 1), bool), (8, 5)),
                 np.broadcast_to(np.zeros((1, 1), np.float32), (8, 5)),
                 np.broadcast_to(np.ones(1, bool), (3, 8, 6))):
        with pytest.raises(ValueError, match="attn_mask of shape .* does not broadcast"):
            fastattn.scaled_dot_product_attention(q, k, k, mask)
        with pytest.raises(ValueError, match="attn_mask of shape .* does not broadcast"):
            ref.scaled_dot_product_attention(q, k, k, mask)


def test_window_size_as_array_or_list():
    q = np.random.default_rng(0).standard_normal((1, 6, 2, 4)).astype(np.float32)
    want = flash_attn_func(q, q, q, window_size=(2, 0))
    for form in [np.array([2, 0]), [2, 0], (np.int64(2), np.int32(0))]:
        assert_same_bits(flash_attn_func(q, q, q, window_size=form), want)
    with pytest.raises(ValueError, match="window_size must be a pair"):
        flash_attn_func(q, q, q, window_size=np.array([1, 2, 3]))


# --------------------------------------------------------------------------
# A KV-cache update is all or nothing; every argument is checked first


def test_kvcache_restores_the_cache_when_the_attention_fails(rng, monkeypatch):
    import fastattn.flash_attn as fa

    for paged in (False, True):
        q, kc, vc, k, v, table = paged_setup(rng)
        if not paged:
            kc, vc = kc.reshape(2, -1, 2, 8), vc.reshape(2, -1, 2, 8)
        kc0, vc0 = kc.copy(), vc.copy()

        def boom(*args, **kwargs):
            raise MemoryError("simulated")

        monkeypatch.setattr(fa, "_kvcache_attention", boom)
        with pytest.raises(MemoryError, match="simulated"):
            flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=np.array([3, 9]),
                                    block_table=table if paged else None)
        monkeypatch.undo()
        assert_same_bits(kc, kc0)
        assert_same_bits(vc, vc0)


@pytest.mark.parametrize("bad", [
    dict(window_size=(2**70, "x")), dict(softcap=float("nan")), dict(causal=1),
    dict(alibi_slopes=[np.nan, 1.0]), dict(rotary_cos=np.ones((2, 2)), rotary_sin=np.ones((2, 2))),
    dict(q=np.ma.masked_array(np.zeros((2, 1, 2, 8), np.float32))),
    dict(k=np.ma.masked_array(np.zeros((2, 1, 2, 8), np.float32),
                              mask=np.zeros((2, 1, 2, 8), bool))),
    dict(out=np.zeros((2, 1, 2, 7), np.float32)),
    dict(softmax_scale=float("inf")),
])
def test_kvcache_bad_argument_leaves_the_cache_untouched(rng, bad):
    q, kc, vc, k, v, table = paged_setup(rng)
    kc0, vc0 = kc.copy(), vc.copy()
    kw = dict(q=q, k=k, v=v, cache_seqlens=np.array([3, 9]), block_table=table)
    kw.update(bad)
    with pytest.raises((TypeError, ValueError)):
        flash_attn_with_kvcache(k_cache=kc, v_cache=vc, **kw)
    assert_same_bits(kc, kc0)
    assert_same_bits(vc, vc0)


# --------------------------------------------------------------------------
# Index arrays: private copies, and the kernels check every offset


def test_cu_seqlens_reach_the_kernel_as_private_copies(rng, monkeypatch):
    seen = []
    real = _core.attention

    def spy(*args, **kwargs):
        seen.append(kwargs.get("varlen"))
        return real(*args, **kwargs)

    monkeypatch.setattr(_core, "attention", spy)
    q = randn(rng, 5, 2, 8)
    for dtype in (np.int64, np.int32, np.uint64):
        cu = np.array([0, 2, 5], dtype)
        fastattn.varlen_attention(q, q, q, cu, cu)
        flash_attn_varlen_func(q, q, q, cu, cu, 3, 3)
    for varlen in seen:
        assert varlen is not None
        for arr in varlen[:2]:
            assert arr.base is None or not np.shares_memory(arr, cu)
    assert not any(np.shares_memory(v[0], v[1]) for v in seen if v[0].size)


def test_cu_seqlens_rewritten_by_another_thread_cannot_corrupt_memory():
    # (in its own process: before the private copies this corrupted the heap)
    run_isolated("""
        import threading
        import numpy as np
        import fastattn
        rng = np.random.default_rng(0)
        q = rng.standard_normal((64, 2, 16)).astype(np.float32)
        cu = np.array([0, 32, 64], np.int64)
        stop = False
        def flip():
            while not stop:
                cu[1] = 64
                cu[2] = 10**9
                cu[1] = 32
                cu[2] = 64
        t = threading.Thread(target=flip)
        t.start()
        try:
            for _ in range(3000):
                try:
                    fastattn.varlen_attention(q, q, q, cu, cu)
                except ValueError:
                    pass  # a check saw the rewritten values: refused, as it must be
        finally:
            stop = True
            t.join()
        print("ok")
    """)


def core_call(**over):
    """fastattn._core.attention on a small valid problem, with fields replaced."""
    q = np.zeros((2, 4, 8), np.float32)
    k = np.zeros((2, 6, 8), np.float32)
    kw = dict(k_dtype=_core.DTYPE_F32, v_dtype=_core.DTYPE_F32,
              q_off=np.array([0, 32]), k_off=np.array([0, 48]), v_off=np.array([0, 48]),
              q_rs=8, k_rs=8, v_rs=8, nbatch=2, L=4, S=6, D=8, Dv=8, scale=1.0,
              out=np.zeros(64, np.float32), nthreads=1)
    arrays = dict(q=q, k=k, v=k)
    for name in ("q", "k", "v"):
        if name in over:
            arrays[name] = over.pop(name)
    kw.update(over)
    return _core.attention(arrays["q"], arrays["k"], arrays["v"], **kw)


@pytest.mark.parametrize("over", [
    dict(q_off=np.array([0, 33])),            # q's last row one element past its end
    dict(q_off=np.array([-1, 32])),           # before its start
    dict(k_off=np.array([0, 49])),
    dict(v_off=np.array([0, 2**61])),
    dict(q_rs=9),
    dict(k_rs=-8),
    dict(S=7),
    dict(L=5),
    dict(out=np.zeros(63, np.float32)),
    dict(lse=np.zeros(7, np.float32)),
    dict(D=9, q_rs=9, k_rs=9, v_rs=9),
    dict(mask=np.ones(23, np.uint8), mask_off=np.array([0, 0]), mask_sl=6, mask_ss=1),
    dict(mask=np.zeros(24, np.float32), mask_off=np.array([0, 1]), mask_sl=6, mask_ss=1),
    dict(alibi_slopes=np.ones(1, np.float32)),
    dict(sinks=np.ones(1, np.float32)),
    dict(segments=(np.zeros(4, np.int64), np.zeros(5, np.int64), np.array([0, 0]),
                   np.array([0, 0]), 1, 1, True)),
    dict(k=np.zeros((4, 64, 8), np.float32), block_table=np.array([0, 4]),
         bt_off=np.array([0, 1]), block_size=64, num_pages=4, k_ps=512, v_ps=512,
         k_off=np.zeros(2, np.int64), v_off=np.zeros(2, np.int64)),   # bt_off past the table
    dict(k=np.zeros((4, 64, 8), np.float32), block_table=np.array([0, 1]),
         bt_off=np.array([0, 1]), block_size=64, num_pages=5, k_ps=512, v_ps=512,
         k_off=np.zeros(2, np.int64), v_off=np.zeros(2, np.int64)),   # pages past the cache
], ids=lambda d: ",".join(d))
def test_kernel_checks_every_offset(over):
    core_call()  # the valid call
    with pytest.raises(ValueError, match="rejected its arguments"):
        core_call(**over)


def test_kernel_checks_packed_offsets():
    q = np.zeros((5, 2, 8), np.float32)
    cu = np.array([0, 2, 5])

    def call(cu_q, cu_k, **kw):
        offs = _core.varlen_offsets(cu, 2, 1, 16, 8)
        _core.attention(q, q, q, k_dtype=0, v_dtype=0, q_off=offs, k_off=offs, v_off=offs,
                        q_rs=16, k_rs=16, v_rs=16, nbatch=2, L=0, S=0, D=8, Dv=8, scale=1.0,
                        out=np.zeros(80, np.float32), nthreads=1,
                        varlen=(cu_q, cu_k, _core.varlen_offsets(cu, 2, 1, 16, 8),
                                _core.varlen_offsets(cu, 2, 1, 2, 1), 16, 2), **kw)

    call(cu, cu)
    # the per-(sequence, head) slopes and sinks: 2 sequences x 2 heads of them
    for name in ("alibi_slopes", "sinks"):
        call(cu, cu, **{name: np.ones(4, np.float32)})
        with pytest.raises(ValueError, match="rejected its arguments"):
            call(cu, cu, **{name: np.ones(3, np.float32)})
    call(np.array([0, 3, 5]), cu)  # (other lengths, but every row within q: the offsets rule)
    for bad in ([0, 2, 6], [0, 2, 10**12], [0, 5, 2], [0, -1, 5]):
        with pytest.raises(ValueError, match="rejected its arguments"):
            call(np.array(bad), cu)
        with pytest.raises(ValueError, match="rejected its arguments"):
            call(cu, np.array(bad))


def test_core_size_checks():
    with pytest.raises(ValueError, match="smaller than its rows"):
        _core.rowwise(np.zeros(5, np.float32), np.zeros(6, np.float32), 2, 3, 0, 1)
    with pytest.raises(ValueError, match="smaller than its rows"):
        _core.rowwise(np.zeros(6, np.float32), np.zeros(5, np.float32), 2, 3, 0, 1)
    with pytest.raises(ValueError, match="outs\\[1\\] is smaller"):
        _core.merge([np.zeros(6, np.float32), np.zeros(5, np.float32)],
                    [np.zeros(2, np.float32)] * 2, 2, 3, np.zeros(6, np.float32),
                    np.zeros(2, np.float32), 1)
    with pytest.raises(MemoryError, match="too many items"):
        _core.block_offsets((2**40, 2**40), [0, 0], 1)
    with pytest.raises(ValueError, match="shorter than x"):
        _core.exp2(np.zeros(4, np.float32), np.zeros(3, np.float32))


# --------------------------------------------------------------------------
# Sizes: a broadcast view of very many items


def test_broadcast_view_of_2_59_items_is_refused_by_name():
    # (in its own process: the fast path's offsets of so many items once
    # wrapped to a 1-byte buffer and the call wrote past it)
    run_isolated("""
        import numpy as np
        import fastattn
        n = (2**30, 2**29)  # 2**59 batch items of stride 0
        q = np.broadcast_to(np.ones((1, 1, 2, 1), np.float32), n + (2, 1))
        k = np.broadcast_to(np.ones((1, 1, 1, 1), np.float32), n + (1, 1))
        v = np.broadcast_to(np.ones((1, 1, 1, 2), np.float32), n + (1, 2))
        for kw in ({}, {"is_causal": True}, {"softcap": 2.0}, {"return_lse": True}):
            try:
                fastattn.scaled_dot_product_attention(q, k, v, **kw)
            except ValueError as exc:
                assert "the output of shape (1073741824, 536870912, 2, 2) would take" \\
                    in str(exc), exc
            else:
                raise AssertionError("accepted")
        try:
            fastattn.attention_weights(q, k)
        except (ValueError, MemoryError) as exc:
            assert "the weights of shape (1073741824, 536870912, 2, 1)" in str(exc), exc
        else:
            raise AssertionError("accepted")
        # nothing to compute: an empty result at once, no offsets made
        empty = np.broadcast_to(np.ones((1, 1, 0, 1), np.float32), n + (0, 1))
        assert fastattn.scaled_dot_product_attention(empty, k, v).shape == n + (0, 2)
        print("ok")
    """)


def test_huge_max_seqlen_is_named_and_nothing_is_written(rng):
    q = randn(rng, 5, 2, 8)
    cu = np.array([0, 2, 5])
    out = np.full((5, 2, 8), 7.0, np.float32)
    with pytest.raises(ValueError, match=r"max_seqlen_q, max_seqlen_k.*would take"):
        flash_attn_varlen_func(q, q, q, cu, cu, 2**40, 2**40, return_attn_probs=True, out=out)
    assert (out == 7.0).all()
    # a result beyond the address space names itself too
    row = np.ones((1, 1, 8), np.float32)
    with pytest.raises(ValueError, match=r"the weights of shape \(2, 1099511627776, 4194304\)"):
        fastattn.attention_weights(np.broadcast_to(row, (2, 2**40, 8)),
                                   np.broadcast_to(row, (2, 2**22, 8)))


# --------------------------------------------------------------------------
# out= overlapping an argument as the caller gave it (not only its converted copy)


def overlapping(arr, shape):
    """A float32 array of `shape` over the first bytes of `arr`'s buffer (which
    must be big enough), as a caller's out= that overlaps `arr`."""
    n = int(np.prod(shape))
    return arr.reshape(-1).view(np.uint8)[:4 * n].view(np.float32).reshape(shape)


def test_merge_out_overlapping_a_converted_partial(rng):
    o64 = rng.standard_normal((2, 3, 4))  # float64: converted, a copy
    l64 = rng.standard_normal((2, 3))
    o0 = o64.copy()
    with pytest.raises(ValueError, match=r"share memory with outs"):
        fastattn.merge_attention(o64, l64, out=overlapping(o64, (3, 4)))
    with pytest.raises(ValueError, match=r"share memory with outs\[1\]"):
        fastattn.merge_attention(list(o64), list(l64), out=overlapping(o64[1], (3, 4)))
    big = np.zeros(12)  # a float64 lse with room for the output behind it
    big[:3] = l64[0]
    with pytest.raises(ValueError, match=r"share memory with lses\[0\]"):
        fastattn.merge_attention(list(o64), [big[:3], l64[1]], out=overlapping(big, (3, 4)))
    with pytest.raises(ValueError, match=r"share memory with outs"):
        ref.merge_attention(o64, l64, out=overlapping(o64, (3, 4)))
    assert_same_bits(o64, o0)


def test_varlen_out_overlapping_int32_cu_seqlens(rng):
    q = randn(rng, 5, 2, 4)
    buf = np.zeros(64, np.int32)
    buf[:3] = [0, 2, 5]
    cu = buf[:3]
    for call in (lambda out: fastattn.varlen_attention(q, q, q, cu, cu, out=out),
                 lambda out: ref.varlen_attention(q, q, q, cu, cu, out=out),
                 lambda out: flash_attn_varlen_func(q, q, q, cu, cu, 3, 3, out=out)):
        with pytest.raises(ValueError, match="share memory with cu_seqlens_q"):
            call(overlapping(buf, (5, 2, 4)))
        assert buf[:3].tolist() == [0, 2, 5]


def test_sdpa_out_overlapping_converted_options(rng):
    q = randn(rng, 2, 3, 4)
    slopes = np.zeros(64)  # float64: converted
    slopes[:2] = [0.5, 0.25]
    with pytest.raises(ValueError, match="share memory with alibi_slopes"):
        fastattn.scaled_dot_product_attention(q, q, q, alibi_slopes=slopes[:2],
                                              out=overlapping(slopes, (2, 3, 4)))
    ids = np.zeros(64, np.int32)
    with pytest.raises(ValueError, match=r"share memory with segment_ids\[1\]"):
        fastattn.scaled_dot_product_attention(q, q, q, segment_ids=(ids[40:43], ids[:3]),
                                              out=overlapping(ids, (2, 3, 4)))
    q64 = np.zeros((2, 3, 4))
    with pytest.raises(ValueError, match="share memory with q"):
        fastattn.scaled_dot_product_attention(q64, q, q, out=overlapping(q64, (2, 3, 4)))


@pytest.mark.parametrize("name", ["cache_seqlens", "cache_batch_idx", "cache_leftpad",
                                  "block_table", "rotary_cos", "rotary_sin"])
def test_kvcache_out_overlapping_an_index_or_rotary_array(rng, name):
    B, H, D, bs = 2, 2, 8, 16
    paged = name == "block_table"
    kc = randn(rng, 4 if paged else B, bs, H, D)
    vc = randn(rng, 4 if paged else B, bs, H, D)
    q, k, v = randn(rng, B, 1, H, D), randn(rng, B, 1, H, D), randn(rng, B, 1, H, D)
    int_buf = np.zeros(64, np.int32)
    float_buf = np.zeros(256)
    args = dict(cache_seqlens=np.array([3, 5], np.int32))
    if name in ("rotary_cos", "rotary_sin"):
        float_buf[:16 * 2] = 1.0
        args["rotary_cos"] = float_buf[:32].reshape(16, 2)
        args["rotary_sin"] = np.zeros((16, 2))
        if name == "rotary_sin":
            args["rotary_cos"], args["rotary_sin"] = args["rotary_sin"], args["rotary_cos"]
        buf = float_buf
    else:
        values = {"cache_seqlens": [3, 5], "cache_batch_idx": [0, 1], "cache_leftpad": [1, 0],
                  "block_table": [0, 1, 2, 3]}[name]
        int_buf[:len(values)] = values
        arr = int_buf[:len(values)]
        args[name] = arr.reshape(B, 2) if paged else arr
        buf = int_buf
    saved = buf.copy()
    with pytest.raises(ValueError, match=f"share memory with {name}"):
        flash_attn_with_kvcache(q, kc, vc, k, v, out=overlapping(buf, (B, 1, H, D)), **args)
    assert_same_bits(buf, saved)


# --------------------------------------------------------------------------
# Masked arrays are refused everywhere, before anything is written


def test_masked_arrays_refused_everywhere(rng):
    x = randn(rng, 2, 3, 4)
    m = np.ma.masked_array(x, mask=np.zeros(x.shape, bool))
    calls = {
        "x": [lambda: fastattn.softmax(m), lambda: fastattn.logsumexp(m)],
        "q": [lambda: fastattn.scaled_dot_product_attention(m, x, x),
              lambda: flash_attn_func(m[None], x[None], x[None]),
              lambda: fastattn.varlen_attention(m, x, x, [0, 2], [0, 2])],
        "k": [lambda: fastattn.attention_weights(x, m)],
        "v": [lambda: fastattn.scaled_dot_product_attention(x, x, m, softcap=3.0)],
        "outs": [lambda: fastattn.merge_attention(m, x[..., 0])],
        "alibi_slopes": [lambda: fastattn.scaled_dot_product_attention(
            x, x, x, alibi_slopes=np.ma.masked_array([1.0, 2.0]))],
        "cu_seqlens_q": [lambda: fastattn.varlen_attention(
            x, x, x, np.ma.masked_array([0, 2]), [0, 2])],
    }
    for name, fns in calls.items():
        for fn in fns:
            with pytest.raises(TypeError, match=f"{name}.* must be a plain"):
                fn()


def test_masked_new_keys_are_not_appended(rng):
    q, kc, vc, k, v, table = paged_setup(rng)
    kc0 = kc.copy()
    km = np.ma.masked_array(k, mask=np.ones(k.shape, bool))
    with pytest.raises(TypeError, match="k must be a plain array"):
        flash_attn_with_kvcache(q, kc, vc, km, v, cache_seqlens=[1, 2], block_table=table)
    with pytest.raises(TypeError, match="k_cache must be a plain array"):
        flash_attn_with_kvcache(q, np.ma.masked_array(kc), vc, k, v, cache_seqlens=[1, 2],
                                block_table=table)
    assert_same_bits(kc, kc0)


# --------------------------------------------------------------------------
# Block ids beyond int32: read as given, never wrapped


def test_block_ids_beyond_int32_are_read_as_given(rng):
    bs, H, D, S = 64, 2, 8, 100
    page = randn(rng, 1, bs, H, D)
    # 2**33 pages of one page's data (a broadcast view): every id is a valid
    # page; 3 * 2**31 wraps to a negative int32
    kc = np.broadcast_to(page, (2**33, bs, H, D))
    q = randn(rng, 1, 1, H, D)
    table = np.array([[3 * 2**31, 2**32 + 1]], np.int64)
    got = flash_attn_with_kvcache(q, kc, kc, cache_seqlens=np.array([S]), block_table=table)
    k = np.concatenate([page[0], page[0]])[:S][None]
    assert_same_bits(got, flash_attn_func(q, k, k))


# --------------------------------------------------------------------------
# Appends through repeated block ids or cache rows


def test_append_into_a_repeated_block_is_refused(rng):
    q, kc, vc, k, v, _ = paged_setup(rng, block_size=4)
    kc0 = kc.copy()
    seq = np.array([5, 1])
    for table, match in [
            (np.array([[0, 0, 2], [3, 4, 5]]), r"block_table\[0, 1\] = 0 is written"),   # one seq
            (np.array([[0, 1, 2], [1, 4, 5]]), r"block_table\[0, 1\] = 1 is written"),   # shared
    ]:
        with pytest.raises(ValueError, match=match):
            flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=seq, block_table=table)
        assert_same_bits(kc, kc0)


def test_shared_read_only_prefix_blocks_are_allowed(rng):
    q, kc, vc, k, v, _ = paged_setup(rng, block_size=4)
    table = np.array([[0, 1, 2], [0, 3, 4]])  # block 0: a prefix both sequences read
    seq = np.array([5, 6])                    # appends at 5 and 6: blocks 1 and 3
    kc1, vc1 = kc.copy(), vc.copy()
    got = flash_attn_with_kvcache(q, kc1, vc1, k, v, cache_seqlens=seq, block_table=table,
                                  causal=True)
    for b in range(2):
        kb = kc1[table[b]].reshape(-1, 2, 8)[:seq[b] + 1]
        vb = vc1[table[b]].reshape(-1, 2, 8)[:seq[b] + 1]
        assert_same_bits(kb[seq[b]], k[b, 0])
        assert_close(got[b], flash_attn_func(q[b:b + 1], kb[None], vb[None], causal=True)[0])
    # and without k and v any block may repeat
    flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seq, block_table=np.array([[0, 0, 0]] * 2))


def test_append_into_a_repeated_cache_row_is_refused(rng):
    kc, vc = randn(rng, 3, 8, 2, 4), randn(rng, 3, 8, 2, 4)
    q, k, v = randn(rng, 2, 1, 2, 4), randn(rng, 2, 1, 2, 4), randn(rng, 2, 1, 2, 4)
    kc0 = kc.copy()
    with pytest.raises(ValueError, match="cache_batch_idx repeats row 1"):
        flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=[2, 4], cache_batch_idx=[1, 1])
    assert_same_bits(kc, kc0)
    flash_attn_with_kvcache(q, kc, vc, cache_seqlens=[2, 4], cache_batch_idx=[1, 1])


# --------------------------------------------------------------------------
# fastattn.dask: every argument checked when the graph is built, by the
# in-memory function's checks


@pytest.mark.skipif(da is None, reason="needs dask")
def test_dask_checks_option_values_when_the_graph_is_built(rng):
    q = da.from_array(randn(rng, 2, 4, 8), chunks=(1, 2, -1))
    for slopes in ([np.nan, 1.0], da.from_array(np.array([1.0, np.inf]))):
        with pytest.raises(ValueError, match="alibi_slopes must be finite"):
            fdask.scaled_dot_product_attention(q, q, q, alibi_slopes=slopes)
    # no task would read them (no query row): still checked
    empty = da.zeros((2, 0, 8), chunks=(1, 0, -1), dtype=np.float32)
    with pytest.raises(ValueError, match="alibi_slopes must be finite"):
        fdask.scaled_dot_product_attention(empty, q, q, alibi_slopes=[np.nan, 1.0])


@pytest.mark.skipif(da is None or ml_dtypes is None, reason="needs dask and ml_dtypes")
def test_dask_takes_what_the_in_memory_function_takes(rng):
    q = randn(rng, 2, 4, 8)
    mask = rng.standard_normal((4, 4)).astype(ml_dtypes.bfloat16)
    k16 = q.astype(ml_dtypes.bfloat16)
    want = fastattn.scaled_dot_product_attention(q, k16, k16, mask)
    dq = da.from_array(q, chunks=(1, 2, -1))
    got = fdask.scaled_dot_product_attention(dq, da.from_array(k16, chunks=(1, 2, -1)),
                                             da.from_array(k16, chunks=(1, 2, -1)),
                                             da.from_array(mask, chunks=2))
    assert_close(got.compute(scheduler="sync"), want)
    # and refuses what it refuses, with the same message
    for bad in (dict(attn_mask=np.ones((4, 3), bool)), dict(window=(-1, 0)), dict(scale=np.nan),
                dict(attn_mask=np.ones((4, 4), np.int8)), dict(softcap=-1.0)):
        with pytest.raises((TypeError, ValueError)) as mem:
            fastattn.scaled_dot_product_attention(q, q, q, **bad)
        with pytest.raises(mem.type, match=str(mem.value).replace("(", r"\(")
                           .replace(")", r"\)").replace("[", r"\[")):
            fdask.scaled_dot_product_attention(dq, dq, dq, **bad)


# --------------------------------------------------------------------------
# segment_ids: a pair only as a tuple


def test_nested_list_segment_ids_are_per_item(rng):
    q, k, v = randn(rng, 2, 4, 8), randn(rng, 2, 4, 8), randn(rng, 2, 4, 8)
    ids = [[0, 0, 1, 1], [0, 1, 1, 1]]  # batch of two: one row of ids each
    got = fastattn.scaled_dot_product_attention(q, k, v, segment_ids=ids)
    for b in range(2):
        assert_same_bits(got[b], fastattn.scaled_dot_product_attention(
            q[b], k[b], v[b], segment_ids=np.array(ids[b])))
    assert_close(got, ref.scaled_dot_product_attention(q, k, v, segment_ids=ids))
    # the tuple is the pair
    pair = (np.array(ids[0]), np.array(ids[1]))
    want = fastattn.scaled_dot_product_attention(q, k, v, segment_ids=pair)
    assert not np.array_equal(want, got)
    if fdask is not None:
        dq = da.from_array(q, chunks=(1, 2, -1))
        assert_close(fdask.scaled_dot_product_attention(dq, dq, dq, segment_ids=ids)
                     .compute(scheduler="sync"),
                     fastattn.scaled_dot_product_attention(q, q, q, segment_ids=ids))


# --------------------------------------------------------------------------
# A cache of another library's tensors is appended to in place


def test_torch_tensor_kv_cache_is_appended_in_place(rng):
    torch = pytest.importorskip("torch")
    kc, vc = torch.zeros(2, 8, 2, 4), torch.zeros(2, 8, 2, 4)
    q, k, v = randn(rng, 2, 1, 2, 4), randn(rng, 2, 1, 2, 4), randn(rng, 2, 1, 2, 4)
    flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=np.array([2, 5], np.int32))
    assert_same_bits(kc.numpy()[1, 5], k[1, 0])
    assert_same_bits(vc.numpy()[0, 2], v[0, 0])


# --------------------------------------------------------------------------
# The same classes of fault by other routes: a failure under the caller's NumPy
# error state, memory shared inside a cache, arguments read through a
# conversion, masked scalars, Dask's checks, results beyond memory


def test_append_that_overflows_the_cache_dtype_under_raise_leaves_it_untouched(rng):
    kc = np.zeros((1, 8, 1, 4), np.float16)
    vc = np.zeros((1, 8, 1, 4), np.float16)
    q = randn(rng, 1, 1, 1, 4)
    big = np.full((1, 1, 1, 4), 1e10, np.float32)
    for k, v in ((q, big), (big, q)):
        with np.errstate(over="raise"), pytest.raises(FloatingPointError):
            flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=[3])
        assert not kc.any() and not vc.any()


def test_append_into_a_cache_whose_positions_share_memory_is_refused(rng):
    row = np.zeros((1, 8, 1, 4), np.float32)
    for kc in (np.lib.stride_tricks.as_strided(row, (2, 8, 1, 4), (0, 16, 16, 4)),
               np.lib.stride_tricks.as_strided(row, (2, 8, 1, 4), (16, 16, 16, 4))):
        q = randn(rng, 2, 1, 1, 4)
        with pytest.raises(ValueError, match="k_cache's positions share memory"):
            flash_attn_with_kvcache(q, kc, randn(rng, 2, 8, 1, 4), q, q, cache_seqlens=[3, 3])
        assert not row.any()
        flash_attn_with_kvcache(q, kc, kc, cache_seqlens=[3, 3])  # reading it is fine
    # transposed and padded layouts do not overlap
    fine = np.zeros((8, 2, 1, 6), np.float32)[..., :4].transpose(1, 0, 2, 3)
    q = randn(rng, 2, 1, 1, 4)
    flash_attn_with_kvcache(q, fine, fine.copy(), q, q, cache_seqlens=[3, 3])
    assert_same_bits(fine[:, 3], q[:, 0])


def test_out_overlapping_a_buffer_protocol_or_array_like_argument(rng):
    q = randn(rng, 4, 1, 2)
    buf = bytearray(64)
    cu = memoryview(buf).cast("q")[:2]  # (the buffer protocol: int64 offsets)
    cu[1] = 4
    with pytest.raises(ValueError, match="share memory with cu_seqlens_q"):
        fastattn.varlen_attention(q, q, q, cu, [0, 4], out=np.frombuffer(buf, np.float32)[:8]
                                  .reshape(4, 1, 2))
    assert cu.tolist() == [0, 4]

    class Frame:  # only __array__, as pandas and xarray objects have
        def __init__(self, a):
            self.a = a

        def __array__(self, dtype=None, copy=None):
            return self.a

    k64 = np.zeros((3, 2, 4))
    with pytest.raises(ValueError, match="share memory with k"):
        fastattn.scaled_dot_product_attention(
            randn(rng, 3, 2, 4), Frame(k64), randn(rng, 3, 2, 4),
            out=k64.reshape(-1).view(np.float32)[:24].reshape(3, 2, 4))
    assert not k64.any()


def test_rotary_huge_offsets_and_failed_in_place_rotation(rng):
    from fastattn.flash_attn.layers.rotary import apply_rotary_emb

    x = randn(rng, 1, 2, 1, 4)
    cos, sin = np.ones((4, 2), np.float32), np.ones((4, 2), np.float32)
    for offset in (2**63, 2**70, np.uint64(2**64 - 1)):
        with pytest.raises(ValueError, match="seqlen_offsets must hold"):
            apply_rotary_emb(x, cos, sin, seqlen_offsets=offset)
    y = np.full((1, 2, 1, 4), 3e38, np.float32)
    y0 = y.copy()
    with np.errstate(over="raise"), pytest.raises(FloatingPointError):
        apply_rotary_emb(y, cos, sin, inplace=True)
    assert_same_bits(y, y0)


def test_masked_scalars_are_refused(rng):
    m = np.ma.array(3, mask=True)
    x = randn(rng, 2, 4)
    q = randn(rng, 1, 1, 1, 4)
    kc = np.zeros((1, 8, 1, 4), np.float32)
    for call in (lambda: flash_attn_with_kvcache(q, kc, kc.copy(), q, q, cache_seqlens=m),
                 lambda: fastattn.scaled_dot_product_attention(x, x, x, window=(m, 0)),
                 lambda: fastattn.sliding_window_attention(x, x, x, m),
                 lambda: fastattn.softmax(x, axis=np.ma.array(0, mask=True))):
        with pytest.raises((TypeError, ValueError), match="must be an int|axis"):
            call()
    assert not kc.any()


@pytest.mark.skipif(da is None, reason="needs dask")
def test_dask_checks_like_the_in_memory_function_everywhere(rng):
    import warnings

    q = randn(rng, 2, 5, 8)
    dq = da.from_array(q, chunks=(1, 5, -1))
    with pytest.raises(TypeError, match="no dropout"):
        fdask.scaled_dot_product_attention(dq, dq, dq, dropout_p=0.1)
    for ids in ([2**64] * 5, [2**63, -1, 0, 0, 0]):
        with pytest.raises(ValueError) as mem:
            fastattn.scaled_dot_product_attention(q, q, q, segment_ids=ids)
        with pytest.raises(ValueError) as lazy:
            fdask.scaled_dot_product_attention(dq, dq, dq, segment_ids=ids)
        assert str(mem.value) == str(lazy.value)
    masked = np.ma.masked_array([0.5, 1.0], mask=[False, True])
    with pytest.raises(TypeError, match="alibi_slopes must be a plain array"):
        fdask.scaled_dot_product_attention(dq, dq, dq, alibi_slopes=da.from_array(masked))
    with warnings.catch_warnings():  # a sink beyond float32 is +inf, silently, as in memory
        warnings.simplefilter("error")
        got = fdask.scaled_dot_product_attention(dq, dq, dq, sinks=[1e300, 0.5])
        assert_close(got.compute(scheduler="sync"),
                     fastattn.scaled_dot_product_attention(q, q, q, sinks=[1e300, 0.5]))


def test_results_beyond_memory_are_named_on_the_fast_path():
    row = np.ones((1, 1, 4), np.float32)
    q = np.broadcast_to(row, (1, 2**58, 4))
    with pytest.raises((MemoryError, ValueError), match="the output of shape"):
        fastattn.scaled_dot_product_attention(q, row, row)
