"""Performance model of GIR graphs (paper 002, section 6) and the machine figures it needs.

A graph's time is estimated from what it moves and synchronizes, per row and parallel unit:

- bytes moved at each hierarchy over that hierarchy's bandwidth; a GLOBAL segment narrower
  than a cache line (or GPU sector) costs the whole line; data shared by every row (weights)
  crosses GLOBAL once;
- synchronizations times the cost of their scope;
- computation: element operations (transcendental ones weighted) over the lanes that run them;
- parallel occupancy: GLOBAL bandwidth is only reached when enough units are busy.

Memory and computation overlap, so the time is their maximum plus the synchronizations.

Machine figures: the CPU's copy bandwidth (GLOBAL) and in-cache copy bandwidth (CACHE) are
measured once on the machine (:func:`measure_cpu`) and stored in plus_tvm's cache
(``<cache root>/gir-figures-<key>.json``, :mod:`plus_tvm.paths`); without a stored measurement
(or with a damaged one, which is named in a warning) the defaults below are used. GPU figures
are per architecture defaults.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import time
from dataclasses import dataclass

import tvm

from ..errors import TVM_FAILURE, is_refusal
from ..paths import private_dir, read_json, write_json
from .analysis import Kernel
from .ir import Graph, Hierarchy, Kind, Scope
from .rewrite import Capacity


@dataclass(frozen=True)
class Machine:
    """What the performance model knows about a target."""

    family: str  # "cpu" | "gpu"
    units: int  # parallel units: CPU cores, GPU resident warps
    lanes: int  # fp32 SIMD lanes (CPU) or threads per warp (GPU)
    global_gbps: float  # copy bandwidth: bytes read + written per second / 1e9
    cache_gbps: float  # per-unit bandwidth of CACHE (CPU L1/L2, GPU shared memory)
    unit_share: float  # fraction of global bandwidth one unit reaches alone
    reg_bytes: int  # bytes of registers one unit may keep live
    cache_bytes: int  # bytes of CACHE one unit (CPU core, GPU block) may use
    tile_bytes: int  # largest staged transpose tile (CPU: in L1 beside its streams)
    gops: float  # element operations per ns per lane
    transcendental: float  # element operations one transcendental costs
    line: int  # bytes of one GLOBAL transaction
    sync_ns: tuple[float, float, float, float]  # per Scope
    page_penalty: int = 0  # bytes a GLOBAL segment costs extra when it jumps a page (CPU)
    launch_ns: float = 0.0  # CPU: waking the thread pool for a parallel loop
    chain_ns: float = 0.0  # CPU: latency of one dependent vector add of a reduction
    stack_bytes: int = 0  # CPU: row-local buffers up to this size live on the stack
    alloc_ns: float = 0.0  # CPU: larger row-local buffers cost a workspace allocation per row
    measured: bool = False

    def capacity(self) -> Capacity:
        return Capacity(reg=self.reg_bytes, cache=self.cache_bytes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# launch_us: waking TVM's pool (spin count 0, ``plus_tvm.threads``) for one parallel loop, measured
# by ``measure_cpu`` on this project's 2-core CI machine type: 17-35 us (median of 200 calls of a
# parallel 2 x 64 add against its serial twin, three runs); the model had 5 us before, and put
# EfficientNet-B0's squeeze-excite kernels (2-20 us of work) on both cores: 0.81 ms of TIR
# kernels against 0.45 ms with the measured launch
_CPU_DEFAULT = dict(global_gbps=20.0, cache_gbps=100.0, unit_share=0.6, launch_us=30.0)
# launch_us on OpenMP's team (``runtime/native/parallel_launch.cc``), awake between kernels: the
# same measurement with the team awake, 0.69-0.70 us here (three runs)
_OPENMP_LAUNCH_US = 1.0
LAUNCH_KEYS = {"tvm": "launch_us", "openmp": "launch_us_openmp"}  # stored figure per pool


def _cpu_lanes(target: tvm.target.Target) -> int:
    try:
        bits = tvm.target.codegen.llvm_get_vector_width(target)
    except TVM_FAILURE as err:  # an mcpu (or triple) this LLVM does not know has no width
        if not is_refusal(err):
            raise
        bits = 128
    return max(int(bits) // 32, 4) if bits and bits > 0 else 4


def target_lanes(target: tvm.target.Target) -> int:
    """fp32 lanes of one vector instruction (CPU) or threads of a warp (GPU)."""
    return 32 if "gpu" in target.keys else _cpu_lanes(target)


def parallel_pool(choice: str) -> str:
    """The pool parallel loops will run on for ``Options.cpu_parallel`` = ``choice``: OpenMP's
    when asked for and the native library can route TVM's launches there (it is built and loaded
    here, once per process, as the first CPU run would), else TVM's."""
    if choice == "openmp":
        from ..runtime import native, use_native

        if use_native() and native.openmp_parallel_available():
            return "openmp"
    return "tvm"


def runtime_threads(pool: str = "tvm") -> int:
    """Threads of a parallel loop on ``pool``: OpenMP's team as torch sizes it (when the launch
    is installed), or TVM's pool (which TVM sizes when it starts); 0 when unknown."""
    if pool == "openmp":
        from ..runtime import native

        threads = native.openmp_threads()
        if threads:
            return threads
    query = tvm.get_global_func("runtime.NumThreads", allow_missing=True)
    return int(query()) if query is not None else 0


def cpu_machine(
    target: tvm.target.Target, figures: dict | None = None, threads: int = 0
) -> Machine:
    """The CPU model: ``figures`` are measured bandwidths (``global_gbps``, ``cache_gbps``;
    missing ones take the defaults), ``threads`` the pool the parallel loops run on (0: the
    runtime's pool now)."""
    cores = int(target.attrs.get("num-cores", 0) or os.cpu_count() or 1)
    # parallel loops run on the runtime's thread pool, which may be smaller than the target's
    # cores (TVM sizes it at start-up from TVM_NUM_THREADS; plus_tvm.threads sets every core)
    cores = max(1, min(cores, threads or runtime_threads() or cores))
    lanes = _cpu_lanes(target)
    f = dict(_CPU_DEFAULT)
    if figures:
        f.update({k: v for k, v in figures.items() if k in f})
    return Machine(
        family="cpu",
        units=cores,
        lanes=lanes,
        global_gbps=float(f["global_gbps"]),
        cache_gbps=float(f["cache_gbps"]),
        unit_share=float(f["unit_share"]),
        reg_bytes=24 * lanes * 4,  # vector registers left for live data
        cache_bytes=256 * 1024,  # what one row may occupy of a core's L2 (2 MiB here)
        tile_bytes=16 * 1024,  # a third of a 48 KiB L1d
        gops=3.0,
        transcendental=5.0,  # exp/erf mapped to polynomials (gir.lowering)
        line=64,
        sync_ns=(0.0, 1.0, 50.0, 5000.0),
        page_penalty=256,  # the hardware prefetcher restarts on every page
        launch_ns=float(f["launch_us"]) * 1e3,
        chain_ns=1.4,  # 4 cycles
        stack_bytes=1024,  # TVM's kMaxStackAlloca
        alloc_ns=400.0,  # TVMBackendAllocWorkspace + Free, measured on softmax rows
        measured=any(figures.get(k, v) != v for k, v in _CPU_DEFAULT.items()) if figures else False,
    )


# Peak figures of GPU architectures (HBM bandwidth in GB/s, SMs).
_GPU = {
    "sm_90": (3350.0, 132),
    "sm_80": (1555.0, 108),
    "sm_89": (1008.0, 128),
    "sm_86": (936.0, 84),
    "sm_75": (448.0, 40),
    "sm_70": (900.0, 80),
}


def gpu_machine(target: tvm.target.Target) -> Machine:
    arch = str(target.attrs.get("arch", "sm_90"))
    bw, sms = _GPU.get(arch, (1000.0, 80))
    return Machine(
        family="gpu",
        units=sms * 32,  # resident warps the model counts on (half of the 64 an SM holds)
        lanes=32,
        global_gbps=bw * 0.85,
        cache_gbps=64.0,  # shared memory per warp
        unit_share=1.0 / (sms * 8),
        reg_bytes=32 * 32 * 4,  # 32 live registers per thread
        cache_bytes=48 * 1024,  # static shared memory per block
        tile_bytes=16 * 1024,  # leaves room for several blocks per SM
        gops=1.5,
        transcendental=4.0,
        line=32,
        sync_ns=(0.0, 0.05, 0.5, 4000.0),
    )


def machine_for(
    target: tvm.target.Target, figures: dict | None = None, threads: int = 0
) -> Machine:
    """The model's figures for ``target``: ``figures`` and ``threads`` as :func:`cpu_machine`
    takes them, or (None) measured ones from the cache file when present."""
    if "gpu" in target.keys:
        return gpu_machine(target)
    return cpu_machine(target, load_figures(target) if figures is None else figures, threads)


def cpu_figures(target: tvm.target.Target, pool: str = "tvm") -> dict[str, float]:
    """The figures the CPU model uses for ``target`` now, parallel loops on ``pool``: the
    stored measurement, else the defaults (what ``Options.gir_global_gbps`` /
    ``gir_cache_gbps`` / ``gir_launch_us`` of 0 resolve to)."""
    stored = load_figures(target) or {}
    figures = {k: float(stored.get(k, _CPU_DEFAULT[k])) for k in ("global_gbps", "cache_gbps")}
    default = _OPENMP_LAUNCH_US if pool == "openmp" else _CPU_DEFAULT["launch_us"]
    figures["launch_us"] = float(stored.get(LAUNCH_KEYS[pool], default))
    return figures


# ------------------------------------------------------------------ measured CPU figures
def figures_key(target: tvm.target.Target) -> str:
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln for ln in f if ln.startswith("model name")), "")
    except OSError:
        pass
    text = (
        f"{target.attrs.get('mcpu', '')}|{target.attrs.get('num-cores', '')}|{cpu.strip()}"
        f"|threads={runtime_threads()}"
    )
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def figures_path(target: tvm.target.Target) -> str:
    return os.path.join(private_dir(), f"gir-figures-{figures_key(target)}.json")


#: the figures a stored measurement may hold (each a finite number >= 0); ``global_gbps`` is
#: required, the others default
FIGURE_KEYS = ("global_gbps", "cache_gbps", "unit_share", "measured_at", *LAUNCH_KEYS.values())


def figures_problem(data: object) -> str | None:
    """What is wrong with a stored measurement (None: nothing)."""
    if not isinstance(data, dict):
        return f"expected a JSON object, got {type(data).__name__}"
    if "global_gbps" not in data:
        return "no global_gbps"
    for key in FIGURE_KEYS:
        value = data.get(key, 0.0)
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not number or not math.isfinite(value) or value < 0:
            return f"{key} is {value!r}, not a number >= 0"
    if data["global_gbps"] <= 0:
        return "global_gbps is 0"
    return None


def load_figures(target: tvm.target.Target) -> dict | None:
    """The stored measurement for ``target``, None when there is none; a damaged one is named
    in a :class:`~plus_tvm.paths.CacheWarning` and ignored."""
    data = read_json(figures_path(target), figures_problem)
    return {k: float(v) for k, v in data.items() if k in FIGURE_KEYS} if data else None


def cpu_copy_kernel(target: tvm.target.Target, n: int, cores: int, reps: int = 1):
    """A compiled parallel, vectorized TVM copy of ``n`` float32 (``b = a + r`` for ``reps``
    repetitions ``r``, so nothing folds it away) split over ``cores`` parallel chunks; it moves
    ``2 * 4 * n * reps`` bytes per call. The bandwidth reference of the model and of
    ``scripts/bench-memory``."""
    from tvm.script import tirx as T  # noqa: N812

    lanes = _cpu_lanes(target)
    chunk = n // cores
    inner = chunk // lanes

    @T.prim_func
    def copy(a: T.Buffer((n,), "float32"), b: T.Buffer((n,), "float32")):
        T.func_attr({"global_symbol": "main", "tirx.noalias": True})
        for c in T.parallel(cores):
            for r in range(reps):
                for j in range(inner):
                    for v in T.vectorized(lanes):
                        b[c * chunk + j * lanes + v] = a[c * chunk + j * lanes + v] + T.Cast(
                            "float32", r
                        )

    return tvm.compile(tvm.IRModule({"main": copy}), target=target)["main"]


def pool_launch_us(
    target: tvm.target.Target, cores: int, calls: int = 200, pool: str = "tvm"
) -> float:
    """Microseconds one parallel loop on ``pool`` costs beyond its work: the median time of a
    tiny ``cores``-way parallel kernel less that of its serial twin, each call timed alone. On
    TVM's pool its workers are asleep in between, as between a model's kernels (spin count 0);
    on OpenMP's the team is awake, as the library calls between a model's kernels keep it."""
    import numpy as np
    from tvm.script import tirx as T  # noqa: N812

    from ..runtime import native

    if pool == "openmp" and parallel_pool("openmp") != "openmp":
        raise RuntimeError("OpenMP launches are unavailable here: " + str(native.status()))

    def kernel(parallel: bool):
        @T.prim_func
        def add(a: T.Buffer((cores, 64), "float32"), b: T.Buffer((cores, 64), "float32")):
            T.func_attr({"global_symbol": "main", "tirx.noalias": True})
            for i in T.parallel(cores) if parallel else T.serial(cores):
                for j in range(64):
                    b[i, j] = a[i, j] + T.float32(1)

        return tvm.compile(tvm.IRModule({"main": add}), target=target).mod

    dev = tvm.cpu()
    a = tvm.runtime.tensor(np.zeros((cores, 64), "float32"), dev)
    b = tvm.runtime.tensor(np.zeros((cores, 64), "float32"), dev)
    medians = []
    for parallel in (False, True):
        timer = kernel(parallel).time_evaluator("main", dev, number=1, repeat=calls)
        with native.openmp_parallel(pool == "openmp"):
            medians.append(float(np.median(timer(a, b).results)) * 1e6)
    return max(medians[1] - medians[0], 0.0)


def measure_cpu(target: tvm.target.Target, store: bool = True, seconds: float = 0.5) -> dict:
    """Measure copy bandwidth of DRAM (a 64 MiB copy on every core) and of cache (256 KiB per
    core, repeated) with a parallel, vectorized TVM copy kernel, and the launch of a parallel
    loop on TVM's pool and on OpenMP's (:func:`pool_launch_us`); store them when asked."""
    import numpy as np

    # with the runtime's thread pool as it is: TVM sizes it at start-up (``TVM_NUM_THREADS``,
    # which plus_tvm.threads sets to the physical cores), and kernels will run on that pool
    cores = int(target.attrs.get("num-cores", 1) or 1)

    dev = tvm.cpu()

    def rate(n: int, reps: int) -> float:
        fn = cpu_copy_kernel(target, n, cores, reps)
        a = tvm.runtime.tensor(np.ones(n, "float32"), dev)
        b = tvm.runtime.tensor(np.zeros(n, "float32"), dev)
        fn(a, b)
        best, end = 0.0, time.perf_counter() + seconds
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            fn(a, b)
            dt = time.perf_counter() - t0
            best = max(best, 2 * 4 * n * reps / dt / 1e9)
        return best

    global_gbps = rate(16 * 1024 * 1024, 1)
    cache_gbps = rate(64 * 1024 * cores, 64) / cores
    figures = {
        "global_gbps": global_gbps,
        "cache_gbps": cache_gbps,
        "launch_us": pool_launch_us(target, cores),
        "unit_share": _CPU_DEFAULT["unit_share"],
        "measured_at": time.time(),
    }
    if parallel_pool("openmp") == "openmp":
        figures[LAUNCH_KEYS["openmp"]] = pool_launch_us(target, cores, pool="openmp")
    if store:
        write_json(figures_path(target), figures)
    return figures


# ------------------------------------------------------------------------------ the model
@dataclass(frozen=True)
class Estimate:
    seconds: float
    global_bytes: float
    cache_bytes: float
    syncs: int
    occupancy: float


PAGE = 4096


def _global_cost(s, line: int, page_penalty: int = 0) -> float:
    """Bytes a GLOBAL slice costs: whole lines for narrow segments, and a restart of the
    hardware prefetcher for every segment that jumps a page."""
    seg = s.width * s.dtype_bytes
    cost = s.num * max(seg, line) if seg < line else s.nbytes
    if s.num > 1 and s.stride * s.dtype_bytes >= PAGE:
        cost += s.num * page_penalty
    return cost


def estimate(kernel: Kernel, g: Graph, m: Machine) -> Estimate:
    """Estimated time of the whole kernel under GIR graph ``g``."""
    par = g.parallel
    groups = max(kernel.rows // max(g.params.get("rows_per_group", 1), 1), 1)
    if kernel.structure == "column":
        groups = g.params.get("split_k") or max(
            kernel.rows // max(g.params.get("col_tile", 1), 1), 1
        )
    elif kernel.structure == "elementwise":
        length = g.params.get("tile", 0) ** 2 or g.params.get("row_len", 1)
        groups = max(kernel.rows // max(length, 1), 1)
    gbytes = cbytes = ops = chain = 0.0
    once = 0.0
    syncs = {s: 0 for s in Scope}
    for n in g.nodes:
        if n.kind in (Kind.MOVE, Kind.SYNC):
            for s in n.inputs + n.outputs:
                per = 1
                if s.hierarchy is Hierarchy.GLOBAL:
                    cost = _global_cost(s, m.line, m.page_penalty) * per
                    if s.shared:
                        once += cost
                        cbytes += s.nbytes
                    else:
                        gbytes += cost
                elif s.hierarchy is Hierarchy.CACHE:
                    cbytes += s.nbytes * per
            if n.kind is Kind.SYNC:
                syncs[n.scope] += 1
        else:
            elems = max((s.elements for s in n.inputs), default=1)
            weight = n.attrs.get("flops", 1) + n.attrs.get("transcendental", 0) * m.transcendental
            ops += elems * max(weight, 1)
            if n.kind is Kind.REDUCE and m.chain_ns:
                # each accumulator vector is a dependence chain of elements / partials adds
                partials = max(sum(s.elements for s in n.outputs), 1)
                chain += elems / partials * m.chain_ns * 1e-9
    units_busy = 1 if g.params.get("serial") else min(m.units, groups * par.units_per_row)
    occupancy = units_busy / m.units
    share = min(1.0, units_busy * m.unit_share)
    t_global = (gbytes * groups + once) / (m.global_gbps * 1e9 * share)
    t_cache = cbytes * groups / (m.cache_gbps * 1e9 * units_busy)
    lanes = par.vector * (m.lanes if par.unit == "warp" else 1)
    t_compute = ops * groups / (m.gops * 1e9 * lanes * units_busy) + chain * groups / units_busy
    per_row_sync = sum(syncs[s] * m.sync_ns[s] for s in Scope) * 1e-9
    if m.alloc_ns:
        staged = {
            (s.tensor, s.hierarchy)
            for s in g.pinned
            if s.tensor in kernel.intermediates and s.nbytes > m.stack_bytes
        }
        per_row_sync += len(staged) * m.alloc_ns * 1e-9
    t_sync = per_row_sync * groups / units_busy + syncs[Scope.DEVICE] * m.sync_ns[3] * 1e-9
    total = max(t_global, t_cache, t_compute) + t_sync
    if not g.params.get("serial"):
        total += m.launch_ns * 1e-9
    return Estimate(total, gbytes * groups + once, cbytes * groups, sum(syncs.values()), occupancy)


def lower_bound(kernel: Kernel, m: Machine) -> float:
    """No graph moves less than every kernel input read once and every output written once."""
    total = 0
    for name in kernel.params:
        total += kernel.sizes.get(name, 0) * 4
    return total / (m.global_gbps * 1e9)


if __name__ == "__main__":  # python -m plus_tvm.gir.model: measure this machine once
    from ..target import resolve_target

    _target = resolve_target("llvm")
    print(json.dumps(measure_cpu(_target, store=True)), "->", figures_path(_target))
