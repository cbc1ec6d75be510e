"""DPFuseOps: mapping-type fusion with plan search (paper 004), a replacement for FuseOps.

For every dataflow block of every Relax function the pass builds the fusion graph (each binding a
node; ``call_tir`` of a PrimFunc with a ``map_pattern`` takes that class, anything else is
NotFuse; edges weighted by the bytes of the tensor they carry, marked when the consumer streams
that input contiguously), searches a plan (``dp``: algorithm 2; ``greedy``: the ablation), and
outlines every group of two or more kernels as a private Relax function with ``"Primitive":
True``, the form ``FuseTIR`` merges into one PrimFunc. Groups are convex and acyclic by
construction; a group whose intermediate values are used outside it returns them all (a
multi-output kernel). Run it after ``LegalizeOps`` + ``AnnotateMapPattern``.

Plans are priced by eq. 8 (``cost="bytes"``) or by the learned cost model's predicted time of
each group's fused kernel (``cost="learned"``, ``plus_tvm.costmodel.LearnedFusionCost``); a
block with a kernel of symbolic size keeps eq. 8. With the learned cost the module attribute
``plus.fusion_cost`` holds the chosen plans' predicted time beside that of the plans eq. 8
picks, and ``explain`` names the predicted times of every pair the cost kept apart.
"""

from __future__ import annotations

import heapq
import json
import re
from collections.abc import Sequence

import tvm
from plus_tvm.fusion import (
    Edge,
    FusionGraph,
    OpPattern,
    Plan,
    PlanCost,
    build_candidates,
    dp_plan,
    explain_plan,
    greedy_plan,
    split_groups,
    tvm_fusible,
    tvm_rule,
)
from plus_tvm.mapping import MapPattern, needs_contiguous_input
from tvm import relax, tirx

_CALL_TIR = tvm.ir.Op.get("relax.call_tir")
#: module attributes the pass writes (read by ``plus_tvm.stats``)
EXPLAIN_ATTR = "plus.fusion_explain"
COST_ATTR = "plus.fusion_cost"


def _no_prices() -> dict[str, float]:
    """The learned cost's record (``COST_ATTR``): predicted us of the chosen plans and of the
    plans eq. 8 picks, blocks priced, blocks left to eq. 8 (a symbolic kernel)."""
    return {"predicted_us": 0.0, "eq8_plan_us": 0.0, "blocks": 0, "eq8_blocks": 0}


_NUMBER = re.compile(r"\d+$")


@tvm.transform.module_pass(opt_level=0, name="DPFuseOps")
class DPFuseOps:
    """Fuse kernels by mapping-type rules and fusion-plan search.

    Parameters
    ----------
    search : {"dp", "greedy"}
        Algorithm 2 with pruning, or a single greedy scan (the ablation's baseline).
    rules : {"mapping", "tvm"}
        Table 1 over mapping classes, or TVM's op-pattern rules (the ablation's Rule_T).
    max_group_size : int
        Most kernels in one group.
    alpha, beta : float
        Weights of eq. 8 (memory traffic, group-size variance); ``alpha=None`` normalises the
        memory term by the block's total traffic.
    seed : int
        Seed of the randomised scans of algorithm 2 (the result is deterministic).
    max_starts : int
        Start nodes tried by algorithm 2.
    explain : bool
        Record, for every dependence left between two kernels, which rule, limit or cost kept
        them apart: a list of strings in the module attribute ``plus.fusion_explain``.
    cost : {"bytes", "learned"}
        Eq. 8 (``alpha``, ``beta``), or the predicted time of the plan's kernels.
    model : plus_tvm.costmodel.LearnedCostModel, optional
        The model of ``cost="learned"``.
    machine : plus_tvm.costmodel.KernelContext, optional
        Where the kernels run, as the model's vectors describe it (``cost="learned"``).
    """

    def __init__(
        self,
        search: str = "dp",
        rules: str = "mapping",
        max_group_size: int = 64,
        alpha: float | None = None,
        beta: float = 0.0,
        seed: int = 0,
        max_starts: int = 32,
        explain: bool = False,
        cost: str = "bytes",
        model: object = None,
        machine: object = None,
    ) -> None:
        if search not in ("dp", "greedy"):
            raise ValueError(f"DPFuseOps: search must be 'dp' or 'greedy', got {search!r}")
        if rules not in ("mapping", "tvm"):
            raise ValueError(f"DPFuseOps: rules must be 'mapping' or 'tvm', got {rules!r}")
        if cost not in ("bytes", "learned"):
            raise ValueError(f"DPFuseOps: cost must be 'bytes' or 'learned', got {cost!r}")
        if cost == "learned" and (model is None or machine is None):
            raise ValueError("DPFuseOps: cost='learned' needs the cost model and the machine")
        self.cost = cost
        self.model = model
        self.machine = machine
        self.search = search
        self.rules = rules
        self.max_group_size = max_group_size
        self.alpha = alpha
        self.beta = beta
        self.seed = seed
        self.max_starts = max_starts
        self.explain = explain

    # ------------------------------------------------------------------------------- driver
    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        builder = relax.BlockBuilder(mod)
        changed = False
        notes: list[str] = []
        priced = _no_prices()
        for gvar, func in list(mod.functions_items()):
            if not isinstance(func, relax.Function) or _is_primitive(func):
                continue
            fuser = _FunctionFuser(self, mod, builder)
            new_func = fuser.rewrite(func)
            notes += [f"{gvar.name_hint}: {line}" for line in fuser.notes]
            for key, value in fuser.priced.items():
                priced[key] += value
            if new_func is not None:
                builder.update_func(gvar, new_func)
                changed = True
        out = builder.get() if changed else mod
        if self.explain:
            out = out.with_attr(EXPLAIN_ATTR, notes)
        if self.cost == "learned":
            priced = {k: round(v, 3) if isinstance(v, float) else v for k, v in priced.items()}
            out = out.with_attr(COST_ATTR, json.dumps(priced))
        return out

    def plan(self, graph: FusionGraph, cost: PlanCost | None = None) -> Plan:
        """The plan of ``graph``, scored by ``cost`` (default eq. 8 with alpha and beta;
        another cost may also cut groups in two, ``split_groups``)."""
        table = build_candidates(graph, self.max_group_size)
        if self.search == "greedy":
            plan = greedy_plan(graph, table, self.max_group_size, self.alpha, self.beta, cost)
        else:
            plan = dp_plan(
                graph,
                table,
                self.max_group_size,
                self.alpha,
                self.beta,
                self.seed,
                self.max_starts,
                cost,
            )
        return plan if cost is None else split_groups(graph, plan, cost)


def _is_primitive(func: relax.Function) -> bool:
    return func.attrs is not None and bool(int(func.attrs.get("Primitive", 0)))


def _int64_shapes(prim: tirx.PrimFunc) -> bool:
    for param in prim.params:
        shape = getattr(param.ty, "shape", None)
        if shape is None:
            continue
        if any(str(getattr(dim, "ty", "int64")) != "int64" for dim in shape):
            return False
    return True


def _bytes(ty: object) -> float:
    """Size of a tensor (or tuple of tensors) in bytes; symbolic dims count as 1."""
    if isinstance(ty, relax.TupleType):
        return float(sum(_bytes(f) for f in ty.fields))
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return 1.0
    total = 1
    for dim in ty.shape.values:
        total *= int(dim) if isinstance(dim, tirx.IntImm) else 1
    dtype = tvm.runtime.DataType(str(ty.dtype))
    return float(total * max(1, dtype.bits * dtype.lanes // 8))


class _FunctionFuser:
    def __init__(self, owner: DPFuseOps, mod: tvm.IRModule, builder: relax.BlockBuilder) -> None:
        self.owner = owner
        self.mod = mod
        self.builder = builder
        self.notes: list[str] = []
        self.priced = _no_prices()
        self._vectors: dict[str, dict | None] = {}  # TIR vector per PrimFunc name
        self._input_sizes: set[int] = set()  # the symbolic sizes the function's inputs define

    def rewrite(self, func: relax.Function) -> relax.Function | None:
        self._input_sizes = {
            v.id_ for p in func.params for v in relax.analysis.definable_tir_vars_in_type(p.ty)
        }
        body = func.body
        if not isinstance(body, relax.SeqExpr):
            return None
        blocks = []
        changed = False
        for block in body.blocks:
            if isinstance(block, relax.DataflowBlock):
                new_block = self._fuse_block(block, body)
                changed |= new_block is not block
                blocks.append(new_block)
            else:
                blocks.append(block)
        if not changed:
            return None
        new_body = self.builder.normalize(relax.SeqExpr(blocks, body.body))
        new_func = relax.Function(func.params, new_body, func.ret_ty, func.is_pure, func.attrs)
        return self.builder.normalize(new_func)

    # ----------------------------------------------------------------------- graph building
    def _kernel(self, value: relax.Expr) -> tirx.PrimFunc | None:
        if not (isinstance(value, relax.Call) and value.op.same_as(_CALL_TIR)):
            return None
        callee = value.args[0]
        if not isinstance(callee, tvm.ir.GlobalVar):
            return None
        prim = self.mod[callee]
        if not isinstance(prim, tirx.PrimFunc) or prim.attrs is None:
            return None
        if "map_pattern" not in prim.attrs:
            return None  # unclassified kernels stay alone
        if not _int64_shapes(prim):
            # FuseTIR (0.27) cannot merge a kernel whose buffers have int32 dims with the int64
            # shapes of Relax tensors ("Inconsistent buffers ... mapped to the same relax var");
            # TVM's FuseOps fails on it too. Such a hand-written kernel stays alone.
            return None
        return prim

    def _graph(self, bindings: Sequence[relax.Binding]) -> FusionGraph:
        index = {b.var: i for i, b in enumerate(bindings)}
        tvm_rules = self.owner.rules == "tvm"
        patterns, edges, names = [], [], []
        for j, binding in enumerate(bindings):
            prim = self._kernel(binding.value) if isinstance(binding, relax.VarBinding) else None
            if prim is None and _is_projection(binding, index, bindings, self._kernel):
                # picking one output of a multi-output kernel moves no data
                patterns.append(OpPattern.Injective if tvm_rules else MapPattern.OneToOne)
                names.append("get")
            elif prim is None:
                patterns.append(OpPattern.Opaque if tvm_rules else MapPattern.NotFuse)
                names.append(binding.var.name)
            else:
                if tvm_rules:
                    patterns.append(OpPattern(int(prim.attrs.get("op_pattern", 8))))
                else:
                    patterns.append(MapPattern(int(prim.attrs["map_pattern"])))
                names.append(_NUMBER.sub("", binding.value.args[0].name_hint))
            for var in relax.analysis.free_vars(binding.value):
                i = index.get(var)
                if i is None:
                    continue
                contiguous = False
                if prim is not None:
                    args = list(binding.value.args[1].fields)
                    contiguous = any(
                        needs_contiguous_input(prim, k)
                        for k, a in enumerate(args)
                        if a.same_as(var)
                    )
                edges.append(Edge(i, j, _bytes(bindings[i].var.ty), contiguous))
        edges += _symbolic_edges(bindings, {(e.src, e.dst) for e in edges})
        if tvm_rules:
            return FusionGraph(patterns, edges, names, rule=tvm_rule, fusible=tvm_fusible)
        return FusionGraph(patterns, edges, names)

    def _price(self, bindings: Sequence[relax.Binding], graph: FusionGraph):  # noqa: ANN202
        """The learned plan cost of a block, or None (eq. 8) where a kernel it could fuse has
        no vector (a symbolic size)."""
        from plus_tvm.costmodel.features import tir_features
        from plus_tvm.costmodel.fusion_cost import LearnedFusionCost

        machine = self.owner.machine
        vectors: list[dict | None] = []
        for node, binding in enumerate(bindings):
            prim = self._kernel(binding.value) if isinstance(binding, relax.VarBinding) else None
            if prim is None:
                vectors.append(None)
                continue
            name = binding.value.args[0].name_hint
            if name not in self._vectors:
                self._vectors[name] = tir_features(
                    prim, gir=machine.gir, lanes=machine.lanes, threads=machine.threads
                )
            vector = self._vectors[name]
            if vector is None and graph.fusible(graph.patterns[node]):
                self.priced["eq8_blocks"] += 1
                return None
            vectors.append(vector)
        return LearnedFusionCost(self.owner.model, vectors)

    # ----------------------------------------------------------------------------- rewrite
    def _fuse_block(self, block: relax.DataflowBlock, body: relax.SeqExpr) -> relax.DataflowBlock:
        bindings = list(block.bindings)
        if len(bindings) < 2:
            return block
        graph = self._graph(bindings)
        price = self._price(bindings, graph) if self.owner.cost == "learned" else None
        plan = self.owner.plan(graph, price)
        if price is not None:
            eq8_plan = self.owner.plan(graph)
            self.priced["predicted_us"] += plan.cost
            self.priced["eq8_plan_us"] += price(graph, eq8_plan.assignment)
            self.priced["blocks"] += 1
        if self.owner.explain:
            group_us = (lambda nodes: price.group_us(graph, nodes)) if price else None
            self.notes += explain_plan(graph, plan, self.owner.max_group_size, group_us)
        groups = plan.groups()
        if all(len(g) == 1 for g in groups):
            return block
        used_after = _vars_used_after(block, body)
        new_bindings: list[relax.Binding] = []
        for group in _topological(graph, plan):
            # A projection whose multi-output kernel is outside the group reads an input of the
            # group: it is emitted just before the group, on its own.
            orphans = [
                i
                for i in group
                if isinstance(bindings[i].value, relax.TupleGetItem)
                and not any(p in group for p in graph.pred[i])
            ]
            new_bindings += [bindings[i] for i in orphans]
            group = [i for i in group if i not in orphans]
            if len(group) <= 1:
                new_bindings += [bindings[i] for i in group]
                continue
            members = set(group)
            outputs = [
                bindings[i].var
                for i in group
                if bindings[i].var in used_after
                or not isinstance(bindings[i].var, relax.DataflowVar)
                or any(u not in members for u in graph.succ[i])
            ]
            if any(not isinstance(v.ty, relax.TensorType) for v in outputs):
                # a whole tuple escapes the group: nested tuple results are not outlined
                new_bindings += [bindings[i] for i in group]
                continue
            new_bindings += self._outline([bindings[i] for i in group], outputs, graph, group)
        return relax.DataflowBlock(new_bindings)

    def _outline(
        self,
        members: list[relax.VarBinding],
        outputs: list[relax.Var],
        graph: FusionGraph,
        group: list[int],
    ) -> list[relax.Binding]:
        defined = {b.var for b in members}
        externals: list[relax.Expr] = []
        for b in members:
            for arg in _operands(b.value):
                if isinstance(arg, (relax.Var, tvm.ir.expr.Constant)) and arg not in defined:
                    if not any(arg.same_as(e) for e in externals):
                        externals.append(arg)
        params = [
            relax.Var(e.name if isinstance(e, relax.Var) else f"c{k}", e.ty)
            for k, e in enumerate(externals)
        ]
        # A symbolic size the group uses (its parameters' and outputs' shapes, its calls'
        # tir_vars) that no tensor parameter defines as a bare dimension (``s*8`` does not
        # define ``s``; a GPT-2 MLP's GELU chain reads the linear's ``[b*n, 3072]`` result and
        # writes ``[b, n, 3072]``) is passed in as one more parameter, a shape of those sizes:
        # it defines them in the outlined function, as TVM's FuseOps does (FuseTIR hands them
        # to the kernel as its size arguments). Such groups were left unfused before: every
        # operation of the chain one kernel.
        defined_syms: set[int] = set()
        for param in params:
            for sym in relax.analysis.definable_tir_vars_in_type(param.ty):
                defined_syms.add(sym.id_)
        used = [v for p in params for v in relax.analysis.tir_vars_in_type(p.ty)]
        for b in members:
            exprs = [*b.value.args[2:]] if isinstance(b.value, relax.Call) else []
            # (and a size passed among the arguments, ``call_tir(f, (x, n))``)
            exprs += [a for a in _operands(b.value) if not isinstance(a, _TENSOR_ARGS)]
            sizes = [v for e in exprs for v in relax.analysis.free_symbolic_vars(e)]
            if any(v.id_ not in defined_syms for v in sizes):
                # a kernel that takes such a size as its own argument (a MoE layer's
                # ``[s*t*2, 4]``): FuseTIR defines it twice when merging; left unfused
                return list(members)
            used += list(relax.analysis.tir_vars_in_type(b.var.ty))
        missing: list[tirx.Var] = []
        for sym in used:
            if sym.id_ not in defined_syms and not any(sym.same_as(m) for m in missing):
                missing.append(sym)
        outputs_define = {
            v.id_ for b in members for v in relax.analysis.definable_tir_vars_in_type(b.var.ty)
        }
        scalars = missing and any(not isinstance(e.ty, relax.TensorType) for e in externals)
        if scalars or any(
            sym.id_ not in outputs_define or sym.id_ not in self._input_sizes for sym in missing
        ):
            # left unfused: a size only ever inside composites (``[2*b, d]`` in and out: each
            # kernel would take ``b`` as its own size argument, which FuseTIR defines twice; so
            # it does for a size that also comes in as a scalar argument), or one a match_cast
            # defines (later passes may fold it to a constant where the kernel's size argument
            # must stay a variable)
            return list(members)
        if missing:
            externals.append(relax.ShapeExpr(missing))
            params.append(relax.Var("plus_sizes", relax.ShapeType(missing)))
        fb = relax.BlockBuilder()
        with fb.function("fused", params, attrs={"Primitive": True}, private=True):
            with fb.dataflow():
                remap: list[tuple[relax.Expr, relax.Expr]] = list(zip(externals, params))
                for b in members:
                    value = b.value
                    if isinstance(value, relax.TupleGetItem):
                        tup = _lookup(remap, value.tuple_value)
                        new_value = relax.TupleGetItem(tup, value.index)
                    else:
                        args = [_lookup(remap, a) for a in value.args[1].fields]
                        new_value = relax.Call(
                            value.op,
                            [value.args[0], relax.Tuple(args), *value.args[2:]],
                            value.attrs,
                            value.ty_args,
                        )
                    new_var = fb.emit(new_value, name_hint=b.var.name)
                    remap.append((b.var, new_var))
                outs = [_lookup(remap, v) for v in outputs]
                ret = fb.emit_output(outs[0] if len(outs) == 1 else relax.Tuple(outs))
            fb.emit_func_output(ret)
        # fresh symbolic shape variables: ``main``'s may not be defined in another function too
        fused = relax.utils.copy_with_new_vars(fb.get()["fused"])
        name = "fused_" + "_".join(graph.names[i] for i in group)
        gvar = self.builder.add_func(fused, name[:120])
        call = self.builder.normalize(relax.Call(gvar, externals))
        if len(outputs) == 1:
            return [relax.VarBinding(outputs[0], call)]
        tuple_var = relax.DataflowVar(f"{name[:40]}_out", call.ty)
        out = [relax.VarBinding(tuple_var, call)]
        for k, var in enumerate(outputs):
            item = self.builder.normalize(relax.TupleGetItem(tuple_var, k))
            out.append(relax.VarBinding(var, item))
        return out


def _symbolic_edges(bindings: Sequence[relax.Binding], data: set[tuple[int, int]]) -> list[Edge]:
    """Dependences through symbolic sizes: a binding whose value or type uses a size that a
    ``match_cast`` defines must stay after it, although it does not read the cast's variable
    (``gv = call_tir(f, x, out_ty=(s,))`` after ``match_cast(shape, [s])``). They carry no
    tensor (weight 0); without them a rebuilt block could use ``s`` before it is computed.
    """
    definer: dict[int, int] = {}
    edges: list[Edge] = []
    for j, binding in enumerate(bindings):
        used = list(relax.analysis.free_symbolic_vars(binding.value))
        used += list(relax.analysis.tir_vars_in_type(binding.var.ty))
        for i in sorted({definer[v.id_] for v in used if v.id_ in definer} - {j}):
            if (i, j) not in data:
                edges.append(Edge(i, j, 0.0, False))
        if isinstance(binding, relax.MatchCast):
            for sym in relax.analysis.definable_tir_vars_in_type(binding.ty):
                definer.setdefault(sym.id_, j)
    return edges


_TENSOR_ARGS = (relax.Var, tvm.ir.expr.Constant)


def _operands(value: relax.Expr) -> list[relax.Expr]:
    """The values a fusible binding reads: call_tir arguments, or a projection's tuple."""
    if isinstance(value, relax.TupleGetItem):
        return [value.tuple_value]
    return list(value.args[1].fields)


def _is_projection(binding: relax.Binding, index: dict, bindings: Sequence, kernel) -> bool:
    """``v = t[k]`` where ``t`` is a (multi-output) kernel call bound in the same block."""
    value = binding.value
    if not isinstance(binding, relax.VarBinding) or not isinstance(value, relax.TupleGetItem):
        return False
    src = index.get(value.tuple_value)
    return src is not None and kernel(bindings[src].value) is not None


def _lookup(pairs: list[tuple[relax.Expr, relax.Expr]], expr: relax.Expr) -> relax.Expr:
    for old, new in pairs:
        if old.same_as(expr):
            return new
    return expr


def _vars_used_after(block: relax.DataflowBlock, body: relax.SeqExpr) -> set[relax.Var]:
    """Variables of ``block`` used by later blocks or by the function's result."""
    used: set[relax.Var] = set(relax.analysis.free_vars(body.body))
    seen = False
    for blk in body.blocks:
        if blk.same_as(block):
            seen = True
            continue
        if seen:
            for b in blk.bindings:
                used |= set(relax.analysis.free_vars(b.value))
    return used


def _topological(graph: FusionGraph, plan: Plan) -> list[list[int]]:
    """Groups in an order that respects every dependence (stable: by first member)."""
    groups = plan.groups()
    gid = {v: k for k, g in enumerate(groups) for v in g}
    indeg = [0] * len(groups)
    succ: list[set[int]] = [set() for _ in groups]
    for e in graph.all_edges():
        a, b = gid[e.src], gid[e.dst]
        if a != b and b not in succ[a]:
            succ[a].add(b)
            indeg[b] += 1
    ready = [(groups[k][0], k) for k in range(len(groups)) if indeg[k] == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        _, k = heapq.heappop(ready)
        order.append(groups[k])
        for s in succ[k]:
            indeg[s] -= 1
            if indeg[s] == 0:
                heapq.heappush(ready, (groups[s][0], s))
    if len(order) != len(groups):  # pragma: no cover - plans are acyclic by construction
        raise RuntimeError("DPFuseOps: fusion plan has a cycle")
    return order
