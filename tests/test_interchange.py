"""Arrays from other libraries: anything NumPy takes through ``__array__`` or
``__dlpack__`` is an input, results are NumPy arrays; PyTorch tensors that
need ``.detach()`` or ``.cpu()`` get a message naming the argument; bfloat16
(torch tensors and ``ml_dtypes.bfloat16`` arrays) is read through ml_dtypes.
The torch and JAX tests skip where those are not installed."""

import numpy as np
import pytest

import fastattn

from conftest import assert_same_bits, randn


class DLPackOnly:
    """An array known to NumPy only through the DLPack protocol."""

    def __init__(self, arr):
        self._arr = arr

    def __dlpack__(self, **kwargs):
        return self._arr.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._arr.__dlpack_device__()


class ArrayOnly:
    """An array-like known to NumPy only through ``__array__``."""

    def __init__(self, arr):
        self._arr = arr

    def __array__(self, dtype=None, copy=None):
        return self._arr if dtype is None else self._arr.astype(dtype)


@pytest.fixture
def qkv(rng):
    return randn(rng, 2, 5, 8), randn(rng, 2, 7, 8), randn(rng, 2, 7, 3)


@pytest.mark.parametrize("wrap", [DLPackOnly, ArrayOnly], ids=["dlpack", "array"])
def test_protocol_inputs(qkv, wrap):
    q, k, v = qkv
    want = fastattn.scaled_dot_product_attention(q, k, v, is_causal=True)
    got = fastattn.scaled_dot_product_attention(wrap(q), wrap(k), wrap(v), is_causal=True)
    assert type(got) is np.ndarray
    assert_same_bits(got, want)
    assert_same_bits(fastattn.softmax(wrap(q)), fastattn.softmax(q))
    mask = np.tril(np.ones((5, 7), bool))
    assert_same_bits(fastattn.scaled_dot_product_attention(q, k, v, wrap(mask)),
                     fastattn.scaled_dot_product_attention(q, k, v, mask))


def test_ml_dtypes_bfloat16_arrays(qkv):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    q, k, v = (x.astype(ml_dtypes.bfloat16) for x in qkv)
    want = fastattn.scaled_dot_product_attention(*(x.astype(np.float32) for x in (q, k, v)))
    assert_same_bits(fastattn.scaled_dot_product_attention(q, k, v), want)
    x = q.astype(np.float32)
    assert_same_bits(fastattn.softmax(q), fastattn.softmax(x))
    mask = np.zeros((5, 7), ml_dtypes.bfloat16)
    assert_same_bits(fastattn.scaled_dot_product_attention(q, k, v, mask), want)


# ------------------------------------------------------------------- torch

@pytest.fixture
def torch():
    return pytest.importorskip("torch")


def test_torch_tensors_in_numpy_out(torch, qkv):
    q, k, v = qkv
    tq, tk, tv = (torch.from_numpy(x) for x in qkv)
    got = fastattn.scaled_dot_product_attention(tq, tk, tv, torch.ones(5, 7, dtype=torch.bool))
    assert type(got) is np.ndarray and got.dtype == np.float32
    assert_same_bits(got, fastattn.scaled_dot_product_attention(q, k, v))
    assert_same_bits(fastattn.log_softmax(tq, axis=0), fastattn.log_softmax(q, axis=0))
    # a (B, L, H, D) tensor viewed as (B, H, L, D), float64, float16
    t = torch.from_numpy(np.ascontiguousarray(q.transpose(1, 0, 2))).transpose(0, 1)
    assert_same_bits(fastattn.softmax(t), fastattn.softmax(q))
    assert_same_bits(fastattn.softmax(tq.double()), fastattn.softmax(q.astype(np.float64)))
    assert_same_bits(fastattn.softmax(tq.half()), fastattn.softmax(q.astype(np.float16)))


@pytest.mark.parametrize("name", ["q", "k", "v", "attn_mask"])
def test_torch_tensor_requiring_grad_is_named(torch, qkv, name):
    args = dict(zip("qkv", (torch.from_numpy(x) for x in qkv)))
    args["attn_mask"] = torch.zeros(5, 7)
    args[name] = args[name].clone().requires_grad_(True)
    with pytest.raises(TypeError, match=rf"^{name} is a torch tensor that requires grad.*"
                                        rf"pass {name}\.detach\(\)"):
        fastattn.scaled_dot_product_attention(**args)
    with pytest.raises(TypeError, match=r"x is a torch tensor that requires grad"):
        fastattn.softmax(torch.zeros(3, requires_grad=True))


def test_torch_bfloat16_tensors(torch, qkv):
    pytest.importorskip("ml_dtypes")
    tq, tk, tv = (torch.from_numpy(x).to(torch.bfloat16) for x in qkv)
    want = fastattn.scaled_dot_product_attention(tq.float(), tk.float(), tv.float())
    got = fastattn.scaled_dot_product_attention(tq, tk, tv, is_causal=False)
    assert type(got) is np.ndarray
    assert_same_bits(got, want)
    # non-contiguous bfloat16 views are read as they are
    t = tq.transpose(-1, -2)
    assert_same_bits(fastattn.softmax(t), fastattn.softmax(t.float()))


def test_torch_bfloat16_without_ml_dtypes_says_what_to_do(torch, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_ml_dtypes(name, *args, **kwargs):
        if name == "ml_dtypes":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ml_dtypes)
    with pytest.raises(TypeError, match=r"x is a bfloat16 torch tensor.*pip install ml_dtypes"):
        fastattn.softmax(torch.zeros(3, dtype=torch.bfloat16))


def test_torch_integer_tensor_is_a_type_error(torch):
    with pytest.raises(TypeError, match=r"^x must have a real floating dtype"):
        fastattn.softmax(torch.zeros(3, dtype=torch.int32))


# --------------------------------------------------------------------- JAX

def test_jax_cpu_arrays(qkv):
    jnp = pytest.importorskip("jax.numpy")
    q, k, v = qkv
    got = fastattn.scaled_dot_product_attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v))
    assert type(got) is np.ndarray
    assert_same_bits(got, fastattn.scaled_dot_product_attention(q, k, v))
    qb = jnp.asarray(q, dtype=jnp.bfloat16)
    assert_same_bits(fastattn.softmax(qb), fastattn.softmax(np.asarray(qb, np.float32)))


def test_flash_attn_takes_torch_tensors(torch, rng):
    from fastattn.flash_attn import flash_attn_func

    q, k, v = (randn(rng, 2, 5, 4, 8) for _ in range(3))   # (B, L, H, D)
    want = flash_attn_func(q, k, v, causal=True)
    got = flash_attn_func(*(torch.from_numpy(x) for x in (q, k, v)), causal=True)
    assert type(got) is np.ndarray
    assert_same_bits(got, want)
    with pytest.raises(TypeError, match=r"^k is a torch tensor that requires grad"):
        flash_attn_func(torch.from_numpy(q), torch.from_numpy(k).requires_grad_(True),
                        torch.from_numpy(v))
