"""Worker process of the ONNX conformance run: runs one (test, pipeline) at a time.

Started as a script (``python worker.py CACHE``) so that a ``tvm`` worker never imports plus_tvm
(it reads the cache with ``case_store``, a sibling module of this script that needs numpy alone):
TVM's side is TVM alone (its ONNX importer, ``tvm.compile``'s default pipeline and the VM), as a
TVM user runs it. The ``plus`` side is ``plus_tvm.compile`` of the ONNX model and a call of the
``CompiledModel``, as a plus_tvm user runs it.

Protocol: one JSON request per line on stdin (``{"name": ..., "pipeline": "plus"|"tvm"}``), one
JSON result per line on the file descriptor the runner passes as ``--result-fd``. Anything the
compilers print goes to a per-test buffer and comes back in the result. A crash or a hang kills
only this process; the runner records it and starts another.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
import warnings

import numpy as np

_KEEP_OUTPUT = 2000  # characters of captured stdout kept per result


def _host_target():
    import tvm

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return tvm.target.Target(
        {
            "kind": "llvm",
            "num-cores": int(cores or 1),
            "mcpu": tvm.target.codegen.llvm_get_system_cpu(),
        }
    )


class _Stage:
    """Names the stage a failure happened in (import, compile, run, compare)."""

    def __init__(self) -> None:
        self.name = "import"


def _run_tvm(model, inputs_sets, stage: _Stage) -> list[list[np.ndarray]]:
    import tvm
    from tvm import relax
    from tvm.relax.frontend.onnx import from_onnx

    stage.name = "import"
    mod = from_onnx(model)
    stage.name = "compile"
    target = _host_target()
    executable = tvm.compile(mod, target)
    stage.name = "run"
    vm = relax.VirtualMachine(executable, tvm.cpu())
    results = []
    for inputs in inputs_sets:
        out = vm["main"](*[tvm.runtime.tensor(np.asarray(x, order="C")) for x in inputs])
        results.append(_flatten(out))
    return results


def _run_plus(model, inputs_sets, stage: _Stage) -> list[list[np.ndarray]]:
    import plus_tvm
    from plus_tvm.loader import load_model

    stage.name = "import"
    loaded = load_model(model)
    stage.name = "compile"
    cm = plus_tvm.compile(loaded, "llvm")
    stage.name = "run"
    results = []
    for inputs in inputs_sets:
        out = cm(*inputs)
        results.append(list(out) if isinstance(out, tuple) else [out])
    return results


def _flatten(out: object) -> list[np.ndarray]:
    import tvm

    if isinstance(out, tvm.runtime.Tensor):
        return [out.numpy()]
    if hasattr(out, "__len__") and not isinstance(out, np.ndarray):
        flat: list[np.ndarray] = []
        for item in out:
            flat += _flatten(item)
        return flat
    return [np.asarray(out)]


def compare(expected: list[np.ndarray], got: list[np.ndarray], rtol: float, atol: float) -> None:
    """Raise AssertionError as ONNX's backend runner would (count, shape, dtype, values)."""
    if len(got) != len(expected):
        raise AssertionError(f"{len(got)} outputs, expected {len(expected)}")
    for k, (ref, out) in enumerate(zip(expected, got)):
        out = np.asarray(out)
        if out.shape != ref.shape:
            raise AssertionError(f"output {k}: shape {out.shape}, expected {ref.shape}")
        if out.dtype != ref.dtype:
            raise AssertionError(f"output {k}: dtype {out.dtype}, expected {ref.dtype}")
        if ref.dtype == bool or ref.dtype.kind in "iu":
            if not np.array_equal(out, ref):
                bad = int(np.sum(out != ref))
                raise AssertionError(f"output {k}: {bad} of {ref.size} values differ")
        else:
            np.testing.assert_allclose(
                out.astype(np.float64),
                ref.astype(np.float64),
                rtol=rtol,
                atol=atol,
                err_msg=f"output {k}",
            )


def _message(err: BaseException) -> str:
    lines = [ln for ln in str(err).strip().splitlines() if ln.strip()]
    # TVM's errors end with the C++ message; keep the last lines, where the reason is
    text = " | ".join(ln.strip() for ln in lines[-3:]) if lines else ""
    return f"{type(err).__name__}: {text}"[:1000]


def run_one(case: dict, pipeline: str) -> dict:
    """Run one test under one pipeline; returns the result record (never raises)."""
    import onnx

    stage = _Stage()
    model = onnx.load_from_string(case["model"])
    inputs_sets = [list(ins) for ins, _ in case["data_sets"]]
    try:
        runner = _run_plus if pipeline == "plus" else _run_tvm
        results = runner(model, inputs_sets, stage)
        stage.name = "compare"
        for got, (_, expected) in zip(results, case["data_sets"]):
            compare(list(expected), got, case["rtol"], case["atol"])
    except KeyboardInterrupt:
        raise
    except Exception as err:  # a conformance failure of any kind is a result to record
        return {
            "status": "fail",
            "stage": stage.name,
            "error": _message(err),
            "trace": "".join(traceback.format_exception(err)[-6:])[-3000:],
        }
    return {"status": "pass"}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("cache")
    parser.add_argument("--result-fd", type=int, required=True)
    args = parser.parse_args()
    from case_store import load  # (this script's folder is first on sys.path)

    cases = {d["name"]: d for d in load(args.cache)}
    results = os.fdopen(args.result_fd, "w", buffering=1)
    warnings.simplefilter("ignore")
    np.seterr(all="ignore")
    for line in sys.stdin:
        request = json.loads(line)
        with tempfile.TemporaryFile(mode="w+") as captured:
            sys.stdout.flush()
            saved = os.dup(1)
            os.dup2(captured.fileno(), 1)
            start = time.perf_counter()
            try:
                record = run_one(cases[request["name"]], request["pipeline"])
            finally:
                sys.stdout.flush()
                os.dup2(saved, 1)
                os.close(saved)
            captured.seek(0)
            printed = captured.read()
        if printed.strip() and record["status"] != "pass":
            record["stdout"] = printed[-_KEEP_OUTPUT:]
        record.update(
            name=request["name"],
            pipeline=request["pipeline"],
            seconds=round(time.perf_counter() - start, 2),
        )
        results.write(json.dumps(record) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
