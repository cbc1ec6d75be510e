"""Mapping classes (paper 004, section 3.1): the op registry, the TIR analysis, table 1's rules."""

from __future__ import annotations

import plus_tvm  # noqa: F401  (registers MapOpPattern on import)
import pytest
import tvm
from plus_tvm.mapping import (
    OP_MAP_PATTERNS,
    MapPattern,
    analyze_primfunc,
    fuse_rule,
    most_complex,
    needs_contiguous_input,
    op_map_pattern,
)
from plus_tvm.mapping.op_table import relax_op_names, unclassified
from plus_tvm.passes import AnnotateMapPattern
from tvm import relax, tirx
from tvm.script import ir as I  # noqa: N812
from tvm.script import relax as R  # noqa: N812
from tvm.script import tirx as T  # noqa: N812

M = MapPattern


# ------------------------------------------------------------------------------------ registry
def test_classes_are_ordered_by_complexity():
    assert [int(p) for p in M] == [0, 1, 2, 3, 4, 5]
    assert [p.name for p in M] == [
        "OneToOne",
        "Reorganize",
        "Shuffle",
        "OneToMany",
        "ManyToMany",
        "NotFuse",
    ]
    assert most_complex(M.OneToOne, M.Shuffle, M.Reorganize) == M.Shuffle


def test_every_relax_operator_has_a_mapping_class():
    names = relax_op_names()
    assert len(names) >= 230
    assert unclassified(names) == []
    for name in names:
        assert op_map_pattern(name) == OP_MAP_PATTERNS[name], name


@pytest.mark.parametrize(
    "op, expected",
    [
        ("relax.add", M.OneToOne),
        ("relax.nn.gelu", M.OneToOne),
        ("relax.reshape", M.Reorganize),
        ("relax.permute_dims", M.Shuffle),
        ("relax.broadcast_to", M.OneToMany),
        ("relax.tile", M.OneToMany),
        ("relax.matmul", M.ManyToMany),
        ("relax.nn.conv2d", M.ManyToMany),
        ("relax.nn.softmax", M.ManyToMany),
        ("relax.nn.layer_norm", M.ManyToMany),
        ("relax.call_tir", M.NotFuse),
        ("relax.call_dps_packed", M.NotFuse),
        ("relax.shape_of", M.NotFuse),
        ("relax.sort", M.NotFuse),
    ],
)
def test_registered_classes_follow_section_3_1(op, expected):
    assert op_map_pattern(op) == expected
    assert int(tvm.ir.Op.get(op).get_attr("MapOpPattern")) == int(expected)


def test_unknown_operator_is_an_error():
    with pytest.raises(Exception, match="not registered|no MapOpPattern"):
        op_map_pattern("relax.no_such_op")


# ---------------------------------------------------------------- analysis vs registry (legalize)
n = tirx.Var("n", "int64")
F = "float32"

# (builder over relax Vars, input (shape, dtype) list) per op; each runs at several shapes.
SHAPES = [(4, 8), (3, 5), (1, 16), (n, 6)]


def _unary(fn):
    return lambda s: (fn, [(s, F)])


CASES = {
    "relax.add": lambda s: (relax.op.add, [(s, F), (s[-1:], F)]),
    "relax.multiply": lambda s: (relax.op.multiply, [(s, F), (s, F)]),
    "relax.where": lambda s: (relax.op.where, [(s, "bool"), (s, F), (s, F)]),
    "relax.exp": _unary(relax.op.exp),
    "relax.sigmoid": _unary(relax.op.sigmoid),
    "relax.nn.gelu": _unary(relax.op.nn.gelu),
    "relax.nn.relu": _unary(relax.op.nn.relu),
    "relax.nn.silu": _unary(relax.op.nn.silu),
    "relax.clip": _unary(lambda x: relax.op.clip(x, 0.0, 6.0)),
    "relax.astype": _unary(lambda x: relax.op.astype(x, "float16")),
    "relax.tril": _unary(relax.op.tril),
    "relax.reshape": _unary(lambda x: relax.op.reshape(x, (-1,))),
    "relax.flatten": _unary(relax.op.flatten),
    "relax.expand_dims": _unary(lambda x: relax.op.expand_dims(x, 1)),
    "relax.strided_slice": _unary(lambda x: relax.op.strided_slice(x, [1], [0], [2], [1])),
    "relax.concat": lambda s: (lambda a, b: relax.op.concat([a, b], axis=1), [(s, F), (s, F)]),
    "relax.flip": _unary(lambda x: relax.op.flip(x, axis=1)),
    "relax.nn.pad": _unary(lambda x: relax.op.nn.pad(x, [0, 0, 1, 2])),
    "relax.take": lambda s: (lambda x, i: relax.op.take(x, i, axis=0), [(s, F), ((7,), "int64")]),
    "relax.permute_dims": _unary(relax.op.permute_dims),
    "relax.broadcast_to": lambda s: (lambda x: relax.op.broadcast_to(x, (2, *s)), [(s, F)]),
    "relax.tile": _unary(lambda x: relax.op.tile(x, (2, 1))),
    "relax.repeat": _unary(lambda x: relax.op.repeat(x, 2, axis=1)),
    "relax.ones_like": _unary(relax.op.ones_like),
    "relax.sum": _unary(lambda x: relax.op.sum(x, axis=[1])),
    "relax.mean": _unary(lambda x: relax.op.mean(x, axis=[0])),
    "relax.max": _unary(lambda x: relax.op.max(x, axis=[1])),
    "relax.argmax": _unary(lambda x: relax.op.argmax(x, axis=1)),
    "relax.matmul": lambda s: (relax.op.matmul, [(s, F), ((s[-1], 3), F)]),
    "relax.nn.softmax": _unary(relax.op.nn.softmax),
    "relax.nn.layer_norm": lambda s: (
        lambda x, g, b: relax.op.nn.layer_norm(x, g, b, [1]),
        [(s, F), (s[-1:], F), (s[-1:], F)],
    ),
    "relax.nn.rms_norm": lambda s: (
        lambda x, g: relax.op.nn.rms_norm(x, g, [1]),
        [(s, F), (s[-1:], F)],
    ),
}


# Where the shape makes an op's kernel simpler than its operator class, the analysis must say so:
# transposing a (1, 16) tensor moves only a unit axis and keeps the element order (a reshape).
EXCEPTIONS = {("relax.permute_dims", (1, 16)): M.Reorganize}


def _legalized_classes(build, inputs) -> list[MapPattern]:
    bb = relax.BlockBuilder()
    params = [
        relax.Var(f"x{i}", relax.TensorType(shape, dt)) for i, (shape, dt) in enumerate(inputs)
    ]
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(build(*params))
        bb.emit_func_output(out)
    mod = relax.transform.LegalizeOps()(bb.get())
    return [analyze_primfunc(f) for _, f in mod.functions_items() if isinstance(f, tirx.PrimFunc)]


@pytest.mark.parametrize("op", sorted(CASES))
@pytest.mark.parametrize("shape", SHAPES, ids=["4x8", "3x5", "1x16", "nx6"])
def test_tir_analysis_agrees_with_registered_class(op, shape):
    build, inputs = CASES[op](shape)
    classes = _legalized_classes(build, inputs)
    assert classes, f"{op} legalized to no PrimFunc"
    expected = EXCEPTIONS.get((op, shape), op_map_pattern(op))
    assert most_complex(*classes) == expected, (op, shape, classes)


def test_every_registered_class_is_covered_by_the_consistency_cases():
    covered = {op_map_pattern(op) for op in CASES}
    assert covered == set(M) - {M.NotFuse}


# ------------------------------------------------------------------------ hand-written TIR
@T.prim_func(private=True, s_tir=True)
def my_transpose(a: T.Buffer((8, 4), "float32"), b: T.Buffer((4, 8), "float32")):
    for i, j in T.grid(4, 8):
        with T.sblock("t"):
            vi, vj = T.axis.remap("SS", [i, j])
            b[vi, vj] = a[vj, vi]


@T.prim_func(private=True, s_tir=True)
def my_scale_add(
    a: T.Buffer((4, 8), "float32"), s: T.Buffer((8,), "float32"), b: T.Buffer((4, 8), "float32")
):
    for i, j in T.grid(4, 8):
        with T.sblock("e"):
            vi, vj = T.axis.remap("SS", [i, j])
            b[vi, vj] = a[vi, vj] * s[vj] + T.float32(1)


@T.prim_func(private=True, s_tir=True)
def my_matmul(
    a: T.Buffer((4, 8), "float32"), w: T.Buffer((8, 3), "float32"), c: T.Buffer((4, 3), "float32")
):
    for i, j, k in T.grid(4, 3, 8):
        with T.sblock("mm"):
            vi, vj, vk = T.axis.remap("SSR", [i, j, k])
            with T.init():
                c[vi, vj] = T.float32(0)
            c[vi, vj] = c[vi, vj] + a[vi, vk] * w[vk, vj]


@T.prim_func(private=True, s_tir=True)
def my_repeat(a: T.Buffer((4,), "float32"), b: T.Buffer((12,), "float32")):
    for i in range(12):
        with T.sblock("r"):
            vi = T.axis.spatial(12, i)
            b[vi] = a[vi // 3]


@T.prim_func(private=True, s_tir=True)
def my_fill(b: T.Buffer((4, 4), "float32")):
    for i, j in T.grid(4, 4):
        with T.sblock("f"):
            vi, vj = T.axis.remap("SS", [i, j])
            b[vi, vj] = T.float32(2)


@pytest.mark.parametrize(
    "func, expected",
    [
        (my_transpose, M.Shuffle),
        (my_scale_add, M.OneToOne),
        (my_matmul, M.ManyToMany),
        (my_repeat, M.OneToMany),
        (my_fill, M.OneToMany),
    ],
    ids=["transpose", "scale_add", "matmul", "repeat", "fill"],
)
def test_tir_analysis_of_user_written_primfuncs(func, expected):
    assert analyze_primfunc(func) == expected


@I.ir_module
class ReshapeTransposeAdd:
    @R.function
    def main(x: R.Tensor((4, 8), "float32"), y: R.Tensor((8, 4), "float32")):  # noqa: N805
        with R.dataflow():
            a = R.reshape(x, (8, 4))
            b = R.add(a, y)
            c = R.permute_dims(b)
            d = R.nn.relu(c)
            R.output(d)
        return d


def test_fused_kernel_takes_the_most_complex_member_class():
    seq = tvm.transform.Sequential(
        [
            relax.transform.LegalizeOps(),
            relax.transform.AnnotateTIROpPattern(),
            relax.transform.FuseOps(),
            relax.transform.FuseTIR(),
            AnnotateMapPattern(),
        ]
    )
    mod = seq(ReshapeTransposeAdd)
    prims = {gv.name_hint: f for gv, f in mod.functions_items() if isinstance(f, tirx.PrimFunc)}
    classes = {name: M(int(f.attrs["map_pattern"])) for name, f in prims.items()}
    # reshape (Reorganize) + add (OneToOne) + transpose (Shuffle) + relu: one kernel, Shuffle.
    assert classes == {"fused_reshape_add_transpose_relu": M.Shuffle}


# --------------------------------------------------------------------------- the annotation pass
def test_annotate_map_pattern_sets_every_primfunc_and_keeps_the_input(deep_copy):
    legal = relax.transform.LegalizeOps()(ReshapeTransposeAdd)
    before = deep_copy(legal)
    out = AnnotateMapPattern()(legal)
    tvm.ir.assert_structural_equal(legal, before)  # input untouched
    got = {
        gv.name_hint: M(int(f.attrs["map_pattern"]))
        for gv, f in out.functions_items()
        if isinstance(f, tirx.PrimFunc)
    }
    assert got == {
        "reshape": M.Reorganize,
        "add": M.OneToOne,
        "transpose": M.Shuffle,
        "relu": M.OneToOne,
    }


def test_annotate_map_pattern_keeps_a_pinned_class_unless_overwrite():
    pinned = my_scale_add.with_attr("map_pattern", tirx.IntImm("int32", int(M.ManyToMany)))
    mod = tvm.IRModule({"k": pinned})
    kept = AnnotateMapPattern()(mod)
    assert int(kept["k"].attrs["map_pattern"]) == int(M.ManyToMany)
    redone = AnnotateMapPattern(overwrite=True)(mod)
    assert int(redone["k"].attrs["map_pattern"]) == int(M.OneToOne)


def test_plus_pipeline_annotates_kernels():
    stats = plus_tvm.inspect(ReshapeTransposeAdd)
    assert stats["kernels"] >= 1


# ---------------------------------------------------------------------------------- table 1
@pytest.mark.parametrize(
    "producer, consumer, fused, rule",
    [
        (M.OneToOne, M.ManyToMany, M.ManyToMany, "rule 1"),
        (M.ManyToMany, M.OneToOne, M.ManyToMany, "rule 1"),  # epilogue
        (M.OneToOne, M.OneToOne, M.OneToOne, "rule 1"),
        (M.Reorganize, M.OneToOne, M.Reorganize, "rule 1"),
        (M.Reorganize, M.Reorganize, M.Reorganize, "rule 2"),
        (M.Reorganize, M.Shuffle, M.Shuffle, "rule 2"),
        (M.Shuffle, M.Reorganize, M.Shuffle, "rule 3"),
        (M.Shuffle, M.Shuffle, M.Shuffle, "rule 3"),
        (M.Reorganize, M.ManyToMany, M.ManyToMany, "supplement 1"),
        (M.Shuffle, M.OneToMany, M.OneToMany, "supplement 1"),
        (M.ManyToMany, M.Reorganize, M.ManyToMany, "supplement 1"),  # matmul -> reshape
        (M.ManyToMany, M.Shuffle, M.ManyToMany, "supplement 1"),
        (M.ManyToMany, M.OneToMany, M.ManyToMany, "supplement 2"),
    ],
)
def test_fusion_rules_accept(producer, consumer, fused, rule):
    decision = fuse_rule(producer, consumer)
    assert decision.ok and decision.fused == fused
    assert decision.rule.startswith(rule)


@pytest.mark.parametrize(
    "producer, consumer",
    [
        (M.OneToMany, M.ManyToMany),
        (M.ManyToMany, M.ManyToMany),
        (M.OneToMany, M.OneToMany),
        (M.NotFuse, M.OneToOne),
        (M.OneToOne, M.NotFuse),
    ],
)
def test_fusion_rules_reject(producer, consumer):
    decision = fuse_rule(producer, consumer)
    assert not decision.ok and decision.fused is None and decision.rule


def test_supplement_1_rejects_a_consumer_that_needs_contiguous_input():
    assert not fuse_rule(M.Shuffle, M.ManyToMany, consumer_needs_contiguous=True).ok
    assert "contiguous" in fuse_rule(M.Reorganize, M.OneToMany, True).rule
    # The condition is about the consumer: a reordering *after* a matmul is unaffected.
    assert fuse_rule(M.ManyToMany, M.Shuffle, consumer_needs_contiguous=True).ok


def test_contiguity_is_read_from_the_consumer_access_pattern():
    # matmul streams A[i, k] along k (its innermost, reduction iterator) but reads W[k, j]
    # across rows: only A needs contiguous order.
    assert needs_contiguous_input(my_matmul, 0) is True
    assert needs_contiguous_input(my_matmul, 1) is False
    # a row-wise elementwise kernel streams its main input along j, not the broadcast scale
    assert needs_contiguous_input(my_scale_add, 0) is True
    assert needs_contiguous_input(my_transpose, 0) is False
