"""A zoo of reference models with random weights, built from configs, never downloaded.

Each entry is a torch model in eval mode whose ``forward`` takes plain tensors (token ids or
pixels, batch 1) and returns one tensor, so it goes through ``torch.export.export`` and
``torch.onnx.export`` as is. Full-size entries use the published architecture sizes (sequence
length 128, 224x224 images); every ``NAME`` has a ``NAME-tiny`` twin that runs the same code path
with a tiny config so that tests can import and compile it in seconds.

Weights are random but deterministic given the seed. Transformers models are built from their
config classes (``transformers`` is imported only when such a model is built); VGG-16 is written
here. Random-weight CNNs are given a sane numeric range: their BatchNorm layers get
unit-ish affine parameters and running statistics re-estimated on random batches, because the
initial ones let activations vanish (outputs near 1e-21 or exactly 0 make any numerics check
meaningless).

Examples
--------
>>> from plus_tvm import zoo
>>> model, inputs = zoo.load("bert-base-tiny")
>>> model(*inputs).shape
torch.Size([1, 16, 64])
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import torch
from torch import nn

from plus_tvm.errors import UnknownModelError

__all__ = ["ZooEntry", "export_onnx", "get", "load", "names"]

_PREFIX = "zoo:"
_SEQ_LEN = 128
_TINY_SEQ_LEN = 16
_IMAGE = 224
# ONNX opset for export_onnx: 18 is the exporter's native opset in torch 2.x and is read by
# onnxruntime and TVM's ONNX importer.
_ONNX_OPSET = 18
# Loggers whose warnings during export_onnx are noise: "torchvision is not installed" (it is
# never needed here) and constant-folding attempts that fail harmlessly on symbolic shapes.
_NOISY_EXPORT_LOGGERS = (
    "torch.onnx._internal.exporter._registration",
    "onnxscript.optimizer._constant_folding",
)


# ----------------------------------------------------------------------------------- wrappers
class _TextModel(nn.Module):
    """Token ids in, one tensor out: hides transformers' ModelOutput from the exporters."""

    def __init__(self, model: nn.Module, output: str) -> None:
        super().__init__()
        self.model = model
        self.output = output

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        # The argument name becomes the input name of the exported programs.
        return getattr(self.model(input_ids=input_ids), self.output)


class _VisionModel(nn.Module):
    """Pixels in, one tensor out: hides transformers' ModelOutput from the exporters."""

    def __init__(self, model: nn.Module, output: str) -> None:
        super().__init__()
        self.model = model
        self.output = output

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return getattr(self.model(pixel_values=pixel_values), self.output)


# Conv widths of VGG-16's five stages; each stage ends with a 2x2 max-pool.
_VGG16_STAGES = ((64, 64), (128, 128), (256, 256, 256), (512, 512, 512), (512, 512, 512))


class _VGG16(nn.Module):
    """VGG-16 (configuration D): 13 conv3x3+ReLU layers, 5 max-pools, 3 fully connected layers.

    Parameters
    ----------
    width_divisor : int
        Divides every conv channel count (1 for the real network).
    hidden : int
        Width of the two hidden fully connected layers (4096 for the real network).
    num_classes : int
        Number of output logits.
    image_size : int
        Input height and width; the classifier's input is the feature map of that image flattened
        (512 x 7 x 7 for 224x224), so no adaptive pooling is needed.
    """

    def __init__(
        self,
        width_divisor: int = 1,
        hidden: int = 4096,
        num_classes: int = 1000,
        image_size: int = _IMAGE,
    ) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        channels = 3
        for stage in _VGG16_STAGES:
            for width in stage:
                out = width // width_divisor
                layers += [nn.Conv2d(channels, out, kernel_size=3, padding=1), nn.ReLU()]
                channels = out
            layers.append(nn.MaxPool2d(kernel_size=2, stride=2))
        self.features = nn.Sequential(*layers)
        spatial = image_size // 32
        self.classifier = nn.Sequential(
            nn.Linear(channels * spatial * spatial, hidden),
            nn.ReLU(),
            nn.Dropout(0.5),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Dropout(0.5),
            nn.Linear(hidden, num_classes),
        )
        # He init keeps activations O(1) through all 16 layers. torchvision's N(0, 0.01) for the
        # FC layers suits only the 25088/4096 wide ones: the tiny variant's logits end up ~1e-5.
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
                nn.init.zeros_(m.bias)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        x = self.features(pixel_values)
        return self.classifier(torch.flatten(x, 1))


# -------------------------------------------------------------------------------- BatchNorm fix
def recalibrate_batchnorm(
    model: nn.Module, input_shape: tuple[int, ...], seed: int, batches: int = 2, batch: int = 4
) -> None:
    """Give every BatchNorm unit-ish affine parameters and running stats of random inputs.

    Random-init transformers CNNs keep the default running stats (mean 0, var 1) while their
    real activations are orders of magnitude smaller, so in eval mode the signal shrinks layer
    after layer. Estimating the stats on random batches normalises every BN output again.
    """
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not norms:
        return
    gen = torch.Generator().manual_seed(seed + 7919)
    momenta = []
    with torch.no_grad():
        for bn in norms:
            if bn.affine:
                # Small noise keeps channels distinguishable (a constant output hides bugs).
                bn.weight.copy_(1.0 + 0.1 * torch.randn(bn.weight.shape, generator=gen))
                bn.bias.copy_(0.1 * torch.randn(bn.bias.shape, generator=gen))
            bn.reset_running_stats()
            momenta.append(bn.momentum)
            bn.momentum = None  # cumulative average over the calibration batches
            bn.train()
        for _ in range(batches):
            model(torch.randn((batch, *input_shape[1:]), generator=gen))
        for bn, momentum in zip(norms, momenta):
            bn.momentum = momentum
            bn.eval()


# --------------------------------------------------------------------------------- builders
def _hf_config(cls_name: str, **kwargs: Any) -> Any:
    import transformers

    # Configs are given in full and models built from them directly (never from_pretrained),
    # so nothing here touches the network or the hub cache.
    config = getattr(transformers, cls_name)(**kwargs)
    # Eager attention exports as plain matmul/softmax/mask ops that TVM's importer and the
    # fusion passes see one by one; SDPA (the default) would arrive as a single fused op.
    config._attn_implementation = "eager"
    return config


def _hf_model(model_cls: str, config: Any, **kwargs: Any) -> nn.Module:
    import transformers

    return getattr(transformers, model_cls)(config, **kwargs)


def _text(
    model_cls: str, config_cls: str, output: str, model_kwargs: Mapping[str, Any], **config: Any
) -> Callable[[int], nn.Module]:
    def build(seed: int) -> nn.Module:
        cfg = _hf_config(config_cls, **config)
        return _TextModel(_hf_model(model_cls, cfg, **model_kwargs), output)

    return build


def _vision(
    model_cls: str,
    config_cls: str,
    output: str,
    model_kwargs: Mapping[str, Any],
    input_shape: tuple[int, ...],
    recalibrate: bool,
    **config: Any,
) -> Callable[[int], nn.Module]:
    def build(seed: int) -> nn.Module:
        cfg = _hf_config(config_cls, **config)
        model = _VisionModel(_hf_model(model_cls, cfg, **model_kwargs), output)
        if recalibrate:
            model.eval()
            recalibrate_batchnorm(model, input_shape, seed)
        return model

    return build


def _vgg(input_shape: tuple[int, ...], **kwargs: Any) -> Callable[[int], nn.Module]:
    def build(seed: int) -> nn.Module:
        return _VGG16(image_size=input_shape[-1], **kwargs)

    return build


# ------------------------------------------------------------------------------------ entries
@dataclass(frozen=True)
class ZooEntry:
    """One zoo model: how to build it and its example inputs.

    Attributes
    ----------
    name : str
        Zoo name, e.g. ``"bert-base"`` or ``"bert-base-tiny"``.
    family : str
        ``"nlp"`` or ``"vision"``.
    description : str
        One line saying what the model is and its input size.
    """

    name: str
    family: str
    description: str
    _builder: Callable[[int], nn.Module] = field(repr=False, compare=False)
    _input_shape: tuple[int, ...] = field(repr=False)
    _vocab_size: int | None = field(default=None, repr=False)
    _output_name: str = field(default="output", repr=False)

    def build(self, seed: int = 0) -> nn.Module:
        """Build the model with random weights.

        Parameters
        ----------
        seed : int
            Seeds the weight initialisation; the same seed gives the same weights. The global
            torch RNG state is restored afterwards.

        Returns
        -------
        torch.nn.Module
            The model in eval mode, parameters not requiring grad; ``forward`` takes the tensors
            of :meth:`example_inputs` and returns one tensor.
        """
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = self._builder(seed)
        model.eval()
        model.requires_grad_(False)
        return model

    def example_inputs(self, seed: int = 0) -> tuple[torch.Tensor, ...]:
        """Example inputs of batch 1, drawn from a generator seeded with ``seed``.

        Returns
        -------
        tuple of torch.Tensor
            ``(input_ids,)`` int64 token ids within the vocabulary for text models,
            ``(pixel_values,)`` float32 standard normal NCHW pixels for vision models.
        """
        gen = torch.Generator().manual_seed(seed)
        if self._vocab_size is not None:
            ids = torch.randint(
                0, self._vocab_size, self._input_shape, generator=gen, dtype=torch.int64
            )
            return (ids,)
        return (torch.randn(self._input_shape, generator=gen, dtype=torch.float32),)

    def input_names(self) -> tuple[str, ...]:
        """Names of the model inputs, in order (the ``forward`` argument names).

        Returns
        -------
        tuple of str
            ``("input_ids",)`` for text models, ``("pixel_values",)`` for vision models.
        """
        return ("input_ids",) if self._vocab_size is not None else ("pixel_values",)


def _text_entry(
    name: str,
    description: str,
    *,
    vocab: int,
    seq: int,
    model_cls: str,
    config_cls: str,
    output: str,
    model_kwargs: Mapping[str, Any] | None = None,
    **config: Any,
) -> ZooEntry:
    builder = _text(model_cls, config_cls, output, model_kwargs or {}, vocab_size=vocab, **config)
    return ZooEntry(name, "nlp", description, builder, (1, seq), vocab, output)


def _vision_entry(
    name: str,
    description: str,
    *,
    image: int,
    model_cls: str,
    config_cls: str,
    output: str,
    model_kwargs: Mapping[str, Any] | None = None,
    recalibrate: bool = False,
    **config: Any,
) -> ZooEntry:
    shape = (1, 3, image, image)
    builder = _vision(
        model_cls, config_cls, output, model_kwargs or {}, shape, recalibrate, **config
    )
    return ZooEntry(name, "vision", description, builder, shape, None, output)


def _vgg_entry(name: str, description: str, *, image: int, **kwargs: Any) -> ZooEntry:
    shape = (1, 3, image, image)
    return ZooEntry(name, "vision", description, _vgg(shape, **kwargs), shape, None, "logits")


_NO_POOLER = {"add_pooling_layer": False}
# Shared by the tiny BERT, ALBERT and ViT configs.
_TINY_ENCODER = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 128,
}
_TINY_IMAGE = 64


def _make_entries() -> list[ZooEntry]:
    seq, tseq, img, timg = _SEQ_LEN, _TINY_SEQ_LEN, _IMAGE, _TINY_IMAGE
    return [
        # ------------------------------------------------------------------------------ NLP
        _text_entry(
            "bert-base",
            f"BERT-base encoder (12 layers, hidden 768), seq {seq}",
            vocab=30522,
            seq=seq,
            model_cls="BertModel",
            config_cls="BertConfig",
            output="last_hidden_state",
            model_kwargs=_NO_POOLER,
        ),
        _text_entry(
            "bert-base-tiny",
            f"BERT encoder, tiny (2 layers, hidden 64), seq {tseq}",
            vocab=1000,
            seq=tseq,
            model_cls="BertModel",
            config_cls="BertConfig",
            output="last_hidden_state",
            model_kwargs=_NO_POOLER,
            max_position_embeddings=64,
            **_TINY_ENCODER,
        ),
        _text_entry(
            "albert-base",
            f"ALBERT-base encoder (12 shared layers, hidden 768, embedding 128), seq {seq}",
            vocab=30000,
            seq=seq,
            model_cls="AlbertModel",
            config_cls="AlbertConfig",
            output="last_hidden_state",
            model_kwargs=_NO_POOLER,
            embedding_size=128,
            hidden_size=768,
            num_hidden_layers=12,
            num_attention_heads=12,
            intermediate_size=3072,
        ),
        _text_entry(
            "albert-base-tiny",
            f"ALBERT encoder, tiny (2 shared layers, hidden 64, embedding 32), seq {tseq}",
            vocab=1000,
            seq=tseq,
            model_cls="AlbertModel",
            config_cls="AlbertConfig",
            output="last_hidden_state",
            model_kwargs=_NO_POOLER,
            embedding_size=32,
            max_position_embeddings=64,
            **_TINY_ENCODER,
        ),
        _text_entry(
            "gpt2",
            f"GPT-2 small LM (12 layers, hidden 768), logits, seq {seq}",
            vocab=50257,
            seq=seq,
            model_cls="GPT2LMHeadModel",
            config_cls="GPT2Config",
            output="logits",
            use_cache=False,
        ),
        _text_entry(
            "gpt2-tiny",
            f"GPT-2 LM, tiny (2 layers, hidden 64), logits, seq {tseq}",
            vocab=1000,
            seq=tseq,
            model_cls="GPT2LMHeadModel",
            config_cls="GPT2Config",
            output="logits",
            use_cache=False,
            # GPT-2's special token 50256 lies outside the tiny vocabulary.
            bos_token_id=999,
            eos_token_id=999,
            n_embd=64,
            n_layer=2,
            n_head=4,
            n_positions=64,
        ),
        _text_entry(
            "t5-encoder",
            f"T5-small encoder (6 layers, d_model 512), seq {seq}",
            vocab=32128,
            seq=seq,
            model_cls="T5EncoderModel",
            config_cls="T5Config",
            output="last_hidden_state",
            d_model=512,
            d_ff=2048,
            num_layers=6,
            num_heads=8,
            d_kv=64,
            use_cache=False,
        ),
        _text_entry(
            "t5-encoder-tiny",
            f"T5 encoder, tiny (2 layers, d_model 64), seq {tseq}",
            vocab=1000,
            seq=tseq,
            model_cls="T5EncoderModel",
            config_cls="T5Config",
            output="last_hidden_state",
            d_model=64,
            d_ff=128,
            num_layers=2,
            num_heads=4,
            d_kv=16,
            use_cache=False,
        ),
        _text_entry(
            "llama",
            f"LLaMA-style decoder LM (2 layers, hidden 512, RMSNorm, SwiGLU), logits, seq {seq}",
            vocab=32000,
            seq=seq,
            model_cls="LlamaForCausalLM",
            config_cls="LlamaConfig",
            output="logits",
            hidden_size=512,
            intermediate_size=1376,
            num_hidden_layers=2,
            num_attention_heads=8,
            num_key_value_heads=8,
            use_cache=False,
        ),
        _text_entry(
            "llama-tiny",
            f"LLaMA-style decoder LM, tiny (2 layers, hidden 64), logits, seq {tseq}",
            vocab=1000,
            seq=tseq,
            model_cls="LlamaForCausalLM",
            config_cls="LlamaConfig",
            output="logits",
            hidden_size=64,
            intermediate_size=176,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=4,
            max_position_embeddings=64,
            use_cache=False,
        ),
        # --------------------------------------------------------------------------- vision
        _vision_entry(
            "vit",
            f"ViT-B/16 encoder (12 layers, hidden 768), image {img}",
            image=img,
            model_cls="ViTModel",
            config_cls="ViTConfig",
            output="last_hidden_state",
            model_kwargs=_NO_POOLER,
        ),
        _vision_entry(
            "vit-tiny",
            "ViT encoder, tiny (2 layers, hidden 64, patch 8), image 32",
            image=32,
            model_cls="ViTModel",
            config_cls="ViTConfig",
            output="last_hidden_state",
            model_kwargs=_NO_POOLER,
            image_size=32,
            patch_size=8,
            **_TINY_ENCODER,
        ),
        _vision_entry(
            "resnet50",
            f"ResNet-50 classifier, 1000 classes, image {img}",
            image=img,
            model_cls="ResNetForImageClassification",
            config_cls="ResNetConfig",
            output="logits",
            recalibrate=True,
            num_labels=1000,
        ),
        _vision_entry(
            "resnet50-tiny",
            f"ResNet bottleneck classifier, tiny (4 stages of 1 block), 10 classes, image {timg}",
            image=timg,
            model_cls="ResNetForImageClassification",
            config_cls="ResNetConfig",
            output="logits",
            recalibrate=True,
            num_labels=10,
            embedding_size=16,
            hidden_sizes=[32, 64, 128, 256],
            depths=[1, 1, 1, 1],
        ),
        _vision_entry(
            "mobilenetv2",
            f"MobileNetV2 1.0 classifier, 1000 classes, image {img}",
            image=img,
            model_cls="MobileNetV2ForImageClassification",
            config_cls="MobileNetV2Config",
            output="logits",
            recalibrate=True,
            num_labels=1000,
        ),
        _vision_entry(
            "mobilenetv2-tiny",
            f"MobileNetV2 0.25 classifier, 10 classes, image {timg}",
            image=timg,
            model_cls="MobileNetV2ForImageClassification",
            config_cls="MobileNetV2Config",
            output="logits",
            recalibrate=True,
            num_labels=10,
            depth_multiplier=0.25,
            image_size=timg,
        ),
        _vision_entry(
            "efficientnet-b0",
            f"EfficientNet-B0 classifier, 1000 classes, image {img}",
            image=img,
            model_cls="EfficientNetForImageClassification",
            config_cls="EfficientNetConfig",
            output="logits",
            recalibrate=True,
            num_labels=1000,
            # EfficientNetConfig's defaults are B7's; these are google/efficientnet-b0's.
            width_coefficient=1.0,
            depth_coefficient=1.0,
            image_size=img,
            dropout_rate=0.2,
            hidden_dim=1280,
        ),
        _vision_entry(
            "efficientnet-b0-tiny",
            f"EfficientNet classifier, tiny (width 0.25, 1 block per stage), 10 classes, "
            f"image {timg}",
            image=timg,
            model_cls="EfficientNetForImageClassification",
            config_cls="EfficientNetConfig",
            output="logits",
            recalibrate=True,
            num_labels=10,
            width_coefficient=0.25,
            depth_coefficient=0.1,  # ceil(0.1 * repeats) = 1 block per stage
            image_size=timg,
            dropout_rate=0.2,
            hidden_dim=320,  # round_filters(1280) at width 0.25
        ),
        _vgg_entry(
            "vgg16",
            f"VGG-16 classifier (13 conv + 3 FC), 1000 classes, image {img}",
            image=img,
        ),
        _vgg_entry(
            "vgg16-tiny",
            "VGG-16 layout, tiny (channels / 16, FC 64), 10 classes, image 32",
            image=32,
            width_divisor=16,
            hidden=64,
            num_classes=10,
        ),
    ]


# Built once at import and read-only afterwards.
_ENTRIES: Mapping[str, ZooEntry] = MappingProxyType({e.name: e for e in _make_entries()})


@contextlib.contextmanager
def _quiet_loggers(names: tuple[str, ...]) -> Iterator[None]:
    loggers = [logging.getLogger(n) for n in names]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


# --------------------------------------------------------------------------------- public API
def quiet_export_loggers() -> contextlib.AbstractContextManager[None]:
    """Silence the exporters' noisy loggers for the duration of a ``torch.onnx.export``."""
    return _quiet_loggers(_NOISY_EXPORT_LOGGERS)


def names() -> list[str]:
    """All zoo model names, sorted, ``-tiny`` variants included.

    Returns
    -------
    list of str
    """
    return sorted(_ENTRIES)


def get(name: str) -> ZooEntry:
    """Look up a zoo entry.

    Parameters
    ----------
    name : str
        ``"bert-base"`` or ``"zoo:bert-base"``.

    Returns
    -------
    ZooEntry

    Raises
    ------
    plus_tvm.errors.UnknownModelError
        If no zoo model has that name; the message lists the known names.
    """
    if not isinstance(name, str):
        raise UnknownModelError(f"zoo model names are strings, got {type(name).__name__}")
    key = name[len(_PREFIX) :] if name.startswith(_PREFIX) else name
    try:
        return _ENTRIES[key]
    except KeyError:
        raise UnknownModelError(f"unknown zoo model {key!r}; known: {', '.join(names())}") from None


def load(name: str, seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """Build a zoo model and its example inputs.

    Parameters
    ----------
    name : str
        Zoo name, with or without the ``zoo:`` prefix.
    seed : int
        Seed of the weights and of the example inputs.

    Returns
    -------
    (torch.nn.Module, tuple of torch.Tensor)
        The model in eval mode and inputs of batch 1 for it.
    """
    entry = get(name)
    return entry.build(seed), entry.example_inputs(seed)


def export_onnx(
    name_or_entry: str | ZooEntry,
    path: str | os.PathLike[str],
    seed: int = 0,
    dynamic_batch: bool = False,
    max_seq_len: int | None = None,
) -> str:
    """Export a zoo model to a self-contained ONNX file with ``torch.onnx.export``.

    Parameters
    ----------
    name_or_entry : str or ZooEntry
        The model.
    path : str or os.PathLike
        File to write; weights are stored inside it (no external data file).
    seed : int
        Seed of the weights.
    dynamic_batch : bool
        Make dimension 0 of every input (and so of the output) symbolic, named ``batch``.
    max_seq_len : int, optional
        Make the sequence axis of the token inputs symbolic, ``1..max_seq_len`` (not with
        ``dynamic_batch``).

    Returns
    -------
    str
        ``path``.
    """
    entry = name_or_entry if isinstance(name_or_entry, ZooEntry) else get(name_or_entry)
    model = entry.build(seed)
    args = entry.example_inputs(seed)
    dynamic_shapes = None
    if dynamic_batch:
        batch = torch.export.Dim("batch", min=1, max=1024)
        dynamic_shapes = {n: {0: batch} for n in entry.input_names()}
        # torch.export specialises a dimension of size 1 to a constant (and transformers' mask
        # code then bakes it in), so trace with batch 2.
        args = tuple(torch.cat([a, a]) for a in args)
    elif max_seq_len is not None:
        from .sequence_axis import sequence_dims

        dims = sequence_dims(args, max_seq_len)
        dynamic_shapes = {n: d for n, d in zip(entry.input_names(), dims)}
    path = os.fspath(path)
    with torch.no_grad(), _quiet_loggers(_NOISY_EXPORT_LOGGERS):
        # The dynamo exporter (torch.export + onnxscript) is the maintained path and handles
        # every zoo model; the TorchScript exporter is deprecated.
        torch.onnx.export(
            model,
            args,
            path,
            input_names=list(entry.input_names()),
            output_names=[entry._output_name],
            opset_version=_ONNX_OPSET,
            dynamo=True,
            external_data=False,
            dynamic_shapes=dynamic_shapes,
            verbose=False,
        )
    return path
