"""The attention backward: attention_backward and varlen_attention_backward.

The gradients against central finite differences of a float64 forward (the
reference's own pieces, _scores and _softmax_rows, on float64 copies of the
inputs) and against PyTorch's autograd where torch expresses the same math;
the varlen form against the dense one on each sequence; the rules (keys a
row may not see, rows without keys, NaN, sums back to broadcast shapes and
over GQA groups); the reduction helper; and the argument checks.

The implementations under test are IMPLS: the float64 reference, and the
compiled fastattn functions once fastattn has them; the same tests hold
both, the compiled ones at float32's tolerance.
"""

import numpy as np
import pytest

import fastattn
from fastattn import reference as ref
from fastattn._grad import sum_to_shape
from fastattn._validate import (BackwardInputs, VarlenBackwardInputs, attention_inputs,
                                backward_inputs, varlen_backward_inputs)
from fastattn.reference import _per_query_head, _scores, _softmax_rows, _weighted_sum

from conftest import FMIN, HALF, HALF_IDS, randn

IMPLS = [ref] + ([fastattn] if hasattr(fastattn, "attention_backward") else [])
IMPL_IDS = ["reference"] + (["fastattn"] if len(IMPLS) > 1 else [])


def assert_grad(got, expected, impl, name=""):
    """A float32 gradient, C-contiguous, of the expected shape, close to a
    float64 `expected`: the reference to ~1e-6 of the gradient's magnitude,
    the compiled float32 kernels to ~2e-5 of it (rtol 2e-4)."""
    got = np.asarray(got)
    assert got.dtype == np.float32, (name, got.dtype)
    assert got.flags.c_contiguous, name
    assert got.shape == np.shape(expected), (name, got.shape, np.shape(expected))
    big = max(1.0, float(np.nanmax(np.abs(expected)))) if np.size(expected) else 1.0
    rtol, atol = (1e-5, 1e-6) if impl is ref else (2e-4, 2e-5)
    np.testing.assert_allclose(got, expected, rtol=rtol, atol=atol * big, err_msg=name)


def forward_and_backward(impl, do_fn, q, k, v, **kw):
    """impl's forward (o, lse), a do from do_fn(o.shape), impl's gradients."""
    o, lse = impl.scaled_dot_product_attention(q, k, v, return_lse=True, **kw)
    do = do_fn(o.shape)
    return do, o, lse, impl.attention_backward(do, q, k, v, o, lse, **kw)


# ----------------------------------------------------------------------------
# Against finite differences


def float64_forward(q, k, v, kw):
    """o(q, k, v, sinks) in float64 from the reference's pieces, as a
    function of float64 copies of q, k, v and sinks (perturbed in place by
    the caller): the scores, the softmax with the sinks, the weighted sum."""
    a = attention_inputs(q, k, v, kw.get("attn_mask"), kw.get("is_causal", False),
                         kw.get("window"), kw.get("scale"), kw.get("enable_gqa", False),
                         softcap=kw.get("softcap"), alibi_slopes=kw.get("alibi_slopes"),
                         sinks=kw.get("sinks"), segment_ids=kw.get("segment_ids"))
    x = {"q": q.astype(np.float64), "k": k.astype(np.float64), "v": v.astype(np.float64)}
    if "sinks" in kw:
        x["sinks"] = np.array(kw["sinks"], dtype=np.float64)

    def o():
        b = a._replace(q=x["q"], k=x["k"], v=x["v"])
        sinks = None
        if "sinks" in x:
            sinks = np.broadcast_to(np.broadcast_to(x["sinks"], x["q"].shape[:-2]), a.batch)
        s = _scores(b)
        w, _, _ = _softmax_rows(s, sinks)
        return np.broadcast_to(_weighted_sum(w, s, _per_query_head(b.v, b)),
                               a.batch + (a.L, a.Dv))
    return x, o


def finite_differences(do, q, k, v, kw, h=1e-5):
    """Central differences of sum(do * o) with respect to q, k, v (and sinks)."""
    x, o = float64_forward(q, k, v, kw)
    do = do.astype(np.float64)
    grads = []
    for name in ("q", "k", "v", "sinks"):
        if name not in x:
            continue
        arr = x[name]
        g = np.zeros(arr.shape)
        for idx in np.ndindex(*arr.shape):
            keep = arr[idx]
            arr[idx] = keep + h
            up = np.sum(do * o())
            arr[idx] = keep - h
            down = np.sum(do * o())
            arr[idx] = keep
            g[idx] = (up - down) / (2 * h)
        grads.append(g)
    return grads


B, H, L, S, D, Dv = 2, 2, 5, 7, 4, 3


def _bool_mask(rng):
    mask = rng.random((B, 1, L, S)) < 0.7
    mask[..., 0] = True  # every row sees a key
    return mask


def _float_mask(rng):
    mask = rng.standard_normal((B, 1, L, S)).astype(np.float32)
    mask[rng.random(mask.shape) < 0.3] = -np.inf
    mask[..., 1] = 0.5  # every row sees a key
    mask[0, 0, 3] = FMIN  # Hugging Face's padding row: equal weights over all keys
    return mask


def _segments(rng):
    return (np.array([[0, 0, 1, 1, 2]] * B)[:, None, :],
            np.array([[0, 0, 0, 1, 1, 2, 2]] * B)[:, None, :])


# (name, q shape, k shape, v shape, keywords: values or functions of rng)
CASES = [
    ("plain", (B, H, L, D), (B, H, S, D), (B, H, S, Dv), {}),
    ("causal", (B, H, L, D), (B, H, S, D), (B, H, S, Dv), {"is_causal": True}),
    ("causal L>S", (B, H, S, D), (B, H, L, D), (B, H, L, Dv), {"is_causal": True}),
    ("window", (B, H, L, D), (B, H, S, D), (B, H, S, Dv), {"window": (2, 1)}),
    ("window L>S", (B, H, S, D), (B, H, L, D), (B, H, L, Dv), {"window": (1, 0)}),
    ("bool mask", (B, H, L, D), (B, H, S, D), (B, H, S, Dv), {"attn_mask": _bool_mask}),
    ("float mask", (B, H, L, D), (B, H, S, D), (B, H, S, Dv), {"attn_mask": _float_mask}),
    ("softcap", (B, H, L, D), (B, H, S, D), (B, H, S, Dv), {"softcap": 1.5, "scale": 1.0}),
    ("alibi", (B, H, L, D), (B, H, S, D), (B, H, S, Dv),
     {"alibi_slopes": np.array([0.5, 0.25], np.float32)}),
    ("sinks", (B, H, L, D), (B, H, S, D), (B, H, S, Dv),
     {"sinks": np.array([0.3, -1.0], np.float32)}),
    ("sinks per item", (B, H, L, D), (B, H, S, D), (B, H, S, Dv),
     {"sinks": lambda rng: randn(rng, B, H), "is_causal": True}),
    ("segments", (B, H, L, D), (B, H, S, D), (B, H, S, Dv), {"segment_ids": _segments}),
    ("gqa", (B, 4, L, D), (B, 2, S, D), (B, 2, S, Dv), {"enable_gqa": True}),
    ("broadcast k v", (B, H, L, D), (1, H, S, D), (H, S, Dv), {}),
    ("broadcast q mqa", (1, H, L, D), (B, 1, S, D), (B, 1, S, Dv), {"is_causal": True}),
    ("everything", (B, 4, L, D), (1, 2, S, D), (B, 2, S, Dv),
     {"enable_gqa": True, "is_causal": True, "window": (3, None), "softcap": 2.0,
      "alibi_slopes": np.array([0.5, 0.25, 0.125, 0.0625], np.float32),
      "sinks": np.float32(0.25), "attn_mask": _float_mask}),
]


def build(rng, case, kv_dtype=np.float32):
    _, qs, ks, vs, kw = case
    q = randn(rng, *qs)
    k = randn(rng, *ks).astype(kv_dtype)
    v = randn(rng, *vs).astype(kv_dtype)
    kw = {name: value(rng) if callable(value) else value for name, value in kw.items()}
    return q, k, v, kw


def _do(rng, kw):
    def make(shape):
        do = randn(rng, *shape)
        mask = kw.get("attn_mask")
        if mask is not None and mask.dtype != np.bool_:
            # float64 cannot resolve a score next to 3.4e38: finite differences
            # see nothing of a finfo.min row's dependence on q and k (see
            # test_finfo_min_padding_row_has_equal_weights), so it gets no do here
            padded = np.broadcast_to((mask == FMIN).all(-1), shape[:-1])
            do[padded] = 0.0
        return do
    return make


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("impl", IMPLS, ids=IMPL_IDS)
def test_gradients_match_finite_differences(impl, case, rng):
    q, k, v, kw = build(rng, case)
    do, _, _, grads = forward_and_backward(impl, _do(rng, kw), q, k, v, **kw)
    expected = finite_differences(do, q, k, v, kw)
    assert len(grads) == (4 if "sinks" in kw else 3)
    for name, g, e in zip(("dq", "dk", "dv", "dsinks"), grads, expected):
        assert_grad(g, e, impl, name)


@pytest.mark.parametrize("dtype", HALF, ids=HALF_IDS)
@pytest.mark.parametrize("impl", IMPLS, ids=IMPL_IDS)
def test_half_precision_kv_gradients_are_float32(impl, dtype, rng):
    case = ("half", (B, 4, L, D), (B, 2, S, D), (B, 2, S, Dv),
            {"enable_gqa": True, "is_causal": True})
    q, k, v, kw = build(rng, case, dtype)
    do, _, _, grads = forward_and_backward(impl, _do(rng, kw), q, k, v, **kw)
    for name, g, e in zip(("dq", "dk", "dv"), grads, finite_differences(do, q, k, v, kw)):
        assert_grad(g, e, impl, name)  # at the half values, read as float32


# ----------------------------------------------------------------------------
# Against PyTorch's autograd


def torch_grads(do, q, k, v, *, attn_mask=None, is_causal=False, scale=None, softcap=None,
                enable_gqa=False):
    """The same gradients from torch's autograd in float64, the forward written
    out in torch operations."""
    torch = pytest.importorskip("torch")
    t = [torch.tensor(x.astype(np.float64), requires_grad=True) for x in (q, k, v)]
    tq, tk, tv = t
    if enable_gqa:
        group = q.shape[-3] // k.shape[-3]
        tk, tv = tk.repeat_interleave(group, -3), tv.repeat_interleave(group, -3)
    Lq, Sk = q.shape[-2], k.shape[-2]
    scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    s = scale * (tq @ tk.transpose(-1, -2))
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    if is_causal:
        allowed = torch.ones(Lq, Sk, dtype=torch.bool).tril(Sk - Lq)
        s = s.masked_fill(~allowed, -torch.inf)
    if attn_mask is not None and attn_mask.dtype == np.bool_:
        s = s.masked_fill(~torch.tensor(attn_mask), -torch.inf)
    elif attn_mask is not None:
        s = s + torch.tensor(attn_mask.astype(np.float64))
    o = torch.softmax(s, dim=-1) @ tv
    (o * torch.tensor(do.astype(np.float64))).sum().backward()
    return [x.grad.numpy() for x in t]


TORCH_CASES = [
    ("plain", (B, H, L, D), (B, H, S, D), (B, H, S, Dv), {}),
    ("causal", (B, H, S, D), (B, H, S, D), (B, H, S, Dv), {"is_causal": True}),
    ("bool mask", (B, H, L, D), (B, H, S, D), (B, H, S, Dv), {"attn_mask": _bool_mask}),
    ("float mask", (B, H, L, D), (B, H, S, D), (B, H, S, Dv), {"attn_mask": _float_mask}),
    ("gqa", (B, 4, L, D), (B, 2, S, D), (B, 2, S, Dv), {"enable_gqa": True}),
    ("softcap", (B, 4, S, D), (B, 2, S, D), (B, 2, S, Dv),
     {"softcap": 1.5, "scale": 1.0, "is_causal": True, "enable_gqa": True}),
]


@pytest.mark.parametrize("case", TORCH_CASES, ids=[c[0] for c in TORCH_CASES])
@pytest.mark.parametrize("impl", IMPLS, ids=IMPL_IDS)
def test_gradients_match_torch_autograd(impl, case, rng):
    pytest.importorskip("torch")
    q, k, v, kw = build(rng, case)
    do, _, _, grads = forward_and_backward(impl, lambda shape: randn(rng, *shape), q, k, v, **kw)
    # (the finfo.min row included: torch differentiates its equal weights exactly)
    for name, g, e in zip(("dq", "dk", "dv"), grads, torch_grads(do, q, k, v, **kw)):
        assert_grad(g, e, impl, name)


# ----------------------------------------------------------------------------
# The rules


def _explicit(do, q, k, v, scale=None):
    """dq, dk, dv of plain attention from the closed forms of the softmax's
    Jacobian, in float64 (no mask): an independent check of the formulas."""
    q, k, v, do = (x.astype(np.float64) for x in (q, k, v, do))
    scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    s = scale * q @ np.swapaxes(k, -1, -2)
    w = np.exp(s - s.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    dw = do @ np.swapaxes(v, -1, -2)
    ds = w * (dw - np.sum(w * dw, -1, keepdims=True))
    return scale * ds @ k, scale * np.swapaxes(ds, -1, -2) @ q, np.swapaxes(w, -1, -2) @ do


@pytest.mark.parametrize("impl", IMPLS, ids=IMPL_IDS)
def test_finfo_min_padding_row_has_equal_weights(impl, rng):
    # A row whose float mask is finfo(float32).min on every key (Hugging
    # Face's padding): its scores all round to that value, its weights are
    # equal (1/S each), and its gradients are those of equal weights, as
    # torch's autograd gives them, although its lse (about -3.4e38) holds
    # nothing of log(S) in float32. Expected: the unmasked problem with that
    # row's q set to 0 (equal weights too), whose dk lacks only that row's
    # own term scale * dS_2j * q_2.
    q, k, v = randn(rng, 1, 1, L, D), randn(rng, 1, 1, S, D), randn(rng, 1, 1, S, Dv)
    mask = np.zeros((L, S), np.float32)
    mask[2] = FMIN
    do, o, lse, (dq, dk, dv) = forward_and_backward(
        impl, lambda shape: randn(rng, *shape), q, k, v, attn_mask=mask)
    np.testing.assert_allclose(o[0, 0, 2], v[0, 0].mean(0), rtol=1e-5, atol=1e-6)
    qz = q.astype(np.float64)
    qz[0, 0, 2] = 0.0
    eq, ek, ev = _explicit(do, qz, k, v)
    dp = do[0, 0, 2].astype(np.float64) @ v[0, 0].T.astype(np.float64)  # dP_2j
    ds = (dp - dp.mean()) / S                                             # dS_2j
    ek[0, 0] += np.outer(ds, q[0, 0, 2].astype(np.float64)) / np.sqrt(D)
    for name, g, e in zip(("dq", "dk", "dv"), (dq, dk, dv), (eq, ek, ev)):
        assert_grad(g, e, impl, name)


@pytest.mark.parametrize("impl", IMPLS, ids=IMPL_IDS)
@pytest.mark.parametrize("how", ["causal L>S", "bool row", "float row"])
def test_row_without_keys_gets_zero_and_contributes_nothing(impl, how, rng):
    kw = {}
    Lq = L
    if how == "causal L>S":
        Lq, kw = S + 2, {"is_causal": True}  # rows 0 and 1 see no key
        dead = [0, 1]
    else:
        dead = [1]
        mask = np.ones((Lq, S), bool)
        mask[1] = False
        kw = {"attn_mask": mask if how == "bool row"
              else np.where(mask, 0.0, -np.inf).astype(np.float32)}
    q, k, v = randn(rng, B, H, Lq, D), randn(rng, B, H, S, D), randn(rng, B, H, S, Dv)
    do, o, lse, (dq, dk, dv) = forward_and_backward(
        impl, lambda shape: randn(rng, *shape), q, k, v, **kw)
    assert np.all(lse[..., dead] == -np.inf)
    assert np.all(dq[..., dead, :] == 0.0)
    do2 = do.copy()
    do2[..., dead, :] = np.nan  # a dead row's do reaches nothing
    q2 = q.copy()
    q2[..., dead, :] = np.nan   # nor does its q
    dq2, dk2, dv2 = impl.attention_backward(do2, q2, k, v, o, lse, **kw)
    assert np.all(dq2[..., dead, :] == 0.0)
    for name, g, c in zip(("dq", "dk", "dv"), (dq2, dk2, dv2), (dq, dk, dv)):
        assert np.isfinite(g).all(), name
        assert_grad(g, c.astype(np.float64), impl, name)  # (sums may run in another order)


@pytest.mark.parametrize("impl", IMPLS, ids=IMPL_IDS)
def test_rows_without_keys_or_sink_leave_dsinks_finite(impl, rng):
    # Causal with L > S: rows 0 and 1 see no key. Head 0 has no sink (-inf):
    # those rows have lse -inf and add nothing (exp(sink - lse) would be NaN);
    # head 1's sink is their only key: lse = sink, output 0, Delta 0.
    q, k, v = randn(rng, B, H, S + 2, D), randn(rng, B, H, S, D), randn(rng, B, H, S, Dv)
    sinks = np.array([-np.inf, 0.5], np.float32)
    do, o, lse, (dq, dk, dv, ds) = forward_and_backward(
        impl, lambda shape: randn(rng, *shape), q, k, v, is_causal=True, sinks=sinks)
    assert np.all(lse[:, 0, :2] == -np.inf) and np.all(lse[:, 1, :2] == np.float32(0.5))
    assert np.all(dq[..., :2, :] == 0.0)
    assert np.isfinite(ds).all() and ds[0] == 0.0 and ds[1] != 0.0
    assert np.isfinite(dk).all() and np.isfinite(dv).all()


@pytest.mark.parametrize("impl", IMPLS, ids=IMPL_IDS)
@pytest.mark.parametrize("how", ["bool", "-inf", "window", "segments"])
def test_nan_in_a_masked_key_reaches_no_gradient(impl, how, rng):
    q, k, v = randn(rng, B, H, L, D), randn(rng, B, H, S, D), randn(rng, B, H, S, Dv)
    j = 0 if how == "window" else S - 1  # no query may see key j
    mask = np.ones((L, S), bool)
    mask[:, j] = False
    kw = {"bool": {"attn_mask": mask},
          "-inf": {"attn_mask": np.where(mask, 0.0, -np.inf).astype(np.float32)},
          "window": {"window": (1, None)},  # j >= p_i - 1 >= 1: p_i = i + S - L >= 2
          "segments": {"segment_ids": (np.zeros(L, np.int64),
                                       np.array([0] * (S - 1) + [1]))}}[how]
    do, o, lse, clean = forward_and_backward(impl, lambda shape: randn(rng, *shape),
                                             q, k, v, **kw)
    k2, v2 = k.copy(), v.copy()
    k2[..., j, :] = np.nan
    v2[..., j, 0] = np.inf
    v2[..., j, 1:] = np.nan
    o2, lse2 = impl.scaled_dot_product_attention(q, k2, v2, return_lse=True, **kw)
    np.testing.assert_array_equal(o2, o)
    dirty = impl.attention_backward(do, q, k2, v2, o2, lse2, **kw)
    for name, g, c in zip(("dq", "dk", "dv"), dirty, clean):
        assert np.isfinite(g).all(), name
        assert_grad(g, c.astype(np.float64), impl, name)
    assert np.all(dirty[1][..., j, :] == 0) and np.all(dirty[2][..., j, :] == 0)


@pytest.mark.parametrize("impl", IMPLS, ids=IMPL_IDS)
def test_nan_on_an_allowed_pair_propagates_only_where_it_is_seen(impl, rng):
    # Causal, L == S: only the last query sees the last key. A NaN in that
    # key's value makes the last row's output NaN there, hence its Delta, its dq
    # and every dk (each key is seen by the last row); dv does not depend on
    # v, and the other rows' dq never combine with that key.
    q, k, v = randn(rng, B, H, S, D), randn(rng, B, H, S, D), randn(rng, B, H, S, Dv)
    do, o, lse, (dq, dk, dv) = forward_and_backward(
        impl, lambda shape: randn(rng, *shape), q, k, v, is_causal=True)
    v2 = v.copy()
    v2[..., -1, 1] = np.nan
    o2, lse2 = impl.scaled_dot_product_attention(q, k, v2, return_lse=True, is_causal=True)
    assert np.isnan(o2[..., -1, 1]).all()
    assert np.isfinite(o2[..., :-1, :]).all() and np.isfinite(o2[..., [0, 2]]).all()
    dq2, dk2, dv2 = impl.attention_backward(do, q, k, v2, o2, lse2, is_causal=True)
    assert np.isnan(dq2[..., -1, :]).all()
    assert_grad(np.ascontiguousarray(dq2[..., :-1, :]), dq[..., :-1, :].astype(np.float64),
                impl, "dq")
    assert np.isnan(dk2).all()
    assert_grad(dv2, dv.astype(np.float64), impl, "dv")


@pytest.mark.parametrize("impl", IMPLS, ids=IMPL_IDS)
def test_a_pair_of_weight_zero_adds_nothing(impl, rng):
    # Key 5 is allowed, but a float mask of -1e4 gives it the weight exp(-1e4)
    # = 0 in every row. NaN in its value row reaches o (0 * NaN), so Delta,
    # dq and the other keys' dk, as IEEE says; its own dk and dv stay 0.
    q, k, v = randn(rng, 4, 4), randn(rng, 6, 4), randn(rng, 6, 3)
    v[5] = np.nan
    mask = np.zeros((4, 6), np.float32)
    mask[:, 5] = -1e4
    o, lse = impl.scaled_dot_product_attention(q, k, v, mask, return_lse=True)
    assert np.isnan(o).all()
    dq, dk, dv = impl.attention_backward(np.ones_like(o), q, k, v, o, lse, mask)
    assert np.isnan(dq).all() and np.isnan(dk[:5]).all() and np.isfinite(dv[:5]).all()
    assert np.all(dk[5] == 0) and np.all(dv[5] == 0)


@pytest.mark.parametrize("impl", IMPLS, ids=IMPL_IDS)
def test_a_row_with_an_infinite_score_is_nan_on_its_allowed_keys(impl):
    # Row 0 scores +inf on key 0 (lse +inf; the forward's softmax makes the
    # row NaN): every key it may see gets NaN gradients. Row 1 scores -inf on
    # key 0 (weight 0) and sees keys 1 and 2; under causal alignment row 0
    # (the second-to-last query against 3 keys) may not see key 2.
    q = np.array([[1.0, 0.0], [-1.0, 0.0]], np.float32)
    k = np.array([[np.inf, 0.0], [0.0, 1.0], [1.0, 1.0]], np.float32)
    v = np.arange(6, dtype=np.float32).reshape(3, 2)
    for kw, seen in (({}, [0, 1, 2]), ({"is_causal": True}, [0, 1])):
        o, lse = impl.scaled_dot_product_attention(q, k, v, return_lse=True, **kw)
        assert lse[0] == np.inf and np.isnan(o[0]).all() and np.isfinite(o[1]).all()
        dq, dk, dv = impl.attention_backward(np.ones_like(o), q, k, v, o, lse, **kw)
        assert np.isnan(dq[0]).all() and np.isnan(dv[seen]).all(), kw
        unseen = [j for j in range(3) if j not in seen]
        assert np.isfinite(dv[unseen]).all() and np.isfinite(dk[unseen]).all(), kw


@pytest.mark.parametrize("impl", IMPLS, ids=IMPL_IDS)
def test_values_of_no_columns_give_zero_gradients(impl, rng):
    # Dv = 0: o has no columns, so the loss cannot depend on q, k or the sinks.
    q, k, v = randn(rng, 2, 3, 4), randn(rng, 2, 5, 4), np.zeros((2, 5, 0), np.float32)
    sinks = np.ones(2, np.float32)
    o, lse = impl.scaled_dot_product_attention(q, k, v, return_lse=True, sinks=sinks)
    dq, dk, dv, ds = impl.attention_backward(o, q, k, v, o, lse, sinks=sinks)
    assert dv.shape == v.shape and ds.shape == sinks.shape
    assert not dq.any() and not dk.any() and not ds.any()
    cu = np.array([0, 1, 3])
    o, lse = impl.varlen_attention(q[0, :3, None], k[0, :3, None], v[0, :3, None], cu, cu,
                                   return_lse=True)
    grads = impl.varlen_attention_backward(o, q[0, :3, None], k[0, :3, None], v[0, :3, None],
                                           o, lse, cu, cu)
    assert grads[2].shape == (3, 1, 0) and not grads[0].any() and not grads[1].any()


@pytest.mark.parametrize("impl", IMPLS, ids=IMPL_IDS)
def test_read_only_inputs_are_read_in_place(impl, rng):
    q, k, v = randn(rng, 2, 8, 4), randn(rng, 2, 8, 4), randn(rng, 2, 8, 4)
    do, o, lse, clean = forward_and_backward(impl, lambda shape: randn(rng, *shape), q, k, v,
                                             is_causal=True)
    for x in (do, q, k, v, o, lse):
        x.flags.writeable = False
    frozen = impl.attention_backward(do, q, k, v, o, lse, is_causal=True)
    for g, c in zip(frozen, clean):
        np.testing.assert_array_equal(g, c)


@pytest.mark.parametrize("impl", IMPLS, ids=IMPL_IDS)
def test_broadcast_arguments_get_summed_gradients(impl, rng):
    # q, k, v, sinks at their own (broadcasting) shapes against the same
    # arrays materialised at the batch shape: the sums over the broadcast axes.
    q = randn(rng, 1, H, L, D)
    k = randn(rng, B, 1, S, D)
    v = randn(rng, S, Dv)
    sinks = np.float32(0.5)
    kw = {"is_causal": True, "sinks": sinks}
    do, o, lse, (dq, dk, dv, ds) = forward_and_backward(
        impl, lambda shape: randn(rng, *shape), q, k, v, **kw)
    assert (dq.shape, dk.shape, dv.shape, ds.shape) == (q.shape, k.shape, v.shape, ())
    full = [np.ascontiguousarray(np.broadcast_to(x, (B, H) + x.shape[-2:])) for x in (q, k, v)]
    fq, fk, fv, fs = impl.attention_backward(do, *full, o, lse, is_causal=True,
                                             sinks=np.full((B, H), sinks))
    tol = dict(rtol=1e-5, atol=1e-6) if impl is ref else dict(rtol=2e-4, atol=2e-5)
    np.testing.assert_allclose(dq, fq.sum(0, keepdims=True), **tol)
    np.testing.assert_allclose(dk, fk.sum(1, keepdims=True), **tol)
    np.testing.assert_allclose(dv, fv.sum((0, 1)), **tol)
    np.testing.assert_allclose(ds, fs.sum(), **tol)


@pytest.mark.parametrize("impl", IMPLS, ids=IMPL_IDS)
def test_gqa_kv_gradients_sum_their_query_heads(impl, rng):
    Hq, Hkv = 6, 2
    q, k, v = randn(rng, B, Hq, L, D), randn(rng, B, Hkv, S, D), randn(rng, B, Hkv, S, Dv)
    sinks = randn(rng, Hq)
    do, o, lse, (dq, dk, dv, ds) = forward_and_backward(
        impl, lambda shape: randn(rng, *shape), q, k, v, enable_gqa=True, sinks=sinks)
    kr, vr = (np.repeat(x, Hq // Hkv, axis=1) for x in (k, v))
    rq, rk, rv, rs = impl.attention_backward(do, q, kr, vr, o, lse, sinks=sinks)
    tol = dict(rtol=1e-5, atol=1e-6) if impl is ref else dict(rtol=2e-4, atol=2e-5)
    np.testing.assert_allclose(dq, rq, **tol)
    np.testing.assert_allclose(dk, rk.reshape(B, Hkv, Hq // Hkv, S, D).sum(2), **tol)
    np.testing.assert_allclose(dv, rv.reshape(B, Hkv, Hq // Hkv, S, Dv).sum(2), **tol)
    np.testing.assert_allclose(ds, rs, **tol)


@pytest.mark.parametrize("impl", IMPLS, ids=IMPL_IDS)
def test_plain_gradients_match_the_closed_forms(impl, rng):
    q, k, v = randn(rng, B, H, L, D), randn(rng, B, H, S, D), randn(rng, B, H, S, Dv)
    do, _, _, grads = forward_and_backward(impl, lambda shape: randn(rng, *shape), q, k, v,
                                           scale=0.7)
    for name, g, e in zip(("dq", "dk", "dv"), grads, _explicit(do, q, k, v, 0.7)):
        assert_grad(g, e, impl, name)


@pytest.mark.parametrize("impl", IMPLS, ids=IMPL_IDS)
def test_empty_batch_and_empty_keys(impl, rng):
    q, k, v = randn(rng, 0, H, L, D), randn(rng, 1, H, S, D), randn(rng, 1, H, S, Dv)
    do, o, lse, grads = forward_and_backward(impl, np.zeros, q, k, v, sinks=np.ones(H))
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape, (H,)]
    assert all(g.dtype == np.float32 and not g.any() for g in grads)
    # S = 0: every row has only the sink (lse = sink, output 0)
    q, k, v = randn(rng, B, H, L, D), randn(rng, B, H, 0, D), randn(rng, B, H, 0, Dv)
    do, o, lse, grads = forward_and_backward(impl, lambda shape: randn(rng, *shape), q, k, v,
                                             sinks=np.ones(H))
    assert [g.shape for g in grads] == [q.shape, k.shape, v.shape, (H,)]
    assert not grads[0].any() and not grads[3].any()


# ----------------------------------------------------------------------------
# Packed variable-length batches


def packed(rng, lens_q, lens_k, Hq=4, Hkv=2, dtype=np.float32):
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int64)
    cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int64)
    q = randn(rng, int(cu_q[-1]), Hq, D)
    k = randn(rng, int(cu_k[-1]), Hkv, D).astype(dtype)
    v = randn(rng, int(cu_k[-1]), Hkv, Dv).astype(dtype)
    return q, k, v, cu_q, cu_k


VARLEN_OPTIONS = {
    "plain": {},
    "causal": {"is_causal": True},
    "window softcap": {"window": (2, 1), "softcap": 1.5},
    "alibi per sequence": {"alibi_slopes": lambda rng, nb: rng.uniform(0, 0.5, (nb, 4))},
    "sinks per head": {"sinks": lambda rng, nb: randn(rng, 4), "is_causal": True},
    "sinks per sequence": {"sinks": lambda rng, nb: randn(rng, nb, 4)},
}


@pytest.mark.parametrize("option", list(VARLEN_OPTIONS))
@pytest.mark.parametrize("impl", IMPLS, ids=IMPL_IDS)
def test_varlen_backward_is_the_dense_backward_per_sequence(impl, option, rng):
    lens_q, lens_k = [3, 0, 6, 2, 4], [5, 4, 6, 0, 2]  # empty q, empty k, L > S
    q, k, v, cu_q, cu_k = packed(rng, lens_q, lens_k)
    nb = len(lens_q)
    kw = {name: value(rng, nb) if callable(value) else value
          for name, value in VARLEN_OPTIONS[option].items()}
    o, lse = impl.varlen_attention(q, k, v, cu_q, cu_k, return_lse=True, **kw)
    do = randn(rng, *o.shape)
    grads = impl.varlen_attention_backward(do, q, k, v, o, lse, cu_q, cu_k, **kw)
    assert len(grads) == (4 if "sinks" in kw else 3)
    expected = [np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape), np.zeros((nb, 4))]
    for b in range(nb):
        rows, keys = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        if rows.stop == rows.start:
            continue
        kb = {name: (value[b] if np.ndim(value) == 2 else value) for name, value in kw.items()}
        heads = [x[part].swapaxes(0, 1) for x, part in
                 ((do, rows), (q, rows), (k, keys), (v, keys), (o, rows), (lse, rows))]
        g = ref.attention_backward(*heads, enable_gqa=True, **kb)
        expected[0][rows] = g[0].swapaxes(0, 1)
        expected[1][keys] = g[1].swapaxes(0, 1)
        expected[2][keys] = g[2].swapaxes(0, 1)
        if "sinks" in kw:
            expected[3][b] = g[3]
    if "sinks" in kw:
        expected[3] = expected[3].reshape(np.broadcast_shapes(np.shape(kw["sinks"]), (nb, 4)))
        expected[3] = sum_to_shape(expected[3], np.shape(kw["sinks"]))
    for name, g, e in zip(("dq", "dk", "dv", "dsinks"), grads, expected):
        assert_grad(g, e, impl, name)
    assert not grads[1][cu_k[1]:cu_k[2]].any()  # the keys of a sequence without queries


@pytest.mark.parametrize("dtype", HALF, ids=HALF_IDS)
@pytest.mark.parametrize("impl", IMPLS, ids=IMPL_IDS)
def test_varlen_backward_half_precision_kv(impl, dtype, rng):
    q, k, v, cu_q, cu_k = packed(rng, [3, 5], [4, 5], dtype=dtype)
    o, lse = impl.varlen_attention(q, k, v, cu_q, cu_k, return_lse=True, is_causal=True)
    do = randn(rng, *o.shape)
    grads = impl.varlen_attention_backward(do, q, k, v, o, lse, cu_q, cu_k, is_causal=True)
    k32, v32 = k.astype(np.float32), v.astype(np.float32)
    expected = ref.varlen_attention_backward(do, q, k32, v32, o, lse, cu_q, cu_k,
                                             is_causal=True)
    for name, g, e in zip(("dq", "dk", "dv"), grads, expected):
        assert_grad(g, e.astype(np.float64), impl, name)


# ----------------------------------------------------------------------------
# The reduction helper


def test_sum_to_shape_follows_numpy_broadcasting(rng):
    g = rng.standard_normal((3, 4, 5))
    for shape in [(3, 4, 5), (4, 5), (4, 1), (1, 5), (3, 1, 5), (1, 1, 1), (5,), (1,), ()]:
        got = sum_to_shape(g, shape)
        assert got.shape == shape and got.flags.c_contiguous
        # the adjoint of broadcasting: <sum_to_shape(g), x> == <g, broadcast(x)>
        x = rng.standard_normal(shape)
        np.testing.assert_allclose(np.sum(got * x), np.sum(g * np.broadcast_to(x, g.shape)))
    assert sum_to_shape(g, (3, 4, 5)) is g
    np.testing.assert_array_equal(sum_to_shape(np.ones((2, 0, 3)), (1, 1, 3)),
                                  np.zeros((1, 1, 3)))


def test_sum_to_shape_sums_gqa_groups(rng):
    g = rng.standard_normal((2, 6, 5, 3))  # 6 query heads, 2 kv heads: groups of 3
    got = sum_to_shape(g, (1, 2, 5, 3), group=3)
    np.testing.assert_allclose(got, g.reshape(2, 2, 3, 5, 3).sum((0, 2))[None])
    np.testing.assert_array_equal(got, sum_to_shape(g, (1, 2, 5, 3), group=3))  # same bits


@pytest.mark.parametrize("grad_shape, shape, group", [
    ((3, 4, 5), (2, 5), 1),        # 2 against 4
    ((3, 4, 5), (3, 4, 5, 6), 1),  # more axes than the gradient
    ((3, 4, 5), (4, 4), 1),        # 4 against 5
    ((2, 6, 5, 3), (2, 2, 5, 3), 4),  # 6 heads are no groups of 4
])
def test_sum_to_shape_refuses_shapes_that_do_not_broadcast(grad_shape, shape, group):
    with pytest.raises(ValueError):
        sum_to_shape(np.zeros(grad_shape), shape, group)


# ----------------------------------------------------------------------------
# Argument checks


def _good(rng, **kw):
    q, k, v = randn(rng, B, H, L, D), randn(rng, B, H, S, D), randn(rng, B, H, S, Dv)
    o, lse = ref.scaled_dot_product_attention(q, k, v, return_lse=True, **kw)
    return randn(rng, *o.shape), q, k, v, o, lse


def test_backward_inputs_fields(rng):
    do, q, k, v, o, lse = _good(rng)
    kw = dict(attn_mask=None, is_causal=False, window=None, scale=None, enable_gqa=False)
    k1 = k[:1].astype(np.float16)
    bi = backward_inputs(do.astype(np.float64), q, k1, v, o[:, :, ::1], lse.tolist(),
                         sinks=[0.5, 1.0], **kw)
    assert isinstance(bi, BackwardInputs)
    assert bi.a.batch == (B, H) and bi.a.k.dtype == np.float16
    for arr in (bi.do, bi.o, bi.lse):
        assert arr.dtype == np.float32
    assert bi.do.shape == bi.o.shape == (B, H, L, Dv) and bi.lse.shape == (B, H, L)
    assert bi.lse.flags.c_contiguous
    assert (bi.q_shape, bi.k_shape, bi.v_shape, bi.sinks_shape) == \
        (q.shape, k1.shape, v.shape, (2,))
    assert backward_inputs(do, q, k, v, o, lse, **kw).sinks_shape is None
    # rows read in place: a strided view of do is not copied
    wide = np.zeros((B, H, 2 * L, Dv), np.float32)
    assert np.shares_memory(backward_inputs(wide[:, :, ::2], q, k, v, o, lse, **kw).do, wide)


def test_varlen_backward_inputs_fields(rng):
    q, k, v, cu_q, cu_k = packed(rng, [3, 4], [5, 2])
    o, lse = ref.varlen_attention(q, k, v, cu_q, cu_k, return_lse=True)
    bi = varlen_backward_inputs(o, q, k, v, o, lse, cu_q, cu_k, False, None, None, None,
                                None, np.ones((1, 4)))
    assert isinstance(bi, VarlenBackwardInputs)
    assert bi.a.B == 2 and bi.sinks_shape == (1, 4)
    assert bi.do.shape == bi.o.shape == (7, 4, Dv) and bi.lse.shape == (7, 4)


def _bad(name, change):
    """The good arguments (do, q, k, v, o, lse) with `name`'s changed."""
    def make(rng):
        args = list(_good(rng))
        i = ["do", "q", "k", "v", "o", "lse"].index(name)
        args[i] = change(args[i])
        return args
    return make


BAD = [
    (ValueError, r"do must have shape batch \+ \(L, Dv\), the output's = \(2, 2, 5, 3\), "
                 r"got shape \(2, 2, 5, 4\)",
     _bad("do", lambda x: np.zeros(x.shape[:-1] + (4,)))),
    (ValueError, r"do must have shape .* got shape \(2, 5, 3\)", _bad("do", lambda x: x[0])),
    (ValueError, r"do must have shape .* got shape \(1, 2, 5, 3\)",
     _bad("do", lambda x: x[:1])),  # broadcasting to the output's shape is not enough
    (ValueError, r"o must have shape batch \+ \(L, Dv\), the output's = \(2, 2, 5, 3\), "
                 r"got shape \(2, 2, 3, 5\)", _bad("o", lambda x: x.swapaxes(-1, -2))),
    (ValueError, r"lse must have shape batch \+ \(L,\), the forward's lse = \(2, 2, 5\), "
                 r"got shape \(2, 2, 5, 1\)", _bad("lse", lambda x: x[..., None])),
    (ValueError, r"lse must have shape .* got shape \(5,\)", _bad("lse", lambda x: x[0, 0])),
    (TypeError, r"do must have a real floating dtype .*got int64",
     _bad("do", lambda x: x.astype(np.int64))),
    (TypeError, r"o must have a real floating dtype .*got complex64",
     _bad("o", lambda x: x.astype(np.complex64))),
    (TypeError, r"lse must have a real floating dtype .*got bool", _bad("lse", lambda x: x > 0)),
    (TypeError, r"lse must be an array", _bad("lse", lambda x: [[1.0], [1.0, 2.0]])),
    (ValueError, r"k's last dimension must equal q's D=4", _bad("k", lambda x: x[..., :3])),
]


@pytest.mark.parametrize("exc, match, make", BAD, ids=[b[1][:40] for b in BAD])
@pytest.mark.parametrize("impl", IMPLS, ids=IMPL_IDS)
def test_backward_errors(impl, exc, match, make, rng):
    with pytest.raises(exc, match=match):
        impl.attention_backward(*make(rng))


def test_backward_inputs_errors_are_the_functions(rng):
    for exc, match, make in BAD:
        with pytest.raises(exc, match=match):
            backward_inputs(*make(rng)[:6], None, False, None, None, False)


@pytest.mark.parametrize("impl", IMPLS, ids=IMPL_IDS)
def test_backward_options_are_checked_as_the_forwards(impl, rng):
    args = _good(rng)
    with pytest.raises(TypeError, match="is_causal must be a bool"):
        impl.attention_backward(*args, is_causal=1)
    with pytest.raises(ValueError, match="softcap must be a finite number > 0"):
        impl.attention_backward(*args, softcap=-1.0)
    with pytest.raises(ValueError, match="sinks of shape \\(3,\\) does not broadcast"):
        impl.attention_backward(*args, sinks=np.zeros(3))
    with pytest.raises(TypeError, match="pass is_causal="):
        impl.attention_backward(*args, causal=True)


@pytest.mark.parametrize("impl", IMPLS, ids=IMPL_IDS)
def test_varlen_backward_errors(impl, rng):
    q, k, v, cu_q, cu_k = packed(rng, [3, 4], [5, 2])
    o, lse = ref.varlen_attention(q, k, v, cu_q, cu_k, return_lse=True)
    with pytest.raises(ValueError, match=r"do must have shape \(total_q, Hq, Dv\), the "
                                         r"output's = \(7, 4, 3\), got shape \(7, 4, 4\)"):
        impl.varlen_attention_backward(np.zeros((7, 4, 4)), q, k, v, o, lse, cu_q, cu_k)
    with pytest.raises(ValueError, match=r"lse must have shape \(total_q, Hq\), the "
                                         r"forward's lse = \(7, 4\), got shape \(4, 7\)"):
        impl.varlen_attention_backward(o, q, k, v, o, lse.T, cu_q, cu_k)
    with pytest.raises(TypeError, match="o must have a real floating dtype"):
        impl.varlen_attention_backward(o, q, k, v, o.astype(int), lse, cu_q, cu_k)
    with pytest.raises(ValueError, match="cu_seqlens_q must end at total_q"):
        impl.varlen_attention_backward(o, q, k, v, o, lse, cu_q[:-1], cu_k[:-1])


# ----------------------------------------------------------------------------
# The compiled kernels: every SIMD path, tiles, threads, large lse, bad rows

COMPILED_CASES = [  # (Hq, Hkv, L, S, D, Dv, keywords): more than one tile and block
    ("causal GQA", 4, 2, 130, 200, 24, 40, {"is_causal": True, "enable_gqa": True}),
    ("window softcap", 2, 2, 100, 160, 32, 32, {"window": (50, 10), "softcap": 3.0}),
    ("sinks ALiBi", 3, 3, 97, 70, 16, 8, {"sinks": np.array([0.5, -1.0, 2.0], np.float32),
                                          "alibi_slopes": np.array([0.1, 0.2, 0.4],
                                                                   np.float32)}),
    ("bool mask L>S", 2, 2, 150, 90, 20, 20, {"mask": 0.6}),
]


def _compiled_case(rng, case):
    _, Hq, Hkv, Lc, Sc, Dc, Dvc, kw = case
    kw = dict(kw)
    q = randn(rng, 2, Hq, Lc, Dc)
    k, v = randn(rng, 2, Hkv, Sc, Dc), randn(rng, 2, Hkv, Sc, Dvc)
    if "mask" in kw:
        kw["attn_mask"] = rng.random((Lc, Sc)) < kw.pop("mask")
    if Hq != Hkv:
        kw["enable_gqa"] = True
    return q, k, v, kw


@pytest.mark.parametrize("case", COMPILED_CASES, ids=[c[0] for c in COMPILED_CASES])
def test_compiled_backward_on_every_simd_path(simd, case, rng):
    q, k, v, kw = _compiled_case(rng, case)
    do, o, lse, got = forward_and_backward(fastattn, lambda shape: randn(rng, *shape),
                                           q, k, v, **kw)
    want = ref.attention_backward(do, q, k, v, o, lse, **kw)
    for name, g, w in zip(("dq", "dk", "dv", "dsinks"), got, want):
        assert_grad(g, w.astype(np.float64), fastattn, name)


@pytest.mark.parametrize("case", COMPILED_CASES, ids=[c[0] for c in COMPILED_CASES])
def test_compiled_backward_is_bitwise_the_same_on_any_thread_count(threads, case, rng):
    # One thread and two take one unit a kv head (five products a tile);
    # three, with four or six kv heads, split them into key-tile and
    # query-block units (seven): the same sums in the same order, so the
    # same bits. Each batch item alone gives its own rows' bits too.
    q, k, v, kw = _compiled_case(rng, case)
    o, lse = fastattn.scaled_dot_product_attention(q, k, v, return_lse=True, **kw)
    do = randn(rng, *o.shape)
    results = []
    for n in (1, 2, 3):
        threads(n)
        results.append(fastattn.attention_backward(do, q, k, v, o, lse, **kw))
    for other in results[1:]:
        for x, y in zip(results[0], other):
            np.testing.assert_array_equal(x, y)
    if "sinks" not in kw and "alibi_slopes" not in kw:  # (per-head arrays of the full batch)
        one = fastattn.attention_backward(do[1:], q[1:], k[1:], v[1:], o[1:], lse[1:], **kw)
        for x, y in zip(results[0], one):
            np.testing.assert_array_equal(x[1:], y)


@pytest.mark.parametrize("offset", [-1e30, 1e30])
def test_rows_of_huge_lse_get_their_weights(offset, rng):
    # An additive mask of `offset` on every key of some rows: their scores
    # round to `offset` alike (equal weights), and their float32 lse to
    # `offset`, which holds nothing of log(S): exp(s - lse) would weigh each
    # key 1. Such rows' normalizers are recomputed from their scores. Other
    # rows see a few keys of ordinary score among keys far below.
    q, k, v = randn(rng, 1, 2, 40, 16), randn(rng, 1, 2, 90, 16), randn(rng, 1, 2, 90, 8)
    mask = np.zeros((40, 90), np.float32)
    mask[::3] = offset
    mask[1::3, 5:] = -abs(offset)
    do, o, lse, got = forward_and_backward(fastattn, lambda shape: randn(rng, *shape),
                                           q, k, v, attn_mask=mask)
    assert np.all(lse[..., ::3] == np.float32(offset))
    want = ref.attention_backward(do, q, k, v, o, lse, attn_mask=mask)
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        assert_grad(g, w.astype(np.float64), fastattn, name)


def test_a_non_finite_query_row_spreads_only_where_it_is_seen(rng):
    # Causal: row 5's NaN q reaches dk and dv of keys 0..5 only (the keys it
    # sees), and its inf in do the same; the other rows' gradients are those
    # of the clean call.
    q, k, v = randn(rng, 1, 1, 70, 8), randn(rng, 1, 1, 70, 8), randn(rng, 1, 1, 70, 8)
    q[0, 0, 5, 3] = np.nan
    do, o, lse, got = forward_and_backward(fastattn, lambda shape: randn(rng, *shape),
                                           q, k, v, is_causal=True)
    do[0, 0, 9, 2] = np.inf
    got = fastattn.attention_backward(do, q, k, v, o, lse, is_causal=True)
    want = ref.attention_backward(do, q, k, v, o, lse, is_causal=True)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w))
        ok = np.isfinite(w)
        np.testing.assert_allclose(g[ok], w[ok], rtol=2e-4,
                                   atol=2e-5 * float(np.max(np.abs(w[ok]))))
