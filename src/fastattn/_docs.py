"""Docstring fragments that several public functions share, and fill() to place them.

A public function's docstring holds ``{name}`` where a fragment goes;
``@fill(name=FRAGMENT)`` replaces it once, at import, so that ``help()``, the
API pages and the doctests all read the finished text. Each fragment is
written at the indentation of the place it fills.
"""
from typing import Any, Callable, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


def fill(**fragments: str) -> Callable[[F], F]:
    """A decorator that replaces each ``{name}`` in the function's docstring
    with ``fragments[name]`` (applied under any wrapper, so that the wrapper
    copies the finished docstring)."""
    def apply(func: F) -> F:
        doc = func.__doc__ or ""
        for name, text in fragments.items():
            doc = doc.replace("{" + name + "}", text)
        func.__doc__ = doc
        return func
    return apply


# softmax, log_softmax and logsumexp: Raises and Notes.
ROWWISE_RAISES = """
    TypeError
        If `x` is not of a real floating dtype or is a ``numpy.ma.MaskedArray``
        (its mask would be ignored), `axis` is not an int, `keepdims`
        (logsumexp) is not a bool, `out` is not a float32 ndarray, or a
        keyword is unknown (PyTorch's ``dim=`` gets a message that says
        ``axis=``).
    numpy.exceptions.AxisError
        If `axis` is out of range or `x` is 0-d.
    ValueError
        If `out` has the wrong shape, is not C-contiguous, writeable or
        aligned, or shares memory with `x`."""

ROWWISE_NOTES = """
    With ``m = max(x)`` over each slice along `axis` (never overflows, at any
    magnitude; the largest entry gets a finite weight):
    ``softmax = exp(x - m) / sum(exp(x - m))``,
    ``log_softmax = (x - m) - log(sum(exp(x - m)))``,
    ``logsumexp = m + log(sum(exp(x - m)))``.
    Non-finite values follow IEEE arithmetic on that formula, as PyTorch and
    ``scipy.special`` do: a NaN makes its whole slice NaN; a +inf makes the
    softmax and log_softmax slice NaN and logsumexp +inf (scipy's log_softmax
    alone differs there: NaN at the +inf entries, -inf at the others); -inf
    entries next to a finite one get weight exactly 0 (log_softmax -inf); an
    all -inf slice gives softmax NaN, log_softmax NaN, logsumexp -inf. An
    empty slice gives logsumexp -inf.

    The computation is float32 with float64 sums; each element is within a few
    float32 ulps of the float64 value. "At any magnitude" means any float32:
    a float64 input is converted to float32 first, so a value beyond
    ``finfo(float32).max`` (about 3.4e38) becomes +-inf and the rules for
    non-finite values apply to it. The slices are split over OpenMP
    threads; results do not depend on the thread count. Time O(x.size), no
    working memory beyond a contiguous copy when `x` is not C-contiguous
    float32 or `axis` is not the last.
"""

# scaled_dot_product_attention and attention_weights: the score rules (Notes).
ATTENTION_RULES = """
    Scores, in this order: ``s_ij = scale * (q_i . k_j)``; with `softcap`
    ``c``, ``s_ij = c * tanh(s_ij / c)``; with `alibi_slopes`,
    ``s_ij -= slope * |p_i - j|``; plus ``attn_mask[..., i, j]`` for a float
    mask. Query row ``i`` sits at key position ``p_i = i + S - L``
    (bottom-right alignment, as in FlashAttention >= 2.1 and MLX: the last
    query lines up with the last key). Key ``j`` is allowed for query ``i``
    iff the bool mask is True there, ``j <= p_i`` when `is_causal`,
    ``p_i - left <= j <= p_i + right`` for ``window=(left, right)`` (None =
    unbounded), and ``q_ids[..., i] == kv_ids[..., j]`` for
    ``segment_ids=(q_ids, kv_ids)``; the constraints intersect. A float mask
    entry of -inf masks its key exactly like a bool False.

    Weights are the softmax of the allowed scores (Vaswani et al. 2017).
    A key whose score is -inf (not allowed, float-masked, or a -inf product)
    gets weight exactly 0 and its rows of k's scores and v are never used, so
    NaN or inf there cannot change the result. Per row, with m the max of the
    allowed scores: no allowed key, or m = -inf, gives an output row of 0 and
    lse -inf (never NaN); a NaN among the allowed scores gives a NaN row (lse
    NaN); m = +inf gives a NaN row and lse +inf.

    With `sinks`, each row's softmax has one more key, of score ``sink`` (its
    head's value) and value 0 (gpt-oss, ONNX Runtime's ``head_sink``):
    ``w_ij = exp(s_ij) / (exp(sink) + sum_j' exp(s_ij'))`` and
    ``lse_i = log(exp(sink) + sum_j exp(s_ij))``, so a row's weights sum to
    less than 1. A row with no allowed key gives 0 and lse = sink; a sink of
    -inf is no sink; a NaN sink gives a NaN row; a +inf sink takes all the
    weight (an output row of 0, lse +inf), unless an allowed score is +inf or
    NaN too (a NaN row).

    The kernels compute in float32 (dot products accumulated in float32,
    sums of weights in float64) and keep the scores in natural units: a
    finite score stays finite, so a row whose allowed scores all equal a huge
    value such as ``np.finfo(np.float32).min`` (Hugging Face's padding
    sentinel) gets equal weights and a finite lse, as float32 arithmetic on
    the formula gives. float16 and bfloat16 elements of k and v are
    converted to float32 exactly, where the kernels read them (once per
    element and tile), so a result is bitwise that of the same call on
    ``k.astype(np.float32)`` and ``v.astype(np.float32)``. A score whose exact value exceeds the float32 range
    (about 3.4e38, e.g. ``q . k`` of entries near 1e20) becomes +-inf and the
    rules above apply, where the float64 reference still has a finite score.
    Likewise each row's weighted sum of v is accumulated before the division
    by the sum of the weights (the online softmax of FlashAttention): where
    that sum, ``sum_j exp(s_ij - m) * v_j``, exceeds the float32 range (values
    near 1e37 and above on many keys of similar weight) the output is +-inf
    although the exact average of v's rows is finite.
    ALiBi distances ``|p_i - j|`` are exact below 2**24; ``tanh`` is within
    4 float32 ulps.
"""
