"""A :class:`~plus_tvm.lm.CompiledLM` saved to a folder and loaded back with TVM's runtime
library alone (compile here, generate there: docs/gpu.md).

:func:`export_lm` writes the two steps (``prefill.so``, ``decode.so``, each with its ``.json``
and ``.params``: :meth:`CompiledModel.export_library`) and ``lm.json`` (the cache layout, the
limits, eos / pad and the model's name). With ``weights="external"`` (the default) neither step
carries the model's weights: :func:`load_lm` takes them from the torch module (or state dict)
given, checked by name, shape and dtype, and both steps then hold one buffer per weight.
"""

from __future__ import annotations

import json
import os
import typing

from ..errors import ModelLoadError, PlusError

if typing.TYPE_CHECKING:  # pragma: no cover
    from .compiled_lm import CompiledLM

FORMAT = "plus_tvm.compiled_lm/1"
STEPS = ("prefill", "decode")
DESCRIPTION = "lm.json"


def export_lm(lm: CompiledLM, folder: str, weights: str = "external") -> str:
    """Write ``lm`` to ``folder`` (created if needed); :func:`load_lm` reads it back.

    ``weights="external"`` (default) leaves every weight that came from the torch module out
    of both steps' files (give the module to :func:`load_lm`); ``"embed"`` stores them, once
    per step. Returns ``folder``."""
    if weights not in ("embed", "external"):
        raise PlusError(f"export_lm: weights must be 'embed' or 'external', got {weights!r}")
    folder = os.fspath(folder)
    os.makedirs(folder, exist_ok=True)
    for step in STEPS:
        getattr(lm, step).export_library(os.path.join(folder, f"{step}.so"), weights=weights)
    layout = lm.layout
    meta = {
        "format": FORMAT,
        "name": lm.name,
        "weights": weights,
        "limits": {
            "max_batch": lm.limits.max_batch,
            "max_length": lm.limits.max_length,
            "vocab_size": lm.limits.vocab_size,
        },
        "cache": {
            "shapes": [list(s) for s in layout.shapes],
            "dtype": str(layout.dtype).removeprefix("torch."),
        },
        "eos_token_id": lm.eos_token_id,
        "pad_token_id": lm.pad_token_id,
        "steps": {step: f"{step}.so" for step in STEPS},
        # the bucketed decode's length step (0: the exact-length decode), where lm has one
        "decode_bucket": int(getattr(lm, "decode_bucket", 0) or 0),
    }
    with open(os.path.join(folder, DESCRIPTION), "w") as f:
        json.dump(meta, f, indent=1)
    return folder


def load_lm(folder: str, weights: object = None, device: object = None) -> CompiledLM:
    """The :class:`CompiledLM` :func:`export_lm` wrote to ``folder``; it generates as the
    compiled one did. Needs TVM's runtime library only.

    ``weights``: the torch module (or a mapping from names to tensors) whose weights a folder
    written with ``weights="external"`` left out, checked by name, shape and dtype
    (:class:`ModelLoadError` names the first that is missing or differs). ``device`` (optional,
    e.g. ``"cpu"``, ``"cuda"``, ``"cuda:0"``) is checked against the device the steps were
    compiled for."""
    from ..compiled_model import load
    from ..shared_weights import share_weights

    meta = read_description(folder)
    paths = [os.path.join(os.fspath(folder), meta["steps"][step]) for step in STEPS]
    described = [_step_description(path) for path in paths]
    kind = str(dict(described[0].get("target") or {}).get("kind", "llvm"))
    if device is not None:
        _check_device(kind, device, folder)
    named = _named_weights(weights) if weights is not None else None
    views: dict = {}  # one TVM tensor per torch tensor, shared by both steps (CPU)
    steps = []
    for path, desc in zip(paths, described):
        given = None
        if named is not None:
            given = _for_step(desc, named)
            if kind == "llvm":
                given = {name: _cpu_view(t, views) for name, t in given.items()}
        steps.append(load(path, weights=given))
    prefill, decode = steps
    if kind != "llvm":  # not placed yet: placed once, on the first call, for both steps
        share_weights([prefill, decode])
    return _build(meta, prefill, decode)


def read_description(folder: str) -> dict:
    """``lm.json`` of an exported LM, checked for what :func:`load_lm` needs."""
    path = os.path.join(os.fspath(folder), DESCRIPTION)
    try:
        with open(path) as f:
            meta = json.load(f)
    except FileNotFoundError:
        raise ModelLoadError(
            f"{path} is missing: {folder} is not a folder export_lm wrote"
        ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ModelLoadError(f"{path} is not a readable LM description: {err}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise ModelLoadError(f"{path}: format {found!r}, expected {FORMAT!r}; export it again")
    try:
        limits = meta["limits"]
        [int(limits[k]) for k in ("max_batch", "max_length", "vocab_size")]
        [(int(h), int(d)) for h, d in meta["cache"]["shapes"]]
        str(meta["cache"]["dtype"])
        [str(meta["steps"][s]) for s in STEPS]
    except (KeyError, TypeError, ValueError) as err:
        raise ModelLoadError(f"{path} is incomplete or malformed: {err!r}") from None
    return meta


def _build(meta: dict, prefill: object, decode: object) -> CompiledLM:
    import torch

    from .checks import Limits
    from .compiled_lm import CompiledLM
    from .export import CacheLayout

    dtype = getattr(torch, meta["cache"]["dtype"], None)
    if not isinstance(dtype, torch.dtype):
        raise ModelLoadError(f"lm.json: unknown cache dtype {meta['cache']['dtype']!r}")
    layout = CacheLayout(tuple((int(h), int(d)) for h, d in meta["cache"]["shapes"]), dtype)
    lim = meta["limits"]
    limits = Limits(int(lim["max_batch"]), int(lim["max_length"]), int(lim["vocab_size"]))
    eos = meta.get("eos_token_id")
    extra = {}
    if int(meta.get("decode_bucket") or 0):  # (the decode step was compiled bucketed)
        extra["decode_bucket"] = int(meta["decode_bucket"])
    return CompiledLM(
        prefill,
        decode,
        layout,
        limits,
        eos,
        meta.get("pad_token_id"),
        str(meta.get("name")),
        **extra,
    )


def _named_weights(weights: object) -> dict:
    """``{name: tensor}`` of a torch module (every parameter and buffer, non-persistent ones
    too: rotary tables are lifted as weights) or of a mapping."""
    if hasattr(weights, "named_parameters") and hasattr(weights, "named_buffers"):
        named = dict(weights.named_buffers())
        named.update(weights.state_dict(keep_vars=True))
        return named
    if not hasattr(weights, "items"):
        raise ModelLoadError(
            "load_lm: weights must be a torch module or a mapping from names to tensors, got "
            f"{type(weights).__name__}"
        )
    return dict(weights.items())


def _step_description(path: str) -> dict:
    """A step's ``.json`` (its target and external weights); ``{}`` where it is missing or
    unreadable (:func:`plus_tvm.load` then says so)."""
    try:
        with open(path + ".json") as f:
            meta = json.load(f)
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}


def _for_step(described: dict, named: dict) -> dict:
    """The weights one step takes, by the names it recorded. The steps were exported from a
    wrapper holding the model as ``model`` (:class:`~plus_tvm.lm.step_module.LMStep`), so a
    recorded ``model.X`` is the module's ``X``."""
    out = {}
    for entry in dict(described.get("external") or {}).values():
        name = entry.get("name")
        if name in named:
            out[name] = named[name]
        elif isinstance(name, str) and name.startswith("model.") and name[6:] in named:
            out[name] = named[name[6:]]
    return out  # (a name not found: plus_tvm.load says which)


def _cpu_view(tensor: object, views: dict) -> object:
    """A CPU torch tensor as a TVM tensor over the same memory (DLPack, no copy) where TVM's
    kernels can read it there (contiguous, 64-byte aligned), else a copy; one per torch tensor,
    so that both steps hold the same buffer (a loaded CPU model places its weights at load)."""
    import tvm

    if not hasattr(tensor, "data_ptr") or getattr(tensor, "device", None) is None:
        return tensor  # (an array: plus_tvm.load checks and copies it)
    if tensor.device.type != "cpu":
        return tensor
    key = (tensor.data_ptr(), tuple(tensor.shape), tuple(tensor.stride()), str(tensor.dtype))
    if key not in views:
        t = tensor.detach()
        if t.is_contiguous() and t.numel() and t.data_ptr() % 64 == 0:
            views[key] = tvm.runtime.from_dlpack(t)
        else:
            views[key] = tvm.runtime.from_dlpack(t.contiguous().clone())
    return views[key]


def _check_device(kind: str, wanted: object, folder: str) -> None:
    text = str(wanted).strip().lower()
    want, _, index = text.partition(":")
    want = {"gpu": "cuda", "llvm": "cpu"}.get(want, want)
    if want not in ("cpu", "cuda") or (index and not index.isdigit()):
        raise PlusError(f"load_lm: device {wanted!r}: give 'cpu', 'cuda' or 'cuda:0'")
    have = "cpu" if kind == "llvm" else kind
    if want != have or int(index or 0) != 0:
        raise ModelLoadError(
            f"load_lm: {folder} was compiled for {have} (device 0), not for {wanted!r}: "
            "compile_lm for that target and export it again"
        )
