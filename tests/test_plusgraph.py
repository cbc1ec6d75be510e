"""+Loop / +Graph: construction (paper 000 figures 5-8), collapse, text, parser, matching."""

from __future__ import annotations

import numpy as np
import pytest
import tvm
from plus_tvm.plusgraph import (
    LoopOperator,
    PlusGraphBuilder,
    PlusGraphSyntaxError,
    TensorAccess,
    full_match,
    parse_plusgraph,
    partial_match,
    plusgraph_of,
    unbatched,
)
from tvm import relax
from tvm.script import tirx as T  # noqa: N812


def op(name, sizes, reduce, ops, reads, writes):
    return LoopOperator(
        name,
        tuple(sizes),
        tuple(reduce),
        tuple(ops),
        tuple(TensorAccess(t, tuple(d)) for t, d in reads),
        tuple(TensorAccess(t, tuple(d)) for t, d in writes),
    )


# Figure 6: GEMM followed by softmax, as the six basic operators of the paper (M, N, K symbolic)
MATMUL = op(
    "matmul",
    ["M", "N", "K"],
    [0, 0, 1],
    ["dot"],
    [("x0", (0, 2)), ("x1", (2, 1))],
    [("x2", (0, 1))],
)
RMAX = op("reduce_max", ["M", "N"], [0, 1], ["reduceMax"], [("x2", (0, 1))], [("x3", (0,))])
SUB = op("sub", ["M", "N"], [0, 0], ["sub"], [("x2", (0, 1)), ("x3", (0,))], [("x4", (0, 1))])
EXP = op("exp", ["M", "N"], [0, 0], ["exp"], [("x4", (0, 1))], [("x5", (0, 1))])
RSUM = op("reduce_sum", ["M", "N"], [0, 1], ["reduceSum"], [("x5", (0, 1))], [("x6", (0,))])
DIV = op("div", ["M", "N"], [0, 0], ["div"], [("x5", (0, 1)), ("x6", (0,))], [("x7", (0, 1))])


def build(*ops):
    b = PlusGraphBuilder()
    for o in ops:
        b.add(o)
    return b.graph()


def test_figure6_walkthrough_each_step():
    assert build(MATMUL).to_text() == (
        "loop0 [M, para]\n  loop1 [N, para]\n    loop2 [K, non-para, (dot)]"
    )
    # (c) primitive 2: N becomes non-parallelizable
    assert build(MATMUL, RMAX).to_text() == (
        "loop0 [M, para]\n  loop1 [N, non-para, (reduceMax)]\n    loop2 [K, non-para, (dot)]"
    )
    # (d) primitive 3: a new N loop after the non-parallelizable one
    assert build(MATMUL, RMAX, SUB).to_text() == (
        "loop0 [M, para]\n  loop1 [N, non-para, (reduceMax)]\n    loop2 [K, non-para, (dot)]\n"
        "  loop3 [N, para, (sub)]"
    )
    # (g) / figure 8
    full = build(MATMUL, RMAX, SUB, EXP, RSUM, DIV)
    assert full.to_text() == (
        "loop0 [M, para]\n"
        "  loop1 [N, non-para, (reduceMax)]\n"
        "    loop2 [K, non-para, (dot)]\n"
        "  loop3 [N, non-para, (sub, exp, reduceSum)]\n"
        "  loop4 [N, para, (div)]"
    )
    # figure 8's tensors per loop body
    loop4 = full.roots[0].children[2]
    assert loop4.inputs == ("x5", "x6") and loop4.outputs == ("x7",)


def test_partial_match_case_study():
    """Section 4.2: +Graph0 (fig. 6d) is a partial state of +Graph1 (fig. 6g), not a match."""
    graph1 = parse_plusgraph(
        """
        loop0 [M, para]
          loop1 [N, non-para, (reduceMax)]
            loop2 [K, non-para, (dot)]
          loop3 [N, non-para, (reduceSum)]
          loop4 [N, para]
        """.replace("        ", "", 1).replace("\n        ", "\n")
    )
    graph0 = build(MATMUL, RMAX, SUB)
    assert full_match(graph1, graph0) is None
    assert partial_match(graph1, graph0) == {"M": "M", "N": "N", "K": "K"}
    assert full_match(graph1, build(MATMUL, RMAX, SUB, EXP, RSUM, DIV)) is not None


@pytest.mark.parametrize(
    "pattern, ok",
    [
        ("loop0 [M, para]\n  loop1 [N, non-para]", True),  # criterion 1: non-para accepts para
        ("loop0 [M, non-para]\n  loop1 [N, para]", True),
        ("loop0 [M, para]\n  loop1 [N, para]\n  loop2 [N, para]", True),  # criterion 3: room
        ("loop0 [M, para]", False),  # criterion 3: fewer nested loops than the subgraph
        ("loop0 [M, para]\n  loop1 [M, para]", False),  # sizes unify: M already bound
        ("loop0 [8, para]\n  loop1 [N, para]", False),  # integer size must be equal
    ],
)
def test_partial_match_criteria(pattern, ok):
    graph = build(
        op("add", ["M", "N"], [0, 0], ["add"], [("a", (0, 1)), ("c", (1,))], [("b", (0, 1))])
    )
    assert graph.to_text() == "loop0 [M, para]\n  loop1 [N, para, (add)]"
    assert (partial_match(parse_plusgraph(pattern), graph) is not None) == ok


def test_criterion4_key_ops_must_agree():
    graph = build(RMAX)  # M para > N non-para (reduceMax)
    assert (
        partial_match(parse_plusgraph("loop0 [M, para]\n  loop1 [N, non-para, (reduceSum)]"), graph)
        is None
    )
    assert partial_match(
        parse_plusgraph("loop0 [M, para]\n  loop1 [N, non-para, (reduceMax)]"), graph
    )
    # a loop that names an operation the subgraph has not met yet may still grow into it
    add = build(
        op("add", ["M", "N"], [0, 0], ["add"], [("a", (0, 1)), ("c", (1,))], [("b", (0, 1))])
    )
    assert partial_match(
        parse_plusgraph("loop0 [M, para]\n  loop1 [N, non-para, (reduceMax)]"), add
    )
    assert full_match(parse_plusgraph("loop0 [M, para]\n  loop1 [N, para, (exp)]"), add) is None


def test_criterion2_para_pattern_needs_para_loop():
    graph = build(RMAX)  # M para > N non-para
    assert partial_match(parse_plusgraph("loop0 [M, para]\n  loop1 [N, para]"), graph) is None
    assert partial_match(parse_plusgraph("loop0 [M, para]\n  loop1 [N, non-para]"), graph)


def test_full_match_ignores_trivial_ops_but_not_key_ops():
    gemm = parse_plusgraph("loop0 [M, para]\n  loop1 [N, para]\n    loop2 [K, non-para, (dot)]")
    bias = op("add", ["M", "N"], [0, 0], ["add"], [("x2", (0, 1)), ("b", (1,))], [("y", (0, 1))])
    assert full_match(gemm, build(MATMUL, bias)) == {"M": "M", "N": "N", "K": "K"}
    summed = op("rsum", ["M", "K"], [0, 1], ["reduceSum"], [("x0", (0, 1))], [("s", (0,))])
    assert full_match(gemm, build(summed)) is None  # reduceSum is not the pattern's dot


def _legalized(fn, *shapes):
    bb = relax.BlockBuilder()
    xs = [relax.Var(f"x{i}", relax.TensorType(s, "float32")) for i, s in enumerate(shapes)]
    with bb.function("main", xs):
        out = bb.emit(fn(*xs))
        bb.emit_func_output(out)
    mod = relax.transform.LegalizeOps()(bb.get())
    return next(f for _, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc))


def test_batch_matmul_collapse_primitive4():
    """[B, L, M, N, D] -> [B*L, M, N, D]: B and L index the same tensors."""
    func = _legalized(relax.op.matmul, (2, 3, 32, 64), (2, 3, 64, 48))
    assert plusgraph_of(func).to_text() == (
        "loop0 [6, para]\n  loop1 [32, para]\n    loop2 [48, para]\n"
        "      loop3 [64, non-para, (dot, mul)]"
    )
    b = PlusGraphBuilder()
    for o in __import__("plus_tvm.plusgraph", fromlist=["loop_operators"]).loop_operators(
        func, ["a", "b", "c"], "f"
    ):
        b.add(o)
    assert len(list(b.graph(collapse_loops=False).loops())) == 5


def test_unbatched_strips_a_loop_enclosing_every_nest():
    batched = parse_plusgraph(
        "loop0 [N, para]\n  loop1 [P, para]\n    loop2 [C, para]\n"
        "loop3 [N, para]\n  loop4 [HW, para]\n    loop5 [K, non-para, (dot)]"
    )
    assert unbatched(batched).to_text() == (
        "loop0 [P, para]\n  loop1 [C, para]\nloop2 [HW, para]\n  loop3 [K, non-para, (dot)]"
    )
    # not a batch: roots of different sizes, a reduction root, a root that computes
    for text in (
        "loop0 [N, para]\n  loop1 [P, para]\nloop2 [M, para]\n  loop3 [K, para]",
        "loop0 [N, non-para]\n  loop1 [P, para]",
        "loop0 [N, para, (exp)]\n  loop1 [P, para]",
        "loop0 [N, para]",
    ):
        assert unbatched(parse_plusgraph(text)) is None, text


def test_gemm_does_not_collapse_m_and_n():
    func = _legalized(relax.op.matmul, (32, 64), (64, 48))
    assert plusgraph_of(func).to_text() == (
        "loop0 [32, para]\n  loop1 [48, para]\n    loop2 [64, non-para, (dot, mul)]"
    )


def test_softmax_and_layer_norm_from_tir():
    softmax = plusgraph_of(_legalized(relax.op.nn.softmax, (32, 64)))
    assert softmax.to_text(key_ops_only=True) == (
        "loop0 [32, para]\n  loop1 [64, non-para, (reduceMax)]\n"
        "  loop2 [64, non-para, (reduceSum)]\n  loop3 [64, para]"
    )
    ones = relax.const(np.ones(64, "float32"))
    ln = plusgraph_of(
        _legalized(lambda x: relax.op.nn.layer_norm(x, ones, ones, axes=[-1]), (32, 64))
    )
    # two-pass layer norm: the variance's sum of squares is a reduceSum, not a dot
    assert ln.to_text(key_ops_only=True) == (
        "loop0 [32, para]\n  loop1 [64, non-para, (reduceSum)]\n"
        "  loop2 [64, non-para, (reduceSum)]\n  loop3 [64, para]"
    )


def test_symbolic_sizes():
    n = tvm.tirx.Var("n", "int64")
    func = _legalized(relax.op.nn.softmax, (n, 64))
    graph = plusgraph_of(func)
    assert graph.roots[0].size == "n"
    assert graph.size_names() == {"n"}


@T.prim_func(private=True, s_tir=True)
def _user_rowsum(a: T.Buffer((8, 16), "float32"), out: T.Buffer((8,), "float32")):
    for i, j in T.grid(8, 16):
        with T.sblock("rowsum"):
            vi, vj = T.axis.remap("SR", [i, j])
            with T.init():
                out[vi] = T.float32(0)
            out[vi] = out[vi] + a[vi, vj] * T.float32(2)


def test_user_call_tir_primfunc_gets_loops():
    graph = plusgraph_of(_user_rowsum, ["a", "out"])
    assert graph.to_text() == "loop0 [8, para]\n  loop1 [16, non-para, (reduceSum, mul)]"


def test_parser_round_trip_and_long_words():
    text = (
        "loop0 [M, para] {x0,x1}:{x7}\n"
        "  loop1 [N, non-para, (reduceMax)] {x2}:{x3}\n"
        "    loop2 [K, non-para, (dot)] {x0,x1}:{x2}\n"
        "  loop3 [B*L, para, (sub, exp)] {x2,x3}:{x6}"
    )
    graph = parse_plusgraph(text)
    assert graph.to_text(io=True) == text
    assert parse_plusgraph(graph.to_text()) == graph
    long = parse_plusgraph("loop0 [M, parallelizable]\n  loop1 [N, non-parallelizable]")
    assert long.to_text() == "loop0 [M, para]\n  loop1 [N, non-para]"


@pytest.mark.parametrize(
    "text, line, words",
    [
        ("loop0 [M, para]\n  loop1 [N, sometimes]", 2, "parallelism"),
        ("loop0 [M, para]\nloop2 [N, para]", 2, "expected loop1"),
        ("loop0 [M, para]\n    loop1 [N, para]", 2, "deeper"),
        ("loop0 [M para]", 1, "expected"),
        ("loop0 [M, para]\n\tloop1 [N, para]", 2, "tabs"),
        ("", 1, "empty"),
        ("loop0 [M-1, para]", 1, "size"),
    ],
)
def test_parser_errors_name_the_line(text, line, words):
    with pytest.raises(PlusGraphSyntaxError) as err:
        parse_plusgraph(text)
    assert err.value.line == line
    assert words in str(err.value)
