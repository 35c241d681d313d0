"""tools/ab_compare.py, the A/B harness against a baseline tree: its cases
compute (a case that raised in both trees would compare only the exception's
type) and its comparison sees a difference in any bit.

Skipped where tools/ is not at hand (the installed wheel tested from outside
the source tree).
"""
import importlib.util
from pathlib import Path

import numpy as np
import pytest

TOOL = Path(__file__).resolve().parent.parent / "tools" / "ab_compare.py"
pytestmark = pytest.mark.skipif(not TOOL.exists(), reason="tools/ab_compare.py is not at hand")


@pytest.fixture(scope="module")
def ab():
    spec = importlib.util.spec_from_file_location("ab_compare", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_case_computes_and_every_error_case_raises(ab, threads):
    threads(1)
    computed, raised = [], []
    for family, name, fn in ab.cases():
        try:
            fn(ab.Gen(name))
        except ab.Absent as exc:  # an optional package only: the functions are all here
            assert str(exc) in ("ml_dtypes", "dask"), (family, name)
        except Exception as exc:
            raised.append((family, name, type(exc).__name__))
        else:
            computed.append((family, name))
    assert all(family == "errors" for family, _, _ in raised), raised
    assert not [c for c in computed if c[0] == "errors"]
    assert len(computed) > 200  # (the catalogue holds some 260 computing cases)


def record(*arrays):
    found = [np.asarray(a) for a in arrays]
    npz = {f"a{i}": np.ascontiguousarray(a).reshape(-1).view(np.uint8) for i, a in enumerate(found)}
    rec = {"status": "ok", "sig": "tuple",
           "arrays": [[f"a{i}", str(a.dtype), list(a.shape)] for i, a in enumerate(found)]}
    return rec, npz


def test_compare_sees_every_bit(ab):
    x = np.array([1.0, np.nan, -0.0], np.float32)
    other_nan = x.copy()
    other_nan.view(np.uint32)[1] += 1  # another NaN payload
    plus_zero = x.copy()
    plus_zero[2] = 0.0
    (b, barr), (n, narr) = record(x), record(x.copy())
    assert ab.compare(b, n, barr, narr) is None
    for y in (other_nan, plus_zero, x.astype(np.float64), x.reshape(3, 1), x[:2]):
        (b, barr), (n, narr) = record(x), record(y)
        assert ab.compare(b, n, barr, narr) is not None, y
    raises = {"status": "raises", "error": "ValueError"}
    assert ab.compare(raises, dict(raises), {}, {}) is None
    assert ab.compare(raises, {"status": "raises", "error": "TypeError"}, {}, {}) is not None
    assert ab.compare(raises, record(x)[0], {}, record(x)[1]) is not None
