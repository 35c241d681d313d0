"""Checks of the compiled kernels on real transformer activations.

The package ships ``fastattn/data/minilm_qkv.npz``: the queries, keys and
values of every attention layer of the sentence encoder all-MiniLM-L6-v2 for a
small padded batch of real sentences (``fastattn/data/README.md`` says where
they come from and ``tools/make_minilm_fixture.py`` remakes them).
:func:`real_input_checks` runs fastattn's compiled attention on them, with the
batch's padding mask, alone and combined with causal and sliding-window
constraints, and compares each result with :mod:`fastattn.reference`.
``python -m fastattn`` prints its rows beside its other checks.
"""
from importlib import resources
from typing import Any, Dict

import numpy as np

import fastattn
from fastattn import reference

FIXTURE = "minilm_qkv.npz"

#: Keys per query of the sliding-window check (window=(WINDOW_SIZE - 1, 0)).
WINDOW_SIZE = 4


def load_minilm_fixture():
    """The real-input fixture, padded as the model saw it.

    The file stores only the real tokens (float16, to keep the package small);
    this function rebuilds the padded batch in float32. Padded positions get
    values that make a misread visible: the query rows of padding are 0 (a
    well-defined uniform attention over the sentence) and the key and value
    rows of padding are NaN, which no result may show, since the padding mask
    forbids reading them.

    Returns
    -------
    dict
        ``q``, ``k``, ``v``: float32, C-contiguous, shape
        (layers, B, heads, L, head_dim), L the longest sentence's token count;
        ``attn_mask``: bool, shape (B, 1, 1, L), True at real tokens (it
        broadcasts over heads and queries); ``lengths``: int64 (B,), tokens per
        sentence; ``sentences``: the B sentences; ``tokens``: list of B lists
        of their WordPiece tokens; ``model``: the model's name.
    """
    ref = resources.files("fastattn").joinpath("data").joinpath(FIXTURE)
    with ref.open("rb") as f, np.load(f, allow_pickle=False) as data:
        packed = {name: data[name] for name in ("q", "k", "v")}
        lengths = data["lengths"].astype(np.int64)
        tokens = [str(t) for t in data["tokens"]]
        sentences = [str(s) for s in data["sentences"]]
        model = str(data["model"])
    n_layers, n_heads, total, head_dim = packed["q"].shape
    if total != lengths.sum():
        raise ValueError(f"{FIXTURE}: {total} tokens stored, lengths sum to {lengths.sum()}")
    batch, longest = len(lengths), int(lengths.max())
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    out: Dict[str, Any] = {}
    for name, fill in (("q", 0.0), ("k", np.nan), ("v", np.nan)):
        a = np.full((n_layers, batch, n_heads, longest, head_dim), fill, np.float32)
        for b, (s, n) in enumerate(zip(starts, lengths)):
            a[:, b, :, :n] = packed[name][:, :, s:s + n]
        out[name] = a
    out["attn_mask"] = (np.arange(longest) < lengths[:, None])[:, None, None, :]
    out["lengths"] = lengths
    out["sentences"] = sentences
    out["tokens"] = [tokens[s:s + n] for s, n in zip(starts, lengths)]
    out["model"] = model
    return out


def max_abs_err(got, want):
    """Max |got - want|; inf when shapes or the NaN/inf patterns differ."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.shape != want.shape:
        return np.inf
    fin = np.isfinite(want)
    if not np.array_equal(np.isfinite(got), fin) or not np.array_equal(
            got[~fin], want[~fin], equal_nan=True):
        return np.inf
    return float(np.max(np.abs(got[fin] - want[fin]), initial=0.0))


def _variants(attn_mask):
    """(label, function name, extra positional args, keyword args) per check."""
    return [
        ("pad mask", "scaled_dot_product_attention", (attn_mask,), {"return_lse": True}),
        ("pad + causal", "scaled_dot_product_attention", (attn_mask,),
         {"is_causal": True, "return_lse": True}),
        (f"pad + window {WINDOW_SIZE}", "sliding_window_attention", (WINDOW_SIZE, attn_mask),
         {"return_lse": True}),
    ]


def real_input_checks(rtol=1e-4, atol=1e-5):
    """Compiled kernels against the reference on real MiniLM activations.

    For every layer of the fixture (:func:`load_minilm_fixture`), runs
    ``fastattn.scaled_dot_product_attention`` with the batch's padding mask,
    the same with ``is_causal=True``, and
    ``fastattn.sliding_window_attention`` with a window of
    :data:`WINDOW_SIZE` keys and the padding mask, each with
    ``return_lse=True``, and compares the output and the log-sum-exp with
    those of :mod:`fastattn.reference`.

    Parameters
    ----------
    rtol, atol : float
        A check passes when ``numpy.allclose(compiled, reference, rtol, atol)``
        holds for the output and the lse and their non-finite entries are the
        same. The key and value rows of padding hold NaN, so a kernel that
        reads a masked key shows NaN where the reference has a number; with
        the window, the padded query rows past the sentence have no allowed
        key at all and must give an output of 0 and an lse of -inf.

    Returns
    -------
    list of (str, bool, float)
        One row ``(name, ok, max_abs_err)`` per layer and variant, e.g.
        ``("MiniLM layer 0 pad + causal", True, 4.8e-07)``; `max_abs_err` is
        the larger of the output's and the lse's (inf when the non-finite
        entries differ).
    """
    fx = load_minilm_fixture()
    rows = []
    for layer in range(fx["q"].shape[0]):
        q, k, v = fx["q"][layer], fx["k"][layer], fx["v"][layer]
        for label, fn, extra, kwargs in _variants(fx["attn_mask"]):
            got = getattr(fastattn, fn)(q, k, v, *extra, **kwargs)
            want = getattr(reference, fn)(q, k, v, *extra, **kwargs)
            err = max(max_abs_err(g, w) for g, w in zip(got, want))
            ok = np.isfinite(err) and all(np.allclose(g, w, rtol=rtol, atol=atol)
                                          for g, w in zip(got, want))
            rows.append((f"MiniLM layer {layer} {label}", bool(ok), err))
    return rows
