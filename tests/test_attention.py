"""scaled_dot_product_attention: shapes, broadcasting, GQA, layouts, scale,
lse and non-finite scores.

The rules held here: leading dims broadcast by NumPy's rules (k with one head
serves all: multi-query attention); with enable_gqa the head axis is -3 and
query head h reads kv head h // (Hq // Hkv); D >= 1 while L, S and Dv may be
0; scale=None is 1/sqrt(D) and any finite float is used as given (0: equal
weights over the allowed keys); lse is the natural log of the sum of the
exponentials of the allowed scaled scores; a NaN among the allowed scores (from
q, k, a float mask or a v row that is read) makes the row NaN, a +inf score
makes it NaN with lse +inf; huge finite scores never overflow."""

import math

import numpy as np
import pytest

import fastattn

from conftest import (IMPL_IDS, IMPLS, assert_close, assert_new_c_float32, assert_same_bits,
                      compare_sdpa, naive_sdpa, qkv, randn, readonly)

sdpa = fastattn.scaled_dot_product_attention

ODD = [1, 3, 17, 33, 65, 129]


# ------------------------------------------------------------ worked example

def test_worked_example():
    q = np.array([[1.0, 0.0]])
    k = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    v = np.array([[10.0, 0.0], [0.0, 10.0], [5.0, 5.0]])
    w = fastattn.attention_weights(q, k)
    out = sdpa(q, k, v)
    assert out.shape == (1, 2) and out.dtype == np.float32
    np.testing.assert_allclose(w[0], [0.4011, 0.1978, 0.4011], atol=5e-5)
    np.testing.assert_allclose(w.sum(), 1.0, rtol=1e-6)
    np.testing.assert_allclose(out[0], [6.0167, 3.9833], atol=5e-5)
    # and the unrounded values, computed here by hand
    a = math.exp(1 / math.sqrt(2))
    exact_w = np.array([a, 1.0, a]) / (2 * a + 1)
    np.testing.assert_allclose(w[0], exact_w, rtol=1e-6)
    np.testing.assert_allclose(out[0], exact_w @ v, rtol=1e-6)


# ------------------------------------------------------------------- shapes

@pytest.mark.parametrize("L", ODD)
@pytest.mark.parametrize("S", ODD)
def test_odd_lengths(rng, L, S):
    D, Dv = (L + S) % 37 + 1, (L * S) % 23 + 1
    compare_sdpa(*qkv(rng, (2, L, D), (2, S, D), (2, S, Dv)))


@pytest.mark.parametrize("D", [1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 40, 63, 64, 65])
def test_head_dims(rng, D):
    for Dv in (1, D, 17):
        compare_sdpa(*qkv(rng, (3, 9, D), (3, 11, D), (3, 11, Dv)))


@pytest.mark.parametrize("D,Dv", [(5, 11), (16, 3), (1, 8), (8, 1), (40, 33)])
def test_dv_differs_from_d(rng, D, Dv):
    o, lse = compare_sdpa(*qkv(rng, (2, 7, D), (2, 13, D), (2, 13, Dv)), is_causal=True)
    assert o.shape == (2, 7, Dv) and lse.shape == (2, 7)


def test_d_equals_one(rng):
    q, k, v = qkv(rng, (4, 1), (6, 1), (6, 3))
    o, lse = compare_sdpa(q, k, v)
    oo, ll, _ = naive_sdpa(q, k, v)
    assert_close(o, oo)
    assert_close(lse, ll)


@pytest.mark.parametrize("kw", [{}, {"is_causal": True}, {"window": (2, 0)}, {"scale": 0.0}],
                         ids=["plain", "causal", "window", "scale0"])
def test_s_zero_gives_zeros_and_neginf_lse(rng, kw):
    q, k, v = qkv(rng, (2, 3, 5, 4), (2, 3, 0, 4), (2, 3, 0, 6))
    o, lse = sdpa(q, k, v, return_lse=True, **kw)
    assert o.shape == (2, 3, 5, 6) and lse.shape == (2, 3, 5)
    assert (o == 0).all()
    assert (lse == -np.inf).all()
    w = fastattn.attention_weights(q, k, **kw)
    assert w.shape == (2, 3, 5, 0)


def test_l_zero(rng):
    q, k, v = qkv(rng, (2, 0, 4), (2, 5, 4), (2, 5, 3))
    o, lse = compare_sdpa(q, k, v, is_causal=True)
    assert o.shape == (2, 0, 3) and lse.shape == (2, 0)
    assert fastattn.attention_weights(q, k).shape == (2, 0, 5)


def test_dv_zero_still_computes_lse(rng):
    q, k, v = qkv(rng, (2, 6, 4), (2, 5, 4), (2, 5, 0))
    o, lse = compare_sdpa(q, k, v)
    assert o.shape == (2, 6, 0) and lse.shape == (2, 6)
    assert np.isfinite(lse).all()
    _, l0, _ = naive_sdpa(q[0], k[0], v[0])
    assert_close(lse[0], l0)
    # lse does not depend on v at all
    _, lse_v = sdpa(q, k, randn(rng, 2, 5, 3), return_lse=True)
    assert_same_bits(lse, lse_v)


def test_zero_batch(rng):
    q, k, v = qkv(rng, (0, 3, 4, 5), (3, 6, 5), (3, 6, 2))
    o, lse = sdpa(q, k, v, return_lse=True)
    assert o.shape == (0, 3, 4, 2) and lse.shape == (0, 3, 4)


BROADCAST_SHAPES = [
    # q, k, v (without the last two dims), expected batch shape
    ((), (), (), ()),
    ((2,), (2,), (2,), (2,)),
    ((2, 3), (3,), (1, 1), (2, 3)),
    ((2, 1, 4), (3, 1), (1, 3, 4), (2, 3, 4)),
    ((), (4,), (), (4,)),
    ((5,), (), (1,), (5,)),
    ((2, 3, 1, 2), (1, 2), (3, 1, 1), (2, 3, 1, 2)),
]


@pytest.mark.parametrize("qb,kb,vb,ob", BROADCAST_SHAPES, ids=str)
def test_leading_dims_broadcast(rng, qb, kb, vb, ob):
    L, S, D, Dv = 5, 7, 6, 3
    q, k, v = qkv(rng, qb + (L, D), kb + (S, D), vb + (S, Dv))
    o, lse = compare_sdpa(q, k, v)
    assert o.shape == ob + (L, Dv) and lse.shape == ob + (L,)
    # broadcasting is exactly the same as materialising the inputs
    qm = np.ascontiguousarray(np.broadcast_to(q, ob + (L, D)))
    km = np.ascontiguousarray(np.broadcast_to(k, ob + (S, D)))
    vm = np.ascontiguousarray(np.broadcast_to(v, ob + (S, Dv)))
    om, lsem = sdpa(qm, km, vm, return_lse=True)
    assert_same_bits(o, om)
    assert_same_bits(lse, lsem)


def test_mqa_by_broadcasting_k(rng):
    B, H, L, S, D, Dv = 2, 4, 6, 9, 8, 5
    q, k, v = qkv(rng, (B, H, L, D), (B, 1, S, D), (B, 1, S, Dv))
    o, lse = compare_sdpa(q, k, v, is_causal=True)
    for b in range(B):
        for h in range(H):
            oh, lh = sdpa(q[b, h], k[b, 0], v[b, 0], is_causal=True, return_lse=True)
            assert_same_bits(o[b, h], oh)
            assert_same_bits(lse[b, h], lh)
    # enable_gqa=True with Hkv == 1 is the same thing
    assert_same_bits(sdpa(q, k, v, is_causal=True, enable_gqa=True), o)


def test_hq_differs_from_hkv_without_gqa_is_broadcast_error(rng):
    q, k, v = qkv(rng, (1, 4, 3, 2), (1, 2, 3, 2), (1, 2, 3, 2))
    with pytest.raises(ValueError):
        sdpa(q, k, v)


# ---------------------------------------------------------------------- GQA

@pytest.mark.parametrize("hkv", [1, 2, 3, 6])
@pytest.mark.parametrize("is_causal", [False, True])
def test_gqa_matches_per_head_loop(rng, hkv, is_causal):
    B, Hq, L, S, D, Dv = 2, 6, 5, 8, 4, 3
    q, k, v = qkv(rng, (B, Hq, L, D), (B, hkv, S, D), (B, hkv, S, Dv))
    o, lse = compare_sdpa(q, k, v, is_causal=is_causal, enable_gqa=True)
    group = Hq // hkv
    for b in range(B):
        for h in range(Hq):
            kh, vh = k[b, h // group], v[b, h // group]
            oh, lh = sdpa(q[b, h], kh, vh, is_causal=is_causal, return_lse=True)
            assert_same_bits(o[b, h], oh)
            assert_same_bits(lse[b, h], lh)
    # and one head against the loop-based float64 computation
    on, ln, _ = naive_sdpa(q[1, 5], k[1, 5 // group], v[1, 5 // group],
                           allowed=np.tril(np.ones((L, S), bool), S - L) if is_causal else None)
    assert_close(o[1, 5], on)
    assert_close(lse[1, 5], ln)


def test_gqa_is_not_interleaved(rng):
    # h -> h // (Hq / Hkv), not h % Hkv: with Hq=4, Hkv=2 head 1 reads kv head 0
    q = np.broadcast_to(randn(rng, 1, 3, 4), (4, 3, 4))
    k, v = randn(rng, 2, 5, 4), randn(rng, 2, 5, 2)
    o = sdpa(q, k, v, enable_gqa=True)
    assert_same_bits(o[0], o[1])
    assert_same_bits(o[2], o[3])
    assert not np.array_equal(o[1], o[2])


def test_gqa_with_extra_leading_dims_and_mask(rng):
    q, k, v = qkv(rng, (2, 1, 4, 5, 3), (3, 2, 7, 3), (3, 2, 7, 2))
    mask = rng.random((4, 5, 7)) < 0.7  # one mask per query head
    o, lse = compare_sdpa(q, k, v, mask, enable_gqa=True, window=(3, 1))
    assert o.shape == (2, 3, 4, 5, 2)
    for a in range(2):
        for b in range(3):
            for h in range(4):
                oh = sdpa(q[a, 0, h], k[b, h // 2], v[b, h // 2], mask[h], window=(3, 1))
                assert_same_bits(o[a, b, h], oh)


@pytest.mark.parametrize("mod", IMPLS, ids=IMPL_IDS)
def test_gqa_with_no_query_heads_gives_an_empty_result(mod):
    q = np.ones((2, 0, 3, 4), np.float32)
    kv = np.ones((2, 2, 5, 4), np.float32)
    out, lse = mod.scaled_dot_product_attention(q, kv, kv, enable_gqa=True, return_lse=True)
    assert out.shape == (2, 0, 3, 4) and lse.shape == (2, 0, 3)
    assert mod.attention_weights(q, kv, enable_gqa=True).shape == (2, 0, 3, 5)


# ------------------------------------------------------------ input layouts

def _variants(a):
    big = np.zeros((2,) + a.shape[:-1] + (a.shape[-1] * 2,), np.float32)
    big[1, ..., ::2] = a
    return {
        "F-order": np.asfortranarray(a),
        "strided": big[1, ..., ::2],
        "transposed-view": np.ascontiguousarray(np.swapaxes(a, -1, -2)).swapaxes(-1, -2),
        "read-only": readonly(a),
        "float64": a.astype(np.float64),
        "float16-exact": a,  # replaced below by float16 data
    }


@pytest.mark.parametrize("which", ["q", "k", "v", "all"])
@pytest.mark.parametrize("layout", ["F-order", "strided", "transposed-view", "read-only", "float64",
                                    "float16-exact"])
def test_input_layouts_equal_contiguous_float32(rng, which, layout):
    base = dict(zip("qkv", qkv(rng, (2, 3, 9, 6), (2, 3, 11, 6), (2, 3, 11, 5))))
    if layout == "float16-exact":
        base = {n: a.astype(np.float16).astype(np.float32) for n, a in base.items()}
    mask = rng.random((9, 11)) < 0.8
    expected = sdpa(base["q"], base["k"], base["v"], mask, is_causal=True, return_lse=True)
    args = dict(base)
    for name in ("qkv" if which == "all" else which):
        args[name] = (base[name].astype(np.float16) if layout == "float16-exact"
                      else _variants(base[name])[layout])
    before = {n: np.array(a, copy=True) for n, a in args.items()}
    got = sdpa(args["q"], args["k"], args["v"], mask, is_causal=True, return_lse=True)
    assert_new_c_float32(got[0])
    assert_same_bits(got[0], expected[0])
    assert_same_bits(got[1], expected[1])
    for n in args:  # inputs untouched
        np.testing.assert_array_equal(args[n], before[n])


@pytest.mark.parametrize("layout", ["F-order", "strided", "read-only", "float64", "float16"])
def test_float_mask_layouts(rng, layout):
    q, k, v = qkv(rng, (2, 7, 4), (2, 9, 4), (2, 9, 3))
    fm = randn(rng, 2, 7, 9).astype(np.float16).astype(np.float32)
    fm[:, :, 2] = -np.inf
    expected = sdpa(q, k, v, fm)
    if layout == "float16":
        m = fm.astype(np.float16)
    else:
        m = _variants(fm)[layout]
    assert_same_bits(sdpa(q, k, v, m), expected)


@pytest.mark.parametrize("layout", ["F-order", "strided", "read-only"])
def test_bool_mask_layouts(rng, layout):
    q, k, v = qkv(rng, (2, 7, 4), (2, 9, 4), (2, 9, 3))
    mask = rng.random((2, 7, 9)) < 0.6
    expected = sdpa(q, k, v, mask)
    if layout == "F-order":
        m = np.asfortranarray(mask)
    elif layout == "strided":
        big = np.zeros((2, 7, 18), bool)
        big[..., ::2] = mask
        m = big[..., ::2]
    else:
        m = readonly(mask)
    assert_same_bits(sdpa(q, k, v, m), expected)


def test_array_like_inputs(rng):
    q, k, v = qkv(rng, (3, 2), (4, 2), (4, 2))
    got = sdpa(q.tolist(), k.tolist(), v.tolist())
    assert_same_bits(got, sdpa(q, k, v))


def test_results_are_new_arrays_and_inputs_untouched(rng):
    q, k, v = qkv(rng, (3, 5, 4), (3, 6, 4), (3, 6, 2))
    copies = [a.copy() for a in (q, k, v)]
    o = sdpa(q, k, v)
    assert_new_c_float32(o)
    for a in (q, k, v):
        assert not np.shares_memory(o, a)
    for a, c in zip((q, k, v), copies):
        assert_same_bits(a, c)


# -------------------------------------------------------------------- scale

def test_scale_none_is_inverse_sqrt_d(rng):
    q, k, v = qkv(rng, (5, 16), (7, 16), (7, 3))
    assert_same_bits(sdpa(q, k, v), sdpa(q, k, v, scale=0.25))
    q, k, v = qkv(rng, (5, 3), (7, 3), (7, 3))
    assert_close(sdpa(q, k, v), sdpa(q, k, v, scale=1 / math.sqrt(3)), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("scale", [2.0, -0.5, -3.0, 1e-3, 7.5])
def test_scale_values(rng, scale):
    o, lse = compare_sdpa(*qkv(rng, (2, 6, 5), (2, 9, 5), (2, 9, 4)), scale=scale)
    q, k, v = qkv(rng, (6, 5), (9, 5), (9, 4))
    oo, ll, _ = naive_sdpa(q, k, v, scale=scale)
    o2, l2 = sdpa(q, k, v, scale=scale, return_lse=True)
    assert_close(o2, oo)
    assert_close(l2, ll)


@pytest.mark.parametrize("scale", [0.5, np.float32(0.5), np.float64(0.5)])
def test_scale_number_types(rng, scale):
    q, k, v = qkv(rng, (4, 3), (5, 3), (5, 2))
    assert_same_bits(sdpa(q, k, v, scale=scale), sdpa(q, k, v, scale=0.5))


def test_integer_scale(rng):
    q, k, v = qkv(rng, (4, 3), (5, 3), (5, 2))
    assert_same_bits(sdpa(q, k, v, scale=2), sdpa(q, k, v, scale=2.0))
    assert_same_bits(sdpa(q, k, v, scale=np.int64(2)), sdpa(q, k, v, scale=2.0))


def test_scale_zero_gives_uniform_weights_over_allowed_keys(rng):
    L, S = 6, 8
    q, k, v = qkv(rng, (L, 4), (S, 4), (S, 3))
    mask = rng.random((L, S)) < 0.6
    mask[:, 0] = True
    o, lse = compare_sdpa(q, k, v, mask, is_causal=True, scale=0.0)
    allowed = mask & np.tril(np.ones((L, S), bool), S - L)
    for i in range(L):
        n = allowed[i].sum()
        assert_close(o[i], v[allowed[i]].astype(np.float64).mean(axis=0), rtol=1e-6, atol=1e-6)
        assert_close(lse[i], np.log(n), rtol=1e-6, atol=1e-7)
    w = fastattn.attention_weights(q, k, mask, is_causal=True, scale=0.0)
    np.testing.assert_allclose(w, allowed / allowed.sum(-1, keepdims=True), rtol=1e-6)


# ---------------------------------------------------------------------- lse

def test_return_lse_shapes_and_output(rng):
    q, k, v = qkv(rng, (2, 3, 5, 4), (3, 7, 4), (2, 1, 7, 6))
    res = sdpa(q, k, v, return_lse=True)
    assert isinstance(res, tuple) and len(res) == 2
    o, lse = res
    assert o.shape == (2, 3, 5, 6) and lse.shape == (2, 3, 5)
    assert_new_c_float32(lse)
    assert_same_bits(o, sdpa(q, k, v))
    assert_same_bits(o, sdpa(q, k, v, return_lse=False))


def test_lse_is_log_sum_exp_of_scaled_scores(rng):
    q, k, v = qkv(rng, (5, 6), (9, 6), (9, 2))
    fm = randn(rng, 5, 9)
    _, lse = sdpa(q, k, v, fm, scale=0.3, return_lse=True)
    scores = 0.3 * (q.astype(np.float64) @ k.T.astype(np.float64)) + fm
    expected = np.log(np.exp(scores).sum(-1))
    assert_close(lse, expected)


@pytest.mark.parametrize("split", [1, 4, 8])
def test_lse_merges_disjoint_key_sets(rng, split):
    # o over all keys == merge of o over keys[:split] and keys[split:]
    q, k, v = qkv(rng, (2, 6, 5), (2, 11, 5), (2, 11, 3))
    o, lse = sdpa(q, k, v, return_lse=True)
    o1, l1 = sdpa(q, k[:, :split], v[:, :split], return_lse=True)
    o2, l2 = sdpa(q, k[:, split:], v[:, split:], return_lse=True)
    l1, l2 = l1.astype(np.float64), l2.astype(np.float64)
    lm = np.logaddexp(l1, l2)
    merged = np.exp(l1 - lm)[..., None] * o1 + np.exp(l2 - lm)[..., None] * o2
    assert_close(lse, lm)
    assert_close(o, merged)


# --------------------------------------------------------- non-finite scores

def test_nan_in_q_row_gives_nan_row(rng):
    q, k, v = qkv(rng, (2, 5, 4), (2, 6, 4), (2, 6, 3))
    q[1, 2, 0] = np.nan
    o, lse = compare_sdpa(q, k, v)
    assert np.isnan(o[1, 2]).all() and np.isnan(lse[1, 2])
    o[1, 2] = 0
    lse[1, 2] = 0
    assert np.isfinite(o).all() and np.isfinite(lse).all()


def test_nan_in_allowed_k_row_gives_nan_rows(rng):
    L = S = 6
    q, k, v = qkv(rng, (L, 4), (S, 4), (S, 3))
    k[3, 1] = np.nan
    o, lse = compare_sdpa(q, k, v, is_causal=True)
    # key 3 is allowed for rows 3..5 only
    assert np.isfinite(o[:3]).all() and np.isfinite(lse[:3]).all()
    assert np.isnan(o[3:]).all() and np.isnan(lse[3:]).all()


def test_nan_in_float_mask_gives_nan_row(rng):
    q, k, v = qkv(rng, (4, 3), (5, 3), (5, 2))
    fm = np.zeros((4, 5), np.float32)
    fm[2, 4] = np.nan
    o, lse = compare_sdpa(q, k, v, fm)
    assert np.isnan(o[2]).all() and np.isnan(lse[2])
    assert np.isfinite(np.delete(o, 2, 0)).all()
    w = fastattn.attention_weights(q, k, fm)
    assert np.isnan(w[2]).all()


def test_posinf_score_gives_nan_row_and_inf_lse(rng):
    # the row's largest score is +inf: its output is NaN and its lse +inf
    q, k, v = qkv(rng, (4, 3), (5, 3), (5, 2))
    fm = np.zeros((4, 5), np.float32)
    fm[1, 3] = np.inf
    o, lse = compare_sdpa(q, k, v, fm)
    assert np.isnan(o[1]).all() and lse[1] == np.inf
    assert np.isfinite(np.delete(o, 1, 0)).all()


def test_nan_in_allowed_v_row_spreads_to_output(rng):
    q, k, v = qkv(rng, (3, 3), (4, 3), (4, 2))
    v[1, 0] = np.nan
    o, lse = compare_sdpa(q, k, v)
    assert np.isnan(o[:, 0]).all() and np.isfinite(o[:, 1]).all()
    assert np.isfinite(lse).all()


def test_non_finite_values_in_a_tile_many_units_read(rng, threads):
    # float32 values read in place (Dv a multiple of 16) by many 96-row units
    # of one head: each tile is checked once per call and its record serves
    # every unit. A NaN or inf value reaches exactly the rows whose causal
    # bounds allow its key, for every thread count.
    q, k, v = qkv(rng, (2, 300, 32), (2, 300, 32), (2, 300, 32))
    v[0, 20, 3] = np.inf
    v[1, 250, 5] = np.nan
    outs = []
    for n in (1, 2, 3):
        threads(n)
        outs.append(compare_sdpa(q, k, v, is_causal=True))
    for o, lse in outs[1:]:
        assert_same_bits(o, outs[0][0])
        assert_same_bits(lse, outs[0][1])
    o = outs[0][0]
    assert np.isfinite(o[0, :20]).all() and not np.isfinite(o[0, 20:, 3]).any()
    assert np.isfinite(np.delete(o[0, 20:], 3, -1)).all()
    assert np.isfinite(o[1, :250]).all() and np.isnan(o[1, 250:, 5]).all()


@pytest.mark.parametrize("mod", IMPLS, ids=IMPL_IDS)
def test_minus_inf_score_plus_inf_float_mask_is_nan(mod):
    # IEEE: -inf + inf is NaN, and a NaN among the allowed scores is a NaN row.
    q = np.array([[1.0, 0.0]], np.float32)
    k = np.array([[-np.inf, 0.0], [1.0, 0.0]], np.float32)
    out = mod.scaled_dot_product_attention(q, k, np.eye(2, dtype=np.float32),
                                           np.array([[np.inf, 0.0]], np.float32))
    assert np.isnan(out).all()


def _two_allowed_keys(nan_key_first, S=200):
    """One query, two allowed keys (bool mask) in different key tiles: one with
    score -100 and a NaN value row, one with score +100. The NaN key's weight
    exp(-200) is positive (about 1e-87), so o = w0 * NaN + w1 * 5 is NaN."""
    q = np.ones((1, 1), np.float32)
    k = np.zeros((S, 1), np.float32)
    v = np.zeros((S, 1), np.float32)
    lo, hi = (0, S - 1) if nan_key_first else (S - 1, 0)
    k[lo], k[hi] = -1.0, 1.0
    v[lo], v[hi] = np.nan, 5.0
    mask = np.zeros((1, S), bool)
    mask[0, [lo, hi]] = True
    return q, k, v, mask


@pytest.mark.parametrize("mod", IMPLS, ids=IMPL_IDS)
@pytest.mark.parametrize("nan_key_first", [True, False], ids=["nan-key-first", "nan-key-last"])
@pytest.mark.parametrize("scale", [100.0, 1e30])
def test_nan_value_row_with_underflowing_weight(mod, nan_key_first, scale):
    # documented: o_i = sum over allowed j of w_ij v_j; only keys that are not
    # allowed (or whose score is -inf, which is weight 0) are skipped. An allowed key with a finite
    # score has a positive weight, so a NaN in its value row makes o_i NaN,
    # whatever the key order. (The kernel used to skip value rows whose float32
    # weight had underflowed to 0 when it saw the underflow in the key tile
    # being processed, so the result depended on the key order.)
    q, k, v, mask = _two_allowed_keys(nan_key_first)
    o = mod.scaled_dot_product_attention(q, k, v, mask, scale=scale)
    assert np.isnan(o).all()


def test_huge_scores_do_not_overflow(rng):
    # Integer q, k times powers of two and a power-of-two scale: every score
    # is exact in float32 and up to ~1e35, distinct scores differ by >= 2**110.
    q = rng.integers(-3, 4, (2, 4, 8)).astype(np.float32) * np.float32(2.0 ** 10)
    k = rng.integers(-3, 4, (2, 6, 8)).astype(np.float32) * np.float32(2.0 ** 10)
    v = randn(rng, 2, 6, 3)
    o, lse = compare_sdpa(q, k, v, scale=2.0 ** 90)
    assert np.isfinite(o).all() and np.isfinite(lse).all()
    scores = (q.astype(np.float64) @ np.swapaxes(k, -1, -2)) * 2.0 ** 90
    assert np.abs(scores).max() > 1e33
    top = scores == scores.max(-1, keepdims=True)
    expected = (top[..., None] * v[:, None]).sum(-2) / top.sum(-1)[..., None]
    assert_close(o, expected, rtol=1e-6, atol=1e-7)


# ------------------------------------------------------------------- memory

_MEMORY_SCRIPT = """
import sys
import numpy as np
import fastattn
from fastattn._bench import extra_peak_kib

rng = np.random.default_rng(0)
D = 16
if sys.argv[1] == "long":
    L = S = 4096                      # one L x S float32 matrix: 64 MiB
    q, k, v = (rng.standard_normal((L, D), dtype=np.float32) for _ in range(3))
    args, kw = (q, k, v), {}
else:
    B, H, L = 4, 8, 512               # mask per (batch, head): 32 MiB
    q, k, v = (rng.standard_normal((B, H, L, D), dtype=np.float32) for _ in range(3))
    args, kw = (q, k, v, rng.standard_normal((L, L), dtype=np.float32)), {}
out = np.empty(q.shape[:-1] + (D,), np.float32)
fastattn.scaled_dot_product_attention(*(a[..., :4, :4] for a in args[:3]))   # warm up
print(extra_peak_kib(lambda: (fastattn.scaled_dot_product_attention(*args, out=out, **kw),
                              fastattn.scaled_dot_product_attention(*args, is_causal=True,
                                                                    out=out, **kw))))
"""


@pytest.mark.parametrize("case", ["long", "broadcast-mask"])
def test_working_memory_is_not_quadratic(case):
    # documented: working memory O(threads x tile), never O(L x S) per head, and a
    # broadcast mask is never materialised per head or batch.
    import os
    import subprocess
    import sys
    import fastattn
    where = os.path.dirname(os.path.dirname(os.path.abspath(fastattn.__file__)))
    res = subprocess.run([sys.executable, "-c", _MEMORY_SCRIPT, case.split("-")[0]],
                         env=dict(os.environ, PYTHONPATH=where),
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    grown_mib = int(res.stdout.strip()) / 1024
    assert grown_mib < 16, f"peak memory grew by {grown_mib:.1f} MiB"
