"""``Options(precision="bf16" | "fp16")``: a float32 model compiled to run in half precision,
as TensorRT's ``--fp16`` or ONNX Runtime's float16 conversion do.

The torch model's weights are converted once, at compile time (``model.to(dtype)`` on a copy:
the user's module is not touched), and it is imported as a half-precision model is
(:mod:`plus_tvm.torch_half`: matrix products and convolutions accumulate in float32, the ops
of ``FLOAT32_OPS`` (norms, softmax, reductions, pow) compute in float32, everything else in
the half dtype). Inputs and outputs keep the model's float32: the compiled ``main`` casts its
float inputs to the half dtype first and its float outputs back last.

Not covered (TVM's ``relax.transform.ToMixedPrecision`` would not cover them either): ONNX
models (convert them with ONNX Runtime's float16 tools first, or export the torch model),
models without example inputs, and float64 models. A compiled model in reduced precision no
longer follows in-place changes of the float32 module's weights (they were converted once).
"""

from __future__ import annotations

import copy

import tvm
from tvm import relax

from .errors import OptionsError
from .frontend import num_inputs
from .loader import LoadedModel, load_model

#: Options.precision -> the dtype the model computes in (None: as it is)
PRECISIONS = {"fp32": None, "bf16": "bfloat16", "fp16": "float16"}


def in_precision(loaded: LoadedModel, precision: str) -> LoadedModel:
    """``loaded`` computed in ``precision``, with float32 inputs and outputs."""
    dtype = PRECISIONS[precision]
    if dtype is None:
        return loaded
    if loaded.torch_module is None or loaded.example_inputs is None:
        raise OptionsError(
            f"precision={precision} converts a torch model (given with example inputs); "
            f"{loaded.name} is not one: convert an ONNX model to {dtype} with ONNX Runtime's "
            "float16 tools, or give the torch module"
        )
    import torch

    half = getattr(torch, dtype)
    module = copy.deepcopy(loaded.torch_module).eval().to(half)
    args = tuple(
        x.to(half) if isinstance(x, torch.Tensor) and x.is_floating_point() else x
        for x in loaded.example_inputs
    )
    converted = load_model(module, args)
    mod = float32_boundaries(converted.mod, dtype)
    return LoadedModel(
        loaded.name,
        mod,
        converted.params,
        torch_module=loaded.torch_module,  # the reference stays the float32 model
        example_inputs=loaded.example_inputs,
        source=loaded.source,
        extra=dict(loaded.extra, precision=precision),
        baked_tensors=converted.baked_tensors,
    )


def float32_boundaries(mod: tvm.IRModule, dtype: str) -> tvm.IRModule:
    """``mod`` whose ``main`` takes and returns float32 where it took and returned ``dtype``:
    each such input cast to ``dtype`` first (the old parameter bound to the cast), each such
    output cast back last. Weights (parameters after ``num_input``) keep ``dtype``."""
    main = mod["main"]
    count = num_inputs(mod)
    params = list(main.params)
    bb = relax.BlockBuilder()
    entry = []
    new_params = []
    for i, p in enumerate(params):
        if i < count and _is(p, dtype):
            wide = relax.Var(p.name, relax.TensorType(p.ty.shape, "float32"))
            entry.append(relax.VarBinding(p, bb.normalize(relax.op.astype(wide, dtype))))
            new_params.append(wide)
        else:
            new_params.append(p)
    body = main.body
    blocks = list(body.blocks)
    result, tail = _widened(bb, body.body, dtype)
    if entry:
        blocks.insert(0, relax.DataflowBlock(entry))
    if tail:
        blocks.append(relax.DataflowBlock(tail))
    ret_ty = result.ty if tail else main.ret_ty
    func = relax.Function(
        new_params, relax.SeqExpr(blocks, result), ret_ty, main.is_pure, main.attrs
    )
    functions = dict(mod.functions_items())
    functions[mod.get_global_var("main")] = func
    return relax.transform.Normalize()(
        tvm.IRModule(functions, attrs=mod.attrs, global_infos=mod.global_infos)
    )


def _is(param: relax.Var, dtype: str) -> bool:
    ty = param.ty
    return isinstance(ty, relax.TensorType) and str(ty.dtype) == dtype


def _widened(
    bb: relax.BlockBuilder, result: relax.Expr, dtype: str
) -> tuple[relax.Expr, list[relax.VarBinding]]:
    """``result`` with its ``dtype`` tensors cast to float32, and the bindings that do it."""
    if isinstance(result, relax.Tuple):
        tail: list = []
        fields = []
        for field in result.fields:
            value, more = _widened(bb, field, dtype)
            fields.append(value)
            tail += more
        return (relax.Tuple(fields), tail) if tail else (result, [])
    ty = result.ty
    if isinstance(ty, relax.TensorType) and str(ty.dtype) == dtype:
        value = bb.normalize(relax.op.astype(result, "float32"))
        var = relax.Var("plus_out", value.ty)
        return var, [relax.VarBinding(var, value)]
    return result, []
