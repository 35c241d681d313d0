"""softcap, alibi_slopes, sinks and segment_ids: against the float64 reference
in every combination with masks, is_causal, window, GQA and L != S; their edge
cases (huge scores, the finfo(float32).min padding sentinel, non-finite sinks,
rows with no allowed key, poisoned keys that may not be seen), thread and
batch invariance, and the properties that tie each option to its absence."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import fastattn
from fastattn import reference as ref

from conftest import (FMAX, FMIN, SDPA_TOL, THREAD_COUNTS, assert_close, assert_same_bits,
                      per_thread_count, qkv, randn)


def _docs(n, sizes):
    """Non-decreasing document ids of length n from a cycle of document sizes."""
    ids, doc = [], 0
    while len(ids) < n:
        ids += [doc] * sizes[doc % len(sizes)]
        doc += 1
    return np.array(ids[:n], np.int64)


def option_values(name, rng, batch, L, S):
    """Keyword arguments for option `name` on a call with result batch `batch`
    (q.shape[:-2]) and L queries, S keys."""
    hq = batch[-1]
    if name == "softcap":
        return {"softcap": 1.7}
    if name == "alibi":
        return {"alibi_slopes": (2.0 ** -np.arange(1, hq + 1)).astype(np.float32)}
    if name == "alibi-batch":
        return {"alibi_slopes": rng.uniform(0.0, 0.5, batch).astype(np.float32)}
    if name == "sinks":
        return {"sinks": randn(rng, *batch)}
    if name == "sinks-per-head":
        return {"sinks": np.linspace(-1.0, 2.0, hq).astype(np.float32)}
    if name == "segments":  # packed documents: non-decreasing ids, one range per row
        return {"segment_ids": (_docs(L, [7, 30, 1, 45]), _docs(S, [9, 41, 2, 60]))}
    if name == "segments-general":  # any ids: checked key by key
        return {"segment_ids": (rng.integers(0, 3, (*batch[:-1], 1, L)), rng.integers(0, 3, S))}
    if name == "all":
        out = {"softcap": 3.0, "sinks": randn(rng, hq),
               "alibi_slopes": (2.0 ** -np.arange(1, hq + 1)).astype(np.float32),
               "segment_ids": (_docs(L, [20, 70]), _docs(S, [30, 100]))}
        return out
    raise AssertionError(name)


OPTIONS = ["softcap", "alibi", "alibi-batch", "sinks", "sinks-per-head", "segments",
           "segments-general", "all"]
CONSTRAINTS = {
    "none": {},
    "causal": {"is_causal": True},
    "window": {"window": (9, 3)},
    "causal+window": {"is_causal": True, "window": (40, None)},
    "bool-mask": {"mask": "bool"},
    "float-mask": {"mask": "float"},
    "gqa": {"gqa": True},
    "L!=S causal": {"is_causal": True, "L": 45},
}


def _problem(rng, constraint, B=2, H=4, L=101, S=131, D=19, Dv=13):
    kw = dict(CONSTRAINTS[constraint])
    L = kw.pop("L", L)
    gqa = kw.pop("gqa", False)
    hkv = 2 if gqa else H
    q, k, v = qkv(rng, (B, H, L, D), (B, hkv, S, D), (B, hkv, S, Dv))
    mask = None
    kind = kw.pop("mask", None)
    if kind == "bool":
        mask = rng.random((L, S)) < 0.7
    elif kind == "float":
        mask = randn(rng, B, 1, L, S)
        mask[..., ::5] = -np.inf
    if gqa:
        kw["enable_gqa"] = True
    return q, k, v, mask, kw


def tol(kw, L, S):
    """The test tolerance: SDPA_TOL, widened by the float32 rounding of ALiBi
    biases, which reach slope * (L + S) in magnitude (an absolute error of
    about 2**-24 of that in every score they shift)."""
    slopes = kw.get("alibi_slopes")
    mag = 0.0 if slopes is None else float(np.max(np.abs(slopes))) * (L + S)
    extra = 8 * float(np.finfo(np.float32).eps) * mag
    return {"rtol": SDPA_TOL["rtol"] + extra, "atol": SDPA_TOL["atol"] + extra}


def _check_against_reference(q, k, v, mask, kw):
    o, lse = fastattn.scaled_dot_product_attention(q, k, v, mask, return_lse=True, **kw)
    ro, rlse = ref.scaled_dot_product_attention(q, k, v, mask, return_lse=True, **kw)
    t = tol(kw, q.shape[-2], k.shape[-2])
    assert_close(o, ro, **t)
    assert_close(lse, rlse, **t)
    w = fastattn.attention_weights(q, k, mask, **kw)
    assert_close(w, ref.attention_weights(q, k, mask, **kw), rtol=t["rtol"],
                 atol=t["atol"] / 3)
    # out= gets the same bits
    buf = np.full(o.shape, 7.0, np.float32)
    got = fastattn.scaled_dot_product_attention(q, k, v, mask, out=buf, **kw)
    assert got is buf
    assert_same_bits(buf, o)
    return o, lse


@pytest.mark.parametrize("constraint", list(CONSTRAINTS))
@pytest.mark.parametrize("option", OPTIONS)
def test_option_with_constraint_matches_reference(rng, simd, option, constraint):
    q, k, v, mask, kw = _problem(rng, constraint)
    kw.update(option_values(option, rng, q.shape[:-2], q.shape[-2], k.shape[-2]))
    _check_against_reference(q, k, v, mask, kw)


@pytest.mark.parametrize("option", OPTIONS)
def test_convenience_forms_take_every_option(rng, option):
    q, k, v = qkv(rng, (2, 3, 40, 8), (2, 3, 40, 8), (2, 3, 40, 5))
    kw = option_values(option, rng, q.shape[:-2], 40, 40)
    assert_close(fastattn.causal_attention(q, k, v, **kw), ref.causal_attention(q, k, v, **kw),
                 **tol(kw, 40, 40))
    assert_same_bits(fastattn.causal_attention(q, k, v, **kw),
                     fastattn.scaled_dot_product_attention(q, k, v, is_causal=True, **kw))
    o, lse = fastattn.sliding_window_attention(q, k, v, 6, return_lse=True, **kw)
    ro, rlse = ref.sliding_window_attention(q, k, v, 6, return_lse=True, **kw)
    assert_close(o, ro, **tol(kw, 40, 40))
    assert_close(lse, rlse, **tol(kw, 40, 40))


@pytest.mark.parametrize("option", OPTIONS)
def test_odd_and_empty_sizes(rng, option):
    for L, S in [(1, 1), (3, 200), (97, 65), (200, 3), (0, 5), (5, 0), (0, 0)]:
        q, k, v = qkv(rng, (1, 2, L, 3), (1, 2, S, 3), (1, 2, S, 17))
        kw = option_values(option, rng, q.shape[:-2], L, S)
        for causal in (False, True):
            o, lse = fastattn.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                           return_lse=True, **kw)
            ro, rlse = ref.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                        return_lse=True, **kw)
            assert_close(o, ro, **tol(kw, L, S))
            assert_close(lse, rlse, **tol(kw, L, S))


# ----------------------------------------------------------- huge scores


def test_float32_min_padding_row_gets_equal_weights_and_a_finite_lse(simd):
    # Hugging Face pads with a float mask of finfo(float32).min: a row whose
    # every key carries it has scores that float32 rounds to that very value,
    # so equal weights (the mean of the value rows) and lse = min + log(3).
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((3, 4)).astype(np.float32) for _ in range(3))
    mask = np.zeros((3, 3), np.float32)
    mask[0] = FMIN
    o, lse = fastattn.scaled_dot_product_attention(q, k, v, mask, return_lse=True)
    np.testing.assert_allclose(o[0], v.astype(np.float64).mean(0), rtol=1e-6, atol=1e-6)
    assert np.isfinite(lse[0]) and lse[0] == np.float32(FMIN + np.log(3.0))
    assert lse[0] < -3.4e38
    want = ref.scaled_dot_product_attention(q, k, v, mask, return_lse=True)
    assert_close(o[1:], want[0][1:])
    assert_close(lse[1:], want[1][1:])
    w = fastattn.attention_weights(q, k, mask)
    np.testing.assert_allclose(w[0], [1 / 3] * 3, rtol=1e-6)
    # the same for a huge positive float mask, and under every option
    for fill, kw in [(FMAX, {}), (FMIN, {"softcap": 2.0}), (FMIN, {"alibi_slopes": 0.0}),
                     (FMIN, {"segment_ids": np.zeros(3, np.int64)})]:
        mask[0] = fill
        o, lse = fastattn.scaled_dot_product_attention(q, k, v, mask, return_lse=True, **kw)
        np.testing.assert_allclose(o[0], v.astype(np.float64).mean(0), rtol=1e-6, atol=1e-6)
        assert np.isfinite(lse[0]) and abs(lse[0]) > 3.4e38


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_scores_near_the_float32_limit_stay_finite(simd, sign):
    # q . k of about +-3.2e38: finite scores, whose differences (about 1e37)
    # put all the weight on the largest one.
    q = np.array([[sign * 1.8e19]], np.float32)
    k = np.array([[1.8e19], [1.7e19], [-1.8e19], [0.0]], np.float32)
    v = np.arange(8, dtype=np.float32).reshape(4, 2)
    o, lse = fastattn.scaled_dot_product_attention(q, k, v, scale=1.0, return_lse=True)
    ro, rlse = ref.scaled_dot_product_attention(q, k, v, scale=1.0, return_lse=True)
    best = 0 if sign > 0 else 2
    assert_same_bits(o, v[best:best + 1])
    assert np.isfinite(lse).all() and abs(lse[0]) > 3e38
    assert_close(o, ro)
    np.testing.assert_allclose(lse, rlse, rtol=1e-6)
    w = fastattn.attention_weights(q, k, scale=1.0)
    assert_same_bits(w, np.eye(4, dtype=np.float32)[best:best + 1])


# ------------------------------------------------------------ sinks


def test_per_head_values_of_any_float_dtype_and_without_a_head_axis(rng):
    # bfloat16 slopes and sinks convert like every other float input; with 2-d
    # q (no head axis) a scalar slope or sink serves the one head, in the
    # compiled function and in the reference alike
    ml_dtypes = pytest.importorskip("ml_dtypes")
    q, k, v = qkv(rng, (2, 6, 8), (2, 9, 8), (2, 9, 4))
    slopes, sinks = np.array([0.5, 0.25]), np.array([1.0, -2.0])
    want = fastattn.scaled_dot_product_attention(q, k, v, alibi_slopes=slopes, sinks=sinks)
    got = fastattn.scaled_dot_product_attention(
        q, k, v, alibi_slopes=slopes.astype(ml_dtypes.bfloat16),
        sinks=sinks.astype(ml_dtypes.bfloat16))
    assert_same_bits(got, want)  # (these values are exact in bfloat16)
    for kw in [dict(alibi_slopes=np.float32(0.5)), dict(sinks=-1.0),
               dict(alibi_slopes=0.25, sinks=np.float64(2.0))]:
        o, lse = fastattn.scaled_dot_product_attention(q[0], k[0], v[0], return_lse=True, **kw)
        ro, rlse = ref.scaled_dot_product_attention(q[0], k[0], v[0], return_lse=True, **kw)
        assert o.shape == ro.shape == (6, 4) and lse.shape == rlse.shape == (6,)
        assert_close(o, ro)
        assert_close(lse, rlse)
        assert fastattn.attention_weights(q[0], k[0], **kw).shape == (6, 9)
        assert ref.attention_weights(q[0], k[0], **kw).shape == (6, 9)


def test_sinks_special_values(rng, simd):
    q, k, v = qkv(rng, (4, 10, 8), (4, 30, 8), (4, 30, 6))
    plain, plain_lse = fastattn.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                             return_lse=True)
    sinks = np.array([-np.inf, np.inf, np.nan, 0.5], np.float32)
    o, lse = fastattn.scaled_dot_product_attention(q, k, v, is_causal=True, sinks=sinks,
                                                   return_lse=True)
    assert_same_bits(o[0], plain[0])  # -inf: no sink
    assert_same_bits(lse[0], plain_lse[0])
    assert (o[1] == 0).all() and (lse[1] == np.inf).all()  # +inf: all the weight
    assert np.isnan(o[2]).all() and np.isnan(lse[2]).all()
    assert np.isfinite(o[3]).all() and (lse[3] > plain_lse[3]).all()
    ro, rlse = ref.scaled_dot_product_attention(q, k, v, is_causal=True, sinks=sinks,
                                                return_lse=True)
    assert_close(o, ro)
    assert_close(lse, rlse)
    w = fastattn.attention_weights(q, k, is_causal=True, sinks=sinks)
    assert_close(w, ref.attention_weights(q, k, is_causal=True, sinks=sinks), atol=1e-6)
    assert (w[1] == 0).all() and np.isnan(w[2]).all()
    np.testing.assert_allclose(w[3].sum(-1), 1 - np.exp(0.5 - rlse[3]), rtol=1e-5)


def test_sink_with_no_allowed_key_gives_zero_and_lse_sink(rng, simd):
    q, k, v = qkv(rng, (2, 5, 4), (2, 6, 4), (2, 6, 3))
    mask = np.ones((5, 6), bool)
    mask[2] = False
    sinks = np.array([1.25, -np.inf], np.float32)
    o, lse = fastattn.scaled_dot_product_attention(q, k, v, mask, sinks=sinks, return_lse=True)
    assert (o[:, 2] == 0).all()
    assert lse[0, 2] == np.float32(1.25) and lse[1, 2] == -np.inf
    ro, rlse = ref.scaled_dot_product_attention(q, k, v, mask, sinks=sinks, return_lse=True)
    assert_close(o, ro)
    assert_close(lse, rlse)


def test_sinks_and_nonfinite_scores(rng, simd):
    q, k, v = qkv(rng, (3, 4, 4), (3, 9, 4), (3, 9, 3))
    mask = np.zeros((3, 4, 9), np.float32)
    mask[0, :, 3] = np.inf   # an allowed +inf score: NaN, lse +inf, whatever the sink
    mask[1, :, 3] = np.nan   # NaN
    mask[2, :, :] = -np.inf  # every score -inf: 0 and lse = sink
    for sink in [0.0, np.inf, -np.inf]:
        sinks = np.full(3, sink, np.float32)
        o, lse = fastattn.scaled_dot_product_attention(q, k, v, mask, sinks=sinks,
                                                       return_lse=True)
        ro, rlse = ref.scaled_dot_product_attention(q, k, v, mask, sinks=sinks, return_lse=True)
        assert_close(o, ro)
        assert_close(lse, rlse)
        assert np.isnan(o[:2]).all() and (lse[0] == np.inf).all() and np.isnan(lse[1]).all()
        assert (o[2] == 0).all() and (lse[2] == np.float32(sink)).all()


# --------------------------------------------------------- segment ids


@pytest.mark.parametrize("kind", ["sorted", "general"])
def test_keys_of_other_documents_are_never_read(rng, simd, kind):
    L = S = 150
    q, k, v = qkv(rng, (2, L, 16), (2, S, 16), (2, S, 8))
    ids = _docs(L, [40, 3, 70]) if kind == "sorted" else rng.integers(0, 4, L)
    clean = fastattn.scaled_dot_product_attention(q, k, v, is_causal=True, segment_ids=ids,
                                                  return_lse=True)
    # poison every key of document ids[-1] seen by no query of another document:
    # the rows of the other documents must keep their bits
    poisoned = ids == ids[-1]
    for bad in [np.nan, np.inf, -np.inf, FMAX]:
        kp, vp = k.copy(), v.copy()
        kp[:, poisoned] = bad
        vp[:, poisoned] = bad
        got = fastattn.scaled_dot_product_attention(q, kp, vp, is_causal=True, segment_ids=ids,
                                                    return_lse=True)
        assert_same_bits(got[0][:, ~poisoned], clean[0][:, ~poisoned])
        assert_same_bits(got[1][:, ~poisoned], clean[1][:, ~poisoned])


def test_segment_ids_equal_a_dense_bool_mask(rng, simd):
    L, S = 120, 200
    q, k, v = qkv(rng, (2, 3, L, 16), (2, 3, S, 16), (2, 3, S, 8))
    for q_ids, kv_ids in [(_docs(L, [50, 1, 80]), _docs(S, [90, 2, 150])),
                          (rng.integers(0, 3, (2, 1, L)), rng.integers(0, 3, S))]:
        dense = q_ids[..., :, None] == kv_ids[..., None, :]
        for causal in (False, True):
            o, lse = fastattn.scaled_dot_product_attention(
                q, k, v, is_causal=causal, segment_ids=(q_ids, kv_ids), return_lse=True)
            do, dlse = fastattn.scaled_dot_product_attention(q, k, v, dense, is_causal=causal,
                                                             return_lse=True)
            np.testing.assert_allclose(o, do, rtol=1e-6, atol=1e-7)
            np.testing.assert_array_equal(lse == -np.inf, dlse == -np.inf)
            np.testing.assert_allclose(lse, dlse, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("sizes", [[5, 40, 17, 100, 3, 60], [256], [16], [1, 2, 1], [97, 31]])
def test_query_tiles_cut_at_documents_keep_the_bits(rng, simd, threads, sizes):
    # One array of sorted ids for every batch item: the work units are cut
    # where documents start. The same ids given per item (a copy each) keep
    # the plain query tiles from row 0; every row keeps its bits either way.
    L = S = 300
    q, k, v = qkv(rng, (2, 4, L, 16), (2, 2, S, 16), (2, 2, S, 8))
    ids = _docs(L, sizes)
    per_item = np.stack([ids, ids.copy()])[:, None, :]  # (2, 1, L): no cut
    for kw in [{}, {"is_causal": True}, {"window": (40, 3)}, {"enable_gqa": True}]:
        if kw.get("enable_gqa"):
            qq, kk, vv = q, k, v
        else:
            qq, kk, vv = q, np.repeat(k, 2, axis=1), np.repeat(v, 2, axis=1)
        want = fastattn.scaled_dot_product_attention(qq, kk, vv, segment_ids=per_item,
                                                     return_lse=True, **kw)
        for n in THREAD_COUNTS:
            threads(n)
            got = fastattn.scaled_dot_product_attention(qq, kk, vv, segment_ids=ids,
                                                        return_lse=True, **kw)
            assert_same_bits(got[0], want[0])
            assert_same_bits(got[1], want[1])
        assert_close(got[0], ref.scaled_dot_product_attention(qq, kk, vv, segment_ids=ids, **kw))
        assert_same_bits(fastattn.attention_weights(qq, kk, segment_ids=ids, **kw),
                         fastattn.attention_weights(qq, kk, segment_ids=per_item, **kw))


def test_query_ids_missing_from_the_keys_give_empty_rows(rng, simd):
    q, k, v = qkv(rng, (3, 7, 4), (3, 9, 4), (3, 9, 2))
    q_ids = np.array([0, 0, 5, 1, 1, 9, 2])
    kv_ids = np.array([0, 0, 0, 1, 1, 1, 2, 2, 2])
    for sinks in [None, np.array([0.5, -1.0, 2.0], np.float32)]:
        o, lse = fastattn.scaled_dot_product_attention(q, k, v, segment_ids=(q_ids, kv_ids),
                                                       sinks=sinks, return_lse=True)
        want = -np.inf if sinks is None else sinks[:, None]
        assert (o[:, [2, 5]] == 0).all()
        np.testing.assert_array_equal(lse[:, [2, 5]], np.broadcast_to(want, (3, 2)))
        ro, rlse = ref.scaled_dot_product_attention(q, k, v, segment_ids=(q_ids, kv_ids),
                                                    sinks=sinks, return_lse=True)
        assert_close(o, ro)
        assert_close(lse, rlse)


def test_segment_ids_forms_and_dtypes(rng):
    q, k, v = qkv(rng, (2, 3, 12, 4), (2, 3, 12, 4), (2, 3, 12, 2))
    ids = np.repeat([0, 1, 2], 4)
    want = fastattn.scaled_dot_product_attention(q, k, v, segment_ids=(ids, ids))
    for form in [ids, (ids, ids), ids.astype(np.int8), ids.astype(np.uint64),
                 np.broadcast_to(ids, (2, 3, 12)), ids.reshape(1, 1, 12), ids.tolist(),
                 [[ids.tolist()] * 3] * 2]:
        assert_same_bits(fastattn.scaled_dot_product_attention(q, k, v, segment_ids=form), want)
    # uint64 ids beyond int64 and negative ids are ids like any other
    big = np.array([2**64 - 1] * 6 + [2**63] * 6, np.uint64)
    assert_close(fastattn.scaled_dot_product_attention(q, k, v, segment_ids=big),
                 ref.scaled_dot_product_attention(q, k, v, segment_ids=big))
    neg = np.array([-5] * 5 + [3] * 7)
    assert_close(fastattn.scaled_dot_product_attention(q, k, v, segment_ids=neg),
                 ref.scaled_dot_product_attention(q, k, v, segment_ids=neg))


def test_segment_ids_uint64_past_int64_against_signed_ids(rng):
    """2**63 (uint64) is not -2**63 (int64): ids compare as values, as NumPy's
    == does; the same ids renumbered within int64 give the same bits."""
    q, k, v = qkv(rng, (6, 4), (9, 4), (9, 3))
    q_ids = np.array([2**63] * 2 + [0] * 4, np.uint64)
    kv_ids = np.array([-2**63] * 5 + [0] * 4, np.int64)
    assert not (q_ids[:, None] == kv_ids[None, :])[:2].any()  # (NumPy's comparison)
    o = fastattn.scaled_dot_product_attention(q, k, v, segment_ids=(q_ids, kv_ids))
    assert not o[:2].any()  # rows with no allowed key: zeros
    same = fastattn.scaled_dot_product_attention(
        q, k, v, segment_ids=(np.array([2] * 2 + [1] * 4), np.array([0] * 5 + [1] * 4)))
    assert_same_bits(o, same)
    for a, b in [(q_ids.tolist(), kv_ids), (q_ids, kv_ids.tolist())]:  # lists alike
        assert_same_bits(fastattn.scaled_dot_product_attention(q, k, v, segment_ids=(a, b)),
                         same)
    assert_same_bits(ref.scaled_dot_product_attention(q, k, v, segment_ids=(q_ids, kv_ids))[:2],
                     np.zeros((2, 3), np.float32))


@pytest.mark.parametrize("q_shape,kv_shape", [
    ((9,), (11,)), ((1, 9), (1, 11)), ((3, 9), (11,)), ((2, 1, 9), (2, 3, 11)),
    ((2, 3, 9), (1, 1, 11)), ((1, 3, 9), (2, 1, 11))])
def test_segment_ids_of_every_broadcasting_shape_match_the_reference(rng, q_shape, kv_shape):
    # ids broadcast to (..., L) and (..., S) by NumPy's rules, each side on its own
    q, k, v = qkv(rng, (2, 3, 9, 5), (2, 3, 11, 5), (2, 3, 11, 4))
    q_ids = rng.integers(0, 3, q_shape)
    kv_ids = np.sort(rng.integers(0, 3, kv_shape), axis=-1)  # non-decreasing: bisection
    for ids in [(q_ids, kv_ids), (q_ids, kv_ids[..., ::-1])]:  # and key by key
        for causal in (False, True):
            o, lse = fastattn.scaled_dot_product_attention(
                q, k, v, segment_ids=ids, is_causal=causal, return_lse=True)
            ro, rlse = ref.scaled_dot_product_attention(
                q, k, v, segment_ids=ids, is_causal=causal, return_lse=True)
            assert_close(o, ro)
            assert_close(lse, rlse)
            # the same as the ids broadcast out in full
            full = (np.broadcast_to(ids[0], (2, 3, 9)), np.broadcast_to(ids[1], (2, 3, 11)))
            assert_same_bits(o, fastattn.scaled_dot_product_attention(
                q, k, v, segment_ids=full, is_causal=causal))


def test_per_item_segment_ids_without_a_head_axis_are_refused_with_the_fix(rng):
    # (B, L) ids for q (B, H, L, D) align with (H, L) from the right (NumPy's rule):
    # refused, and the message shows the (B, 1, L) form that means "every head"
    q, k, v = qkv(rng, (2, 3, 8, 4), (2, 3, 8, 4), (2, 3, 8, 4))
    ids = np.repeat([[0, 1], [1, 2]], 4, axis=1)  # (2, 8)
    with pytest.raises(ValueError, match=r"segment_ids of shape \(2, 8\) does not broadcast to "
                       r"\(2, 3, 8\) .*ids\[:, None, :\] of shape \(2, 1, 8\)"):
        fastattn.scaled_dot_product_attention(q, k, v, segment_ids=ids)
    assert_close(fastattn.scaled_dot_product_attention(q, k, v, segment_ids=ids[:, None, :]),
                 ref.scaled_dot_product_attention(q, k, v, segment_ids=ids[:, None, :]))


# ------------------------------------------------- threads and batches


@pytest.mark.parametrize("option", OPTIONS)
def test_option_bitwise_equal_for_any_thread_count(rng, threads, option):
    B, H, L, S, D = 2, 3, 300, 300, 32
    q, k, v = qkv(rng, (B, H, L, D), (B, H, S, D), (B, H, S, D))
    kw = option_values(option, rng, (B, H), L, S)
    results = per_thread_count(threads, lambda: fastattn.scaled_dot_product_attention(
        q, k, v, is_causal=True, return_lse=True, **kw))
    for o, lse in results[1:]:
        assert_same_bits(o, results[0][0])
        assert_same_bits(lse, results[0][1])
    weights = per_thread_count(threads, lambda: fastattn.attention_weights(q, k, **kw))
    for w in weights[1:]:
        assert_same_bits(w, weights[0])


def _take(kw, b, rows):
    """The options of `kw` for batch item b and query rows `rows` alone."""
    out = dict(kw)
    for name in ("alibi_slopes", "sinks"):
        if name in kw:
            out[name] = np.broadcast_to(kw[name], (2, 3))[b:b + 1]
    if "segment_ids" in kw:
        q_ids, kv_ids = kw["segment_ids"]
        q_ids = np.broadcast_to(q_ids, (2, 3, q_ids.shape[-1]))[b:b + 1, :, rows]
        kv_ids = np.broadcast_to(kv_ids, (2, 3, kv_ids.shape[-1]))[b:b + 1]
        out["segment_ids"] = (q_ids, kv_ids)
    return out


@pytest.mark.parametrize("option", OPTIONS)
def test_option_rows_and_batch_items_alone_equal_them_in_the_call(rng, threads, option):
    # the last rows keep their key positions (bottom-right alignment)
    B, H, L, S, D = 2, 3, 150, 170, 24
    q, k, v = qkv(rng, (B, H, L, D), (B, H, S, D), (B, H, S, D))
    kw = option_values(option, rng, (B, H), L, S)
    threads(2)
    full = fastattn.scaled_dot_product_attention(q, k, v, is_causal=True, return_lse=True, **kw)
    for b, rows in [(1, slice(0, L)), (0, slice(L - 1, L)), (1, slice(L - 60, L))]:
        part = fastattn.scaled_dot_product_attention(
            q[b:b + 1, :, rows], k[b:b + 1], v[b:b + 1], is_causal=True, return_lse=True,
            **_take(kw, b, rows))
        assert_same_bits(part[0], full[0][b:b + 1, :, rows])
        assert_same_bits(part[1], full[1][b:b + 1, :, rows])


@pytest.mark.parametrize("option", ["softcap", "alibi", "sinks", "segments", "segments-general",
                                    "all"])
def test_option_in_decoding_split_over_key_chunks_gives_the_same_bits(rng, threads, option):
    # one query row per head, one kv head, S = 3000: the unit is split by key
    # chunks over the threads and folded in order (see test_threads)
    S = 3000
    q, k, v = qkv(rng, (1, 8, 200, 64), (1, 1, S, 64), (1, 1, S, 48))
    kw = option_values(option, rng, (1, 8), 200, S)
    if "segment_ids" in kw:
        q_ids, kv_ids = kw["segment_ids"]
        kw["segment_ids"] = (np.broadcast_to(q_ids, (1, 8, 200)), kv_ids)
        q_ids = np.full((1, 8, 1), kv_ids[-1])  # the last query: the last document
    last = slice(199, 200)
    row_kw = dict(kw)
    if "segment_ids" in kw:
        row_kw["segment_ids"] = (q_ids, kw["segment_ids"][1])
        kw["segment_ids"] = (np.concatenate([kw["segment_ids"][0][..., :199], q_ids], -1),
                             kw["segment_ids"][1])

    def decode():
        return fastattn.scaled_dot_product_attention(q[..., last, :], k, v, return_lse=True,
                                                     enable_gqa=True, **row_kw)

    results = per_thread_count(threads, decode)
    for o, lse in results[1:]:
        assert_same_bits(o, results[0][0])
        assert_same_bits(lse, results[0][1])
    full, full_lse = fastattn.scaled_dot_product_attention(q, k, v, return_lse=True,
                                                           enable_gqa=True, **kw)
    assert_same_bits(results[0][0], full[..., last, :])
    assert_same_bits(results[0][1], full_lse[..., last])
    want, want_lse = ref.scaled_dot_product_attention(q[..., last, :], k, v, return_lse=True,
                                                      enable_gqa=True, **row_kw)
    np.testing.assert_allclose(results[0][0], want, rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(results[0][1], want_lse, rtol=2e-5, atol=2e-6)


# ----------------------------------------------------------- properties


@st.composite
def problems(draw):
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    H = draw(st.integers(1, 3))
    L = draw(st.integers(0, 140))
    S = draw(st.integers(0, 140)) if draw(st.booleans()) else L
    D = draw(st.integers(1, 20))
    q, k, v = qkv(rng, (H, L, D), (H, S, D), (H, S, draw(st.integers(0, 9))))
    kw = {"is_causal": draw(st.booleans())}
    if draw(st.booleans()):
        kw["window"] = (draw(st.integers(0, 50)), draw(st.none() | st.integers(0, 50)))
    if draw(st.booleans()):
        kw["attn_mask"] = rng.random((L, S)) < 0.8
    return rng, q, k, v, kw


def _sdpa(q, k, v, **kw):
    return fastattn.scaled_dot_product_attention(q, k, v, return_lse=True, **kw)


@given(problems(), st.floats(1e15, 1e30))
def test_a_huge_softcap_is_no_softcap(problem, cap):
    _, q, k, v, kw = problem
    o, lse = _sdpa(q, k, v, softcap=cap, **kw)
    po, plse = _sdpa(q, k, v, **kw)
    np.testing.assert_allclose(o, po, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(lse, plse, rtol=1e-5, atol=1e-6)


@given(problems())
def test_zero_alibi_slopes_and_minus_inf_sinks_are_nothing(problem):
    _, q, k, v, kw = problem
    plain = _sdpa(q, k, v, **kw)
    for extra in [{"alibi_slopes": np.zeros(q.shape[0], np.float32)},
                  {"sinks": np.full(q.shape[0], -np.inf)}, {"sinks": -np.inf},
                  {"segment_ids": (np.full(q.shape[-2], 3), np.full(k.shape[-2], 3))}]:
        got = _sdpa(q, k, v, **kw, **extra)
        assert_same_bits(got[0], plain[0])
        assert_same_bits(got[1], plain[1])


@given(problems(), st.sampled_from(["softcap", "alibi", "sinks", "segments",
                                    "segments-general"]))
def test_options_match_the_reference_on_random_problems(problem, option):
    rng, q, k, v, kw = problem
    kw.update(option_values(option, rng, q.shape[:-2], q.shape[-2], k.shape[-2]))
    o, lse = _sdpa(q, k, v, **kw)
    ro, rlse = ref.scaled_dot_product_attention(q, k, v, return_lse=True, **kw)
    np.testing.assert_allclose(o, ro, **tol(kw, q.shape[-2], k.shape[-2]))
    np.testing.assert_allclose(lse, rlse, **tol(kw, q.shape[-2], k.shape[-2]))


# ------------------------------------------------------- PyTorch, optional


def test_alibi_and_document_masks_match_pytorch(rng):
    torch = pytest.importorskip("torch")
    H, L, D = 4, 130, 32
    q, k, v = qkv(rng, (1, H, L, D), (1, H, L, D), (1, H, L, D))
    slopes = (2.0 ** -np.arange(1, H + 1)).astype(np.float32)
    pos = np.arange(L)
    bias = (-slopes[:, None, None] * np.abs(pos[:, None] - pos[None, :])).astype(np.float32)
    causal = np.tril(np.ones((L, L), bool))
    ids = _docs(L, [30, 50, 7])
    docs = (ids[:, None] == ids[None, :]) & causal
    t = [torch.from_numpy(a) for a in (q, k, v)]
    with torch.no_grad():
        t_alibi = torch.nn.functional.scaled_dot_product_attention(
            *t, attn_mask=torch.from_numpy(np.where(causal, bias, -np.inf).astype(np.float32)))
        t_docs = torch.nn.functional.scaled_dot_product_attention(
            *t, attn_mask=torch.from_numpy(docs))
    np.testing.assert_allclose(
        fastattn.causal_attention(q, k, v, alibi_slopes=slopes), t_alibi.numpy(), rtol=1e-4,
        atol=1e-5)
    np.testing.assert_allclose(
        fastattn.causal_attention(q, k, v, segment_ids=ids), t_docs.numpy(), rtol=1e-4,
        atol=1e-5)


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("alibi", [False, True])
def test_softcap_polynomial_pass_has_the_full_forms_bits(simd, alibi, shared):
    # A tile row whose scores all lie within 0.625 c takes tanh's polynomial
    # form alone; one large score anywhere in the row (here at key m, masked
    # out by a float -inf inside the row's key range, which therefore is
    # computed) sends it through the full form. The rows must get the same
    # bits either way: the masked key adds nothing. shared: the mask is one
    # row for every query (the rows-as-lanes kernels' pass after the
    # products), else one row per query (the general path).
    rng = np.random.default_rng(11)
    H, L, S, D = 2, 30, 40, 16
    q, k, v = qkv(rng, (H, L, D), (H, S, D), (H, S, 8))
    m = S // 2
    k_big = k.copy()
    k_big[:, m, :] = 1e3  # |q . k| of about 1e3 at key m: far above 0.625 c
    kw = {"softcap": 20.0}
    if alibi:
        kw["alibi_slopes"] = np.array([0.5, 0.125], np.float32)
    mask = np.zeros((1 if shared else L, S), np.float32)
    mask[:, m] = -np.inf
    o_small, l_small = _sdpa(q, k, v, attn_mask=mask, **kw)
    o_big, l_big = _sdpa(q, k_big, v, attn_mask=mask, **kw)
    assert_same_bits(o_big, o_small)
    assert_same_bits(l_big, l_small)
    ro, rl = ref.scaled_dot_product_attention(q, k, v, mask, return_lse=True, **kw)
    assert_close(o_small, ro, **tol(kw, L, S))
    assert_close(l_small, rl, **tol(kw, L, S))


@pytest.mark.parametrize("cap", [0.3, 50.0])
def test_softcap_both_tanh_forms_match_the_reference(simd, cap):
    # cap 50: every tile row's scores within 0.625 c (the polynomial pass);
    # cap 0.3: nearly every row past it (the full form), with ALiBi and causal.
    rng = np.random.default_rng(12)
    q, k, v = qkv(rng, (2, 3, 150, 24), (2, 3, 170, 24), (2, 3, 170, 16))
    for extra in [{}, {"alibi_slopes": np.array([0.5, 0.1, 0.0], np.float32)}]:
        kw = {"softcap": cap, "is_causal": True, **extra}
        o, lse = _sdpa(q, k, v, **kw)
        ro, rl = ref.scaled_dot_product_attention(q, k, v, return_lse=True, **kw)
        assert_close(o, ro, **tol(kw, 150, 170))
        assert_close(lse, rl, **tol(kw, 150, 170))


# ------------------------------------------------- the diagonal tile


@pytest.mark.parametrize("window", [None, (30, 0), (200, 5)])
@pytest.mark.parametrize("nonfinite", [False, True])
def test_causal_rows_of_the_diagonal_tile_have_the_bits_of_each_row_alone(rng, simd, window,
                                                                          nonfinite):
    # Each block of micro-kernel rows stops at the last key its rows may see in
    # a key tile; a row alone (the few-rows path) reads the whole tile: the
    # same bits, also when a value row the block leaves out holds inf or NaN.
    L, D, Dv = 150, 24, 20
    q, k, v = qkv(rng, (2, L, D), (2, L, D), (2, L, Dv))
    if nonfinite:
        v[:, 71] = np.inf
        v[1, 100, 3] = np.nan
    o, lse = fastattn.scaled_dot_product_attention(q, k, v, is_causal=True, window=window,
                                                   softcap=20.0, return_lse=True)
    for i in range(L):
        oi, li = fastattn.scaled_dot_product_attention(
            q[:, i:i + 1], k[:, :i + 1], v[:, :i + 1], is_causal=True, window=window,
            softcap=20.0, return_lse=True)
        assert_same_bits(oi, o[:, i:i + 1])
        assert_same_bits(li, lse[:, i:i + 1])
    ro = ref.scaled_dot_product_attention(q, k, v, is_causal=True, window=window, softcap=20.0)
    finite = np.isfinite(ro)
    assert_close(o[finite], ro[finite])
    assert_same_bits(np.isnan(o), np.isnan(ro))


