"""``CompiledModel``: a compiled model that checks its inputs, is safe across threads, follows
in-place weight updates, and is saved and loaded as three files bound by digests.

- **Inputs** are checked against the signature before anything runs: count, dtype, rank,
  static and symbolic dims, and for *index inputs* (token ids and other tensors that index a
  table, :mod:`plus_tvm.index_inputs`) the range of valid values. TVM's gather kernels have no
  bounds checks, so an out-of-range id would read or write outside the table.
- **Calls** bind inputs by position and by name (:mod:`plus_tvm.input_binding`) and return the
  outputs in the model's own structure, with names (:mod:`plus_tvm.output_structure`);
  :meth:`CompiledModel.run` is ONNX Runtime's ``run(output_names, input_feed)``.
- **Threads**: each calling thread gets its own ``VirtualMachine`` (a VM holds per-call state and
  is not reentrant); the weights on the device are shared, read-only.
- **Weights** of a model compiled from a torch module follow the module: a parameter changed in
  place (its version counter moved) is copied to the device again before the next call. A
  buffer baked into the code as a constant (BatchNorm statistics) cannot follow: changing one
  is refused with an error that says so.
- **Files**: ``path`` (the library), ``path.params`` (weights) and ``path.json`` (signature,
  target, input / output names and structure, stats and the sha256 of the other two; a json
  without the names, written before they were kept, still loads). :func:`load` refuses a
  library or weights file whose digest differs (swapped, truncated, foreign) with a
  :class:`ModelLoadError`.
"""

from __future__ import annotations

import hashlib
import json
import operator
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import tvm
from tvm.runtime.vm import VirtualMachine

from . import output_structure
from .errors import (
    TVM_REFUSAL,
    InputError,
    ModelLoadError,
    OutputWriteError,
    PlusError,
    service_error,
)
from .input_binding import bind
from .output_files import check_target, replace_atomically, write_bytes
from .runtime import native, use_native
from .runtime.native import torch_versions
from .signature import (
    SIGNATURE_FUNCTION,
    InputSpec,
    as_numpy,
    bfloat16_view,
    check_inputs,
    signature_text,
)
from .target import device_for, target_json, target_name
from .torch_branch_guards import Guards
from .tvm_libs import compiler_available

FORMAT = "plus_tvm.compiled/3"  # 3: the executable carries its signature
_READABLE_FORMATS = (FORMAT,)
ALIGNMENT = 64  # bytes: what TVM's kernels assume of a buffer (tvm.runtime.from_dlpack checks)
_DLPACK_CUDA = 2  # kDLCUDA


@dataclass(frozen=True)
class WeightSource:
    """Where a weight came from: the torch tensor it was copied from, to follow updates."""

    name: str  # the module's name for it (``encoder.layer.0.attention.self.query.weight``)
    tensor: object  # torch.Tensor

    def version(self) -> int:
        return _VERSION(self.tensor) if _tracks_version(self.tensor) else 0


_VERSION = operator.attrgetter("_version")


@dataclass(frozen=True)
class ModelIO:
    """What a model's inputs and outputs are called, and the structure its outputs come in
    (:mod:`plus_tvm.output_structure`; None: a model exported before these were kept)."""

    input_names: list[str]
    output_names: list[str] | None = None
    structure: dict | None = None

    def to_dict(self) -> dict[str, object]:
        return {
            "input_names": list(self.input_names),
            "output_names": self.output_names,
            "outputs": self.structure,
        }

    @classmethod
    def from_dict(cls, data: dict, inputs: list[InputSpec]) -> ModelIO:
        """From an exported model's json (a model exported without it: the inputs' own names,
        outputs unnamed and returned flat)."""
        names = [str(n) for n in data.get("input_names") or [s.name for s in inputs]]
        if len(names) != len(inputs):
            raise ValueError(f"{len(names)} input names for {len(inputs)} inputs")
        outputs = data.get("output_names")
        structure = data.get("outputs")
        structure = output_structure.check(structure) if structure is not None else None
        if outputs is not None:
            outputs = [str(n) for n in outputs]
            if structure is not None and output_structure.leaf_count(structure) != len(outputs):
                raise ValueError(f"{len(outputs)} output names for the outputs' structure")
        return cls(names, outputs, structure)


def _tracks_version(tensor: object) -> bool:
    """Whether ``tensor`` has a version counter to follow: a torch tensor made outside
    ``torch.inference_mode`` (a numpy array cannot change under the model unseen; an inference
    tensor has no counter)."""
    try:
        _VERSION(tensor)
    except (AttributeError, RuntimeError):  # numpy; "Inference tensors do not track version"
        return False
    return True


class _Followed:
    """Torch tensors whose in-place changes a model follows, by their version counters: one
    C++ pass over all of them per call (``runtime/native/torch_versions.cc``: MobileNetV2's 314
    followed tensors 35-40 us right after a run, against 150-250 us reading ``_version`` in
    Python, which stays the way where that library is unavailable). Arrays without a counter
    (numpy) cannot change under the model unseen and are not followed."""

    def __init__(self, sources: dict[int, WeightSource]) -> None:
        self.positions = [i for i, s in sources.items() if _tracks_version(s.tensor)]
        self.tensors = [sources[i].tensor for i in self.positions]
        self.versions = list(map(_VERSION, self.tensors))
        self.slot = {p: k for k, p in enumerate(self.positions)}
        self._reader = torch_versions.reader(self.tensors, self.versions) if self.tensors else None

    def changed(self) -> list[int]:
        """The position of each tensor changed since it was last seen."""
        if self._reader is not None and self._reader.first_changed() == -1:
            return []
        now = list(map(_VERSION, self.tensors))
        if now == self.versions:
            return []
        return [p for p, v, w in zip(self.positions, now, self.versions) if v != w]

    def seen(self, position: int, version: int) -> None:
        slot = self.slot[position]
        self.versions[slot] = version
        if self._reader is not None:
            self._reader.seen(slot, version)


class CompiledModel:
    """A compiled model: numpy arrays in, numpy arrays out; torch tensors in, torch tensors out.

    Weights are moved to the device once, on first use (the host copy is not kept beside
    them). Inputs are checked against the signature before running (module docstring). Safe
    to call from several threads.
    """

    def __init__(
        self,
        executable: object,
        target: tvm.target.Target | dict,
        params: list,
        inputs: list[InputSpec],
        stats: dict[str, object],
        source: object | None = None,
        weight_sources: Sequence[WeightSource | None] | None = None,
        baked: Sequence[WeightSource] = (),
        origin: str = "the compiled model",
        io: ModelIO | None = None,
    ) -> None:
        self.executable = executable
        self._origin = origin  # what messages call it (a loaded model: its path)
        self._signature_seen = False
        self._ran_in: int | None = None  # the process that last built a VM (fork_safety)
        self.target = target
        self.device = device_for(target)
        self.inputs = inputs
        self.io = io or ModelIO([s.name for s in inputs])
        self.stats = stats
        self.source = source
        self._weights = list(params)
        self._sources = list(weight_sources or [None] * len(self._weights))
        if len(self._sources) != len(self._weights):
            raise PlusError(f"{len(self._sources)} weight sources for {len(self._weights)} weights")
        self._versions = [s.version() if s is not None else 0 for s in self._sources]
        self._followed = _Followed({i: s for i, s in enumerate(self._sources) if s is not None})
        self._baked = list(baked)
        self._baked_followed = _Followed(dict(enumerate(self._baked)))
        self._lock = threading.Lock()
        self._device_weights: list | None = None
        self._local = threading.local()  # one VirtualMachine per calling thread
        # parallel loops of the generated kernels on OpenMP's pool, as compiled for
        # (``Options.cpu_parallel``; runtime/native/parallel_launch.cc)
        options = stats.get("options") if isinstance(stats, dict) else None
        self._cpu = _is_cpu(self.device)
        self._openmp = self._cpu and (options or {}).get("cpu_parallel") == "openmp"
        self._device_seen = False
        # Python branches on a tensor's value compiled by speculation (torch_branch_guards)
        fallback = (options or {}).get("host_fallback", True)
        self._guards = Guards.of(stats, source, fallback)

    # ----------------------------------------------------------------------------- running
    def __call__(self, *args: object, **kwargs: object) -> object:
        """Run the model: numpy arrays in, numpy arrays out; torch tensors in (any of the
        inputs), torch tensors out, on the model's device (no copy to the host).

        Inputs are given by position or by name (:attr:`input_names`), as a Python call binds
        them. The outputs come in the structure the model returns them (a torch model's
        ``ModelOutput``, dict or nested tuple; one output alone, else a tuple)."""
        leaves = self._run_flat(args, kwargs)
        structure = self.io.structure
        if structure is None or output_structure.leaf_count(structure) != len(leaves):
            return leaves[0] if len(leaves) == 1 else tuple(leaves)  # (a model exported before)
        return output_structure.rebuild(structure, leaves)

    @property
    def input_names(self) -> list[str]:
        """The names the inputs are given by (``cm(input_ids=..., attention_mask=...)``)."""
        return list(self.io.input_names)

    @property
    def output_names(self) -> list[str] | None:
        """The outputs' names in their flat order: an ONNX graph's output names, a torch
        model's output keys (``logits``; ``b.0`` inside a nested one; ``output0``, ``output1``
        for positions). None for a model exported before names were kept (:meth:`run_named`
        then calls them ``output0``...)."""
        return None if self.io.output_names is None else list(self.io.output_names)

    def run_named(self, *args: object, **kwargs: object) -> dict[str, object]:
        """Run the model (inputs as for a call) and return ``{output name: value}``."""
        leaves = self._run_flat(args, kwargs)
        names = self.io.output_names or [f"output{i}" for i in range(len(leaves))]
        return dict(zip(names, leaves))

    def run(self, output_names: Sequence[str] | None, input_feed: dict[str, object]) -> list:
        """ONNX Runtime's ``InferenceSession.run``: the outputs named in ``output_names`` (None:
        all), in that order, for the inputs in ``input_feed`` by name."""
        if not isinstance(input_feed, dict):
            raise InputError(
                f"run takes the inputs as a dict by name ({', '.join(self.io.input_names)}), "
                f"got {type(input_feed).__name__}"
            )
        named = self.run_named(**input_feed)
        if output_names is None:
            return list(named.values())
        unknown = [n for n in output_names if n not in named]
        if unknown:
            raise InputError(f"the model has no output(s) {unknown}; its outputs are {list(named)}")
        return [named[n] for n in output_names]

    def _run_flat(self, args: tuple, kwargs: dict) -> list:
        """Run on inputs bound by position and name; the outputs as a flat list, torch tensors
        where an input was one, numpy arrays otherwise."""
        inputs = bind(self.io.input_names, args, kwargs)
        out = self.run_prepared(self.prepare(*inputs))
        torch_in = any(_is_torch(x) for x in inputs)
        convert = _to_torch if torch_in else _to_numpy
        leaves = _leaves(out)
        if self._guards is not None:  # (a speculated branch that went another way: torch eager)
            leaves, missed = self._guards.split(leaves)
            if missed:
                eager = self._guards.rerun(missed, inputs, leaves)
                return eager if torch_in else [as_numpy(t) for t in eager]
        return [convert(leaf) for leaf in leaves]

    def prepare(self, *inputs: object) -> list:
        """Check inputs and place them on the device (separate so benchmarks can time runs)."""
        arrays = self.check_inputs(inputs)
        self._check_device()  # fail clearly before touching a missing device
        try:
            return [self._input_tensor(a) for a in arrays]
        except TVM_REFUSAL as err:
            where = f"cannot place the inputs on {self.device}"
            raise InputError(f"{where}: {_last_line(err)}") from None

    def _input_tensor(self, array: object) -> tvm.runtime.Tensor:
        """An input on the device. On the CPU a writable C-ordered array aligned as TVM's
        kernels need (a torch tensor's own storage, a large numpy array) is passed as it is, by
        DLPack: no copy (a decode step's past keys and values would otherwise be copied at
        every step); so is a torch tensor already on the model's GPU (no round trip through
        the host); anything else is copied."""
        if not isinstance(array, np.ndarray):  # a torch tensor on an accelerator
            if self._on_this_device(array):
                return tvm.runtime.from_dlpack(array)
            array = as_numpy(array)  # another device: through the host
        if (
            self._cpu
            and array.size
            and array.flags.c_contiguous
            and array.flags.writeable
            and array.ctypes.data % ALIGNMENT == 0
        ):
            try:
                # (numpy has no DLPack code for ml_dtypes' bfloat16: the same memory as a
                # torch tensor, which has one; a decode step's bfloat16 cache is not copied)
                source = bfloat16_view(array) if array.dtype.name == "bfloat16" else array
                return tvm.runtime.from_dlpack(source)
            except (BufferError, *TVM_REFUSAL):  # a dtype DLPack has no code for
                pass
        return tvm.runtime.tensor(array, self.device)

    def _on_this_device(self, tensor: object) -> bool:
        """Whether a torch tensor lives on this model's (non-CPU) device."""
        dev = tensor.device
        return (
            not self._cpu
            and dev.type == "cuda"
            and self.device.dlpack_device_type() == _DLPACK_CUDA
            and (dev.index or 0) == self.device.index
        )

    def run_prepared(self, prepared: list) -> object:
        """Run on inputs from :meth:`prepare`; returns TVM tensors (synchronised)."""
        _, weights = self._vm()
        main = self._local.main
        try:
            if self._openmp:
                before = native.use_openmp(True)
                try:
                    out = main(*prepared, *weights)
                finally:
                    native.use_openmp(before)
            else:
                out = main(*prepared, *weights)
        except RuntimeError as err:  # a runtime service's error, as TVM's VM hands it back
            found = service_error(err)
            if found is None:
                raise
            raise found from None
        if not self._cpu:  # (a CPU call has returned when its results are written)
            self.device.sync()
        return out

    def _vm(self) -> tuple:
        """This thread's VM and the shared weights on the device (weights refreshed when the
        torch parameters they came from changed in place)."""
        self._check_device()
        weights = self._current_weights()
        vm = getattr(self._local, "vm", None)
        if self._ran_in not in (None, os.getpid()):
            self._forked()  # a fork since the last run: this process's own VM, if it can run
            vm = None
        if vm is None:
            with self._lock:  # VM construction reads the shared executable
                start = time.perf_counter()
                if self._cpu:
                    # the VM resolves kernel names when it is built, and the JIT module starts
                    # with the parallel launch in force then
                    use_native()
                try:
                    vm = VirtualMachine(self.executable, self.device)
                except TVM_REFUSAL as err:  # code for another machine (an -mtriple, -mcpu)
                    triple = target_json(self.target).get("mtriple", "")
                    raise PlusError(
                        f"cannot run {self._origin} on this machine (compiled for "
                        f"{target_name(self.target)} {triple}): {_last_line(err)}; export it "
                        "and run it on the machine it was compiled for"
                    ) from None
                # the first call's fixed cost: native kernels loaded (or built), TVM's device
                # setup (VirtualMachine._setup_device: constants, device modules); docs/architecture
                if isinstance(self.stats, dict):
                    self.stats["setup_s"] = round(time.perf_counter() - start, 4)
                self._check_signature(vm)
                self._local.vm = vm
                self._local.main = vm["main"]  # (a lookup through the FFI: once, not per call)
                self._ran_in = os.getpid()
        self._device_seen = True  # (a device does not go away under a process)
        return vm, weights

    def _check_device(self) -> None:
        if not self._device_seen and not self.device.exist:
            raise PlusError(
                f"cannot run a model compiled for {target_name(self.target)}: "
                f"no {self.device} on this machine (export_library works without one)"
            )

    def _forked(self) -> None:
        """In a child forked after this model ran: OpenMP's pool runs on one thread here
        (:mod:`plus_tvm.fork_safety`); TVM's pool would hang, so a model on it refuses."""
        if self._cpu and not self._openmp:
            raise PlusError(
                f"{self._origin} ran on TVM's thread pool before this process was forked, and "
                "that pool does not survive a fork: start worker processes with "
                "multiprocessing's 'spawn' or 'forkserver' method, or compile with "
                "cpu_parallel='openmp' (the default where the native library is available)"
            )
        self._local = threading.local()  # the parent's VMs stay the parent's
        self._lock = threading.Lock()  # (a lock held by another parent thread stays held)

    def _check_signature(self, vm: VirtualMachine) -> None:
        """The executable's own signature (inputs, index ranges, weight count) must be the one
        this model was described with: an edited json must not reach TVM's raw checks or
        widen an index range (the executable's is the truth; the json's digests only catch
        accidents). Called with the lock held."""
        if self._signature_seen:
            return
        wanted = signature_text(self.inputs, len(self._weights))
        try:
            own = str(vm[SIGNATURE_FUNCTION]())
        except (AttributeError, *TVM_REFUSAL):
            raise ModelLoadError(
                f"{self._origin}: the executable carries no signature (not built by this "
                "version of plus_tvm); export the model again"
            ) from None
        if own != wanted:
            raise ModelLoadError(
                f"{self._origin}: the model description does not match its executable "
                f"({_first_difference(json.loads(own), json.loads(wanted))}): the .json was "
                "edited or belongs to another model; export the model again"
            )
        self._signature_seen = True

    def _current_weights(self) -> list:
        changed = self._baked_followed.changed()
        if changed:
            raise InputError(
                f"buffer {self._baked[changed[0]].name} of the torch module changed after "
                "compilation; it is compiled into the code as a constant: compile the model again"
            )
        with self._lock:
            if self._device_weights is None:
                placed: dict[int, tvm.runtime.Tensor] = {}  # a tied weight is placed once
                for p in self._weights:
                    if id(p) not in placed:
                        placed[id(p)] = place(p, self.device)
                self._device_weights = [placed[id(p)] for p in self._weights]
                self._weights = list(self._device_weights)  # (no host copy kept beside them)
            for i in self._followed.changed():
                self._refresh(i, self._sources[i])
                self._followed.seen(i, self._versions[i])
            return list(self._device_weights)

    def _refresh(self, i: int, source: WeightSource) -> None:
        """Copy weight ``i`` from its torch tensor again, into the device buffer it has: a captured
        CUDA graph replays the addresses it recorded (TVM ignores the arguments on replay), so a
        new buffer would never be read. Library kernels cache packed weights by address:
        ``forget_tensor`` drops them, so the next call packs the new values."""
        from .runtime import forget_tensor

        version = source.version()
        value = as_numpy(source.tensor)
        old = self._device_weights[i]
        if tuple(value.shape) != tuple(old.shape) or str(value.dtype) != str(old.dtype):
            raise InputError(
                f"weight {source.name} changed shape or dtype after compilation "
                f"({tuple(old.shape)} {old.dtype} -> {tuple(value.shape)} {value.dtype}): "
                "compile the model again"
            )
        old.copyfrom(np.ascontiguousarray(value))  # (a tied weight's other uses see it too)
        self._versions[i] = version
        forget_tensor(old)

    # ----------------------------------------------------------------------------- weights
    def weight_entries(self) -> list[tuple[object, WeightSource | None, int]]:
        """Each weight (a host array or a device tensor) in parameter order, with the torch
        tensor it came from (None: none) and that tensor's version when it was copied."""
        with self._lock:
            return list(zip(self._weights, self._sources, self._versions))

    def use_weights(self, weights: Sequence[object]) -> None:
        """Hold ``weights`` (the same shapes and dtypes, in parameter order) in place of this
        model's own, before its first run: weights shared with another model
        (:mod:`plus_tvm.shared_weights`). A TVM tensor on this model's device is passed to the
        executable as it is."""
        weights = list(weights)
        with self._lock:
            if self._device_weights is not None:  # (a captured CUDA graph keeps the old ones)
                raise PlusError(f"{self._origin} has run: its weights can no longer be replaced")
            if len(weights) != len(self._weights):
                raise PlusError(f"{len(weights)} weights given for {len(self._weights)}")
            for i, (old, new) in enumerate(zip(self._weights, weights)):
                if _shape_dtype(old) != _shape_dtype(new):
                    raise PlusError(
                        f"weight {i}: {_shape_dtype(new)} given for {_shape_dtype(old)}"
                    )
            self._weights = weights

    def weight_buffers(self) -> dict[tuple, int]:
        """The weight buffers this model holds, host arrays and device copies, by where they
        are: ``{(device type, device id, address): bytes}`` (a buffer used by several weights,
        a tied one, is one entry)."""
        with self._lock:
            held = list(self._weights) + list(self._device_weights or [])
        return dict(_buffer(w) for w in held)

    def check_inputs(self, inputs: tuple) -> list:
        """Validate inputs against the model signature; returns them as numpy arrays (a torch
        tensor on an accelerator stays a torch tensor there)."""
        return check_inputs(self.inputs, inputs)

    # ------------------------------------------------------------------------------ saving
    def export_library(self, path: str, *, weights: str = "embed") -> str:
        """Write the compiled library to ``path`` and the weights and signature beside it.

        ``path`` gets the shared library, ``path + ".params"`` the weights (TVM param-dict
        format), ``path + ".json"`` the target, inputs, stats, the weights' names and the sha256
        digests of the other two files. :func:`load` reads them back and checks the digests.

        ``weights="external"`` leaves out of ``.params`` every weight that came from a named
        tensor of the torch module (the json keeps its name, shape and dtype): :func:`load` then
        takes them from a module or state dict the caller gives (``load(path, weights=model)``),
        which keeps a deployment's files small where the weights ship separately.
        """
        if weights not in ("embed", "external"):
            raise PlusError(
                f"export_library: weights must be 'embed' or 'external', got {weights!r}"
            )
        path = os.fspath(path)
        for name in (path, path + ".params", path + ".json"):
            check_target(name)
        with self._lock:
            values = list(self._weights)
            names = [src.name if src is not None else None for src in self._sources]
        first: dict[int, int] = {}  # id of a weight object -> its first position
        aliases = {i: first.setdefault(id(p), i) for i, p in enumerate(values)}
        aliases = {i: j for i, j in aliases.items() if i != j}  # tied weights: stored once
        external = {}
        if weights == "external":
            external = {
                i: {"name": names[i], "shape": list(v.shape), "dtype": str(v.dtype)}
                for i, v in enumerate(values)
                if names[i] is not None and i not in aliases
            }
        params = {
            f"p{i}": tvm.runtime.tensor(as_numpy(p))
            for i, p in enumerate(values)
            if i not in aliases and i not in external
        }
        blob = tvm.runtime.save_param_dict(params)
        # each file whole or not at all, never written through a link at its path
        replace_atomically(path, lambda tmp: self._link(tmp, path))
        write_bytes(path + ".params", blob)
        meta = {
            "format": FORMAT,
            "target": target_json(self.target),
            "inputs": [s.to_dict() for s in self.inputs],
            "num_params": len(values),
            "weight_names": names,
            "aliases": {str(i): j for i, j in aliases.items()},
            "external": {str(i): e for i, e in external.items()},
            "sha256": {"library": _sha256_file(path), "params": _sha256(blob)},
            "io": self.io.to_dict(),
            "stats": self.stats,
        }
        write_bytes(path + ".json", json.dumps(meta, indent=1, default=str).encode())
        return path

    def _link(self, tmp: str, path: str) -> None:
        """The executable as a shared library at ``tmp`` (TVM runs the C++ linker)."""
        try:
            self.executable.export_library(tmp)
        except TVM_REFUSAL as err:  # the linker failed: a full disk, a read-only folder
            raise OutputWriteError(
                f"cannot write {path}: the library could not be linked ({_last_line(err)})"
            ) from None

    # ----------------------------------------------------------------------------- display
    def __repr__(self) -> str:
        s = self.stats
        return (
            f"CompiledModel({s.get('model')!r}, target={s.get('target')!r}, "
            f"pipeline={s.get('pipeline')!r}, ops={s.get('ops')}, kernels={s.get('kernels')})"
        )

    def _repr_html_(self) -> str:
        from .report import stats_html

        return stats_html(self.stats)


def load(path: str, weights: object = None) -> CompiledModel:
    """Load a model written by :meth:`CompiledModel.export_library` (in any process).

    ``weights`` (a torch module, or a mapping from names to tensors or arrays) gives the weights
    of a model exported with ``weights="external"``, by their names in the torch module; the
    model follows in-place updates of torch tensors given this way.

    Raises :class:`ModelLoadError` when a file is missing, unreadable, or does not belong with
    the others (its sha256 differs from the one recorded at export), or when an external weight
    is missing from ``weights`` or has another shape or dtype.
    """
    path = os.fspath(path)
    for need in (path, path + ".params", path + ".json"):
        if not os.path.isfile(need):
            raise ModelLoadError(f"compiled model file missing: {need}")
    try:
        with open(path + ".json") as f:
            meta = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ModelLoadError(f"{path}.json is not a readable model description: {err}") from None
    if not isinstance(meta, dict) or meta.get("format") not in _READABLE_FORMATS:
        found = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise ModelLoadError(
            f"{path}.json is not a plus_tvm compiled-model description of format {FORMAT} "
            f"(found {found!r}); export the model again with this version"
        )
    try:
        digests = dict(meta["sha256"])
        inputs = [InputSpec.from_dict(d) for d in meta["inputs"]]
        num_params = int(meta["num_params"])
        aliases = {int(i): int(j) for i, j in dict(meta.get("aliases", {})).items()}
        external = {int(i): dict(e) for i, e in dict(meta.get("external", {})).items()}
        target = tvm.target.Target(meta["target"]) if compiler_available() else dict(meta["target"])
        io = ModelIO.from_dict(dict(meta.get("io") or {}), inputs)
    except (KeyError, TypeError, ValueError, *TVM_REFUSAL) as err:
        raise ModelLoadError(f"{path}.json is incomplete or malformed: {err!r}") from None
    if any(not 0 <= j < i < num_params for i, j in aliases.items()):
        raise ModelLoadError(f"{path}.json is malformed: bad weight aliases {aliases}")
    if _sha256_file(path) != digests.get("library"):
        raise ModelLoadError(
            f"{path} does not match {path}.json (sha256 differs): the library was replaced, "
            "truncated or rebuilt; export the model again"
        )
    with open(path + ".params", "rb") as f:
        blob = f.read()
    if _sha256(blob) != digests.get("params"):
        raise ModelLoadError(
            f"{path}.params does not belong to {path} (sha256 differs from {path}.json): the "
            "weights file was swapped, truncated or edited"
        )
    given = _external_weights(path, external, weights)
    try:
        table = tvm.runtime.load_param_dict(blob)
        params: list = []
        for i in range(num_params):  # a tied weight is the same tensor as its first use
            if i in aliases:
                params.append(params[aliases[i]])
            else:
                params.append(given[i].tensor if i in given else table[f"p{i}"])
    except (KeyError, *TVM_REFUSAL) as err:
        raise ModelLoadError(f"{path}.params cannot be read: {_last_line(err)}") from None
    sources = [given.get(aliases.get(i, i)) for i in range(num_params)]
    if _is_cpu(device_for(target)):
        use_native()  # before loading: a library takes the parallel launch in force at load
    try:
        executable = tvm.runtime.load_module(path)
    except TVM_REFUSAL as err:
        raise ModelLoadError(f"{path} is not a loadable library: {_last_line(err)}") from None
    stats = meta.get("stats", {})
    model = CompiledModel(
        executable,
        target,
        params,
        inputs,
        stats,
        weight_sources=sources,
        origin=f"{path}.json",
        io=io,
    )
    if _is_cpu(model.device):
        model._vm()  # the executable's signature checked now (on a GPU: at the first call)
    return model


def _first_difference(own: dict, described: dict) -> str:
    """Where the executable's signature and the description differ, in words."""
    if own.get("num_params") != described.get("num_params"):
        takes = own.get("num_params")
        return f"{described.get('num_params')} weights described, the executable takes {takes}"
    mine, theirs = own.get("inputs", []), described.get("inputs", [])
    if len(mine) != len(theirs):
        return f"{len(theirs)} inputs described, the executable takes {len(mine)}"
    for a, b in zip(mine, theirs):
        for key in sorted(set(a) | set(b)):
            if a.get(key) != b.get(key):
                name = a.get("name", "?")
                return f"input {name}: {key} described as {b.get(key)}, built for {a.get(key)}"
    return "they differ"


def _is_cpu(device: object) -> bool:
    return device.dlpack_device_type() == tvm.cpu().dlpack_device_type()


def _external_weights(path: str, external: dict[int, dict], weights: object) -> dict:
    """The weights a model exported with ``weights="external"`` takes from ``weights``, as
    :class:`WeightSource` by parameter position (checked by name, shape and dtype)."""
    if not external:
        if weights is not None:
            raise ModelLoadError(
                f"{path} holds all its weights in {path}.params; weights= is only for a model "
                'exported with export_library(..., weights="external")'
            )
        return {}
    if weights is None:
        raise ModelLoadError(
            f"{path} was exported without {len(external)} of its weights "
            '(weights="external"): give them with plus_tvm.load(path, weights=module_or_dict)'
        )
    if hasattr(weights, "state_dict") and callable(weights.state_dict):
        weights = weights.state_dict(keep_vars=True)
    if not hasattr(weights, "get"):
        raise ModelLoadError(
            f"weights for {path} must be a torch module or a mapping from names to tensors, "
            f"got {type(weights).__name__}"
        )
    found = {}
    for i, want in sorted(external.items()):
        value = weights.get(want["name"])
        if value is None:
            raise ModelLoadError(f"weight {want['name']} of {path} is not in the given weights")
        shape, dtype = list(getattr(value, "shape", ())), str(getattr(value, "dtype", ""))
        if shape != list(want["shape"]) or dtype.removeprefix("torch.") != want["dtype"]:
            raise ModelLoadError(
                f"weight {want['name']} of {path}: expected {tuple(want['shape'])} "
                f"{want['dtype']}, the given one is {tuple(shape)} {dtype.removeprefix('torch.')}"
            )
        found[i] = WeightSource(want["name"], value)
    return found


# ----------------------------------------------------------------------------------- helpers
def share_tied_weights(params: list, sources: Sequence[WeightSource | None]) -> list:
    """``params`` with every weight whose torch source shares storage, shape and strides with
    an earlier one (tied weights: GPT-2's embedding and LM head) replaced by that earlier
    weight object, so that it is held, placed and exported once."""
    first: dict[tuple, int] = {}
    out = list(params)
    for i, source in enumerate(sources):
        t = getattr(source, "tensor", None)
        if t is None or not hasattr(t, "data_ptr"):
            continue
        j = first.setdefault(storage_key(t), i)
        if j != i:
            out[i] = out[j]
    return out


def storage_key(tensor: object) -> tuple:
    """What identifies a torch tensor's values: its storage address, shape, strides, dtype
    and device (two views of one buffer with the same layout are the same tensor)."""
    t = tensor
    return (t.data_ptr(), tuple(t.shape), tuple(t.stride()), str(t.dtype), str(t.device))


def place(weight: object, device: object) -> tvm.runtime.Tensor:
    """``weight`` on ``device``: a TVM tensor already there is used as it is (never copied: a
    CPU model would otherwise hold every weight twice), anything else is copied once."""
    if isinstance(weight, tvm.runtime.Tensor) and weight.device == device:
        return weight
    return tvm.runtime.tensor(as_numpy(weight), device)


def _shape_dtype(weight: object) -> tuple:
    dtype = str(weight.dtype).removeprefix("torch.")
    return tuple(int(d) for d in weight.shape), dtype


def _buffer(weight: object) -> tuple[tuple, int]:
    """``((device type, device id, address), bytes)`` of a held weight."""
    if isinstance(weight, tvm.runtime.Tensor):
        dev = weight.device
        item = tvm.runtime.DataType(str(weight.dtype))
        size = int(weight.numel()) * item.bits * item.lanes // 8
        return (dev.dlpack_device_type(), dev.index, int(weight.data_ptr())), size
    array = as_numpy(weight)
    return (1, 0, int(array.__array_interface__["data"][0])), int(array.nbytes)  # (kDLCPU)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _sha256_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _last_line(err: BaseException) -> str:
    # NVRTC's log (a CUDA module compiled at load) ends in NUL padding
    lines = [ln.strip() for ln in str(err).replace("\x00", "").splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error" in ln.lower() and "detected in the comp" not in ln]
    return (errors or lines or [type(err).__name__])[-1]


def _is_torch(value: object) -> bool:
    return type(value).__module__.startswith("torch") and hasattr(value, "__dlpack__")


def _leaves(out: object) -> list:
    """The VM's result as a flat list (one tensor, or a tuple of them; a null output: None)."""
    if out is None or isinstance(out, tvm.runtime.Tensor):
        return [out]
    if isinstance(out, (list, tuple)) or hasattr(out, "__len__"):
        return [leaf for o in out for leaf in _leaves(o)]
    return [out]


def _to_torch(out: object) -> object:
    import torch  # (loaded already: an input was a torch tensor)

    if out is None:
        return None
    if isinstance(out, tvm.runtime.Tensor):
        return torch.from_dlpack(out)  # (a tensor the VM made for this call: no copy needed)
    return torch.as_tensor(_to_numpy(out))


def _to_numpy(out: object) -> np.ndarray | None:
    if out is None:
        return None
    if hasattr(out, "numpy"):
        return out.numpy()
    return np.asarray(out)
