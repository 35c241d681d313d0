"""softmax along the last axis, against a plain copy, PyTorch and ONNX Runtime
(each into a new array; the "into" forms write into the same array each
call: fastattn's out=, ONNX Runtime's IO binding)."""
import numpy as np

import fastattn
from fastattn._bench import onnxruntime_softmax

from .common import random, torch_or_skip


class Softmax:
    params = (["fastattn", "fastattn into", "torch", "onnxruntime", "onnxruntime into", "copy"],
              [(16384, 2048), (64, 32768)], [1, 2])
    param_names = ["impl", "shape", "threads"]

    def setup(self, impl, shape, threads):
        self.x = random(shape)
        out = np.zeros_like(self.x)
        if impl == "torch":
            torch = torch_or_skip()
            torch.set_num_threads(threads)
            tx = torch.from_numpy(self.x)
            self.fn = lambda: torch.softmax(tx, dim=-1)
        elif impl.startswith("onnxruntime"):
            self.fn = onnxruntime_softmax(self.x, threads, out if impl.endswith("into") else None)
            if self.fn is None:
                raise NotImplementedError("ONNX Runtime is not installed")
        elif impl == "copy":
            self.fn = self.x.copy
        else:
            fastattn.set_num_threads(threads)
            o = out if impl.endswith("into") else None
            self.fn = lambda: fastattn.softmax(self.x, axis=-1, out=o)

    def teardown(self, *args):
        fastattn.set_num_threads(None)

    def time_softmax(self, *args):
        self.fn()


class SoftmaxSmallCall:
    """Per-call cost of softmax on one short row (Python overhead in view)."""

    params = [["fastattn", "torch"]]
    param_names = ["impl"]

    def setup(self, impl):
        self.x = random((1, 64))
        if impl == "torch":
            tx = torch_or_skip().from_numpy(self.x)
            self.fn = lambda: torch_or_skip().softmax(tx, dim=-1)
        else:
            self.fn = lambda: fastattn.softmax(self.x)

    def time_softmax_small(self, impl):
        self.fn()
