"""The compiled kernels on real transformer activations: the shipped fixture.

``fastattn/data/minilm_qkv.npz`` holds q, k, v of every layer of
all-MiniLM-L6-v2 for a padded batch of three sentences (see
``fastattn/data/README.md``). It ships inside the package, so these tests
always run.
"""
from importlib import resources

import numpy as np
import pytest

import fastattn
from fastattn import _realinput
from fastattn import reference as ref
from fastattn._realinput import load_minilm_fixture, real_input_checks

from conftest import SDPA_TOL, assert_close, assert_new_c_float32

N_LAYERS, N_HEADS, HEAD_DIM = 6, 12, 32  # all-MiniLM-L6-v2
VARIANTS = [label for label, *_ in _realinput._variants(None)]


@pytest.fixture(scope="module")
def fx():
    return load_minilm_fixture()


def test_fixture_is_package_data():
    f = resources.files("fastattn").joinpath("data", _realinput.FIXTURE)
    assert f.is_file()
    assert resources.files("fastattn").joinpath("data", "README.md").is_file()


def test_fixture_layout(fx):
    lengths = fx["lengths"]
    B, L = len(lengths), int(lengths.max())
    assert len(set(lengths.tolist())) == B >= 2  # different lengths: there is padding
    for name in ("q", "k", "v"):
        assert_new_c_float32(fx[name])
        assert fx[name].shape == (N_LAYERS, B, N_HEADS, L, HEAD_DIM)
    mask = fx["attn_mask"]
    assert mask.dtype == bool and mask.shape == (B, 1, 1, L)
    assert mask.sum(axis=-1).ravel().tolist() == lengths.tolist()
    assert len(fx["sentences"]) == B and isinstance(fx["model"], str)
    for toks, n in zip(fx["tokens"], lengths):
        assert len(toks) == n and toks[0] == "[CLS]" and toks[-1] == "[SEP]"


def test_fixture_padding(fx):
    """Real positions hold finite, non-trivial values; padded keys and values
    are NaN (a kernel reading them shows) and padded queries are 0."""
    real = fx["attn_mask"][:, 0, 0, :]  # (B, L)
    for name in ("q", "k", "v"):
        a = fx[name].transpose(1, 3, 0, 2, 4)  # (B, L, layers, heads, D)
        assert np.isfinite(a[real]).all()
        assert np.abs(a[real]).max(axis=-1).min() > 0
        pad = a[~real]
        assert pad.size and (np.all(pad == 0) if name == "q" else np.all(np.isnan(pad)))


@pytest.mark.parametrize("layer", range(N_LAYERS))
@pytest.mark.parametrize("variant", VARIANTS)
def test_layer_against_reference(fx, layer, variant):
    label, fn, extra, kwargs = next(c for c in _realinput._variants(fx["attn_mask"])
                                    if c[0] == variant)
    q, k, v = fx["q"][layer], fx["k"][layer], fx["v"][layer]
    o, lse = getattr(fastattn, fn)(q, k, v, *extra, **kwargs)
    ro, rlse = getattr(ref, fn)(q, k, v, *extra, **kwargs)
    assert np.isfinite(o).all()  # no NaN leaked in from the padded keys
    assert_close(o, ro)
    assert_close(lse, rlse)


@pytest.mark.parametrize("layer", range(N_LAYERS))
def test_padded_batch_equals_each_sentence_alone(fx, layer):
    """With the padding mask, a sentence's rows in the padded batch are what
    attention over that sentence alone, unpadded and unmasked, gives."""
    o, lse = fastattn.scaled_dot_product_attention(
        fx["q"][layer], fx["k"][layer], fx["v"][layer], fx["attn_mask"], return_lse=True)
    for b, n in enumerate(fx["lengths"]):
        q, k, v = (fx[name][layer, b, :, :n] for name in ("q", "k", "v"))
        alone, alone_lse = fastattn.scaled_dot_product_attention(q, k, v, return_lse=True)
        np.testing.assert_allclose(o[b, :, :n], alone, **SDPA_TOL)
        np.testing.assert_allclose(lse[b, :, :n], alone_lse, **SDPA_TOL)


def test_window_rows_past_the_sentence_are_empty(fx):
    """A window of W keys over right padding leaves the query rows W or more
    past a sentence's end with no allowed key: output 0, lse -inf."""
    W = _realinput.WINDOW_SIZE
    o, lse = fastattn.sliding_window_attention(fx["q"][0], fx["k"][0], fx["v"][0], W,
                                               fx["attn_mask"], return_lse=True)
    L = fx["q"].shape[-2]
    empty_rows = [(b, i) for b, n in enumerate(fx["lengths"]) for i in range(n + W - 1, L)]
    assert empty_rows  # the fixture's shortest sentence is short enough
    for b, i in empty_rows:
        assert np.all(o[b, :, i] == 0) and np.all(lse[b, :, i] == -np.inf)


def test_real_input_checks_pass():
    rows = real_input_checks()
    assert len(rows) == N_LAYERS * len(VARIANTS)
    assert len({name for name, _, _ in rows}) == len(rows)
    for layer in range(N_LAYERS):
        for variant in VARIANTS:
            assert f"MiniLM layer {layer} {variant}" in {name for name, _, _ in rows}
    for name, ok, err in rows:
        assert isinstance(ok, bool) and isinstance(err, float)
        assert ok, (name, err)
        assert 0 <= err < 1e-4, (name, err)


def test_real_input_checks_catch_a_kernel_that_ignores_the_mask(monkeypatch):
    """The checks can fail: a kernel that reads the padded keys is flagged."""
    sdpa, swa = fastattn.scaled_dot_product_attention, fastattn.sliding_window_attention

    def sdpa_no_mask(q, k, v, attn_mask=None, **kw):
        return sdpa(q, k, v, None, **kw)

    def swa_no_mask(q, k, v, window_size, attn_mask=None, **kw):
        return swa(q, k, v, window_size, None, **kw)

    monkeypatch.setattr(fastattn, "scaled_dot_product_attention", sdpa_no_mask)
    monkeypatch.setattr(fastattn, "sliding_window_attention", swa_no_mask)
    rows = real_input_checks()
    assert rows and not any(ok for _, ok, _ in rows)
    assert all(err == np.inf for _, _, err in rows)


def test_real_input_checks_catch_a_small_error(monkeypatch):
    """An output off by a relative 1e-3 fails at the default tolerance."""
    sdpa = fastattn.scaled_dot_product_attention

    def sdpa_off(*args, **kw):
        o, lse = sdpa(*args, **kw)
        return o * np.float32(1.001), lse

    monkeypatch.setattr(fastattn, "scaled_dot_product_attention", sdpa_off)
    rows = {name: (ok, err) for name, ok, err in real_input_checks()}
    assert not any(ok for name, (ok, _) in rows.items() if "window" not in name)
    assert all(ok for name, (ok, _) in rows.items() if "window" in name)
    assert all(0 < err < 0.1 for name, (_, err) in rows.items() if "window" not in name)
