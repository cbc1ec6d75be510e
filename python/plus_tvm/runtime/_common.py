"""Shared machinery of the library kernels: config parsing, DLPack, streams, prepacking.

Every kernel is a global function with the calling convention that the dispatch pass emits::

    plus.<kernel>(*tensor_inputs, config: str, out)

``config`` is ``key=value`` pairs joined by ``;``; the VM appends the preallocated output last.
Tensors arrive as ``tvm.runtime.Tensor`` and are viewed as torch tensors without a copy through
DLPack (about 1 us each). torch is imported when a kernel first runs (:mod:`._torch`): the
runtime imports, and runs models whose calls all take the native kernels, without it.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections import OrderedDict, namedtuple
from collections.abc import Callable, Sequence
from typing import Any

import tvm_ffi

from .. import env
from ._torch import IMPORT as _TORCH_IMPORT
from ._torch import require, torch
from .cpu_features import cpu_dtypes

# ---------------------------------------------------------------------------------------------
# config strings


def format_config(config: dict[str, object]) -> str:
    """``key=value`` pairs joined by ``;`` (sorted by key): the text :meth:`ConfigSpec.parse`
    reads. Booleans are ``0|1``, sequences comma-separated integers."""

    def fmt(v: object) -> str:
        if isinstance(v, bool):
            return str(int(v))
        if isinstance(v, float):
            return repr(v)
        if isinstance(v, (tuple, list)):
            return ",".join(str(int(x)) for x in v)
        return str(v)

    return ";".join(f"{k}={fmt(v)}" for k, v in sorted(config.items()))


class Field:
    """One config key: a parser from its text to a value, the default when absent, and
    ``samples``: texts it takes (every value of a choice; for checking the C++ parsers)."""

    def __init__(
        self, parse: Callable[[str], Any], default: Any, doc: str, samples: Sequence[str]
    ) -> None:
        self.parse = parse
        self.default = default
        self.doc = doc
        self.samples = tuple(samples)


def flag(default: bool = False) -> Field:
    """A ``0|1`` key."""

    def parse(text: str) -> bool:
        if text not in ("0", "1"):
            raise ValueError("expected 0 or 1")
        return text == "1"

    return Field(parse, default, "0|1", ("0", "1"))


def choice(*values: str, default: str | None = None) -> Field:
    """A key taking one of ``values`` (the first is the default unless ``default`` is given)."""

    def parse(text: str) -> str:
        if text not in values:
            raise ValueError(f"expected one of {'|'.join(values)}")
        return text

    return Field(parse, values[0] if default is None else default, "|".join(values), values)


def real(default: float | None) -> Field:
    """A float key (``None`` default means "not given")."""

    def parse(text: str) -> float:
        return float(text)

    return Field(parse, default, "<float>", ("1e-05", "0.125"))


def integer(default: int) -> Field:
    """An int key."""
    return Field(int, default, "<int>", ("1", "2"))


def ints(count: int, default: tuple[int, ...]) -> Field:
    """A comma-separated list of ``count`` ints (one value is repeated ``count`` times)."""

    def parse(text: str) -> tuple[int, ...]:
        values = tuple(int(v) for v in text.split(","))
        if len(values) == 1:
            values = values * count
        if len(values) != count:
            raise ValueError(f"expected {count} comma-separated ints")
        return values

    return Field(parse, default, ",".join(["<int>"] * count), ("1", ",".join(["2"] * count)))


class ConfigSpec:
    """The keys a kernel accepts; :meth:`parse` turns a config string into a named tuple.

    Parsing is cached on the string (the VM passes the same string on every call), so a call
    costs one dictionary lookup once warm.
    """

    def __init__(self, kernel: str, **fields: Field) -> None:
        self.kernel = kernel
        self.fields = fields
        self.type = namedtuple(kernel.replace(".", "_") + "_config", list(fields))
        self.parse = functools.lru_cache(maxsize=1024)(self._parse)

    def _parse(self, text: str) -> tuple:
        """Parse ``key=value;...`` (see :meth:`parse`, the cached entry point).

        Parameters
        ----------
        text : str
            The config string; empty items are ignored, absent keys take their default.

        Returns
        -------
        tuple
            A named tuple with one field per key.

        Raises
        ------
        ValueError
            Naming the kernel and the key, for an unknown key or a bad value.
        """
        values = {name: f.default for name, f in self.fields.items()}
        for item in str(text).split(";"):
            item = item.strip()
            if not item:
                continue
            key, sep, value = item.partition("=")
            key, value = key.strip(), value.strip()
            if not sep:
                raise ValueError(f"{self.kernel}: config item {item!r} is not key=value")
            if key not in self.fields:
                raise ValueError(
                    f"{self.kernel}: unknown config key {key!r} in {text!r} "
                    f"(known: {', '.join(self.fields)})"
                )
            field = self.fields[key]
            try:
                values[key] = field.parse(value)
            except ValueError as err:
                raise ValueError(
                    f"{self.kernel}: bad value {value!r} for config key {key!r} "
                    f"({err}; expected {field.doc})"
                ) from None
        return self.type(**values)

    def format(self, config: dict[str, object]) -> str:
        """The config string of ``config`` (:func:`format_config`), checked against the keys
        and value types of this spec: the compiler builds every library call's config through
        it, so a key the kernel does not know fails at compile time, naming kernel and key.

        Raises
        ------
        ValueError
            Naming the kernel and the key, for an unknown key or a bad value.
        """
        text = format_config(config)
        self._parse(text)
        return text

    def describe(self) -> str:
        """``key=<values>`` for every key, joined by ``;`` (for error messages and docs)."""
        return ";".join(f"{k}={f.doc}" for k, f in self.fields.items())


# ---------------------------------------------------------------------------------------------
# threads and streams


class _Streams:
    """torch views of TVM's current CUDA stream, created once per (device, handle).

    The VM (and its CUDA-graph capture, which swaps in a capture stream through
    ``TVMFFIEnvSetStream``) launches on the stream that ``tvm_ffi.get_raw_stream`` returns;
    torch work must go to the same stream. The wrappers are cached so that nothing is created
    while a graph is being captured.

    While TVM captures a CUDA graph, the torch temporaries of a kernel (SDPA's output, a conv
    result before the copy into ``out``, cuBLAS workspace) are allocated from a private
    ``torch.cuda.MemPool`` that lives as long as the process: the captured graph keeps
    pointing at them, so they must never be handed to other tensors. Temporaries of different
    kernels may share pool blocks; that is safe because every temporary is dead when its
    kernel returns and graph replays run the kernels in order on one stream.
    """

    def __init__(self) -> None:
        self.by_handle: dict[tuple[int, int], Any] = {}
        self.pools: dict[int, Any] = {}

    def stream(self, index: int, device: torch.device):
        handle = tvm_ffi.get_raw_stream(tvm_ffi.device("cuda", index))
        key = (index, handle)
        stream = self.by_handle.get(key)
        if stream is None:
            if handle == 0:
                stream = torch.cuda.default_stream(index)
            else:
                stream = torch.cuda.ExternalStream(handle, device=device)
            self.by_handle[key] = stream
        return stream

    @contextlib.contextmanager
    def context(self, tensor: torch.Tensor):
        """Run torch work on TVM's current stream of ``tensor``'s device (no-op on the CPU)."""
        if tensor.device.type != "cuda":
            yield
            return
        index = tensor.device.index or 0
        with torch.cuda.device(index), torch.cuda.stream(self.stream(index, tensor.device)):
            if not torch.cuda.is_current_stream_capturing():
                yield
                return
            pool = self.pools.get(index)
            if pool is None:
                pool = self.pools[index] = torch.cuda.MemPool()
            with torch.cuda.use_mem_pool(pool, index):
                yield


STREAMS = _Streams()


# ---------------------------------------------------------------------------------------------
# prepacked weights


class PrepackCache:
    """Weights reordered once into the library's blocked layout, keyed by identity.

    The key is (data pointer, shape, strides, dtype, device, variant); ``variant`` names the
    packing (kernel, weight layout, attributes). Each entry keeps a reference to the source
    tensor, so its memory cannot be freed and reused by another tensor while the entry lives.

    A weight is packed the second time it is seen (the first call runs on the plain weight,
    which oneDNN takes at about 90% of the packed speed): a caller that passes a fresh weight
    tensor on every call then never pays for packing nor grows the cache, while a model's
    parameters are packed once, at their second call, and never again. A weight mutated in
    place after it was packed is NOT re-packed (the cache cannot see the change): call
    :func:`plus_tvm.runtime.clear_caches` after mutating weights, or emit ``prepack=0`` for
    weights computed at run time (the VM reuses activation storage, so a computed "weight"
    changes under a fixed address).

    The packed bytes are bounded (``PLUS_TVM_PREPACK_MB``, default 4096 MiB): past the budget
    the least recently used entries are dropped (and re-packed if seen again), so that a
    long-running process that builds many models does not keep every old weight alive.

    Safe to use from several threads (one lock; packing a weight holds it).
    """

    SEEN_LIMIT = 4096

    def __init__(self, name: str, budget_bytes: int | None = None, pack_after: int = 2) -> None:
        self.name = name
        self.entries: OrderedDict[tuple, tuple[torch.Tensor, Any, int]] = OrderedDict()
        # keys seen fewer than ``pack_after`` times (no reference kept: a new tensor at a
        # recycled address only gets packed one call early, which is harmless)
        self.seen: OrderedDict[tuple, int] = OrderedDict()
        self.pack_after = pack_after
        self.packs = 0
        self.hits = 0
        self.bytes = 0
        if budget_bytes is None:
            budget_bytes = int(env.prepack_budget_mb() * (1 << 20))
        self.budget_bytes = budget_bytes
        self.lock = threading.RLock()

    @staticmethod
    def key(tensor: torch.Tensor, variant: tuple) -> tuple:
        """The identity of ``tensor`` for packing ``variant``."""
        return (
            tensor.data_ptr(),
            tuple(tensor.shape),
            tuple(tensor.stride()),
            tensor.dtype,
            tensor.device,
            variant,
        )

    def get(self, tensor: torch.Tensor, variant: tuple, pack: Callable[[torch.Tensor], Any]):
        """The packed form of ``tensor``, or ``None`` while it has been seen too few times.

        Parameters
        ----------
        tensor : torch.Tensor
            The weight as the kernel received it.
        variant : tuple
            What the packing depends on besides the tensor (kernel, layout, attributes).
        pack : callable
            ``pack(tensor)`` returns the packed form; it runs once per (tensor, variant), at
            the ``pack_after``-th request.

        Returns
        -------
        object or None
            The cached packed form, or ``None``: use the plain tensor for this call.
        """
        key = self.key(tensor, variant)
        with self.lock:
            return self._get(key, tensor, pack)

    def _get(self, key: tuple, tensor: torch.Tensor, pack: Callable[[torch.Tensor], Any]):
        entry = self.entries.get(key)
        if entry is not None:
            self.hits += 1
            self.entries.move_to_end(key)
            return entry[1]
        count = self.seen.pop(key, 0) + 1
        if count < self.pack_after:
            self.seen[key] = count
            if len(self.seen) > self.SEEN_LIMIT:
                self.seen.popitem(last=False)
            return None
        packed = pack(tensor)
        self.packs += 1
        size = packed.numel() * packed.element_size() if isinstance(packed, torch.Tensor) else 0
        self.entries[key] = (tensor, packed, size)
        self.bytes += size
        while self.bytes > self.budget_bytes and len(self.entries) > 1:
            _, (_, _, dropped) = self.entries.popitem(last=False)
            self.bytes -= dropped
        return packed

    def get_joined(
        self,
        tensors: Sequence[torch.Tensor],
        variant: tuple,
        pack: Callable[[Sequence[torch.Tensor]], Any],
    ):
        """:meth:`get` for a form made of several tensors (sibling weights concatenated into
        one GEMM): keyed by the identity of every part, and holding every part alive, so a
        part freed and its address reused can never meet the old packing."""
        key = ("joined", *(self.key(t, variant) for t in tensors))
        with self.lock:
            return self._get(key, tuple(tensors), pack)

    def discard(self, tensor: torch.Tensor, variant: tuple) -> None:
        """Drop the entry of ``tensor`` packed as ``variant``, if any."""
        with self.lock:
            entry = self.entries.pop(self.key(tensor, variant), None)
            if entry is not None:
                self.bytes -= entry[2]

    def forget(self, data_ptr: int) -> None:
        """Drop every entry (and sighting) of the tensor at ``data_ptr``, in any variant."""
        with self.lock:
            for key in [k for k in self.entries if _uses(k, data_ptr)]:
                self.bytes -= self.entries.pop(key)[2]
            for key in [k for k in self.seen if _uses(k, data_ptr)]:
                del self.seen[key]

    def clear(self) -> None:
        """Drop every entry (and the references to the source tensors)."""
        with self.lock:
            self.entries.clear()
            self.seen.clear()
            self.bytes = 0

    def __len__(self) -> int:
        return len(self.entries)


# ---------------------------------------------------------------------------------------------
# kernels


# torch's capsule importer: 0.45 us a tensor against 1.15 us for ``torch.from_dlpack``, which
# negotiates the protocol version and stream on every call. No stream hand-off is needed: on
# CUDA the kernels run on TVM's own current stream. Falls back to the public API if absent.
# Looked up at the first conversion (torch is imported then, not with the runtime).
_FROM_CAPSULE: list[Callable[[Any], Any] | None] = []


def to_torch(tensor: Any) -> torch.Tensor:
    """A zero-copy torch view of a TVM tensor (torch tensors pass through)."""
    if isinstance(tensor, torch.Tensor):
        return tensor
    if not _FROM_CAPSULE:
        _FROM_CAPSULE.append(getattr(torch._C, "_from_dlpack", None))
    if _FROM_CAPSULE[0] is not None:
        return _FROM_CAPSULE[0](tensor.__dlpack__())
    return torch.from_dlpack(tensor)


@functools.cache
def onednn_dtypes() -> tuple[torch.dtype, ...]:
    """The dtypes torch's oneDNN takes here: float32, and bfloat16 on CPUs that compute it
    natively (``cpu_features``: measured 10% over F.linear at BERT's FFN; torch's own check
    also says yes where oneDNN would emulate it). Asked once, at the first use."""
    if not torch.backends.mkldnn.is_available():
        return ()
    bf16 = "bfloat16" in cpu_dtypes()
    return (torch.float32, torch.bfloat16) if bf16 else (torch.float32,)


def _uses(key: tuple, data_ptr: int) -> bool:
    """Whether a :class:`PrepackCache` key is (or, joined, has a part) at ``data_ptr``."""
    if key[0] == "joined":
        return any(part[0] == data_ptr for part in key[1:])
    return key[0] == data_ptr


def onednn_usable(*tensors: torch.Tensor) -> bool:
    """Whether oneDNN's prepacked path applies: CPU tensors of one dtype oneDNN supports here
    (float32, and bfloat16 on CPUs with native bf16)."""
    dtype = tensors[0].dtype
    return dtype in onednn_dtypes() and all(
        t.device.type == "cpu" and t.dtype == dtype for t in tensors
    )


# The fewest GEMM rows from which a half call widens to float32 (:func:`widened_half`), per
# dtype. float16: always (torch's float16 GEMM here is 4.5x slower than float32 at 128x768x3072
# and back). bfloat16: measured on this project's AVX2 EPYC (2 cores, torch 2.13, bf16 addmm
# against the float32 oneDNN GEMM on a weight widened and packed once, plus the activation's
# widening and the output's rounding; scripts/bench_widened_half.py): at 3+ rows the widened GEMM
# wins everywhere (K x N in 768x768, 768x3072, 3072x768, 2048x2048, 2048x5632: 1.1-2.1x at 3
# rows and weights streamed from memory as in a model, 1.2-1.5x at 4, 2-3x at 8, 5-7x at 128
# and 1024; convolutions at ResNet-50's layers 2.7-70x, attention's batched matmuls 2-35x). A
# linear of up to eight rows (a decode step's) takes the native library's bfloat16 GEMV first
# where it is loaded (runtime/linear.py HALF_GEMV_MAX_ROWS; native/gemv.cc), which streams half
# the weight bytes (torch's bfloat16 GEMV runs at 1.4-51x the memory bound).
WIDEN_MIN_ROWS = {"float16": 1, "bfloat16": 3}


def widened_half(x: torch.Tensor, rows: int) -> bool:
    """Whether a float16 / bfloat16 call computes in float32 on oneDNN: on a CPU without GEMM
    instructions for its dtype (``cpu_features``), from ``WIDEN_MIN_ROWS`` GEMM rows (a
    linear's input rows, a convolution's output pixels, a matmul's rows over its batch). The
    kernel then widens its weights once (packed by the cache), its activations per call, and
    rounds to the half dtype once, where torch's op-by-op graph rounds; products of half values
    are exact in float32, so the result is float32's rounded once. CPUs with the instructions
    (and other dtypes) keep their paths."""
    if x.dtype == torch.float16:
        name = "float16"
    elif x.dtype == torch.bfloat16:
        name = "bfloat16"
    else:
        return False
    return (
        rows >= WIDEN_MIN_ROWS[name]
        and x.device.type == "cpu"
        and torch.float32 in onednn_dtypes()
        and name not in cpu_dtypes()
    )


def check_last_axis(kernel: str, axis: int, ndim: int) -> None:
    """Reject a row kernel's ``axis`` other than the last one, naming the kernel."""
    if axis not in (-1, ndim - 1):
        raise ValueError(
            f"{kernel}: only the last axis is supported (axis=-1), got axis={axis} "
            f"for a {ndim}-D input"
        )


def write_out(out: torch.Tensor, result: torch.Tensor) -> None:
    """Copy ``result`` into the preallocated DPS output (no-op when it already is ``out``)."""
    if result is out:
        return
    out.copy_(result)


ACTIVATIONS = ("none", "relu", "relu6", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh")


def apply_activation_(x: torch.Tensor, act: str) -> torch.Tensor:
    """Apply ``act`` to ``x`` in place and return it."""
    if act == "none":
        return x
    if act == "relu":
        return x.relu_()
    if act == "relu6":
        return x.clamp_(0.0, 6.0)
    if act == "gelu":
        return torch.ops.aten.gelu_(x)
    if act == "gelu_tanh":
        return torch.ops.aten.gelu_(x, approximate="tanh")
    if act == "silu":
        return torch.nn.functional.silu(x, inplace=True)
    if act == "sigmoid":
        return x.sigmoid_()
    if act == "tanh":
        return x.tanh_()
    raise ValueError(f"unknown activation {act!r}")


# oneDNN post-op (attr, algorithm) for each activation; ONEDNN_SCALARS: the op's scalars.
ONEDNN_SCALARS = {"relu6": [0.0, 6.0]}
ONEDNN_UNARY = {
    "none": ("none", ""),
    "relu": ("relu", ""),
    "relu6": ("hardtanh", ""),
    "gelu": ("gelu", "none"),
    "gelu_tanh": ("gelu", "tanh"),
    "silu": ("swish", ""),
    "sigmoid": ("sigmoid", ""),
    "tanh": ("tanh", ""),
}


class LibraryKernel:
    """Base class: one ``plus.<name>`` global function backed by torch's libraries.

    Subclasses set ``spec`` (which names the kernel: ``name`` is taken from it), say how many
    tensor inputs a config implies (:meth:`num_inputs`) and implement :meth:`run` on torch
    tensors. Calling the object with the VM's arguments (``*inputs, config, out``) converts,
    checks and dispatches.

    The class is the one source of the kernel's contract: its name and config keys
    (``spec``), the dtypes it takes (``dtypes``; a warehouse implementation of it,
    ``implementations``, may declare no other), whether it has a native C++ form and in which
    dtypes (``native_dtypes``), and which configs that form runs (:meth:`native_config`).
    ``runtime/native``, the dispatcher's cost model and the warehouse loader read them here;
    tests/test_kernel_contract.py checks the C++ parsers against them.
    """

    name: str = ""
    spec: ConfigSpec
    #: the element dtypes the kernel computes in (its torch path takes every float dtype)
    dtypes: tuple[str, ...] = ("float32", "float64", "float16", "bfloat16")
    #: the dtypes its native C++ form (``runtime/native/onednn_<name>.cc``) runs, on CPUs that
    #: compute them natively (``native.native_dtypes``); empty: no native form
    native_dtypes: tuple[str, ...] = ()
    #: the warehouse implementation names (``plus_tvm.dispatch`` binders) that call this kernel:
    #: an entry's implementation may declare only dtypes in ``dtypes`` (checked at load time)
    implementations: tuple[str, ...] = ()
    #: throughput the dispatch cost model prices a call at (GFLOP/s; memory-bound kernels in
    #: "GFLOP/s" of a few flops per element), on CPU (this project's 2-core machine, measured
    #: with scripts/bench_kernels.py) and on CUDA (order of an H100, not measured)
    cpu_gflops: float = 10.0
    cuda_gflops: float = 1000.0

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        spec = cls.__dict__.get("spec")
        if spec is not None:
            named = cls.__dict__.get("name", spec.kernel)
            if named != spec.kernel:
                raise TypeError(f"{cls.__name__}: name {named!r} is not its spec's {spec.kernel!r}")
            cls.name = spec.kernel
        if not set(cls.native_dtypes) <= set(cls.dtypes):
            raise TypeError(
                f"{cls.__name__}: native_dtypes {cls.native_dtypes} are not all among the dtypes "
                f"it takes {cls.dtypes}"
            )

    def __init__(self) -> None:
        self.cache = PrepackCache(self.name)

    def native_config(self, cfg: tuple) -> bool:
        """Whether the native form runs a call of parsed config ``cfg`` (its dtype apart):
        by default every config of a kernel that has one. The C++ parser decides the same
        (``cfg.native``); tests/test_kernel_contract.py checks that they agree."""
        del cfg
        return bool(self.native_dtypes)

    def num_inputs(self, cfg: tuple) -> int:
        """The number of tensor inputs the call carries for ``cfg``."""
        raise NotImplementedError

    def forget(self, data_ptr: int) -> None:
        """Drop everything cached for the tensor at ``data_ptr`` (a weight being replaced)."""
        self.cache.forget(data_ptr)

    def clear(self) -> None:
        """Drop everything this kernel caches (prepacked weights and any other state a
        subclass keeps: it extends this)."""
        self.cache.clear()

    def run(self, cfg: tuple, inputs: Sequence[torch.Tensor], out: torch.Tensor) -> None:
        """Compute into ``out`` from torch tensors (the body of the kernel)."""
        raise NotImplementedError

    def probe(self, rand: Callable[..., torch.Tensor]) -> tuple | None:
        """One representative call, ``(inputs, config, out, flops)``, for measuring this
        machine's throughput (``PLUS_TVM_MEASURE_LIBRARY=1``); None (default): not measured,
        :attr:`cpu_gflops` is used. ``rand(*shape)`` draws a tensor."""
        del rand
        return None

    def num_outputs(self, cfg: tuple) -> int:
        """How many outputs the VM passes after the config string (default one)."""
        del cfg
        return 1

    def check(self, cfg: tuple, inputs: Sequence[torch.Tensor], out: torch.Tensor) -> None:
        """Raise ``ValueError`` for a config the kernel does not support (optional hook)."""

    def out_shape(self, cfg: tuple, inputs: Sequence[torch.Tensor]) -> tuple[int, ...]:
        """The shape ``out`` must have (torch's ``out=`` would silently resize a wrong one)."""
        return tuple(inputs[0].shape)

    def __call__(self, *args: Any) -> None:
        if _TORCH_IMPORT.module is None:  # (imported at the first call; a clear error without)
            require(f"the Python kernel {self.name}")
        if len(args) < 2:
            raise ValueError(f"{self.name}: expected (*inputs, config, out), got {len(args)} args")
        at = next((i for i, a in enumerate(args) if isinstance(a, str)), None)
        if at is None:
            raise ValueError(
                f"{self.name}: the argument before the output(s) must be the config string, "
                f"got none among {[type(a).__name__ for a in args]}"
            )
        tensors, config, outs = args[:at], args[at], args[at + 1 :]
        cfg = self.spec.parse(config)
        if len(outs) != self.num_outputs(cfg):
            raise ValueError(
                f"{self.name}: config {str(config)!r} implies {self.num_outputs(cfg)} outputs, "
                f"got {len(outs)}"
            )
        out, extra = outs[0], [to_torch(o) for o in outs[1:]]
        expected = self.num_inputs(cfg)
        if len(tensors) != expected:
            raise ValueError(
                f"{self.name}: config {str(config)!r} implies {expected} tensor inputs, "
                f"got {len(tensors)}"
            )
        inputs = [to_torch(t) for t in tensors]
        out_t = to_torch(out)
        self.check(cfg, inputs, out_t)
        shape = self.out_shape(cfg, inputs)
        if tuple(out_t.shape) != shape:
            raise ValueError(
                f"{self.name}: output shape {tuple(out_t.shape)} does not match {shape} "
                f"implied by the inputs {[tuple(t.shape) for t in inputs]} and {str(config)!r}"
            )
        if out_t.device.type == "cpu":
            self.run(cfg, inputs, out_t, *extra)
        else:
            with STREAMS.context(out_t):
                self.run(cfg, inputs, out_t, *extra)

    def call(self, *inputs: torch.Tensor, config: str = "", out: torch.Tensor) -> torch.Tensor:
        """Run the kernel on torch tensors directly (no VM), as the VM would.

        Parameters
        ----------
        *inputs : torch.Tensor
            The tensor inputs, optional ones included as ``config`` says.
        config : str
            ``key=value`` pairs joined by ``;``.
        out : torch.Tensor
            The preallocated output, written in place.

        Returns
        -------
        torch.Tensor
            ``out``.
        """
        self(*inputs, config, out)
        return out
