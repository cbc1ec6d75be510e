"""PlusDispatch: subgraphs matched in the pattern warehouse become library calls (phase 1).

Per dataflow block: build the operator graph with each operator's +Loops (from its legalized
TIR), identify subgraphs from skeleton operators (algorithms 1-2 of PluS), and for each match
try the entries it fully matches, best first, and their implementations for the target in
order (an implementation's ``when`` condition routes by size). A binder turns the subgraph into
``R.call_dps_packed("plus.<kernel>", args + [config])``; what the binder does not absorb stays
as Relax operators, and everything unmatched flows on to legalization and fusion. The
dispatcher keeps TIR where the cost model predicts it faster.

A report (per entry: matched subgraphs and chosen implementations; declined subgraphs and why)
is stored as the module attribute ``plus.dispatch`` (JSON) for ``plus_tvm.inspect``.
"""

from __future__ import annotations

import dataclasses
import json
from collections import Counter

import tvm
from tvm import relax

from ..costmodel import (
    DispatchCost,
    LearnedDispatchCost,
    predict_library_us,
    predict_tir_us,
    size_value,
    work_of,
)
from ..costmodel.dispatch_cost import analytic_ratio
from ..costmodel.features import KernelContext, choice_features, library_features, tir_features
from ..dispatch.binders import BINDERS, CallSettings, Ctx, LibraryCall
from ..dispatch.identify import Identifier
from ..dispatch.opgraph import OpGraph
from ..dispatch.unscheduled import tir_unscheduled
from ..runtime.conv2d import WINOGRAD_MIN_CHANNELS
from ..runtime.native import runs_natively
from ..runtime.perf import library_gflops
from ..symbolic_bounds import typical_sizes


@tvm.transform.module_pass(opt_level=0, name="PlusDispatch")
class PlusDispatch:
    """Match warehouse patterns and call library kernels for them.

    Parameters
    ----------
    warehouse : Warehouse, optional
        Entries to match; default: ``load_warehouse(extra_dirs)``.
    extra_dirs : tuple of str
        User entry folders (``Options.warehouse``).
    cost : DispatchCost, LearnedDispatchCost or None
        Prices of the library-vs-TIR choice (constants, or a learned model's kernel times);
        ``None`` always takes the library.
    propagate_nan : bool
        Library activations must return NaN for NaN (``Options.propagate_nan``); off lets a
        library drop it where that is faster.
    conv_winograd : bool
        3x3 convolutions may run as Winograd F(2x2, 3x3) where the library finds it faster
        (``Options.conv_winograd``); off: always the direct algorithm.
    machine : costmodel.features.KernelContext or None
        Where the kernels run, as the learned model's vectors say it; required by a
        ``LearnedDispatchCost`` and by ``record_calls``.
    record_calls : bool
        Record each library call made with its vector and its subgraph's TIR vectors (the
        report's ``calls``, which ``plus-tvm calibrate`` learns from); off in compiles.
    """

    def __init__(
        self,
        warehouse=None,  # noqa: ANN001
        extra_dirs: tuple[str, ...] = (),
        cost=DispatchCost(),  # noqa: ANN001, B008
        propagate_nan: bool = True,
        conv_winograd: bool = True,
        machine: KernelContext | None = None,
        record_calls: bool = False,
    ):
        if machine is None and (record_calls or isinstance(cost, LearnedDispatchCost)):
            raise ValueError("PlusDispatch: a learned cost model and record_calls need machine")
        self.warehouse = warehouse
        self.extra_dirs = tuple(extra_dirs)
        self.cost = cost
        self.settings = CallSettings(propagate_nan=propagate_nan, conv_winograd=conv_winograd)
        self.machine = machine
        self.record_calls = record_calls

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        from ..pattern_warehouse import load_warehouse

        warehouse = self.warehouse or load_warehouse(self.extra_dirs)
        target = tvm.target.Target.current(allow_none=True)
        kind = target.kind.name if target is not None else "llvm"
        settings = self.settings
        if target is not None and kind == "llvm":
            mcpu = str(target.attrs.get("mcpu", ""))
            least = WINOGRAD_MIN_CHANNELS.get(mcpu, 0)
            settings = dataclasses.replace(settings, winograd_min_channels=least)
        report = _Report(self.record_calls)
        cache: dict = {}
        functions = {}
        changed = False
        for gvar, func in mod.functions_items():
            if isinstance(func, relax.Function) and not _is_primitive(func):
                new = _rewrite_function(
                    func,
                    mod,
                    warehouse,
                    kind,
                    self.cost,
                    report,
                    cache,
                    settings,
                    self.machine,
                )
                if new is not func:
                    changed = True
                    func = new
            functions[gvar] = func
        if not changed:
            return mod.with_attr("plus.dispatch", report.to_json())
        out = tvm.IRModule(functions, attrs=mod.attrs, global_infos=mod.global_infos)
        # new SeqExprs carry no type until normalized (the well-formed check needs them)
        out = relax.transform.Normalize()(out)
        out = relax.transform.DeadCodeElimination()(out)
        return out.with_attr("plus.dispatch", report.to_json())


class _Report:
    def __init__(self, record_calls: bool = False) -> None:
        self.matched: Counter = Counter()
        self.library: Counter = Counter()  # entry -> library calls
        self.chosen: dict[str, Counter] = {}
        self.declined: Counter = Counter()
        # each priced choice: entry, kernel, predicted library and TIR microseconds, the model
        self.decisions: list[dict] = []
        # with ``record_calls``: each library call made, with the learned cost model's vectors
        # (calibration times the calls and learns from these); None: not recorded
        self.calls: list[dict] | None = [] if record_calls else None

    def decide(
        self, entry: str, kernel: str, library_us: float, tir_us: float, how: str, pays: bool
    ) -> None:  # noqa: PLR0913
        self.decisions.append(
            {
                "entry": entry,
                "kernel": kernel,
                "library_us": round(library_us, 2),
                "tir_us": round(tir_us, 2),
                "model": how,
                "chosen": "library" if pays else "tir",
            }
        )

    def to_json(self) -> str:
        return json.dumps(
            {
                "matched": dict(self.matched),
                "library": dict(self.library),
                "implementations": {k: dict(v) for k, v in self.chosen.items()},
                "declined": dict(self.declined),
                "decisions": self.decisions,
                **({"calls": self.calls} if self.calls is not None else {}),
            },
            sort_keys=True,
        )


def _is_primitive(func: relax.Function) -> bool:
    return bool(func.attrs is not None and func.attrs.get("Primitive", False))


def _weights(func: relax.Function) -> set[int]:
    num_input = func.attrs.get("num_input") if func.attrs is not None else None
    if num_input is None:
        return set()
    return {p.id_ for p in list(func.params)[int(num_input) :]}


def _rewrite_function(func, mod, warehouse, kind, cost, report, cache, settings, machine):  # noqa: ANN001, ANN202, PLR0913
    weights = _weights(func)
    sizes = typical_sizes(func)  # symbolic sizes priced at the middle of their declared range
    if cost is not None:
        cost = cost.at_sizes(sizes)
    body = func.body
    if not isinstance(body, relax.SeqExpr):
        return func
    blocks = []
    changed = False
    for block in body.blocks:
        if isinstance(block, relax.DataflowBlock):
            new = _rewrite_block(
                block, mod, warehouse, kind, cost, report, cache, weights, settings, sizes, machine
            )
            changed |= new is not block
            block = new
        blocks.append(block)
    if not changed:
        return func
    return relax.Function(
        func.params, relax.SeqExpr(blocks, body.body), func.ret_ty, func.is_pure, func.attrs
    )


def _rewrite_block(block, mod, warehouse, kind, cost, report, cache, weights, lib, sizes, machine):  # noqa: ANN001, ANN202, PLR0913
    graph = OpGraph(block, mod, cache)
    calls: dict[int, LibraryCall] = {}
    absorbed: set[int] = set()
    seen: set[tuple[int, ...]] = set()
    # Round 1 identifies from every operator; an operator a library call did not absorb (a
    # subgraph fell back to a smaller archived state, or was declined) may join a subgraph of
    # another skeleton in the next round.
    for _round in range(3):
        matches = Identifier(graph, list(warehouse.entries), exclude=absorbed).run()
        new_calls = 0
        for match in matches:
            if match.members not in seen:
                seen.add(match.members)
                report.matched[match.entries[0].name] += 1
            for state in (match, *match.fallbacks):
                ctx = Ctx(graph, state, weights, taken=absorbed, settings=lib)
                chosen = _choose(state, ctx, graph, kind, cost, report, machine)
                if chosen is not None:
                    break
            if chosen is None or chosen[2].final in calls:
                continue
            if absorbed & set(chosen[2].absorbed):
                continue  # a binding another call already absorbed
            seen.add(chosen[2].final)
            entry, impl, call = chosen
            calls[call.final] = call
            if report.calls is not None:
                report.calls.append(
                    {
                        "entry": entry.name,
                        "kernel": call.kernel,
                        "features": call_features(call, state, graph, sizes, kind, machine),
                        "tir": member_features(state, graph, sizes, machine),
                    }
                )
            absorbed.update(call.absorbed)
            new_calls += 1
            report.library[entry.name] += 1
            report.chosen.setdefault(entry.name, Counter())[impl.name] += 1
        if not new_calls:
            break
    if not calls:
        return block
    bb = relax.BlockBuilder()
    at: dict[int, LibraryCall] = {}  # where each call is emitted: its earliest rebound value
    replaced: set[int] = set()
    for call in calls.values():
        position = min([call.final, *call.extra])
        if not all(_defined_before(graph, a, position) for a in call.args):
            continue  # an input computed after the earliest output: keep the operators
        at[position] = call
        replaced.update((call.final, *call.extra))
    bindings = []
    for index, binding in enumerate(block.bindings):
        call = at.get(index)
        if call is None:
            if index not in replaced:
                bindings.append(binding)
            continue
        for var, value in call.pre:
            bindings.append(relax.VarBinding(var, value))
        args = [*call.args, tvm.ir.StringImm(call.config_text())]
        final_var = graph.nodes[call.final].var
        if call.extra:
            outs = [final_var, *(graph.nodes[i].var for i in call.extra)]
            out_ty = [v.ty for v in outs]
            value = bb.normalize(relax.call_dps_packed(call.kernel, args, out_ty=out_ty))
            tup = relax.DataflowVar("plus_outs", value.ty)
            bindings.append(relax.VarBinding(tup, value))
            for k, var in enumerate(outs):
                bindings.append(relax.VarBinding(var, bb.normalize(relax.TupleGetItem(tup, k))))
            continue
        final_ty = final_var.ty
        if call.out_shape is None:
            value = relax.call_dps_packed(call.kernel, args, out_ty=final_ty)
            bindings.append(relax.VarBinding(final_var, bb.normalize(value)))
            continue
        out_ty = relax.TensorType(call.out_shape, final_ty.dtype)
        out_var = relax.DataflowVar("plus_out", out_ty)
        value = relax.call_dps_packed(call.kernel, args, out_ty=out_ty)
        bindings.append(relax.VarBinding(out_var, bb.normalize(value)))
        view = relax.op.reshape(out_var, final_ty.shape)
        bindings.append(relax.VarBinding(final_var, bb.normalize(view)))
    return relax.DataflowBlock(bindings)


def _defined_before(graph: OpGraph, expr: relax.Expr, position: int) -> bool:
    index = graph.by_var.get(expr.id_) if isinstance(expr, relax.Var) else None
    return index is None or index < position


def _choose(match, ctx, graph, kind, cost, report, machine):  # noqa: ANN001, ANN202
    # the data's dtypes: a predicate inside the subgraph (a mask's condition) is bool, and so
    # is every value that feeds only predicates (the positions of ``arange(n) == last``)
    dtypes = {
        str(graph.nodes[i].var.ty.dtype) for i in match.members if not _feeds_predicates(graph, i)
    }
    for entry in match.entries:
        if not entry.constraints.admits(dtypes, match.sizes):
            report.declined[f"{entry.name}: constraints"] += 1
            continue
        for impl in entry.candidates(kind):
            verdict = impl.evaluate(match.sizes)
            if verdict is False or (verdict is None and impl.when is not None):
                continue
            if not impl.takes(dtypes):  # (its dtypes: the warehouse's data, checked at load)
                other = ", ".join(sorted(d for d in dtypes if not impl.takes([d])))
                report.declined[f"{entry.name}: {impl.name} takes no {other}"] += 1
                continue
            binder = BINDERS.get(impl.name)
            call = binder(ctx, match.members) if binder is not None else None
            if call is None:
                report.declined[f"{entry.name}: {impl.name} cannot express it"] += 1
                continue
            if not _one_float_dtype(call, graph):
                report.declined[f"{entry.name}: {impl.name} mixes float dtypes"] += 1
                continue
            if cost is not None and not _library_pays(
                call, match, graph, cost, kind, report, machine
            ):
                report.declined[f"{entry.name}: TIR predicted faster"] += 1
                return None
            return entry, impl, call
    return None


def _feeds_predicates(graph: OpGraph, index: int, depth: int = 0) -> bool:
    """``index`` is a bool value, or one read only to compute bool values (a mask's
    condition)."""
    node = graph.nodes[index]
    if str(getattr(node.var.ty, "dtype", "")) == "bool":
        return True
    if depth > 4 or not node.consumers or index in graph.outside_uses:
        return False
    return all(_feeds_predicates(graph, c, depth + 1) for c in node.consumers)


def _one_float_dtype(call: LibraryCall, graph: OpGraph) -> bool:
    """A library kernel computes in one float dtype: its float operands and its outputs agree
    (a half-precision GEMM whose float32 accumulator the binder did not round stays TIR)."""
    outs = [graph.nodes[i].var for i in (call.final, *call.extra)]
    dtypes = {
        str(e.ty.dtype)
        for e in (*call.args, *outs)
        if isinstance(e.ty, relax.TensorType) and str(e.ty.dtype).startswith(("float", "bfloat"))
    }
    return len(dtypes) <= 1


def _library_pays(call: LibraryCall, match, graph, cost, kind: str, report, machine) -> bool:  # noqa: ANN001, PLR0913
    """Whether the library call is predicted faster than the TIR of its subgraph; the
    predicted times go to the report (``stats["dispatch"]["decisions"]``)."""
    prices = None
    if isinstance(cost, LearnedDispatchCost):
        prices = _learned_prices(call, match, graph, cost, kind, machine)
    if prices is None:
        fallback = cost.fallback if isinstance(cost, LearnedDispatchCost) else cost
        prices = _analytic_prices(call, match, fallback, kind)
    if prices is None:
        return True  # symbolic sizes without a declared range: sized at run time, assume large
    library_us, tir_us, how = prices
    pays = library_us < tir_us
    if not pays and tir_unscheduled(match.members, graph, kind):  # (dispatch/unscheduled.py)
        pays, how = True, f"{how}; TIR unscheduled"
    report.decide(match.entries[0].name, call.kernel, library_us, tir_us, how, pays)
    return pays


def _operand_shapes(call: LibraryCall, graph, sizes: dict) -> tuple | None:  # noqa: ANN001
    """(shape, dtype) of each tensor operand and of the output, sizes put in; None when a size
    stays symbolic."""

    def static(ty) -> tuple[list[int], str] | None:  # noqa: ANN001
        dims = []
        for d in ty.shape.values:
            size = size_value(int(d) if isinstance(d, tvm.tirx.IntImm) else str(d), sizes)
            if size is None:
                return None
            dims.append(size)
        return dims, str(ty.dtype)

    inputs = []
    for arg in call.args:
        ty = arg.ty
        if isinstance(ty, relax.TensorType) and ty.shape is not None:
            shape = static(ty)
            if shape is None:
                return None
            inputs.append(shape)
    out_ty = graph.nodes[call.final].var.ty
    if not isinstance(out_ty, relax.TensorType) or out_ty.shape is None:
        return None
    out = static(out_ty)
    return None if out is None else (inputs, out)


def call_features(call: LibraryCall, match, graph, sizes: dict, kind: str, machine: KernelContext):  # noqa: ANN001, ANN201
    """The learned model's vector of a library call (None: a size stays symbolic)."""
    flops = work_of(match.graph, sizes)
    shapes = _operand_shapes(call, graph, sizes)
    if flops is None or shapes is None:
        return None
    native = kind == "llvm" and runs_natively(call.kernel, call.config, str(call.args[0].ty.dtype))
    return library_features(
        call.kernel, flops, shapes[0], shapes[1], native=native, threads=machine.threads
    )


def member_features(match, graph, sizes: dict, machine: KernelContext):  # noqa: ANN001, ANN201
    """The learned model's vectors of the subgraph's operators, each legalized alone: the TIR
    the library call replaces (None: an operator has no PrimFunc, or a size stays symbolic)."""
    vectors = []
    for index in match.members:
        func = graph.nodes[index].func
        vector = None
        if func is not None:
            vector = tir_features(
                func,
                gir=machine.gir,
                lanes=machine.lanes,
                threads=machine.threads,
                sizes=sizes,
            )
        if vector is None:
            return None
        vectors.append(vector)
    return vectors


def _learned_prices(call: LibraryCall, match, graph, cost: LearnedDispatchCost, kind: str, machine):  # noqa: ANN001, ANN202, PLR0913
    sizes = dict(cost.sizes)
    vector = call_features(call, match, graph, sizes, kind, machine)
    kernels = member_features(match, graph, sizes, machine)
    if vector is None or kernels is None:
        return None
    library_us = cost.model.predict_library_us([vector])[0]
    gflops = library_gflops(call.kernel, kind, measure=False)
    start = analytic_ratio(cost.fallback, vector, gflops)
    ratio = cost.model.predict_ratio(choice_features(vector, kernels, start))
    if ratio is None:
        return library_us, cost.model.predict_subgraph_us(kernels), "learned"
    return library_us, library_us * ratio, "learned"


def _analytic_prices(call: LibraryCall, match, cost: DispatchCost, kind: str):  # noqa: ANN001, ANN202
    sizes = dict(cost.sizes)
    flops = work_of(match.graph, sizes)
    if flops is None:
        return None
    nbytes = 0.0
    for arg in call.args:
        ty = arg.ty
        if isinstance(ty, relax.TensorType) and ty.shape is not None:
            n = 1
            for d in ty.shape.values:
                size = size_value(int(d) if isinstance(d, tvm.tirx.IntImm) else str(d), sizes)
                if size is None:
                    return None
                n *= size
            nbytes += n * tvm.runtime.DataType(str(ty.dtype)).bits / 8
    native = kind == "llvm" and runs_natively(call.kernel, call.config, str(call.args[0].ty.dtype))
    gflops = library_gflops(call.kernel, kind, measure=False)
    library_us = predict_library_us(cost, flops, nbytes, native, gflops)
    return library_us, predict_tir_us(cost, flops, nbytes), "analytic"
