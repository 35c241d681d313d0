"""
What each masking option allows
===============================

With all-zero queries and keys every allowed key gets the same score, so
:func:`fastattn.attention_weights` draws exactly the set of keys each query
may attend to (weight ``1 / count``) and leaves the others at 0. Here for 8
queries over 12 keys (``L != S``), where alignment matters: query ``i`` sits at
key position ``i + S - L`` (bottom-right), as in decoding with a KV cache.
"""

import matplotlib.pyplot as plt
import numpy as np

import fastattn

L, S = 8, 12
q, k = np.zeros((L, 4)), np.zeros((S, 4))
ids_q = np.repeat([0, 1], [3, 5])            # two documents among the queries...
ids_k = np.repeat([0, 1], [6, 6])            # ...and among the keys

cases = {
    "full": {},
    "is_causal=True\n(bottom-right)": {"is_causal": True},
    "PyTorch's is_causal, L != S\nattn_mask=np.tril(...)": {
        "attn_mask": np.tril(np.ones((L, S), bool))},
    "window=(3, 0)\n(sliding window of 4)": {"window": (3, 0)},
    "window=(2, 2)\n(local, both sides)": {"window": (2, 2)},
    "segment_ids + is_causal": {"segment_ids": (ids_q, ids_k), "is_causal": True},
}

fig, axes = plt.subplots(2, 3, figsize=(9, 5.6), sharex=True, sharey=True)
for ax, (title, kw) in zip(axes.flat, cases.items()):
    w = fastattn.attention_weights(q, k, **kw)
    ax.imshow(w > 0, cmap="Blues", vmin=0, vmax=1.3)
    ax.set_title(title, fontsize=9)
    ax.set_xticks(range(0, S, 2))
    ax.set_yticks(range(L))
for ax in axes[1]:
    ax.set_xlabel("key j")
for ax in axes[:, 0]:
    ax.set_ylabel("query i")
fig.suptitle(f"allowed keys (blue), L={L} queries, S={S} keys", fontsize=11)
fig.tight_layout()

# %%
# Sinks take a share of every row
# -------------------------------
# A sink is one extra virtual key with a zero value: the weights of the real
# keys then sum to less than 1, and a row can give most of its weight to
# "nothing". Here each row's total weight on the real keys, for a few sink
# logits.
x = np.random.default_rng(0).standard_normal((L, 16))
fig, ax = plt.subplots(figsize=(6, 3.2))
for sink in (-np.inf, 0.0, 1.0, 2.0):
    w = fastattn.attention_weights(x, x, is_causal=True, sinks=np.float32(sink))
    ax.plot(range(L), w.sum(-1), marker="o", label=f"sink = {sink}")
ax.set_xlabel("query i (causal: query i sees i + 1 keys)")
ax.set_ylabel("weight on real keys")
ax.set_ylim(0, 1.05)
ax.legend(fontsize=8)
fig.tight_layout()
plt.show()
