"""ATen ops run on the host by torch eager (``plus.torch_host``): the torch path's graph break.

The torch frontend (:mod:`plus_tvm.torch_host_fallback`) sends here a node whose ATen op has no
converter (neither TVM's torch importer nor plus_tvm's). Such a node becomes

    R.call_pure_packed("plus.torch_host", *tensor_inputs, spec: str)

where ``spec`` is JSON naming the op overload (``aten::i0.default``) with its non-tensor
arguments (tensors appear as ``{"tensor": i}``, the i-th tensor input), the outputs' dtypes and
the node it came from. A call wraps the TVM tensors as torch tensors through DLPack (no copy),
runs the op on the device the VM hands over (the host for a CPU target; on a CUDA target the op
runs with torch's CUDA kernels on the device tensors, on the default stream both use, with no
copy to the host) and hands the outputs back through DLPack: no copy unless an output is not
contiguous or shares memory with an input (then it is copied, so the VM owns what it gets).
Each output's dtype is checked against the one the node was compiled for.

Only deterministic ops that leave their inputs alone are sent here (the call is pure: it can be
merged or removed like any pure call); the compiled model lists them in ``stats["host_nodes"]``.
torch is imported at the first call (:mod:`._torch`): a model without such nodes runs without it.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass

from ..errors import TORCH_HOST_MARKER
from ._torch import require

NAME = "plus.torch_host"

# non-tensor argument kinds a spec carries, by tag (values that JSON holds as they are pass as
# they are: int, bool, str, None)
_DTYPE, _DEVICE, _LAYOUT, _FORMAT, _FLOAT, _TENSOR, _LIST, _TUPLE = (
    "dtype",
    "device",
    "layout",
    "memory_format",
    "float",
    "tensor",
    "list",
    "tuple",
)


@dataclass(frozen=True)
class HostOp:
    """A decoded spec: the op overload, its argument template, output dtypes, where it is."""

    op: object  # torch._ops.OpOverload
    args: object  # the encoded template ({"tensor": i} for the i-th tensor input)
    kwargs: object
    dtypes: tuple[str, ...]
    multiple: bool  # the op returns a tuple (a TVM tuple), else one tensor
    where: str  # "aten::i0.default at node 'i0' (File ...)"


def encode(
    op_name: str,
    args: object,
    kwargs: object,
    dtypes: list[str],
    multiple: bool,
    where: str,
) -> str:
    """The spec string of a host call (``args`` / ``kwargs`` already encoded, see
    :func:`plus_tvm.torch_host_fallback.encode_value`)."""
    spec = {
        "op": op_name,
        "args": args,
        "kwargs": kwargs,
        "dtypes": list(dtypes),
        "multiple": multiple,
        "where": where,
    }
    return json.dumps(spec, sort_keys=True, allow_nan=False)


def _resolve(name: str) -> object:
    """``torch.ops.aten.i0.default`` from ``"aten::i0.default"``."""
    torch = require(f"{NAME} ({name})")
    namespace, _, rest = name.partition("::")
    packet, _, overload = rest.partition(".")
    return getattr(getattr(getattr(torch.ops, namespace), packet), overload or "default")


def _decode_value(value: object, tensors: list) -> object:
    if isinstance(value, dict):
        (tag, inner), *more = value.items()
        if more:
            raise ValueError(f"a spec value has several tags: {sorted(value)}")
        if tag == _TENSOR:
            return tensors[inner]
        if tag in (_LIST, _TUPLE):
            items = [_decode_value(v, tensors) for v in inner]
            return items if tag == _LIST else tuple(items)
        torch = require(NAME)
        if tag == _DTYPE:
            return getattr(torch, inner)
        if tag == _DEVICE:
            return torch.device(inner)
        if tag == _LAYOUT:
            return getattr(torch, inner)
        if tag == _FORMAT:
            return getattr(torch, inner)
        if tag == _FLOAT:
            return float(inner)  # "inf", "-inf", "nan" and every other float, exactly (repr)
        raise ValueError(f"unknown spec tag {tag!r}")
    return value


class _Specs:
    """One decoded :class:`HostOp` per distinct spec string."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._made: dict[str, HostOp] = {}

    def get(self, text: str) -> HostOp:
        with self._lock:
            made = self._made.get(text)
            if made is None:
                spec = json.loads(text)
                made = self._made[text] = HostOp(
                    _resolve(spec["op"]),
                    spec["args"],
                    spec["kwargs"],
                    tuple(spec["dtypes"]),
                    bool(spec["multiple"]),
                    spec["where"],
                )
            return made


_SPECS = _Specs()


def prepared(text: str) -> HostOp:
    """The :class:`HostOp` of a spec, decoded once per process (the frontend decodes it to check
    the op resolves; the calls reuse it)."""
    return _SPECS.get(text)


def _owned(out: object, inputs: list) -> object:
    """``out`` as a tensor the VM may own: contiguous and sharing no memory with an input."""
    if not out.is_contiguous():
        return out.contiguous()
    if out.numel() and any(
        t.numel() and t.untyped_storage().data_ptr() == out.untyped_storage().data_ptr()
        for t in inputs
    ):
        return out.clone()
    return out


def run(*args: object) -> object:
    """``plus.torch_host(*tensors, spec)``: the op's output (one tensor, or a tuple)."""
    import tvm_ffi

    from ._common import to_torch

    *tensors, text = args
    host = prepared(str(text))
    inputs = [to_torch(t) for t in tensors]
    try:
        args = _decode_value(host.args, inputs)
        kwargs = {k: _decode_value(v, inputs) for k, v in host.kwargs.items()}
        out = host.op(*args, **kwargs)
    except Exception as err:  # noqa: BLE001 - an ATen op raises anything on bad values
        why = f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err) else ''}"
        raise RuntimeError(f"torch op {host.where} {TORCH_HOST_MARKER}: {why}") from None
    outs = list(out) if host.multiple else [out]
    results = []
    for i, (value, dtype) in enumerate(zip(outs, host.dtypes)):
        got = str(value.dtype).removeprefix("torch.")
        if got != dtype or len(outs) != len(host.dtypes):
            raise RuntimeError(
                f"torch op {host.where} {TORCH_HOST_MARKER}: output {i} is {got}, compiled "
                f"for {dtype} ({len(outs)} outputs for {len(host.dtypes)})"
            )
        results.append(tvm_ffi.from_dlpack(_owned(value, inputs)))
    return tuple(results) if host.multiple else results[0]


def register() -> None:
    import tvm_ffi

    tvm_ffi.register_global_func(NAME, run, override=True)
