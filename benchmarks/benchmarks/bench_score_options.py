"""softcap, ALiBi, sinks, segment ids and varlen_attention: each against the
call it replaces, in one process (L = S = 4096, D = 128, 8 heads, causal);
key-padding masks, bool against float."""
import numpy as np

import fastattn

from .common import random

H, L, D = 8, 4096, 128


class ScoreOptions:
    """Causal attention with each score option, against none (track the ratio)."""

    params = [["none", "softcap", "alibi", "sinks"], [2]]
    param_names = ["option", "threads"]
    timeout = 600

    def setup(self, option, threads):
        fastattn.set_num_threads(threads)
        self.q, self.k, self.v = (random((1, H, L, D), seed) for seed in range(3))
        self.kw = {"none": {}, "softcap": {"softcap": 30.0},
                   "alibi": {"alibi_slopes": 2.0 ** -np.arange(1, H + 1)},
                   "sinks": {"sinks": np.zeros(H)}}[option]

    def teardown(self, *args):
        fastattn.set_num_threads(None)

    def time_causal(self, option, threads):
        fastattn.causal_attention(self.q, self.k, self.v, **self.kw)


class DocumentMask:
    """16 packed documents of 256 tokens: segment ids against dense bool masks."""

    params = [["segment_ids", "dense+is_causal", "dense"], [2]]
    param_names = ["form", "threads"]
    timeout = 600

    def setup(self, form, threads):
        fastattn.set_num_threads(threads)
        self.q, self.k, self.v = (random((1, H, L, D), seed) for seed in range(3))
        ids = np.repeat(np.arange(16), 256)
        dense = ids[:, None] == ids[None, :]
        if form == "segment_ids":
            self.args, self.kw = (), {"segment_ids": ids, "is_causal": True}
        elif form == "dense+is_causal":
            self.args, self.kw = (dense,), {"is_causal": True}
        else:
            self.args, self.kw = (dense & np.tri(L, dtype=bool),), {}

    def teardown(self, *args):
        fastattn.set_num_threads(None)

    def time_documents(self, form, threads):
        fastattn.scaled_dot_product_attention(self.q, self.k, self.v, *self.args, **self.kw)


class Varlen:
    """16 causal sequences of 16..1024 tokens: packed, one call each, padded."""

    params = [["varlen", "separate", "padded"], [2]]
    param_names = ["form", "threads"]
    timeout = 600

    def setup(self, form, threads):
        fastattn.set_num_threads(threads)
        self.lens = np.round(np.geomspace(16, 1024, 16)).astype(int)
        self.cu = np.concatenate([[0], np.cumsum(self.lens)])
        total = int(self.cu[-1])
        self.q, self.k, self.v = (random((total, H, D), seed) for seed in range(3))
        M = int(self.lens.max())
        self.pad = random((16, H, M, D), 3)

    def teardown(self, *args):
        fastattn.set_num_threads(None)

    def time_sequences(self, form, threads):
        if form == "varlen":
            fastattn.varlen_attention(self.q, self.k, self.v, self.cu, self.cu, is_causal=True)
        elif form == "separate":
            for b in range(16):
                r = slice(self.cu[b], self.cu[b + 1])
                fastattn.causal_attention(self.q[r].swapaxes(0, 1), self.k[r].swapaxes(0, 1),
                                          self.v[r].swapaxes(0, 1))
        else:
            fastattn.causal_attention(self.pad, self.pad, self.pad)


class PaddingMask:
    """BERT-base's shape (16, 12, 256, 256, 64) with a key-padding mask
    (B, 1, 1, S): bool, float with -inf, and float with finfo(float32).min
    (Hugging Face's form) at the padded keys (track the float forms' ratio
    to the bool one)."""

    params = [["bool", "float -inf", "float finfo.min"], [2]]
    param_names = ["mask", "threads"]
    timeout = 600

    def setup(self, mask, threads):
        fastattn.set_num_threads(threads)
        B, heads, S, Dh = 16, 12, 256, 64
        self.q, self.k, self.v = (random((B, heads, S, Dh), seed) for seed in range(3))
        keep = np.ones((B, 1, 1, S), bool)
        for b in range(B):  # batch item b keeps its first S - b S / 32 keys
            keep[b, ..., S - (b * S) // (2 * B):] = False
        off = {"bool": None, "float -inf": -np.inf,
               "float finfo.min": np.finfo(np.float32).min}[mask]
        self.mask = keep if off is None else np.where(keep, 0.0, off).astype(np.float32)

    def teardown(self, *args):
        fastattn.set_num_threads(None)

    def time_padded(self, mask, threads):
        fastattn.scaled_dot_product_attention(self.q, self.k, self.v, self.mask)
