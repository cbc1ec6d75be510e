"""One benchmark backend in its own process, run with that backend's own defaults.

Started as a script (``python worker.py KIND ARTIFACT INPUTS WORKDIR --result-fd N``) so that an
``onnxruntime`` or ``torch`` worker never imports plus_tvm or TVM: each backend runs as its users
run it, on every core the process was started with, with its own thread pools at their default
sizes. Nothing here sets a thread count or an affinity.

KIND is ``plus`` (ARTIFACT: a library written by ``CompiledModel.export_library``, loaded with
``plus_tvm.load``, for the plus and tvm pipelines alike), ``torch`` / ``torch-compile``
(ARTIFACT: a module saved with ``torch.save``) or ``onnxruntime`` (ARTIFACT: an ``.onnx`` file,
run on the CPU provider with default session options).

Protocol: one JSON command per line on stdin, one JSON reply per line on the result fd.

* at start, unasked: ``{"ready": true, "setup_s", "state": <thread state at start>}`` or
  ``{"ready": false, "error"}``;
* ``{"cmd": "run", "n": N, "keep": bool, "rewarm": R}``: R untimed runs, then N timed runs
  back to back; reply ``{"times_ms": [...]}`` (``keep``: the first timed run's outputs are saved
  to ``WORKDIR/output.npz``) or ``{"error"}``;
* ``{"cmd": "memory_mark"}``: the peak resident size is reset (``/proc/self/clear_refs``), so
  the next ``finish`` reports the peak of the runs after it;
* ``{"cmd": "finish"}``: reply ``{"state", "memory", "threads"}`` and exit.

``state`` is the CPU affinity and torch's thread counts (when torch is loaded): the driver
checks that no backend changed them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

import numpy as np

# {module name: file} of the model files a saved torch module's classes come from
USER_FILES_SUFFIX = ".modules.json"


def _state() -> dict:
    # plus_tvm.threads.snapshot's keys (this script must not import plus_tvm)
    torch = sys.modules.get("torch")
    return {
        "affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [],
        "torch_threads": torch.get_num_threads() if torch is not None else None,
        "torch_interop_threads": torch.get_num_interop_threads() if torch is not None else None,
    }


def _status_kb(key: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class _Runner:
    """Builds one backend's callable; ``threads`` describes the pools it uses."""

    def __init__(self, kind: str, artifact: str, inputs: list[np.ndarray], dtype: str) -> None:
        self.kind = kind
        self.dtype = dtype
        self.fn = getattr(self, "_" + kind.replace("-", "_"))(artifact, inputs)

    def _plus(self, artifact: str, inputs: list[np.ndarray]):
        import plus_tvm

        cm = plus_tvm.load(artifact)
        prepared = cm.prepare(*[_as_dtype_numpy(x, self.dtype) for x in inputs])
        return lambda: cm.run_prepared(prepared)

    def _torch_runner(self, module, inputs: list[np.ndarray]):
        import torch

        dtype = getattr(torch, TORCH_DTYPES[self.dtype])
        args = tuple(
            torch.from_numpy(x).to(dtype) if x.dtype.kind == "f" else torch.from_numpy(x)
            for x in inputs
        )

        def run():
            with torch.inference_mode():
                return module(*args)

        return run

    def _torch(self, artifact: str, inputs: list[np.ndarray]):
        import torch

        _import_user_files(artifact)
        return self._torch_runner(torch.load(artifact, weights_only=False), inputs)

    def _torch_compile(self, artifact: str, inputs: list[np.ndarray]):
        import torch

        _import_user_files(artifact)
        module = torch.compile(torch.load(artifact, weights_only=False))  # its defaults
        return self._torch_runner(module, inputs)

    def _onnxruntime(self, artifact: str, inputs: list[np.ndarray]):
        import onnxruntime as ort

        sess = ort.InferenceSession(artifact, providers=["CPUExecutionProvider"])
        names = [i.name for i in sess.get_inputs()]
        if len(names) != len(inputs):
            raise ValueError(
                f"the ONNX model takes {len(names)} inputs, the bench has {len(inputs)}"
            )
        feed = dict(zip(names, (_as_dtype_numpy(x, self.dtype) for x in inputs)))
        return lambda: sess.run(None, feed)

    def threads(self) -> dict:
        """The pools this backend ran on, as its libraries report them."""
        out: dict = {}
        torch = sys.modules.get("torch")
        if torch is not None:
            out["torch"] = torch.get_num_threads()
        tvm_ffi = sys.modules.get("tvm_ffi")
        if self.kind == "plus" and tvm_ffi is not None:
            out["tvm_pool"] = int(tvm_ffi.get_global_func("runtime.NumThreads")())
        if self.kind == "onnxruntime":
            out["onnxruntime"] = "default (intra-op = physical cores, spinning on)"
        return out


# what each kind imports before its model is loaded
_LIBRARIES = {
    "plus": ("plus_tvm",),
    "torch": ("torch",),
    "torch-compile": ("torch",),
    "onnxruntime": ("onnxruntime",),
}


# --dtype -> torch's name of it (the float inputs arrive as float32 and are cast here: an .npz
# holds no bfloat16)
TORCH_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def _as_dtype_numpy(x: np.ndarray, dtype: str) -> np.ndarray:
    """A float input in the bench's dtype (bfloat16 through ml_dtypes, TVM's)."""
    if x.dtype.kind != "f" or dtype == "fp32":
        return x
    if dtype == "fp16":
        return x.astype(np.float16)
    import ml_dtypes

    return x.astype(ml_dtypes.bfloat16)


def _flatten(out) -> list[np.ndarray]:
    """The outputs as numpy arrays, half precision widened to float32 for the .npz."""
    if isinstance(out, (list, tuple)):
        return [a for o in out for a in _flatten(o)]
    if hasattr(out, "detach"):
        out = out.detach().cpu()
        return [(out.float() if out.is_floating_point() else out).numpy()]
    arr = out.numpy() if hasattr(out, "numpy") else np.asarray(out)
    return [arr.astype(np.float32) if str(arr.dtype) in ("bfloat16", "float16") else arr]


def _short(err: BaseException) -> str:
    lines = [ln for ln in str(err).strip().splitlines() if ln.strip()]
    return f"{type(err).__name__}: {lines[-1] if lines else ''}"[:300]


def _import_user_files(artifact: str) -> None:
    """Import the model files listed next to ``artifact`` under the names the saved module's
    classes were pickled with (plus_tvm is not imported here: the worker runs torch alone)."""
    import importlib.util

    listing = artifact + USER_FILES_SUFFIX
    if not os.path.exists(listing):
        return
    with open(listing) as f:
        files = json.load(f)
    for name, path in files.items():
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("kind")
    parser.add_argument("artifact")
    parser.add_argument("inputs")
    parser.add_argument("workdir")
    parser.add_argument("--result-fd", type=int, required=True)
    parser.add_argument("--dtype", default="fp32", choices=sorted(TORCH_DTYPES))
    args = parser.parse_args(argv)
    results = os.fdopen(args.result_fd, "w")

    def reply(obj: dict) -> None:
        results.write(json.dumps(obj) + "\n")
        results.flush()

    start = time.perf_counter()
    try:
        for module in _LIBRARIES[args.kind]:  # the libraries first: "base" is their memory
            __import__(module)
        state = _state()
        base_kb = _status_kb("VmRSS")
        with np.load(args.inputs) as data:
            inputs = [np.asarray(data[f"arr_{i}"], order="C") for i in range(len(data.files))]
        runner = _Runner(args.kind, args.artifact, inputs, args.dtype)
    except Exception as err:  # the driver reports a backend that cannot start
        traceback.print_exc()
        reply({"ready": False, "error": _short(err)})
        return 1
    reply({"ready": True, "setup_s": time.perf_counter() - start, "state": state})
    marked = False
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["cmd"] == "run":
            times = []
            try:
                for _ in range(int(cmd.get("rewarm", 0))):
                    runner.fn()
                for i in range(int(cmd["n"])):
                    t0 = time.perf_counter()
                    out = runner.fn()
                    times.append((time.perf_counter() - t0) * 1e3)
                    if i == 0 and cmd.get("keep"):
                        np.savez(os.path.join(args.workdir, "output.npz"), *_flatten(out))
            except Exception as err:  # a failing run is the backend's result, not a crash
                traceback.print_exc()
                reply({"error": _short(err)})
                continue
            reply({"times_ms": times})
        elif cmd["cmd"] == "memory_mark":
            marked = _reset_peak()
            reply({"marked": marked})
        elif cmd["cmd"] == "finish":
            reply(
                {
                    "state": _state(),
                    "threads": runner.threads(),
                    "memory": {
                        "base_kb": base_kb,
                        "rss_kb": _status_kb("VmRSS"),
                        "peak_kb": _status_kb("VmHWM"),
                        "peak_is_runs_only": marked,
                    },
                }
            )
            return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
