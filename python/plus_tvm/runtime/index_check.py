"""Index bounds checked as the model runs (``plus.check_indices``).

TVM's gather and scatter kernels (``take``, ``gather_elements``, ``gather_nd``,
``scatter_elements``, ``scatter_nd``, ``index_tensor``, ``index_put``) read and write without
bounds checks: an index outside the indexed extent reads neighbouring memory, writes past the
buffer or ends the process. torch and ONNX Runtime raise an error instead. Every such index
operand of a compiled model goes through

    R.call_pure_packed("plus.check_indices", indices, R.shape(extents), config)

(the torch frontend emits it with torch's semantics, the ``CheckIndexBounds`` pass for every
other indexing op), which returns a copy of ``indices`` when every value is in range and
raises otherwise, naming the operator, the node, the offending value and position, and the
model input the index comes from. ``config`` (``key=value;...``):

- ``op``: the operator (``gather``, ``relax.scatter_nd`` ...), ``node``: the node or binding;
- ``neg``: 1 when ``-n..-1`` are valid (they count from the end), else the range is
  ``[0, n)``;
- ``last``: 1 when the last axis holds one coordinate per extent (``gather_nd``: coordinate
  ``j`` of each index tuple against ``extents[j]``), else every value against ``extents[0]``;
- ``input``: the model input the indices are a view of, if any.

A call reads the indices on the host (a view on CPU, no copy). It runs on CPU targets; on GPU
the pass clamps instead (memory-safe without an error: a host check would cut the CUDA graph and
synchronise). With the native library loaded (:mod:`plus_tvm.runtime.native`) the check the VM
calls is its C++ form (``native/index_check.cc``, about 1 us): it returns the copy of indices in
range without entering Python, and hands every other call to :func:`run` below (an index out
of range, whose error this module words; another device or dtype, strided indices, a config it
does not read), so the error is the same either way. Through Python a call costs 30-40 us (the
VM -> Python crossing, the numpy view, the copy made in Python), each decode step of a language
model pays it once per gather of its ids and positions.
"""

from __future__ import annotations

import functools

import numpy as np

from ..errors import INDEX_MARKER

NAME = "plus.check_indices"

_KEYS = ("op", "node", "neg", "last", "input")


def config_text(op: str, node: str, negative: bool, last: bool, source: str = "") -> str:
    """The ``config`` string of a check (no ``;`` or ``=`` inside a value)."""
    values = dict(zip(_KEYS, (op, node, str(int(negative)), str(int(last)), source)))
    return ";".join(f"{k}={str(v).replace(';', ',').replace('=', ':')}" for k, v in values.items())


def parse(text: str) -> dict[str, str]:
    """``config_text``'s fields, by key."""
    return dict(_parsed(str(text)))


@functools.lru_cache(maxsize=1024)
def _parsed(text: str) -> tuple[tuple[str, str], ...]:
    """``parse``'s fields as items, once per config (a check runs at every call of a model:
    each decode step)."""
    fields = dict(part.split("=", 1) for part in str(text).split(";") if "=" in part)
    unknown = set(fields) - set(_KEYS)
    if unknown:
        raise ValueError(f"{NAME}: unknown config keys {sorted(unknown)}")
    return tuple(fields.items())


@functools.lru_cache(maxsize=1024)
def _flags(text: str) -> tuple[bool, bool]:
    """``(neg, last)`` of a config, once per config (the check runs at every decode step)."""
    fields = parse(text)
    return fields.get("neg") == "1", fields.get("last") == "1"


def _in_range(values: np.ndarray, extent: int, negative: bool) -> bool:
    """Every value in ``[0, extent)`` (``[-extent, extent)`` with ``negative``): the common
    case of a check against one extent, two reductions (a decode step's few ids: 2-3 us
    against 10 for :func:`first_out_of_range`'s masks)."""
    if values.size == 0:
        return True
    if values.size <= 64:  # (a few ids: Python's min / max on a list beat two numpy reductions)
        flat = values.ravel().tolist()
        low, high = min(flat), max(flat)
    else:
        low, high = int(values.min()), int(values.max())
    return low >= (-extent if negative else 0) and high < extent


def first_out_of_range(
    values: np.ndarray, extents: list[int], negative: bool, last: bool
) -> tuple[tuple[int, ...], int, int, int] | None:
    """(position, value, low, high) of the first index outside its range, else None."""
    if values.size == 0:
        return None
    high = np.asarray(extents, dtype=np.int64)
    if not last:
        high = high[:1]
    low = -high if negative else np.zeros_like(high)
    bad = (values < low) | (values >= high)
    if not bad.any():
        return None
    pos = tuple(int(p) for p in np.argwhere(bad)[0])
    column = pos[-1] if last else 0
    return pos, int(values[pos]), int(low[column]), int(high[column])


def message(fields: dict[str, str], found: tuple, shape: tuple) -> str:
    pos, value, low, high = found
    where = f"{fields.get('op', '?')} {fields.get('node', '')}".strip()
    source = f" (from input {fields['input']})" if fields.get("input") else ""
    coordinate = f", coordinate {pos[-1]}" if fields.get("last") == "1" else ""
    return (
        f"{INDEX_MARKER}{where}: index {value} at position {list(pos)} of indices of shape "
        f"{list(shape)}{source} is outside [{low}, {high}){coordinate}"
    )


def run(indices: object, extents: object, config: str) -> object:
    """``plus.check_indices(indices, extents, config)``: a copy of ``indices``, or an error.

    A copy, not ``indices`` itself: the VM plans the input's storage as free after its last
    use (this call), so a result aliasing it could be overwritten before the gather reads it.
    """
    import tvm

    negative, last = _flags(config)
    if indices.device.dlpack_device_type() == 1:  # kDLCPU: read in place
        values = np.from_dlpack(indices)
        dtype = str(values.dtype)  # (numpy's name, TVM's too; cheaper than indices.dtype)
    else:
        values = indices.numpy()
        dtype = indices.dtype
    if last or not _in_range(values, int(extents[0]), negative):
        found = first_out_of_range(values, [int(e) for e in extents], negative, last)
        if found is not None:
            raise RuntimeError(message(parse(config), found, values.shape))
    copy = tvm.runtime.empty(values.shape, dtype, indices.device)
    indices.copyto(copy)  # (a device copy: 4 us for a decode step's ids, 14 through numpy)
    return copy


_NATIVE: list = []  # (library, its check with run as fallback), once install_native ran


def install_native(module: object) -> None:
    """Register the native library's check (``module``: the loaded library) as ``NAME``, with
    :func:`run` as its fallback. VMs built from then on call it (a VM resolves the name when
    it is built)."""
    _NATIVE[:] = [module, module["index_check_create"](run)]
    register()


def native_check(fallback: object = None) -> object | None:
    """A native check of its own handing what it does not run to ``fallback`` (default
    :func:`run`), or None while the native library is not loaded."""
    return _NATIVE[0]["index_check_create"](fallback or run) if _NATIVE else None


def register() -> None:
    """Register the check as ``NAME``: the native one once installed, else :func:`run`."""
    import tvm_ffi

    tvm_ffi.register_global_func(NAME, _NATIVE[1] if _NATIVE else run, override=True)
