"""Quantized k and v (GGUF q8_0 and q4_0 blocks) in attention.

A fastattn.QuantizedArray k or v is read as its blocks: every result must be
bitwise that of the same call on ``k.dequantize()``, ``v.dequantize()`` (an
integer times a float16 scale is exact in float32, and the kernels convert
element by element), on every SIMD path, every entry point and layout, with
no float32 copy of the cache made. The format itself (bytes equal to
gguf-py's quantizer): test_quantized_format.py.
"""
from pathlib import Path

import numpy as np
import pytest

import fastattn
from fastattn import _core
from fastattn.flash_attn import (flash_attn_func, flash_attn_varlen_func,
                                 flash_attn_with_kvcache)

from conftest import assert_same_bits, qkv, randn, traced_peak

sdpa = fastattn.scaled_dot_product_attention
FORMATS = ["q8_0", "q4_0"]


def deq(x):
    return x.dequantize() if isinstance(x, fastattn.QuantizedArray) else x


def both(fn, q, k, v, *args, **kw):
    """fn on (k, v) as given and on their dequantized values."""
    return fn(q, k, v, *args, **kw), fn(q, deq(k), deq(v), *args, **kw)


def assert_pairs_same(got, want):
    if isinstance(got, tuple):
        for g, w in zip(got, want):
            assert_same_bits(g, w)
    else:
        assert_same_bits(got, want)


OPTIONS = {
    "plain": {},
    "causal": dict(is_causal=True),
    "window": dict(window=(13, 2)),
    "causal-window": dict(is_causal=True, window=(70, None)),
    "scale": dict(scale=0.7),
}


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("opt", list(OPTIONS))
@pytest.mark.parametrize("shape", [(1, 300, 64, 64), (1, 1100, 128, 128), (3, 77, 32, 96),
                                   (70, 70, 64, 32), (130, 200, 96, 64), (5, 0, 32, 32)],
                         ids=lambda s: "L%d-S%d-D%d-Dv%d" % s)
def test_quantized_kv_equals_dequantized(simd, rng, fmt, opt, shape):
    L, S, D, Dv = shape
    q, k, v = qkv(rng, (2, 3, L, D), (2, 3, S, D), (2, 3, S, Dv))
    kq, vq = fastattn.quantize_kv(k, fmt), fastattn.quantize_kv(v, fmt)
    got, want = both(sdpa, q, kq, vq, return_lse=True, **OPTIONS[opt])
    assert_pairs_same(got, want)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("L", [1, 2, 5, 64])
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_quantized_decoding_grouped_heads(simd, rng, fmt, L, layout):
    # 32 query heads over 8 kv heads (the few-rows kernels, one kv head or
    # several a unit), keys over several 1024-key chunks; a (B, S, H, D)
    # cache is a view whose rows interleave the kv heads.
    S, D = 2100, 128
    q = randn(rng, 1, 32, L, D)
    k, v = randn(rng, 1, S, 8, D), randn(rng, 1, S, 8, D)
    kq, vq = fastattn.quantize_kv(k, fmt), fastattn.quantize_kv(v, fmt)
    if layout == "bshd":
        kq, vq = kq.swapaxes(1, 2), vq.swapaxes(1, 2)
    else:
        kq, vq = fastattn.quantize_kv(k.swapaxes(1, 2), fmt), fastattn.quantize_kv(
            v.swapaxes(1, 2), fmt)
    for kw in ({}, dict(is_causal=True), dict(window=(500, 0))):
        got, want = both(sdpa, q, kq, vq, enable_gqa=True, return_lse=True, **kw)
        assert_pairs_same(got, want)


@pytest.mark.parametrize("fmt", FORMATS)
def test_quantized_bits_do_not_depend_on_threads(rng, threads, fmt):
    q, k, v = qkv(rng, (1, 8, 1, 64), (1, 2, 3000, 64), (1, 2, 3000, 64))
    kq, vq = fastattn.quantize_kv(k, fmt), fastattn.quantize_kv(v, fmt)
    results = []
    for n in (1, 2, 3):
        threads(n)
        results.append(sdpa(q, kq, vq, enable_gqa=True))
    for r in results[1:]:
        assert_same_bits(r, results[0])


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("opt", ["softcap", "alibi", "sinks", "segments", "mask", "all"])
@pytest.mark.parametrize("L", [1, 37])
def test_quantized_kv_with_score_options(simd, rng, fmt, opt, L):
    Hq, S = 6, 140
    seg = np.sort(rng.integers(0, 3, S))
    mask = rng.random((Hq, L, S)) < 0.8
    kw = {
        "softcap": dict(softcap=7.5),
        "alibi": dict(alibi_slopes=rng.random(Hq).astype(np.float32)),
        "sinks": dict(sinks=randn(rng, Hq)),
        "segments": dict(segment_ids=(seg[S - L:], seg)),
        "mask": dict(attn_mask=mask),
        "all": dict(softcap=3.0, alibi_slopes=rng.random(Hq).astype(np.float32),
                    sinks=randn(rng, Hq), segment_ids=(seg[S - L:], seg), is_causal=True,
                    window=(50, None), attn_mask=np.where(mask, 0.0, -np.inf)),
    }[opt]
    q, k, v = qkv(rng, (2, Hq, L, 64), (2, 2, S, 64), (2, 2, S, 32))
    kq, vq = fastattn.quantize_kv(k, fmt), fastattn.quantize_kv(v, fmt)
    got, want = both(sdpa, q, kq, vq, enable_gqa=True, return_lse=True, **kw)
    assert_pairs_same(got, want)


@pytest.mark.parametrize("kfmt,vkind", [("q8_0", "q4_0"), ("q4_0", "float16"),
                                        ("q8_0", "float32"), ("float32", "q8_0"),
                                        ("bfloat16", "q4_0")])
def test_quantized_and_plain_mixed(simd, rng, kfmt, vkind):
    from conftest import ml_dtypes
    if ml_dtypes is None and "bfloat16" in (kfmt, vkind):
        pytest.skip("ml_dtypes is not installed")

    def make(x, kind):
        if kind in FORMATS:
            return fastattn.quantize_kv(x, kind)
        return x.astype(ml_dtypes.bfloat16 if kind == "bfloat16" else kind)

    q, k, v = qkv(rng, (2, 4, 9, 64), (2, 4, 150, 64), (2, 4, 150, 64))
    kk, vv = make(k, kfmt), make(v, vkind)
    for L in (9, 1):
        got = sdpa(q[:, :, :L], kk, vv, is_causal=True, return_lse=True)
        want = sdpa(q[:, :, :L], deq(kk).astype(np.float32), deq(vv).astype(np.float32),
                    is_causal=True, return_lse=True)
        assert_pairs_same(got, want)


@pytest.mark.parametrize("fmt", FORMATS)
def test_quantized_attention_weights(simd, rng, fmt):
    q, k = randn(rng, 2, 19, 64), randn(rng, 2, 77, 64)
    kq = fastattn.quantize_kv(k, fmt)
    for kw in ({}, dict(is_causal=True), dict(window=(3, 3))):
        assert_same_bits(fastattn.attention_weights(q, kq, **kw),
                         fastattn.attention_weights(q, kq.dequantize(), **kw))


@pytest.mark.parametrize("fmt", FORMATS)
def test_quantized_varlen(simd, rng, fmt):
    cu_q = np.array([0, 3, 3, 20, 21])
    cu_k = np.array([0, 50, 60, 150, 300])
    q, k, v = qkv(rng, (21, 4, 32), (300, 2, 32), (300, 2, 64))
    kq, vq = fastattn.quantize_kv(k, fmt), fastattn.quantize_kv(v, fmt)
    for kw in ({}, dict(is_causal=True, softcap=5.0), dict(window=(10, 0))):
        got, want = both(fastattn.varlen_attention, q, kq, vq, cu_q, cu_k, return_lse=True,
                         **kw)
        assert_pairs_same(got, want)


@pytest.mark.parametrize("fmt", FORMATS)
def test_quantized_flash_attn_func_and_varlen(simd, rng, fmt):
    q, k, v = qkv(rng, (2, 50, 4, 64), (2, 70, 2, 64), (2, 70, 2, 32))
    kq, vq = fastattn.quantize_kv(k, fmt), fastattn.quantize_kv(v, fmt)
    got, want = both(flash_attn_func, q, kq, vq, causal=True, return_attn_probs=True)
    assert_pairs_same(got[:2], want[:2])
    cu_q, cu_k = np.array([0, 30, 50], np.int32), np.array([0, 40, 70], np.int32)
    got, want = both(flash_attn_varlen_func, q.reshape(-1, 4, 64)[:50],
                     kq.reshape(-1, 2, 64)[:70], vq.reshape(-1, 2, 32)[:70], cu_q, cu_k, 30, 40,
                     causal=True)
    assert_pairs_same(got, want)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
@pytest.mark.parametrize("L_new", [1, 3])
def test_quantized_kvcache_appends_quantized_rows(simd, rng, fmt, paged, L_new):
    B, S_max, Hkv, H, D = 2, 256, 2, 4, 64
    kc = fastattn.quantize_kv(randn(rng, B, S_max, Hkv, D), fmt)
    vc = fastattn.quantize_kv(randn(rng, B, S_max, Hkv, D), fmt)
    q = randn(rng, B, L_new, H, D)
    k_new, v_new = randn(rng, B, L_new, Hkv, D), randn(rng, B, L_new, Hkv, D)
    seqlens = np.array([100, 37])
    kw = dict(cache_seqlens=seqlens, causal=True)
    if paged:  # pages of 64 positions, shuffled
        kc, vc = (c.reshape(B * S_max // 64, 64, Hkv, D) for c in (kc, vc))
        kw["block_table"] = np.array([[3, 0, 5, 1], [2, 4, 6, 7]], np.int32)
    kf, vf = kc.dequantize(), vc.dequantize()
    before = kc.blocks.copy()
    got = flash_attn_with_kvcache(q, kc, vc, k_new, v_new, return_softmax_lse=True, **kw)
    # the float call, on the values the appended rows are quantized to
    want = flash_attn_with_kvcache(q, kf, vf, fastattn.quantize_kv(k_new, fmt).dequantize(),
                                   fastattn.quantize_kv(v_new, fmt).dequantize(),
                                   return_softmax_lse=True, **kw)
    assert_pairs_same(got, want)
    # the cache holds the appended rows' blocks, the rest untouched
    assert np.array_equal(kc.dequantize(), kf) and np.array_equal(vc.dequantize(), vf)
    written = (kc.blocks != before).any(axis=-1)
    assert written.sum() <= B * L_new * Hkv
    new_blocks = fastattn.quantize_kv(k_new, fmt).blocks
    for b in range(B):
        for i in range(L_new):
            pos = seqlens[b] + i
            if paged:
                page = kw["block_table"][b, pos // 64]
                row = kc.blocks[page, pos % 64]
            else:
                row = kc.blocks[b, pos]
            assert np.array_equal(row, new_blocks[b, i])


def test_quantized_kvcache_failure_leaves_the_cache_as_it_was(rng):
    kc = fastattn.quantize_kv(randn(rng, 1, 64, 1, 32))
    vc = fastattn.quantize_kv(randn(rng, 1, 64, 1, 32))
    before = kc.blocks.copy(), vc.blocks.copy()
    q, k, v = randn(rng, 1, 1, 1, 32), randn(rng, 1, 1, 1, 32), randn(rng, 1, 1, 1, 32)
    with pytest.raises(ValueError, match="out"):
        flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=5,
                                out=np.zeros((1, 1, 1, 16), np.float32))
    k[0, 0, 0, 0] = np.nan  # refused before anything is written, naming k
    with pytest.raises(ValueError, match="^k has non-finite values"):
        flash_attn_with_kvcache(q, kc, vc, k, v, cache_seqlens=5)
    with pytest.raises(ValueError, match="^v .*too large"):  # (float64 beyond float16 scales)
        flash_attn_with_kvcache(q, kc, vc, v, np.full((1, 1, 1, 32), 1e300), cache_seqlens=5)
    # a cache whose positions share memory is refused for appends, naming it
    shared = np.lib.stride_tricks.as_strided(np.zeros((1, 1, 1, 34), np.uint8), (1, 64, 1, 34),
                                             (0, 0, 0, 1), writeable=True)
    with pytest.raises(ValueError, match="k_cache's positions share memory"):
        flash_attn_with_kvcache(q, fastattn.QuantizedArray.from_blocks(shared, "q8_0"), vc, v, v,
                                cache_seqlens=5)
    assert np.array_equal(kc.blocks, before[0]) and np.array_equal(vc.blocks, before[1])


def test_quantized_read_only_cache_is_refused_for_appends(rng):
    blocks = fastattn.quantize_kv(randn(rng, 1, 64, 1, 32)).blocks
    blocks.setflags(write=False)
    kc = fastattn.QuantizedArray.from_blocks(blocks, "q8_0")
    q, k = randn(rng, 1, 1, 1, 32), randn(rng, 1, 1, 1, 32)
    with pytest.raises(ValueError, match="k_cache must be writeable"):
        flash_attn_with_kvcache(q, kc, kc.copy(), k, k, cache_seqlens=5)
    flash_attn_with_kvcache(q, kc, kc, cache_seqlens=5)  # (reading only: fine)


@pytest.mark.parametrize("fmt", FORMATS)
def test_quantized_dask_chunks(rng, fmt):
    da = pytest.importorskip("dask.array")
    dask = pytest.importorskip("dask")
    import fastattn.dask as fd

    q = randn(rng, 2, 4, 300, 64)
    k, v = randn(rng, 2, 2, 500, 64), randn(rng, 2, 2, 500, 32)
    kq, vq = fastattn.quantize_kv(k, fmt), fastattn.quantize_kv(v, fmt)
    kw = dict(enable_gqa=True, is_causal=True, return_lse=True)
    with dask.config.set(scheduler="synchronous"):
        # one block each: the in-memory call's bits
        got = [x.compute() for x in fd.scaled_dot_product_attention(q, kq, vq, **kw)]
        assert_pairs_same(tuple(got), sdpa(q, kq.dequantize(), vq.dequantize(), **kw))
        # chunks of quantized blocks (rechunked to meet each other): those of
        # the dequantized chunks, block by block
        qd = da.from_array(q, chunks=(1, 4, 100, 64))
        kd = da.from_array(kq, chunks=(1, 2, 128, 64), asarray=False)
        vd = da.from_array(vq, chunks=(2, 1, 100, 32), asarray=False)
        got = [x.compute() for x in fd.scaled_dot_product_attention(qd, kd, vd, **kw)]
        want = [x.compute() for x in fd.scaled_dot_product_attention(
            qd, da.from_array(kq.dequantize(), chunks=(1, 2, 128, 64)),
            da.from_array(vq.dequantize(), chunks=(2, 1, 100, 32)), **kw)]
        assert_pairs_same(tuple(got), tuple(want))
        # the tasks read quantized blocks: a rechunk joins them still quantized
        merged = kd.rechunk((2, 2, 250, 64)).blocks[0, 0, 1].compute()
        with pytest.raises(TypeError, match="q is a QuantizedArray"):  # (when called)
            fd.scaled_dot_product_attention(fastattn.quantize_kv(q), kq, vq)
        assert isinstance(merged, fastattn.QuantizedArray)
        assert np.array_equal(merged.blocks, kq.blocks[:, :, 250:])


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("L", [1, 40])
def test_quantized_non_finite_scales(simd, rng, fmt, L):
    # Blocks whose float16 scale is inf or NaN (bytes from elsewhere: the
    # quantizer never writes them) stand for inf, -inf and NaN values (0 * inf
    # is NaN): the NaN and inf rules of the float call, bit for bit.
    q, k, v = qkv(rng, (1, 4, L, 64), (1, 1, 200, 64), (1, 1, 200, 64))
    kq, vq = fastattn.quantize_kv(k, fmt), fastattn.quantize_kv(v, fmt)
    inf, nan = np.array([0x00, 0x7C], np.uint8), np.array([0x00, 0x7E], np.uint8)
    bb = kq.block_bytes
    kq.blocks[0, 0, 150, bb:bb + 2] = inf   # key 150, elements 32..63
    vq.blocks[0, 0, 20, 0:2] = nan          # value 20, elements 0..31
    vq.blocks[0, 0, 199, bb:bb + 2] = inf
    for kw in ({}, dict(is_causal=True), dict(window=(30, 0)), dict(window=(0, 0))):
        got, want = both(sdpa, q, kq, vq, enable_gqa=True, return_lse=True, **kw)
        assert_pairs_same(got, want)
    assert np.isnan(sdpa(q, kq, vq, enable_gqa=True)).any()


def test_quantized_gguf_bytes_read_in_place(simd, rng):
    # GGUF bytes made by gguf-py itself, wrapped without a copy: the
    # attention of gguf-py's dequantized values
    gguf = pytest.importorskip("gguf")
    q, k, v = qkv(rng, (1, 8, 3, 64), (1, 2, 500, 64), (1, 2, 500, 64))
    for fmt, qtype in (("q8_0", gguf.GGMLQuantizationType.Q8_0),
                       ("q4_0", gguf.GGMLQuantizationType.Q4_0)):
        kb, vb = gguf.quants.quantize(k, qtype), gguf.quants.quantize(v, qtype)
        kq = fastattn.QuantizedArray.from_blocks(kb, fmt)
        vq = fastattn.QuantizedArray.from_blocks(vb, fmt)
        assert np.shares_memory(kq.blocks, kb)
        got = sdpa(q, kq, vq, enable_gqa=True, is_causal=True, return_lse=True)
        want = sdpa(q, gguf.quants.dequantize(kb, qtype), gguf.quants.dequantize(vb, qtype),
                    enable_gqa=True, is_causal=True, return_lse=True)
        assert_pairs_same(got, want)


def test_quantized_kv_makes_no_float_copy(rng):
    # the cache is read as its blocks: nothing near the 8 MiB of its float32
    # values is allocated (numpy's allocations are traced)
    q = randn(rng, 1, 8, 1, 128)
    k, v = randn(rng, 1, 2, 4096, 128), randn(rng, 1, 2, 4096, 128)
    kq, vq = fastattn.quantize_kv(k), fastattn.quantize_kv(v, "q4_0")
    sdpa(q, kq, vq, enable_gqa=True)
    peak = traced_peak(lambda: sdpa(q, kq, vq, enable_gqa=True))
    assert peak < 256 * 1024, peak
    # and strided views (a (B, S, H, D) cache's heads) are read in place too
    kb = fastattn.quantize_kv(np.ascontiguousarray(k.swapaxes(1, 2))).swapaxes(1, 2)
    peak = traced_peak(lambda: sdpa(q, kb, vq, enable_gqa=True))
    assert peak < 256 * 1024, peak


def test_quantized_errors(rng):
    q, k, v = qkv(rng, (1, 2, 3, 64), (1, 2, 100, 64), (1, 2, 100, 64))
    kq, vq = fastattn.quantize_kv(k), fastattn.quantize_kv(v)
    with pytest.raises(TypeError, match="q must be a float array, got a QuantizedArray"):
        sdpa(kq, kq, vq)
    with pytest.raises(TypeError, match="q must be a float array"):
        fastattn.attention_weights(fastattn.quantize_kv(q), kq)
    with pytest.raises(ValueError, match="k's last dimension must equal q's D=32"):
        sdpa(q[..., :32], kq, vq)
    with pytest.raises(ValueError, match="out must not share memory with k"):
        sdpa(q, kq, vq, out=kq.blocks.reshape(-1)[:1536].view(np.float32).reshape(1, 2, 3, 64))
    # only k and v take quantized arrays: a mask or another function's input is
    # refused, not dequantized behind the caller's back
    with pytest.raises(TypeError, match="attn_mask is a QuantizedArray"):
        sdpa(q, kq, vq, attn_mask=fastattn.quantize_kv(np.zeros((3, 96))))
    with pytest.raises(TypeError, match="x is a QuantizedArray"):
        fastattn.softmax(kq)
    with pytest.raises(TypeError, match="attn_mask is a QuantizedArray"):
        fastattn.reference.scaled_dot_product_attention(
            q, kq, vq, attn_mask=fastattn.quantize_kv(np.zeros((3, 96))))
    do = randn(rng, 1, 2, 3, 64)
    o, lse = sdpa(q, kq.dequantize(), vq.dequantize(), return_lse=True)
    with pytest.raises(TypeError, match="k is a QuantizedArray"):
        fastattn.attention_backward(do, q, kq, vq, o, lse)
    with pytest.raises(TypeError, match="v is a QuantizedArray"):
        fastattn.reference.attention_backward(do, q, kq.dequantize(), vq, o, lse)


def test_quantized_reference_twin(rng):
    q, k, v = qkv(rng, (2, 4, 5, 64), (2, 2, 40, 64), (2, 2, 40, 32))
    kq, vq = fastattn.quantize_kv(k), fastattn.quantize_kv(v, "q4_0")
    got = sdpa(q, kq, vq, enable_gqa=True, is_causal=True)
    want = fastattn.reference.scaled_dot_product_attention(q, kq, vq, enable_gqa=True,
                                                           is_causal=True)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert fastattn.reference.quantize_kv is fastattn.quantize_kv


def test_quantized_bounds_are_checked_in_blocks():
    # the kernel's bounds count whole blocks of k and v: a buffer one block
    # short is refused before any read
    q = np.zeros((2, 4, 64), np.float32)
    blocks = np.zeros((2, 6, 68), np.uint8).view(np.dtype((np.void, 34)))  # 2 blocks a row
    kw = dict(k_dtype=_core.DTYPE_CODES["q8_0"], v_dtype=_core.DTYPE_CODES["q8_0"],
              q_off=np.array([0, 256]), k_off=np.array([0, 12]), v_off=np.array([0, 12]),
              q_rs=64, k_rs=2, v_rs=2, nbatch=2, L=4, S=6, D=64, Dv=64, scale=1.0,
              out=np.zeros(512, np.float32), nthreads=1)
    _core.attention(q, blocks, blocks, **kw)
    with pytest.raises(ValueError, match="rejected its arguments"):
        _core.attention(q, blocks, blocks, **dict(kw, k_off=np.array([0, 13])))
    with pytest.raises(ValueError, match="rejected its arguments"):
        _core.attention(q, blocks[:, :, :1], blocks, **kw)
    with pytest.raises(ValueError, match="rejected its arguments"):  # D not whole blocks
        _core.attention(q, blocks, blocks, **dict(kw, D=48, q_rs=48))


SPEED_TOOL = Path(__file__).resolve().parents[1] / "tools" / "kv_cache_speed.py"


@pytest.mark.skipif(not SPEED_TOOL.exists(), reason="tools/ is not at hand (an installed wheel)")
def test_kv_cache_speed_tool_times_every_cache(threads, capsys):
    # tools/kv_cache_speed.py (docs/performance.rst's table) on a small case
    import importlib.util
    spec = importlib.util.spec_from_file_location("kv_cache_speed", SPEED_TOOL)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    med = tool.run((1, 4, 2, 1, 200, 64), "blhd", 1, False, 2)
    assert set(med) == {"float32", "float16", "q8_0", "q4_0"}
    assert all(t > 0 for t in med.values())
    assert "B=1 H=4/2 L=1 S=200 D=64 blhd 1t" in capsys.readouterr().out
