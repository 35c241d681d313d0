"""Property tests (hypothesis) for the invariants: rows sum to 1, compiled
equals the reference over random shapes and constraint combinations, masked
keys have no effect."""

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import fastattn
from fastattn import reference as ref

from conftest import allowed_keys, assert_close, assert_same_bits

finite32 = st.floats(width=32, allow_nan=False, allow_infinity=False)


@st.composite
def array_and_axis(draw):
    x = draw(hnp.arrays(np.float32, hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=9),
                        elements=finite32))
    axis = draw(st.integers(-x.ndim, x.ndim - 1))
    return x, axis


@given(array_and_axis())
def test_softmax_rows_sum_to_one_and_match_reference(xa):
    x, axis = xa
    sm = fastattn.softmax(x, axis=axis)
    assert np.isfinite(sm).all()
    assert ((sm >= 0) & (sm <= 1)).all()
    np.testing.assert_allclose(sm.sum(axis=axis, dtype=np.float64), 1.0, rtol=1e-5)
    np.testing.assert_allclose(sm, ref.softmax(x, axis=axis), rtol=1e-5, atol=1e-6)


@given(array_and_axis())
def test_log_softmax_and_logsumexp_match_reference(xa):
    x, axis = xa
    ls = fastattn.log_softmax(x, axis=axis)
    assert not np.isnan(ls).any()
    rls = ref.log_softmax(x, axis=axis).astype(np.float64)
    with np.errstate(invalid="ignore"):
        err = np.abs(ls - rls)
    err[ls == rls] = 0  # both -inf (beyond float32's range)
    assert (err <= 1e-5 * (1 + np.abs(rls))).all()
    lse = fastattn.logsumexp(x, axis=axis)
    assert np.isfinite(lse).all()
    rlse = ref.logsumexp(x, axis=axis).astype(np.float64)
    bound = 1e-5 * (1 + np.max(np.abs(x.astype(np.float64)), axis=axis))
    assert (np.abs(lse - rlse) <= bound).all()


@st.composite
def attention_problem(draw):
    seed = draw(st.integers(0, 2**32 - 1))
    L = draw(st.integers(0, 12))
    S = draw(st.integers(0, 12))
    D = draw(st.integers(1, 9))
    Dv = draw(st.integers(0, 6))
    gqa = draw(st.booleans())
    hkv = draw(st.sampled_from([1, 2, 3])) if gqa else 1
    hq = hkv * draw(st.integers(1, 3)) if gqa else draw(st.integers(1, 3))
    bq = draw(st.sampled_from([(), (2,), (1,)]))
    bk = draw(st.sampled_from([(), (2,), (1,)]))
    side = st.one_of(st.none(), st.integers(0, 6))
    window = draw(st.one_of(st.none(), st.tuples(side, side)))
    is_causal = draw(st.booleans())
    mask_kind = draw(st.sampled_from([None, "bool", "float", "bool-LS", "float-LS"]))
    scale = draw(st.one_of(st.none(), st.floats(-2, 2)))
    rng = np.random.default_rng(seed)
    q = rng.standard_normal(bq + (hq, L, D)).astype(np.float32)
    k = rng.standard_normal(bk + (hkv, S, D)).astype(np.float32)
    v = rng.standard_normal(bk + (hkv, S, Dv)).astype(np.float32)
    batch = np.broadcast_shapes(bq, bk) + (hq,)
    mshape = (L, S) if mask_kind and mask_kind.endswith("-LS") else batch + (L, S)
    mask = None
    if mask_kind and mask_kind.startswith("bool"):
        mask = rng.random(mshape) < 0.7
    elif mask_kind:
        mask = rng.standard_normal(mshape).astype(np.float32)
        mask[rng.random(mshape) < 0.2] = -np.inf
    kw = dict(is_causal=is_causal, window=window, scale=scale, enable_gqa=gqa)
    return q, k, v, mask, kw


@given(attention_problem())
def test_sdpa_matches_reference(problem):
    q, k, v, mask, kw = problem
    o, lse = fastattn.scaled_dot_product_attention(q, k, v, mask, return_lse=True, **kw)
    ro, rlse = ref.scaled_dot_product_attention(q, k, v, mask, return_lse=True, **kw)
    assert_close(o, ro)
    assert_close(lse, rlse)
    assert not np.isnan(o).any() and not np.isnan(lse).any()


@given(attention_problem())
def test_attention_weights_rows_sum_to_one_or_zero(problem):
    q, k, v, mask, kw = problem
    w = fastattn.attention_weights(q, k, mask, **kw)
    assert_close(w, ref.attention_weights(q, k, mask, **kw))
    sums = w.sum(-1, dtype=np.float64)
    empty = (w == 0).all(-1)
    np.testing.assert_allclose(sums[~empty], 1.0, rtol=1e-5)


@given(attention_problem(), st.sampled_from([np.nan, np.inf, -np.inf, 1e38]))
def test_masked_keys_have_no_effect(problem, poison):
    q, k, v, mask, kw = problem
    L, S = q.shape[-2], k.shape[-2]
    if mask is not None and mask.dtype == bool:
        m = np.broadcast_to(mask, np.broadcast_shapes(mask.shape, (L, S)))
        bool_mask = m.any(axis=tuple(range(m.ndim - 2)))
    else:
        bool_mask = None
    allowed = allowed_keys(L, S, is_causal=kw["is_causal"], window=kw["window"], mask=bool_mask)
    dead = ~allowed.any(0)  # keys no query may read
    clean = fastattn.scaled_dot_product_attention(q, k, v, mask, return_lse=True, **kw)
    k2, v2 = k.copy(), v.copy()
    k2[..., dead, :] = poison
    v2[..., dead, :] = poison
    dirty = fastattn.scaled_dot_product_attention(q, k2, v2, mask, return_lse=True, **kw)
    assert_same_bits(dirty[0], clean[0])
    assert_same_bits(dirty[1], clean[1])
