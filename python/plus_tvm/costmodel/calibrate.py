"""``plus-tvm calibrate``: measure this machine's kernels and train the learned cost model.

For every program of the corpus (:mod:`.corpus`) and every tiny zoo model:

- **library calls**: phase 1 with every expressible subgraph sent to the library; each
  distinct call (kernel, config, operand types) is compiled as a one-call Relax function and
  timed through the VM on random operands, less the VM's own cost of calling a function (timed
  on one that returns its input); its vector is the one the dispatcher recorded for it;
- **TIR kernels**: phases 1-3 (the library off for corpus programs, so that GEMMs,
  convolutions and norms are measured as TIR too; on for zoo models, whose remaining kernels
  are what the pipeline really generates), then phase 4 twice, with the memory-kernel schedules
  (GIR, ParallelSpatial) and without; each kernel is timed alone with ``time_evaluator`` and
  described by its unscheduled PrimFunc and the schedule setting.

A corpus program with one library call also gives a **decision pair**: the call's measured
time against its TIR's (with the schedules), with the call's vector and its subgraph's operator
vectors as the dispatcher recorded them; each pair is a ``subgraph`` and a ``choice`` record
too. The records are split by program into training and held-out sets (:mod:`.train`); the
choices are scored by five-fold cross-validation over programs, against the analytic
constants' choices on the same pairs; the model, trained on everything, is written to the
user's cache.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import resource
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import tvm
from tvm import relax

from ..errors import TVM_FAILURE, PlusError, is_refusal
from ..kernel_timing import random_args, signatures
from ..options import Options
from ..runtime import KERNELS, native
from ..target import device_for
from .corpus import TIR_FLOP_LIMIT, Program, programs
from .features import gir_plan_features, subgraph_features, tir_features
from .train import choice_of


def zoo_models() -> tuple[str, ...]:
    """The zoo models whose kernels join the corpus by default (each as its tiny twin)."""
    from .. import zoo

    return tuple(n for n in zoo.names() if not n.endswith("-tiny"))


@dataclass
class Measurement:
    records: list[dict] = field(default_factory=list)
    pairs: list[dict] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)  # program -> time measuring it


def _median_us(fn: Callable[[], object], min_ms: float) -> float:
    """Median microseconds of ``fn`` over at least ``min_ms`` of runs (after two warm-up
    calls), the lowest of three such blocks: other processes only ever add time."""
    fn()
    fn()
    start = time.perf_counter()
    fn()
    once = time.perf_counter() - start
    runs = max(3, min(2000, int(min_ms / 1e3 / max(once, 1e-7))))
    blocks = []
    for _ in range(3):
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        blocks.append(float(np.median(times)))
    return min(blocks) * 1e6


class Calibrator:
    """Measures programs on one target (see the module docstring)."""

    def __init__(self, target: tvm.target.Target, min_ms: float = 20.0) -> None:
        from ..compile_inputs import resolve_inputs
        from ..gir.model import runtime_threads, target_lanes

        self.target = target
        self.dev = device_for(target)
        if not self.dev.exist:
            raise PlusError(f"calibrate: this machine has no {target.kind.name} device to time on")
        self.min_ms = min_ms
        self.options = resolve_inputs(target, Options(dispatch_cost_model=False))
        self.lanes = target_lanes(target)
        self.threads = self.options.threads or runtime_threads(self.options.cpu_parallel)
        self.rng = np.random.default_rng(0)
        self._entry_us: float | None = None
        if target.kind.name == "llvm":
            from ..runtime import use_native

            use_native()  # before any VM is built: the VM resolves kernel names then

    # ------------------------------------------------------------------ the phases
    def _run(self, mod: tvm.IRModule, options: Options, phases: tuple[str, ...]) -> tvm.IRModule:
        from ..pipeline import phase_passes

        with tvm.transform.PassContext(opt_level=3), self.target:
            return tvm.transform.Sequential(phase_passes(self.target, options, phases))(mod)

    def _build(self, mod: tvm.IRModule) -> object:
        """``mod`` through the pipeline's lowering phases (the library calls the VM runs
        natively become native calls there), built for the target."""
        from ..pipeline import phase_passes

        post = tvm.transform.Sequential(
            phase_passes(self.target, self.options, ("lower", "finalize"))
        )
        return tvm.compile(mod, self.target, relax_pipeline=post)

    # ------------------------------------------------------------------ library calls
    def entry_us(self) -> float:
        """The VM's cost of calling a function that returns its input."""
        if self._entry_us is None:
            bb = relax.BlockBuilder()
            x = relax.Var("x", relax.TensorType((4,), "float32"))
            with bb.function("main", [x]):
                bb.emit_func_output(x)
            vm = relax.VirtualMachine(self._build(bb.get()), self.dev)
            arg = tvm.runtime.tensor(np.zeros(4, "float32"), self.dev)
            self._entry_us = _median_us(lambda: vm["main"](arg), self.min_ms)
        return self._entry_us

    def time_call(self, call: relax.Call, out_ty: relax.TensorType) -> float:
        """Microseconds of one library call alone, through the VM."""
        params, args, sigs = [], [], []
        for k, arg in enumerate(call.args[1].fields):
            if isinstance(arg.ty, relax.TensorType):
                shape = [int(d) for d in arg.ty.shape.values]
                param = relax.Var(f"a{k}", relax.TensorType(shape, arg.ty.dtype))
                params.append(param)
                args.append(param)
                sigs.append((shape, str(arg.ty.dtype)))
            else:
                args.append(arg)
        bb = relax.BlockBuilder()
        with bb.function("main", params):
            out = bb.emit(relax.call_dps_packed(call.args[0].global_symbol, args, out_ty=out_ty))
            bb.emit_func_output(out)
        vm = relax.VirtualMachine(self._build(bb.get()), self.dev)
        values = random_args(sigs, self.dev, self.rng)
        self.dev.sync()

        def run() -> None:
            vm["main"](*values)
            self.dev.sync()

        return max(_median_us(run, self.min_ms) - self.entry_us(), 0.05)

    def library_records(self, group: str, mod: tvm.IRModule) -> tuple[list[dict], int]:
        """Records of every distinct library call phase 1 makes of ``mod``, and the number of
        calls."""
        from ..pipeline import dispatch_phase

        with tvm.transform.PassContext(opt_level=3), self.target:
            passes = dispatch_phase(self.target, self.options, record_calls=True)
            dispatched = tvm.transform.Sequential(passes)(mod)
        report = json.loads(str(dispatched.attrs["plus.dispatch"]))
        made_by_kernel: dict[str, list[dict]] = {}
        for made in report["calls"]:
            if made["features"] is not None:
                made_by_kernel.setdefault(made["kernel"], []).append(made)
        records, seen, count = [], set(), 0
        for call, out_ty in _library_calls(dispatched):
            count += 1
            kernel = call.args[0].global_symbol
            operands = [
                str(a.ty) if isinstance(a.ty, relax.TensorType) else str(a)
                for a in call.args[1].fields
            ]
            key = (kernel, tuple(operands), str(out_ty))
            if key in seen or not _static(call, out_ty):
                continue
            seen.add(key)
            made = _made_for(made_by_kernel.get(kernel, []), call, out_ty)
            if made is None:
                continue
            us = self.time_call(call, out_ty)
            records.append(
                {
                    "part": "library",
                    "group": group,
                    "features": made["features"],
                    "us": us,
                    "tir": made["tir"],
                }
            )
        return records, count

    # ------------------------------------------------------------------ TIR kernels
    def tir_records(self, group: str, mod: tvm.IRModule, dispatch: bool) -> list[dict]:
        """Records of every statically shaped kernel of ``mod`` with and without the memory
        schedules."""
        # with the library: the pipeline's own choices (cost model on), so that the kernels are
        # the ones a compiled model runs
        options = self.options.replace(dispatch=dispatch, dispatch_cost_model=dispatch)
        fused = self._run(mod, options, ("dispatch", "legalize", "fuse"))
        records = []
        for gir in (False, True):
            scheduled = self._run(fused, options.replace(gir="on" if gir else "off"), ("schedule",))
            sigs = signatures(scheduled)
            if not sigs:
                continue
            funcs = {n: scheduled[n].with_attr("global_symbol", n) for n in sigs}
            lib = tvm.compile(tvm.IRModule(funcs), self.target).mod
            for name, entry in sigs.items():
                vector = tir_features(fused[name], gir=gir, lanes=self.lanes, threads=self.threads)
                if vector is None:
                    continue
                args = random_args(entry["args"], self.dev, self.rng)
                us = _kernel_us(lib, name, self.dev, args)
                records.append(
                    {
                        "part": "tir",
                        "group": group,
                        "features": vector,
                        "us": us,
                        "launches": entry["launches"],
                        "kernel": name,
                    }
                )
        if self.target.kind.name == "llvm":
            records += self.gir_plan_records(group, fused, options.replace(gir="on"))
        return records

    def gir_plan_records(self, group: str, fused: tvm.IRModule, options: Options) -> list[dict]:
        """Records of the GIR performance model's best plans (up to ``gir_cost.TOP``) of every
        statically shaped kernel of ``fused`` that GIR plans in more than one way, each plan
        lowered as ``GIRLLVM`` lowers it and timed alone (``plan`` = its rank by the
        performance model; ``kernel`` names the kernel the plans share)."""
        from ..compile_inputs import gir_machine
        from ..gir.search import candidate_plans
        from ..passes import ExpandIntegerPower
        from ..schedules import GIRLLVM
        from .gir_cost import TOP

        with tvm.transform.PassContext(opt_level=3), self.target:
            kernels = ExpandIntegerPower()(fused)  # as the schedule phase sees them
        machine = gir_machine(self.target, options)
        rule = GIRLLVM(machine=machine)
        sigs = signatures(kernels)
        funcs, made = {}, {}
        for name in sigs:
            func = kernels[name]
            vector = tir_features(func, gir=True, lanes=self.lanes, threads=self.threads)
            if vector is None:
                continue
            plans = candidate_plans(func, self.target, 0, machine, exhaustive=True)[:TOP]
            if len(plans) < 2:
                continue
            for rank, p in enumerate(plans):
                sch = rule.lower_plan(func, p)
                if sch is None:
                    continue
                variant = f"{name}__gir{rank}"
                funcs[variant] = sch.mod["main"].with_attr("global_symbol", variant)
                features = gir_plan_features(
                    vector, p.kernel.structure, p.params, p.estimate.seconds
                )
                made[variant] = (name, rank, features)
        if not funcs:
            return []
        lib = tvm.compile(tvm.IRModule(funcs), self.target).mod
        records, args = [], {}
        for variant, (name, rank, features) in made.items():
            if name not in args:
                args[name] = random_args(sigs[name]["args"], self.dev, self.rng)
            records.append(
                {
                    "part": "gir_plan",
                    "group": group,
                    "features": features,
                    "us": _kernel_us(lib, variant, self.dev, args[name]),
                    "launches": sigs[name]["launches"],
                    "kernel": f"{group}/{name}",
                    "plan": rank,
                }
            )
        return records

    # ------------------------------------------------------------------ programs
    def measure_program(self, program: Program, out: Measurement) -> None:
        from ..loader import load_model

        module, inputs = program.build()
        loaded = load_model(module, inputs)
        library, calls = self.library_records(program.name, loaded.mod)
        out.records += library
        if program.flops > TIR_FLOP_LIMIT:
            return
        tir = self.tir_records(program.name, loaded.mod, dispatch=False)
        out.records += tir
        if calls == 1 and len(library) == 1 and library[0]["tir"]:
            # the choice as the dispatcher prices it: the call against its subgraph's
            # operators legalized alone; measured: the call against the kernels the pipeline
            # makes of the subgraph (memory schedules on, as on this target by default)
            scheduled = [r for r in tir if r["part"] == "tir" and r["features"]["gir"]]
            tir_us = sum(r["us"] * r["launches"] for r in scheduled)
            out.pairs.append(
                {
                    "group": program.name,
                    "library": library[0]["features"],
                    "library_us": library[0]["us"],
                    "tir": library[0]["tir"],
                    "tir_us": tir_us,
                }
            )
            out.records.append(
                {
                    "part": "subgraph",
                    "group": program.name,
                    "features": subgraph_features(library[0]["tir"]),
                    "us": tir_us,
                }
            )
            out.records.append(
                {
                    "part": "choice",
                    "group": program.name,
                    "features": choice_of(out.pairs[-1]),
                    "us": tir_us / library[0]["us"],
                }
            )

    def measure_zoo(self, name: str, out: Measurement) -> None:
        from ..loader import load_model

        loaded = load_model(f"zoo:{name}")
        library, _ = self.library_records(f"zoo:{name}", loaded.mod)
        out.records += library
        out.records += self.tir_records(f"zoo:{name}", loaded.mod, dispatch=True)


def _kernel_us(lib: tvm.runtime.Module, name: str, dev: object, args: list) -> float:
    """Median microseconds of one kernel: five timings of at least 5 ms each, or for a kernel
    slower than 20 ms (an untuned TIR GEMM) the second of two runs."""
    once = lib.time_evaluator(name, dev, number=1, repeat=1)(*args).results[0]
    if once > 0.02:
        return float(lib.time_evaluator(name, dev, number=1, repeat=1)(*args).results[0]) * 1e6
    timer = lib.time_evaluator(name, dev, number=1, repeat=5, min_repeat_ms=5)
    return float(np.median(timer(*args).results)) * 1e6


def _library_calls(mod: tvm.IRModule) -> Iterator[tuple[relax.Call, relax.TensorType]]:
    """Each ``call_dps_packed`` of a library kernel (``runtime.KERNELS``) in ``mod``'s Relax
    functions, with its output type (single-output calls only)."""
    for _, func in mod.functions_items():
        if not isinstance(func, relax.Function):
            continue
        for block in func.body.blocks:
            for binding in block.bindings:
                value = binding.value
                if (
                    isinstance(value, relax.Call)
                    and value.op.same_as(tvm.ir.Op.get("relax.call_dps_packed"))
                    and str(value.args[0].global_symbol) in KERNELS
                    and isinstance(binding.var.ty, relax.TensorType)
                ):
                    yield value, binding.var.ty


def _static(call: relax.Call, out_ty: relax.TensorType) -> bool:
    types = [a.ty for a in call.args[1].fields if isinstance(a.ty, relax.TensorType)]
    return all(
        t.shape is not None and all(isinstance(d, tvm.tirx.IntImm) for d in t.shape.values)
        for t in [*types, out_ty]
    )


def _made_for(made: list[dict], call: relax.Call, out_ty: relax.TensorType) -> dict | None:
    """The dispatcher's record of the call with these operand sizes (same kernel, same bytes
    in and out): its vector and its subgraph's TIR vectors."""
    from .features import library_features

    inputs = [
        ([int(d) for d in a.ty.shape.values], str(a.ty.dtype))
        for a in call.args[1].fields
        if isinstance(a.ty, relax.TensorType)
    ]
    output = ([int(d) for d in out_ty.shape.values], str(out_ty.dtype))
    probe = library_features(
        str(call.args[0].global_symbol), 0.0, inputs, output, native=False, threads=0
    )
    for entry in made:
        vector = entry["features"]
        if (
            all(
                abs(vector[k] - probe[k]) < 1e-9
                for k in ("bytes_in", "bytes_out", "out_rows", "out_cols")
            )
            and vector["inputs"] == probe["inputs"]
        ):
            return entry
    return None


@contextlib.contextmanager
def _bar(total: int, enabled: bool) -> Iterator[object]:
    if not enabled:

        class _No:
            def update(self, _n: int = 1) -> None:
                pass

            def set_postfix_str(self, _s: str) -> None:
                pass

        yield _No()
        return
    from tqdm import tqdm

    with tqdm(total=total, desc="calibrate", unit="program", file=sys.stderr) as bar:
        yield bar


def busy_core_s() -> float | None:
    """Core-seconds the machine's CPUs have been busy since boot, all processes (Linux
    ``/proc/stat``); None where it cannot be read."""
    try:
        with open("/proc/stat") as f:
            values = [int(v) for v in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    if len(values) < 5:
        return None
    idle = values[3] + values[4]  # idle, iowait
    return (sum(values) - idle) / os.sysconf("SC_CLK_TCK")


def own_core_s() -> float:
    """Core-seconds this process (and its finished children) has used."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def other_load(busy: tuple[float, float], own: tuple[float, float], wall_s: float) -> float:
    """Cores that other processes kept busy on average over ``wall_s`` seconds, from the
    machine's busy core-seconds and this process's own at the start and the end."""
    others = (busy[1] - busy[0]) - (own[1] - own[0])
    return max(others, 0.0) / wall_s if wall_s > 0 else 0.0


#: cores other processes may keep busy during a calibration before its timings count as noisy
#: (a run beside a test suite on this 2-core machine: Spearman of the library calls 0.95 ->
#: 0.89, the choices' regret 3.5% -> 213%)
QUIET_LOAD = 0.1


def calibrate(
    target: tvm.target.Target,
    *,
    quick: bool = False,
    zoo: tuple[str, ...] | None = None,
    full_zoo: bool = False,
    seed: int = 0,
    progress: bool = True,
    min_ms: float = 20.0,
) -> tuple[dict, Measurement]:
    """Measure the corpus (and the tiny twins of ``zoo``, default :func:`zoo_models`, and with
    ``full_zoo`` the models at their full sizes: the kernels and GIR plans compiled models
    run) on ``target`` and train a model; returns the model file's contents and the
    measurements."""
    from ..gir.model import figures_key
    from .train import train

    start = time.perf_counter()
    busy0, own0 = busy_core_s(), own_core_s()
    calibrator = Calibrator(target, min_ms=min_ms)
    drawn = programs(quick=quick, seed=seed)
    zoo = zoo_models() if zoo is None else zoo
    twins = [name if name.endswith("-tiny") else f"{name}-tiny" for name in zoo]
    zoo = twins + [name for name in zoo if full_zoo and not name.endswith("-tiny")]
    out = Measurement()
    # kernels are timed on the pool compiled models run their parallel loops on
    openmp = native.openmp_parallel(calibrator.options.cpu_parallel == "openmp")
    with openmp, _bar(len(drawn) + len(zoo), progress) as bar:
        for program in drawn:
            bar.set_postfix_str(program.name[:40])
            began = time.perf_counter()
            try:
                calibrator.measure_program(program, out)
            except (PlusError, *TVM_FAILURE) as err:
                if not isinstance(err, PlusError) and not is_refusal(err):
                    raise  # a bug of plus_tvm's own code, not TVM refusing the program
                out.skipped.append(f"{program.name}: {str(err).strip().splitlines()[-1][:160]}")
            out.seconds[program.name] = round(time.perf_counter() - began, 2)
            bar.update(1)
        for name in zoo:
            bar.set_postfix_str(name)
            began = time.perf_counter()
            try:
                calibrator.measure_zoo(name, out)
            except (PlusError, *TVM_FAILURE) as err:
                if not isinstance(err, PlusError) and not is_refusal(err):
                    raise  # a bug of plus_tvm's own code, not TVM refusing the model
                out.skipped.append(f"zoo:{name}: {str(err).strip().splitlines()[-1][:160]}")
            out.seconds[f"zoo:{name}"] = round(time.perf_counter() - began, 2)
            bar.update(1)
    meta = {
        "target_kind": target.kind.name,
        "target": str(target),
        "machine": figures_key(target),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "threads": calibrator.threads,
        "entry_us": round(calibrator.entry_us(), 3),
    }
    busy1 = busy_core_s()
    if busy0 is not None and busy1 is not None:
        wall = time.perf_counter() - start
        meta["other_load"] = round(other_load((busy0, busy1), (own0, own_core_s()), wall), 3)
    data = train(out.records, seed=seed, meta=meta)
    data["calibrate_s"] = round(time.perf_counter() - start, 1)
    if out.pairs:
        data["accuracy"].update(cross_validated_decisions(out.records, out.pairs, meta, seed))
    if any(r["part"] == "gir_plan" for r in out.records):
        data["accuracy"].update(cross_validated_plans(out.records, meta, seed))
    return data, out


def cross_validated_decisions(
    records: list[dict], pairs: list[dict], meta: dict, seed: int, folds: int = 5
) -> dict:
    """The library-vs-TIR choice on every measured pair by a model that never saw its program
    (``folds``-fold over programs), and the analytic constants' choice on the same pairs."""
    from .learned import LearnedCostModel
    from .train import decision_accuracy, train

    learned = {"right": 0, "n": 0, "chosen_us": 0.0, "best_us": 0.0}
    for held in _folds(list({p["group"] for p in pairs}), folds, seed):
        fold = [p for p in pairs if p["group"] in held]
        model = LearnedCostModel(
            train([r for r in records if r["group"] not in held], holdout=0, seed=seed, meta=meta),
            "",
        )
        got = decision_accuracy(model, fold)
        for key in learned:
            learned[key] += got[key]
    return {
        "decisions": _summary(learned),
        "decisions_analytic": _summary(decision_accuracy(None, pairs)),
    }


def _folds(groups: list, folds: int, seed: int) -> list[set]:
    """``groups`` (program names) shuffled by ``seed`` and dealt into ``folds`` sets."""
    groups = sorted(groups)
    np.random.default_rng(seed).shuffle(groups)
    return [set(groups[k::folds]) for k in range(folds) if groups[k::folds]]


def _summary(acc: dict) -> dict:
    regret = acc["chosen_us"] / acc["best_us"] - 1.0 if acc["best_us"] else 0.0
    return {"right": acc["right"], "n": acc["n"], "regret": round(regret, 4)}


def cross_validated_plans(records: list[dict], meta: dict, seed: int, folds: int = 5) -> dict:
    """The GIR plan picked for every kernel with several measured plans by a model that never
    saw its program (``folds``-fold over programs), and the GIR performance model's picks."""
    from .learned import LearnedCostModel
    from .train import plan_choices, train

    plans = [r for r in records if r["part"] == "gir_plan"]
    learned = {"right": 0, "n": 0, "chosen_us": 0.0, "best_us": 0.0}
    for held in _folds(list({r["group"] for r in plans}), folds, seed):
        data = train(
            [r for r in records if r["group"] not in held], holdout=0, seed=seed, meta=meta
        )
        if "gir_plan" not in data:
            continue
        got = plan_choices(LearnedCostModel(data, ""), [r for r in plans if r["group"] in held])
        for key in learned:
            learned[key] += got[key]
    return {
        "gir_plans": _summary(learned),
        "gir_plans_analytic": _summary(plan_choices(None, plans)),
    }


def write(data: dict, path: str) -> str:
    """Write a model file (the folder is created), atomically and private to the user (mode
    0600: the default path is in plus_tvm's cache, which refuses files others can write)."""
    from ..paths import write_private

    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, exist_ok=True)
    write_private(path, json.dumps(data).encode())
    return path
