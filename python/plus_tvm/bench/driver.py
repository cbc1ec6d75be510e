"""Side-by-side benchmark of plus against TVM's pipeline, torch eager, torch.compile and ORT,
each backend in its own process with its own defaults, on every core the bench started with.

The driver imports the model, compiles the plus and tvm pipelines (and any ``plus:KEY=VALUE``
variant) and exports each as a library, saves the torch module and the ONNX model, and draws the
inputs once. Every backend then runs in a fresh worker process (``worker.py``) that loads only
what its users load: ``plus_tvm.load`` of the library, ``torch.load`` of the module,
``onnxruntime.InferenceSession`` of the file. No thread count or affinity is set anywhere; each
worker reports its affinity and torch's thread counts at start and at the end, and a backend that
changed them, or started with a different affinity than the bench had, makes the result invalid
(``result["invalid"]``; the command line exits 3).

Timing: after warm-up, each backend's timed runs are split into blocks, interleaved A B C A B C
so that drifts of the machine hit every backend alike, with a pause between blocks so that the
spinning threads of the previous backend (ORT's pool, OpenMP) go idle before the next one runs.
A block's runs go back to back, as a user's steady loop does. Each backend has a time budget: a
backend whose runs are slow is timed a few times and reported, not waited on. Every backend's
first output is compared with the reference (torch eager where the model is a torch model, else
ONNX Runtime). Peak resident memory is measured per worker over the timed runs.

With ``seq_lengths`` (a text model), plus (and tvm, and the variants) is compiled once with a
symbolic sequence length bounded by the largest length (:mod:`plus_tvm.dynamic_sequence`), the
ONNX model is exported with a dynamic sequence axis, and the whole measurement (fresh workers,
interleaved blocks, reference check) runs once per length on inputs of that length; the result
holds one summary per length under ``"lengths"``.
"""

from __future__ import annotations

import json
import os
import select
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..env import child_environment
from ..errors import PlusError
from ..loader import LoadedModel, load_model, random_inputs
from ..options import Options
from ..threads import snapshot, state_changes
from .spread import spread_ms, spread_warnings

BACKENDS = ("plus", "tvm", "torch", "torch-compile", "onnxruntime")

_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker.py")
SETTLE_S = 0.25  # pause before each block: longer than OpenMP's / ORT's spin-wait after work
MAX_BLOCKS = 3  # a backend's timed runs are split into at most this many interleaved blocks
REWARM_RUNS = 1  # untimed runs at the start of every block after a backend's first
SETUP_TIMEOUT_S = 3600.0  # a worker's start-up (loading, torch.compile at the first run)
RUN_TIMEOUT_S = 1800.0  # one block of runs


class BenchError(PlusError):
    """A benchmark that cannot be set up (bad arguments, a plus model that does not compile)."""


@dataclass
class Backend:
    """One contender: its worker kind and artifact, and what was measured."""

    name: str
    kind: str = ""
    artifact: str = ""
    status: str = "ok"
    times_ms: list[float] = field(default_factory=list)
    spent_s: float = 0.0
    output: np.ndarray | None = None
    kernels: int | None = None
    setup_s: float = 0.0
    state_start: dict | None = None
    state_end: dict | None = None
    threads: dict | None = None
    memory: dict | None = None
    workdir: str = ""  # the worker's own folder (its log and first output)
    worker: _Worker | None = None

    @property
    def active(self) -> bool:
        return self.worker is not None and self.status == "ok"


class _Worker:
    """A worker process and its two pipes (commands in, JSON replies out)."""

    def __init__(
        self, kind: str, artifact: str, inputs: str, workdir: str, log: str, dtype: str = "fp32"
    ) -> None:
        read_fd, write_fd = os.pipe()
        env = child_environment()
        # the worker unpickles the torch module: the classes must import there as here
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        with open(log, "w") as log_file:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    _WORKER,
                    kind,
                    artifact,
                    inputs,
                    workdir,
                    "--result-fd",
                    str(write_fd),
                    "--dtype",
                    dtype,
                ],
                stdin=subprocess.PIPE,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                pass_fds=(write_fd,),
                env=env,
                text=True,
            )
        os.close(write_fd)
        self.replies = os.fdopen(read_fd, "r")
        self.log = log

    def read(self, timeout: float) -> dict:
        ready, _, _ = select.select([self.replies], [], [], timeout)
        line = self.replies.readline() if ready else ""
        if not line:
            self.kill()
            why = "timed out" if not ready else f"exited with code {self.proc.wait()}"
            raise RuntimeError(f"worker {why}: {self.tail()}")
        return json.loads(line)

    def ask(self, cmd: dict, timeout: float) -> dict:
        try:
            self.proc.stdin.write(json.dumps(cmd) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            raise RuntimeError(f"worker exited: {self.tail()}") from None
        return self.read(timeout)

    def tail(self) -> str:
        try:
            with open(self.log) as f:
                lines = [ln.strip() for ln in f.read().splitlines() if ln.strip()]
        except OSError:
            return ""
        return lines[-1][:300] if lines else ""

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def close(self) -> None:
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.kill()
        self.replies.close()


def _short(err: BaseException) -> str:
    text = [ln for ln in str(err).strip().splitlines() if ln.strip()]
    return f"{type(err).__name__}: {text[-1] if text else ''}"[:300]


def _check_count(name: str, value: object, least: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise BenchError(f"{name} must be an integer of at least {least}, got {value!r}")


def _float32(x: object) -> np.ndarray:
    """A torch tensor as numpy; half precision widened to float32 (exact)."""
    x = x.detach().cpu()
    return (x.float() if x.is_floating_point() else x).numpy()


#: --dtype -> torch's name of the dtype every backend runs in
DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


class Bench:
    """Sets the backends up, times them in their own processes, and summarises.

    Parameters
    ----------
    model : object
        Anything :func:`plus_tvm.loader.load_model` accepts.
    backends : sequence of str
        Names from :data:`BACKENDS` or plus variants ``plus:KEY=VALUE[+KEY=VALUE...]``;
        ``plus`` is always included.
    target : object
        Target for plus and tvm (``"llvm"`` or ``"cuda"``...).
    options : Options
        Options of the plus pipeline.
    runs, warmup : int
        Timed runs wanted per backend, and untimed runs before them.
    budget_s : float
        Wall-clock budget per backend for timed runs (set-up and warm-up excluded); a backend
        stops being timed when it runs out and reports how many runs it got.
    dtype : {"fp32", "bf16", "fp16"}
        The precision every backend runs the model in: a torch model and its example inputs
        are converted (``model.to(dtype)``) before plus compiles it, the torch peers run it so,
        ONNX Runtime gets it exported in float16 (its CPU provider has no bfloat16 kernels: it
        is reported ``n/a`` in bf16). An ONNX model is converted to float16 with ONNX Runtime's
        converter and every backend runs that file (bf16: refused).
    """

    def __init__(
        self,
        model: object,
        backends: Sequence[str] = BACKENDS,
        target: object = "llvm",
        options: Options | None = None,
        runs: int = 20,
        warmup: int = 2,
        budget_s: float = 60.0,
        progress: bool = True,
        log: Callable[[str], None] | None = None,
        seq_lengths: Sequence[int] | None = None,
        dtype: str = "fp32",
    ) -> None:
        if dtype not in DTYPES:
            raise BenchError(f"unknown dtype {dtype!r}; choose from {list(DTYPES)}")
        self.dtype = dtype
        unknown = [b for b in backends if b not in BACKENDS and not b.startswith("plus:")]
        if unknown:
            raise BenchError(
                f"unknown backend(s) {unknown}; choose from {list(BACKENDS)} or a plus variant "
                "plus:KEY=VALUE[+KEY=VALUE...] (e.g. plus:gir=false)"
            )
        self.options = options or Options()
        self.variants = {  # plus with other options, measured beside plus (e.g. an ablation)
            b: Options.from_pairs(b[len("plus:") :].split("+"), base=self.options)
            for b in backends
            if b.startswith("plus:")
        }
        self.names = list(dict.fromkeys(["plus", *backends]))
        self.model = model
        self.target = target
        _check_count("runs", runs, 1)
        _check_count("warmup", warmup, 0)
        if not isinstance(budget_s, (int, float)) or not 0 < budget_s < float("inf"):
            raise BenchError(f"budget must be a positive number of seconds, got {budget_s!r}")
        self.runs = int(runs)
        self.warmup = int(warmup)
        for length in seq_lengths or ():
            _check_count("a sequence length", length, 1)
        self.seq_lengths = tuple(int(n) for n in seq_lengths) if seq_lengths else ()
        self.budget_s = float(budget_s)
        self.progress = progress
        self.log = log or (lambda msg: print(msg, file=sys.stderr))
        self.loaded: LoadedModel | None = None
        self.stats: dict = {}
        self.inputs: tuple[np.ndarray, ...] = ()
        self.reference: np.ndarray | None = None
        self.reference_name = ""

    # ------------------------------------------------------------------------------- set-up
    def _in_dtype(self, loaded: LoadedModel) -> LoadedModel:
        """The model as ``model.to(dtype)`` with its example inputs converted (a torch model),
        or an ONNX model converted to float16 with ONNX Runtime's converter."""
        import copy

        if loaded.onnx_model is not None and loaded.torch_module is None:
            return self._onnx_in_dtype(loaded)
        import torch

        if loaded.torch_module is None or loaded.example_inputs is None:
            raise BenchError(f"--dtype {self.dtype} needs a torch model with example inputs")
        dtype = getattr(torch, DTYPES[self.dtype])
        module = copy.deepcopy(loaded.torch_module).eval().to(dtype)
        args = tuple(
            x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x
            for x in loaded.example_inputs
        )
        self.log(f"[bench] converting the model to {dtype}")
        half = load_model(module, args)
        half.name = f"{loaded.name} ({self.dtype})"
        return half

    def _onnx_in_dtype(self, loaded: LoadedModel) -> LoadedModel:
        """An ONNX model in float16, as an ONNX Runtime user makes it
        (``onnxruntime.transformers.float16.convert_float_to_float16``: weights, inputs and
        outputs in float16, ORT's list of ops kept in float32); every backend runs that file."""
        if self.dtype != "fp16":
            raise BenchError(
                f"--dtype {self.dtype} of an ONNX model: only fp16 (ONNX Runtime's float16 "
                "converter); bfloat16 needs a torch model (model.to(torch.bfloat16))"
            )
        try:
            from onnxruntime.transformers.float16 import convert_float_to_float16
        except ImportError as err:
            raise BenchError(
                f"--dtype fp16 of an ONNX model needs onnxruntime's float16 converter ({err})"
            ) from None
        self.log("[bench] converting the ONNX model to float16 (ONNX Runtime's converter)")
        import copy

        half = load_model(convert_float_to_float16(copy.deepcopy(loaded.onnx_model)))
        half.name = f"{loaded.name} ({self.dtype})"
        return half

    def _example_inputs(self, loaded: LoadedModel, specs: list) -> tuple[np.ndarray, ...]:
        """The inputs every worker gets: float ones as float32 (an .npz holds no bfloat16; the
        workers convert them to the bench's dtype)."""
        if loaded.example_inputs is not None:
            return tuple(
                np.asarray(_float32(x) if hasattr(x, "detach") else x, order="C")
                for x in loaded.example_inputs
            )
        return tuple(np.asarray(x, order="C") for x in random_inputs(specs))

    def _compile(self, backends: dict[str, Backend], workdir: str) -> None:
        from .. import compile as plus_compile

        for name in ("plus", "tvm", *self.variants):
            if name not in backends:
                continue
            b = backends[name]
            start = time.perf_counter()
            try:
                self.log(f"[bench] compiling with the {name} pipeline")
                options = self.variants.get(name, self.options)
                pipeline = "tvm" if name == "tvm" else "plus"
                cm = plus_compile(self.loaded, self.target, options=options, pipeline=pipeline)
                if not self.inputs:
                    self.inputs = self._example_inputs(self.loaded, cm.inputs)
                b.kind = "plus"
                b.artifact = os.path.join(workdir, f"lib{self.names.index(name)}.so")
                cm.export_library(b.artifact)
                b.kernels = int(cm.stats["kernels"])
                if name == "plus":
                    self.stats = dict(cm.stats)
            except Exception as err:  # a failing peer is reported, not fatal
                if name == "plus":
                    raise
                b.status = f"failed: {_short(err)}"
            b.setup_s = time.perf_counter() - start

    def _save_torch(self, backends: dict[str, Backend], workdir: str) -> None:
        wanted = [backends[n] for n in ("torch", "torch-compile") if n in backends]
        if not wanted:
            return
        module = self.loaded.torch_module
        if module is None:
            for b in wanted:
                b.status = "n/a: not a torch model"
            return
        import torch

        path = os.path.join(workdir, "torch_module.pt")
        try:
            torch.save(module, path)
            _write_user_files(module, path)
        except Exception as err:  # e.g. a module with a lambda: cannot go to a worker
            for b in wanted:
                b.status = f"n/a: the torch module cannot be saved for a worker ({_short(err)})"
            return
        for b in wanted:
            b.kind, b.artifact = b.name, path

    def _save_onnx(self, b: Backend, workdir: str) -> None:
        import onnx

        from .. import zoo

        if self.dtype == "bf16":  # (checked: NOT_IMPLEMENTED at the session's creation)
            b.status = (
                "n/a in bfloat16: ONNX Runtime's CPU provider has no bfloat16 kernels for "
                "MatMul, Gemm, Add, Relu, Softmax; --dtype fp16 runs it"
            )
            return
        path = os.path.join(workdir, "model.onnx")
        if self.dtype == "fp16" and self.loaded.onnx_model is None:
            self.log("[bench] exporting the float16 torch model to ONNX for onnxruntime")
        try:
            if self.loaded.onnx_model is not None:
                onnx.save(self.loaded.onnx_model, path)
            else:
                self.log("[bench] exporting to ONNX for onnxruntime")
                with zoo.quiet_export_loggers():
                    entry = self.loaded.extra.get("zoo_entry")
                    max_len = max(self.seq_lengths) if self.seq_lengths else None
                    if entry is not None:
                        zoo.export_onnx(entry, path, max_seq_len=max_len)
                    else:
                        import torch

                        from ..sequence_axis import sequence_dims

                        args = tuple(self.loaded.example_inputs)
                        torch.onnx.export(
                            self.loaded.torch_module,
                            args,
                            path,
                            dynamo=True,
                            dynamic_shapes=sequence_dims(args, max_len) if max_len else None,
                        )
        except Exception as err:
            b.status = f"failed: {_short(err)}"
            return
        b.kind, b.artifact = "onnxruntime", path

    def _start(self, b: Backend, workdir: str, inputs_path: str) -> None:
        start = time.perf_counter()
        b.workdir = os.path.join(workdir, f"w{self.names.index(b.name)}")
        os.makedirs(b.workdir, exist_ok=True)
        self.log(f"[bench] starting {b.name}")
        log = os.path.join(b.workdir, "log.txt")
        worker = _Worker(b.kind, b.artifact, inputs_path, b.workdir, log, self.dtype)
        try:
            ready = worker.read(SETUP_TIMEOUT_S)
            if not ready["ready"]:
                worker.close()
                b.status = f"failed: {ready['error']}"
                return
            b.state_start = ready["state"]
            b.worker = worker
            if self.warmup:
                self._ask_run(b, self.warmup, keep=True, timed=False)
            if b.active:
                worker.ask({"cmd": "memory_mark"}, RUN_TIMEOUT_S)
        except RuntimeError as err:
            b.status = f"failed: {_short(err)}"
            b.worker = None
        b.setup_s += time.perf_counter() - start

    def _ask_run(self, b: Backend, n: int, keep: bool, timed: bool, rewarm: int = 0) -> None:
        try:
            cmd = {"cmd": "run", "n": n, "keep": keep, "rewarm": rewarm}
            reply = b.worker.ask(cmd, RUN_TIMEOUT_S)
        except RuntimeError as err:
            b.status = f"failed: {_short(err)}"
            b.worker = None
            return
        if "error" in reply:
            b.status = f"failed: {reply['error']}"
            return
        if keep:
            with np.load(os.path.join(b.workdir, "output.npz")) as data:
                b.output = np.array(data["arr_0"])
        if timed:
            b.times_ms.extend(reply["times_ms"])
            b.spent_s += sum(reply["times_ms"]) / 1e3

    def _finish(self, b: Backend) -> None:
        if b.worker is None:
            return
        try:
            reply = b.worker.ask({"cmd": "finish"}, RUN_TIMEOUT_S)
            b.state_end, b.threads, b.memory = reply["state"], reply["threads"], reply["memory"]
        except RuntimeError as err:
            b.status = f"failed: {_short(err)}"
        b.worker.close()
        b.worker = None

    # ----------------------------------------------------------------------------- running
    def run(self) -> dict:
        """Set up, warm up, time interleaved blocks, and return the result dict."""
        self.initial_state = snapshot()
        with tempfile.TemporaryDirectory(prefix="plus-bench-") as workdir:
            self.log(f"[bench] importing {self.model}")
            self.loaded = load_model(self.model)
            if self.dtype != "fp32":
                self.loaded = self._in_dtype(self.loaded)
            if self.seq_lengths:
                from ..dynamic_sequence import load_dynamic_sequence

                self.log(f"[bench] sequence length symbolic, 1..{max(self.seq_lengths)}")
                self.loaded = load_dynamic_sequence(self.loaded, max(self.seq_lengths))
            backends = {n: Backend(n) for n in self.names}
            self._compile(backends, workdir)
            self._save_torch(backends, workdir)
            if "onnxruntime" in backends:
                self._save_onnx(backends["onnxruntime"], workdir)
            if not self.seq_lengths:
                return self._measure([backends[n] for n in self.names], workdir)
            return self._per_length(backends, workdir)

    def _per_length(self, backends: dict[str, Backend], workdir: str) -> dict:
        """The measurement once per sequence length, with the same compiled artifacts."""
        from ..dynamic_sequence import inputs_at

        summaries = {}
        for length in self.seq_lengths:
            self.log(f"[bench] sequence length {length}")
            self.inputs = inputs_at(self.loaded.example_inputs, length)
            fresh = [
                Backend(b.name, b.kind, b.artifact, b.status, kernels=b.kernels, setup_s=b.setup_s)
                for b in (backends[n] for n in self.names)
            ]
            summaries[str(length)] = self._measure(fresh, os.path.join(workdir, f"L{length}"))
        first = summaries[str(self.seq_lengths[0])]
        invalid = [f"length {n}: {p}" for n, s in summaries.items() for p in s["invalid"]]
        return {
            **{k: first[k] for k in ("model", "target", "reference", "environment", "stats")},
            "invalid": invalid,
            "warnings": [f"length {n}: {w}" for n, s in summaries.items() for w in s["warnings"]],
            "lengths": summaries,
        }

    def _measure(self, ordered: list[Backend], workdir: str) -> dict:
        """Start the workers on ``self.inputs``, time them interleaved, and summarise."""
        os.makedirs(workdir, exist_ok=True)
        inputs_path = os.path.join(workdir, "inputs.npz")
        np.savez(inputs_path, *self.inputs)
        try:
            for b in ordered:
                if b.status == "ok":
                    self._start(b, workdir, inputs_path)
            self._time(ordered)
            for b in ordered:
                self._finish(b)
        finally:  # interrupted or failed: no worker outlives the bench
            for b in ordered:
                if b.worker is not None:
                    b.worker.kill()
                    b.worker.close()
                    b.worker = None
        return self._summary(ordered)

    def _time(self, backends: list[Backend]) -> None:
        blocks = min(MAX_BLOCKS, self.runs)
        sizes = [self.runs // blocks + (i < self.runs % blocks) for i in range(blocks)]
        bar = _progress(self.runs * len(backends), self.progress)
        for size in sizes:
            for b in backends:
                if not b.active or (b.times_ms and b.spent_s >= self.budget_s):
                    bar.update(size)
                    continue
                n = size
                if b.times_ms:  # no more runs than the budget left has room for
                    mean_s = b.spent_s / len(b.times_ms)
                    n = max(1, min(size, int((self.budget_s - b.spent_s) / max(mean_s, 1e-9))))
                time.sleep(SETTLE_S)
                # one untimed run first: the other backends' blocks have evicted this one's
                # weights and code from the caches since its last block, and a user's loop
                # runs warm (on this noisy 2-core VM the effect stayed within the noise);
                # skipped for a backend already past half its budget (a slow one)
                rewarm = REWARM_RUNS if b.times_ms and b.spent_s < self.budget_s / 2 else 0
                self._ask_run(b, n, keep=b.output is None, timed=True, rewarm=rewarm)
                bar.update(size)
        bar.close()

    # ----------------------------------------------------------------------------- summary
    def _reference(self, by_name: dict[str, Backend]) -> np.ndarray | None:
        for cand in ("torch", "onnxruntime"):
            if cand in by_name and by_name[cand].output is not None:
                self.reference_name = cand
                return by_name[cand].output
        if self.loaded is not None and self.loaded.torch_module is not None:
            import torch

            dtype = getattr(torch, DTYPES[self.dtype])  # (the workers' cast of float inputs)
            try:
                with torch.inference_mode():
                    args = tuple(
                        t.to(dtype) if t.is_floating_point() else t
                        for t in (torch.from_numpy(np.asarray(x, order="C")) for x in self.inputs)
                    )
                    out = self.loaded.torch_module(*args)
            except Exception as err:  # noqa: BLE001 - a model that fails eagerly: no reference
                self.reference_name = f"none (torch eager failed: {_short(err)})"
                return None
            while isinstance(out, (list, tuple)):
                out = out[0]
            self.reference_name = "torch"
            return _float32(out.detach().cpu())  # (numpy has no bfloat16)
        return None

    def _validity(self, backends: list[Backend]) -> list[str]:
        bench_affinity = self.initial_state["affinity"]
        invalid = []
        changed = state_changes(self.initial_state, snapshot())
        if changed:
            invalid.append(f"the bench process itself: {', '.join(changed)}")
        for b in backends:
            problems = []
            if b.state_start is not None and b.state_start["affinity"] != bench_affinity:
                problems.append(
                    f"started on CPUs {b.state_start['affinity']}, the bench had {bench_affinity}"
                )
            if b.state_start is not None and b.state_end is not None:
                problems += state_changes(b.state_start, b.state_end)
            if problems:
                b.status = "invalid: " + "; ".join(problems)
                invalid.append(f"{b.name}: {'; '.join(problems)}")
        return invalid

    def _summary(self, backends: list[Backend]) -> dict:
        by_name = {b.name: b for b in backends}
        ref = self.reference = self._reference(by_name)
        invalid = self._validity(backends)
        result = {}
        for b in backends:
            spread = spread_ms(b.times_ms)
            entry: dict[str, object] = {
                "median_ms": round(statistics.median(b.times_ms), 6) if b.times_ms else None,
                "runs": len(b.times_ms),
                "spread_ms": round(spread, 6) if spread is not None else None,
                "max_abs_err": None,
                "status": b.status,
                "setup_s": round(b.setup_s, 2),
            }
            if b.status == "ok" and b.times_ms and len(b.times_ms) < self.runs:
                entry["status"] = (
                    f"budget: {len(b.times_ms)} of {self.runs} runs in {self.budget_s:g} s"
                )
            if b.kernels is not None:
                entry["kernels"] = b.kernels
            if b.memory is not None:
                entry["peak_rss_mb"] = _mb(b.memory.get("peak_kb"))
                base = b.memory.get("base_kb")
                peak = b.memory.get("peak_kb")
                entry["peak_above_libraries_mb"] = (
                    _mb(peak - base) if peak is not None and base is not None else None
                )
            if b.threads is not None:
                entry["threads"] = b.threads
            if b.state_start is not None:
                entry["affinity"] = b.state_start["affinity"]
            if ref is not None and b.output is not None:
                if b.output.shape != ref.shape:
                    entry["status"] = f"wrong output shape {b.output.shape} vs {ref.shape}"
                else:
                    err = np.abs(b.output.astype(np.float64) - ref.astype(np.float64)).max()
                    entry["max_abs_err"] = float(err)
            result[b.name] = entry
        plus_ms = result["plus"]["median_ms"]
        speedup = {}
        for name, entry in result.items():
            if name == "plus":
                continue
            if plus_ms and entry["median_ms"]:
                speedup[name] = float(f"{entry['median_ms'] / plus_ms:.4g}")
            else:
                speedup[name] = entry["status"] if entry["status"] != "ok" else None
        return {
            "model": self.loaded.name if self.loaded else str(self.model),
            "target": self.stats.get("target"),
            "reference": self.reference_name,
            "environment": {
                "affinity": self.initial_state["affinity"],
                "cores": len(self.initial_state["affinity"]),
                "torch_threads_in_bench": self.initial_state["torch_threads"],
                "settle_s": SETTLE_S,
            },
            "invalid": invalid,
            "backends": result,
            "speedup": speedup,
            "warnings": spread_warnings(result),
            "stats": {k: v for k, v in self.stats.items() if k not in ("groups", "kernel_names")},
        }


def bench(model: object, backends: Sequence[str] = BACKENDS, **kwargs) -> dict:
    """Run :class:`Bench` and return its JSON-ready result."""
    return Bench(model, backends, **kwargs).run()


def _mb(kb: int | None) -> float | None:
    return round(kb / 1024, 1) if kb is not None else None


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def _progress(total: int, enabled: bool, stream: object = None):
    """A tqdm bar on ``stream`` (stderr), only when it is a terminal: a pipe or a log file
    gets no bar."""
    stream = stream if stream is not None else sys.stderr
    if not enabled or not getattr(stream, "isatty", lambda: False)():
        return _NoBar()
    from tqdm import tqdm

    return tqdm(total=total, desc="bench", unit="run", file=stream, leave=False)


def _write_user_files(module: object, artifact: str) -> None:
    """Next to a saved torch module, the model files (``python:FILE.py:ATTR``) its classes come
    from, for the worker to import before loading it (``worker.USER_FILES_SUFFIX``)."""
    import json
    import sys

    from ..loader import USER_MODULE_PREFIX
    from .worker import USER_FILES_SUFFIX

    names = {type(m).__module__ for m in module.modules()}
    files = {
        n: sys.modules[n].__file__
        for n in sorted(names)
        if n.startswith(USER_MODULE_PREFIX) and n in sys.modules
    }
    if files:
        with open(artifact + USER_FILES_SUFFIX, "w") as f:
            json.dump(files, f)
