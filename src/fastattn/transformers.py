"""fastattn.transformers: fastattn as an attention implementation of Hugging Face transformers.

Importing this module registers the name ``"fastattn"`` with transformers'
``AttentionInterface`` (the attention function, :func:`attention_forward`)
and ``AttentionMaskInterface`` (the mask builder, :func:`create_mask`), so
that a model loaded or configured with ``attn_implementation="fastattn"``
computes its attention with :func:`fastattn.torch.scaled_dot_product_attention`,
forward and backward::

    import fastattn.transformers
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="fastattn")

Both registrations are needed: without a mask builder of the same name,
transformers builds no mask for the model and passes ``attention_mask=None``
to the attention function, which would lose causality and padding silently.

Needs PyTorch and transformers >= 5 (``pip install "fastattn[transformers]"``);
``import fastattn`` imports neither.
"""
import weakref
from typing import Any, Optional, Tuple

import torch
from torch import Tensor

from fastattn.torch import scaled_dot_product_attention

__all__ = ["register", "attention_forward", "create_mask", "NAME"]

#: The name under which fastattn is registered: ``attn_implementation="fastattn"``.
NAME = "fastattn"

Window = Tuple[Optional[int], Optional[int]]


def create_mask(*args: Any, **kwargs: Any) -> Optional[Tensor]:
    """Build the attention mask of a model that runs with ``attn_implementation="fastattn"``.

    The mask builder registered with transformers' ``AttentionMaskInterface``:
    transformers calls it (from ``create_causal_mask``,
    ``create_sliding_window_causal_mask``, ``create_bidirectional_mask``, ...)
    with the keywords of ``transformers.masking_utils.sdpa_mask``, and it
    returns what that function returns: a boolean mask of shape
    ``(batch, 1, L, S)`` (True = the key takes part), or None when the mask
    is plain causal attention (``L == S`` or ``L == 1``, no padding), plain
    bidirectional attention, or causal attention over the first ``L`` keys
    of an empty static cache, which :func:`attention_forward` then applies
    from its `is_causal` argument, as PyTorch's ``is_causal`` (aligned
    top-left). :func:`attention_forward` turns the mask into fastattn's
    cheaper forms before computing.

    Parameters
    ----------
    *args, **kwargs
        Those of ``transformers.masking_utils.sdpa_mask``: ``batch_size``,
        ``q_length``, ``kv_length``, ``q_offset``, ``kv_offset``,
        ``mask_function``, ``attention_mask`` (the 2-D padding mask),
        ``local_size``, ``allow_is_causal_skip``, ... .

    Returns
    -------
    torch.Tensor of bool, shape (batch, 1, L, S), or None
    """
    from transformers.masking_utils import sdpa_mask

    return sdpa_mask(*args, **kwargs)


def register() -> None:
    """Register ``"fastattn"`` with transformers' attention and mask interfaces.

    ``import fastattn.transformers`` calls it once; calling it again does no
    harm (the entries are replaced by the same functions), and restores them
    if something else was registered under the name since. Afterwards
    ``attn_implementation="fastattn"`` is accepted by
    ``from_pretrained``, ``from_config`` and ``model.set_attn_implementation``.

    Raises
    ------
    ImportError
        If transformers (>= 5) or PyTorch is not installed.

    Notes
    -----
    Two registrations: :func:`attention_forward` with
    ``transformers.AttentionInterface`` and :func:`create_mask` with
    ``transformers.masking_utils.AttentionMaskInterface``. transformers builds
    a model's mask only for names that have a mask builder; with the first
    registration alone, a causal model would get ``attention_mask=None``
    with every padding and sliding-window rule dropped, and a decoder would
    attend to future tokens whenever it was given a mask.

    Examples
    --------
    .. code-block:: python

       import fastattn.transformers
       from transformers import AutoModelForCausalLM

       model = AutoModelForCausalLM.from_pretrained(
           "HuggingFaceTB/SmolLM2-135M", attn_implementation="fastattn")
       model.set_attn_implementation("sdpa")       # and back:
       model.set_attn_implementation("fastattn")
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(NAME, attention_forward)
    AttentionMaskInterface.register(NAME, create_mask)


# ------------------------------------------------------------ mask analysis
# transformers' boolean masks are a band (causal, sliding window, or none)
# intersected with a key-padding vector per batch item, for every model
# without special patterns. In that case the attention gets the band as a
# window and the padding as a (batch, 1, 1, S) mask, which the kernels read
# once per row and which lets them skip the tiles outside the band; any other
# mask is used as it is.

class _Form:
    """A bool mask (B, 1, L, S) as `keys` (the first keys, those any row
    sees), `window` (bottom-right over those keys) and `padding` (None, or a
    (B, 1, 1, keys) bool mask); `dense` when it has no such form."""

    __slots__ = ("keys", "window", "padding", "dense")

    def __init__(self, keys: int, window: Optional[Window], padding: Optional[Tensor],
                 dense: bool):
        self.keys, self.window, self.padding, self.dense = keys, window, padding, dense


# The last mask analysed: a model passes the same mask to every layer of a
# kind, so it is analysed once per forward. (reference to the mask, its
# in-place version counter, the form)
_last: Optional[Tuple[Any, int, _Form]] = None


def _mask_form(mask: Tensor, L: int, S: int) -> _Form:
    """The cheapest form of a bool mask of shape (B, 1, L, S)."""
    global _last
    last = _last
    if last is not None and last[0]() is mask and last[1] == mask._version:
        return last[2]
    form = _analyse(mask, L, S)
    if not torch.compiler.is_compiling():
        _last = (weakref.ref(mask), mask._version, form)
    return form


def _analyse(mask: Tensor, L: int, S: int) -> _Form:
    dense = _Form(S, None, None, True)
    with torch.no_grad():
        seen = mask.any(dim=-2, keepdim=True)                     # (B, 1, 1, S)
        any_key = seen.reshape(-1, S).any(dim=0).nonzero()
        if any_key.numel() == 0 or L == 0:
            return dense
        keys = int(any_key[-1]) + 1                                # keys past this: seen by no row
        m, seen = mask[..., :keys], seen[..., :keys]
        # d = p_i - j, the distance of key j before query row i's position
        # p_i = i + keys - L (fastattn's alignment on the kept keys)
        d = (torch.arange(L, device=mask.device)[:, None] + (keys - L)
             - torch.arange(keys, device=mask.device)[None, :])
        allowed = m.reshape(-1, L, keys).any(dim=0)
        if not bool(allowed.any()):
            return dense
        far, near = int(d[allowed].max()), int(d[allowed].min())
        # a bound that no row can reach is no bound
        left = None if far >= keys - 1 else max(far, 0)
        right = None if -near >= L - 1 else max(-near, 0)
        band = torch.ones(L, keys, dtype=torch.bool, device=mask.device)
        if left is not None:
            band &= d <= left
        if right is not None:
            band &= d >= -right
        if not torch.equal(seen & band, m):
            return dense
    padding = None if bool(seen.all()) else seen
    window = None if left is None and right is None else (left, right)
    return _Form(keys, window, padding, False)


# ------------------------------------------------------------------ forward

def attention_forward(module: torch.nn.Module, query: Tensor, key: Tensor, value: Tensor,
                      attention_mask: Optional[Tensor], dropout: float = 0.0,
                      scaling: Optional[float] = None, is_causal: Optional[bool] = None,
                      sliding_window: Optional[int] = None, softcap: Optional[float] = None,
                      s_aux: Optional[Tensor] = None, **kwargs: Any) -> Tuple[Tensor, None]:
    """A transformers attention function computed by fastattn (registered as ``"fastattn"``).

    Models call it through ``ALL_ATTENTION_FUNCTIONS`` with the arguments of
    transformers' ``sdpa_attention_forward``; it computes with
    :func:`fastattn.torch.scaled_dot_product_attention`, so that the
    gradients of query, key, value and the sinks are fastattn's backward.

    Parameters
    ----------
    module : torch.nn.Module
        The attention layer. Read: ``module.training`` (for `dropout`) and
        ``module.is_causal`` (when `is_causal` is None; default True).
    query : torch.Tensor, shape (B, Hq, L, D), float32, float16 or bfloat16
    key : torch.Tensor, shape (B, Hkv, S, D)
    value : torch.Tensor, shape (B, Hkv, S, Dv)
        ``Hq % Hkv == 0``: grouped-query heads are read in place
        (``enable_gqa``), key and value are never repeated. Tensors whose
        last axis is contiguous (the transposed projections models pass) are
        not copied; float16 and bfloat16 key and value are read as stored.
    attention_mask : torch.Tensor or None
        What :func:`create_mask` built: a bool mask (True = attend) of shape
        (B, 1, L, S), or None. A float mask (added to the scores) or a bool
        mask of another pattern, passed by the user, is used as it is.
    dropout : float, default 0.0
        Attention dropout. Must be 0 when ``module.training`` (fastattn has
        none); ignored otherwise, as transformers' eager attention does.
    scaling : float, optional
        The score scale; default ``1 / sqrt(D)``.
    is_causal : bool, optional
        Whether the layer is causal; None reads ``module.is_causal``. Applied
        only when `attention_mask` is None and ``L > 1``, aligned top-left
        (query i sees keys ``j <= i``) as PyTorch's SDPA and transformers'
        sdpa do; a mask, when given, holds the causal rule itself.
    sliding_window : int, optional
        Accepted and not read: transformers writes the window into the mask
        (and omits the mask only when the window covers every key).
    softcap : float, optional
        Logit soft-capping, ``softcap * tanh(s / softcap)`` before the mask
        (Gemma 2).
    s_aux : torch.Tensor, shape (Hq,), optional
        Attention-sink logits, one per query head (gpt-oss); they get a
        gradient when they require one.
    **kwargs
        Other keywords models pass (``position_ids``, ...), ignored.

    Returns
    -------
    attn_output : torch.Tensor, shape (B, L, Hq, Dv), the dtype of `query`
        Contiguous, in the layout models reshape to (B, L, Hq * Dv).
    attn_weights : None
        fastattn never forms the weights (``output_attentions`` gives None).

    Raises
    ------
    ValueError
        If ``dropout > 0`` while ``module.training``; and what
        :func:`fastattn.torch.scaled_dot_product_attention` raises (tensors
        off the CPU, shapes that do not fit).
    TypeError
        For float64 tensors, as :func:`fastattn.torch.scaled_dot_product_attention`.

    Notes
    -----
    A bool mask that is a band of keys around each query's position (causal,
    sliding window, or none) intersected with one key-padding vector per
    batch item, which is every mask transformers builds for a model without
    special patterns, runs as fastattn's ``window`` plus a ``(B, 1, 1, S)``
    padding mask over the keys that some row sees (a static cache's empty
    tail is left out, by a view). The mask is checked element for element
    against that form, once per mask (a model passes the same one to every
    layer), and used as it is when it differs.

    A query row that may attend to no key (a left-padding position during
    the prefill) gives zeros, as PyTorch's SDPA gives for it; transformers'
    eager attention gives the mean of the values there (its mask adds the
    float minimum rather than -inf). Neither is read by the other
    positions, whose results agree.

    References
    ----------
    transformers' ``integrations/sdpa_attention.py`` (``sdpa_attention_forward``)
    and ``masking_utils.py`` (``sdpa_mask``) define the arguments and the masks.
    """
    if dropout and module.training:
        raise ValueError(
            f"fastattn has no attention dropout, and the model asked for dropout={dropout!r} "
            f"in training mode: set its attention dropout to 0 in the config (attention_dropout, "
            f"attention_probs_dropout_prob or the model's name for it) before training with "
            f"attn_implementation='fastattn'")
    L, S = query.shape[-2], key.shape[-2]
    enable_gqa = query.shape[-3] != key.shape[-3]
    causal = False
    window: Optional[Window] = None
    mask = attention_mask
    if mask is None:
        causal = L > 1 and (is_causal if is_causal is not None
                            else bool(getattr(module, "is_causal", True)))
    elif mask.dtype == torch.bool and mask.dim() == 4 and mask.shape[1] == 1 \
            and mask.shape[-2:] == (L, S):
        form = _mask_form(mask, L, S)
        if not form.dense:
            if form.keys < S:
                key, value = key[..., :form.keys, :], value[..., :form.keys, :]
            window, mask = form.window, form.padding
    out = scaled_dot_product_attention(query, key, value, mask, 0.0, causal, scaling,
                                       enable_gqa, window=window, softcap=softcap, sinks=s_aux)
    return out.transpose(1, 2).contiguous(), None


register()
