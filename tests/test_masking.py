"""Allowed keys: is_causal, window, bool and float masks, their broadcasting,
bottom-right alignment, fully masked rows, and masked keys never being read.

Key j is allowed for query row i, which sits at key position p_i = i + S - L
(bottom-right alignment), when the bool mask is True there, j <= p_i under
is_causal, and p_i - left <= j <= p_i + right under window=(left, right)
(None: that side unbounded); the constraints intersect. A float mask is
added to the scores, -inf acting as masked (whatever q . k is, even NaN); a
key whose scaled score is itself -inf gets weight 0. Masks broadcast to
(..., L, S) and are read in place. A row with no allowed key, or only -inf
scores, is 0 with lse -inf, never NaN. Keys that are not allowed are never
read: NaN or inf in their k and v rows changes nothing."""

import warnings

import numpy as np
import pytest

import fastattn
from fastattn import reference

from conftest import (IMPL_IDS, IMPLS, allowed_keys, assert_close, assert_same_bits, compare_sdpa,
                      naive_sdpa, qkv, randn, traced_peak)

sdpa = fastattn.scaled_dot_product_attention
weights = fastattn.attention_weights

LS = [(6, 6), (3, 8), (8, 3), (1, 9), (9, 1), (5, 6)]
WINDOWS = [(0, 0), (2, 1), (None, 0), (0, None), (3, None), (None, 2), (None, None), (5, 5), (1, 0)]


def assert_pattern(w, allowed):
    """Weights are > 0 exactly on the allowed keys (unit-scale scores)."""
    np.testing.assert_array_equal(w > 0, np.broadcast_to(allowed, w.shape))


# --------------------------------------------------- causal and alignment

@pytest.mark.parametrize("L,S", LS)
def test_causal_bottom_right_alignment(rng, L, S):
    q, k, v = qkv(rng, (2, L, 5), (2, S, 5), (2, S, 3))
    o, lse = compare_sdpa(q, k, v, is_causal=True)
    allowed = allowed_keys(L, S, is_causal=True)
    assert_pattern(weights(q, k, is_causal=True), allowed)
    # same as the explicit bool mask of p_i = i + S - L
    assert_close(o, sdpa(q, k, v, allowed), rtol=1e-6, atol=1e-6)
    on, ln, _ = naive_sdpa(q[1], k[1], v[1], allowed)
    assert_close(o[1], on)
    assert_close(lse[1], ln)


def test_causal_l_greater_than_s_rows_before_first_key_are_empty(rng):
    L, S = 7, 4  # p_i = i - 3: rows 0..2 see no key
    q, k, v = qkv(rng, (2, L, 3), (2, S, 3), (2, S, 2))
    o, lse = compare_sdpa(q, k, v, is_causal=True)
    assert (o[:, :3] == 0).all() and (lse[:, :3] == -np.inf).all()
    assert np.isfinite(lse[:, 3:]).all()
    w = weights(q, k, is_causal=True)
    assert (w[:, :3] == 0).all()
    np.testing.assert_allclose(w[:, 3:].sum(-1), 1.0, rtol=1e-6)
    # the last query sees every key, the first allowed one sees exactly one
    assert (w[:, -1] > 0).all()
    assert ((w[:, 3] > 0).sum(-1) == 1).all()


def test_causal_square_is_lower_triangular(rng):
    q, k, v = qkv(rng, (6, 4), (6, 4), (6, 2))
    assert_pattern(weights(q, k, is_causal=True), np.tril(np.ones((6, 6), bool)))


# ------------------------------------------------------------------ window

@pytest.mark.parametrize("L,S", LS)
@pytest.mark.parametrize("window", WINDOWS, ids=str)
@pytest.mark.parametrize("is_causal", [False, True])
def test_window(rng, L, S, window, is_causal):
    q, k, v = qkv(rng, (L, 4), (S, 4), (S, 3))
    o, lse = compare_sdpa(q, k, v, window=window, is_causal=is_causal)
    allowed = allowed_keys(L, S, is_causal=is_causal, window=window)
    assert_pattern(weights(q, k, window=window, is_causal=is_causal), allowed)
    assert_close(o, sdpa(q, k, v, allowed), rtol=1e-6, atol=1e-6)
    empty = ~allowed.any(-1)
    assert (o[empty] == 0).all() and (lse[empty] == -np.inf).all()


def test_window_list_and_numpy_ints(rng):
    q, k, v = qkv(rng, (7, 4), (9, 4), (9, 3))
    expected = sdpa(q, k, v, window=(2, 1))
    assert_same_bits(sdpa(q, k, v, window=[2, 1]), expected)
    assert_same_bits(sdpa(q, k, v, window=(np.int64(2), np.int32(1))), expected)


def test_window_unbounded_both_sides_is_no_constraint(rng):
    q, k, v = qkv(rng, (2, 7, 4), (2, 9, 4), (2, 9, 3))
    assert_close(sdpa(q, k, v, window=(None, None)), sdpa(q, k, v), rtol=1e-6, atol=1e-7)


def test_window_none_left_zero_right_is_causal(rng):
    q, k, v = qkv(rng, (2, 5, 4), (2, 9, 4), (2, 9, 3))
    assert_close(sdpa(q, k, v, window=(None, 0)), sdpa(q, k, v, is_causal=True), rtol=1e-6, atol=1e-7)


def test_reference_accepts_windows_wider_than_int64(rng):
    q = rng.standard_normal((5, 4), dtype=np.float32)
    k = rng.standard_normal((7, 4), dtype=np.float32)
    want = reference.scaled_dot_product_attention(q, k, k, window=(None, 0))
    for mod in IMPLS:
        np.testing.assert_allclose(mod.scaled_dot_product_attention(q, k, k, window=(2**80, 0)),
                                   want, rtol=3e-5, atol=3e-6)
        np.testing.assert_allclose(mod.sliding_window_attention(q, k, k, 10**30), want,
                                   rtol=3e-5, atol=3e-6)


# ------------------------------------------------------------- bool masks

def test_bool_mask(rng):
    q, k, v = qkv(rng, (2, 3, 6, 4), (2, 3, 8, 4), (2, 3, 8, 5))
    mask = rng.random((2, 3, 6, 8)) < 0.5
    o, lse = compare_sdpa(q, k, v, mask)
    assert_pattern(weights(q, k, mask), mask)
    on, ln, _ = naive_sdpa(q[1, 2], k[1, 2], v[1, 2], mask[1, 2])
    assert_close(o[1, 2], on)
    assert_close(lse[1, 2], ln)


MASK_SHAPES = [(6, 8), (1, 8), (6, 1), (2, 1, 6, 8), (2, 1, 1, 8), (3, 6, 8), (1, 3, 1, 8), (1, 1, 1, 1)]


@pytest.mark.parametrize("mshape", MASK_SHAPES, ids=str)
@pytest.mark.parametrize("kind", ["bool", "float"])
def test_mask_broadcasting(rng, mshape, kind):
    B, H, L, S = 2, 3, 6, 8
    q, k, v = qkv(rng, (B, H, L, 4), (B, H, S, 4), (B, H, S, 5))
    if kind == "bool":
        mask = rng.random(mshape) < 0.6
    else:
        mask = randn(rng, *mshape)
        mask[rng.random(mshape) < 0.3] = -np.inf
    o, lse = compare_sdpa(q, k, v, mask)
    full = np.ascontiguousarray(np.broadcast_to(mask, (B, H, L, S)))
    om, lm = sdpa(q, k, v, full, return_lse=True)
    assert_same_bits(o, om)
    assert_same_bits(lse, lm)


def test_broadcast_mask_view_is_not_materialised(rng):
    B, H, L, S = 1, 64, 256, 256
    q = rng.standard_normal((B, H, L, 8), dtype=np.float32)
    mask = np.broadcast_to(np.tril(np.ones((L, S), bool)), (B, H, L, S))
    out = np.empty((B, H, L, 8), np.float32)
    peak = traced_peak(lambda: fastattn.scaled_dot_product_attention(q, q, q, mask, out=out))
    assert peak < B * H * L * S // 8, f"{peak} bytes traced: the mask was expanded"


@pytest.mark.parametrize("mod", IMPLS, ids=IMPL_IDS)
@pytest.mark.parametrize("value", [True, False, 0.5, -np.inf])
def test_zero_d_masks_broadcast(mod, value):
    # A 0-d mask broadcasts to every (i, j): False / -inf masks everything (o = 0),
    # True / a constant leaves the weights of no mask.
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((2, 3, 4)).astype(np.float32) for _ in range(3))
    got = mod.scaled_dot_product_attention(q, k, v, np.array(value))
    if value is False or value == -np.inf:
        np.testing.assert_array_equal(got, 0.0)
    else:
        np.testing.assert_allclose(got, reference.scaled_dot_product_attention(q, k, v),
                                   rtol=3e-5, atol=3e-6)


def test_key_padding_mask(rng):
    # (B, 1, 1, S): the usual padding mask, True for real tokens
    B, H, L, S = 3, 2, 5, 7
    q, k, v = qkv(rng, (B, H, L, 4), (B, H, S, 4), (B, H, S, 3))
    lengths = [7, 4, 1]
    mask = (np.arange(S) < np.array(lengths)[:, None])[:, None, None, :]
    o = sdpa(q, k, v, mask)
    for b, n in enumerate(lengths):
        assert_close(o[b], sdpa(q[b], k[b, :, :n], v[b, :, :n]), rtol=1e-6, atol=1e-7)


# ------------------------------------------------------------ float masks

@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_float_mask_added_to_scores(rng, dtype):
    L, S = 5, 7
    q, k, v = qkv(rng, (L, 4), (S, 4), (S, 3))
    fm = randn(rng, L, S).astype(dtype)
    fm[1, [0, 3]] = -np.inf
    o, lse = compare_sdpa(q, k, v, fm)
    on, ln, _ = naive_sdpa(q, k, v, float_mask=fm.astype(np.float64))
    assert_close(o, on)
    assert_close(lse, ln)
    w = weights(q, k, fm)
    assert (w[1, [0, 3]] == 0).all()


def test_float_mask_neginf_equals_bool_false(rng):
    q, k, v = qkv(rng, (2, 6, 4), (2, 9, 4), (2, 9, 3))
    mask = rng.random((6, 9)) < 0.6
    fm = np.where(mask, np.float32(0), np.float32(-np.inf))
    assert_close(sdpa(q, k, v, fm), sdpa(q, k, v, mask), rtol=1e-6, atol=1e-7)


def test_float_mask_with_causal_and_window(rng):
    q, k, v = qkv(rng, (2, 7, 4), (2, 10, 4), (2, 10, 3))
    fm = randn(rng, 7, 10)
    fm[:, 5] = -np.inf
    compare_sdpa(q, k, v, fm, is_causal=True, window=(3, None))


# ------------------------------------------------- all constraints at once

@pytest.mark.parametrize("L,S", [(6, 6), (4, 9), (9, 4)])
@pytest.mark.parametrize("window", [(2, 0), (1, 3), (None, 1), (3, None)], ids=str)
def test_bool_mask_causal_and_window_intersect(rng, L, S, window):
    q, k, v = qkv(rng, (2, L, 5), (2, S, 5), (2, S, 3))
    mask = rng.random((L, S)) < 0.7
    o, lse = compare_sdpa(q, k, v, mask, is_causal=True, window=window)
    allowed = allowed_keys(L, S, is_causal=True, window=window, mask=mask)
    assert_pattern(weights(q, k, mask, is_causal=True, window=window), allowed)
    assert_close(o, sdpa(q, k, v, allowed), rtol=1e-6, atol=1e-7)
    on, ln, _ = naive_sdpa(q[0], k[0], v[0], allowed)
    assert_close(o[0], on)
    assert_close(lse[0], ln)


# ------------------------------------------------------ fully masked rows

def test_fully_masked_rows(rng):
    L, S = 6, 5
    q, k, v = qkv(rng, (L, 4), (S, 4), (S, 3))
    mask = np.ones((L, S), bool)
    mask[1] = False
    fm = np.zeros((L, S), np.float32)
    fm[3] = -np.inf
    for kw in ({"attn_mask": mask}, {"attn_mask": fm}):
        row = 1 if kw["attn_mask"].dtype == bool else 3
        o, lse = compare_sdpa(q, k, v, **kw)
        assert (o[row] == 0).all() and lse[row] == -np.inf
        assert np.isfinite(np.delete(o, row, 0)).all()
        w = weights(q, k, kw["attn_mask"])
        assert (w[row] == 0).all()


def test_fully_masked_row_never_nan_even_with_nan_q(rng):
    # documented: no allowed key -> 0 and -inf, never NaN (keys are never read)
    q, k, v = qkv(rng, (3, 4), (5, 4), (5, 2))
    q[1] = np.nan
    mask = np.ones((3, 5), bool)
    mask[1] = False
    o, lse = sdpa(q, k, v, mask, return_lse=True)
    assert (o[1] == 0).all() and lse[1] == -np.inf
    assert (weights(q, k, mask)[1] == 0).all()


def test_float_mask_neginf_masks_even_nan_scores(rng):
    # a float-mask -inf makes the score -inf whatever q.k is (even NaN)
    q, k, v = qkv(rng, (3, 4), (5, 4), (5, 2))
    q[1] = np.nan
    fm = np.zeros((3, 5), np.float32)
    fm[1] = -np.inf
    o, lse = sdpa(q, k, v, fm, return_lse=True)
    assert (o[1] == 0).all() and lse[1] == -np.inf
    assert np.isfinite(o).all()


def test_neginf_dot_product_key_has_zero_weight(rng):
    # a key whose scaled dot is itself -inf gets weight 0; its v row is unused
    q = np.array([[1.0, 0.0], [2.0, 0.0]], np.float32)
    k = np.array([[-np.inf, 0.0], [0.5, 1.0], [1.0, -1.0]], np.float32)
    v = np.array([[np.nan, np.inf], [1.0, 2.0], [3.0, -4.0]], np.float32)
    o, lse = sdpa(q, k, v, return_lse=True)
    assert np.isfinite(o).all() and np.isfinite(lse).all()
    on, ln, _ = naive_sdpa(q, k[1:], v[1:])
    assert_close(o, on)
    assert_close(lse, ln)


# ------------------------------------------- masked keys are never read

POISON = [np.nan, np.inf, -np.inf, 3e38]


@pytest.mark.parametrize("poison", POISON, ids=str)
@pytest.mark.parametrize("kind", ["bool", "float"])
@pytest.mark.parametrize("shared", [False, True], ids=["rows", "shared"])
def test_keys_masked_for_all_rows_are_not_read(rng, poison, kind, shared):
    # Dead keys at both ends (cut from every row's key range) and inside;
    # shared: one mask row for every query (a key-padding mask), which the
    # rows-as-lanes kernels take.
    B, L, S = 2, 5, 9
    q, k, v = qkv(rng, (B, L, 4), (B, S, 4), (B, S, 3))
    mask = rng.random((1 if shared else L, S)) < 0.7
    dead = [0, 4, 8]
    mask[:, dead] = False
    m = mask if kind == "bool" else np.where(mask, randn(rng, *mask.shape), np.float32(-np.inf))
    clean = sdpa(q, k, v, m, return_lse=True)
    k2, v2 = k.copy(), v.copy()
    k2[:, dead] = poison
    v2[:, dead] = poison
    dirty = sdpa(q, k2, v2, m, return_lse=True)
    assert_same_bits(dirty[0], clean[0])
    assert_same_bits(dirty[1], clean[1])
    assert np.isfinite(clean[0]).all()


@pytest.mark.parametrize("poison", POISON, ids=str)
@pytest.mark.parametrize("L,S", [(8, 8), (5, 9), (9, 5)])
def test_future_keys_not_read_with_causal(rng, poison, L, S):
    q, k, v = qkv(rng, (2, L, 4), (2, S, 4), (2, S, 3))
    clean = sdpa(q, k, v, is_causal=True, return_lse=True)
    for t in range(1, S):
        k2, v2 = k.copy(), v.copy()
        k2[:, t:] = poison
        v2[:, t:] = poison
        dirty = sdpa(q, k2, v2, is_causal=True, return_lse=True)
        rows = [i for i in range(L) if i + S - L < t]  # rows that cannot see keys >= t
        assert_same_bits(dirty[0][:, rows], clean[0][:, rows])
        assert_same_bits(dirty[1][:, rows], clean[1][:, rows])


@pytest.mark.parametrize("poison", POISON, ids=str)
@pytest.mark.parametrize("window", [(2, 0), (1, 1), (3, None)], ids=str)
def test_keys_outside_window_not_read(rng, poison, window):
    L, S = 7, 10
    left, right = window
    q, k, v = qkv(rng, (L, 4), (S, 4), (S, 3))
    clean = sdpa(q, k, v, window=window, return_lse=True)
    for t in range(1, S):
        # poison keys before t: rows with p_i - left >= t do not see them
        k2, v2 = k.copy(), v.copy()
        k2[:t] = poison
        v2[:t] = poison
        dirty = sdpa(q, k2, v2, window=window, return_lse=True)
        rows = [i for i in range(L) if i + S - L - left >= t]
        assert_same_bits(dirty[0][rows], clean[0][rows])
        assert_same_bits(dirty[1][rows], clean[1][rows])
        if right is not None:
            # poison keys from t on: rows with p_i + right < t do not see them
            k2, v2 = k.copy(), v.copy()
            k2[t:] = poison
            v2[t:] = poison
            dirty = sdpa(q, k2, v2, window=window, return_lse=True)
            rows = [i for i in range(L) if i + S - L + right < t]
            assert_same_bits(dirty[0][rows], clean[0][rows])
            assert_same_bits(dirty[1][rows], clean[1][rows])


def test_poisoned_masked_keys_in_attention_weights(rng):
    q, k, _ = qkv(rng, (4, 3), (6, 3), (6, 2))
    mask = np.ones((4, 6), bool)
    mask[:, 2] = False
    clean = weights(q, k, mask, is_causal=True)
    k[2] = np.nan
    assert_same_bits(weights(q, k, mask, is_causal=True), clean)
    assert np.isfinite(clean).all()


@pytest.mark.parametrize("S", [32, 77, 200])
@pytest.mark.parametrize("hole", [False, True])
@pytest.mark.parametrize("kind", ["bool", "-inf", "finfo.min", "additive"])
def test_key_padding_mask_bits_equal_the_same_mask_row_by_row(rng, S, hole, kind):
    # A key-padding mask (B, 1, 1, S) whose allowed keys are a run (right
    # padding, left padding, both) takes the whole-tile kernels on every tile;
    # a bool one with a hole inside the run not on the tile that holds it. A
    # float one (-inf or Hugging Face's finfo(float32).min where the bool is
    # False; "additive": random values as well where it is True) takes them
    # with its values added after the products. Either way the bits are those
    # of the same mask given row by row (B, H, L, S), which takes the general
    # path, and close to the float64 reference.
    B, H, L, D = 4, 3, 40, 32
    q, k, v = qkv(rng, (B, H, L, D), (B, H, S, D), (B, H, S, D))
    keys = np.arange(S)
    starts = np.array([0, 0, S // 5, 3])
    ends = np.array([S, S - S // 3, S, S - 5])
    mask = ((keys >= starts[:, None]) & (keys < ends[:, None]))[:, None, None, :]
    if hole:
        mask[1, 0, 0, S // 4] = False
        mask[3, 0, 0, S // 2] = False
    if kind != "bool":
        off = -np.inf if kind == "-inf" else np.finfo(np.float32).min
        on = rng.standard_normal(mask.shape) if kind == "additive" else 0.0
        mask = np.where(mask, on, off).astype(np.float32)
    rows = np.broadcast_to(mask, (B, H, L, S)).copy()
    o, lse = sdpa(q, k, v, mask, return_lse=True)
    o_rows, lse_rows = sdpa(q, k, v, rows, return_lse=True)
    assert_same_bits(o, o_rows)
    assert_same_bits(lse, lse_rows)
    want = fastattn.reference.scaled_dot_product_attention(
        q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), mask)
    assert_close(o, want)


@pytest.mark.parametrize("L,S", [(257, 257), (65, 1), (17, 130), (40, 77), (97, 49)])
@pytest.mark.parametrize("causal", [False, True])
def test_rows_and_keys_past_whole_blocks_keep_the_general_paths_bits(simd, rng, L, S, causal):
    # A unit's rows past a multiple of 32 (65 of ViT-L/14's 257 in its last
    # unit of 96) and a last key tile of a few keys: the whole-tile kernels
    # compute the rows up to the next register of lanes and the keys up to
    # the rows' last one (plus a key-padding mask's end), no more. The same
    # call with an all-True mask row by row takes the general path, whose
    # bits it must have; and close to the float64 reference.
    B, H, D = 2, 3, 40
    q, k, v = qkv(rng, (B, H, L, D), (B, H, S, D), (B, H, S, D))
    pad = (np.arange(S) < np.array([S, max(1, S - S // 3 - 1)])[:, None])[:, None, None, :]
    for mask in (None, pad):
        rows = np.broadcast_to(True if mask is None else mask, (B, H, L, S)).copy()
        o, lse = sdpa(q, k, v, mask, is_causal=causal, return_lse=True)
        o_rows, lse_rows = sdpa(q, k, v, rows, is_causal=causal, return_lse=True)
        assert_same_bits(o, o_rows)
        assert_same_bits(lse, lse_rows)
        assert_close(o, reference.scaled_dot_product_attention(
            q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), mask,
            is_causal=causal))


FMIN = float(np.finfo(np.float32).min)


@pytest.mark.parametrize("case", [
    "plain", "causal", "gqa-per-head", "softcap", "sinks", "f16-kv", "half-padded",
    "nan-v-tail", "inf-v-tail", "nan-k-tail", "huge-k-tail-scale-0", "nan-q",
    "window-in-tail", "all-padded", "huge-scores", "overflow", "alibi", "alibi-steep",
    "segment-ids", "-65504", "big-additive"])
def test_padding_tail_cut_keeps_the_bits_of_every_key(case):
    # A float key-padding mask (B, 1, 1, S) whose padded keys carry
    # finfo(float32).min (Hugging Face's form) skips its trailing padded keys
    # where their weights are exact zeros for every row: the bits are those
    # of the same mask given row by row (the general path, which computes
    # every key). Each case below either takes the cut or must not (a NaN or
    # an infinity behind the padding reaches the result through a zero
    # weight; a window that sees only padding weighs it equally; scores or
    # ALiBi biases as large as the padding value; segment ids move the rows'
    # keys).
    rng = np.random.default_rng(11)
    B, H, Hkv, L, S, D = 3, 4, 4, 70, 150, 32
    kw = {}
    if case == "gqa-per-head":
        Hkv = 2
        kw["enable_gqa"] = True
    q, k, v = qkv(rng, (B, H, L, D), (B, Hkv, S, D), (B, Hkv, S, D))
    ends = np.array([S, 100, 37])
    keep = np.arange(S) < ends[:, None, None, None]
    shape = (B, H, 1, S) if case == "gqa-per-head" else (B, 1, 1, S)
    if case == "gqa-per-head":
        keep = keep & (np.arange(S) < 150 - 9 * np.arange(H)[:, None, None])
    on = rng.standard_normal(shape) * (1e6 if case == "big-additive" else 1.0)
    mask = np.where(np.broadcast_to(keep, shape), on, FMIN).astype(np.float32)
    if case == "-65504":
        mask[mask == FMIN] = -65504.0
    if case == "half-padded":
        mask[0, ..., 75:] = FMIN
    if case == "all-padded":
        mask[2] = FMIN
    if case == "causal":
        kw["is_causal"] = True
    if case == "softcap":
        kw["softcap"] = 5.0
    if case == "sinks":
        kw["sinks"] = rng.standard_normal(H).astype(np.float32)
    if case == "alibi":
        kw["alibi_slopes"] = (2.0 ** -np.arange(1, H + 1)).astype(np.float32)
    if case == "alibi-steep":  # the bias of a far kept key below a near padded one
        mask[mask == FMIN] = -65504.0
        kw["alibi_slopes"] = np.full(H, 2e3, np.float32)
    if case == "segment-ids":
        kw["segment_ids"] = (np.arange(L) // 40, np.arange(S) // 40)
    if case == "window-in-tail":
        kw["window"] = (5, 0)  # the late rows see only padded keys (L < S: rows at S - L + i)
    if case == "nan-v-tail":
        v[1, :, 120, 3] = np.nan
    if case == "inf-v-tail":
        v[2, :, 140, 0] = np.inf
    if case == "nan-k-tail":
        k[1, :, 149, 7] = np.nan
    if case == "huge-k-tail-scale-0":
        k[2, :, 60, :] = 1e38  # q . k overflows: inf x 0 is NaN
        kw["scale"] = 0.0
    if case == "nan-q":
        q[1, 2, 5, 0] = np.nan
    if case == "huge-scores":  # a padded key's score beats the padding value
        mask[mask == FMIN] = -65504.0
        q = np.abs(q)
        k[:, :, 120, :] = 2e4  # scale q . k about 9e4, for items 1 and 2 behind the padding
    if case == "overflow":
        q *= 1e17
        k *= 1e19  # q . k beyond float32's largest
    if case == "f16-kv":
        k, v = k.astype(np.float16), v.astype(np.float16)
    rows = np.broadcast_to(mask, (B, H, L, S)).copy()
    with np.errstate(all="ignore"):
        o, lse = sdpa(q, k, v, mask, return_lse=True, **kw)
        o_rows, lse_rows = sdpa(q, k, v, rows, return_lse=True, **kw)
    assert_same_bits(o, o_rows)
    assert_same_bits(lse, lse_rows)
    if case == "nan-v-tail":  # 0 x NaN: the rows that see the key are NaN
        assert np.isnan(o[1, :, :, 3]).all() and not np.isnan(o[0]).any()
    if case == "all-padded":  # equal weights: the mean of the value rows
        assert_close(o[2], np.broadcast_to(v[2].astype(np.float64).mean(axis=1, keepdims=True),
                                           o[2].shape))


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("poison", [False, True])
def test_padding_tail_cut_in_units_split_over_threads(threads, poison):
    # One head of 40 queries over 5000 keys: its unit is split into key
    # chunks over the threads, and each chunk checks only its own part of
    # the padded tail (a NaN value behind the padding, in a middle chunk,
    # must still reach every row). The bits are those of the mask given row
    # by row, for every thread count.
    rng = np.random.default_rng(12)
    q, k, v = qkv(rng, (1, 1, 40, 64), (1, 1, 5000, 64), (1, 1, 5000, 64))
    mask = np.zeros((1, 1, 1, 5000), np.float32)
    mask[..., 3500:] = FMIN
    if poison:
        v[0, 0, 3600, 5] = np.nan
    rows = np.broadcast_to(mask, (1, 1, 40, 5000)).copy()
    fastattn.set_num_threads(threads)
    try:
        o, lse = sdpa(q, k, v, mask, return_lse=True)
        o_rows, lse_rows = sdpa(q, k, v, rows, return_lse=True)
    finally:
        fastattn.set_num_threads(None)
    assert_same_bits(o, o_rows)
    assert_same_bits(lse, lse_rows)
    assert np.isnan(o[..., 5]).all() == poison and not np.isnan(o[..., 4]).any()


@pytest.mark.parametrize("kind", ["bool", "float"])
@pytest.mark.parametrize("causal", [False, True])
def test_per_head_padding_mask_under_grouped_heads_bits_equal_row_by_row(kind, causal):
    # Grouped heads put the query heads that share a kv head into one unit:
    # a mask with one row per (batch item, head), broadcast over the queries,
    # differs between the heads of a unit, and the rows-as-lanes kernels must
    # add each head's own values. The bits are those of the same mask given
    # row by row (the general path).
    rng = np.random.default_rng(5)
    B, Hq, Hkv, L, S, D = 2, 6, 2, 20, 150, 32
    q, k, v = qkv(rng, (B, Hq, L, D), (B, Hkv, S, D), (B, Hkv, S, D))
    keep = rng.random((B, Hq, 1, S)) < 0.9
    for n in range(B * Hq):  # key padding of its own length for each head
        keep[n // Hq, n % Hq, 0, S - 7 * (n + 1):] = False
    if kind == "bool":
        mask = keep
    else:
        values = rng.standard_normal((B, Hq, 1, S)).astype(np.float32)
        mask = np.where(keep, values, -np.inf).astype(np.float32)
    rows = np.broadcast_to(mask, (B, Hq, L, S)).copy()
    kw = {"enable_gqa": True, "is_causal": causal, "return_lse": True}
    o, lse = sdpa(q, k, v, mask, **kw)
    o_rows, lse_rows = sdpa(q, k, v, rows, **kw)
    assert_same_bits(o, o_rows)
    assert_same_bits(lse, lse_rows)
    want = fastattn.reference.scaled_dot_product_attention(
        q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), mask,
        is_causal=causal, enable_gqa=True)
    assert_close(o, want)


@pytest.mark.parametrize("S", [300, 1100, 2200])
def test_bool_mask_false_runs_at_both_ends_over_many_tiles(rng, S):
    # Key padding (trailing False) and a left pad (leading False) spanning
    # several 64-key tiles and key chunks: the rows' key ranges are cut to the
    # allowed span, which must give the bits of the whole computation (the
    # poisoned masked keys would show if they were read), every row alone as
    # in the batch, the same for any thread count.
    B, H, L, D = 3, 2, 20, 16
    q, k, v = qkv(rng, (B, H, L, D), (B, H, S, D), (B, H, S, 8))
    starts, ends = np.array([0, 70, 130]), np.array([S, S - 200, S // 2])
    keys = np.arange(S)
    mask = ((keys >= starts[:, None]) & (keys < ends[:, None]))[:, None, None, :]
    row_mask = np.broadcast_to(mask, (B, H, L, S)).copy()
    row_mask[0, 0, 3] = False  # one row with no allowed key
    for m in (mask, row_mask):
        clean = sdpa(q, k, v, m, return_lse=True)
        k2, v2 = k.copy(), v.copy()
        k2[~np.broadcast_to(m, (B, H, L, S)).any(axis=2)] = np.nan
        v2[~np.broadcast_to(m, (B, H, L, S)).any(axis=2)] = np.inf
        dirty = sdpa(q, k2, v2, m, return_lse=True)
        assert_same_bits(dirty[0], clean[0])
        assert_same_bits(dirty[1], clean[1])
        want = fastattn.reference.scaled_dot_product_attention(
            q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), m)
        assert_close(clean[0], want)
        for t in (1, 3):
            fastattn.set_num_threads(t)
            try:
                assert_same_bits(sdpa(q, k, v, m), clean[0])
            finally:
                fastattn.set_num_threads(None)
        alone = sdpa(q[2:, :, 5:6], k[2:], v[2:], m[2:, :, 5:6] if m.shape[2] > 1 else m[2:])
        assert_same_bits(alone, clean[0][2:, :, 5:6])
    assert (clean[0][0, 0, 3] == 0).all()


# --------------------------------------------- float masks beyond float32

@pytest.mark.parametrize("fn", [sdpa, weights])
def test_float64_mask_beyond_float32_masks_without_a_warning(rng, fn):
    # -1e300 (float64) is -inf in float32: the same result as a -inf mask,
    # and no RuntimeWarning from the conversion
    q, k, v = qkv(rng, (2, 4, 8), (2, 6, 8), (2, 6, 8))
    mask = np.zeros((4, 6))
    mask[:, 1::2] = -1e300
    mask[2, :] = -np.finfo(np.float64).max  # a row with no allowed key
    args = (q, k, v) if fn is sdpa else (q, k)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = fn(*args, attn_mask=mask)
    want = fn(*args, attn_mask=np.where(mask < -1e38, -np.inf, 0.0).astype(np.float32))
    assert_same_bits(got, want)


def test_float64_data_beyond_float32_converts_without_a_warning():
    # the one conversion casts as NumPy does (to +-inf) without its warning:
    # a masked key of 1e300 is never read, a -1e300 entry has weight 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert fastattn.logsumexp(np.array([-1e300, 0.0])) == 0.0
        k = np.array([[1.0, 0.0], [1e300, 0.0]])
        o = sdpa(np.ones((1, 2)), k, np.ones((2, 2)), np.array([True, False]))
    np.testing.assert_array_equal(o, np.ones((1, 2), np.float32))
