"""Side-by-side benchmark of plus against TVM's pipeline, torch eager, torch.compile and ORT.

All backends run in one process on the same inputs, interleaved round by round (one timed run of
each backend per round), so machine noise hits them alike; medians are reported with the ratio of
each peer's median to plus's (above 1: plus is faster). Each backend has a time budget: a backend
whose runs are slow (an untuned TVM build takes tens of seconds per BERT run on a CPU) is timed a
few times and reported, not waited on. Every backend's output is compared with the reference
(torch eager where the model is a torch model, else ONNX Runtime).
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from .errors import PlusError
from .loader import LoadedModel, load_model, random_inputs
from .options import Options

BACKENDS = ("plus", "tvm", "torch", "torch-compile", "onnxruntime")


@dataclass
class Backend:
    """One contender: a name, a callable that runs the model once, and what we learnt."""

    name: str
    run: Callable[[], object] | None = None
    status: str = "ok"
    times_ms: list[float] = field(default_factory=list)
    spent_s: float = 0.0
    output: object = None
    kernels: int | None = None
    setup_s: float = 0.0

    @property
    def active(self) -> bool:
        return self.run is not None and self.status == "ok"


def _first(out: object) -> np.ndarray:
    """The first output as numpy, whatever the backend returned."""
    if isinstance(out, (list, tuple)):
        return _first(out[0])
    if hasattr(out, "detach"):
        return out.detach().cpu().numpy()
    if hasattr(out, "numpy"):
        return out.numpy()
    return np.asarray(out)


def _short(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[-1] if text else ''}"[:300]


def _check_count(name: str, value: object, least: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise PlusError(f"{name} must be an integer of at least {least}, got {value!r}")


class Bench:
    """Sets the backends up, times them interleaved, and summarises.

    Parameters
    ----------
    model : object
        Anything :func:`plus_tvm.loader.load_model` accepts.
    backends : sequence of str
        Names from :data:`BACKENDS`; ``plus`` is always included.
    target : object
        Target for plus and tvm (``"llvm"`` or ``"cuda"``...).
    options : Options
        Options of the plus pipeline.
    runs, warmup : int
        Timed runs wanted per backend, and untimed runs before them.
    budget_s : float
        Wall-clock budget per backend for warm-up and timed runs (set-up excluded); a backend
        stops being timed when it runs out and reports how many runs it got.
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
    ) -> None:
        unknown = [b for b in backends if b not in BACKENDS and not b.startswith("plus:")]
        if unknown:
            raise PlusError(
                f"unknown backend(s) {unknown}; choose from {list(BACKENDS)} or a plus variant "
                "plus:KEY=VALUE[+KEY=VALUE...] (e.g. plus:gir=false)"
            )
        base = options or Options()
        self.variants = {  # plus with other options, measured beside plus (e.g. an ablation)
            b: Options.from_pairs(b[len("plus:") :].split("+"), base=base)
            for b in backends
            if b.startswith("plus:")
        }
        names = ["plus"] + [b for b in backends if b != "plus"]
        self.names = list(dict.fromkeys(names))
        self.model = model
        self.target = target
        self.options = options or Options()
        _check_count("runs", runs, 1)
        _check_count("warmup", warmup, 0)
        if not isinstance(budget_s, (int, float)) or not 0 < budget_s < float("inf"):
            raise PlusError(f"budget must be a positive number of seconds, got {budget_s!r}")
        self.runs = int(runs)
        self.warmup = int(warmup)
        self.budget_s = float(budget_s)
        self.progress = progress
        self.log = log or (lambda msg: print(msg, file=sys.stderr))
        self.loaded: LoadedModel | None = None
        self.stats: dict = {}
        self.reference: np.ndarray | None = None
        self.reference_name = ""

    # ------------------------------------------------------------------------------- set-up
    def _inputs(self, loaded: LoadedModel, specs: list) -> tuple[np.ndarray, ...]:
        if loaded.example_inputs is not None:
            return tuple(
                x.detach().cpu().numpy() if hasattr(x, "detach") else np.asarray(x)
                for x in loaded.example_inputs
            )
        return random_inputs(specs)

    def _setup(self) -> list[Backend]:
        from . import compile as plus_compile

        self.log(f"[bench] importing {self.model}")
        loaded = load_model(self.model)
        self.loaded = loaded
        backends = [Backend(n) for n in self.names]
        by_name = {b.name: b for b in backends}
        inputs: tuple[np.ndarray, ...] | None = None

        for name in ("plus", "tvm", *self.variants):
            if name not in by_name:
                continue
            b = by_name[name]
            start = time.perf_counter()
            try:
                self.log(f"[bench] compiling with the {name} pipeline")
                options = self.variants.get(name, self.options)
                pipeline = "tvm" if name == "tvm" else "plus"
                cm = plus_compile(loaded, self.target, options=options, pipeline=pipeline)
                if inputs is None:
                    inputs = self._inputs(loaded, cm.inputs)
                prepared = cm.prepare(*inputs)
                b.run = lambda cm=cm, prepared=prepared: cm.run_prepared(prepared)
                b.kernels = int(cm.stats["kernels"])
                if name == "plus":
                    self.stats = dict(cm.stats)
            except Exception as err:  # a failing backend is reported, not fatal
                if name == "plus":
                    raise
                b.status = f"failed: {_short(err)}"
            b.setup_s = time.perf_counter() - start

        assert inputs is not None  # plus always compiles or raises
        torch_mod = loaded.torch_module
        for name in ("torch", "torch-compile"):
            if name not in by_name:
                continue
            b = by_name[name]
            if torch_mod is None:
                b.status = "n/a: not a torch model"
                continue
            b.run = self._torch_runner(torch_mod, inputs, compiled=name == "torch-compile")
        if "onnxruntime" in by_name:
            b = by_name["onnxruntime"]
            start = time.perf_counter()
            try:
                b.run = self._ort_runner(loaded, inputs)
            except Exception as err:
                b.status = f"failed: {_short(err)}"
            b.setup_s = time.perf_counter() - start
        self.inputs = inputs
        return backends

    def _torch_runner(self, module, inputs, compiled: bool) -> Callable[[], object]:
        import torch

        torch.set_num_threads(_cores())
        args = tuple(torch.from_numpy(np.asarray(x, order="C")) for x in inputs)
        fn = torch.compile(module) if compiled else module

        def run() -> object:
            with torch.inference_mode():
                return fn(*args)

        return run

    def _ort_runner(self, loaded: LoadedModel, inputs) -> Callable[[], object]:
        import onnxruntime as ort

        proto = loaded.onnx_model
        if proto is None:
            proto = self._export_onnx(loaded)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = _cores()
        opts.inter_op_num_threads = 1
        if os.environ.get("PLUS_TVM_ORT_SPIN", "0") != "1":
            # Backends share the cores in one process: a pool that keeps spinning after its
            # run steals them from the next backend's run (measured: plus 71 ms alone, 102 ms
            # right after spinning ORT runs). PLUS_TVM_ORT_SPIN=1 restores ORT's default.
            opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        sess = ort.InferenceSession(
            proto.SerializeToString(), opts, providers=["CPUExecutionProvider"]
        )
        feed = {i.name: x for i, x in zip(sess.get_inputs(), inputs)}
        if len(feed) != len(inputs):
            raise PlusError(f"ONNX model takes {len(sess.get_inputs())} inputs, have {len(inputs)}")
        return lambda: sess.run(None, feed)

    def _export_onnx(self, loaded: LoadedModel):
        import onnx

        from . import zoo

        self.log("[bench] exporting to ONNX for onnxruntime")
        with tempfile.TemporaryDirectory() as tmp, zoo.quiet_export_loggers():
            path = os.path.join(tmp, "model.onnx")
            entry = loaded.extra.get("zoo_entry")
            if entry is not None:
                zoo.export_onnx(entry, path)
            else:
                import torch

                torch.onnx.export(
                    loaded.torch_module, tuple(loaded.example_inputs), path, dynamo=True
                )
            return onnx.load(path)

    # ----------------------------------------------------------------------------- running
    def _once(self, b: Backend, timed: bool) -> None:
        start = time.perf_counter()
        try:
            out = b.run()
        except Exception as err:
            b.status = f"failed: {_short(err)}"
            return
        elapsed = time.perf_counter() - start
        b.spent_s += elapsed
        if timed:
            b.times_ms.append(elapsed * 1e3)
        if b.output is None:
            b.output = _first(out)

    def run(self) -> dict:
        """Set up, warm up, time interleaved rounds, and return the result dict."""
        backends = self._setup()
        total = len(backends) * (self.warmup + self.runs)
        bar = _progress(total, self.progress)
        for i in range(self.warmup):
            for b in backends:
                # the first warm-up run always happens: a timed cold run is not a latency
                if b.active and (i == 0 or b.spent_s < self.budget_s):
                    self._once(b, timed=False)
                bar.update(1)
        for _ in range(self.runs):
            for b in backends:
                if not b.active:
                    bar.update(1)
                    continue
                # Always time at least once; after that, stop when the budget is spent.
                if b.times_ms and b.spent_s >= self.budget_s:
                    bar.update(1)
                    continue
                self._once(b, timed=True)
                bar.update(1)
        bar.close()
        return self._summary(backends)

    def _summary(self, backends: list[Backend]) -> dict:
        by_name = {b.name: b for b in backends}
        ref = None
        for cand in ("torch", "onnxruntime"):
            if cand in by_name and by_name[cand].output is not None:
                ref, self.reference_name = by_name[cand].output, cand
                break
        if ref is None and self.loaded is not None and self.loaded.torch_module is not None:
            import torch

            with torch.inference_mode():
                args = tuple(torch.from_numpy(np.asarray(x, order="C")) for x in self.inputs)
                ref, self.reference_name = _first(self.loaded.torch_module(*args)), "torch"
        self.reference = ref
        result = {}
        for b in backends:
            entry: dict[str, object] = {
                "median_ms": round(statistics.median(b.times_ms), 6) if b.times_ms else None,
                "runs": len(b.times_ms),
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
            if ref is not None and b.output is not None:
                if b.output.shape != ref.shape:
                    entry["max_abs_err"] = None
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
            "backends": result,
            "speedup": speedup,
            "stats": {k: v for k, v in self.stats.items() if k not in ("groups", "kernel_names")},
        }


def bench(model: object, backends: Sequence[str] = BACKENDS, **kwargs) -> dict:
    """Run :class:`Bench` and return its JSON-ready result."""
    return Bench(model, backends, **kwargs).run()


# ------------------------------------------------------------------------------------ output
def format_table(result: dict) -> str:
    """The result as an aligned text table (one row per backend)."""
    header = (
        f"{'backend':<14}{'median ms':>12}{'runs':>6}{'plus speedup':>14}{'max abs err':>13}"
        f"{'kernels':>9}  status"
    )
    lines = [
        f"model {result['model']} on {result['target']} (reference: {result['reference']})",
        header,
        "-" * len(header),
    ]
    for name, e in result["backends"].items():
        ms = f"{e['median_ms']:.3f}" if e["median_ms"] is not None else "-"
        sp = result["speedup"].get(name) if name != "plus" else 1.0
        sp_text = f"{sp:.2f}x" if isinstance(sp, (int, float)) else "-"
        err = f"{e['max_abs_err']:.2e}" if e["max_abs_err"] is not None else "-"
        kern = str(e.get("kernels", "-"))
        lines.append(
            f"{name:<14}{ms:>12}{e['runs']:>6}{sp_text:>14}{err:>13}{kern:>9}  {e['status']}"
        )
    s = result.get("stats", {})
    if s:
        lines.append(
            f"plus: ops {s.get('ops')}, kernels {s.get('kernels')}, fusion ratio "
            f"{s.get('fusion_ratio')}, library calls {s.get('library_calls')}"
        )
    return "\n".join(lines)


def plot(result: dict, path: str) -> str:
    """Bar chart of the medians (log scale) with plus's speedup over each peer."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n, e in result["backends"].items() if e["median_ms"] is not None]
    values = [result["backends"][n]["median_ms"] for n in names]
    fig, ax = plt.subplots(figsize=(1.6 * max(3, len(names)), 3.6))
    bars = ax.bar(names, values, color=["#d62728" if n == "plus" else "#1f77b4" for n in names])
    ax.set_yscale("log")
    ax.set_ylabel("median latency (ms, log)")
    ax.set_title(f"{result['model']} on {result['target']}")
    for bar_, name in zip(bars, names):
        sp = result["speedup"].get(name)
        label = "plus" if name == "plus" else (f"{sp:.2f}x" if isinstance(sp, (int, float)) else "")
        ax.annotate(
            label,
            (bar_.get_x() + bar_.get_width() / 2, bar_.get_height()),
            ha="center",
            va="bottom",
            fontsize=8,
        )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# ----------------------------------------------------------------------------------- helpers
def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


class _NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def _progress(total: int, enabled: bool):
    if not enabled:
        return _NoBar()
    from tqdm import tqdm

    return tqdm(total=total, desc="bench", unit="run", file=sys.stderr, leave=False)
