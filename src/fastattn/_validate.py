"""Argument checks and conversions shared by fastattn's API and its reference.

Everything here is pure Python/NumPy and runs before any kernel: the dtype
policy, axis normalisation, `out=` rules, and the shape rules of attention
(broadcasting, grouped-query heads, masks, scale, window). Each error names the
argument, what was seen and what was expected (the rules are stated in the
user guide, docs/user_guide.rst).
"""
import functools
import inspect
import math
import numbers
import operator
import sys
from typing import (Any, Callable, Iterable, List, NamedTuple, Optional, Sequence, Tuple,
                    TypeVar, cast)

import numpy as np

from fastattn import _core
from fastattn._quant import QuantizedArray

try:  # numpy >= 1.25
    from numpy.exceptions import AxisError, TooHardError
except ImportError:  # pragma: no cover - older numpy
    from numpy import AxisError, TooHardError  # type: ignore[attr-defined,no-redef]

_FLOAT32_MAX = float(np.finfo(np.float32).max)

F = TypeVar("F", bound=Callable[..., Any])

# Keywords of other libraries' attention and softmax functions that fastattn
# names otherwise or does not have: (the argument it corresponds to, or None,
# what to pass instead). A hint is given only where the function has that
# argument (or the keyword names nothing fastattn has at all).
_MASK = ("attn_mask", "fastattn's name is attn_mask, as PyTorch's: a bool mask (True = may "
                      "attend) or a float mask added to the scores")
_FOREIGN_KEYWORDS = {
    "dropout_p": (None, "fastattn has no dropout: leave dropout_p out (fastattn.torch's "
                        "scaled_dot_product_attention and fastattn.flash_attn's functions take "
                        "dropout_p=0.0, the signatures of PyTorch and FlashAttention)"),
    "dim": ("axis", "NumPy's name for it is axis: pass axis="),
    "keepdim": ("keepdims", "NumPy's name for it is keepdims: pass keepdims="),
    "causal": ("is_causal", "fastattn's name is is_causal, as PyTorch's: pass is_causal="),
    "softmax_scale": ("scale", "fastattn's name is scale, as PyTorch's: pass scale="),
    "window_size": ("window", "fastattn takes window=(left, right), each side an int >= 0 or "
                              "None for unbounded (FlashAttention's -1); "
                              "sliding_window_attention(q, k, v, window_size) takes a window "
                              "size"),
    "sliding_window": ("window", "pass window=(sliding_window - 1, 0), or call "
                                 "sliding_window_attention(q, k, v, sliding_window)"),
    "attention_mask": _MASK, "mask": _MASK, "attn_bias": _MASK,
    "logits_soft_cap": ("softcap", "fastattn's name is softcap: pass softcap="),
    "soft_cap": ("softcap", "fastattn's name is softcap: pass softcap="),
    "return_softmax_lse": ("return_lse", "pass return_lse=True"),
    "return_attn_probs": ("return_lse", "pass return_lse=True for the lse; "
                                        "attention_weights(q, k, ...) gives the weights"),
}
# causal_attention's own: it has no is_causal to take.
CAUSAL_KEYWORDS = dict(_FOREIGN_KEYWORDS, is_causal=(
    None, "causal_attention is causal by definition: leave is_causal out, or call "
          "scaled_dot_product_attention(..., is_causal=...)"))
# The same for fastattn.flash_attn, whose functions take FlashAttention's names:
# fastattn's and PyTorch's names there.
FLASH_ATTN_KEYWORDS = {
    "is_causal": ("causal", "FlashAttention's name is causal: pass causal="),
    "scale": ("softmax_scale", "FlashAttention's name is softmax_scale: pass softmax_scale="),
    "window": ("window_size", "FlashAttention's name is window_size, with -1 for an "
                              "unbounded side: pass window_size=(left, right)"),
    "enable_gqa": (None, "grouped-query attention follows from the head counts (k's heads "
                         "dividing q's): leave enable_gqa out"),
    "return_lse": ("return_softmax_lse", "pass return_softmax_lse=True"),
    "attn_mask": (None, "FlashAttention's API takes no mask: use causal, window_size, "
                        "cache_leftpad or packed sequences (cu_seqlens), or "
                        "fastattn.scaled_dot_product_attention(q, k, v, attn_mask)"),
}


def foreign_keywords(func: Optional[F] = None, *, hints: Optional[dict] = None) -> Any:
    """`func`, whose TypeError for an unexpected keyword says what to pass
    instead when the keyword is another library's name for one of its
    arguments (`hints`: name -> (that argument or None, message); default
    PyTorch's dim, FlashAttention's causal, dropout_p, ...).

    A function whose last parameter is ``**_foreign`` takes such keywords
    itself and calls ``reject_foreign(func, _foreign)`` when it got any: it
    is returned as it is, with a signature that leaves ``_foreign`` out, so
    that its calls pay for no wrapper (a Python frame costs a few tenths of a
    microsecond, a tenth of the smallest call's time). Any other `func` is
    wrapped: only an error of the call's own binding is reworded (one raised
    before `func` ran: its traceback holds no frame of `func`); the
    signature, docstring and annotations stay `func`'s."""
    if func is None:  # (used as @foreign_keywords(hints=...))
        return functools.partial(foreign_keywords, hints=hints)
    table = _FOREIGN_KEYWORDS if hints is None else hints
    sig = inspect.signature(func)
    last = list(sig.parameters.values())[-1:]
    if last and last[0].kind is inspect.Parameter.VAR_KEYWORD and last[0].name == "_foreign":
        setattr(func, "__signature__", sig.replace(parameters=list(sig.parameters.values())[:-1]))
        setattr(func, "_foreign_hints", table)
        return func

    @functools.wraps(func)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except TypeError as exc:
            tb = exc.__traceback__
            if tb is None or tb.tb_next is not None or not kwargs:
                raise
            _hint(func, kwargs, table)
            raise
    return cast(F, call)


def _hint(func: Any, keywords: Any, table: dict) -> None:
    """Raises the TypeError with a hint for the first of `keywords` that
    `func` does not take and `table` knows; returns if none."""
    params = inspect.signature(func).parameters
    for name in keywords:
        target, hint = table.get(name, ("", ""))
        if name not in params and hint and (target is None or target in params):
            raise TypeError(f"{func.__name__}() got an unexpected keyword argument "
                            f"{name!r}: {hint}") from None


def reject_foreign(func: Any, foreign: dict) -> None:
    """The TypeError for the keywords a ``**_foreign`` function of
    foreign_keywords got: with a hint where one applies, else Python's own
    message for an unexpected keyword."""
    _hint(func, foreign, getattr(func, "_foreign_hints", _FOREIGN_KEYWORDS))
    raise TypeError(f"{func.__name__}() got an unexpected keyword argument "
                    f"{next(iter(foreign))!r}")


def is_bfloat16(dtype):
    """True for ml_dtypes' bfloat16 (NumPy's bfloat16 type, as JAX uses). A
    bfloat16 array exists only once ml_dtypes is imported, so it is never
    imported here."""
    if dtype.kind != "V" or dtype.name != "bfloat16":
        return False
    ml_dtypes = sys.modules.get("ml_dtypes")
    return ml_dtypes is not None and dtype == ml_dtypes.bfloat16


def is_masked_array(x: Any) -> bool:
    """True for a numpy.ma.MaskedArray. NumPy imports numpy.ma lazily (tens of
    milliseconds, paid by the first attention call otherwise); no masked array
    can exist before it is imported, so it is only looked up, never imported."""
    ma = sys.modules.get("numpy.ma")
    return ma is not None and isinstance(x, ma.MaskedArray)


def index(value: Any) -> int:
    """``index(value)``, the one reading of every int argument; a 0-d
    ``numpy.ma.MaskedArray`` is refused (TypeError) like every masked array:
    its mask would be ignored."""
    if is_masked_array(value):
        raise TypeError("a masked array is not an int")
    return operator.index(value)


def _is_torch_tensor(x: Any) -> bool:
    return type(x).__module__.split(".")[0] == "torch" and hasattr(x, "requires_grad")


def as_array(x: Any, name: str) -> np.ndarray:
    """`x` as a NumPy array, without a copy where its library allows.

    Takes anything NumPy takes (``__array__``, the buffer protocol,
    ``__array_interface__``), objects with only ``__dlpack__``, and PyTorch CPU
    tensors, bfloat16 ones included (as an ``ml_dtypes.bfloat16`` view of the
    same memory). A tensor that requires grad is refused with a message naming
    the argument: the NumPy functions record nothing for autograd, so it must
    be detached (fastattn.torch's function is the differentiable one).
    A ``numpy.ma.MaskedArray`` is refused (TypeError): its mask would be
    ignored, so that masked entries would count as data.
    """
    if isinstance(x, QuantizedArray):  # (np.asarray would dequantize it silently)
        raise TypeError(f"{name} is a QuantizedArray ({x.format}): quantized arrays are taken "
                        f"for k and v only; pass {name}.dequantize()")
    if isinstance(x, np.ndarray):
        if is_masked_array(x):
            raise TypeError(f"{name} must be a plain array, not a masked array (its mask would "
                            f"be ignored): pass numpy.ma.filled({name}, value), or express the "
                            f"masked positions with attn_mask")
        return x
    if _is_torch_tensor(x):
        if x.requires_grad:
            raise TypeError(f"{name} is a torch tensor that requires grad; fastattn's NumPy "
                            f"functions record nothing for autograd: pass {name}.detach(), or "
                            f"use fastattn.torch.scaled_dot_product_attention, which is "
                            f"differentiable")
        if x.device.type != "cpu":
            raise TypeError(f"{name} is a torch tensor on {x.device}; fastattn runs on the "
                            f"CPU: pass {name}.cpu()")
        if str(x.dtype) == "torch.bfloat16":
            try:
                import ml_dtypes
            except ImportError:
                raise TypeError(f"{name} is a bfloat16 torch tensor, which NumPy reads "
                                f"through the ml_dtypes package: pip install ml_dtypes, or "
                                f"pass {name}.float()") from None
            import torch
            return x.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    elif (hasattr(x, "__dlpack__") and not hasattr(x, "__array__")
          and not hasattr(x, "__array_interface__")):
        try:
            return np.from_dlpack(x)
        except (TypeError, ValueError, RuntimeError, BufferError) as exc:
            raise TypeError(f"{name}: NumPy cannot read this array through DLPack: {exc}; "
                            f"pass a CPU array") from None
    try:
        return np.asarray(x)
    except (TypeError, ValueError, RuntimeError) as exc:  # e.g. a ragged nested list
        raise TypeError(f"{name} must be an array (anything numpy.asarray takes): {exc}") from None


def is_half(dtype):
    """True for the half-precision dtypes attention reads in place as k and v."""
    return dtype == np.float16 or is_bfloat16(dtype)


def _real_array(x, name):
    """`x` as an ndarray of a real floating dtype (bfloat16 included); TypeError else."""
    arr = as_array(x, name)
    if arr.dtype.kind != "f" and not is_bfloat16(arr.dtype):
        raise TypeError(
            f"{name} must have a real floating dtype (float16, bfloat16, float32 or float64), "
            f"got {arr.dtype}"
        )
    return arr


def aligned(arr: np.ndarray) -> np.ndarray:
    """`arr` (C-contiguous) itself when its elements lie at addresses that are
    multiples of their size, else an aligned copy: the kernels take arrays as
    typed C pointers, which must be aligned. NumPy's conversions keep a
    misaligned array as it is (``np.frombuffer(buf, np.float32, offset=1)``, a
    field of a packed record), so every array handed to the kernels whole
    passes through here (those read in place row by row: rows_in_place)."""
    return arr if arr.flags.aligned else np.array(arr, order="C")


def to_float32(arr, order="C"):
    """arr (a real floating array) as float32, no copy when it is one already:
    the one conversion of every float input. Values beyond float32's range
    become +-inf, as the cast makes them, with no RuntimeWarning (a float64
    mask of -1e300 is -inf; data that overflows follows the non-finite rules,
    and a masked key's value is never read at all)."""
    with np.errstate(over="ignore"):
        return np.asarray(arr, dtype=np.float32, order=order)


def as_float32(x, name):
    """`x` as an aligned C-contiguous float32 array; no copy when it already is one.

    Raises TypeError unless `x` converts to a real floating dtype (float16,
    bfloat16, float32, float64: converted to float32).
    """
    return aligned(to_float32(_real_array(x, name)))


def rows_in_place(arr):
    """True when the kernels can read `arr` where it lies: each row (the last
    axis) contiguous and aligned, every stride a whole number of elements."""
    if arr.flags.c_contiguous and arr.flags.aligned:
        return True
    if arr.ndim == 0 or not arr.flags.aligned:
        return False
    size = arr.itemsize
    if arr.shape[-1] > 1 and arr.strides[-1] != size:
        return False
    return all(st % size == 0 or n == 1 for n, st in zip(arr.shape, arr.strides))


def as_rows(x, name, half=False):
    """`x` for attention: float32 (with `half`, float16 and bfloat16 are kept
    as they are, for k and v, and a QuantizedArray too), read in place when
    its rows are contiguous (any other strides), else copied once into a
    C-contiguous array."""
    if isinstance(x, QuantizedArray):
        if not half:
            raise TypeError(f"{name} must be a float array, got a QuantizedArray ({x.format}): "
                            f"quantized arrays are taken for k and v only; pass "
                            f"{name}.dequantize()")
        if x.ndim < 2:
            raise ValueError(f"{name} must have at least 2 dimensions (..., rows, features), "
                             f"got shape {x.shape}")
        # the kernels count its strides in whole blocks
        size = x.block_bytes
        if all(st % size == 0 or n == 1
               for n, st in zip(x.blocks.shape[:-1], x.blocks.strides[:-1])):
            return x
        return x.copy()
    arr = _real_array(x, name)
    if arr.dtype != np.float32 and not (half and is_half(arr.dtype)):
        return to_float32(arr)
    # (np.array copies: ascontiguousarray would hand back a misaligned C-contiguous array)
    return arr if rows_in_place(arr) else np.array(arr, order="C")


def as_bool(value: Any, name: str) -> bool:
    """A Python bool from a bool or numpy.bool_; TypeError for anything else."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise TypeError(f"{name} must be a bool, got {type(value).__name__}")


def compact_broadcast(arr: Any) -> Any:
    """`arr` with each broadcast (stride-0) axis cut to length 1: what a view
    from numpy.broadcast_to holds, at its own size. It broadcasts back to
    `arr`'s shape, so a later C-contiguous copy stays small."""
    if not isinstance(arr, np.ndarray) or arr.size == 0 or arr.ndim == 0:
        return arr  # (indexing a 0-d array with () would give its scalar)
    index = tuple(slice(0, 1) if st == 0 and n > 1 else slice(None)
                  for n, st in zip(arr.shape, arr.strides))
    return arr[index]


def normalize_axis(axis: Any, ndim: int) -> int:
    """`axis` as an index in [0, ndim); AxisError when out of range or ndim == 0."""
    if isinstance(axis, (bool, np.bool_)):
        raise TypeError(f"axis must be an int, got {type(axis).__name__}")
    try:
        axis = index(axis)
    except TypeError:
        raise TypeError(f"axis must be an int, got {type(axis).__name__}") from None
    if not -ndim <= axis < ndim:
        raise AxisError(axis, ndim)
    return axis % ndim


def shares_memory(a: Any, b: Any) -> bool:
    """True when arrays a and b may overlap (an undecidable case counts as overlap)."""
    if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)):
        return False
    if not np.may_share_memory(a, b):
        return False
    try:
        return bool(np.shares_memory(a, b, max_work=100_000))  # type: ignore[arg-type]
    except TooHardError:
        return True


def _arrays_in(name: str, value: Any) -> Iterable[Tuple[str, np.ndarray]]:
    """(name, ndarray) for the memory `value` holds as the caller gave it: an
    ndarray itself; the items of a list or tuple as ``name[i]``; nothing for
    None, scalars and strings; anything else as the NumPy view of its memory
    that fastattn's conversion reads (a torch tensor, ``__array_interface__``,
    ``__dlpack__``, the buffer protocol as of ``array.array`` or
    ``bytearray``, ``__array__`` as of pandas), except a lazy collection
    (Dask's: converting it would compute it again; it holds no memory of its
    own to overlap)."""
    if isinstance(value, np.ndarray):
        yield name, value
    elif isinstance(value, QuantizedArray):  # (its bytes, not a dequantized copy)
        yield name, value.blocks
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from _arrays_in(f"{name}[{i}]", item)
    elif (value is not None and not isinstance(value, (numbers.Number, str, bytes))
          and not hasattr(value, "__dask_graph__")):
        try:
            arr = as_array(value, name)
        except (TypeError, ValueError, BufferError):  # (not an array: nothing to overlap)
            return
        if arr.dtype != object:
            yield name, arr


def new_array(shape: Sequence[int], what: str, dtype: Any = np.float32,
              fill: Optional[float] = None) -> np.ndarray:
    """A new C-contiguous array of `shape` for a result (`fill`: its value, else
    uninitialised: from 4 MiB on, on memory that earlier results gave back,
    see _core.result_array). ValueError naming `what` and the shape when its
    size is beyond what this platform can address (NumPy's own message names
    neither), MemoryError naming them when the memory cannot be had."""
    shape = tuple(int(n) for n in shape)
    nbytes = math.prod(shape) * np.dtype(dtype).itemsize
    if nbytes > sys.maxsize:
        raise ValueError(f"{what} of shape {shape} would take {nbytes} bytes, more than this "
                         f"platform can address")
    try:
        if fill is None and nbytes >= _core.RESULT_MIN_BYTES:
            kept = _core.result_array(shape, dtype, nbytes)
            return np.empty(shape, dtype) if kept is None else kept
        if fill is None:
            return np.empty(shape, dtype)
        return np.full(shape, fill, dtype)
    except MemoryError:
        raise MemoryError(f"{what} of shape {shape} ({nbytes / 2**30:.3g} GiB) could not be "
                          f"allocated") from None


def result_array(out: Any, shape: Sequence[int], inputs: Iterable[Tuple[str, Any]]) -> np.ndarray:
    """The array a call writes its result into: `out` once check_out has
    passed it (`inputs`: the call's arguments, named), else a new float32
    array of `shape`."""
    if out is None:
        return new_array(shape, "the output")
    check_out(out, shape, inputs)
    return out


def check_out(out: Any, shape: Sequence[int], inputs: Iterable[Tuple[str, Any]]) -> None:
    """Check an `out=` array before anything is written: a writeable, C-contiguous
    float32 ndarray of exactly `shape`, overlapping no input.

    `inputs` are (name, value) pairs: every argument of the call as the caller
    gave it (arrays, tensors, sequences of them, scalars, None; see
    _arrays_in), and the arrays fastattn converted them to. `out` may overlap
    none of them: a caller's array that fastattn read through a converted copy
    would otherwise be overwritten behind its back.
    """
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out must be a numpy.ndarray, got {type(out).__name__}")
    if isinstance(out, (np.matrix, np.ma.MaskedArray)):  # (its mask would hide the result)
        raise TypeError(f"out must be a numpy.ndarray, not a {type(out).__name__} (np.matrix "
                        f"stays 2-d when reshaped; a masked array's mask would hide the "
                        f"result)")
    if out.dtype != np.float32:
        raise TypeError(f"out must have dtype float32, got {out.dtype} (nothing is cast into out)")
    if out.shape != tuple(shape):
        raise ValueError(f"out must have shape {tuple(shape)}, got {out.shape}")
    if not out.flags.c_contiguous:
        raise ValueError("out must be C-contiguous")
    if not out.flags.writeable:
        raise ValueError("out must be writeable")
    if not out.flags.aligned:
        raise ValueError(f"out must be aligned (its address a multiple of 4 bytes), got an "
                         f"array at address {out.ctypes.data:#x}")
    for name, value in inputs:
        for item, arr in _arrays_in(name, value):
            if shares_memory(out, arr):
                raise ValueError(f"out must not share memory with {item}")


def check_scale(scale: Any, D: int) -> float:
    """The score scale: 1/sqrt(D) for None, else a finite real number."""
    if scale is None:
        return 1.0 / math.sqrt(D)
    if isinstance(scale, (bool, np.bool_)) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale must be a real number or None, got {type(scale).__name__}")
    try:
        value = float(scale)
    except OverflowError:  # an int beyond float64's range
        value = math.inf
    if not math.isfinite(value) or abs(value) > _FLOAT32_MAX:
        raise ValueError(f"scale must be finite (in float32), got {scale!r}")
    return value


def check_softcap(softcap: Any) -> float:
    """The soft cap: 0.0 for None (off), else a finite float > 0 (as float32)."""
    if softcap is None:
        return 0.0
    if isinstance(softcap, (bool, np.bool_)) or not isinstance(softcap, numbers.Real):
        raise TypeError(f"softcap must be a real number > 0 or None, got "
                        f"{type(softcap).__name__}")
    try:
        value = float(softcap)
    except OverflowError:  # an int beyond float64's range
        value = math.inf
    if not math.isfinite(value) or value <= 0 or abs(value) > _FLOAT32_MAX:
        raise ValueError(f"softcap must be a finite number > 0 (in float32) or None, "
                         f"got {softcap!r}")
    value32 = float(np.float32(value))
    if value32 < float(np.finfo(np.float32).tiny):
        raise ValueError(f"softcap must be at least {np.finfo(np.float32).tiny} (the "
                         f"smallest normal float32), got {softcap!r}")
    return value32


def per_head(value: Any, name: str, head_shape: Sequence[int], batch: Sequence[int],
             finite: bool, target: str = "q.shape[:-2]") -> Optional[np.ndarray]:
    """`value` (None, or real floats broadcasting to `head_shape`, which is
    `target`) as a C-contiguous float32 array of shape `batch`, or None."""
    if value is None:
        return None
    arr = _real_array(value, name)  # (the dtype rule of every float input: bfloat16 too)
    head_shape = tuple(head_shape)
    try:
        ok = np.broadcast_shapes(arr.shape, head_shape) == head_shape
    except ValueError:
        ok = False
    if not ok:
        forms = (f"{head_shape}" if len(head_shape) < 2
                 else f"{head_shape[-1:]} or {head_shape}")
        raise ValueError(f"{name} of shape {arr.shape} does not broadcast to {target} = "
                         f"{head_shape} (one value per query head, e.g. shape {forms})")
    arr32 = to_float32(arr, order="K")
    if finite and not np.isfinite(arr32).all():
        bad = arr[~np.isfinite(arr32)].reshape(-1)[0]
        raise ValueError(f"{name} must be finite (in float32), got {float(bad)!r}")
    # (np.asarray, not np.ascontiguousarray, which makes a 0-d array 1-d)
    return np.asarray(np.broadcast_to(np.broadcast_to(arr32, head_shape), batch), order="C")


class SegmentIds(NamedTuple):
    """Validated segment ids: int64 arrays broadcasting to batch + (L,) and
    batch + (S,), unbroadcast, and whether every key id row is non-decreasing."""

    q: np.ndarray
    kv: np.ndarray
    sorted: bool


def _ids(arr: np.ndarray, name: str, target: Tuple[int, ...]) -> np.ndarray:
    """Ids read by int_array, checked and as int64 broadcasting to `target`."""
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{name} must have an integer dtype, got {arr.dtype}")
    try:
        ok = np.broadcast_shapes(arr.shape, target) == target
    except ValueError:
        ok = False
    if not ok:
        hint = ""
        if 2 <= arr.ndim < len(target) and arr.shape[0] == target[0]:
            # (B, L) ids for a (B, H) batch: NumPy aligns axes from the right
            axes = ", ".join([":"] + ["None"] * (len(target) - arr.ndim) + [":"] * (arr.ndim - 1))
            hint = (f" (the leading axes broadcast from the right, as in NumPy: ids of one "
                    f"batch item for all its heads need the head axis, e.g. ids[{axes}] of "
                    f"shape {arr.shape[:1] + (1,) * (len(target) - arr.ndim) + arr.shape[1:]})")
        raise ValueError(f"{name} of shape {arr.shape} does not broadcast to {target}{hint}")
    # A private copy (of the ids at their own size): the kernels bisect key ids
    # checked to be sorted, with the GIL released, so no other thread may
    # rewrite them meanwhile.
    arr = compact_broadcast(arr)
    if arr.dtype == np.uint64:  # reinterpreted: equal ids stay equal, different ones differ
        return np.array(arr, order="C").view(np.int64)
    return np.array(arr, dtype=np.int64, order="C")


def segment_pair(segment_ids: Any, L: int, S: int) -> Tuple[Any, Any]:
    """(q_ids, kv_ids) from `segment_ids` (not None): a pair is a tuple, and only
    a tuple; anything else (a list, nested or not, an array) is one array of
    ids serving queries and keys, which needs L == S. A list of two lists is
    the ids of a batch of two, as NumPy reads it, never a pair."""
    if isinstance(segment_ids, tuple):
        if len(segment_ids) != 2:
            raise ValueError(f"segment_ids must be one integer array or a pair (q_ids, "
                             f"kv_ids) as a tuple, got a tuple of length {len(segment_ids)}")
        return segment_ids
    if L != S:
        raise ValueError(f"one segment_ids array serves queries and keys only when L == S, "
                         f"got L={L}, S={S}: pass a tuple (q_ids, kv_ids)")
    return segment_ids, segment_ids


def check_segment_ids(segment_ids: Any, batch: Sequence[int], L: int,
                      S: int) -> Optional[SegmentIds]:
    """SegmentIds from `segment_ids`: None, a tuple (q_ids, kv_ids), or one
    integer array serving both when L == S (see segment_pair)."""
    if segment_ids is None:
        return None
    q_ids, kv_ids = segment_pair(segment_ids, L, S)
    names = ("segment_ids[0] (q_ids)", "segment_ids[1] (kv_ids)") \
        if q_ids is not kv_ids else ("segment_ids", "segment_ids")
    qa = int_array(q_ids, names[0])
    ka = qa if kv_ids is q_ids else int_array(kv_ids, names[1])
    q = _ids(qa, names[0], tuple(batch) + (L,))
    kv = q if ka is qa else _ids(ka, names[1], tuple(batch) + (S,))
    if ka is not qa:
        if (_past_int64(qa) or _past_int64(ka)) and "i" in (qa.dtype.kind, ka.dtype.kind):
            # uint64 ids of 2**63 or more against signed ids: _ids'
            # reinterpretation would make 2**63 equal to -2**63; their ranks
            # among all the ids compare (and order) as the values do
            both = np.concatenate([qa.reshape(-1).astype(object), ka.reshape(-1).astype(object)])
            rank = np.unique(both, return_inverse=True)[1].reshape(-1).astype(np.int64)
            q = _ids(rank[:qa.size].reshape(qa.shape), names[0], tuple(batch) + (L,))
            kv = _ids(rank[qa.size:].reshape(ka.shape), names[1], tuple(batch) + (S,))
    ordered = kv.ndim == 0 or kv.shape[-1] <= 1 or bool(np.all(kv[..., 1:] >= kv[..., :-1]))
    return SegmentIds(q=q, kv=kv, sorted=ordered)


def _window_side(value: Any, side: str) -> Optional[int]:
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)):
        raise ValueError(f"window's {side} bound must be an int >= 0 or None, got {value!r}")
    try:
        value = index(value)
    except TypeError:
        raise ValueError(
            f"window's {side} bound must be an int >= 0 or None, got {value!r}"
        ) from None
    if value < 0:
        raise ValueError(f"window's {side} bound must be >= 0 or None, got {value}"
                         + (" (FlashAttention's -1 for an unbounded side is None here)"
                            if value == -1 else ""))
    return value


def check_window(window: Any, span: Optional[int] = None) -> Tuple[Optional[int], Optional[int]]:
    """(left, right) from `window`, each an int >= 0 or None (unbounded).

    With `span` (more than any distance between a query's position and a key,
    e.g. L + S) a side beyond it is cut to `span`: it allows the same keys,
    and every position computed from it stays within int64 (a side such as
    sys.maxsize or 2**70 would wrap or overflow there)."""
    if window is None:
        return None, None
    if not isinstance(window, (tuple, list)) or len(window) != 2:
        raise ValueError(f"window must be None or a pair (left, right), got {window!r}")
    sides = (_window_side(window[0], "left"), _window_side(window[1], "right"))
    if span is None:
        return sides
    return tuple(None if side is None else min(side, span) for side in sides)  # type: ignore


def check_window_size(window_size: Any) -> Tuple[int, int]:
    """`window=(window_size - 1, 0)` for sliding_window_attention."""
    if isinstance(window_size, (bool, np.bool_)):
        raise ValueError(f"window_size must be an int >= 1, got {window_size!r}")
    try:
        window_size = index(window_size)
    except TypeError:
        raise ValueError(f"window_size must be an int >= 1, got {window_size!r}") from None
    if window_size < 1:
        raise ValueError(f"window_size must be an int >= 1, got {window_size}")
    return (window_size - 1, 0)


def _broadcast(shapes: Sequence[Tuple[int, ...]], what: str, hint: str = "") -> Tuple[int, ...]:
    if all(s == shapes[0] for s in shapes):  # the common case, without numpy's overhead
        return tuple(shapes[0])
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        raise ValueError(
            f"the leading (batch) dimensions of {what} do not broadcast: "
            + ", ".join(str(s) for s in shapes) + hint
        ) from None


def _gqa_hint(arrays: List[np.ndarray]) -> str:
    """A hint for leading dims that fail to broadcast because the query and kv
    head counts (axis -3) differ: that is grouped-query attention."""
    if len(arrays) < 2 or min(a.ndim for a in arrays) < 3:
        return ""
    Hq, Hkv = arrays[0].shape[-3], arrays[1].shape[-3]
    if Hq == Hkv or Hkv <= 1:
        return ""
    if Hq % Hkv == 0:
        return (f"; q has {Hq} heads and k {Hkv} (axis -3): pass enable_gqa=True for "
                f"grouped-query attention (query head h reads kv head h // {Hq // Hkv})")
    return (f"; q has {Hq} heads and k {Hkv} (axis -3): grouped-query attention "
            f"(enable_gqa=True) needs q's heads to be a multiple of k's")


class AttentionInputs(NamedTuple):
    """Validated attention arguments, unbroadcast. q is float32, k and v float32,
    float16 or bfloat16, each with contiguous rows (other strides any, as the
    caller gave them); the mask is C-contiguous."""

    q: np.ndarray
    k: np.ndarray
    v: Optional[np.ndarray]
    mask: Optional[np.ndarray]  # bool or float32
    batch: Tuple[int, ...]      # leading dims of the result
    L: int
    S: int
    D: int
    Dv: int
    scale: float
    is_causal: bool
    window: Tuple[Optional[int], Optional[int]]
    group: int                  # query heads per kv head (1 without GQA)
    softcap: float = 0.0        # 0: off
    alibi_slopes: Optional[np.ndarray] = None  # float32, shape batch
    sinks: Optional[np.ndarray] = None         # float32, shape batch
    segments: Optional[SegmentIds] = None

    def arrays(self) -> List[Tuple[str, Any]]:
        """(name, array) of the converted arrays the kernels read, for check_out."""
        seg = self.segments
        return [("q", self.q), ("k", self.k), ("v", self.v), ("attn_mask", self.mask),
                ("alibi_slopes", self.alibi_slopes), ("sinks", self.sinks),
                ("segment_ids", None if seg is None else (seg.q, seg.kv))]


def attention_inputs(q: Any, k: Any, v: Any, attn_mask: Any, is_causal: Any, window: Any,
                     scale: Any, enable_gqa: Any, with_v: bool = True, softcap: Any = None,
                     alibi_slopes: Any = None, sinks: Any = None,
                     segment_ids: Any = None) -> "AttentionInputs":
    """Validate and convert the arguments of SDPA (with_v=False: attention_weights)."""
    names = ("q", "k", "v") if with_v else ("q", "k")
    arrays = [as_rows(x, name, half=name != "q") for x, name in zip((q, k, v), names)]
    for arr, name in zip(arrays, names):
        if arr.ndim < 2:
            raise ValueError(f"{name} must have at least 2 dimensions (..., rows, features), "
                             f"got shape {arr.shape}")
    q, k = arrays[:2]
    v = arrays[2] if with_v else None
    L, D = q.shape[-2:]
    S = k.shape[-2]
    if D < 1:
        raise ValueError(f"q must have D >= 1 features (last dimension), got shape {q.shape}")
    if k.shape[-1] != D:
        raise ValueError(f"k's last dimension must equal q's D={D}, got k shape {k.shape}")
    if v is not None and v.shape[-2] != S:
        raise ValueError(f"v must have as many rows as k (S={S}), got v shape {v.shape}")
    Dv = v.shape[-1] if v is not None else 0
    is_causal = as_bool(is_causal, "is_causal")
    enable_gqa = as_bool(enable_gqa, "enable_gqa")
    group = 1
    if enable_gqa:
        for arr, name in zip(arrays, names):
            if arr.ndim < 3:
                raise ValueError(f"with enable_gqa=True, {name} must have a head axis "
                                 f"(..., heads, rows, features), got shape {arr.shape}")
        Hq, Hkv = q.shape[-3], k.shape[-3]
        if v is not None and v.shape[-3] != Hkv:
            raise ValueError(f"with enable_gqa=True, k and v must have the same number of "
                             f"heads, got k {k.shape} and v {v.shape}")
        if Hkv < 1:
            raise ValueError(f"with enable_gqa=True, k and v must have at least one head "
                             f"(axis -3), got k shape {k.shape}")
        if Hq % Hkv != 0:
            raise ValueError(f"with enable_gqa=True, q's number of heads must be a multiple of "
                             f"k's (each kv head serves Hq // Hkv query heads): got {Hq} query "
                             f"heads and {Hkv} kv heads (axis -3 of q {q.shape} and k {k.shape})")
        group = max(1, Hq // Hkv)  # Hq = 0: an empty result
        batch = _broadcast([a.shape[:-3] for a in arrays], "/".join(names)) + (Hq,)
    else:
        batch = _broadcast([a.shape[:-2] for a in arrays], "/".join(names), _gqa_hint(arrays))
    mask = None
    if attn_mask is not None:
        if is_masked_array(attn_mask):
            raise TypeError("attn_mask must be a plain bool or float array, not a masked array")
        mask = as_array(attn_mask, "attn_mask")
        if mask.dtype != np.bool_ and mask.dtype.kind != "f" and not is_bfloat16(mask.dtype):
            raise TypeError(f"attn_mask must be a bool or real floating array, got dtype "
                            f"{mask.dtype}")
        target = batch + (L, S)
        try:  # (the shape as given: a broadcast view's is checked, not its compact form)
            ok = np.broadcast_shapes(mask.shape, target) == target
        except ValueError:
            ok = False
        if not ok:
            raise ValueError(f"attn_mask of shape {mask.shape} does not broadcast to "
                             f"(..., L, S) = {target}")
        mask = compact_broadcast(mask)
        if mask.dtype == np.bool_:
            mask = aligned(np.ascontiguousarray(mask))
        else:
            mask = aligned(np.ascontiguousarray(to_float32(mask, order="K")))
    window = check_window(window, L + S)
    return AttentionInputs(
        q=q, k=k, v=v, mask=mask, batch=batch, L=L, S=S, D=D, Dv=Dv,
        scale=check_scale(scale, D), is_causal=is_causal, window=window, group=group,
        softcap=check_softcap(softcap),
        alibi_slopes=per_head(alibi_slopes, "alibi_slopes", q.shape[:-2], batch, True),
        sinks=per_head(sinks, "sinks", q.shape[:-2], batch, False),
        segments=check_segment_ids(segment_ids, batch, L, S),
    )


def merge_inputs(outs, lses):
    """Validate and convert the partials of merge_attention.

    `outs` and `lses` are each a sequence of arrays or one array whose first axis
    indexes the partials. Returns (outs, lses, shape): lists of C-contiguous
    float32 arrays (no copy of those that already are) and the shape of one
    output partial, (..., L, Dv).
    """
    def split(x, name):
        if x is None or not (isinstance(x, (list, tuple)) or hasattr(x, "__array__")
                             or hasattr(x, "__array_interface__") or hasattr(x, "__dlpack__")):
            # (a generator or None would reach NumPy as a 0-d object array)
            raise TypeError(f"{name} must be a list or tuple of arrays or one array with the "
                            f"partials on its first axis, got {type(x).__name__}")
        if isinstance(x, (list, tuple)):
            return [as_float32(part, f"{name}[{p}]") for p, part in enumerate(x)], None
        arr = as_float32(x, name)
        if arr.ndim < 1:
            raise ValueError(f"{name} must be a sequence of arrays or one array with the "
                             f"partials on its first axis, got a 0-d array")
        return list(arr), arr.shape[1:]

    outs, o_shape = split(outs, "outs")
    lses, l_shape = split(lses, "lses")
    if len(outs) != len(lses):
        raise ValueError(f"outs and lses must hold as many partials, got {len(outs)} and "
                         f"{len(lses)}")
    if o_shape is None:
        if not outs:
            raise ValueError("outs must hold at least one partial (or be one array with a "
                             "partials axis of length 0)")
        o_shape = outs[0].shape
    if len(o_shape) < 2:
        raise ValueError(f"each partial output must have shape (..., L, Dv), got {o_shape}")
    for p, part in enumerate(outs):
        if part.shape != o_shape:
            raise ValueError(f"outs[{p}] has shape {part.shape}, expected {o_shape} "
                             f"(the shape of outs[0]; partials must agree exactly)")
    for p, part in enumerate(lses):
        if part.shape != o_shape[:-1]:
            raise ValueError(f"lses[{p}] has shape {part.shape}, expected {o_shape[:-1]} "
                             f"(the partial outputs' shape {o_shape} without its last axis)")
    if not lses and l_shape is not None and l_shape != o_shape[:-1]:  # no partial, but the shapes still must agree
        raise ValueError(f"lses has partials of shape {l_shape}, expected {o_shape[:-1]} "
                         f"(the partial outputs' shape {o_shape} without its last axis)")
    return outs, lses, tuple(o_shape)


# ----------------------------------------------------------------------------
# The attention backward


def _output_like(x: Any, name: str, shape: Tuple[int, ...], what: str) -> np.ndarray:
    """`x` (do, o or lse of the backward) as float32, checked to have exactly
    `shape` (`what` says which shape that is) before any conversion copies it:
    with contiguous rows (as_rows, as q), lse C-contiguous (as_float32; it is
    small, one value per row)."""
    arr = _real_array(x, name)
    if arr.shape != shape:
        raise ValueError(f"{name} must have shape {what} = {shape}, got shape {arr.shape}")
    return as_float32(arr, name) if name == "lse" else as_rows(arr, name)


def _not_quantized(k: Any, v: Any) -> None:
    """The backward differentiates float arrays: a QuantizedArray k or v
    (whose gradient would be of its dequantized values) is refused."""
    for x, name in ((k, "k"), (v, "v")):
        if isinstance(x, QuantizedArray):
            raise TypeError(f"{name} is a QuantizedArray ({x.format}): the backward takes "
                            f"float k and v only (gradients of quantized values are not "
                            f"defined here); pass {name}.dequantize()")


class BackwardInputs(NamedTuple):
    """Validated arguments of attention_backward: `a` those of the forward
    (attention_inputs: q, k, v, mask, options, the broadcast batch); do and o
    float32 of shape ``a.batch + (a.L, a.Dv)``, each with contiguous rows
    (other strides any), and lse float32 C-contiguous of shape
    ``a.batch + (a.L,)``; and the shapes of the arguments as given, which
    the gradients are summed back to (fastattn._grad.sum_to_shape)."""

    a: AttentionInputs
    do: np.ndarray
    o: np.ndarray
    lse: np.ndarray
    q_shape: Tuple[int, ...]
    k_shape: Tuple[int, ...]
    v_shape: Tuple[int, ...]
    sinks_shape: Optional[Tuple[int, ...]]  # None without sinks


def _sinks_shape(sinks: Any) -> Optional[Tuple[int, ...]]:
    """The shape of `sinks` as given (already checked by per_head), or None."""
    return None if sinks is None else tuple(_real_array(sinks, "sinks").shape)


def backward_inputs(do: Any, q: Any, k: Any, v: Any, o: Any, lse: Any, attn_mask: Any,
                    is_causal: Any, window: Any, scale: Any, enable_gqa: Any,
                    softcap: Any = None, alibi_slopes: Any = None, sinks: Any = None,
                    segment_ids: Any = None) -> BackwardInputs:
    """Validate and convert the arguments of attention_backward: those of the
    forward as attention_inputs checks them, then do and o, which must have
    exactly the output's shape ``batch + (L, Dv)``, and lse exactly
    ``batch + (L,)`` (what ``return_lse=True`` gave): no broadcasting, since
    they are per row of that output. Any real floating dtype (converted to
    float32, as q)."""
    _not_quantized(k, v)
    a = attention_inputs(q, k, v, attn_mask, is_causal, window, scale, enable_gqa,
                         softcap=softcap, alibi_slopes=alibi_slopes, sinks=sinks,
                         segment_ids=segment_ids)
    assert a.v is not None
    shape = a.batch + (a.L, a.Dv)
    return BackwardInputs(
        a=a,
        do=_output_like(do, "do", shape, "batch + (L, Dv), the output's"),
        o=_output_like(o, "o", shape, "batch + (L, Dv), the output's"),
        lse=_output_like(lse, "lse", a.batch + (a.L,), "batch + (L,), the forward's lse"),
        q_shape=a.q.shape, k_shape=a.k.shape, v_shape=a.v.shape,
        sinks_shape=_sinks_shape(sinks),
    )


# ----------------------------------------------------------------------------
# Packed variable-length batches


def int_array(x: Any, name: str) -> np.ndarray:
    """`x` as a NumPy integer array in its own dtype (TypeError otherwise).
    Python ints that no one NumPy integer dtype holds (NumPy makes them float64
    or object) are read as uint64 where they are all in [0, 2**64); otherwise
    ValueError names the first that is not."""
    if is_masked_array(x):
        raise TypeError(f"{name} must be a plain integer array, not a masked array")
    try:
        arr = np.asarray(x)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be an integer array: {exc}") from None
    if arr.size == 0 and arr.dtype.kind == "f" and not isinstance(x, np.ndarray):
        return arr.astype(np.int64)  # ([] is float64 to NumPy: no value to say otherwise)
    if arr.dtype.kind in "fO" and arr.size and not isinstance(x, np.ndarray):
        items = np.asarray(x, dtype=object)
        flat = items.ravel()
        if all(isinstance(v, (int, np.integer)) for v in flat):
            out = [i for i, v in enumerate(flat) if not 0 <= int(v) < 2**64]
            if out:
                raise ValueError(f"{name} must hold 64-bit integers (int64, or uint64 when "
                                 f"all are >= 0), got {int(flat[out[0]])} at index {out[0]}")
            arr = items.astype(np.uint64)
    return arr


def _past_int64(arr: np.ndarray) -> bool:
    """True if `arr` is uint64 with a value of 2**63 or more."""
    return arr.dtype == np.uint64 and arr.size > 0 and int(arr.max()) >= 2**63


def index_int64(arr: np.ndarray, name: str) -> np.ndarray:
    """An integer array from int_array as int64: ValueError for a uint64 value
    of 2**63 or more (named, not wrapped to a negative number)."""
    if _past_int64(arr):
        i = int(np.argmax(arr.reshape(-1) >= np.uint64(2**63)))
        raise ValueError(f"{name} must hold integers below 2**63, got "
                         f"{int(arr.reshape(-1)[i])} at flat index {i}")
    return arr.astype(np.int64)


def check_cu_seqlens(cu: Any, name: str, total: int, what: str) -> np.ndarray:
    """`cu` as a new int64 array (never the caller's): 1-d integers from 0,
    non-decreasing, ending at `total` (the packed length `what`)."""
    # A private copy first, checked and returned: the kernels read the offsets
    # with the GIL released, and another thread could rewrite a caller's array
    # between a check and the call.
    arr = np.array(int_array(cu, name), copy=True)
    if arr.ndim == 1 and arr.shape[0] == 0:  # (before the dtype: [] is float64)
        raise ValueError(f"{name} must be a 1-d array of B + 1 >= 1 offsets, got shape (0,)")
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{name} must be a 1-d integer array, got dtype {arr.dtype}")
    if arr.ndim != 1 or arr.shape[0] < 1:
        raise ValueError(f"{name} must be a 1-d array of B + 1 >= 1 offsets, got shape "
                         f"{arr.shape}")
    if int(arr[0]) != 0:
        raise ValueError(f"{name} must start at 0, got {int(arr[0])}")
    down = arr[1:] < arr[:-1]  # (in arr's own dtype: exact, no wrap-around)
    if down.any():
        i = int(down.argmax())
        raise ValueError(f"{name} must be non-decreasing, got {int(arr[i])} then "
                         f"{int(arr[i + 1])} at index {i}")
    if int(arr[-1]) != total:
        raise ValueError(f"{name} must end at {what} = {total}, got {int(arr[-1])}")
    return aligned(np.ascontiguousarray(arr, dtype=np.int64))


class VarlenInputs(NamedTuple):
    """Validated arguments of varlen_attention: q (total_q, Hq, D), k and v
    (total_k, Hkv, D / Dv) with contiguous rows, cu_q and cu_k (B + 1,)."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    cu_q: np.ndarray
    cu_k: np.ndarray
    B: int
    Hq: int
    Hkv: int
    D: int
    Dv: int
    scale: float
    is_causal: bool
    window: Tuple[Optional[int], Optional[int]]
    softcap: float
    alibi_slopes: Optional[np.ndarray]  # float32 (B, Hq)
    sinks: Optional[np.ndarray]         # float32 (B, Hq)

    def arrays(self) -> List[Tuple[str, Any]]:
        """(name, array) of the converted arrays the kernels read, for check_out."""
        return [("q", self.q), ("k", self.k), ("v", self.v), ("cu_seqlens_q", self.cu_q),
                ("cu_seqlens_k", self.cu_k), ("alibi_slopes", self.alibi_slopes),
                ("sinks", self.sinks)]


def varlen_inputs(q: Any, k: Any, v: Any, cu_seqlens_q: Any, cu_seqlens_k: Any, is_causal: Any,
                  window: Any, scale: Any, softcap: Any, alibi_slopes: Any,
                  sinks: Any) -> VarlenInputs:
    """Validate and convert the arguments of varlen_attention."""
    q = as_rows(q, "q")
    k = as_rows(k, "k", half=True)
    v = as_rows(v, "v", half=True)
    for arr, name, rows in ((q, "q", "total_q"), (k, "k", "total_k"), (v, "v", "total_k")):
        if arr.ndim != 3:
            raise ValueError(f"{name} must have 3 dimensions ({rows}, heads, features) "
                             f"(packed sequences), got shape {arr.shape}")
    total_q, Hq, D = q.shape
    total_k, Hkv = k.shape[:2]
    if D < 1:
        raise ValueError(f"q must have D >= 1 features (last dimension), got shape {q.shape}")
    if k.shape[2] != D:
        raise ValueError(f"k's last dimension must equal q's D={D}, got k shape {k.shape}")
    if v.shape[:2] != (total_k, Hkv):
        raise ValueError(f"v must have k's total_k={total_k} rows and Hkv={Hkv} heads, got v "
                         f"shape {v.shape}")
    if Hkv < 1 or Hq % Hkv != 0:
        raise ValueError(f"q's heads ({Hq}) must be a multiple of k's heads ({Hkv} >= 1)")
    cu_q = check_cu_seqlens(cu_seqlens_q, "cu_seqlens_q", total_q, "total_q (q.shape[0])")
    cu_k = check_cu_seqlens(cu_seqlens_k, "cu_seqlens_k", total_k, "total_k (k.shape[0])")
    if cu_q.shape != cu_k.shape:
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k must have the same length B + 1, got "
                         f"{cu_q.shape[0]} and {cu_k.shape[0]}")
    B = cu_q.shape[0] - 1
    heads = (B, Hq)
    window = check_window(window, total_q + total_k)
    return VarlenInputs(
        q=q, k=k, v=v, cu_q=cu_q, cu_k=cu_k, B=B, Hq=Hq, Hkv=Hkv, D=D, Dv=v.shape[2],
        scale=check_scale(scale, D), is_causal=as_bool(is_causal, "is_causal"),
        window=window, softcap=check_softcap(softcap),
        alibi_slopes=per_head(alibi_slopes, "alibi_slopes", heads, heads, True, "(B, Hq)"),
        sinks=per_head(sinks, "sinks", heads, heads, False, "(B, Hq)"),
    )


class VarlenBackwardInputs(NamedTuple):
    """Validated arguments of varlen_attention_backward: `a` those of the
    forward (varlen_inputs), do and o float32 (total_q, Hq, Dv) with
    contiguous rows, lse float32 C-contiguous (total_q, Hq), and the shape of
    sinks as given (None without), which dsinks is summed back to."""

    a: VarlenInputs
    do: np.ndarray
    o: np.ndarray
    lse: np.ndarray
    sinks_shape: Optional[Tuple[int, ...]]


def varlen_backward_inputs(do: Any, q: Any, k: Any, v: Any, o: Any, lse: Any,
                           cu_seqlens_q: Any, cu_seqlens_k: Any, is_causal: Any, window: Any,
                           scale: Any, softcap: Any, alibi_slopes: Any,
                           sinks: Any) -> VarlenBackwardInputs:
    """Validate and convert the arguments of varlen_attention_backward: those
    of varlen_attention, then do and o of exactly the output's shape
    (total_q, Hq, Dv) and lse of exactly (total_q, Hq)."""
    _not_quantized(k, v)
    a = varlen_inputs(q, k, v, cu_seqlens_q, cu_seqlens_k, is_causal, window, scale, softcap,
                      alibi_slopes, sinks)
    total_q = a.q.shape[0]
    shape = (total_q, a.Hq, a.Dv)
    return VarlenBackwardInputs(
        a=a,
        do=_output_like(do, "do", shape, "(total_q, Hq, Dv), the output's"),
        o=_output_like(o, "o", shape, "(total_q, Hq, Dv), the output's"),
        lse=_output_like(lse, "lse", (total_q, a.Hq), "(total_q, Hq), the forward's lse"),
        sinks_shape=_sinks_shape(sinks),
    )


# ----------------------------------------------------------------------------
# A paged KV cache (fastattn.flash_attn's flash_attn_with_kvcache)

class PagedInputs(NamedTuple):
    """Validated arguments of attention over a paged KV cache: q (B, Hq, L, D)
    float32, k and v the caches (num_pages, block_size, Hkv, D / Dv) as
    stored, each with contiguous rows; table (B, max_pages) a private int64
    copy of the block table whose first pages cover S keys. The score options
    that the paged form does not take are off."""

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    table: np.ndarray
    B: int
    Hq: int
    L: int
    S: int
    D: int
    Dv: int
    block_size: int
    num_pages: int
    group: int                  # query heads per kv head
    scale: float
    is_causal: bool
    window: Tuple[Optional[int], Optional[int]]
    softcap: float = 0.0
    alibi_slopes: Optional[np.ndarray] = None
    sinks: Optional[np.ndarray] = None


def paged_inputs(q: Any, k_cache: Any, v_cache: Any, block_table: Any, seqlen: Any,
                 is_causal: Any, window: Any, scale: Any, page_multiple: int) -> PagedInputs:
    """Validate and convert the arguments of attention over a paged KV cache:
    every batch item's keys are the first `seqlen` rows of its pages, key
    ``j`` row ``j % block_size`` of page ``block_table[b, j // block_size]``,
    block_size a multiple of `page_multiple` (the kernels' key tile)."""
    q = as_rows(q, "q")
    k_cache = as_rows(k_cache, "k_cache", half=True)
    v_cache = as_rows(v_cache, "v_cache", half=True)
    if q.ndim != 4 or k_cache.ndim != 4 or v_cache.ndim != 4:
        raise ValueError(f"q, k_cache, v_cache must be 4-d, got {q.shape}, {k_cache.shape}, "
                         f"{v_cache.shape}")
    B, Hq, L, D = q.shape
    P, bs, Hkv, Dk = k_cache.shape
    Dv = v_cache.shape[-1]
    if Dk != D or v_cache.shape[:3] != (P, bs, Hkv):
        raise ValueError(f"k_cache {k_cache.shape} and v_cache {v_cache.shape} do not match "
                         f"q {q.shape}")
    if Hkv < 1 or Hq % Hkv != 0:
        raise ValueError(f"q's heads ({Hq}) must be a multiple of the cache's ({Hkv})")
    if bs % page_multiple != 0:
        raise ValueError(f"block_size must be a multiple of {page_multiple}, got {bs}")
    # (a private copy: the kernels read it with the GIL released, after the
    # checks below, so no other thread may rewrite it meanwhile)
    table = np.array(block_table, dtype=np.int64, order="C")
    S = int(seqlen)
    pages = -(-S // bs)
    if table.ndim != 2 or table.shape[0] != B or table.shape[1] < pages or S < 0:
        raise ValueError(f"block_table of shape {table.shape} does not cover {S} keys of "
                         f"{B} sequences in pages of {bs}")
    used = table[:, :pages]
    if used.size and (used.min() < 0 or used.max() >= P):
        raise ValueError(f"block_table points outside the cache's {P} pages")
    window = check_window(window, L + S)
    return PagedInputs(
        q=q, k=k_cache, v=v_cache, table=table, B=B, Hq=Hq, L=L, S=S, D=D, Dv=Dv,
        block_size=bs, num_pages=P, group=Hq // Hkv, scale=check_scale(scale, D),
        is_causal=as_bool(is_causal, "is_causal"), window=window,
    )
