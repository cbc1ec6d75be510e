"""Frontends: torch (``torch.export``) and ONNX models to Relax, weights kept as inputs.

Both return ``(IRModule, params)``: ``main`` takes the model inputs first and the weights after
them (its ``num_input`` attribute says how many are inputs), and ``params`` maps each weight's
Relax parameter name to its value, in ``main``'s order. Keeping weights as inputs lets the
pipeline reason about them (layout, prepacking, CUDA graphs) without baking them into the code.

Import failures are reported as :class:`~plus_tvm.errors.UnsupportedOperatorError` naming the
operator and the graph node, or :class:`~plus_tvm.errors.ModelLoadError` for unreadable files.
"""

from __future__ import annotations

import functools
import json
import os
import typing
import warnings
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import tvm
from tvm import relax

from .errors import (
    TVM_FAILURE,
    ModelLoadError,
    OptionsError,
    PlusError,
    UnsupportedOperatorError,
    is_refusal,
)
from .stats import HOST_NODES_ATTR

if typing.TYPE_CHECKING:  # pragma: no cover
    import onnx
    import torch

Params = dict[str, np.ndarray]


# --------------------------------------------------------------------------------------- torch
def from_torch(
    module: torch.nn.Module | torch.export.ExportedProgram,
    example_args: Sequence[torch.Tensor] | Mapping[str, torch.Tensor] | None = None,
    dynamic_shapes: object = None,
    *,
    example_kwargs: Mapping[str, torch.Tensor] | None = None,
    train_mode: str = "refuse",
    host_fallback: bool = True,
) -> tuple[tvm.IRModule, Params]:
    """Import a torch model through ``torch.export``.

    Parameters
    ----------
    module : torch.nn.Module or torch.export.ExportedProgram
        The model or an already exported program.
    example_args : sequence of torch.Tensor, or a dict
        Example positional inputs for export (a dict: keyword inputs, as ``example_kwargs``);
        an ``nn.Module`` needs example inputs.
    dynamic_shapes : object, optional
        Passed to ``torch.export.export`` (e.g. ``{"x": {0: torch.export.Dim("batch")}}``); the
        dynamic dims become Relax symbolic shape variables.
    example_kwargs : dict of torch.Tensor, optional
        Example keyword inputs (``torch.export.export``'s ``kwargs``), e.g. ``attention_mask``.
    train_mode : {"refuse", "eval"}
        A module in training mode whose graph differs in training (dropout, batch norm) is
        refused, or (``"eval"``) an eval-mode copy of it is exported
        (:mod:`plus_tvm.torch_model_prep`).
    host_fallback : bool
        Run a node whose op has no converter on the host through torch eager
        (:func:`import_exported`); off: such an op is an error.

    Returns
    -------
    (tvm.IRModule, dict[str, numpy.ndarray])
        The Relax module and its weights by parameter name. A model that branches in Python on
        a tensor's value is exported along its example inputs' path
        (:mod:`plus_tvm.torch_branch_speculation`): ``main`` then returns, after the model's
        outputs, one boolean guard per speculated branch, listed in the module's
        ``plus.speculated_branches`` attribute.
    """
    program = export_torch(
        module, example_args, dynamic_shapes, example_kwargs=example_kwargs, train_mode=train_mode
    )
    return import_exported(program, host_fallback)


def export_torch(
    module: torch.nn.Module | torch.export.ExportedProgram,
    example_args: Sequence[torch.Tensor] | Mapping[str, torch.Tensor] | None = None,
    dynamic_shapes: object = None,
    *,
    example_kwargs: Mapping[str, torch.Tensor] | None = None,
    train_mode: str = "refuse",
) -> torch.export.ExportedProgram:
    """``torch.export`` of ``module`` (an exported program passes through), decomposed.

    The user's module is never changed: a module in training mode is refused or exported from an
    eval-mode copy (``train_mode``), a transformers model's ``use_cache`` is off during the
    export only (with a warning that the cache outputs are not returned)."""
    import torch

    from . import torch_model_prep as prep

    if train_mode not in prep.TRAIN_MODES:
        choices = list(prep.TRAIN_MODES)
        raise OptionsError(f"option train_mode={train_mode!r} is not one of {choices}")
    args, kwargs = example_inputs(example_args, example_kwargs)
    if isinstance(module, torch.export.ExportedProgram):
        program = module
        found = prep.training_ops(program)
        if found:
            raise ModelLoadError(
                prep.training_message("the exported program", found)
                + " (export the module again after model.eval())"
            )
    elif isinstance(module, torch.nn.Module):
        if args is None and not kwargs:
            raise ModelLoadError("from_torch: example_args are required to export an nn.Module")
        name = type(module).__name__
        training = any(m.training for m in module.modules())
        if training and train_mode == "eval":
            module, training = prep.eval_copy(module), False
        kwargs = prep.ordered_kwargs(module, kwargs)
        exported, tensors = prep.bind_constants(module, kwargs)
        program, dropped = _export_module(
            exported, args or (), tensors, kwargs, dynamic_shapes, name
        )
        found = prep.training_ops(program) if training else []
        if found:
            raise ModelLoadError(prep.training_message(name, found))
        if dropped:
            prep.warn_cache_dropped(name)
    else:
        raise ModelLoadError(
            f"from_torch expects a torch.nn.Module or ExportedProgram, got {type(module).__name__}"
        )
    from .torch_branch_speculation import carry_speculation

    return carry_speculation(program, program.run_decompositions())


def _export_module(
    module: torch.nn.Module,
    args: tuple,
    tensors: dict,
    kwargs: dict,
    dynamic_shapes: object,
    name: str,
) -> tuple[torch.export.ExportedProgram, bool]:
    """``(torch.export of module, whether a cache was turned off)``; a module that branches on
    a tensor's value is exported by speculation (:mod:`plus_tvm.torch_branch_speculation`)."""
    import torch

    from . import torch_model_prep as prep
    from .torch_export_errors import (
        export_failure_message,
        is_data_dependent,
        partial_graph_dropped,
    )

    def run(mod: torch.nn.Module, a: tuple, kw: dict) -> torch.export.ExportedProgram:
        with partial_graph_dropped():
            return torch.export.export(mod, a, kw or None, dynamic_shapes=dynamic_shapes)

    def eager(mod: torch.nn.Module, a: tuple, kw: dict) -> object:
        with torch.no_grad(), prep.cache_off(mod, {**kwargs, **kw}):
            return mod(*a, **kw)

    try:
        with torch.no_grad(), prep.cache_off(module, kwargs) as dropped:
            try:
                return run(module, args, tensors), dropped
            except Exception as err:  # noqa: BLE001 - the user's forward runs here: any error
                if not is_data_dependent(err):
                    raise
                from .torch_branch_speculation import export_speculating

                program = export_speculating(module, args, tensors, dynamic_shapes, run, eager)
                if program is None:
                    raise
                return program, dropped
    except ModelLoadError:
        raise
    except Exception as err:  # noqa: BLE001 - (a branch on a value, or any other failure)
        raise ModelLoadError(export_failure_message(name, err)) from err


def example_inputs(
    example_args: object, example_kwargs: Mapping[str, object] | None
) -> tuple[tuple | None, dict]:
    """``(args, kwargs)`` for ``torch.export``: ``example_args`` a tuple, a list, one tensor, or
    a dict of keyword inputs; ``example_kwargs`` more keyword inputs."""
    kwargs = dict(example_kwargs or {})
    if isinstance(example_args, Mapping):
        twice = sorted(set(example_args) & set(kwargs))
        if twice:
            raise ModelLoadError(
                f"example input(s) {twice} given in example_args and example_kwargs"
            )
        kwargs = {**example_args, **kwargs}
        return (), kwargs
    if example_args is None:
        return None, kwargs
    args = tuple(example_args) if isinstance(example_args, (list, tuple)) else (example_args,)
    return args, kwargs


def import_exported(
    program: torch.export.ExportedProgram, host_fallback: bool = True
) -> tuple[tvm.IRModule, Params]:
    """Import a decomposed exported program to Relax (weights kept as inputs).

    A node whose ATen op has no converter runs on the host through torch eager
    (:mod:`plus_tvm.torch_host_fallback`; a warning per op, listed in the module's
    ``plus.host_nodes`` attribute, ``stats["host_nodes"]``) unless ``host_fallback`` is off or
    the op cannot go there (random, in place, no tensor output): then
    :class:`~plus_tvm.errors.UnsupportedOperatorError` names the op and the node."""
    from .torch_fixes import custom_convert_map  # importer bug workarounds
    from .torch_half import compute_as_torch, is_half_program

    if is_half_program(program):  # matmul / conv / norm ops computed as torch does
        compute_as_torch(program)
    custom = custom_convert_map()
    importer = _NamingImporter()
    missing = _check_torch_ops(program, set(importer.convert_map) | set(custom), host_fallback)
    hosts = _host_nodes(missing)
    if hosts:
        from .torch_host_fallback import converter

        convert = converter(hosts)
        custom = {**custom, **{node.target.__name__: convert for node in missing}}
    mod = importer.from_exported_program(
        program,
        keep_params_as_input=True,
        unwrap_unit_return_tuple=True,
        no_bind_return_tuple=False,
        custom_convert_map=custom,
    )
    if hosts:
        mod = mod.with_attr(HOST_NODES_ATTR, json.dumps(_warn_host_nodes(missing, hosts)))
    from .torch_branch_speculation import speculation_of, with_branches

    return _detach(with_branches(mod, speculation_of(program)))


def torch_weight_tensors(
    program: torch.export.ExportedProgram, param_names: Sequence[str]
) -> tuple[dict[str, tuple[str, object]], list[tuple[str, object]]]:
    """The torch tensors behind an exported program's weights.

    Returns ``({relax parameter name: (module name, tensor)}, [(module name, tensor)])``: the
    parameters that stay weights of the compiled model, and the buffers and parameters that the
    importer compiled in as constants. The tensors are the module's own (``torch.export`` shares
    them), so their version counters show in-place changes made after compilation.
    """
    sig = program.graph_signature
    state = program.state_dict
    kept: dict[str, tuple[str, object]] = {}
    baked: list[tuple[str, object]] = []
    names = set(param_names)
    for table in (sig.inputs_to_parameters, sig.inputs_to_buffers):
        for placeholder, fqn in table.items():
            tensor = state.get(fqn)
            if tensor is None:
                continue  # a non-persistent buffer: a constant of the program
            if placeholder in names:
                kept[placeholder] = (fqn, tensor)
            else:
                baked.append((fqn, tensor))
    return kept, baked


def node_location(node: object) -> str:
    """`` (File "...", line N, in forward)``: where the fx node comes from, or ``""``."""
    trace = getattr(node, "meta", {}).get("stack_trace") or ""
    lines = [ln.strip() for ln in trace.strip().splitlines() if ln.strip().startswith("File ")]
    # the innermost frame of the user's code (an nn.Embedding's own forward is torch's)
    own = [ln for ln in lines if f"{os.sep}torch{os.sep}" not in ln] or lines
    return f" ({own[-1]})" if own else ""


def _check_torch_ops(
    program: torch.export.ExportedProgram, known: set[str], host_fallback: bool = False
) -> list:
    """The ``call_function`` nodes whose op has no converter (with ``host_fallback`` off, the
    first of them is an error)."""
    missing = []
    for node in program.graph.nodes:
        if node.op != "call_function":
            continue
        name = getattr(node.target, "__name__", str(node.target))
        if name not in known:
            if not host_fallback:
                raise UnsupportedOperatorError(
                    f"unsupported torch operator {name} at node '{node.name}'"
                    f"{node_location(node)}: TVM 0.27's torch importer has no converter for it"
                )
            missing.append(node)
    return missing


def _host_nodes(missing: list) -> dict:
    """The host plan of the nodes without a converter (torch_host_fallback.plan), or an
    :class:`~plus_tvm.errors.UnsupportedOperatorError` for one that cannot run there."""
    if not missing:
        return {}
    from .torch_host_fallback import NotForHostError, plan

    try:
        return plan(missing, node_location)
    except NotForHostError as err:
        node, why = err.args
        name = getattr(node.target, "__name__", str(node.target))
        raise UnsupportedOperatorError(
            f"unsupported torch operator {name} at node '{node.name}'{node_location(node)}: "
            f"TVM 0.27's torch importer has no converter for it, and it cannot run on the host "
            f"through torch eager: {why}"
        ) from None


def _warn_host_nodes(missing: list, hosts: dict) -> list[str]:
    """Warn once per op that runs on the host; the ``stats["host_nodes"]`` lines."""
    lines, by_op = [], {}
    for node in missing:
        host = hosts[node.name]
        where = f"node '{node.name}'{node_location(node)}"
        lines.append(f"{where} of torch operator {host.op_name}: no converter (torch eager)")
        by_op.setdefault(host.op_name, []).append(where)
    for op, wheres in by_op.items():
        warnings.warn(
            f"torch operator {op} has no converter: it runs on the host through torch eager "
            f"(a graph break; Options(host_fallback=False) refuses it) at {'; '.join(wheres)}",
            RuntimeWarning,
            stacklevel=3,
        )
    return lines


def _naming_errors(op_name: str, fn: Callable) -> Callable:
    """Wrap a converter so that a failure names the torch op and the node it failed on."""

    @functools.wraps(fn)
    def convert(node, *rest):
        try:
            return fn(node, *rest)
        except PlusError:
            raise
        except TVM_FAILURE as err:
            if not is_refusal(err):
                raise  # a bug of plus_tvm's own code (a converter of ours), not TVM refusing
            msg = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
            raise UnsupportedOperatorError(
                f"cannot import torch operator {op_name} at node '{node.name}'"
                f"{node_location(node)}: {msg}"
            ) from err

    return convert


def _naming_importer_class() -> type:
    from tvm.relax.frontend.torch.exported_program_translator import ExportedProgramImporter

    class NamingImporter(ExportedProgramImporter):
        """TVM's importer whose converters report the node they fail on."""

        def create_convert_map(self):
            return {k: _naming_errors(k, f) for k, f in super().create_convert_map().items()}

        def update_convert_map(self, custom_convert_map):
            wrapped = {k: _naming_errors(k, f) for k, f in custom_convert_map.items()}
            super().update_convert_map(wrapped)

    return NamingImporter


def _NamingImporter():  # noqa: N802 - reads like a class at the call site
    return _naming_importer_class()()


# ---------------------------------------------------------------------------------------- onnx
def from_onnx(
    path_or_proto: str | os.PathLike | onnx.ModelProto,
    shape_dict: Mapping[str, Sequence[int | str]] | None = None,
) -> tuple[tvm.IRModule, Params]:
    """Import an ONNX model.

    Parameters
    ----------
    path_or_proto : str, path or onnx.ModelProto
        The model file or the loaded model.
    shape_dict : mapping, optional
        Input shapes overriding the file's; a string dim (e.g. ``"batch"``) is symbolic. Symbolic
        dims in the file (``dim_param``) become Relax symbolic shape variables.

    Returns
    -------
    (tvm.IRModule, dict[str, numpy.ndarray])
    """
    import onnx

    from .onnx_import import import_model

    model = load_onnx(path_or_proto)
    where = str(path_or_proto) if not isinstance(path_or_proto, onnx.ModelProto) else "model"
    _check_onnx_ops(model, where)
    initializers = {t.name for t in model.graph.initializer}
    dtypes = {}
    for inp in model.graph.input:
        if inp.name in initializers:
            continue
        if inp.type.WhichOneof("value") != "tensor_type" or not inp.type.tensor_type.elem_type:
            continue  # optionals and sequences: TVM's importer reads their types itself
        elem = inp.type.tensor_type.elem_type
        dtypes[inp.name] = str(onnx.helper.tensor_dtype_to_np_dtype(elem))
    shapes = None
    if shape_dict:
        shapes = {
            k: [tvm.tirx.Var(d, "int64") if isinstance(d, str) else int(d) for d in v]
            for k, v in shape_dict.items()
        }
        unknown = set(shapes) - set(dtypes)
        if unknown:
            raise ModelLoadError(
                f"{where}: shape_dict names no input {sorted(unknown)}; inputs are {sorted(dtypes)}"
            )
    try:
        mod = import_model(model, shapes, dtypes, keep_params_in_input=True, where=where)
    except PlusError:
        raise
    except TVM_FAILURE as err:  # the importer outside any node (graph inputs, outputs)
        if not is_refusal(err):
            raise  # a bug of plus_tvm's own code, not TVM refusing
        msg = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
        raise UnsupportedOperatorError(f"{where}: TVM's ONNX importer failed: {msg}") from err
    return _detach(mod)


def load_onnx(path_or_proto: str | os.PathLike | onnx.ModelProto) -> onnx.ModelProto:
    """Load and check an ONNX model, with errors that name the file."""
    import onnx

    if isinstance(path_or_proto, onnx.ModelProto):
        model = path_or_proto
        where = "model"
    else:
        where = str(path_or_proto)
        if not os.path.exists(where):
            raise ModelLoadError(f"ONNX file not found: {where}")
        try:
            model = onnx.load(where)
        except Exception as err:  # noqa: BLE001 - onnx's parsers refuse a file with any type
            # (external data pointing outside the model's folder: a ValidationError; a .json
            # nested too deep: protobuf's ParseError; a truncated file: DecodeError)
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise ModelLoadError(f"cannot load ONNX file {where}: {first}") from None
    if not model.graph.node and not model.graph.output:
        raise ModelLoadError(f"{where} holds no ONNX graph (empty or not an ONNX model)")
    _check_onnx_header(model, where)
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as err:
        # TVM's importer only warns here too: exporters write models the checker calls
        # incomplete (an output without a shape) that import and run correctly; a model that
        # is really broken fails in the importer, naming the node
        msg = str(err).strip().splitlines()[0]
        warnings.warn(f"{where}: ONNX's checker: {msg}", stacklevel=2)
    return model


def _check_onnx_header(model: onnx.ModelProto, where: str) -> None:
    """Refuse what no importer can read right: an opset newer than the onnx package knows (its
    operators' meaning is unknown), an input declared with a negative dimension."""
    import onnx

    newest = onnx.defs.onnx_opset_version()
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx") and not 1 <= entry.version <= newest:
            raise ModelLoadError(
                f"{where}: ONNX opset {entry.version} is outside 1..{newest}, the opsets this "
                "onnx package defines"
            )
    for value in model.graph.input:
        dims = value.type.tensor_type.shape.dim if value.type.HasField("tensor_type") else ()
        for axis, dim in enumerate(dims):
            if dim.HasField("dim_value") and dim.dim_value < 0:
                raise ModelLoadError(
                    f"{where}: input {value.name} is declared with dimension {dim.dim_value} "
                    f"at axis {axis} (a dimension is >= 0, or a name for a symbolic one)"
                )


def _check_onnx_ops(model: onnx.ModelProto, where: str) -> None:
    from .onnx_import import supported_ops
    from .onnx_import.host_nodes import supported

    known = supported_ops()
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
    for index, node in enumerate(model.graph.node):
        host = supported(node, opset) if node.op_type not in known else None
        if host is not None:
            raise UnsupportedOperatorError(
                f"{where}: unsupported ONNX operator {node.op_type} at node #{index} "
                f"'{node.name or '(unnamed)'}': neither TVM 0.27's ONNX importer nor plus_tvm "
                f"has a converter for it, and it cannot run on the host: {host}"
            )


# -------------------------------------------------------------------------------------- common
def _detach(mod: tvm.IRModule) -> tuple[tvm.IRModule, Params]:
    attrs = dict(mod.attrs) if mod.attrs is not None else {}
    mod, detached = relax.frontend.detach_params(mod)
    for key, value in attrs.items():  # (detach_params drops the module's attributes)
        mod = mod.with_attr(key, value)
    main = mod["main"]
    num_input = (
        int(main.attrs["num_input"])
        if main.attrs and "num_input" in main.attrs
        else len(main.params)
    )
    names = [p.name for p in main.params[num_input:]]
    values = detached.get("main", [])
    if len(values) != len(names):
        raise PlusError(f"importer returned {len(values)} weights for {len(names)} parameters")
    params = {name: value.numpy() for name, value in zip(names, values)}
    return mod, params


def num_inputs(mod: tvm.IRModule, func: str = "main") -> int:
    """How many leading parameters of ``func`` are model inputs (the rest are weights)."""
    fn = mod[func]
    if fn.attrs is not None and "num_input" in fn.attrs:
        return int(fn.attrs["num_input"])
    return len(fn.params)
