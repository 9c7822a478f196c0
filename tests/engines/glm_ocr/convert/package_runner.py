"""Test-only: run a converted package's source module behind the calls the Core ML runtime
makes (predict(inputs, state), make_state()), checking every call against the package's own
saved spec: input names, shapes (fixed or within the flexible range) and dtypes.

This exercises CoreMLRuntime's glue (names, channels-first layout, float16 casts, padding to
seq_len, state handling, the one-row MTP loop) on Linux. The computation is the channels-first
torch module that was traced and converted (same graph, float32); Core ML's own prediction is
NOT exercised here (see the macOS-only tests)."""

from __future__ import annotations

import numpy as np
import torch

_DTYPES = {65552: np.float16, 65568: np.float32, 131104: np.int32}


class PackageRunner:
    def __init__(self, package_path, module):
        import coremltools as ct

        spec = ct.models.MLModel(str(package_path), skip_model_load=True).get_spec()
        self.inputs = []  # (name, shape, ranges, dtype) in the package's input order
        for feature in spec.description.input:
            array = feature.type.multiArrayType
            ranges = [(r.lowerBound, r.upperBound) for r in array.shapeRange.sizeRanges]
            self.inputs.append((feature.name, list(array.shape), ranges, _DTYPES[array.dataType]))
        self.outputs = [feature.name for feature in spec.description.output]
        self.states = [state.name for state in spec.description.state]
        self.module = module.eval()
        self.calls = 0

    def make_state(self) -> dict:
        return {name: torch.zeros_like(getattr(self.module, name)) for name in self.states}

    def _check(self, data: dict) -> None:
        assert set(data) == {name for name, *_ in self.inputs}, (sorted(data), self.inputs)
        for name, shape, ranges, dtype in self.inputs:
            value = data[name]
            assert isinstance(value, np.ndarray) and value.dtype == dtype, (name, type(value), getattr(value, "dtype", None))
            if ranges:
                assert len(value.shape) == len(ranges) and all(lo <= d <= hi for d, (lo, hi) in zip(value.shape, ranges)), (name, value.shape, ranges)
            else:
                assert list(value.shape) == shape, (name, value.shape, shape)

    @torch.no_grad()
    def predict(self, data: dict, state: dict | None = None) -> dict:
        self._check(data)
        assert (state is not None) == bool(self.states), "stateful packages need their state, others none"
        for name in self.states:
            getattr(self.module, name).copy_(state[name])
        args = [torch.from_numpy(np.asarray(data[name]).astype(np.int32 if dtype == np.int32 else np.float32))
                for name, _, _, dtype in self.inputs]
        result = self.module(*args)
        result = result if isinstance(result, tuple) else (result,)
        for name in self.states:
            state[name].copy_(getattr(self.module, name))
        self.calls += 1
        return {name: value.numpy().astype(np.float16) for name, value in zip(self.outputs, result)}
