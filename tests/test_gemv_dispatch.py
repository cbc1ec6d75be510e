"""Matrix-vector products (a linear over one row) are GEMMs with M = 1 and go to the library.

The +Graph builder drops loops of extent 1, so a batch-1 linear has no ``M`` loop; the matcher
takes the pattern's missing spatial loop as a unit loop (``plusgraph.match``), and an entry that
needs no unit loop beats one that does (a GEMM is not read as a one-pixel convolution).
"""

from __future__ import annotations

import copy

import plus_tvm
import pytest
import torch
from plus_tvm import zoo
from plus_tvm.dispatch.identify import Identifier
from plus_tvm.dispatch.opgraph import OpGraph
from plus_tvm.pattern_warehouse import load_warehouse
from plus_tvm.plusgraph import full_match, full_match_units, parse_plusgraph
from tvm import relax, tirx

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# as tests/test_half_precision.py: error against float64 at most twice torch eager's + a floor
FLOOR = {"float32": 1e-6, "bfloat16": 2.0**-7, "float16": 2.0**-10}
GEMM = parse_plusgraph("loop0 [M, para]\n  loop1 [N, para]\n    loop2 [K, non-para, (dot)]")


class KNResidual(torch.nn.Module):
    """A [K, N] weight (``x @ w``), bias, then a residual add of another input."""

    def __init__(self, k: int, n: int) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(k, n) / k**0.5)
        self.b = torch.nn.Parameter(torch.randn(n))

    def forward(self, x: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        return x @ self.w + self.b + r


def _check(model: torch.nn.Module, args: tuple, dtype: str) -> dict:
    """Compile ``model`` in ``dtype``; its output is as accurate as torch eager's (against
    float64); returns the dispatch stats."""
    half = copy.deepcopy(model).eval().to(DTYPES[dtype])
    hargs = tuple(a.to(DTYPES[dtype]) for a in args)
    with torch.no_grad():
        ref = copy.deepcopy(half).double()(*[a.double() for a in hargs])
        eager = half(*hargs).double()
    cm = plus_tvm.compile(half, example_args=hargs)
    got = cm(*hargs)
    assert got.dtype == DTYPES[dtype] and got.shape == eager.shape
    scale = float(ref.abs().max())
    plus_err = float((got.double() - ref).abs().max()) / scale
    torch_err = float((eager - ref).abs().max()) / scale
    assert plus_err <= 2 * torch_err + FLOOR[dtype], (plus_err, torch_err)
    return cm.stats["dispatch"]


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("lead", [(1,), (1, 1)], ids=["2d", "3d"])
def test_a_one_row_linear_is_matched_by_gemm_epilogue(lead, dtype):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 16), torch.nn.ReLU())
    stats = _check(model, (torch.randn(*lead, 32),), dtype)
    assert stats["matched"] == {"gemm_epilogue": 1}, stats


@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_a_one_row_kn_product_with_a_residual_is_matched(dtype):
    torch.manual_seed(0)
    stats = _check(KNResidual(32, 16), (torch.randn(1, 1, 32), torch.randn(1, 1, 16)), dtype)
    assert stats["matched"] == {"gemm_epilogue": 1}, stats


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_half_matrix_vector_product_runs_in_the_library(dtype):
    """Priced as any GEMM: at 512 x 512 the untuned TIR reduction (GIR declines half-precision
    reductions on the CPU) is far slower than the library call."""
    torch.manual_seed(0)
    stats = _check(torch.nn.Linear(512, 512), (torch.randn(1, 512),), dtype)
    assert stats["library"] == {"gemm_epilogue": 1}, stats
    assert [d["chosen"] for d in stats["decisions"]] == ["library"], stats["decisions"]


def test_vgg16_tiny_classifier_linears_are_matched_in_bfloat16():
    entry = zoo.get("vgg16-tiny")
    model = entry.build(0).eval().to(torch.bfloat16)
    args = tuple(a.to(torch.bfloat16) for a in entry.example_inputs(0))
    cm = plus_tvm.compile(model, example_args=args)
    stats = cm.stats["dispatch"]
    assert stats["matched"].get("gemm_epilogue") == 3, stats["matched"]
    assert stats["library"].get("gemm_epilogue") == 3, stats
    with torch.no_grad():
        want = model(*args).float()
    got = cm(*args).float()
    assert float((got - want).abs().max()) <= 0.05 * float(want.abs().max()) + 2.0**-7


class PoolFlattenLinear(torch.nn.Module):
    """VGG's classifier head: max pool (float32 between casts in a half model), flatten, linear."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.nn.functional.max_pool2d(x, 2)
        return torch.relu(self.fc(torch.flatten(x, 1)))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_flattened_pool_output_feeds_the_library_linear(dtype):
    """The cast before the flatten is no prologue of the GEMM: a growing subgraph is read
    without unit loops, so it cannot pass for the second half of a one-row attention (that
    took the bias, cast and ReLU along and left the linear without its epilogue)."""
    torch.manual_seed(0)
    stats = _check(PoolFlattenLinear(), (torch.randn(1, 8, 4, 4),), dtype)
    assert stats["library"] == {"gemm_epilogue": 1}, stats


# ------------------------------------------------------------------------- the matcher itself
def _graph(x_shape, dtype="float32"):
    """The OpGraph of ``relu(x @ permute(w) + b)`` with ``x`` of ``x_shape`` (K = 32, N = 16)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(x_shape, dtype))
    w = relax.Var("w", relax.TensorType((16, 32), dtype))
    b = relax.Var("b", relax.TensorType((16,), dtype))
    with bb.function("main", [x, w, b]):
        with bb.dataflow():
            wt = bb.emit(relax.op.permute_dims(w, [1, 0]))
            mm = bb.emit(relax.op.matmul(x, wt))
            out = bb.emit_output(relax.op.nn.relu(relax.op.add(mm, b)))
        bb.emit_func_output(out)
    mod = bb.get()
    return OpGraph(mod["main"].body.blocks[0], mod, {})


def _matches(x_shape):
    graph = _graph(x_shape)
    return Identifier(graph, list(load_warehouse(()).entries)).run()


def test_the_gemm_pattern_takes_a_missing_m_loop_as_a_unit_loop():
    gemv = parse_plusgraph("loop0 [16, para]\n  loop1 [32, non-para, (dot)]")
    assert full_match_units(GEMM, gemv) == ({"M": 1, "N": 16, "K": 32}, 1)
    gemm = parse_plusgraph("loop0 [2, para]\n  loop1 [16, para]\n    loop2 [32, non-para, (dot)]")
    assert full_match_units(GEMM, gemm) == ({"M": 2, "N": 16, "K": 32}, 0)
    # only a spatial loop that performs no operation may be a unit loop
    assert full_match(GEMM, parse_plusgraph("loop0 [16, para]")) is None
    fixed = parse_plusgraph("loop0 [8, para]\n  loop1 [N, para]\n    loop2 [K, non-para, (dot)]")
    assert full_match(fixed, gemv) is None  # an integer size other than 1 is no unit loop


@pytest.mark.parametrize("x_shape", [(1, 32), (1, 1, 32)])
def test_a_one_row_gemm_is_identified_with_its_epilogues(x_shape):
    (match,) = _matches(x_shape)
    assert [e.name for e in match.entries] == ["gemm_epilogue"]
    assert match.sizes == {"M": 1, "N": 16, "K": 32}
    assert len(match.members) == 4  # permute, matmul, add, relu


@pytest.mark.parametrize("rows", [2, tirx.Var("n", "int64")], ids=["static", "symbolic"])
def test_batched_and_dynamic_rows_match_as_before(rows):
    """A GEMM with an M loop needs no unit loop: batch_gemm (which would take its B loop as
    unit) is not offered for it, and a symbolic batch binds M to its variable."""
    (match,) = _matches((rows, 32))
    assert [e.name for e in match.entries] == ["gemm_epilogue"]
    assert str(match.sizes["M"]) == str(rows) and match.sizes["N"] == 16


def test_tir_that_gir_leaves_unscheduled_is_not_chosen():
    """A float16 GEMV of 32 x 16: the library runs it through its Python crossing (no native
    float16 kernel), so the prices favour TIR; but on the CPU GIR declines a reduction over
    half-precision buffers, and TVM's unscheduled loop nest is not taken."""
    torch.manual_seed(0)
    stats = _check(torch.nn.Linear(32, 16), (torch.randn(1, 32),), "float16")
    assert stats["library"] == {"gemm_epilogue": 1}, stats
    (decision,) = stats["decisions"]
    assert decision["chosen"] == "library" and decision["model"].endswith("TIR unscheduled")
