"""``plus.conv2d``: ``out = post_act(act(conv2d(x, w) + bias) + residual)``.

Call: ``plus.conv2d(x, w, [bias], [gamma, beta, mean, var], [residual], config, out)``. Keys:
``stride=a,b``, ``padding=t,l,b,r`` (one value or two ``h,w`` are also accepted; top / bottom
and left / right may differ), ``dilation=a,b``, ``groups=<int>``, ``bias=0|1``, ``bn=0|1``
(with ``bn_eps``), ``residual=0|1``, ``act`` and ``post_act`` (``none|relu|relu6|gelu|
gelu_tanh|silu|sigmoid|tanh``: before and after the residual add), ``layout=nchw|nhwc``,
``nan=1|0``, ``prepack=1|0``, ``winograd=1|0``.

``layout`` is the layout of ``x``, ``residual`` and ``out``: ``nchw`` (``[N, C, H, W]``) or
``nhwc`` (``[N, H, W, C]``, channels last); the weight is always the model's OIHW tensor (its
packed form is the library's business). ``nan=1`` (the default): a NaN reaching ReLU / ReLU6
gives NaN, as in torch; ``nan=0`` lets the implementation return 0 there. ``winograd=1`` (the
default) lets an implementation compute a 3x3 stride-1 convolution with Winograd's algorithm where
it is faster (the native kernel does, ``runtime/native/winograd.h``; this one never does);
``winograd=0``: the direct algorithm.

On CPU fp32 with ``layout=nhwc`` the native kernel (``runtime/native/onednn_conv2d.cc``) runs
in front of this one: oneDNN with every epilogue as a post-op and the padding done by the
convolution, writing ``out`` in place. What follows is the Python implementation, the
reference and the fallback for every other call.

Two CPU fp32 implementations, neither best everywhere (measured on ResNet-50 shapes, 2 cores):

* oneDNN ``_convolution_pointwise`` on a weight reordered once (``_reorder_convolution_weight``)
  with the activation / residual add as post-ops. 2x faster than ``F.conv2d`` on the 7x7 stem
  and the 512-channel 7x7 layers, but its output is channels-last, and copying that into the
  NCHW ``out`` costs up to 2x the kernel on large activations (64x256x56x56: 0.6 ms copy vs
  0.27 ms conv);
* ``F.conv2d`` (oneDNN through ATen, NCHW output, no copy penalty).

So the first call at each (shape, attributes) times both (four interleaved runs each, including
the copy into ``out``; oneDNN must be 10% faster) and keeps the winner for that shape; later
calls only look the choice up. The choice is per process and can differ between runs when the
two are close.
CUDA and other dtypes use ``F.conv2d`` (cuDNN) with the activation and residual in place.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from ._common import (
    ACTIVATIONS,
    ONEDNN_SCALARS,
    ONEDNN_UNARY,
    ConfigSpec,
    Field,
    LibraryKernel,
    apply_activation_,
    choice,
    flag,
    integer,
    ints,
    onednn_usable,
    real,
    widened_half,
)
from ._torch import F, torch


def _padding(text: str) -> tuple[int, int, int, int]:
    values = tuple(int(v) for v in text.split(","))
    if len(values) == 1:
        return values * 4
    if len(values) == 2:
        return (values[0], values[1], values[0], values[1])
    if len(values) == 4:
        return values  # type: ignore[return-value]
    raise ValueError("expected t,l,b,r (or one value, or h,w)")


CONV2D_SPEC = ConfigSpec(
    "plus.conv2d",
    stride=ints(2, (1, 1)),
    padding=Field(_padding, (0, 0, 0, 0), "t,l,b,r", ("1", "1,2", "1,2,3,4")),
    dilation=ints(2, (1, 1)),
    groups=integer(1),
    bias=flag(),
    residual=flag(),
    act=choice(*ACTIVATIONS),
    post_act=choice(*ACTIVATIONS),
    layout=choice("nchw", "nhwc"),
    nan=flag(True),
    prepack=flag(True),
    winograd=flag(True),
    bn=flag(),
    bn_eps=real(1e-5),
)

# The narrowest layer (fewer of input and output channels) that may run as Winograd, per CPU
# (LLVM's ``-mcpu`` of the target), where the native kernel's own table (``winograd.h``) lets
# thinner layers take it but oneDNN's direct convolution is faster there. Empty: on Zen 5,
# where the table was measured, Winograd F(4x4) wins from 64 channels (a 64-channel 3x3 layer
# at 56x56: 0.60 ms against direct 1.07, one thread); Zen 4 ran it 1.15x faster than direct
# even before its output transform vectorized. (Zen 5 had 128 here until then.)
WINOGRAD_MIN_CHANNELS: dict[str, int] = {}

TRIAL_ROUNDS = 4
MARGIN = 0.9


class Conv2d(LibraryKernel):
    """``plus.conv2d(x, w, [bias], [gamma, beta, mean, var], [residual], config, out)``.

    With ``bn=1`` an inference BatchNorm after the convolution is folded into it: the four
    statistics tensors follow the bias and the kernel convolves with ``W * s`` and adds
    ``(bias - mean) * s + beta``, ``s = gamma / sqrt(var + bn_eps)``. The folded weight and bias
    are computed once per set of parameter tensors (kept alive by the cache, like a prepacked
    weight) and never per call; parameters changed in place need ``clear_caches()``. In
    float16 / bfloat16 the BatchNorm is not folded: it computes in float32 on the convolution's
    result (see :meth:`_half_batch_norm`; the native kernel runs it as float32 post-ops).
    """

    spec = CONV2D_SPEC
    implementations = ("torch.conv2d",)
    cpu_gflops = 350.0  # ResNet-50's layers: 200-475 (1x1 layers lowest)
    native_dtypes = ("float32", "bfloat16")  # native/onednn_conv2d.cc
    cuda_gflops = 15000.0

    def probe(self, rand):  # noqa: ANN001, ANN201
        flops = 2.0 * 64 * 64 * 9 * 56 * 56
        x, w = rand(1, 64, 56, 56), rand(64, 64, 3, 3)
        return (x, w), "padding=1", torch.empty(1, 64, 56, 56), flops

    def __init__(self) -> None:
        super().__init__()
        # (shapes, attributes) -> "onednn" | "aten", decided by timing at the first call
        self.choices: dict[tuple, str] = {}
        # (data pointers of w, bias and the statistics) -> (sources kept alive, folded w, b)
        self.folded: dict[tuple, tuple] = {}

    def native_config(self, cfg) -> bool:
        return cfg.layout == "nhwc" and cfg.prepack and cfg.groups >= 1

    def num_inputs(self, cfg) -> int:
        return 2 + cfg.bias + 4 * cfg.bn + cfg.residual

    def forget(self, data_ptr: int) -> None:
        super().forget(data_ptr)
        for key in [k for k, hit in list(self.folded.items()) if _holds(hit[0], data_ptr)]:
            self.folded.pop(key, None)

    def clear(self) -> None:
        super().clear()
        self.choices.clear()
        self.folded.clear()

    def _run_widened(self, cfg, inputs: Sequence[torch.Tensor], out: torch.Tensor) -> None:
        """float16 / bfloat16 on a CPU without instructions for it (:func:`widened_half`): the
        convolution (and its bias) in float32 (oneDNN or ATen as timed) on the parameters
        widened once (the cache keeps them, so the packing is done once too), then rounded
        where torch's half graph rounds: the convolution's result, the BatchNorm computed
        in float32 on it, the activations and the residual add in the half dtype (an overflow
        between the convolution and its BatchNorm is inf as in torch, not folded away)."""
        x, w = inputs[0], inputs[1]
        rest = list(inputs[2:])
        bias = rest.pop(0) if cfg.bias else None
        stats = [rest.pop(0) for _ in range(4)] if cfg.bn else None
        residual = rest.pop(0) if cfg.residual else None

        def wide(t: torch.Tensor) -> torch.Tensor:
            hit = self.cache.get(t, ("float32",), lambda s: s.float()) if cfg.prepack else None
            return hit if hit is not None else t.float()

        plain = cfg._replace(bn=0, residual=0, act="none", post_act="none")
        params = [wide(w), *([wide(bias)] if bias is not None else [])]
        result = torch.empty_like(out, dtype=torch.float32)
        self.run(plain, [x.float(), *params], result)
        channels = (-1,) if cfg.layout == "nhwc" else (-1, 1, 1)  # the channel axis
        self._half_epilogue(cfg, result.to(out.dtype), stats, residual, out, channels)

    def _affine(self, cfg, bias, stats) -> tuple[torch.Tensor, torch.Tensor]:
        """A half call's BatchNorm as float32 ``(s, (bias - mean) * s + beta)`` per channel,
        computed once per set of parameter tensors."""
        key = ("affine", *((t.data_ptr(), tuple(t.shape)) for t in stats)) + (
            (bias.data_ptr(),) if bias is not None else (None,),
            cfg.bn_eps,
        )
        hit = self.folded.get(key)
        if hit is None:
            gamma, beta, mean, var = (t.float() for t in stats)
            scale = gamma / torch.sqrt(var + cfg.bn_eps)
            b0 = bias.float() if bias is not None else torch.zeros_like(mean)
            hit = ((bias, *stats), scale, (b0 - mean) * scale + beta)
            self.folded[key] = hit
        return hit[1], hit[2]

    def _half_batch_norm(self, cfg, x, w, bias, stats, residual, out) -> None:
        """A half convolution and its BatchNorm as torch computes them: the convolution
        rounded once to the half dtype, the BatchNorm in float32 and rounded once (folding it
        into the half weight would round the weight once more: MobileNetV2 in float16 was 3x
        torch's error), then the activations and the residual in the half dtype."""
        xs, padding = self._symmetric(cfg, x)
        y = F.conv2d(xs, w, bias, cfg.stride, padding, cfg.dilation, cfg.groups)
        self._half_epilogue(cfg, y, stats, residual, out, (-1, 1, 1))  # (NCHW-shaped)

    def _half_epilogue(self, cfg, y, stats, residual, out, channels: tuple) -> None:
        """A half convolution's rounded result ``y`` on to ``out`` as torch computes it: its
        BatchNorm (if any) in float32 and rounded once, the activation, the residual add and
        the second activation in the half dtype. ``channels``: the view that lays a
        per-channel vector along ``y``'s channel axis."""
        if stats is not None:
            scale, shift = self._affine(cfg, None, stats)
            y = torch.addcmul(shift.view(channels), y.float(), scale.view(channels)).to(y.dtype)
        apply_activation_(y, cfg.act)
        if residual is not None:
            torch.add(y, residual, out=out)
        else:
            out.copy_(y)
        apply_activation_(out, cfg.post_act)

    def _fold(self, cfg, w, bias, stats) -> tuple[torch.Tensor, torch.Tensor]:
        key = tuple((t.data_ptr(), tuple(t.shape)) for t in (w, *stats)) + (
            (bias.data_ptr(),) if bias is not None else (None,),
            cfg.bn_eps,
        )
        hit = self.folded.get(key)
        if hit is None:
            # folded in float32 and rounded once (a half model's weights would otherwise be
            # rounded at every step of the fold)
            gamma, beta, mean, var = (t.float() for t in stats)
            scale = gamma / torch.sqrt(var + cfg.bn_eps)
            wf = (w.float() * scale.view(-1, 1, 1, 1)).to(w.dtype).contiguous()
            b0 = bias.float() if bias is not None else torch.zeros_like(mean)
            bf = ((b0 - mean) * scale + beta).to(w.dtype).contiguous()
            hit = ((w, bias, *stats), wf, bf)
            self.folded[key] = hit
        return hit[1], hit[2]

    def check(self, cfg, inputs: Sequence[torch.Tensor], out: torch.Tensor) -> None:
        x, w = inputs[0], inputs[1]
        if x.dim() != 4 or w.dim() != 4:
            raise ValueError(
                f"{self.name}: x must be {cfg.layout.upper()} and w OIHW (4-D), got "
                f"{tuple(x.shape)} and {tuple(w.shape)}"
            )
        channels = x.shape[3] if cfg.layout == "nhwc" else x.shape[1]
        if cfg.groups < 1 or channels != w.shape[1] * cfg.groups:
            raise ValueError(
                f"{self.name}: groups={cfg.groups} does not match x channels {channels} and "
                f"w in-channels {w.shape[1]}"
            )

    def out_shape(self, cfg, inputs: Sequence[torch.Tensor]) -> tuple[int, ...]:
        x, w = inputs[0], inputs[1]
        spatial = x.shape[1:3] if cfg.layout == "nhwc" else x.shape[2:]
        t, left, b, r = cfg.padding
        sizes = []
        for size, pad, k, s, d in zip(
            spatial, (t + b, left + r), w.shape[2:], cfg.stride, cfg.dilation, strict=True
        ):
            sizes.append((size + pad - d * (k - 1) - 1) // s + 1)
        if cfg.layout == "nhwc":
            return (x.shape[0], *sizes, w.shape[0])
        return (x.shape[0], w.shape[0], *sizes)

    @staticmethod
    def _symmetric(cfg, x: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
        t, left, b, r = cfg.padding
        if t == b and left == r:
            return x, [t, left]
        return F.pad(x, (left, r, t, b)), [0, 0]

    def _aten(self, cfg, x, w, bias, residual, out) -> None:
        x, padding = self._symmetric(cfg, x)
        y = F.conv2d(x, w, bias, cfg.stride, padding, cfg.dilation, cfg.groups)
        apply_activation_(y, cfg.act)
        if residual is not None:
            torch.add(y, residual, out=out)
        else:
            out.copy_(y)

    @staticmethod
    def _variant(cfg, padding: list[int], x: torch.Tensor) -> tuple:
        return ("conv2d", tuple(padding), cfg.stride, cfg.dilation, cfg.groups, tuple(x.shape))

    def _onednn(self, cfg, x, w, bias, residual, out) -> None:
        x, padding = self._symmetric(cfg, x)
        x = x.contiguous()
        stride, dilation = list(cfg.stride), list(cfg.dilation)
        variant = self._variant(cfg, padding, x)

        def pack(weight: torch.Tensor) -> torch.Tensor:
            return torch.ops.mkldnn._reorder_convolution_weight(
                weight.contiguous(), padding, stride, dilation, cfg.groups, list(x.shape)
            )

        wp = self.cache.get(w, variant, pack)
        if wp is None:  # not seen often enough yet: oneDNN takes the plain OIHW weight too
            wp = w.contiguous()
        if residual is not None and cfg.act == "none":
            y = torch.ops.mkldnn._convolution_pointwise.binary(
                x,
                residual.contiguous(),
                wp,
                bias,
                padding,
                stride,
                dilation,
                cfg.groups,
                "add",
                None,
                None,
                [],
                None,
            )
            out.copy_(y)
            return
        # oneDNN's fused ReLU / clip turn a NaN into 0 (max instructions): those activations
        # run in torch, which propagates NaN like eager mode, in the pass that writes ``out``
        act = "none" if cfg.act in _NAN_DROPPING_POST_OPS else cfg.act
        attr, algorithm = ONEDNN_UNARY[act]
        y = torch.ops.mkldnn._convolution_pointwise(
            x,
            wp,
            bias,
            padding,
            stride,
            dilation,
            cfg.groups,
            attr,
            ONEDNN_SCALARS.get(act, []),
            algorithm,
        )
        if act != cfg.act and residual is None:
            low, high = _NAN_DROPPING_POST_OPS[cfg.act]
            torch.clamp(y, low, high, out=out)
            return
        if act != cfg.act:
            apply_activation_(y, cfg.act)
        if residual is not None:
            torch.add(y, residual, out=out)
        else:
            out.copy_(y)

    def _choose(self, cfg, args) -> str:
        """Time both implementations at this call's shapes and return the faster one's name.

        The runs are interleaved and each side keeps its best time, so that another process
        running at that moment slows both sides alike; oneDNN must win by ``MARGIN`` to be
        chosen (the ATen path is the steadier one: its output needs no layout change).
        """
        impls = (("onednn", self._onednn), ("aten", self._aten))
        for _, fn in impls:
            fn(cfg, *args)  # warm-up: primitive creation; oneDNN sees the weight (plain)
        self._onednn(cfg, *args)  # second sighting: the weight is packed now
        best = {name: float("inf") for name, _ in impls}
        for _ in range(TRIAL_ROUNDS):
            for name, fn in impls:
                start = time.perf_counter()
                fn(cfg, *args)
                best[name] = min(best[name], time.perf_counter() - start)
        if best["onednn"] < MARGIN * best["aten"]:
            return "onednn"
        x, padding = self._symmetric(cfg, args[0])  # the packed copy would only hold memory
        self.cache.discard(args[1], self._variant(cfg, padding, x))
        return "aten"

    def run(self, cfg, inputs: Sequence[torch.Tensor], out: torch.Tensor) -> None:
        if widened_half(inputs[0], out.numel() // max(inputs[1].shape[0], 1)):  # output pixels
            self._run_widened(cfg, inputs, out)
            return
        x, w = inputs[0], inputs[1]
        rest = list(inputs[2:])
        bias = rest.pop(0) if cfg.bias else None
        stats = [rest.pop(0) for _ in range(4)] if cfg.bn else None
        half = x.dtype in (torch.float16, torch.bfloat16)
        if stats is not None and not half:
            w, bias = self._fold(cfg, w, bias, stats)
        residual = rest.pop(0) if cfg.residual else None
        if cfg.layout == "nhwc":  # NCHW views with channels-last strides: ATen keeps them
            x, out = _nchw_view(x), _nchw_view(out)
            residual = _nchw_view(residual) if residual is not None else None
        if stats is not None and half:
            self._half_batch_norm(cfg, x, w, bias, stats, residual, out)
            return
        args = (x, w, bias, residual, out)
        if cfg.post_act != "none":  # the activation after the residual add: on out, in place
            self._aten(cfg, *args)
            apply_activation_(out, cfg.post_act)
            return
        if cfg.layout == "nhwc" or not (cfg.prepack and onednn_usable(x, w, out)):
            self._aten(cfg, *args)
            return
        key = (tuple(x.shape), tuple(w.shape), cfg, residual is not None)
        impl = self.choices.get(key)
        if impl is None:
            # every trial run wrote the full result into out, so the call is done
            self.choices[key] = self._choose(cfg, args)
            return
        (self._onednn if impl == "onednn" else self._aten)(cfg, *args)


# activations whose oneDNN post-op drops NaN, as the clamp bounds torch applies instead
_NAN_DROPPING_POST_OPS = {"relu": (0.0, None), "relu6": (0.0, 6.0)}


def _nchw_view(t: torch.Tensor) -> torch.Tensor:
    """The NCHW-shaped view of an NHWC tensor (channels-last strides, no copy)."""
    return t.permute(0, 3, 1, 2)


def _holds(tensors: tuple, data_ptr: int) -> bool:
    return any(t is not None and t.data_ptr() == data_ptr for t in tensors)
