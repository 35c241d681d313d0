"""Train a small character-level transformer with fastattn's attention in PyTorch.

A 2-layer decoder (token and position embeddings, two blocks of pre-LayerNorm
causal self-attention and an MLP, the output layer tied to the token
embedding) learns to continue a short built-in text, trained with AdamW on
the CPU. The attention of every block is
``fastattn.torch.scaled_dot_product_attention``, forward and backward; with
``--attention torch`` the same model runs PyTorch's own
``torch.nn.functional.scaled_dot_product_attention`` instead, and from the
same seed the two start from the same loss and follow the same curve to
rounding::

    python examples/train_char_transformer.py                     # under a minute on 2 cores
    python examples/train_char_transformer.py --attention torch   # the same with torch's SDPA
    python examples/train_char_transformer.py --steps 50 --log-every 10

The loss printed is the mean cross-entropy (nats per character) of the
training batch. At the end the model writes a few characters of its own,
greedily, from the text's first words. Needs PyTorch (its CPU build:
``pip install torch --index-url https://download.pytorch.org/whl/cpu``).
"""
import argparse
import math
import os
import time

#: Set when run as a script (unless the environment sets it), before PyTorch
#: and fastattn load libgomp: after a parallel call GNU libgomp's threads spin
#: before they sleep, on the cores that the next of the many small operations
#: of a training step needs. On 2 cores shared with another busy process, 60
#: steps took 80 s without it and 7 s with it (fastattn's attention, 2 threads).
THREAD_ENV = {"OMP_WAIT_POLICY": "passive"}
if __name__ == "__main__":
    for _name, _value in THREAD_ENV.items():
        os.environ.setdefault(_name, _value)

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import fastattn  # noqa: E402
import fastattn.torch  # noqa: E402

# Written for this example (no download): a few paragraphs about the thing
# the model runs on.
TEXT = """\
Attention lets every position of a sequence look at every other position and
decide how much each one matters. A query asks a question, every key offers an
answer, and the softmax of their dot products turns the answers into weights
that sum to one. The output of the position is the weighted sum of the values.

In a language model the attention is causal: a position may look back, never
ahead, because the next character is what the model has to guess. The first
character sees only itself, the second sees two, and the last sees the whole
line that came before it. Masking the future keeps the model honest.

Each head of a layer learns its own way of looking. One head follows the
previous character, another the start of the word, a third the last space or
the last full stop. Stacked in layers, the heads build from letters to words
and from words to the shape of a sentence.

Training is patient work. The model guesses, the loss says how surprised it
was, and the gradients flow back through the softmax, the queries, the keys
and the values, nudging every weight a little. After a few hundred steps the
guesses improve: spaces fall between words, capitals follow full stops, and
familiar words appear in the right places.

The same attention can be computed in many ways. A slow way writes the whole
table of scores; a fast way walks the keys in tiles, keeps a running maximum
and a running sum, and never holds the table at all. Both give the same
numbers, to the last few bits, and the model cannot tell them apart.
"""


class Block(nn.Module):
    """Pre-LayerNorm transformer block: causal self-attention, then an MLP."""

    def __init__(self, dim, heads, attention):
        super().__init__()
        self.heads, self.attention = heads, attention
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=-1)
        # (B, T, C) -> (B, heads, T, head_dim): a view, rows stay contiguous
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        y = self.attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        return x + self.mlp(self.ln2(x))


class CharTransformer(nn.Module):
    """Token and position embeddings, `layers` blocks, a final LayerNorm and
    an output layer tied to the token embedding."""

    def __init__(self, vocab, context, dim, heads, layers, attention):
        super().__init__()
        self.context = context
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(context, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, attention) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        for m in self.modules():  # GPT-2's initialisation: small weights, zero biases
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
            if isinstance(m, nn.Linear):
                nn.init.zeros_(m.bias)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.ln(x) @ self.tok.weight.T  # tied output layer


ATTENTIONS = {"fastattn": fastattn.torch.scaled_dot_product_attention,
              "torch": F.scaled_dot_product_attention}


def _at_least(low):
    def parse(text):
        value = int(text)
        if value < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {text}")
        return value
    return parse


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description="Train a 2-layer character-level transformer whose attention is "
                    "fastattn.torch.scaled_dot_product_attention (or torch's own SDPA).")
    parser.add_argument("--attention", choices=sorted(ATTENTIONS), default="fastattn",
                        help="the attention function (default: fastattn)")
    parser.add_argument("--steps", type=_at_least(1), default=400,
                        help="training steps (default 400: under a minute on 2 cores)")
    parser.add_argument("--log-every", type=_at_least(1), default=25, help="print the loss every N steps")
    parser.add_argument("--batch-size", type=_at_least(1), default=16)
    parser.add_argument("--context", type=_at_least(1), default=128, help="characters per sequence")
    parser.add_argument("--dim", type=_at_least(1), default=128, help="model width")
    parser.add_argument("--heads", type=_at_least(1), default=4)
    parser.add_argument("--layers", type=_at_least(1), default=2)
    parser.add_argument("--lr", type=float, default=3e-3, help="AdamW's learning rate")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=_at_least(1), default=None,
                        help="threads of torch and of fastattn (default: each library's own)")
    parser.add_argument("--sample", type=_at_least(0), default=120,
                        help="characters to generate at the end (0: none)")
    args = parser.parse_args(argv)
    if args.dim % args.heads:
        parser.error(f"--dim ({args.dim}) must be a multiple of --heads ({args.heads})")
    if args.context > len(TEXT) - 2:  # a sequence and its next character, at 2 starts at least
        parser.error(f"--context must be at most {len(TEXT) - 2} (the text has {len(TEXT)} "
                     f"characters)")
    return args


def train(args, log=print):
    """Train from `args.seed`; returns the list of (step, loss) pairs logged
    (every `args.log_every` steps, the first and the last)."""
    if args.threads is not None:
        torch.set_num_threads(args.threads)
        fastattn.set_num_threads(args.threads)
    chars = sorted(set(TEXT))
    data = torch.tensor([chars.index(c) for c in TEXT])
    torch.manual_seed(args.seed)
    model = CharTransformer(len(chars), args.context, args.dim, args.heads, args.layers,
                            ATTENTIONS[args.attention])
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    batches = torch.Generator().manual_seed(args.seed)
    log(f"{sum(p.numel() for p in model.parameters())} parameters, {len(chars)} characters "
        f"in the vocabulary, {len(TEXT)} in the text; attention: {args.attention}")
    losses, start = [], time.perf_counter()
    for step in range(1, args.steps + 1):
        # linear warm-up over the first tenth (at most 20 steps), then a cosine decay
        warmup = max(1, min(20, args.steps // 10))
        lr = args.lr * min(1.0, step / warmup) * 0.5 * (1 + math.cos(math.pi * step / args.steps))
        for group in opt.param_groups:
            group["lr"] = lr
        starts = torch.randint(len(data) - args.context - 1, (args.batch_size,),
                               generator=batches)
        x = torch.stack([data[s:s + args.context] for s in starts])
        y = torch.stack([data[s + 1:s + args.context + 1] for s in starts])
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step == 1 or step % args.log_every == 0 or step == args.steps:
            losses.append((step, loss.item()))
            log(f"step {step:5d}  loss {loss.item():.4f}  ({time.perf_counter() - start:.1f} s)")
    log(f"final loss {losses[-1][1]:.4f} after {args.steps} steps in "
        f"{time.perf_counter() - start:.1f} s")
    if args.sample > 0:
        log("sample: " + repr(generate(model, chars, TEXT[:24], args.sample)))
    return losses


@torch.no_grad()
def generate(model, chars, prompt, n):
    """`prompt` continued by `n` characters, each the most likely next one."""
    model.eval()
    idx = torch.tensor([[chars.index(c) for c in prompt]])
    for _ in range(n):
        logits = model(idx[:, -model.context:])[0, -1]
        idx = torch.cat([idx, logits.argmax().view(1, 1)], dim=1)
    model.train()
    return "".join(chars[i] for i in idx[0].tolist())


def main(argv=None):
    train(parse_args(argv))


if __name__ == "__main__":
    main()
