"""ONNX's backend node tests, generated once into a cache.

The ``onnx`` wheel carries the generators of its node tests
(``onnx.backend.test.case.node.collect_testcases``) but not their data files. Generating them takes
a few seconds and prints numpy warnings, so it is done once per ``onnx`` version and the result is
kept in plus_tvm's cache (``<cache root>/onnx_node_tests/onnx-<onnx version>.npz``, see
:mod:`plus_tvm.paths`) in a format that loading cannot run code from (:mod:`.case_store`); a
damaged file is named in a warning and generated again.

Only *runnable* tests are kept: every input and output of every data set is a numeric tensor
(bool, signed or unsigned integers, bfloat16, float16/32/64; bfloat16 as ``ml_dtypes.bfloat16``,
which TVM's runtime exchanges with numpy). Strings, sequences, optionals and the 8-bit and 4-bit
float formats are left out: TVM's runtime does not exchange them with numpy.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from dataclasses import dataclass

import numpy as np

from ..paths import check_private, damaged, private_dir, write_private
from . import case_store

NUMERIC_DTYPES = frozenset(
    "bool int8 int16 int32 int64 uint8 uint16 uint32 uint64".split()
    + "bfloat16 float16 float32 float64".split()
)
HALF_DTYPES = frozenset(("float16", "bfloat16"))


@dataclass(frozen=True)
class NodeCase:
    """One ONNX node test: the model, its data sets and the tolerances ONNX's runner uses."""

    name: str
    op: str  # operator under test (the op type of the single-node model)
    model: bytes  # serialized onnx.ModelProto
    data_sets: tuple[tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]], ...]
    rtol: float
    atol: float

    @property
    def expanded(self) -> bool:
        """Whether this is the function-expanded form of another test (``*_expanded*``)."""
        return "_expanded" in self.name


CACHE_FOLDER = "onnx_node_tests"


def cache_path() -> str:
    """``<cache root>/onnx_node_tests/onnx-<version>.npz`` (the folder created private)."""
    import onnx

    return os.path.join(private_dir(CACHE_FOLDER), f"onnx-{onnx.__version__}.npz")


def _numeric(value: object) -> np.ndarray | None:
    """``value`` as a numeric numpy array, or None when it is not one."""
    import onnx
    from onnx import numpy_helper

    if isinstance(value, onnx.TensorProto):
        try:
            value = numpy_helper.to_array(value)
        except (ValueError, TypeError):  # formats numpy cannot hold
            return None
    if isinstance(value, np.generic):
        value = np.asarray(value)
    if not isinstance(value, np.ndarray) or value.dtype.name not in NUMERIC_DTYPES:
        return None
    return value


def _operator(model: object) -> str:
    """The op type under test: the model's one node, else (a function-expanded body) its last."""
    nodes = model.graph.node
    return nodes[0].op_type if len(nodes) == 1 else (nodes[-1].op_type if nodes else "")


def generate() -> list[NodeCase]:
    """Run ONNX's generators and keep the runnable tests (slow: use :func:`load_cases`)."""
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        raw = collect_testcases(None)
    # an expanded test is named after the test it expands: it tests that test's operator
    ops = {c.name: _operator(c.model) for c in raw if c.model is not None}
    cases = []
    for case in raw:
        if case.model is None or not case.data_sets:
            continue
        sets = []
        for inputs, outputs in case.data_sets:
            ins = [_numeric(x) for x in inputs]
            outs = [_numeric(x) for x in outputs]
            if any(x is None for x in ins + outs):
                break
            sets.append((tuple(ins), tuple(outs)))
        else:
            cases.append(
                NodeCase(
                    case.name,
                    ops.get(case.name.split("_expanded")[0], ops[case.name]),
                    case.model.SerializeToString(),
                    tuple(sets),
                    float(case.rtol),
                    float(case.atol),
                )
            )
    return cases


def load_cases(refresh: bool = False) -> list[NodeCase]:
    """The runnable node tests, from the cache (generated on first use; a damaged cache is
    named in a :class:`~plus_tvm.paths.CacheWarning` and generated again).

    The cache holds plain arrays (:mod:`.case_store`) so that a worker can read it without
    importing plus_tvm, and without running anything a planted file could hold.
    """
    path = cache_path()
    if not refresh and os.path.exists(path):
        try:
            return read_cache(path)
        except case_store.StaleStoreError:
            pass  # an older plus_tvm's cache (fewer tests): generated again
        except (OSError, case_store.StoreError) as err:
            damaged(path, str(err))
    cases = generate()
    write_cache(path, cases)
    return cases


def write_cache(path: str, cases: list[NodeCase]) -> None:
    """Store ``cases`` at ``path`` (atomically, private)."""
    write_private(path, case_store.dumps([dataclasses.asdict(c) for c in cases]))


def read_cache(path: str) -> list[NodeCase]:
    """The cached tests (the file checked private first).

    Raises
    ------
    UnsafeCacheError
        The file is another user's or writable by group or others.
    OSError, case_store.StoreError
        Unreadable, or not a store (never anything that runs code).
    """
    check_private(path)
    return [NodeCase(**d) for d in case_store.load(path)]


def half_precision(cases: list[NodeCase]) -> list[NodeCase]:
    """The tests with float16 or bfloat16 data (an input or an expected output)."""
    return [
        case
        for case in cases
        if any(
            array.dtype.name in HALF_DTYPES
            for inputs, outputs in case.data_sets
            for array in (*inputs, *outputs)
        )
    ]


def first_of_each_operator(cases: list[NodeCase]) -> list[NodeCase]:
    """The CI subset: the first test of every operator.

    Function-expanded tests (``*_expanded``) test the same operators through their function
    bodies; they are left to the full run (some, such as Attention's, take minutes to compile).
    """
    seen: set[str] = set()
    subset = []
    for case in cases:
        if not case.expanded and case.op not in seen:
            seen.add(case.op)
            subset.append(case)
    return subset
