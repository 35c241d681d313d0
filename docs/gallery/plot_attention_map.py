"""
What a real model attends to
============================

The queries and keys of all-MiniLM-L6-v2 (a sentence encoder) for a real
sentence ship with fastattn (``fastattn/data/minilm_qkv.npz``). Here
:func:`fastattn.attention_weights` turns those of one layer into the weights
of every head: query tokens down the side, key tokens along the bottom, each
row summing to 1. No model download is needed.
"""

from importlib import resources

import matplotlib.pyplot as plt
import numpy as np

import fastattn

with resources.files("fastattn").joinpath("data").joinpath("minilm_qkv.npz").open("rb") as f:
    data = dict(np.load(f, allow_pickle=False))

# The file packs three sentences token by token: (layers, heads, tokens, D).
lengths = data["lengths"]
n = int(lengths[0])                       # the first sentence
tokens = [str(t) for t in data["tokens"][:n]]
layer = 3
q = data["q"][layer, :, :n]               # (heads, n, D)
k = data["k"][layer, :, :n]
w = fastattn.attention_weights(q, k)      # (heads, n, n), MiniLM's scale 1/sqrt(D)
print(str(data["sentences"][0]), "->", tokens)
print("weights", w.shape, "rows sum to", np.round(w.sum(-1).min(), 5), "...",
      np.round(w.sum(-1).max(), 5))

# %%
# One head, large
# ---------------
head = 1
fig, ax = plt.subplots(figsize=(5.5, 4.8))
im = ax.imshow(w[head], cmap="viridis", vmin=0, vmax=1)
ax.set_xticks(range(n), tokens, rotation=60, ha="right")
ax.set_yticks(range(n), tokens)
ax.set_xlabel("key")
ax.set_ylabel("query")
ax.set_title(f"all-MiniLM-L6-v2, layer {layer}, head {head}")
fig.colorbar(im, ax=ax, shrink=0.8, label="attention weight")
fig.tight_layout()

# %%
# Every head of the layer
# -----------------------
# Heads specialise: some look at the previous or next token, some at the
# separators, some at related words.
fig, axes = plt.subplots(3, 4, figsize=(9, 7), sharex=True, sharey=True)
for h, ax in enumerate(axes.flat):
    ax.imshow(w[h], cmap="viridis", vmin=0, vmax=1)
    ax.set_title(f"head {h}", fontsize=9)
    ax.set_xticks([])
    ax.set_yticks([])
fig.suptitle(f"layer {layer}: " + " ".join(tokens), fontsize=10)
fig.tight_layout()
plt.show()
