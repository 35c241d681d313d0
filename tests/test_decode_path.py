"""The few-query-rows path (decoding: a unit of at most 8 query rows, one per
head or the heads of one GQA group) reads k and v in place instead of packing
tiles; it must give every row exactly the bits the general path gives it:
decode, short and long calls agree where they overlap, on every SIMD path and
for any thread count."""
import numpy as np
import pytest

import fastattn
from fastattn import _core

from conftest import SIMD_PATHS, assert_close, assert_same_bits, qkv


def _sdpa(q, k, v, mask=None, **kw):
    return fastattn.scaled_dot_product_attention(q, k, v, mask, return_lse=True,
                                                 enable_gqa=q.shape[-3] != k.shape[-3], **kw)


# (heads, kv heads, S, D, Dv): groups of 1 to 9 rows per unit at L = 1 (9: the
# general path), S across a key chunk (1024), D and Dv off the vector widths.
SHAPES = [(4, 4, 70, 16, 16), (8, 2, 2100, 64, 64), (14, 2, 256, 64, 64), (7, 7, 33, 13, 20),
          (16, 2, 300, 24, 40), (9, 1, 129, 8, 8), (3, 1, 1500, 128, 128), (2, 2, 5, 3, 1)]


@pytest.mark.parametrize("H,Hkv,S,D,Dv", SHAPES)
@pytest.mark.parametrize("causal", [False, True])
def test_decode_rows_have_the_bits_of_a_prefill(simd, rng, H, Hkv, S, D, Dv, causal):
    L = 40
    q, k, v = qkv(rng, (2, H, L, D), (2, Hkv, S, D), (2, Hkv, S, Dv))
    full, lse = _sdpa(q, k, v, is_causal=causal)
    for i in (0, 17, L - 1):
        # row i sees keys j <= i + S - L under causal (bottom-right): alone, with
        # exactly those keys it is the last row of a decoding step
        Si = i + S - L + 1 if causal else S
        if Si < 1:
            continue
        o, lo = _sdpa(q[:, :, i:i + 1], k[:, :, :Si], v[:, :, :Si], is_causal=causal)
        assert_same_bits(o, full[:, :, i:i + 1])
        assert_same_bits(lo, lse[:, :, i:i + 1])
        # a short call: a few rows (still the few-rows path for small groups)
        o3, l3 = _sdpa(q[:, :, i:i + 3], k, v)
        f3, g3 = _sdpa(q, k, v)
        assert_same_bits(o3, f3[:, :, i:i + 3])
        assert_same_bits(l3, g3[:, :, i:i + 3])


@pytest.mark.parametrize("nthreads", [1, 2, 3])
def test_decode_bits_do_not_depend_on_threads(simd, rng, threads, nthreads):
    # one kv head and a long cache: the unit's key chunks are split over threads
    q, k, v = qkv(rng, (1, 4, 1, 64), (1, 1, 5000, 64), (1, 1, 5000, 64))
    threads(1)
    want = _sdpa(q, k, v)
    threads(nthreads)
    got = _sdpa(q, k, v)
    assert_same_bits(got[0], want[0])
    assert_same_bits(got[1], want[1])
    assert_close(got[0], fastattn.reference.scaled_dot_product_attention(
        q, k, v, enable_gqa=True))


def test_decode_masks_and_windows_match_the_general_path(simd, rng):
    B, H, Hkv, L, S, D = 3, 6, 2, 24, 300, 32
    q, k, v = qkv(rng, (B, H, L, D), (B, Hkv, S, D), (B, Hkv, S, D))
    pad = (np.arange(S) < np.array([300, 120, 1])[:, None])[:, None, None, :]
    fmask = rng.standard_normal((B, 1, L, S)).astype(np.float32)
    fmask[fmask < -1.0] = -np.inf
    for mask, window, rows in [(pad, None, (0, 11, L - 1)), (fmask, None, (0, 11, L - 1)),
                               (None, (50, 3), (L - 1,)), (pad, (7, 7), (L - 1,))]:
        # (a lone row sits where the last row of the call sits: windows are
        # checked on that row)
        full = _sdpa(q, k, v, mask, window=window)
        for i in rows:
            mi = mask if mask is None or mask.shape[-2] == 1 else mask[..., i:i + 1, :]
            o = _sdpa(q[:, :, i:i + 1], k, v, mi, window=window)
            assert_same_bits(o[0], full[0][:, :, i:i + 1])
            assert_same_bits(o[1], full[1][:, :, i:i + 1])


def test_decode_non_finite_values_only_where_allowed(simd, rng):
    q, k, v = qkv(rng, (1, 4, 1, 16), (1, 1, 200, 16), (1, 1, 200, 16))
    pad = np.arange(200) < 150
    v[0, 0, 170] = np.nan  # a masked key: never read
    o = _sdpa(q, k, v, pad)[0]
    assert np.isfinite(o).all()
    assert_same_bits(o, _sdpa(np.repeat(q, 30, axis=2), k, v, pad)[0][:, :, :1])
    v[0, 0, 10] = np.inf  # an allowed key: inf or NaN reaches the output
    o = _sdpa(q, k, v, pad)[0]
    assert not np.isfinite(o).all()
    assert_same_bits(o, _sdpa(np.repeat(q, 30, axis=2), k, v, pad)[0][:, :, :1])


def test_decode_non_finite_or_huge_values_inside_the_span(simd, rng):
    # Decoding reads float32 v in place and checks a tile only when its
    # products are not finite: a masked key inside the allowed span holding
    # NaN or inf must not reach the row, and finite values whose products
    # overflow keep the general path's bits.
    q, k, v = qkv(rng, (1, 4, 1, 32), (1, 2, 300, 32), (1, 2, 300, 32))
    mask = np.ones(300, bool)
    mask[[5, 70, 199]] = False
    for bad in (np.nan, np.inf, -np.inf):
        v2 = v.copy()
        v2[0, :, [5, 70, 199]] = bad
        o = _sdpa(q, k, v2, mask)
        assert np.isfinite(o[0]).all()
        assert_same_bits(o[0], _sdpa(q, k, v, mask)[0])
        assert_same_bits(o[0], _sdpa(np.repeat(q, 30, axis=2), k, v2, mask)[0][:, :, :1])
    v2 = v.copy()
    v2[0, :, 100:110] = np.float32(3e38)  # allowed: the sums overflow to inf
    o = _sdpa(q, k, v2, mask)
    assert not np.isfinite(o[0]).all()
    assert_same_bits(o[0], _sdpa(np.repeat(q, 30, axis=2), k, v2, mask)[0][:, :, :1])


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
# D: the few-rows scores' steps of 32, 16 and 8 elements and the last ones
@pytest.mark.parametrize("D,Dv", [(24, 20), (45, 32), (128, 128)])
def test_decode_half_precision_kv_matches_the_general_path(simd, rng, dtype, D, Dv):
    if dtype == "bfloat16":
        ml_dtypes = pytest.importorskip("ml_dtypes")
        dt = ml_dtypes.bfloat16
    else:
        dt = np.float16
    L, S = 30, 1100
    q, k, v = qkv(rng, (1, 8, L, D), (1, 2, S, D), (1, 2, S, Dv))
    k, v = k.astype(dt), v.astype(dt)
    full = _sdpa(q, k, v)
    for i in (0, L - 1):
        o = _sdpa(q[:, :, i:i + 1], k, v)
        assert_same_bits(o[0], full[0][:, :, i:i + 1])
        assert_same_bits(o[1], full[1][:, :, i:i + 1])


def test_decode_strided_kv_matches_the_general_path(simd, rng):
    # k and v in the (B, S, heads, D) layout of a KV cache, viewed as (B, heads, S, D)
    L, S = 30, 700
    q = qkv(rng, (2, 8, L, 16), (1,), (1,))[0]
    k = rng.standard_normal((2, S, 2, 16)).astype(np.float32).transpose(0, 2, 1, 3)
    v = rng.standard_normal((2, S, 2, 16)).astype(np.float32).transpose(0, 2, 1, 3)
    full = _sdpa(q, k, v)
    dense = _sdpa(q, np.ascontiguousarray(k), np.ascontiguousarray(v))
    assert_same_bits(full[0], dense[0])
    for i in (0, L - 1):
        o = _sdpa(q[:, :, i:i + 1], k, v)
        assert_same_bits(o[0], full[0][:, :, i:i + 1])
        assert_same_bits(o[1], full[1][:, :, i:i + 1])


@pytest.mark.parametrize("kvdtype", ["float32", "float16"])
def test_decode_of_a_strided_cache_split_by_key_chunks(simd, rng, threads, kvdtype):
    # a (B, S, heads, D) cache with several kv heads and keys over several
    # chunks (1024): its few-row units are split into key chunks, a chunk of
    # several heads at a time, at any thread count. The bits must be those of
    # the contiguous cache (whose units are not split) for 1, 2 and 3 threads,
    # with odd S, partial tiles, a window and an ALiBi bias.
    B, Hkv, S, D = 2, 3, 2600, 24
    q = qkv(rng, (B, 6, 1, D), (1,), (1,))[0]
    k = rng.standard_normal((B, S, Hkv, D)).astype(kvdtype).transpose(0, 2, 1, 3)
    v = rng.standard_normal((B, S, Hkv, D + 8)).astype(kvdtype).transpose(0, 2, 1, 3)
    for kw in ({}, {"window": (1500, 0), "alibi_slopes": np.full(6, 0.01, np.float32)}):
        threads(1)
        want = _sdpa(q, np.ascontiguousarray(k), np.ascontiguousarray(v), **kw)
        for n in (1, 2, 3):
            threads(n)
            got = _sdpa(q, k, v, **kw)
            assert_same_bits(got[0], want[0])
            assert_same_bits(got[1], want[1])


@pytest.mark.skipif(not {"avx2", "avx512"} <= set(SIMD_PATHS),
                    reason="needs the AVX2 and AVX-512 paths")
def test_avx512_path_agrees_with_the_avx2_path(rng):
    # The AVX-512 variant takes every product and every exponential as the
    # AVX2 one does, and sums a tile's exponentials in sixteen lanes instead of
    # eight: attention agrees to float32 rounding, the weights and softmax
    # (no tile sums) bit for bit.
    q, k, v = qkv(rng, (2, 4, 130, 64), (2, 2, 300, 64), (2, 2, 300, 40))
    pad = (np.arange(300) < np.array([300, 77])[:, None])[:, None, None, :]
    before = fastattn.show_config(print_=False)["simd"]
    got = {}
    try:
        for path in ("avx2", "avx512"):
            _core.select_simd(path)
            got[path] = (_sdpa(q, k, v, pad, is_causal=True), _sdpa(q[:, :, :1], k, v),
                         fastattn.attention_weights(q, k, pad, enable_gqa=True),
                         fastattn.softmax(q))
    finally:
        _core.select_simd(before)
    for a, b in zip(got["avx2"][:2], got["avx512"][:2]):
        for x, y in zip(a if isinstance(a, tuple) else (a,), b if isinstance(b, tuple) else (b,)):
            np.testing.assert_allclose(x, y, rtol=2e-6, atol=1e-7)
    for x, y in zip(got["avx2"][2:], got["avx512"][2:]):
        assert_same_bits(x, y)


def test_decode_score_options_match_the_general_path(simd, rng):
    # softcap, ALiBi, sinks and segment ids on the few-rows path: a decoding
    # step is the last row of a prefill over the same keys
    B, H, Hkv, L, S, D = 2, 8, 2, 32, 700, 32
    q, k, v = qkv(rng, (B, H, L, D), (B, Hkv, S, D), (B, Hkv, S, D))
    slopes = rng.uniform(0.01, 0.5, H).astype(np.float32)
    sinks = rng.standard_normal(H).astype(np.float32)
    kv_ids = np.repeat(np.arange(S) // 200, 1)[None].repeat(B, 0)
    q_ids = np.full((B, L), 3)
    q_ids[1] = 2
    for kw in [{"softcap": 5.0}, {"alibi_slopes": slopes}, {"sinks": sinks},
               {"segment_ids": (q_ids[:, None, :], kv_ids[:, None, :])},
               {"softcap": 3.0, "alibi_slopes": slopes, "sinks": sinks, "is_causal": True}]:
        full = _sdpa(q, k, v, **kw)
        if "segment_ids" in kw:
            kw = dict(kw, segment_ids=(q_ids[:, None, -1:], kv_ids[:, None, :]))
        last = _sdpa(q[:, :, -1:], k, v, **kw)
        assert_same_bits(last[0], full[0][:, :, -1:])
        assert_same_bits(last[1], full[1][:, :, -1:])


@pytest.mark.parametrize("kvdtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("D, Dv", [(40, 32), (24, 80)])
def test_decode_of_a_strided_cache_reads_all_kv_heads_at_once(simd, rng, threads, kvdtype, D,
                                                              Dv):
    # A (B, S, kv heads, D) cache decoded with GQA groups: one unit reads a key
    # tile's rows for all kv heads at once, 16 keys at a time (each head's rows
    # its own products, each P.V sum going on from the previous keys', with
    # its own non-finite check). Every option, and a NaN / inf value in one
    # head only (masked in some rows' ranges, allowed in others), must give
    # the bits of the contiguous cache. S = 1300 ends in a tile of 20 keys;
    # Dv = 80 takes the 64-column P.V blocks and a 16-column one.
    if kvdtype == "bfloat16":
        dt = pytest.importorskip("ml_dtypes").bfloat16
    else:
        dt = np.dtype(kvdtype)
    B, H, Hkv, S = 2, 12, 4, 1300
    q = qkv(rng, (B, H, 1, D), (1,), (1,))[0]
    k = rng.standard_normal((B, S, Hkv, D)).astype(dt).transpose(0, 2, 1, 3)
    v = rng.standard_normal((B, S, Hkv, Dv)).astype(dt).transpose(0, 2, 1, 3)
    v[1, 2, 1100] = np.nan  # kv head 2 of batch item 1 only
    v[0, 1, 40] = np.inf
    slopes = rng.uniform(0.01, 0.5, H).astype(np.float32)
    sinks = rng.standard_normal(H).astype(np.float32)
    pad = (np.arange(S) < np.array([S, 1000])[:, None])[:, None, None, :]
    kv_ids = (np.arange(S) // 300)[None].repeat(B, 0)[:, None, :]
    q_ids = np.array([[[1]], [[4]]])
    cases = [{}, {"mask": pad}, {"softcap": 4.0, "alibi_slopes": slopes, "sinks": sinks},
             {"segment_ids": (q_ids, kv_ids)}, {"window": (500, 0), "is_causal": True}]
    for kw in cases:
        kw = dict(kw)
        mask = kw.pop("mask", None)
        threads(1)
        want = _sdpa(q, np.ascontiguousarray(k), np.ascontiguousarray(v), mask, **kw)
        for n in (1, 2):
            threads(n)
            got = _sdpa(q, k, v, mask, **kw)
            assert_same_bits(got[0], want[0])
            assert_same_bits(got[1], want[1])
    # a non-finite value reaches only the rows that may see it: kv head 1's
    # group of item 0 (inf), kv head 2's of item 1 unless padded out (NaN)
    for mask, item1 in ((None, False), (pad, True)):
        o = _sdpa(q, k, v, mask)[0]
        assert not np.isfinite(o[0, 3:6]).all()
        assert np.isfinite(o[0, :3]).all() and np.isfinite(o[0, 6:]).all()
        assert np.isfinite(o[1, 6:9]).all() == item1
        assert np.isfinite(o[1, :6]).all() and np.isfinite(o[1, 9:]).all()
