"""Resolve whatever a user hands us (zoo name, ONNX file, torch module, IRModule) to Relax.

One function, :func:`load_model`, serves the Python API, the CLI and the benchmark, so every entry
point accepts the same model references:

- ``"zoo:NAME"``: a model of :mod:`plus_tvm.zoo` with its example inputs;
- a path ending in ``.onnx`` (or an ``onnx.ModelProto``);
- ``"python:MODULE:ATTR"`` or ``"python:path/to/file.py:ATTR"``: ``ATTR`` is a callable returning
  ``(nn.Module, example_args)``, or an ``nn.Module`` whose Python module defines ``example_args``;
- a ``torch.nn.Module`` (with ``example_args``) or ``torch.export.ExportedProgram``;
- a Relax ``IRModule``, or ``(IRModule, params)`` as returned by the frontends.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from dataclasses import dataclass, field

import numpy as np
import tvm

from .errors import ModelLoadError
from .frontend import (
    Params,
    export_torch,
    from_onnx,
    import_exported,
    num_inputs,
    torch_weight_tensors,
)
from .torch_host_refusal import refuse_host_nodes


@dataclass
class LoadedModel:
    """A model imported to Relax, with what is known about how to run it for reference."""

    name: str
    mod: tvm.IRModule
    params: Params
    torch_module: object | None = None  # torch.nn.Module, for torch eager references
    example_inputs: tuple | None = None  # torch tensors or numpy arrays
    onnx_model: object | None = None  # onnx.ModelProto, for onnxruntime references
    source: str = "relax"  # "zoo", "torch", "onnx", "relax"
    extra: dict = field(default_factory=dict)
    # torch tensors behind the weights: {weight parameter: (module name, tensor)}, and the ones
    # compiled in as constants (see :func:`plus_tvm.frontend.torch_weight_tensors`)
    weight_tensors: dict = field(default_factory=dict)
    baked_tensors: list = field(default_factory=list)
    # the names a call gives the inputs by (the torch module's argument names as torch.export
    # flattened them, the ONNX graph's input names), the outputs' names and their structure
    # (:mod:`plus_tvm.output_structure`); None: the Relax function's own
    input_names: list | None = None
    output_names: list | None = None
    output_structure: dict | None = None


def load_model(
    model: object,
    example_args: object = None,
    *,
    example_kwargs: dict | None = None,
    dynamic_shapes: object = None,
    train_mode: str = "refuse",
    host_fallback: bool = True,
) -> LoadedModel:
    """Import ``model`` (any reference listed in the module docstring) to Relax.

    A torch model is exported with ``example_args`` (a tuple, or a dict of keyword inputs),
    ``example_kwargs`` and ``dynamic_shapes`` as ``torch.export.export`` takes them;
    ``train_mode`` says what a module in training mode gets
    (:func:`plus_tvm.frontend.export_torch`).
    """
    import onnx

    torch_export = {
        "example_kwargs": example_kwargs,
        "dynamic_shapes": dynamic_shapes,
        "train_mode": train_mode,
        "host_fallback": host_fallback,
    }

    if isinstance(model, LoadedModel):  # (imported with its own host fallback: off refuses it)
        return model if host_fallback else refuse_host_nodes(model)
    if isinstance(model, os.PathLike):
        model = os.fspath(model)
    if isinstance(model, str):
        if model.startswith("zoo:"):
            return _load_zoo(model[4:])
        if model.startswith("python:"):
            module, args = _load_python(model[len("python:") :])
            return _load_torch(
                module, args or example_args, name=model, source="torch", **torch_export
            )
        if model.endswith(".onnx") or os.path.exists(model):
            return _refused_unless(host_fallback, _load_onnx(model))
        if os.path.splitext(model)[1]:  # a file name: say so, not "cannot tell"
            raise ModelLoadError(f"model file not found: {model}")
        raise ModelLoadError(
            f"cannot tell what model {model!r} is: use zoo:NAME, a .onnx file or python:MODULE:ATTR"
        )
    if isinstance(model, onnx.ModelProto):
        return _refused_unless(host_fallback, _load_onnx(model))
    if isinstance(model, tuple) and len(model) == 2 and isinstance(model[0], tvm.IRModule):
        return LoadedModel("relax", model[0], dict(model[1]), example_inputs=example_args)
    if isinstance(model, tvm.IRModule):
        if not any(gv.name_hint == "main" for gv in model.get_global_vars()):
            raise ModelLoadError("the IRModule has no 'main' function")
        return LoadedModel("relax", model, {}, example_inputs=example_args)
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        torch = None
    if torch is not None and isinstance(model, (torch.nn.Module, torch.export.ExportedProgram)):
        name = type(model).__name__
        return _load_torch(model, example_args, name=name, source="torch", **torch_export)
    raise ModelLoadError(f"unsupported model type {type(model).__name__}")


def _load_zoo(name: str) -> LoadedModel:
    from . import zoo

    entry = zoo.get(name)
    module, args = zoo.load(entry.name)
    loaded = _load_torch(module, args, name=entry.name, source="zoo")
    loaded.extra["zoo_entry"] = entry
    return loaded


def _load_torch(
    module: object,
    example_args: object,
    name: str,
    source: str,
    example_kwargs: dict | None = None,
    dynamic_shapes: object = None,
    train_mode: str = "refuse",
    host_fallback: bool = True,
) -> LoadedModel:
    import torch

    from . import output_structure
    from .frontend import example_inputs
    from .torch_branch_speculation import speculation_of
    from .torch_model_prep import eval_copy

    if train_mode == "eval" and isinstance(module, torch.nn.Module) and module.training:
        module = eval_copy(module)  # (the reference runs it too)
    args, kwargs = example_inputs(example_args, example_kwargs)
    program = export_torch(
        module, args, dynamic_shapes, example_kwargs=kwargs, train_mode=train_mode
    )
    mod, params = import_exported(program, host_fallback)
    weights = [p.name for p in mod["main"].params[num_inputs(mod) :]]
    kept, baked = torch_weight_tensors(program, weights)
    torch_module = module if isinstance(module, torch.nn.Module) else module.module()
    inputs = _flat_inputs(program, args, kwargs)
    user_inputs = list(program.graph_signature.user_inputs)
    speculation = speculation_of(program)  # (guard outputs after the model's own)
    count = output_count(mod) - (len(speculation.branches) if speculation else 0)
    spec = speculation.out_spec if speculation else program.call_spec.out_spec
    structure = output_structure.from_treespec(spec)
    if structure is None or output_structure.leaf_count(structure) != count:
        structure = output_structure.flat(count)  # (returned flat, as the function does)
    loaded = LoadedModel(
        name,
        mod,
        params,
        torch_module=torch_module,
        example_inputs=inputs,
        source=source,
        weight_tensors=kept,
        baked_tensors=baked,
        input_names=user_inputs if len(user_inputs) == num_inputs(mod) else None,
        output_names=output_structure.leaf_names(structure),
        output_structure=structure,
    )
    if kwargs:
        loaded.extra["example_kwargs"] = kwargs
    if speculation:
        loaded.extra["speculation"] = speculation
    return loaded


def _flat_inputs(program: object, args: tuple | None, kwargs: dict) -> tuple | None:
    """The example inputs in the order of the compiled model's inputs (positional, then the
    keyword ones in the order the export gave them)."""
    if args is None and not kwargs:
        return None
    if not kwargs:
        return tuple(args)
    import torch

    spec = program.call_spec.in_spec
    order = list(spec.children_specs[1].context) if spec.num_children == 2 else list(kwargs)
    leaves = torch.utils._pytree.tree_leaves((tuple(args or ()), {k: kwargs[k] for k in order}))
    return tuple(leaves)


def output_count(mod: tvm.IRModule) -> int:
    """How many tensors ``main`` returns (a tuple's fields, else one)."""
    ret = mod["main"].ret_ty
    from tvm import relax

    return len(ret.fields) if isinstance(ret, relax.TupleType) else 1


def _refused_unless(host_fallback: bool, loaded: LoadedModel) -> LoadedModel:
    return loaded if host_fallback else refuse_host_nodes(loaded)


def _load_onnx(path_or_proto: object) -> LoadedModel:
    from .frontend import load_onnx

    proto = load_onnx(path_or_proto)
    mod, params = from_onnx(proto if not isinstance(path_or_proto, str) else path_or_proto)
    name = os.path.basename(path_or_proto) if isinstance(path_or_proto, str) else "onnx-model"
    from . import output_structure

    initializers = {t.name for t in proto.graph.initializer}
    inputs = [i.name for i in proto.graph.input if i.name not in initializers]
    outputs = [o.name for o in proto.graph.output]
    count = output_count(mod)
    return LoadedModel(
        name,
        mod,
        params,
        onnx_model=proto,
        source="onnx",
        input_names=inputs if len(inputs) == num_inputs(mod) else None,
        output_names=outputs if len(outputs) == count else None,
        output_structure=output_structure.flat(count),
    )


USER_MODULE_PREFIX = "_plus_user_model_"


def import_user_file(path: str) -> object:
    """Import a model file under a name derived from its absolute path and register it in
    ``sys.modules``, so that its classes pickle by reference (``plus-tvm bench`` hands the
    torch module to fresh worker processes, which import the same file first)."""
    import hashlib
    import sys

    where = os.path.abspath(path)
    name = USER_MODULE_PREFIX + hashlib.sha1(where.encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(name, where)
    pymod = importlib.util.module_from_spec(spec)
    sys.modules[name] = pymod
    try:
        spec.loader.exec_module(pymod)
    except BaseException:
        del sys.modules[name]
        raise
    return pymod


def _load_python(ref: str) -> tuple[object, tuple | None]:
    """``MODULE:ATTR`` or ``FILE.py:ATTR`` -> (nn.Module, example_args or None)."""
    if ":" not in ref:
        raise ModelLoadError(f"python:{ref}: expected python:MODULE:ATTR or python:FILE.py:ATTR")
    where, attr = ref.rsplit(":", 1)
    try:
        if where.endswith(".py"):
            if not os.path.exists(where):
                raise ModelLoadError(f"python model file not found: {where}")
            pymod = import_user_file(where)
        else:
            pymod = importlib.import_module(where)
    except ModelLoadError:
        raise
    except Exception as err:  # noqa: BLE001 - the user's module runs here: any error
        raise ModelLoadError(f"cannot import {where}: {type(err).__name__}: {err}") from None
    if not hasattr(pymod, attr):
        raise ModelLoadError(f"{where} has no attribute {attr!r}")
    obj = getattr(pymod, attr)
    import torch

    if isinstance(obj, torch.nn.Module):
        return obj, getattr(pymod, "example_args", None)
    if callable(obj):
        result = obj()
        if isinstance(result, tuple) and len(result) == 2:
            return result
        if isinstance(result, torch.nn.Module):
            return result, getattr(pymod, "example_args", None)
    raise ModelLoadError(
        f"python:{ref} must be an nn.Module or a callable returning (nn.Module, example_args)"
    )


def random_inputs(specs: list, seed: int = 0) -> tuple[np.ndarray, ...]:
    """Random inputs for input specs whose shapes are static.

    Integer inputs that index a table take values in its valid range, other integers
    ``[0, 16)``. An input larger than this machine's memory is refused before allocating.
    """
    rng = np.random.default_rng(seed)
    out = []
    for spec in specs:
        if spec.shape is None or any(not isinstance(d, int) for d in spec.shape):
            raise ModelLoadError(
                f"input {spec.name} has shape {spec.shape} (symbolic or unknown dims): "
                "give inputs explicitly (--inputs)"
            )
        _check_fits(spec)
        rng_spec = spec.index_range
        if rng_spec is not None:
            low, high = max(rng_spec.low, 0), rng_spec.high
            out.append(rng.integers(low, high + 1, size=spec.shape).astype(spec.dtype))
        elif np.issubdtype(np.dtype(spec.dtype), np.integer):
            out.append(rng.integers(0, 16, size=spec.shape).astype(spec.dtype))
        elif spec.dtype == "bool":
            out.append(rng.integers(0, 2, size=spec.shape).astype(bool))
        else:
            out.append(rng.standard_normal(spec.shape).astype(spec.dtype))
    return tuple(out)


def _check_fits(spec: object) -> None:
    """Refuse an input whose size exceeds the machine's memory (before numpy tries)."""
    count = 1
    for d in spec.shape:
        count *= d
    need = count * np.dtype(spec.dtype).itemsize
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return
    if need > total:
        raise ModelLoadError(
            f"input {spec.name} of shape {tuple(spec.shape)} ({spec.dtype}) needs "
            f"{need / 2**30:.1f} GiB, more than this machine's {total / 2**30:.1f} GiB: "
            "give smaller inputs (--inputs)"
        )
