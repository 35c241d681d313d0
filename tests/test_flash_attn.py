"""fastattn.flash_attn: FlashAttention's Python API on the CPU.

Two oracles: the core API (fastattn.scaled_dot_product_attention on the
(B, H, L, D) views, bitwise) and an independent float64 NumPy model of
FlashAttention's conventions written here, after the formulation of
FlashAttention's own tests: the whole cache with a key-padding mask, key
columns counted from the left pad, bottom-right alignment from the number of
valid keys, -1 for an unbounded window side, and the rotary embedding as a
complex rotation.
"""
import doctest
import subprocess
import sys

import numpy as np
import pytest

import fastattn
import fastattn.flash_attn as fa
from fastattn import _core
from fastattn.flash_attn import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache

from conftest import HALF, HALF_IDS, assert_same_bits, randn, traced_peak

TOL = dict(rtol=2e-5, atol=2e-5)


# ----------------------------------------------------------------------------
# The independent model of FlashAttention's conventions (float64)


def model(q, k, v, *, causal=False, window_size=(-1, -1), softmax_scale=None, softcap=0.0,
          alibi_slopes=None, key_valid=None, leftpad=None):
    """q (B, L, H, D), k (B, S, Hkv, D), v (B, S, Hkv, Dv) -> out (B, L, H, Dv),
    lse (B, H, L), probs (B, H, L, S). key_valid (B, S) marks the valid keys;
    leftpad (B,) shifts the key columns (FlashAttention's test's construct_local_mask)."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    B, L, H, D = q.shape
    S = k.shape[1]
    g = H // k.shape[2]
    k, v = np.repeat(k, g, axis=2), np.repeat(v, g, axis=2)
    scale = 1 / np.sqrt(D) if softmax_scale is None else softmax_scale
    s = np.einsum("blhd,bshd->bhls", q, k) * scale
    if softcap > 0:
        s = softcap * np.tanh(s / softcap)
    valid = np.ones((B, S), bool) if key_valid is None else np.asarray(key_valid, bool)
    lp = np.zeros(B, np.int64) if leftpad is None else np.asarray(leftpad, np.int64)
    col = np.arange(S)[None, :] - lp[:, None]                # (B, S) key positions
    sk = valid.sum(-1)                                       # valid keys per sequence
    pos = np.arange(L)[None, :] + sk[:, None] - L            # (B, L) query positions
    left, right = window_size
    if causal:
        right = 0
    allowed = np.broadcast_to(valid[:, None, :], (B, L, S)).copy()
    if left >= 0:
        allowed &= col[:, None, :] >= pos[:, :, None] - left
    if right >= 0:
        allowed &= col[:, None, :] <= pos[:, :, None] + right
    if alibi_slopes is not None:
        slopes = np.asarray(alibi_slopes, np.float64)
        slopes = slopes[None, :, None, None] if slopes.ndim == 1 else slopes[:, :, None, None]
        s = s - slopes * np.abs(pos[:, None, :, None] - col[:, None, None, :])
    allowed = allowed[:, None]                               # (B, 1, L, S)
    s = np.where(allowed, s, -np.inf)
    m = s.max(-1, keepdims=True, initial=-np.inf)
    e = np.where(allowed, np.exp(s - np.where(np.isfinite(m), m, 0)), 0.0)
    z = e.sum(-1)
    with np.errstate(divide="ignore"):
        lse = np.log(z) + np.where(np.isfinite(m[..., 0]), m[..., 0], 0)
    w = e / np.where(z > 0, z, 1)[..., None]
    return np.einsum("bhls,bshd->blhd", w, v), lse, w


def rope_model(x, cos, sin, positions, interleaved):
    """Rotary embedding as complex multiplication: feature pairs (x_a, x_b) form
    x_a + i x_b, turned by angle theta with cos(theta), sin(theta) from the tables."""
    x = np.asarray(x, np.float64).copy()
    half = cos.shape[1]
    rot = (cos[positions] + 1j * sin[positions])[:, :, None, :]   # (B, T, 1, half)
    if interleaved:
        a, b = slice(0, 2 * half, 2), slice(1, 2 * half, 2)
    else:
        a, b = slice(0, half), slice(half, 2 * half)
    z = (x[..., a] + 1j * x[..., b]) * rot
    x[..., a], x[..., b] = z.real, z.imag
    return x


# ----------------------------------------------------------------------------
# flash_attn_func

SHAPES = [  # B, L, S, H, Hkv, D, Dv
    (2, 5, 7, 4, 2, 16, 16),
    (1, 7, 5, 6, 3, 13, 9),      # L > S: bottom-right causal leaves empty rows
    (2, 1, 33, 8, 1, 32, 32),    # decoding, multi-query
    (1, 40, 40, 2, 2, 64, 8),
]
WINDOWS = [(-1, -1), (3, -1), (-1, 1), (2, 0), (0, 0), (5, 2), (-7, -2)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window_size", WINDOWS)
def test_func_matches_model(shape, causal, window_size):
    B, L, S, H, Hkv, D, Dv = shape
    rng = np.random.default_rng(1)
    q, k, v = randn(rng, B, L, H, D), randn(rng, B, S, Hkv, D), randn(rng, B, S, Hkv, Dv)
    o, lse, probs = flash_attn_func(q, k, v, causal=causal, window_size=window_size,
                                    return_attn_probs=True)
    mo, mlse, mw = model(q, k, v, causal=causal, window_size=window_size)
    assert o.dtype == lse.dtype == probs.dtype == np.float32
    assert o.shape == (B, L, H, Dv) and lse.shape == (B, H, L) and probs.shape == (B, H, L, S)
    assert o.flags.c_contiguous
    np.testing.assert_allclose(o, mo, **TOL)
    np.testing.assert_allclose(probs, mw, **TOL)
    np.testing.assert_allclose(lse, mlse, **TOL)  # -inf where a row has no key


def test_func_bitwise_core():
    rng = np.random.default_rng(2)
    q, k, v = randn(rng, 2, 9, 8, 24), randn(rng, 2, 12, 2, 24), randn(rng, 2, 12, 2, 24)
    o, lse, _ = flash_attn_func(q, k, v, softmax_scale=0.3, causal=True, window_size=(4, -1),
                                return_attn_probs=True)
    t = lambda x: np.ascontiguousarray(x.swapaxes(1, 2))  # noqa: E731
    co, clse = fastattn.scaled_dot_product_attention(t(q), t(k), t(v), enable_gqa=True,
                                                     is_causal=True, window=(4, None),
                                                     scale=0.3, return_lse=True)
    assert np.array_equal(o, co.swapaxes(1, 2)) and np.array_equal(lse, clse)


def test_func_causal_bottom_right_rows():
    """FlashAttention's docstring example: L=2, S=5 sees keys [0..3] and [0..4];
    L=5, S=2 leaves the first three rows empty (output 0)."""
    rng = np.random.default_rng(3)
    q, k, v = randn(rng, 1, 2, 1, 4), randn(rng, 1, 5, 1, 4), randn(rng, 1, 5, 1, 4)
    _, _, p = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert ((p[0, 0] > 0) == np.array([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], bool)).all()
    q = randn(rng, 1, 5, 1, 4)
    o, lse, p = flash_attn_func(q, k[:, :2], v[:, :2], causal=True, return_attn_probs=True)
    assert ((p[0, 0] > 0) == np.array([[0, 0], [0, 0], [0, 0], [1, 0], [1, 1]], bool)).all()
    assert not o[0, :3].any() and np.isneginf(lse[0, 0, :3]).all()


def test_func_out_and_inputs_untouched():
    rng = np.random.default_rng(4)
    q, k, v = randn(rng, 2, 3, 4, 8), randn(rng, 2, 6, 4, 8), randn(rng, 2, 6, 4, 8)
    copies = [a.copy() for a in (q, k, v)]
    out = np.full((2, 3, 4, 8), np.nan, np.float32)
    assert flash_attn_func(q, k, v, out=out) is out
    assert np.array_equal(out, flash_attn_func(q, k, v))
    out1 = np.empty((2, 1, 4, 8), np.float32)  # L == 1: the core writes into out directly
    assert flash_attn_func(q[:, :1], k, v, out=out1) is out1
    assert np.array_equal(out1, flash_attn_func(q[:, :1], k, v))
    assert all(np.array_equal(a, c) for a, c in zip((q, k, v), copies))


def test_func_float64_and_float16_inputs():
    rng = np.random.default_rng(5)
    q, k, v = randn(rng, 1, 4, 2, 8), randn(rng, 1, 4, 2, 8), randn(rng, 1, 4, 2, 8)
    ref = flash_attn_func(q, k, v)
    assert np.array_equal(flash_attn_func(q.astype(np.float64), k, v), ref)
    o16 = flash_attn_func(q.astype(np.float16), k.astype(np.float16), v.astype(np.float16))
    assert o16.dtype == np.float32
    np.testing.assert_allclose(o16, model(q.astype(np.float16), k.astype(np.float16),
                                          v.astype(np.float16))[0], **TOL)


@pytest.mark.parametrize("causal", [False, True])
def test_func_softcap_alibi(causal):
    rng = np.random.default_rng(6)
    q, k, v = randn(rng, 2, 6, 4, 16) * 3, randn(rng, 2, 9, 2, 16) * 3, randn(rng, 2, 9, 2, 16)
    for slopes in (rng.random(4) * 0.5, rng.random((2, 4)) * 0.5):
        o, lse, p = flash_attn_func(q, k, v, causal=causal, softcap=2.5, alibi_slopes=slopes,
                                    window_size=(5, -1), return_attn_probs=True)
        mo, mlse, mw = model(q, k, v, causal=causal, softcap=2.5, alibi_slopes=slopes,
                             window_size=(5, -1))
        np.testing.assert_allclose(o, mo, **TOL)
        np.testing.assert_allclose(lse, mlse, **TOL)
        np.testing.assert_allclose(p, mw, **TOL)


# ----------------------------------------------------------------------------
# flash_attn_varlen_func


def _packed(rng, lens_q, lens_k, H=4, Hkv=2, D=16, Dv=12):
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    q, k, v = randn(rng, cu_q[-1], H, D), randn(rng, cu_k[-1], Hkv, D), randn(rng, cu_k[-1], Hkv, Dv)
    return q, k, v, cu_q, cu_k


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window_size", [(-1, -1), (2, 1), (3, 0)])
def test_varlen_matches_model(causal, window_size):
    rng = np.random.default_rng(7)
    lens_q, lens_k = [3, 1, 0, 6, 4], [5, 7, 3, 6, 0]
    q, k, v, cu_q, cu_k = _packed(rng, lens_q, lens_k)
    o, lse, probs = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 6, 7, causal=causal,
                                           window_size=window_size, return_attn_probs=True)
    assert o.shape == (q.shape[0], 4, 12) and lse.shape == (4, q.shape[0])
    assert probs.shape == (5, 4, 6, 7)
    for b in range(5):
        qs, ks = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        mo, mlse, mw = model(q[None, qs], k[None, ks], v[None, ks], causal=causal,
                             window_size=window_size)
        np.testing.assert_allclose(o[qs], mo[0], **TOL)
        np.testing.assert_allclose(lse[:, qs], mlse[0], **TOL)
        np.testing.assert_allclose(probs[b, :, :lens_q[b], :lens_k[b]], mw[0], **TOL)
        assert not probs[b, :, lens_q[b]:].any() and not probs[b, :, :, lens_k[b]:].any()
        alone = flash_attn_func(q[None, qs], k[None, ks], v[None, ks], causal=causal,
                                window_size=window_size)
        assert np.array_equal(o[qs], alone[0])


@pytest.mark.parametrize("alibi_shape", ["H", "BH"])
def test_varlen_softcap_alibi(alibi_shape):
    rng = np.random.default_rng(24)
    lens_q, lens_k = [2, 4, 1], [6, 4, 9]
    q, k, v, cu_q, cu_k = _packed(rng, lens_q, lens_k)
    slopes = rng.random(4) * 0.4 if alibi_shape == "H" else rng.random((3, 4)) * 0.4
    o, lse, probs = flash_attn_varlen_func(q * 3, k, v, cu_q, cu_k, 4, 9, causal=True,
                                           softcap=2.0, alibi_slopes=slopes,
                                           return_attn_probs=True)
    for b in range(3):
        qs, ks = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        mo, mlse, mw = model(q[None, qs] * 3, k[None, ks], v[None, ks], causal=True, softcap=2.0,
                             alibi_slopes=slopes if slopes.ndim == 1 else slopes[b])
        np.testing.assert_allclose(o[qs], mo[0], **TOL)
        np.testing.assert_allclose(lse[:, qs], mlse[0], **TOL)
        np.testing.assert_allclose(probs[b, :, :lens_q[b], :lens_k[b]], mw[0], **TOL)


@pytest.mark.parametrize("block_size", [1, 4, 5])
def test_varlen_paged_equals_contiguous(block_size):
    rng = np.random.default_rng(8)
    lens_q, lens_k = [2, 5, 1], [9, 5, 13]
    q, k, v, cu_q, cu_k = _packed(rng, lens_q, lens_k)
    nblk = [-(-n // block_size) for n in lens_k]
    num_blocks = sum(nblk) + 3
    k_pages, v_pages = randn(rng, num_blocks, block_size, 2, 16), randn(rng, num_blocks, block_size, 2, 12)
    perm = rng.permutation(num_blocks)
    table = np.zeros((3, max(nblk) + 1), np.int32)
    used = 0
    for b in range(3):
        table[b, :nblk[b]] = perm[used:used + nblk[b]]
        used += nblk[b]
        for t in range(lens_k[b]):
            blk, off = table[b, t // block_size], t % block_size
            k_pages[blk, off], v_pages[blk, off] = k[cu_k[b] + t], v[cu_k[b] + t]
    ref = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 5, 13, causal=True)
    got = flash_attn_varlen_func(q, k_pages, v_pages, cu_q, cu_k, 5, 13, causal=True,
                                 block_table=table)
    assert np.array_equal(got, ref)


# ----------------------------------------------------------------------------
# flash_attn_with_kvcache


def _kv_model(q, k_cache, v_cache, k, v, seqlens, *, rows=None, leftpad=None, rotary=None,
              causal=False, window_size=(-1, -1), **kw):
    """FlashAttention's test_flash_attn_kvcache, in NumPy: the updated cache
    (k rotated) and attention over it with the key-padding mask."""
    B, L = q.shape[:2]
    S = k_cache.shape[1]
    rows = np.arange(B) if rows is None else rows
    kc, vc = k_cache[rows].astype(np.float64), v_cache[rows].astype(np.float64)
    L_new = 0 if k is None else k.shape[1]
    q_ro = q
    if rotary is not None:
        cos, sin, interleaved = rotary
        local = window_size != (-1, -1)
        qpos = seqlens[:, None] + (np.arange(L) if causal or local else np.zeros(L, int))
        q_ro = rope_model(q, cos, sin, qpos, interleaved)
        k = rope_model(k, cos, sin, seqlens[:, None] + np.arange(L_new), interleaved)
    arange = np.arange(S)[None, :]
    if L_new:
        update = (seqlens[:, None] <= arange) & (arange < seqlens[:, None] + L_new)
        kc[update] = k.reshape(-1, *k.shape[2:])
        vc[update] = v.reshape(-1, *v.shape[2:])
    valid = arange < seqlens[:, None] + L_new
    if leftpad is not None:
        valid &= arange >= leftpad[:, None]
    o, lse, _ = model(q_ro, kc, vc, key_valid=valid, leftpad=leftpad, causal=causal,
                      window_size=window_size, **kw)
    return o, lse, kc, vc


def _cache_case(rng, B=3, S=24, H=6, Hkv=2, D=16, L=2, L_new=2, Bc=None):
    Bc = B if Bc is None else Bc
    return dict(q=randn(rng, B, L, H, D), k_cache=randn(rng, Bc, S, Hkv, D),
                v_cache=randn(rng, Bc, S, Hkv, D), k=randn(rng, B, L_new, Hkv, D),
                v=randn(rng, B, L_new, Hkv, D))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("window_size", [(-1, -1), (4, -1), (3, 0)])
@pytest.mark.parametrize("seqlens", ["int", "0-d array", "per-batch"])
def test_kvcache_append_and_attend(causal, window_size, seqlens):
    rng = np.random.default_rng(9)
    c = _cache_case(rng)
    cs = np.full(3, 7) if seqlens != "per-batch" else np.array([0, 11, 22])
    k0, v0 = c["k_cache"].copy(), c["v_cache"].copy()
    mo, mlse, mkc, mvc = _kv_model(c["q"], k0, v0, c["k"], c["v"], cs, causal=causal,
                                   window_size=window_size)
    o, lse = flash_attn_with_kvcache(c["q"], c["k_cache"], c["v_cache"], c["k"], c["v"],
                                     cache_seqlens={"int": 7, "0-d array": np.array(7, np.int32),
                                                    "per-batch": cs.astype(np.int32)}[seqlens],
                                     causal=causal, window_size=window_size,
                                     return_softmax_lse=True)
    assert o.shape == (3, 2, 6, 16) and lse.shape == (3, 6, 2)
    assert np.array_equal(c["k_cache"], mkc.astype(np.float32))  # in place, nothing else moved
    assert np.array_equal(c["v_cache"], mvc.astype(np.float32))
    np.testing.assert_allclose(o, mo, **TOL)
    np.testing.assert_allclose(lse, mlse, **TOL)


def test_kvcache_no_new_kv_and_default_seqlens():
    rng = np.random.default_rng(10)
    c = _cache_case(rng)
    before = c["k_cache"].copy()
    o = flash_attn_with_kvcache(c["q"], c["k_cache"], c["v_cache"], causal=True)
    assert np.array_equal(c["k_cache"], before)
    ref = flash_attn_func(c["q"], c["k_cache"], c["v_cache"], causal=True)  # whole cache
    assert np.array_equal(o, ref)
    cs = np.array([5, 1, 24])
    o = flash_attn_with_kvcache(c["q"], c["k_cache"], c["v_cache"], cache_seqlens=cs)
    for b in range(3):
        alone = flash_attn_func(c["q"][b:b + 1], c["k_cache"][b:b + 1, :cs[b]],
                                c["v_cache"][b:b + 1, :cs[b]])
        assert np.array_equal(o[b], alone[0])


@pytest.mark.parametrize("causal", [False, True])
def test_kvcache_leftpad_and_batch_idx(causal):
    rng = np.random.default_rng(11)
    c = _cache_case(rng, Bc=5)
    rows = np.array([4, 0, 2], np.int32)
    cs = np.array([9, 3, 20])
    lp = np.array([4, 0, 20])
    k0, v0 = c["k_cache"].copy(), c["v_cache"].copy()
    mo, mlse, mkc, mvc = _kv_model(c["q"], k0, v0, c["k"], c["v"], cs, rows=rows, leftpad=lp,
                                   causal=causal)
    o, lse = flash_attn_with_kvcache(c["q"], c["k_cache"], c["v_cache"], c["k"], c["v"],
                                     cache_seqlens=cs, cache_batch_idx=rows, cache_leftpad=lp,
                                     causal=causal, return_softmax_lse=True)
    np.testing.assert_allclose(o, mo, **TOL)
    np.testing.assert_allclose(lse, mlse, **TOL)
    assert np.array_equal(c["k_cache"][rows], mkc.astype(np.float32))
    untouched = [1, 3]
    assert np.array_equal(c["k_cache"][untouched], k0[untouched])
    assert np.array_equal(c["v_cache"][untouched], v0[untouched])


def test_kvcache_uniform_single_call_equals_per_sequence():
    """The one-call path (same key range for every row, rows a regular slice)
    and the per-sequence path give the same bits as flash_attn_func."""
    rng = np.random.default_rng(12)
    c = _cache_case(rng, B=2, Bc=4)
    for rows in ([1, 3], [3, 1], [2, 2]):  # a slice; then two that go row by row
        o = flash_attn_with_kvcache(c["q"], c["k_cache"], c["v_cache"], cache_seqlens=10,
                                    cache_batch_idx=rows, causal=True)
        for b, r in enumerate(rows):
            alone = flash_attn_func(c["q"][b:b + 1], c["k_cache"][r:r + 1, :10],
                                    c["v_cache"][r:r + 1, :10], causal=True)
            assert np.array_equal(o[b], alone[0])


def _paged(rng, k_cache, v_cache, block_size):
    """A paged copy of a contiguous (B, S, Hkv, D) cache: sequence b's blocks in
    its own group of nblk + 1 blocks (one left unused), in reverse order with
    random neighbours swapped (any run of entries stays within its span + 2)."""
    B, S = k_cache.shape[:2]
    nblk = -(-S // block_size)
    num_blocks = B * (nblk + 1)
    kp = randn(rng, num_blocks, block_size, *k_cache.shape[2:])
    vp = randn(rng, num_blocks, block_size, *v_cache.shape[2:])
    order = np.arange(nblk, 0, -1)
    for i in range(0, nblk - 1, 2):
        if rng.random() < 0.5:
            order[i], order[i + 1] = order[i + 1], order[i]
    table = np.stack([b * (nblk + 1) + order for b in range(B)])
    table = table.astype(np.int32)
    for b in range(B):
        for t in range(S):
            kp[table[b, t // block_size], t % block_size] = k_cache[b, t]
            vp[table[b, t // block_size], t % block_size] = v_cache[b, t]
    return kp, vp, table


@pytest.mark.parametrize("path", ["in-place", "gather"])
@pytest.mark.parametrize("block_size", [1, 5, 8])
@pytest.mark.parametrize("leftpad", [False, True])
@pytest.mark.parametrize("causal,window_size", [(True, (6, -1)), (False, (-1, -1)),
                                                (False, (3, 1))])
def test_kvcache_paged_equals_contiguous(path, block_size, leftpad, causal, window_size,
                                         monkeypatch):
    """Pages read in place (blocks as a batch of partials, merged) agree with the
    contiguous cache to float32 rounding; gathered pages give the same bits."""
    rng = np.random.default_rng(13)
    c = _cache_case(rng, L=3, L_new=2)
    kp, vp, table = _paged(rng, c["k_cache"], c["v_cache"], block_size)
    if path == "gather":
        monkeypatch.setattr(fa, "_PAGED_MAX_L", 0)
    else:  # the in-place path must not fall back to gathering
        monkeypatch.setattr(fa, "_gather_pages", None)
    cs = np.array([6, 1, 21])
    lp = np.array([2, 0, 9]) if leftpad else None
    kw = dict(cache_seqlens=cs, cache_leftpad=lp, causal=causal, window_size=window_size,
              return_softmax_lse=True)
    o, lse = flash_attn_with_kvcache(c["q"], c["k_cache"], c["v_cache"], c["k"], c["v"], **kw)
    po, plse = flash_attn_with_kvcache(c["q"], kp, vp, c["k"], c["v"], block_table=table, **kw)
    if path == "gather":
        assert np.array_equal(po, o) and np.array_equal(plse, lse)
    else:
        np.testing.assert_allclose(po, o, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(plse, lse, rtol=1e-6, atol=1e-6)
    for b in range(3):  # the pages now hold the contiguous cache's update
        for t in range(cs[b], cs[b] + 2):
            assert np.array_equal(kp[table[b, t // block_size], t % block_size], c["k_cache"][b, t])
            assert np.array_equal(vp[table[b, t // block_size], t % block_size], c["v_cache"][b, t])


def test_kvcache_paged_sparse_blocks_are_gathered():
    """Blocks spread over far more than their span, or used twice, go through
    the gather path, with the contiguous result's bits."""
    rng = np.random.default_rng(19)
    c = _cache_case(rng, B=1, S=16, L=1, L_new=1)
    for ids in ([0, 37, 2, 90], [5, 5, 6, 7]):
        kp, vp = randn(rng, 100, 4, 2, 16), randn(rng, 100, 4, 2, 16)
        for t in range(16):
            kp[ids[t // 4], t % 4], vp[ids[t // 4], t % 4] = c["k_cache"][0, t], c["v_cache"][0, t]
        if len(set(ids)) < 4:  # a block used twice holds the later positions' rows
            c["k_cache"][0, 0:4], c["v_cache"][0, 0:4] = kp[5], vp[5]
        kw = dict(cache_seqlens=np.array([16]), causal=True)
        ref = flash_attn_with_kvcache(c["q"], c["k_cache"], c["v_cache"], **kw)
        got = flash_attn_with_kvcache(c["q"], kp, vp, block_table=np.array([ids]), **kw)
        assert np.array_equal(got, ref)


@pytest.mark.parametrize("causal,window_size", [(True, (-1, -1)), (False, (-1, -1)),
                                                (True, (100, -1)), (False, (30, 7))])
def test_kvcache_paged_kernel_path_bitwise(causal, window_size, monkeypatch):
    """Blocks of a multiple of 64 rows, one length for every sequence and no
    left pad: the kernel reads the pages in place, with the contiguous bits."""
    rng = np.random.default_rng(20)
    c = _cache_case(rng, B=2, S=256, L=2, L_new=2)
    kp, vp, table = _paged(rng, c["k_cache"], c["v_cache"], 64)
    monkeypatch.setattr(fa, "_pages_in_place", None)  # neither of the other two paths
    monkeypatch.setattr(fa, "_gather_pages", None)
    kw = dict(cache_seqlens=150, causal=causal, window_size=window_size, return_softmax_lse=True)
    o, lse = flash_attn_with_kvcache(c["q"], c["k_cache"], c["v_cache"], c["k"], c["v"], **kw)
    po, plse = flash_attn_with_kvcache(c["q"], kp, vp, c["k"], c["v"], block_table=table, **kw)
    assert np.array_equal(po, o) and np.array_equal(plse, lse)
    out = np.empty_like(o)
    assert flash_attn_with_kvcache(c["q"], kp, vp, block_table=table, cache_seqlens=152,
                                   causal=causal, window_size=window_size, out=out) is out
    assert np.array_equal(out, o)


@pytest.mark.parametrize("kvdtype", [np.float32] + HALF, ids=["float32"] + HALF_IDS)
@pytest.mark.parametrize("block_size,S,L", [(64, 300, 1), (128, 256, 5), (256, 1000, 40),
                                            (64, 0, 3), (64, 1, 1)])
def test_paged_cache_equals_the_gathered_cache(simd, rng, kvdtype, block_size, S, L):
    from fastattn._attention import paged_sdpa
    B, Hq, Hkv, D, Dv, P = 3, 4, 2, 24, 16, 20
    k_cache = randn(rng, P, block_size, Hkv, D).astype(kvdtype)
    v_cache = randn(rng, P, block_size, Hkv, Dv).astype(kvdtype)
    pages = max(1, -(-S // block_size))
    table = np.stack([rng.permutation(P)[:pages + 1] for _ in range(B)]).astype(np.int32)
    q = randn(rng, B, L, Hq, D).swapaxes(1, 2)  # (B, Hq, L, D) view
    for kw in ({}, dict(is_causal=True), dict(window=(7, 0), scale=0.3)):
        got = paged_sdpa(q, k_cache, v_cache, table, S, return_lse=True, **kw)
        # the gathered cache, (B, Hkv, S, D), contiguous
        k = k_cache[table].reshape(B, -1, Hkv, D)[:, :S].swapaxes(1, 2).copy()
        v = v_cache[table].reshape(B, -1, Hkv, Dv)[:, :S].swapaxes(1, 2).copy()
        want = fastattn.scaled_dot_product_attention(np.ascontiguousarray(q), k, v, enable_gqa=True,
                                                     return_lse=True, **kw)
        assert_same_bits(got[0], want[0])
        assert_same_bits(got[1], want[1])


def test_paged_cache_bad_tables(rng):
    from fastattn._attention import paged_sdpa
    k_cache = randn(rng, 4, 64, 2, 8)
    q = randn(rng, 1, 2, 1, 8)
    with pytest.raises(ValueError, match="outside the cache"):
        paged_sdpa(q, k_cache, k_cache, np.array([[0, 4]]), 100)
    with pytest.raises(ValueError, match="outside the cache"):
        paged_sdpa(q, k_cache, k_cache, np.array([[-1]]), 10)
    with pytest.raises(ValueError, match="does not cover"):
        paged_sdpa(q, k_cache, k_cache, np.array([[0]]), 100)
    with pytest.raises(ValueError, match="multiple of 64"):
        paged_sdpa(q, k_cache[:, :48], k_cache[:, :48], np.array([[0]]), 10)
    # the kernel checks the table itself too (the private core entry)
    with pytest.raises(ValueError, match="rejected its arguments"):
        _core.attention(q, k_cache, k_cache, k_dtype=_core.DTYPE_F32, v_dtype=_core.DTYPE_F32,
                        q_off=np.zeros(2, np.int64), k_off=np.zeros(2, np.int64),
                        v_off=np.zeros(2, np.int64), q_rs=8, k_rs=16, v_rs=16, nbatch=2, L=1,
                        S=100, D=8, Dv=8, scale=1.0, out=np.zeros(16, np.float32), nthreads=1,
                        block_table=np.array([0, 9], np.int64), bt_off=np.zeros(2, np.int64),
                        block_size=64, num_pages=4, k_ps=64 * 16, v_ps=64 * 16)


def test_kvcache_reads_the_cache_in_place():
    """No copy of the cache: contiguous, paged through the kernel, and paged
    through the masked blocks (an odd block size), each under 1/8 of k_cache."""
    rng = np.random.default_rng(21)
    S, D = 2048, 64
    k_cache, v_cache = randn(rng, 1, S, 4, D), randn(rng, 1, S, 4, D)
    q, k = randn(rng, 1, 1, 8, D), randn(rng, 1, 1, 4, D)
    nblk = S // 64
    kp, vp = k_cache.reshape(nblk, 64, 4, D), v_cache.reshape(nblk, 64, 4, D)
    kodd, vodd = k_cache.reshape(nblk * 2, 32, 4, D), v_cache.reshape(nblk * 2, 32, 4, D)
    calls = {
        "contiguous": lambda: flash_attn_with_kvcache(q, k_cache, v_cache, k, k,
                                                      cache_seqlens=S - 1),
        "paged kernel": lambda: flash_attn_with_kvcache(
            q, kp, vp, k, k, cache_seqlens=S - 1, block_table=np.arange(nblk)[None]),
        "paged blocks": lambda: flash_attn_with_kvcache(
            q, kodd, vodd, k, k, cache_seqlens=S - 1, block_table=np.arange(2 * nblk)[None]),
    }
    for name, call in calls.items():
        call()
        peak = traced_peak(call)
        assert peak < k_cache.nbytes / 8, (name, peak)


def test_func_reads_token_major_inputs_in_place():
    rng = np.random.default_rng(22)
    q, k, v = randn(rng, 1, 4, 8, 64), randn(rng, 1, 4096, 2, 64), randn(rng, 1, 4096, 2, 64)
    flash_attn_func(q, k, v)
    assert traced_peak(lambda: flash_attn_func(q, k, v, causal=True)) < k.nbytes / 8


def test_kvcache_bfloat16_cache():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(23)
    c = _cache_case(rng)
    kc, vc = (c[n].astype(ml_dtypes.bfloat16) for n in ("k_cache", "v_cache"))
    o = flash_attn_with_kvcache(c["q"], kc, vc, c["k"], c["v"], cache_seqlens=5, causal=True)
    assert np.array_equal(kc[:, 5:7].astype(np.float32),
                          c["k"].astype(ml_dtypes.bfloat16).astype(np.float32))
    ref = flash_attn_func(c["q"], kc[:, :7].astype(np.float32), vc[:, :7].astype(np.float32),
                          causal=True)
    assert np.array_equal(o, ref)


@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("causal,window_size", [(False, (-1, -1)), (True, (-1, -1)),
                                                (False, (5, 3))])
@pytest.mark.parametrize("rotary_dim", [16, 6])
def test_kvcache_rotary(interleaved, causal, window_size, rotary_dim):
    rng = np.random.default_rng(14)
    c = _cache_case(rng, L=3, L_new=3)
    angle = rng.random((30, rotary_dim // 2)) * 2 * np.pi
    cos, sin = np.cos(angle).astype(np.float32), np.sin(angle).astype(np.float32)
    cs = np.array([2, 9, 21])
    k0, v0 = c["k_cache"].copy(), c["v_cache"].copy()
    mo, mlse, mkc, mvc = _kv_model(c["q"], k0, v0, c["k"], c["v"], cs, causal=causal,
                                   window_size=window_size,
                                   rotary=(cos.astype(np.float64), sin.astype(np.float64),
                                           interleaved))
    o = flash_attn_with_kvcache(c["q"], c["k_cache"], c["v_cache"], c["k"], c["v"],
                                rotary_cos=cos, rotary_sin=sin, cache_seqlens=cs,
                                causal=causal, window_size=window_size,
                                rotary_interleaved=interleaved)
    np.testing.assert_allclose(c["k_cache"], mkc, rtol=1e-6, atol=1e-6)  # rotated k stored
    assert np.array_equal(c["v_cache"], mvc.astype(np.float32))          # v is not rotated
    np.testing.assert_allclose(o, mo, **TOL)


def test_kvcache_rotary_layouts_differ():
    """Interleaved and GPT-NeoX pairings are different rotations (a test that
    could not tell them apart would pass either way)."""
    rng = np.random.default_rng(15)
    c = _cache_case(rng, B=1)
    angle = rng.random((30, 8)) * 2 * np.pi
    outs = []
    for interleaved in (True, False):
        kc = c["k_cache"].copy()
        flash_attn_with_kvcache(c["q"], kc, c["v_cache"].copy(), c["k"], c["v"],
                                rotary_cos=np.cos(angle), rotary_sin=np.sin(angle),
                                cache_seqlens=4, rotary_interleaved=interleaved)
        outs.append(kc[0, 4:6])
    assert not np.allclose(outs[0], outs[1])


def test_kvcache_float16_cache():
    rng = np.random.default_rng(16)
    c = _cache_case(rng)
    kc, vc = c["k_cache"].astype(np.float16), c["v_cache"].astype(np.float16)
    o = flash_attn_with_kvcache(c["q"], kc, vc, c["k"], c["v"], cache_seqlens=5)
    assert kc.dtype == np.float16
    assert np.array_equal(kc[:, 5:7], c["k"].astype(np.float16))  # cast into the cache
    ref = flash_attn_func(c["q"], kc[:, :7].astype(np.float32), vc[:, :7].astype(np.float32))
    assert np.array_equal(o, ref)


@pytest.mark.parametrize("alibi_shape", ["H", "BH"])
def test_kvcache_softcap_alibi(alibi_shape):
    rng = np.random.default_rng(17)
    c = _cache_case(rng)
    slopes = rng.random(6) * 0.3 if alibi_shape == "H" else rng.random((3, 6)) * 0.3
    cs, lp = np.array([5, 12, 3]), np.array([1, 4, 0])
    k0, v0 = c["k_cache"].copy(), c["v_cache"].copy()
    mo, mlse, _, _ = _kv_model(c["q"] * 4, k0, v0, c["k"], c["v"], cs, leftpad=lp, causal=True,
                               softcap=3.0, alibi_slopes=slopes)
    o, lse = flash_attn_with_kvcache(c["q"] * 4, c["k_cache"], c["v_cache"], c["k"], c["v"],
                                     cache_seqlens=cs, cache_leftpad=lp, causal=True, softcap=3.0,
                                     alibi_slopes=slopes, return_softmax_lse=True)
    np.testing.assert_allclose(o, mo, **TOL)
    np.testing.assert_allclose(lse, mlse, **TOL)


# ----------------------------------------------------------------------------
# Bad input: clear errors, the cache untouched


def _case():
    c = _cache_case(np.random.default_rng(18))
    c["cache_seqlens"] = np.array([3, 4, 5], np.int32)
    return c


BAD = [
    ("dropout_p", lambda: flash_attn_func(*(np.zeros((1, 2, 2, 4), np.float32),) * 3,
                                          dropout_p=0.1), ValueError),
    ("dropout_p", lambda: flash_attn_varlen_func(*(np.zeros((2, 2, 4), np.float32),) * 3,
                                                 [0, 2], [0, 2], 2, 2, 0.5), ValueError),
    ("out", lambda: flash_attn_func(*(np.zeros((1, 2, 2, 4), np.float32),) * 3,
                                    out=np.zeros((1, 2, 2, 4), np.float16)), TypeError),
    ("out", lambda: flash_attn_func(*(np.zeros((1, 2, 2, 4), np.float32),) * 3,
                                    out=np.zeros((1, 2, 2, 5), np.float32)), ValueError),
    ("heads", lambda: flash_attn_func(np.zeros((1, 2, 3, 4)), np.zeros((1, 2, 2, 4)),
                                      np.zeros((1, 2, 2, 4))), ValueError),
    ("batch size", lambda: flash_attn_func(np.zeros((2, 2, 2, 4)), np.zeros((1, 2, 2, 4)),
                                           np.zeros((1, 2, 2, 4))), ValueError),
    ("head dimension", lambda: flash_attn_func(np.zeros((1, 2, 2, 4)), np.zeros((1, 2, 2, 3)),
                                               np.zeros((1, 2, 2, 4))), ValueError),
    ("4 dimensions", lambda: flash_attn_func(np.zeros((2, 2, 4)), np.zeros((1, 2, 2, 4)),
                                             np.zeros((1, 2, 2, 4))), ValueError),
    ("window_size", lambda: flash_attn_func(*(np.zeros((1, 2, 2, 4)),) * 3, window_size=3),
     ValueError),
    ("window_size", lambda: flash_attn_func(*(np.zeros((1, 2, 2, 4)),) * 3,
                                            window_size=(1.5, 0)), ValueError),
    ("alibi_slopes", lambda: flash_attn_func(*(np.zeros((1, 2, 2, 4)),) * 3,
                                             alibi_slopes=np.ones(3)), ValueError),
    ("softmax_scale", lambda: flash_attn_func(*(np.zeros((1, 2, 2, 4)),) * 3,
                                              softmax_scale=np.inf), ValueError),
    ("real floating", lambda: flash_attn_func(np.zeros((1, 2, 2, 4), int),
                                              *(np.zeros((1, 2, 2, 4)),) * 2), TypeError),
    ("cu_seqlens_q", lambda: flash_attn_varlen_func(*(np.zeros((4, 2, 4)),) * 3, [0, 3],
                                                    [0, 4], 4, 4), ValueError),
    ("cu_seqlens_k", lambda: flash_attn_varlen_func(*(np.zeros((4, 2, 4)),) * 3, [0, 4],
                                                    [0, 2, 4], 4, 4), ValueError),
    ("max_seqlen_q", lambda: flash_attn_varlen_func(*(np.zeros((4, 2, 4)),) * 3, [0, 4],
                                                    [0, 4], 3, 4), ValueError),
    ("integer", lambda: flash_attn_varlen_func(*(np.zeros((4, 2, 4)),) * 3,
                                                np.array([0., 4.]), [0, 4], 4, 4), TypeError),
    ("block_table", lambda: flash_attn_varlen_func(
        np.zeros((4, 2, 4)), np.zeros((3, 2, 2, 4)), np.zeros((3, 2, 2, 4)), [0, 4], [0, 4],
        4, 4, block_table=[[0, 3]]), ValueError),
    # a sequence longer than its pages: its length named as such (no entry of
    # cu_seqlens_k is 7)
    (r"sequence 1 has 7 keys \(by cu_seqlens_k\), more than block_table addresses: 2 blocks "
     r"of 3 = 6", lambda: flash_attn_varlen_func(
         np.zeros((10, 4, 8)), np.zeros((4, 3, 2, 8)), np.zeros((4, 3, 2, 8)), [0, 4, 10],
         [0, 5, 12], 6, 7, block_table=[[0, 1], [2, 3]]), ValueError),
    # errors in FlashAttention's terms: softcap 0.0 is off (None is not taken), and
    # shapes as the caller gave them, (B, L, H, D) not the core's (B, H, L, D)
    (r"softcap must be a finite float \(> 0 caps, <= 0 is off; finite in float32\), got inf$",
     lambda: flash_attn_func(*(np.zeros((1, 2, 2, 4)),) * 3, softcap=np.inf), ValueError),
    (r"softcap .*got nan$", lambda: flash_attn_func(*(np.zeros((1, 2, 2, 4)),) * 3,
                                                    softcap=np.nan), ValueError),
    (r"softcap .*got 1e\+39$", lambda: flash_attn_func(*(np.zeros((1, 2, 2, 4)),) * 3,
                                                       softcap=1e39), ValueError),
    (r"q must have a head dimension \(last axis\) >= 1, got shape \(1, 3, 2, 0\)",
     lambda: flash_attn_func(*(np.zeros((1, 3, 2, 0)),) * 3), ValueError),
    (r"q must have a head dimension \(last axis\) >= 1, got shape \(5, 2, 0\)",
     lambda: flash_attn_varlen_func(*(np.zeros((5, 2, 0)),) * 3, [0, 5], [0, 5], 5, 5),
     ValueError),
]


@pytest.mark.parametrize("words,call,exc", BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_input(words, call, exc):
    with pytest.raises(exc, match=words):
        call()


KV_BAD = [  # (what the message names, changes to the arguments, exception)
    ("block_table", dict(block_table=np.array([[0, 1], [6, 2], [4, 5]])), ValueError),
    ("block_table", dict(block_table=np.array([[0, 1], [2, 3], [4, -1]]),
                         cache_seqlens=np.array([3, 4, 7])), ValueError),
    ("block_table", dict(block_table=np.array([[0], [1], [2]]),  # too few blocks
                         cache_seqlens=np.array([3, 4, 7])), ValueError),
    ("block_table", dict(block_table=np.zeros((2, 2), np.int32)), ValueError),
    ("block_table", dict(block_table=np.zeros((3, 2))), TypeError),
    ("cache_batch_idx", dict(block_table=np.arange(6).reshape(3, 2), cache_batch_idx=[0, 1, 2]),
     ValueError),
    ("cache_seqlens", dict(cache_seqlens=np.array([3, 23, 5])), ValueError),  # + 2 new > 24
    ("cache_seqlens", dict(cache_seqlens=np.array([3, -1, 5])), ValueError),
    ("cache_seqlens", dict(cache_seqlens=23), ValueError),
    ("cache_seqlens", dict(cache_seqlens=np.array([3, 4])), ValueError),
    ("cache_seqlens", dict(cache_seqlens=np.array([3., 4., 5.])), TypeError),
    ("cache_seqlens", dict(cache_seqlens=None), ValueError),  # k given
    ("cache_seqlens", dict(cache_seqlens=5.0), TypeError),
    ("cache_seqlens must be an int, got ndarray of dtype float64",
     dict(cache_seqlens=np.array(3.0)), TypeError),
    (r"q must have a head dimension \(last axis\) >= 1, got shape \(3, 1, 6, 0\)",
     dict(q=np.zeros((3, 1, 6, 0), np.float32)), ValueError),
    ("cache_seqlens", dict(cache_seqlens=True), TypeError),
    ("cache_leftpad", dict(cache_leftpad=np.array([0, 5, 0])), ValueError),  # > cache_seqlens
    ("cache_leftpad", dict(cache_leftpad=np.array([-1, 0, 0])), ValueError),
    ("cache_batch_idx", dict(cache_batch_idx=np.array([0, 1, 3])), ValueError),
    ("cache_batch_idx", dict(cache_batch_idx=np.array([0, 1])), ValueError),
    ("k and v", dict(v=None), ValueError),
    ("k must have shape", dict(k=np.zeros((3, 2, 1, 16), np.float32)), ValueError),
    ("v must have shape", dict(v=np.zeros((3, 1, 2, 16), np.float32)), ValueError),
    ("v_cache", dict(v_cache=np.zeros((3, 20, 2, 16), np.float32)), ValueError),
    ("k_cache's head dimension", dict(k_cache=np.zeros((3, 24, 2, 8), np.float32)), ValueError),
    ("k_cache must hold", dict(q=np.zeros((2, 2, 6, 16), np.float32),
                               k=np.zeros((2, 2, 2, 16)), v=np.zeros((2, 2, 2, 16)),
                               cache_seqlens=3), ValueError),
    ("k_cache", dict(k_cache=[[[[0.0]]]]), TypeError),  # not an array to update in place
    ("rotary_cos and rotary_sin", dict(rotary_cos=np.ones((30, 8))), ValueError),
    ("rotary_sin", dict(rotary_cos=np.ones((30, 8)), rotary_sin=np.ones((30, 4))), ValueError),
    ("rotary_cos", dict(rotary_cos=np.ones((30, 9)), rotary_sin=np.ones((30, 9))), ValueError),
    ("positions", dict(rotary_cos=np.ones((6, 8)), rotary_sin=np.ones((6, 8))), ValueError),
    ("need k and v", dict(k=None, v=None, rotary_cos=np.ones((30, 8)),
                          rotary_sin=np.ones((30, 8))), ValueError),
    ("out", dict(out=np.zeros((3, 2, 6, 16), np.float16)), TypeError),
    ("out", dict(out=np.zeros((3, 6, 2, 16), np.float32)), ValueError),
    ("softcap", dict(softcap=float("nan")), ValueError),
    ("alibi_slopes", dict(alibi_slopes=np.ones((2, 6))), ValueError),
    ("num_splits", dict(num_splits=-1), ValueError),
    # the core's rules, checked before k and v are appended (the core would
    # refuse them only after the append)
    ("softmax_scale", dict(softmax_scale=1e39), ValueError),  # not finite in float32
    ("softmax_scale", dict(softmax_scale=10**400), ValueError),  # not an OverflowError
    ("softcap", dict(softcap=1e-40), ValueError),  # below the smallest normal float32
    ("softcap", dict(softcap=1e39), ValueError),
    ("alibi_slopes", dict(alibi_slopes=np.full(6, 1e39)), ValueError),
    # integers no int64 holds: named, never wrapped or an OverflowError
    ("cache_seqlens", dict(cache_seqlens=2**63), ValueError),
    ("cache_seqlens", dict(cache_seqlens=np.uint64(2**63)), ValueError),
    ("cache_seqlens.*9223372036854775808", dict(cache_seqlens=[3, 2**63, 5]), ValueError),
    ("cache_seqlens.*9223372036854775807", dict(cache_seqlens=np.array([3, 2**63 - 1, 5])),
     ValueError),  # (+ seqlen_new would wrap)
    ("cache_batch_idx.*18446744073709551615",
     dict(cache_batch_idx=np.array([0, 1, 2**64 - 1], np.uint64)), ValueError),
    ("block_table.*9223372036854775808",
     dict(block_table=[[0, 1], [2, 3], [4, 2**63]]), ValueError),
    ("causal", dict(causal=None), TypeError),
]


@pytest.mark.parametrize("words,change,exc", KV_BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(KV_BAD)])
def test_kvcache_bad_input_leaves_cache(words, change, exc):
    c = _case()
    if "block_table" in change:  # a paged cache of 6 blocks of 8
        c["k_cache"], c["v_cache"] = (np.zeros((6, 8, 2, 16), np.float32) for _ in range(2))
    c.update(change)
    caches = [a.copy() for a in (c["k_cache"], c["v_cache"]) if isinstance(a, np.ndarray)]
    with pytest.raises(exc, match=words):
        flash_attn_with_kvcache(**c)
    now = [a for a in (c["k_cache"], c["v_cache"]) if isinstance(a, np.ndarray)]
    assert all(np.array_equal(a, b) for a, b in zip(now, caches))


def test_kvcache_block_size_zero():
    c = _case()
    c["k_cache"], c["v_cache"] = (np.zeros((6, 0, 2, 16), np.float32) for _ in range(2))
    with pytest.raises(ValueError, match=r"k_cache must have a block size \(axis 1\) >= 1"):
        flash_attn_with_kvcache(**c, block_table=np.zeros((3, 2), np.int32))
    q = np.zeros((4, 2, 16), np.float32)
    with pytest.raises(ValueError, match=r"k must have a block size \(axis 1\) >= 1"):
        flash_attn_varlen_func(q, c["k_cache"], c["v_cache"], [0, 2, 4], [0, 0, 0], 2, 0,
                               block_table=np.zeros((2, 1), np.int32))


def test_out_must_not_overlap_the_callers_arrays():
    """Not only the copies the wrapper works on: the slopes (which the
    per-sequence path reads after writing earlier rows of out), q before its
    rotary embedding, a paged cache before it is gathered."""
    rng = np.random.default_rng(31)
    q = rng.standard_normal((2, 1, 4, 8), dtype=np.float32)
    kc = rng.standard_normal((2, 10, 2, 8), dtype=np.float32)
    vc = rng.standard_normal((2, 10, 2, 5), dtype=np.float32)
    buf = np.zeros(60, np.float32)
    slopes, out = buf[:8].reshape(2, 4), buf[4:44].reshape(2, 1, 4, 5)
    slopes[:] = 0.5
    with pytest.raises(ValueError, match="out must not share memory with alibi_slopes"):
        flash_attn_with_kvcache(q, kc, vc, cache_seqlens=np.array([3, 6]),
                                alibi_slopes=slopes, out=out)
    k1, v1 = (rng.standard_normal((2, 1, 2, d), dtype=np.float32) for d in (8, 5))
    cos, sin = np.ones((20, 2), np.float32), np.zeros((20, 2), np.float32)
    q8 = np.zeros((2, 1, 4, 8), np.float32)
    kc0 = kc.copy()
    with pytest.raises(ValueError, match="out must not share memory with q"):
        flash_attn_with_kvcache(q8, kc, vc, k1, v1, rotary_cos=cos, rotary_sin=sin,
                                cache_seqlens=3, out=q8.reshape(-1)[:40].reshape(2, 1, 4, 5))
    assert np.array_equal(kc, kc0)  # (checked before the append)
    kp = rng.standard_normal((6, 4, 2, 8), dtype=np.float32)
    vp = np.zeros((6, 4, 2, 8), np.float32)
    with pytest.raises(ValueError, match="out must not share memory with v"):
        flash_attn_varlen_func(np.zeros((4, 4, 8), np.float32), kp, vp, [0, 2, 4],
                               [0, 3, 5], 2, 3, block_table=np.array([[0, 1], [2, 3]]),
                               out=vp.reshape(-1)[:128].reshape(4, 4, 8))


def test_kvcache_unused_block_table_entries_are_not_read():
    """Only the entries that cover positions [0, cache_seqlens + seqlen_new) are
    used (and checked): padding the table with -1 is fine."""
    c = _case()
    c["k_cache"], c["v_cache"] = (np.zeros((6, 8, 2, 16), np.float32) for _ in range(2))
    c["block_table"] = np.array([[0, -1], [1, 99], [2, -7]])
    o = flash_attn_with_kvcache(**c)
    c["block_table"] = np.array([[0, 3], [1, 4], [2, 5]])
    assert np.array_equal(o, flash_attn_with_kvcache(**c))


def test_kvcache_read_only_cache():
    c = _case()
    c["k_cache"].flags.writeable = False
    with pytest.raises(ValueError, match="k_cache must be writeable"):
        flash_attn_with_kvcache(**c)
    c["k"] = c["v"] = None  # reading a read-only cache is fine
    flash_attn_with_kvcache(**c)


def test_docstring_examples():
    result = doctest.testmod(fa, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0


def test_import_needs_no_optional_dependency():
    code = ("import sys, fastattn; f = fastattn.flash_attn.flash_attn_with_kvcache; "
            "print(sorted(m for m in ('torch', 'dask', 'ml_dtypes', 'flash_attn') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("alias", ["k-slot", "k-shifted", "v-in-k_cache", "q-in-cache"])
def test_kvcache_new_kv_aliasing_the_cache(paged, alias):
    """q, k and v that are views of the cache, the positions written included,
    are read as they were before the call: the result and the cache equal
    those of the same call on copies of them."""
    rng = np.random.default_rng(23)
    c = _cache_case(rng, B=2, S=16, H=2, Hkv=2, D=8, L=1, L_new=2)
    kfull, vfull = c["k_cache"], c["v_cache"]  # (2, 16, 2, 8)
    kw = dict(cache_seqlens=np.array([5, 9], np.int32), causal=True, return_softmax_lse=True)
    kc, vc = kfull, vfull
    if paged:  # the same memory as blocks of 8: position p of sequence b in block 2 b + p // 8
        kc, vc = kfull.reshape(4, 8, 2, 8), vfull.reshape(4, 8, 2, 8)
        kw["block_table"] = np.array([[0, 1], [2, 3]], np.int32)
    q, k, v = c["q"], c["k"], c["v"]
    if alias == "k-slot":  # sequence 0 writes positions 5 and 6: k is what they hold
        k = kfull[:, 5:7]
    elif alias == "k-shifted":  # positions 5, 6 written from 4, 5 (a memmove)
        k = kfull[:, 4:6]
    elif alias == "v-in-k_cache":  # v from the key cache, which is written first
        v = kfull[:, 5:7]
    else:  # the queries are position 5 of the key cache (written by sequence 0)
        q = kfull[:, 5:6]
    assert kc.base is kfull or kc is kfull
    assert any(np.shares_memory(x, kfull) or np.shares_memory(x, vfull) for x in (q, k, v))
    kc2, vc2 = kc.copy(), vc.copy()
    want = flash_attn_with_kvcache(q.copy(), kc2, vc2, k.copy(), v.copy(), **kw)
    got = flash_attn_with_kvcache(q, kc, vc, k, v, **kw)
    assert np.array_equal(kc, kc2) and np.array_equal(vc, vc2)
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])


def test_kvcache_caches_sharing_memory_with_new_kv():
    """k_cache and v_cache that overlap (each appended position would be
    written twice) are an error when k and v are given, before anything is
    written; reading such caches (no k, v) is fine."""
    c = _case()
    c["v_cache"] = c["k_cache"]
    before = c["k_cache"].copy()
    with pytest.raises(ValueError, match="k_cache and v_cache must not share memory"):
        flash_attn_with_kvcache(**c)
    assert np.array_equal(c["k_cache"], before)
    c["k"] = c["v"] = None
    flash_attn_with_kvcache(**c)
    # a key and a value cache interleaved in one buffer do not overlap
    rng = np.random.default_rng(24)
    c = _cache_case(rng, B=2, S=8, H=2, Hkv=2, D=8, L=1, L_new=1)
    kv = randn(rng, 2, 8, 2, 2, 8)
    want = flash_attn_with_kvcache(c["q"], kv[:, :, :, 0].copy(), kv[:, :, :, 1].copy(), c["k"],
                                   c["v"], cache_seqlens=3)
    got = flash_attn_with_kvcache(c["q"], kv[:, :, :, 0], kv[:, :, :, 1], c["k"], c["v"],
                                  cache_seqlens=3)
    assert np.array_equal(got, want)


# ----------------------------------------------------------------------------
# bert_padding: unpad_input, pad_input, index_first_axis

from fastattn.flash_attn.bert_padding import index_first_axis, pad_input, unpad_input  # noqa: E402


def _padding_mask(lengths, S, left=False):
    mask = np.zeros((len(lengths), S), np.int64)
    for b, n in enumerate(lengths):
        if left:
            mask[b, S - n:] = 1
        else:
            mask[b, :n] = 1
    return mask


@pytest.mark.parametrize("left", [False, True])
def test_unpad_input_matches_masking(left):
    rng = np.random.default_rng(40)
    lengths, S = [5, 0, 3, 7], 7
    mask = _padding_mask(lengths, S, left)
    x = randn(rng, 4, S, 3, 2)
    packed, idx, cu, max_seqlen, seqused = unpad_input(x, mask)
    assert np.array_equal(packed, x[mask.astype(bool)])
    assert np.array_equal(idx, np.flatnonzero(mask)) and idx.dtype == np.int64
    assert cu.dtype == np.int32 and cu.tolist() == [0, 5, 5, 8, 15]
    assert max_seqlen == 7 and type(max_seqlen) is int
    assert seqused.dtype == np.int32 and seqused.tolist() == lengths
    back = pad_input(packed, idx, 4, S)
    assert back.dtype == x.dtype and np.array_equal(back, x * mask[:, :, None, None])
    # token ids (2-d), bool masks, torch-free: any dtype goes through
    ids = np.arange(28).reshape(4, 7)
    packed_ids = unpad_input(ids, mask.astype(bool))[0]
    assert packed_ids.dtype == ids.dtype and packed_ids.tolist() == ids[mask == 1].tolist()


def test_unpad_input_unused_mask():
    """Unused positions are packed and counted in cu_seqlens and max_seqlen,
    not in seqused (FlashAttention >= 2.7's fifth return value)."""
    x = np.arange(8.0).reshape(2, 4)
    valid = np.array([[1, 1, 0, 0], [1, 0, 0, 0]])
    unused = np.array([[0, 0, 1, 0], [0, 1, 1, 1]])
    packed, idx, cu, max_seqlen, seqused = unpad_input(x, valid, unused)
    assert packed.tolist() == [0, 1, 2, 4, 5, 6, 7]
    assert idx.tolist() == [0, 1, 2, 4, 5, 6, 7]
    assert cu.tolist() == [0, 3, 7] and max_seqlen == 4 and seqused.tolist() == [2, 1]


def test_unpad_varlen_pad_equals_each_sequence_alone():
    """The BERT flow: a padded batch unpadded, attended as packed sequences
    (q, k and v unpadded together), padded back: each sequence's rows bitwise
    those of flash_attn_func on that sequence alone, zeros at the padding."""
    rng = np.random.default_rng(41)
    lengths, S, H, D = [6, 2, 9, 4], 9, 4, 16
    mask = _padding_mask(lengths, S)
    qkv = randn(rng, 4, S, 3, H, D)
    packed, idx, cu, max_seqlen, _ = unpad_input(qkv, mask)
    out = flash_attn_varlen_func(packed[:, 0], packed[:, 1], packed[:, 2], cu, cu, max_seqlen,
                                 max_seqlen, causal=True)
    padded = pad_input(out, idx, 4, S)
    for b, n in enumerate(lengths):
        alone = flash_attn_func(qkv[b:b + 1, :n, 0], qkv[b:b + 1, :n, 1], qkv[b:b + 1, :n, 2],
                                causal=True)
        assert np.array_equal(padded[b, :n], alone[0])
        assert not padded[b, n:].any()


def test_index_first_axis():
    x = np.arange(24).reshape(6, 2, 2)
    idx = np.array([5, 0, 5, 2], np.int32)  # (repeats allowed)
    got = index_first_axis(x, idx)
    assert got.dtype == x.dtype and np.array_equal(got, x[idx])
    assert np.array_equal(index_first_axis(np.arange(4.0), [3, 1]), [3.0, 1.0])
    assert index_first_axis(x, np.zeros(0, np.int64)).shape == (0, 2, 2)


BERT_PADDING_BAD = [
    ("attention_mask must hold 0 .padding. and 1 .a token., got 2 at \\[1, 0\\]",
     lambda: unpad_input(np.zeros((2, 3)), [[1, 1, 0], [2, 0, 0]]), ValueError),
    ("attention_mask must hold bools or the integers 0 and 1, got dtype float64",
     lambda: unpad_input(np.zeros((2, 3)), np.ones((2, 3))), TypeError),
    (r"attention_mask must have shape \(batch, seqlen\), got \(6,\)",
     lambda: unpad_input(np.zeros((2, 3)), np.ones(6, bool)), ValueError),
    (r"hidden_states must have shape \(batch, seqlen, ...\) with \(batch, seqlen\) = "
     r"attention_mask's shape \(2, 3\), got \(3, 2\)",
     lambda: unpad_input(np.zeros((3, 2)), np.ones((2, 3), bool)), ValueError),
    (r"unused_mask must have shape \(batch, seqlen\) = \(2, 3\), got \(2, 2\)",
     lambda: unpad_input(np.zeros((2, 3)), np.ones((2, 3), bool), np.zeros((2, 2), bool)),
     ValueError),
    (r"unused_mask marks \[0, 2\], a token of attention_mask",
     lambda: unpad_input(np.zeros((2, 3)), np.ones((2, 3), bool), [[0, 0, 1], [0, 0, 0]]),
     ValueError),
    (r"indices must lie in \[0, 4\) \(batch \* seqlen = 2 \* 2\), got 4 at 1",
     lambda: pad_input(np.zeros((2, 1)), [0, 4], 2, 2), ValueError),
    (r"indices must lie in \[0, 6\) \(input.shape\[0\]\), got -1 at 0",
     lambda: index_first_axis(np.zeros((6, 2)), [-1]), ValueError),
    (r"indices repeats 1 \(at 2 and earlier\)",
     lambda: pad_input(np.zeros((3, 1)), [0, 1, 1], 2, 2), ValueError),
    (r"indices must have one entry per row of hidden_states \(3\), got 2",
     lambda: pad_input(np.zeros((3, 1)), [0, 1], 2, 2), ValueError),
    ("indices must be an array of integers, got dtype float64",
     lambda: pad_input(np.zeros((2, 1)), [0.0, 1.0], 2, 2), TypeError),
    (r"indices must be 1-d, got shape \(1, 2\)",
     lambda: index_first_axis(np.zeros((3, 1)), [[0, 1]]), ValueError),
    ("batch must be an int >= 0, got -1", lambda: pad_input(np.zeros((0, 1)), [], -1, 2),
     ValueError),
    ("seqlen must be an int, got float", lambda: pad_input(np.zeros((0, 1)), [], 1, 2.0),
     TypeError),
]


@pytest.mark.parametrize("words,call,exc", BERT_PADDING_BAD,
                         ids=[f"{i}" for i in range(len(BERT_PADDING_BAD))])
def test_bert_padding_bad_input(words, call, exc):
    with pytest.raises(exc, match=words):
        call()


# ----------------------------------------------------------------------------
# Packed q, k, v: views handed to the unpacked functions

import inspect  # noqa: E402

from fastattn.flash_attn import (flash_attn_kvpacked_func, flash_attn_qkvpacked_func,  # noqa: E402
                                 flash_attn_varlen_kvpacked_func,
                                 flash_attn_varlen_qkvpacked_func)

# FlashAttention 2.x's signatures (flash_attn/flash_attn_interface.py), copied
# here as data: the names, their order and the defaults a drop-in must match.
_OPTS = [("dropout_p", 0.0), ("softmax_scale", None), ("causal", False),
         ("window_size", (-1, -1)), ("softcap", 0.0), ("alibi_slopes", None),
         ("deterministic", False), ("return_attn_probs", False)]
FA_SIGNATURES = {
    "flash_attn_qkvpacked_func": ["qkv"] + _OPTS,
    "flash_attn_kvpacked_func": ["q", "kv"] + _OPTS,
    "flash_attn_func": ["q", "k", "v"] + _OPTS,
    "flash_attn_varlen_qkvpacked_func": ["qkv", "cu_seqlens", "max_seqlen"] + _OPTS,
    "flash_attn_varlen_kvpacked_func": ["q", "kv", "cu_seqlens_q", "cu_seqlens_k",
                                        "max_seqlen_q", "max_seqlen_k"] + _OPTS,
    "flash_attn_varlen_func": ["q", "k", "v", "cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q",
                               "max_seqlen_k"] + _OPTS + [("block_table", None)],
}


@pytest.mark.parametrize("name", sorted(FA_SIGNATURES))
def test_signatures_match_flash_attention(name):
    params = list(inspect.signature(getattr(fa, name)).parameters.values())
    positional = [p for p in params if p.kind == p.POSITIONAL_OR_KEYWORD]
    want = [(p, inspect.Parameter.empty) if isinstance(p, str) else p for p in FA_SIGNATURES[name]]
    assert [(p.name, p.default) for p in positional] == want
    assert [p.name for p in params if p.kind == p.KEYWORD_ONLY] == ["out"]  # (the extension)
    assert name in fa.__all__


OPTIONS = [dict(), dict(causal=True), dict(window_size=(2, 1), softcap=3.0),
           dict(causal=True, alibi_slopes="BH", softmax_scale=0.2)]


def _options(rng, opts, B, H):
    opts = dict(opts)
    if opts.get("alibi_slopes") == "BH":
        opts["alibi_slopes"] = rng.random((B, H)) * 0.5
    return opts


@pytest.mark.parametrize("opts", OPTIONS)
def test_qkvpacked_bitwise_unpacked(opts):
    rng = np.random.default_rng(50)
    qkv = randn(rng, 2, 7, 3, 4, 16)
    opts = _options(rng, opts, 2, 4)
    got = flash_attn_qkvpacked_func(qkv, return_attn_probs=True, **opts)
    want = flash_attn_func(qkv[:, :, 0].copy(), qkv[:, :, 1].copy(), qkv[:, :, 2].copy(),
                           return_attn_probs=True, **opts)
    assert len(got) == 3 and all(np.array_equal(g, w) for g, w in zip(got, want))
    out = np.empty((2, 7, 4, 16), np.float32)
    assert flash_attn_qkvpacked_func(qkv, out=out, **opts) is out
    assert np.array_equal(out, want[0])


@pytest.mark.parametrize("opts", OPTIONS)
def test_kvpacked_bitwise_unpacked(opts):
    rng = np.random.default_rng(51)
    q, kv = randn(rng, 2, 5, 6, 8), randn(rng, 2, 9, 2, 3, 8)  # grouped heads: 6 over 3
    opts = _options(rng, opts, 2, 6)
    got = flash_attn_kvpacked_func(q, kv, return_attn_probs=True, **opts)
    want = flash_attn_func(q, kv[:, :, 0].copy(), kv[:, :, 1].copy(), return_attn_probs=True,
                           **opts)
    assert len(got) == 3 and all(np.array_equal(g, w) for g, w in zip(got, want))
    assert np.array_equal(flash_attn_kvpacked_func(q, kv, **opts), want[0])


@pytest.mark.parametrize("opts", OPTIONS)
def test_varlen_packed_bitwise_unpacked(opts):
    rng = np.random.default_rng(52)
    lens_q, lens_k = [3, 0, 5, 2], [4, 2, 5, 6]
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    opts = _options(rng, opts, 4, 4)
    qkv = randn(rng, cu_q[-1], 3, 4, 8)
    got = flash_attn_varlen_qkvpacked_func(qkv, cu_q, 5, return_attn_probs=True, **opts)
    want = flash_attn_varlen_func(qkv[:, 0].copy(), qkv[:, 1].copy(), qkv[:, 2].copy(), cu_q,
                                  cu_q, 5, 5, return_attn_probs=True, **opts)
    assert len(got) == 3 and all(np.array_equal(g, w) for g, w in zip(got, want))
    q, kv = randn(rng, cu_q[-1], 4, 8), randn(rng, cu_k[-1], 2, 2, 8)
    got = flash_attn_varlen_kvpacked_func(q, kv, cu_q, cu_k, 5, 6, return_attn_probs=True,
                                          **opts)
    want = flash_attn_varlen_func(q, kv[:, 0].copy(), kv[:, 1].copy(), cu_q, cu_k, 5, 6,
                                  return_attn_probs=True, **opts)
    assert len(got) == 3 and all(np.array_equal(g, w) for g, w in zip(got, want))
    out = np.empty((cu_q[-1], 4, 8), np.float32)
    assert flash_attn_varlen_kvpacked_func(q, kv, cu_q, cu_k, 5, 6, out=out, **opts) is out
    assert np.array_equal(out, want[0])


def test_packed_inputs_read_in_place():
    """The views of the packed arrays are read where they lie: no copy of kv."""
    rng = np.random.default_rng(53)
    q, kv = randn(rng, 1, 4, 8, 64), randn(rng, 1, 4096, 2, 2, 64)
    qkv = randn(rng, 1, 2048, 3, 2, 64)
    flash_attn_kvpacked_func(q, kv)
    flash_attn_varlen_kvpacked_func(q[0], kv[0], [0, 4], [0, 4096], 4, 4096)
    for call in (lambda: flash_attn_kvpacked_func(q, kv, causal=True),
                 lambda: flash_attn_varlen_kvpacked_func(q[0], kv[0], [0, 4], [0, 4096], 4, 4096),
                 lambda: flash_attn_qkvpacked_func(qkv[:, :4], causal=True)):
        assert traced_peak(call) < kv.nbytes / 16


PACKED_BAD = [
    (r"qkv must have shape \(batch_size, seqlen, 3, nheads, headdim\) with headdim >= 1, got "
     r"\(1, 4, 2, 2, 8\)", lambda: flash_attn_qkvpacked_func(np.zeros((1, 4, 2, 2, 8))),
     ValueError),
    (r"qkv must have 5 dimensions, got shape \(4, 3, 2, 8\)",
     lambda: flash_attn_qkvpacked_func(np.zeros((4, 3, 2, 8))), ValueError),
    ("qkv must have a real floating dtype",
     lambda: flash_attn_qkvpacked_func(np.zeros((1, 4, 3, 2, 8), int)), TypeError),
    (r"qkv must have shape \(batch_size, seqlen, 3, nheads, headdim\) with headdim >= 1, got "
     r"\(1, 4, 3, 2, 0\)", lambda: flash_attn_qkvpacked_func(np.zeros((1, 4, 3, 2, 0))),
     ValueError),
    (r"kv must have shape \(batch_size, seqlen_k, 2, nheads_k, headdim\)",
     lambda: flash_attn_kvpacked_func(np.zeros((1, 4, 2, 8)), np.zeros((1, 4, 3, 2, 8))),
     ValueError),
    (r"kv must have q's batch size \(1\), got kv of shape \(2, 4, 2, 2, 8\)",
     lambda: flash_attn_kvpacked_func(np.zeros((1, 4, 2, 8)), np.zeros((2, 4, 2, 2, 8))),
     ValueError),
    (r"kv's head dimension must be q's \(8\), got kv of shape \(1, 4, 2, 2, 4\)",
     lambda: flash_attn_kvpacked_func(np.zeros((1, 4, 2, 8)), np.zeros((1, 4, 2, 2, 4))),
     ValueError),
    (r"the number of query heads \(3\) must be a multiple of kv's number of heads \(2\)",
     lambda: flash_attn_kvpacked_func(np.zeros((1, 4, 3, 8)), np.zeros((1, 4, 2, 2, 8))),
     ValueError),
    (r"kv must have shape \(total_k, 2, nheads_k, headdim\)",
     lambda: flash_attn_varlen_kvpacked_func(np.zeros((4, 2, 8)), np.zeros((4, 1, 2, 8)),
                                             [0, 4], [0, 4], 4, 4), ValueError),
    ("cu_seqlens must end at total \\(qkv.shape\\[0\\]\\) = 4, got 3",
     lambda: flash_attn_varlen_qkvpacked_func(np.zeros((4, 3, 2, 8)), [0, 3], 4), ValueError),
    (r"max_seqlen \(2\) is smaller than the longest sequence \(3\)",
     lambda: flash_attn_varlen_qkvpacked_func(np.zeros((4, 3, 2, 8)), [0, 3, 4], 2),
     ValueError),
    ("dropout_p must be 0.0",
     lambda: flash_attn_qkvpacked_func(np.zeros((1, 4, 3, 2, 8)), 0.1), ValueError),
]


@pytest.mark.parametrize("words,call,exc", PACKED_BAD, ids=[str(i) for i in range(len(PACKED_BAD))])
def test_packed_bad_input(words, call, exc):
    with pytest.raises(exc, match=words):
        call()


def test_packed_out_must_not_overlap_the_packed_array():
    """out is checked against the packed arrays as the caller gave them (and
    named so), before anything is written."""
    buf = np.zeros(2 * 4 * 3 * 2 * 8, np.float32)
    qkv = buf.reshape(2, 4, 3, 2, 8)
    with pytest.raises(ValueError, match="out must not share memory with qkv"):
        flash_attn_qkvpacked_func(qkv, out=buf[:128].reshape(2, 4, 2, 8))
    buf[:] = 1.0
    q, kv = np.ones((1, 4, 2, 8), np.float32), buf[:128].reshape(1, 4, 2, 2, 8)
    with pytest.raises(ValueError, match="out must not share memory with kv"):
        flash_attn_kvpacked_func(q, kv, out=buf[64:128].reshape(1, 4, 2, 8))
    with pytest.raises(ValueError, match="out must not share memory with kv"):
        flash_attn_varlen_kvpacked_func(q[0], kv[0], [0, 4], [0, 4], 4, 4,
                                        out=buf[64:128].reshape(4, 2, 8))
    assert (buf == 1.0).all()


# ----------------------------------------------------------------------------
# layers.rotary.apply_rotary_emb: the rotation flash_attn_with_kvcache applies

from fastattn.flash_attn.layers.rotary import apply_rotary_emb, apply_rotary_emb_func  # noqa: E402


def _tables(rng, n, rotary_dim):
    angle = rng.random((n, rotary_dim // 2)) * 2 * np.pi
    return np.cos(angle), np.sin(angle)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("rotary_dim", [16, 6])
@pytest.mark.parametrize("offsets", [0, 3, "per sequence"])
def test_apply_rotary_emb_matches_model(interleaved, rotary_dim, offsets):
    rng = np.random.default_rng(60)
    x = randn(rng, 3, 5, 2, 16)
    cos, sin = _tables(rng, 20, rotary_dim)
    offsets = np.array([0, 7, 15]) if offsets == "per sequence" else offsets
    y = apply_rotary_emb(x, cos, sin, interleaved=interleaved, seqlen_offsets=offsets)
    pos = np.broadcast_to(np.asarray(offsets)[..., None], (3, 1)) + np.arange(5)
    want = rope_model(x, cos, sin, pos, interleaved)
    assert y.dtype == np.float32 and y.shape == x.shape
    np.testing.assert_allclose(y, want, rtol=1e-6, atol=1e-6)
    assert np.array_equal(y[..., rotary_dim:], x[..., rotary_dim:])  # the rest kept
    # packed: each sequence at its own offset, the same bits
    lens = [5, 2, 4]
    cu = np.concatenate([[0], np.cumsum(lens)])
    packed = np.concatenate([x[b, :n] for b, n in enumerate(lens)])
    yp = apply_rotary_emb(packed, cos, sin, interleaved=interleaved, seqlen_offsets=offsets,
                          cu_seqlens=cu, max_seqlen=5)
    assert np.array_equal(yp, np.concatenate([y[b, :n] for b, n in enumerate(lens)]))


@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("causal", [False, True])
def test_apply_rotary_emb_is_kvcache_rotation(interleaved, causal):
    """One rule: what flash_attn_with_kvcache does with rotary_cos and
    rotary_sin is, bit for bit, apply_rotary_emb on q and k at the cache's
    positions followed by the call without the tables."""
    rng = np.random.default_rng(61)
    c = _cache_case(rng, L=3, L_new=3)
    cos, sin = _tables(rng, 30, 10)
    cs = np.array([2, 9, 21])
    kc1, vc1 = c["k_cache"].copy(), c["v_cache"].copy()
    o1 = flash_attn_with_kvcache(c["q"], kc1, vc1, c["k"], c["v"], rotary_cos=cos,
                                 rotary_sin=sin, cache_seqlens=cs, causal=causal,
                                 rotary_interleaved=interleaved)
    # without causal or a window, every row of q sits at cache_seqlens[b]
    q_rot = (apply_rotary_emb(c["q"], cos, sin, interleaved, seqlen_offsets=cs) if causal else
             np.concatenate([apply_rotary_emb(c["q"][:, i:i + 1], cos, sin, interleaved,
                                              seqlen_offsets=cs) for i in range(3)], axis=1))
    k_rot = apply_rotary_emb(c["k"], cos, sin, interleaved, seqlen_offsets=cs)
    kc2, vc2 = c["k_cache"].copy(), c["v_cache"].copy()
    o2 = flash_attn_with_kvcache(q_rot, kc2, vc2, k_rot, c["v"], cache_seqlens=cs, causal=causal)
    assert np.array_equal(kc1, kc2) and np.array_equal(vc1, vc2) and np.array_equal(o1, o2)


@pytest.mark.parametrize("dtype", ["float16", "float64", "bfloat16"])
def test_apply_rotary_emb_dtypes_and_inplace(dtype):
    if dtype == "bfloat16":
        dtype = pytest.importorskip("ml_dtypes").bfloat16
    rng = np.random.default_rng(62)
    x = randn(rng, 2, 4, 3, 8).astype(dtype)
    cos, sin = _tables(rng, 8, 8)
    y = apply_rotary_emb(x, cos, sin)
    # computed in float32 (FlashAttention's kernel), rounded to x's dtype once
    want = apply_rotary_emb(x.astype(np.float32), cos.astype(np.float32), sin.astype(np.float32))
    assert y.dtype == x.dtype and np.array_equal(y, want.astype(dtype))
    z = x.copy()
    assert apply_rotary_emb(z, cos, sin, inplace=True) is z
    assert np.array_equal(z, y)
    assert apply_rotary_emb_func is apply_rotary_emb


def test_apply_rotary_emb_inplace_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(63)
    x = randn(rng, 1, 4, 2, 8)
    cos, sin = _tables(rng, 4, 8)
    t = torch.from_numpy(x.copy())
    assert apply_rotary_emb(t, cos, sin, inplace=True) is t
    assert np.array_equal(t.numpy(), apply_rotary_emb(x, cos, sin))


ROTARY_BAD = [
    (r"cos and sin have 8 positions; sequence 1 needs positions 5 to 8 \(seqlen_offsets \+ "
     r"its tokens\)", dict(seqlen_offsets=np.array([0, 5])), ValueError),
    (r"cos and sin have 8 positions; sequence 0 needs positions 6 to 9",
     dict(seqlen_offsets=6), ValueError),
    (r"seqlen_offsets must be >= 0, got -1 for sequence 1",
     dict(seqlen_offsets=np.array([0, -1])), ValueError),
    ("seqlen_offsets must be an int >= 0, got -2", dict(seqlen_offsets=-2), ValueError),
    (r"seqlen_offsets must have shape \(2,\), got \(3,\)",
     dict(seqlen_offsets=np.zeros(3, int)), ValueError),
    ("seqlen_offsets must be an array of integers", dict(seqlen_offsets=np.zeros(2)),
     TypeError),
    (r"sin must have cos's shape \(8, 4\), got \(8, 3\)", dict(sin=np.zeros((8, 3))),
     ValueError),
    (r"cos must have shape \(seqlen_ro, rotary_dim / 2\) with 1 <= rotary_dim <= headdim = 8",
     dict(cos=np.zeros((8, 5)), sin=np.zeros((8, 5))), ValueError),
    (r"x must have 3 dimensions", dict(cu_seqlens=[0, 2]), ValueError),
    ("max_seqlen is needed with cu_seqlens",
     dict(x=np.zeros((5, 3, 8)), cu_seqlens=[0, 2, 5]), ValueError),
    (r"max_seqlen \(2\) is smaller than the longest sequence \(3\)",
     dict(x=np.zeros((5, 3, 8)), cu_seqlens=[0, 2, 5], max_seqlen=2), ValueError),
    ("cu_seqlens must end at total",
     dict(x=np.zeros((5, 3, 8)), cu_seqlens=[0, 2, 4], max_seqlen=2), ValueError),
    ("x must be writeable: it is rotated in place",
     dict(x=np.broadcast_to(np.zeros(8), (2, 4, 3, 8)), inplace=True), ValueError),
    ("x must be a NumPy array or a CPU torch tensor",
     dict(x=np.zeros((2, 4, 3, 8)).tolist(), inplace=True), TypeError),
    ("inplace must be a bool", dict(inplace=1), TypeError),
    ("max_seqlen must be an int", dict(max_seqlen=2.5), TypeError),
]


@pytest.mark.parametrize("words,change,exc", ROTARY_BAD,
                         ids=[str(i) for i in range(len(ROTARY_BAD))])
def test_apply_rotary_emb_bad_input(words, change, exc):
    kw = dict(x=np.zeros((2, 4, 3, 8)), cos=np.ones((8, 4)), sin=np.zeros((8, 4)))
    kw.update(change)
    x = kw["x"]
    before = np.array(x, copy=True)
    with pytest.raises(exc, match=words):
        apply_rotary_emb(**kw)
    assert np.array_equal(np.asarray(x), before)


def test_version_is_the_flash_attention_api_followed():
    """__version__ names the FlashAttention release whose API is matched (a
    version that code comparing flash_attn.__version__ can parse), not
    fastattn's own."""
    assert fa.__version__ == "2.8.3"
    assert tuple(int(p) for p in fa.__version__.split(".")) >= (2, 7, 0)
    assert fa.__version__ != fastattn.__version__


# ----------------------------------------------------------------------------
# The differences from FlashAttention stated in docs/howto/conventions.rst, each
# against a model of FlashAttention 2.8.3's own rule, written here from its
# sources (csrc/flash_attn/flash_api.cpp, csrc/flash_attn/src/mask.h)


def _fa_kernel_keys(L, S, left, right, causal, seqlen_k, widen):
    """The keys FlashAttention's kernel lets query i see: its rewrite of
    window_size (a side >= seqlen_k becomes -1 where `widen`: flash_attn_func
    and flash_attn_with_kvcache, not varlen; causal sets the right side to 0;
    a -1 side beside a set one becomes seqlen_k), then mask.h's bounds
    max(0, p - left) <= j < min(S, p + 1 + right), p = i + S - L."""
    if widen:
        left = -1 if left >= seqlen_k else left
        right = -1 if right >= seqlen_k else right
    if causal:
        right = 0
    allowed = np.ones((L, S), bool)
    if left < 0 and right < 0:
        return allowed
    left, right = (seqlen_k if left < 0 else left), (seqlen_k if right < 0 else right)
    p = np.arange(L)[:, None] + S - L
    j = np.arange(S)[None, :]
    return (j >= np.maximum(0, p - left)) & (j < np.minimum(S, p + 1 + right))


def _fastattn_keys(L, S, left, right, causal):
    """fastattn's rule: sides are distances, a negative side unbounded,
    causal a right side of 0 at most."""
    p = np.arange(L)[:, None] + S - L
    j = np.arange(S)[None, :]
    allowed = np.ones((L, S), bool)
    if left >= 0:
        allowed &= j >= p - left
    if causal:
        right = 0 if right < 0 else min(right, 0)
    if right >= 0:
        allowed &= j <= p + right
    return allowed


def _sides(S):
    return sorted({-1, -3, 0, 1, 2, max(S - 1, 0), S, S + 1, S + 4})


def _check_far_rows_only(got, fa_keys, L, S, causal, where):
    """got equals FlashAttention's keys on every row with p = i + S - L >= -1
    (every row with causal); returns whether any row differs."""
    p = np.arange(L) + S - L
    near = np.ones(L, bool) if causal else p >= -1
    assert np.array_equal(got[near], fa_keys[near]), where
    return not np.array_equal(got, fa_keys)


def test_conventions_window_sides_func():
    """flash_attn_func: fastattn's rule exactly, and the same keys as
    FlashAttention's kernel except on queries more than one position before
    the first key, without causal, with a right side that FlashAttention
    rewrites (-1 beside a left window shorter than S; S or more)."""
    differ = set()
    for L in range(1, 7):
        for S in range(1, 6):
            q, k = np.zeros((1, L, 1, 4), np.float32), np.zeros((1, S, 1, 4), np.float32)
            for causal in (False, True):
                for left in _sides(S):
                    for right in _sides(S):
                        _, _, probs = flash_attn_func(q, k, k, causal=causal,
                                                      window_size=(left, right),
                                                      return_attn_probs=True)
                        got = probs[0, 0] > 0
                        where = (L, S, causal, left, right)
                        assert np.array_equal(got, _fastattn_keys(L, S, left, right, causal)), \
                            where
                        fa_keys = _fa_kernel_keys(L, S, left, right, causal, S, widen=True)
                        if _check_far_rows_only(got, fa_keys, L, S, causal, where):
                            # only the right sides FlashAttention rewrites
                            assert L >= S + 2 and not causal
                            windowed = 0 <= left < S
                            assert ((right < 0 and windowed) or right > S
                                    or (right == S and not windowed)), where
                            differ.add((L, S, left, right))
    assert (5, 2, 1, -1) in differ  # the page's example
    # query 0 sees no key in FlashAttention, query 1 key 0 only; fastattn: both keys
    fa_keys = _fa_kernel_keys(5, 2, 1, -1, False, 2, widen=True)
    assert fa_keys[:2].tolist() == [[False, False], [True, False]]


def test_conventions_window_sides_varlen_and_kvcache():
    """The same in flash_attn_varlen_func (no widening, seqlen_k =
    max_seqlen_k) and flash_attn_with_kvcache (seqlen_k = the cache's
    capacity, positions counted from cache_leftpad)."""
    lens_q, lens_k = [6, 1, 4, 2], [2, 3, 4, 5]
    cu_q = np.concatenate([[0], np.cumsum(lens_q)])
    cu_k = np.concatenate([[0], np.cumsum(lens_k)])
    q = np.zeros((cu_q[-1], 1, 4), np.float32)
    k = np.zeros((cu_k[-1], 1, 4), np.float32)
    for causal in (False, True):
        for left in _sides(5):
            for right in _sides(5):
                _, _, probs = flash_attn_varlen_func(q, k, k, cu_q, cu_k, 6, 5, causal=causal,
                                                     window_size=(left, right),
                                                     return_attn_probs=True)
                for b, (L, S) in enumerate(zip(lens_q, lens_k)):
                    got = probs[b, 0, :L, :S] > 0
                    assert np.array_equal(got, _fastattn_keys(L, S, left, right, causal))
                    fa_keys = _fa_kernel_keys(L, S, left, right, causal, 5, widen=False)
                    _check_far_rows_only(got, fa_keys, L, S, causal, (b, causal, left, right))
    # KV cache: capacity 6, sequences of 2 and 5 valid keys (one left-padded), 4 queries
    B, C, L = 2, 6, 4
    qc = np.zeros((B, L, 1, 4), np.float32)
    kc = np.zeros((B, C, 1, 4), np.float32)
    vc = np.broadcast_to(np.eye(C, dtype=np.float32)[None, :, None, :], (B, C, 1, C)).copy()
    seqlens, leftpad = np.array([2, 6]), np.array([0, 1])
    for causal in (False, True):
        for left in _sides(C):
            for right in _sides(C):
                out = flash_attn_with_kvcache(qc, kc, vc, cache_seqlens=seqlens,
                                              cache_leftpad=leftpad, causal=causal,
                                              window_size=(left, right))
                for b in range(B):
                    S = int(seqlens[b] - leftpad[b])
                    got = out[b, :, 0, leftpad[b]:seqlens[b]] > 0
                    assert np.array_equal(got, _fastattn_keys(L, S, left, right, causal))
                    fa_keys = _fa_kernel_keys(L, S, left, right, causal, C, widen=True)
                    _check_far_rows_only(got, fa_keys, L, S, causal, (b, causal, left, right))


def _kernel_alibi_lse(q, k, slopes, S, L):
    """FlashAttention's causal-path lse: scores plus slope * j (keys j <= p)."""
    s = np.einsum("lhd,shd->hls", q.astype(np.float64), k.astype(np.float64)) / np.sqrt(q.shape[-1])
    s = s + slopes[:, None, None] * np.arange(S)
    p = np.arange(L)[:, None] + S - L
    s = np.where(np.arange(S) <= p, s, -np.inf)
    m = s.max(-1, keepdims=True)
    return (np.log(np.exp(s - m).sum(-1)) + m[..., 0])  # (H, L)


def test_conventions_alibi_lse_on_flash_attentions_causal_path():
    """fastattn's lse is the documented one (-slope |p - j|); FlashAttention's
    causal kernel path (+slope j) gives lse + slope * (i + S - L). The outputs
    agree (a per-row constant)."""
    rng = np.random.default_rng(70)
    B, L, S, H, D = 2, 4, 7, 3, 8
    q, k, v = randn(rng, B, L, H, D), randn(rng, B, S, H, D), randn(rng, B, S, H, D)
    slopes = (rng.random(H) * 0.5).astype(np.float32)
    shift = slopes[:, None] * (np.arange(L) + S - L)  # (H, L)
    for window_size in ((-1, -1), (-1, 0), (S, 0), (S + 5, -1)):
        causal = window_size[1] != 0
        o, lse, _ = flash_attn_func(q, k, v, causal=causal, window_size=window_size,
                                    alibi_slopes=slopes, return_attn_probs=True)
        mo, mlse, _ = model(q, k, v, causal=True, alibi_slopes=slopes)
        np.testing.assert_allclose(lse, mlse, **TOL)
        np.testing.assert_allclose(o, mo, **TOL)
        for b in range(B):
            np.testing.assert_allclose(lse[b] + shift, _kernel_alibi_lse(q[b], k[b], slopes, S, L),
                                       **TOL)


def test_conventions_softcap_off_and_refused():
    rng = np.random.default_rng(71)
    q, k, v = randn(rng, 1, 3, 2, 8), randn(rng, 1, 5, 2, 8), randn(rng, 1, 5, 2, 8)
    off = flash_attn_func(q * 10, k, v)
    for softcap in (0.0, -1.0, -np.inf, 0, -3):
        assert np.array_equal(flash_attn_func(q * 10, k, v, softcap=softcap), off)
    assert not np.array_equal(flash_attn_func(q * 10, k, v, softcap=1.0), off)
    for softcap in (np.nan, np.inf, 1e-40):
        with pytest.raises(ValueError, match="softcap"):
            flash_attn_func(q, k, v, softcap=softcap)


def test_conventions_any_head_dimension():
    rng = np.random.default_rng(72)
    q, k, v = randn(rng, 1, 2, 1, 300), randn(rng, 1, 3, 1, 300), randn(rng, 1, 3, 1, 1)
    o, lse, _ = flash_attn_func(q, k, v, return_attn_probs=True)
    mo, mlse, _ = model(q, k, v)
    assert o.dtype == np.float32
    np.testing.assert_allclose(o, mo, **TOL)
