"""merge_attention: the exact merge of attention results over disjoint key sets.

The identity held here: attention over a partition of the keys (return_lse=True),
merged, equals attention over all keys to float32 rounding; plus the row rules
for non-finite lse, determinism, in-place reading and out=.
"""
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import fastattn
from fastattn import reference

from conftest import randn

TOL = dict(rtol=2e-5, atol=2e-6)


def _split_sdpa(q, k, v, cuts, mask=None, **kw):
    """Attention over the key ranges between `cuts`, each with return_lse.

    The causal/window bounds depend on a key's global position, so each part
    gets them as a bool mask of its columns of the full (L, S) grid; a given
    attn_mask is sliced the same way."""
    L, S = q.shape[-2], k.shape[-2]
    p = np.arange(L)[:, None] + S - L
    j = np.arange(S)[None, :]
    allowed = np.ones((L, S), bool)
    if kw.pop("is_causal", False):
        allowed &= j <= p
    left, right = kw.pop("window", None) or (None, None)
    if left is not None:
        allowed &= j >= p - left
    if right is not None:
        allowed &= j <= p + right
    outs, lses = [], []
    for a, b in zip(cuts[:-1], cuts[1:]):
        m = allowed[:, a:b]
        if mask is not None and mask.dtype == np.bool_:
            m = m & mask[..., a:b]
        elif mask is not None:
            m = np.where(m, mask[..., a:b], -np.inf).astype(np.float32)
        o, lse = fastattn.scaled_dot_product_attention(
            q, k[..., a:b, :], v[..., a:b, :], m, return_lse=True,
            **kw)
        outs.append(o)
        lses.append(lse)
    return outs, lses


@pytest.mark.parametrize("cuts_of", [
    lambda S: [0, S],
    lambda S: [0, S // 2, S],
    lambda S: [0, 1, 2, S - 1, S],
    lambda S: [0, 5, 5, 17, S],  # an empty part
    lambda S: list(range(S + 1)),  # one key per part
])
@pytest.mark.parametrize("case", ["plain", "causal", "window", "gqa", "bool_mask", "float_mask",
                                  "decode"])
def test_merged_partition_equals_whole(rng, cuts_of, case):
    B, Hq, L, S, D, Dv = 2, 4, 9, 40, 16, 12
    kw, mask = {}, None
    Hkv = Hq
    if case == "decode":
        L = 1
    if case == "gqa":
        Hkv, kw["enable_gqa"] = 2, True
        kw["is_causal"] = True
    q = randn(rng, B, Hq, L, D)
    k, v = randn(rng, B, Hkv, S, D), randn(rng, B, Hkv, S, Dv)
    if case == "causal":
        kw["is_causal"] = True
    if case == "window":
        kw["window"] = (7, 3)
    if case == "bool_mask":  # broadcast over batch and heads
        mask = rng.random((L, S)) < 0.6
    if case == "float_mask":
        mask = randn(rng, B, 1, L, S)
        mask[..., 3] = -np.inf
    whole, whole_lse = fastattn.scaled_dot_product_attention(q, k, v, mask, return_lse=True,
                                                             **kw)
    cuts = cuts_of(S)
    outs, lses = _split_sdpa(q, k, v, cuts, mask, **kw)
    o, lse = fastattn.merge_attention(outs, lses)
    np.testing.assert_allclose(o, whole, **TOL)
    np.testing.assert_allclose(lse, whole_lse, **TOL)
    # the reference merge agrees, and the one-array form gives the same bits
    ro, rlse = reference.merge_attention(outs, lses)
    np.testing.assert_allclose(ro, o, **TOL)
    np.testing.assert_allclose(rlse, lse, **TOL)
    so, slse = fastattn.merge_attention(np.stack(outs), np.stack(lses))
    assert so.tobytes() == o.tobytes() and slse.tobytes() == lse.tobytes()


def test_merge_of_merges_is_the_merge(rng):
    """A tree of merges agrees with one merge (float32 rounding)."""
    outs = [randn(rng, 3, 5, 7) for _ in range(6)]
    lses = [randn(rng, 3, 5, scale=3) for _ in range(6)]
    o, lse = fastattn.merge_attention(outs, lses)
    left = fastattn.merge_attention(outs[:2], lses[:2])
    right = fastattn.merge_attention(outs[2:], lses[2:])
    o2, lse2 = fastattn.merge_attention([left[0], right[0]], [left[1], right[1]])
    np.testing.assert_allclose(o2, o, **TOL)
    np.testing.assert_allclose(lse2, lse, **TOL)


def test_single_partial_is_returned_exactly(rng):
    o = randn(rng, 4, 3)
    lse = randn(rng, 4)
    m, ml = fastattn.merge_attention([o], [lse])
    assert m.tobytes() == o.tobytes() and ml.tobytes() == lse.tobytes()


def test_nonfinite_rows():
    nan, inf = np.nan, np.inf
    good = np.array([[1.0, 2.0]], np.float32)
    garbage = np.array([[nan, inf]], np.float32)
    cases = [  # (lse per partial, expected lse, expected o row or "nan")
        ([-inf, 0.0], 0.0, [1.0, 2.0]),   # the -inf partial (garbage) is never read
        ([-inf, -inf], -inf, [0.0, 0.0]),  # all -inf: 0 and -inf
        ([nan, 0.0], nan, "nan"),
        ([inf, 0.0], inf, "nan"),
        ([inf, nan], nan, "nan"),          # NaN wins over +inf
        ([-inf, inf], inf, "nan"),
    ]
    for lse_p, want_lse, want_o in cases:
        for impl in (fastattn, reference):
            o, lse = impl.merge_attention([garbage, good], [[lse_p[0]], [lse_p[1]]])
            np.testing.assert_array_equal(lse, np.array([want_lse], np.float32), err_msg=str(lse_p))
            if want_o == "nan":
                assert np.isnan(o).all(), (impl.__name__, lse_p, o)
            else:
                np.testing.assert_array_equal(o, np.array([want_o], np.float32))


def test_nan_in_a_read_partial_propagates():
    o, lse = fastattn.merge_attention([[[np.nan, 1.0]], [[1.0, 1.0]]], [[0.0], [0.0]])
    assert np.isnan(o[0, 0]) and o[0, 1] == 1.0 and lse[0] == np.float32(math.log(2))


def test_zero_partials_in_one_array():
    o, lse = fastattn.merge_attention(np.zeros((0, 3, 2), np.float32), np.zeros((0, 3), np.float32))
    assert o.shape == (3, 2) and (o == 0).all() and (lse == -np.inf).all()
    ro, rlse = reference.merge_attention(np.zeros((0, 3, 2)), np.zeros((0, 3)))
    assert (ro == 0).all() and (rlse == -np.inf).all()


def test_empty_rows_and_columns(rng):
    o, lse = fastattn.merge_attention([np.zeros((2, 0, 4))] * 3, [np.zeros((2, 0))] * 3)
    assert o.shape == (2, 0, 4) and lse.shape == (2, 0)
    o, lse = fastattn.merge_attention([np.zeros((3, 0))] * 2, [np.zeros(3), np.ones(3)])
    assert o.shape == (3, 0)
    np.testing.assert_allclose(lse, np.logaddexp(0, 1), rtol=1e-6)


def test_wide_rows_and_many_partials(rng):
    """Dv beyond one column block of the kernel; more partials than rows."""
    outs = randn(rng, 37, 3, 700)
    lses = randn(rng, 37, 3, scale=20)
    o, lse = fastattn.merge_attention(outs, lses)
    ro, rlse = reference.merge_attention(outs, lses)
    np.testing.assert_allclose(o, ro, **TOL)
    np.testing.assert_allclose(lse, rlse, **TOL)


def test_extreme_lse_magnitudes(rng):
    """lse far apart (exp underflows) and near float32's limits stay exact."""
    o = randn(rng, 2, 3, 5)
    lses = np.array([[1e30, 3e38, -3e38], [-1e30, 3e38, -3e38]], np.float32)
    m, ml = fastattn.merge_attention(o, lses)
    np.testing.assert_array_equal(m[0], o[0, 0])  # 1e30 outweighs -1e30 absolutely
    np.testing.assert_allclose(m[1], (o[0, 1] + o[1, 1]) / 2, **TOL)
    np.testing.assert_allclose(m[2], (o[0, 2] + o[1, 2]) / 2, **TOL)
    np.testing.assert_array_equal(ml[0], np.float32(1e30))
    np.testing.assert_allclose(ml[1:], [3e38, -3e38], rtol=1e-7)
    assert np.isfinite(ml).all()


def test_inputs_read_in_place_and_out(rng):
    outs = randn(rng, 4, 2, 6, 8)
    lses = randn(rng, 4, 2, 6)
    outs.flags.writeable = False  # read-only inputs work
    o, lse = fastattn.merge_attention(outs, lses)
    buf = np.empty((2, 6, 8), np.float32)
    o2, lse2 = fastattn.merge_attention(list(outs), list(lses), out=buf)
    assert o2 is buf and buf.tobytes() == o.tobytes() and lse2.tobytes() == lse.tobytes()
    # other dtypes and layouts are converted (once), with the same result
    o3, _ = fastattn.merge_attention([p.astype(np.float64) for p in outs],
                                     np.asfortranarray(lses))
    assert o3.tobytes() == o.tobytes()


def test_out_rules(rng):
    outs = randn(rng, 2, 3, 4)
    lses = randn(rng, 2, 3)
    with pytest.raises(TypeError, match="float32"):
        fastattn.merge_attention(outs, lses, out=np.empty((3, 4)))
    with pytest.raises(ValueError, match="shape"):
        fastattn.merge_attention(outs, lses, out=np.empty((3, 5), np.float32))
    with pytest.raises(ValueError, match="C-contiguous"):
        fastattn.merge_attention(outs, lses, out=np.empty((4, 3), np.float32).T)
    with pytest.raises(ValueError, match=r"share memory with outs\[1\]"):
        fastattn.merge_attention(outs, lses, out=outs[1])
    ro = np.empty((3, 4), np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="writeable"):
        fastattn.merge_attention(outs, lses, out=ro)


@pytest.mark.parametrize("impl", [fastattn, reference])
def test_bad_input(impl):
    o = np.zeros((2, 3, 4), np.float32)
    lse = np.zeros((2, 3), np.float32)
    with pytest.raises(ValueError, match="as many partials"):
        impl.merge_attention(o, lse[:1])
    with pytest.raises(ValueError, match="at least one partial"):
        impl.merge_attention([], [])
    with pytest.raises(ValueError, match=r"outs\[1\] has shape \(3, 5\)"):
        impl.merge_attention([o[0], np.zeros((3, 5))], lse)
    with pytest.raises(ValueError, match=r"lses\[0\] has shape \(4,\)"):
        impl.merge_attention(o, [np.zeros(4), np.zeros(4)])
    with pytest.raises(ValueError, match=r"lses has partials of shape \(4,\)"):
        impl.merge_attention(np.zeros((0, 3, 4)), np.zeros((0, 4)))
    with pytest.raises(ValueError, match=r"\(\.\.\., L, Dv\)"):
        impl.merge_attention(np.zeros((2, 3)), np.zeros((2,)))
    with pytest.raises(ValueError, match="0-d"):
        impl.merge_attention(np.float32(1.0), lse)
    with pytest.raises(TypeError, match=r"outs\[0\] must have a real floating dtype"):
        impl.merge_attention([np.zeros((3, 4), np.int32)] * 2, lse)
    with pytest.raises(TypeError, match="lses must have a real floating dtype"):
        impl.merge_attention(o, lse.astype(complex))
    # neither a sequence nor an array: named as such (not "got dtype object")
    with pytest.raises(TypeError, match="outs must be a list or tuple of arrays.*got generator"):
        impl.merge_attention((x for x in o), lse)
    with pytest.raises(TypeError, match="lses must be a list or tuple of arrays.*got NoneType"):
        impl.merge_attention(o, None)


def test_bits_independent_of_threads(rng, threads):
    outs = randn(rng, 8, 64, 128, 32)
    lses = randn(rng, 8, 64, 128, scale=5)
    lses[2, :, ::3] = -np.inf
    outs[2, :, ::3] = np.nan  # never read
    results = []
    for n in (1, 2, 3):
        threads(n)
        o, lse = fastattn.merge_attention(outs, lses)
        results.append((o.tobytes(), lse.tobytes()))
    assert results[0] == results[1] == results[2]
    assert not np.isnan(o).any()


@given(P=st.integers(1, 5), rows=st.integers(1, 6), Dv=st.integers(0, 9),
       seed=st.integers(0, 2**32 - 1), minus_inf=st.floats(0, 1))
def test_fuzz_against_reference(P, rows, Dv, seed, minus_inf):
    rng = np.random.default_rng(seed)
    outs = randn(rng, P, rows, Dv)
    lses = randn(rng, P, rows, scale=10)
    lses[rng.random((P, rows)) < minus_inf] = -np.inf
    o, lse = fastattn.merge_attention(outs, lses)
    ro, rlse = reference.merge_attention(outs, lses)
    np.testing.assert_allclose(o, ro, **TOL)
    np.testing.assert_allclose(lse, rlse, **TOL)
    assert not np.isnan(o).any() and not np.isnan(lse).any()


def test_many_partials_same_bits_as_few(rng):
    """Beyond 64 partials the kernel sums column blocks instead of registers:
    the same sums in the same order, so -inf partials added change no bit."""
    outs, lses = randn(rng, 3, 5, 40), randn(rng, 3, 5, scale=4)
    few = fastattn.merge_attention(outs, lses)
    pad_o = np.concatenate([outs, np.full((67, 5, 40), np.nan, np.float32)])
    pad_l = np.concatenate([lses, np.full((67, 5), -np.inf, np.float32)])
    many = fastattn.merge_attention(pad_o, pad_l)
    assert many[0].tobytes() == few[0].tobytes() and many[1].tobytes() == few[1].tobytes()
    outs, lses = randn(rng, 100, 4, 300), randn(rng, 100, 4, scale=4)
    o, lse = fastattn.merge_attention(outs, lses)
    ro, rlse = reference.merge_attention(outs, lses)
    np.testing.assert_allclose(o, ro, **TOL)
    np.testing.assert_allclose(lse, rlse, **TOL)


@pytest.mark.parametrize("kw", [dict(sinks="sinks"), dict(softcap=1.5),
                                dict(sinks="sinks", softcap=2.0, is_causal=True)],
                         ids=["sinks", "softcap", "sinks_softcap_causal"])
def test_merged_partition_with_score_options(rng, kw):
    """Sinks count once: given to one part only (here the first), the merge
    equals attention over all keys with the sinks; softcap is per score."""
    B, H, L, S, D = 2, 3, 7, 30, 8
    q, k, v = randn(rng, B, H, L, D), randn(rng, B, H, S, D), randn(rng, B, H, S, 4)
    kw = {name: randn(rng, B, H) if val == "sinks" else val for name, val in kw.items()}
    whole, whole_lse = fastattn.scaled_dot_product_attention(q, k, v, return_lse=True, **kw)
    sinks = kw.pop("sinks", None)
    outs, lses = _split_sdpa(q, k, v, [0, 11, 12, S], **kw)
    if sinks is not None:  # the first part again, now with the sinks
        o0, l0 = _split_sdpa(q, k, v, [0, 11], **kw, sinks=sinks)
        outs[0], lses[0] = o0[0], l0[0]
    o, lse = fastattn.merge_attention(outs, lses)
    np.testing.assert_allclose(o, whole, **TOL)
    np.testing.assert_allclose(lse, whole_lse, **TOL)
