"""A compiled model's signature: its inputs (:class:`InputSpec`), the valid values of index inputs
(:class:`IndexRange`), and the checks a call's arrays must pass before anything runs.

Plain data with no dependency on TVM's compiler: a deployed model (:func:`plus_tvm.load` with TVM's
runtime library alone) reads it from the model's json and checks inputs with it. The compiler side
fills it in from the IRModule (:func:`plus_tvm.compiler.input_specs`,
:mod:`plus_tvm.index_inputs`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np

from .errors import InputError

#: the function every compiled executable carries that returns its signature as JSON
#: (:func:`signature_text`): what ``plus_tvm.load`` compares the model's json with
SIGNATURE_FUNCTION = "plus_signature"


def signature_text(specs: list[InputSpec], num_params: int) -> str:
    """The signature a compiled executable carries: its inputs and its weight count."""
    data = {"inputs": [s.to_dict() for s in specs], "num_params": int(num_params)}
    return json.dumps(data, sort_keys=True)


@dataclass(frozen=True)
class IndexRange:
    """The values an index input may take, and the use that limits them."""

    low: int
    high: int
    use: str  # e.g. "indices of take along axis 0 of a (1000, 64) tensor"

    def to_dict(self) -> dict[str, object]:
        return {"low": self.low, "high": self.high, "use": self.use}

    @classmethod
    def from_dict(cls, data: dict) -> IndexRange:
        return cls(int(data["low"]), int(data["high"]), str(data["use"]))


@dataclass(frozen=True)
class InputSpec:
    """One model input: name, dtype, shape and, for index inputs, the valid values.

    ``shape`` holds ints (static dims), strings (symbolic dims, equal wherever they repeat) and
    ``None`` (a dim of unknown size); ``shape`` itself is ``None`` when even the rank is unknown.
    """

    name: str
    shape: tuple[int | str | None, ...] | None
    dtype: str
    index_range: IndexRange | None = None
    # (symbolic dim, lowest, highest size) the model was compiled for (None: no bound)
    sizes: tuple[tuple[str, int | None, int | None], ...] = ()

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {
            "name": self.name,
            "shape": None if self.shape is None else list(self.shape),
            "dtype": self.dtype,
        }
        if self.index_range is not None:
            out["index_range"] = self.index_range.to_dict()
        if self.sizes:
            out["sizes"] = [list(s) for s in self.sizes]
        return out

    @classmethod
    def from_dict(cls, data: dict) -> InputSpec:
        shape = data.get("shape")
        rng = data.get("index_range")
        return cls(
            str(data["name"]),
            None if shape is None else tuple(shape),
            str(data["dtype"]),
            IndexRange.from_dict(rng) if rng else None,
            tuple((str(n), lo, hi) for n, lo, hi in data.get("sizes", ())),
        )


_ANY_DTYPE = frozenset(("None", "void", ""))  # an input whose dtype the model leaves open


def check_inputs(specs: list[InputSpec], inputs: tuple) -> list:
    """Validate ``inputs`` against ``specs``; returns them as C-ordered numpy arrays, except
    a torch tensor on an accelerator, which stays where it is (contiguous): a CUDA model takes
    it without a round trip through the host."""
    if len(inputs) != len(specs):
        names = ", ".join(s.name for s in specs)
        raise InputError(f"model takes {len(specs)} input(s) ({names}), got {len(inputs)}")
    arrays = []
    bound: dict[str, int] = {}
    for spec, value in zip(specs, inputs):
        on_device = is_device_tensor(value)
        try:
            arr = value.detach() if on_device else as_numpy(value)
        except (TypeError, ValueError, RuntimeError) as err:
            raise InputError(f"input {spec.name}: not an array ({err})") from None
        dtype = dtype_name(arr)
        if spec.dtype not in _ANY_DTYPE and dtype != spec.dtype:
            raise InputError(f"input {spec.name}: expected dtype {spec.dtype}, got {dtype}")
        if spec.shape is not None:
            _check_shape(spec, arr, bound)
        if spec.index_range is not None and math.prod(arr.shape):
            _check_range(spec, arr)
        # (np.asarray keeps 0-d arrays 0-d)
        arrays.append(arr.contiguous() if on_device else np.asarray(arr, order="C"))
    return arrays


def is_device_tensor(value: object) -> bool:
    """A torch tensor that is not in host memory (CUDA, or torch's shape-only ``meta``)."""
    device = getattr(value, "device", None)
    return hasattr(value, "detach") and getattr(device, "type", "cpu") != "cpu"


def dtype_name(arr: object) -> str:
    """The element type's name, numpy's or torch's (``float32``, ``bfloat16``, ``int64``)."""
    dtype = arr.dtype
    if isinstance(dtype, np.dtype):
        return dtype.name  # (numpy's str() of a dtype costs 2 us: once per input and call)
    return str(dtype).removeprefix("torch.")


def bfloat16_view(array: np.ndarray) -> object:
    """An ml_dtypes bfloat16 array as a torch bfloat16 tensor on the same memory (no copy)."""
    import torch

    return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)


def as_numpy(value: object) -> np.ndarray:
    """``value`` (numpy array, torch tensor, TVM tensor, nested list) as a numpy array."""
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "detach") and hasattr(value, "cpu"):  # torch tensor
        tensor = value.detach().cpu()
        if str(tensor.dtype) == "torch.bfloat16":  # numpy has no bfloat16: ml_dtypes' (TVM's)
            import ml_dtypes
            import torch  # (loaded already: value is a torch tensor)

            return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        return tensor.numpy()
    if hasattr(value, "numpy") and callable(value.numpy):  # tvm.runtime.Tensor
        return value.numpy()
    return np.asarray(value)


def _check_shape(spec: InputSpec, arr: np.ndarray, bound: dict[str, int]) -> None:
    def wrong() -> InputError:
        return InputError(
            f"input {spec.name}: expected shape {_shape(spec.shape)}, got {tuple(arr.shape)}"
        )

    if arr.ndim != len(spec.shape):
        raise wrong()
    for dim, size in zip(spec.shape, arr.shape):
        if isinstance(dim, int) and dim != size:
            raise wrong()
        if isinstance(dim, str) and bound.setdefault(dim, size) != size:
            raise InputError(
                f"input {spec.name}: symbolic dim {dim} is {size} here but {bound[dim]} in an "
                "earlier input"
            )
    if not spec.sizes:
        return
    limits = {name: (low, high) for name, low, high in spec.sizes}
    for axis, (dim, size) in enumerate(zip(spec.shape, arr.shape)):
        if isinstance(dim, str) and dim in limits:
            name, (low, high) = dim, limits[dim]
            if not ((low is None or size >= low) and (high is None or size <= high)):
                raise InputError(
                    f"input {spec.name}: axis {axis} ({name}) is {size}, but the model was "
                    f"compiled for {name} in {low if low is not None else 0}.."
                    f"{high if high is not None else 'any'} (the Dim's min and max at export)"
                )


def _check_range(spec: InputSpec, arr: object) -> None:
    rng = spec.index_range
    low, high = int(arr.min()), int(arr.max())  # (on a device tensor: there, then one sync)
    if low >= rng.low and high <= rng.high:
        return
    arr = as_numpy(arr)  # an error: where, read on the host
    bad = low if low < rng.low else high
    where = tuple(int(i) for i in np.argwhere(arr == bad)[0])
    raise InputError(
        f"input {spec.name}: value {int(bad)} at {where} is out of range: the valid values "
        f"are {rng.low}..{rng.high} ({rng.use})"
    )


def _shape(dims: tuple) -> str:
    return "(" + ", ".join("?" if d is None else str(d) for d in dims) + ")"
