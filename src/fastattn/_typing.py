"""Type aliases of fastattn's public signatures (for annotations only)."""
from typing import Optional, Tuple, Union

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = ["ArrayLike", "Float32Array", "WithLse", "AttentionResult", "Window", "SegmentIds"]

Float32Array = NDArray[np.float32]
"""Every result: a C-contiguous float32 NumPy array."""
WithLse = Tuple[Float32Array, Float32Array]
"""``(out, lse)``, as ``return_lse=True`` gives."""
AttentionResult = Union[Float32Array, WithLse]
Window = Optional[Tuple[Optional[int], Optional[int]]]
"""``(left, right)``, each side an int >= 0 or None (unbounded)."""
SegmentIds = Optional[Union[ArrayLike, Tuple[ArrayLike, ArrayLike]]]
"""``(q_ids, kv_ids)``, or one array when L == S."""
