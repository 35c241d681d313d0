"""Property tests (hypothesis) for the invariants, over random problems.

- softmax rows sum to 1; softmax, log_softmax and logsumexp match the
  reference on finite inputs, and with non-finite values, 0-sized axes and
  thread counts;
- compiled == reference over random shapes and every combination of masks,
  is_causal, window, scale and GQA, and with NaN and +-inf injected into q, k,
  v and float masks, in allowed and in masked-out positions, and with scales
  0, negative, tiny (subnormal in float32) and huge;
- attention weights rows sum to 1 or are all 0;
- two leading batch dims with every broadcasting pattern, masks broadcast
  along any axis (L and S included), F-ordered and strided inputs;
- masked keys have no effect, for every row and per query row;
- batch invariance: a suffix of query rows (the alignment p_i = i + S - L is
  kept) or one batch item alone gives the same bits as inside the full call;
- thread invariance: 1 to 4 threads give the same bits, on problems big enough
  for the kernels to actually use the threads.

The profile (tests/conftest.py) derandomizes, so CI sees the same examples.
"""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import fastattn
from fastattn import reference as ref

from conftest import allowed_keys, assert_close, assert_same_bits, per_thread_count

sdpa = fastattn.scaled_dot_product_attention
POISON = [np.nan, np.inf, -np.inf]

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


# scale: (value, integer data?). Huge scales use small-integer q and k so that
# q . k is exact in float32 and float64 alike and no score leaves float32's range:
# weights are then exactly one-hot or tied in both implementations.
SCALES = st.sampled_from([(None, False), (0.0, False), (-0.7, False), (1.3, False),
                          (1e-30, False), (1e-40, False), (1e30, True), (-1e30, True),
                          (None, True), (0.0, True)])


def _mask_shape(draw, target):
    """A shape that broadcasts to `target`: leading dims dropped, any axis 1."""
    drop = draw(st.integers(0, len(target) - 2))
    shape = list(target[drop:])
    for ax in range(len(shape)):
        if draw(st.booleans()):
            shape[ax] = 1
    return tuple(shape)


def _layout(draw, a):
    """The same values in C order, F order, or as a strided view."""
    kind = draw(st.sampled_from(["C", "C", "F", "strided"]))
    if kind == "F":
        return np.asfortranarray(a)
    if kind == "strided":
        big = np.empty(a.shape[:-1] + (2 * a.shape[-1],), a.dtype)
        big[..., ::2] = a
        return big[..., ::2]
    return a


@st.composite
def problems(draw, nonfinite=True, max_side=11, batch_dims=2):
    """(q, k, v, mask, kw) for scaled_dot_product_attention."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    L = draw(st.integers(0, max_side))
    S = draw(st.integers(0, max_side))
    D = draw(st.integers(1, 9))
    Dv = draw(st.integers(0, 6))
    gqa = draw(st.booleans())
    hkv = draw(st.sampled_from([1, 2])) if gqa else draw(st.sampled_from([1, 2]))
    hq = hkv * draw(st.integers(1, 3)) if gqa else (hkv if hkv > 1 else draw(st.integers(1, 3)))
    # leading dims before the head axis: every pattern of broadcasting
    lead = draw(st.lists(st.sampled_from([1, 2, 3]), min_size=0, max_size=batch_dims))
    bq = tuple(n if draw(st.booleans()) else 1 for n in lead)
    bk = tuple(n if draw(st.booleans()) else 1 for n in lead)
    bk = bk[draw(st.integers(0, len(bk))):]      # k, v may have fewer leading dims
    scale, integer = draw(SCALES)
    if integer:
        def make(shape):
            return rng.integers(-2, 3, shape).astype(np.float32)
    else:
        def make(shape):
            return rng.standard_normal(shape).astype(np.float32)
    q = make(bq + (hq, L, D))
    k = make(bk + (hkv, S, D))
    v = rng.standard_normal(bk + (hkv, S, Dv)).astype(np.float32)
    batch = np.broadcast_shapes(bq, bk) + (hq,)
    mask_kind = draw(st.sampled_from([None, "bool", "float"]))
    mask = None
    if mask_kind:
        mshape = _mask_shape(draw, batch + (L, S))
        if mask_kind == "bool":
            mask = rng.random(mshape) < 0.7
        else:
            mask = rng.standard_normal(mshape).astype(np.float32)
            mask[rng.random(mshape) < 0.25] = -np.inf
    if nonfinite:
        # Not into v under the huge scales: an inf value row whose weight
        # underflows to 0 in float32 (but not in the float64 reference) gives
        # 0 * inf = NaN in the kernel and inf in the reference. The NaN case has
        # its own test (test_attention.py: test_nan_value_row_with_underflowing_weight).
        for arr in (q, k) + (() if integer else (v,)) + ((mask,) if mask_kind == "float" else ()):
            n = draw(st.integers(0, 2))
            if n and arr.size:
                flat = arr.reshape(-1)
                flat[rng.integers(0, arr.size, n)] = draw(st.sampled_from(POISON))
    side = st.one_of(st.none(), st.integers(0, 6), st.just(2**62))
    window = draw(st.one_of(st.none(), st.tuples(side, side)))
    kw = dict(is_causal=draw(st.booleans()), window=window, scale=scale, enable_gqa=gqa)
    q, k, v = (_layout(draw, a) for a in (q, k, v))
    return q, k, v, mask, kw


@given(problems())
def test_sdpa_with_nonfinite_values_and_odd_scales_matches_reference(p):
    q, k, v, mask, kw = p
    o, lse = sdpa(q, k, v, mask, return_lse=True, **kw)
    ro, rlse = ref.scaled_dot_product_attention(q, k, v, mask, return_lse=True, **kw)
    assert_close(o, ro)
    assert_close(lse, rlse)


@given(problems())
def test_attention_weights_with_nonfinite_values_match_reference(p):
    q, k, _, mask, kw = p
    w = fastattn.attention_weights(q, k, mask, **kw)
    assert_close(w, ref.attention_weights(q, k, mask, **kw))
    with np.errstate(invalid="ignore"):
        sums = w.sum(-1, dtype=np.float64)
    nan_rows = np.isnan(w).any(-1)
    zero_rows = (w == 0).all(-1)
    if w.shape[-1]:
        assert (np.isnan(w).all(-1) == nan_rows).all()      # a NaN row is NaN throughout
    np.testing.assert_allclose(sums[~nan_rows & ~zero_rows], 1.0, rtol=1e-5)


def _dead_keys(L, S, mask, kw, rows):
    """(S,) bool: keys that no query row in `rows` may read in any batch item
    (not allowed by is_causal/window/bool mask, or a -inf float-mask entry)."""
    allowed = allowed_keys(L, S, is_causal=kw["is_causal"], window=kw["window"])
    if mask is not None:
        m = np.broadcast_to(mask, np.broadcast_shapes(mask.shape, (L, S)))
        live = m if mask.dtype == bool else (m != -np.inf)
        allowed = allowed & live.any(axis=tuple(range(m.ndim - 2)))
    return ~allowed[rows].any(0)


@given(problems(nonfinite=False), st.sampled_from(POISON + [1e38]), st.data())
def test_suffix_of_query_rows_is_batch_invariant_and_blind_to_its_masked_keys(p, poison, data):
    """Rows i0: alone (same alignment) == the same rows in the full call,
    bitwise, even with NaN/inf written into every key those rows may not read."""
    q, k, v, mask, kw = p
    L, S = q.shape[-2], k.shape[-2]
    full, full_lse = sdpa(q, k, v, mask, return_lse=True, **kw)
    i0 = data.draw(st.integers(0, L), label="i0")
    sub_mask = mask if mask is None or mask.shape[-2] == 1 else mask[..., i0:, :]
    dead = _dead_keys(L, S, mask, kw, slice(i0, L))
    k2, v2 = np.array(k), np.array(v)
    k2[..., dead, :] = poison
    v2[..., dead, :] = poison
    o, lse = sdpa(q[..., i0:, :], k2, v2, sub_mask, return_lse=True, **kw)
    assert_same_bits(o, full[..., i0:, :])
    assert_same_bits(lse, full_lse[..., i0:])


@given(problems(nonfinite=True, batch_dims=1), st.data())
def test_one_batch_item_alone_is_bitwise_equal_to_it_in_the_batch(p, data):
    q, k, v, mask, kw = p
    full = sdpa(q, k, v, mask, **kw)
    if full.ndim < 4 or full.shape[0] == 0:
        return
    b = data.draw(st.integers(0, full.shape[0] - 1), label="b")

    def item(a):  # a's slice for batch item b (a may broadcast along axis 0)
        if a is None or a.ndim < full.ndim:
            return a
        return a[b if a.shape[0] > 1 else 0]
    alone = sdpa(item(q), item(k), item(v), item(mask), **kw)
    assert_same_bits(alone, full[b])


@st.composite
def threaded_problems(draw):
    """Problems large enough (>= ~2M multiply-adds) for the kernels to use
    several threads, with odd sizes that miss every tile."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    B = draw(st.integers(1, 3))
    H = draw(st.sampled_from([1, 2, 4]))
    L = draw(st.integers(1, 260))
    S = draw(st.integers(1, 260))
    D = draw(st.sampled_from([1, 7, 16, 33, 64]))
    Dv = draw(st.sampled_from([1, 8, 31, 64]))
    hkv = draw(st.sampled_from([h for h in (1, 2, 4) if H % h == 0]))
    q = rng.standard_normal((B, H, L, D)).astype(np.float32)
    k = rng.standard_normal((B, hkv, S, D)).astype(np.float32)
    v = rng.standard_normal((B, hkv, S, Dv)).astype(np.float32)
    mask = draw(st.sampled_from([None, "bool", "float"]))
    if mask == "bool":
        mask = rng.random((B, 1, L, S)) < 0.8
    elif mask == "float":
        mask = rng.standard_normal((L, S)).astype(np.float32)
        mask[rng.random((L, S)) < 0.1] = -np.inf
    side = st.one_of(st.none(), st.integers(0, 80))
    kw = dict(is_causal=draw(st.booleans()), window=draw(st.one_of(st.none(), st.tuples(side, side))),
              enable_gqa=hkv != H or draw(st.booleans()))
    return q, k, v, mask, kw


@settings(max_examples=12, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(threaded_problems())
def test_sdpa_bitwise_equal_for_1_to_4_threads(threads, p):
    q, k, v, mask, kw = p
    results = per_thread_count(threads, lambda: sdpa(q, k, v, mask, return_lse=True, **kw),
                               (1, 2, 3, 4))
    for o, lse in results[1:]:
        assert_same_bits(o, results[0][0])
        assert_same_bits(lse, results[0][1])


@settings(max_examples=8, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(threaded_problems())
def test_attention_weights_bitwise_equal_for_1_to_4_threads(threads, p):
    q, k, _, mask, kw = p
    results = per_thread_count(threads, lambda: fastattn.attention_weights(q, k, mask, **kw),
                               (1, 2, 3, 4))
    for w in results[1:]:
        assert_same_bits(w, results[0])


# ---------------------------------------------------------------- rowwise

@st.composite
def rowwise_inputs(draw):
    """An array with 0/1/odd sized dims (up to 3-d), non-finite values sprinkled
    in, an axis, and a size class: small, or large enough for threads."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    big = draw(st.booleans())
    if big:
        shape = (draw(st.integers(1, 700)), draw(st.integers(1, 3000)))
    else:
        shape = tuple(draw(st.lists(st.integers(0, 9), min_size=1, max_size=3)))
    magnitude = draw(st.sampled_from([1.0, 1e4, 1e30, 3e38]))
    with np.errstate(over="ignore"):  # (3e38 times a normal sample may round to inf)
        x = (rng.standard_normal(shape) * magnitude).astype(np.float32)
    n = draw(st.integers(0, 3))
    if n and x.size:
        x.reshape(-1)[rng.integers(0, x.size, n)] = draw(st.sampled_from(POISON))
    if draw(st.booleans()) and x.ndim >= 1 and x.shape[-1] > 0:
        x[..., 0] = -np.inf  # a whole column: all -inf rows when the last axis is 1 long
    axis = draw(st.integers(-x.ndim, x.ndim - 1))
    return x, axis


@given(rowwise_inputs())
def test_rowwise_with_nonfinite_values_match_reference(xa):
    x, axis = xa
    for name in ("softmax", "log_softmax", "logsumexp"):
        got = getattr(fastattn, name)(x, axis=axis)
        want = getattr(ref, name)(x, axis=axis)
        assert got.shape == want.shape and got.dtype == np.float32
        # The same non-finite pattern, and close values elsewhere.
        assert (np.isnan(got) == np.isnan(want)).all(), name
        assert ((got == np.inf) == (want == np.inf)).all(), name
        finite = np.isfinite(want) & np.isfinite(got)
        if name == "logsumexp":  # relative to the slice's max magnitude, as the kernel is
            bound = 1e-5 * (1 + np.max(np.abs(np.where(np.isfinite(x), x, 0)), axis=axis,
                                       initial=0).astype(np.float64))
            with np.errstate(invalid="ignore"):  # (inf - inf off the finite entries)
                err = np.abs(got.astype(np.float64) - want)
            assert (err[finite] <= bound[finite]).all(), name
        elif name == "softmax":
            np.testing.assert_allclose(got[finite], want[finite], rtol=1e-5, atol=1e-6)
            rows = np.isfinite(got).all(axis=axis) & (x.shape[axis] > 0)
            np.testing.assert_allclose(got.sum(axis=axis, dtype=np.float64)[rows], 1.0, rtol=1e-5)
        else:
            w = want[finite].astype(np.float64)
            assert (np.abs(got[finite] - w) <= 1e-5 * (1 + np.abs(w))).all(), name
            # -inf where the reference's float64 value is below float32's range
            assert ((got == -np.inf) <= (want == -np.inf) | ~np.isfinite(want)).all()


@settings(max_examples=10, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rowwise_inputs(), st.sampled_from(["softmax", "log_softmax", "logsumexp"]))
def test_rowwise_bitwise_equal_for_1_to_4_threads_and_row_by_row(threads, xa, name):
    x, axis = xa
    fn = getattr(fastattn, name)
    results = per_thread_count(threads, lambda: fn(x, axis=axis), (1, 2, 3, 4))
    for r in results[1:]:
        assert_same_bits(r, results[0])
    if x.ndim >= 2 and x.shape[0] > 1 and axis % x.ndim != 0:
        i = x.shape[0] // 2
        assert_same_bits(fn(x[i:i + 1], axis=axis), results[0][i:i + 1])


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_softmax_of_a_length_one_axis_is_exactly_one_or_zero(name):
    # documented: a length-1 axis gives exactly 1.0 (log 0.0) for finite entries,
    # at any magnitude, and follows the IEEE rules for the others.
    x = np.array([[0.0], [-3e38], [3e38], [1e-45], [np.inf], [-np.inf], [np.nan]], np.float32)
    got = getattr(fastattn, name)(x, axis=-1)
    one = 1.0 if name == "softmax" else 0.0
    np.testing.assert_array_equal(got[:4], one)
    assert np.isnan(got[4:]).all()
