"""A suite of transformers architectures outside the zoo, built from small configs (issue 13).

Each entry is data: the transformers model and config classes, the config's fields, and the
kind of input (``text``: token ids; ``image``: pixels; ``seq2seq``: encoder and decoder ids;
``audio``: log-mel features). Models are built with random weights from the config alone
(nothing is downloaded) and keep transformers' defaults, attention implementation included
(SDPA), as a user would run them; ``forward`` returns the first tensor of the model's output.
Vision models get the zoo's BatchNorm recalibration (random statistics make outputs vanish).
``tiny`` sizes serve the tests, ``small`` ones the ``scripts/arch_suite`` benchmark.

Examples
--------
>>> from plus_tvm import arch_suite
>>> model, inputs = arch_suite.load("roberta")  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import torch
from torch import nn

from .errors import UnknownModelError
from .zoo import recalibrate_batchnorm

__all__ = ["ENTRIES", "FAMILIES", "load", "names"]

_TEXT = {"vocab_size": 100, "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2}
_ENC = {
    **_TEXT,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 64,
    "max_position_embeddings": 64,
}
_DEC = {**_ENC, "num_key_value_heads": 2}
_MOE = {**_DEC, "num_local_experts": 4, "num_experts_per_tok": 2}
_S2S = {
    **_TEXT,
    "d_model": 32,
    "encoder_layers": 1,
    "decoder_layers": 1,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "encoder_ffn_dim": 64,
    "decoder_ffn_dim": 64,
    "max_position_embeddings": 64,
}
_VIT = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 64,
    "image_size": 32,
    "patch_size": 8,
}


def _e(family: str, model: str, config: str, kind: str, **fields: Any) -> Mapping[str, Any]:
    return MappingProxyType(
        {"family": family, "model": model, "config": config, "kind": kind, "fields": fields}
    )


ENTRIES: Mapping[str, Mapping[str, Any]] = MappingProxyType(
    {
        # encoders
        "bert": _e("encoder", "BertModel", "BertConfig", "text", **_ENC),
        "roberta": _e("encoder", "RobertaModel", "RobertaConfig", "text", **_ENC),
        "xlm-roberta": _e("encoder", "XLMRobertaModel", "XLMRobertaConfig", "text", **_ENC),
        "camembert": _e("encoder", "CamembertModel", "CamembertConfig", "text", **_ENC),
        "distilbert": _e(
            "encoder",
            "DistilBertModel",
            "DistilBertConfig",
            "text",
            **_TEXT,
            dim=32,
            n_layers=2,
            n_heads=4,
            hidden_dim=64,
            max_position_embeddings=64,
        ),
        "electra": _e(
            "encoder", "ElectraModel", "ElectraConfig", "text", embedding_size=32, **_ENC
        ),
        "mpnet": _e("encoder", "MPNetModel", "MPNetConfig", "text", **_ENC),
        "deberta": _e("encoder", "DebertaModel", "DebertaConfig", "text", **_ENC),
        "deberta-v2": _e(
            "encoder",
            "DebertaV2Model",
            "DebertaV2Config",
            "text",
            relative_attention=True,
            position_buckets=8,
            pos_att_type=["p2c", "c2p"],
            **_ENC,
        ),
        "ernie": _e("encoder", "ErnieModel", "ErnieConfig", "text", **_ENC),
        # ConvBERT's span-based convolution indexes an unfold (x[:, i, j] with a slice first)
        "convbert": _e(
            "encoder",
            "ConvBertModel",
            "ConvBertConfig",
            "text",
            embedding_size=32,
            conv_kernel_size=3,
            head_ratio=2,
            **_ENC,
        ),
        # Funnel: relative positions from arange(n, -n, -1), pooling, an upsampling decoder
        "funnel": _e(
            "encoder",
            "FunnelModel",
            "FunnelConfig",
            "text",
            **_TEXT,
            block_sizes=[1, 1],
            block_repeats=[1, 1],
            d_model=32,
            n_head=4,
            d_head=8,
            d_inner=64,
            num_decoder_layers=1,
        ),
        # Reformer: chunked local attention, its softmax through logsumexp (amax)
        "reformer": _e(
            "encoder",
            "ReformerModel",
            "ReformerConfig",
            "text",
            **_TEXT,
            hidden_size=32,
            num_attention_heads=2,
            attention_head_size=16,
            feed_forward_size=64,
            attn_layers=["local", "local"],
            local_attn_chunk_length=4,
            axial_pos_embds=False,
            max_position_embeddings=64,
            is_decoder=False,
        ),
        "mobilebert": _e(
            "encoder",
            "MobileBertModel",
            "MobileBertConfig",
            "text",
            embedding_size=16,
            intra_bottleneck_size=32,
            true_hidden_size=32,
            num_feedforward_networks=1,
            **_ENC,
        ),
        # decoders
        "gpt-neo": _e(
            "decoder",
            "GPTNeoModel",
            "GPTNeoConfig",
            "text",
            **_TEXT,
            hidden_size=32,
            num_layers=2,
            num_heads=4,
            attention_types=[[["global", "local"], 1]],
            window_size=8,
            max_position_embeddings=64,
        ),
        "gptj": _e(
            "decoder",
            "GPTJModel",
            "GPTJConfig",
            "text",
            **_TEXT,
            n_embd=32,
            n_layer=2,
            n_head=4,
            rotary_dim=4,
            n_positions=64,
        ),
        "gpt-neox": _e("decoder", "GPTNeoXModel", "GPTNeoXConfig", "text", **_ENC),
        "gpt-bigcode": _e(
            "decoder",
            "GPTBigCodeModel",
            "GPTBigCodeConfig",
            "text",
            **_TEXT,
            n_embd=32,
            n_layer=2,
            n_head=4,
            n_positions=64,
            multi_query=True,
        ),
        "opt": _e(
            "decoder",
            "OPTModel",
            "OPTConfig",
            "text",
            **_TEXT,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            ffn_dim=64,
            word_embed_proj_dim=32,
            max_position_embeddings=64,
        ),
        "bloom": _e(
            "decoder",
            "BloomModel",
            "BloomConfig",
            "text",
            **_TEXT,
            hidden_size=32,
            n_layer=2,
            n_head=4,
        ),
        "falcon": _e(
            "decoder",
            "FalconModel",
            "FalconConfig",
            "text",
            **_TEXT,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            multi_query=True,
            new_decoder_architecture=False,
        ),
        "mistral": _e("decoder", "MistralModel", "MistralConfig", "text", **_DEC),
        "qwen2": _e("decoder", "Qwen2Model", "Qwen2Config", "text", **_DEC),
        "qwen3": _e("decoder", "Qwen3Model", "Qwen3Config", "text", head_dim=8, **_DEC),
        "gemma": _e("decoder", "GemmaModel", "GemmaConfig", "text", head_dim=8, **_DEC),
        # mixture of experts: router, top-k, histc, grouped expert matmuls
        "mixtral": _e("decoder", "MixtralModel", "MixtralConfig", "text", **_MOE),
        "qwen2-moe": _e(
            "decoder",
            "Qwen2MoeModel",
            "Qwen2MoeConfig",
            "text",
            moe_intermediate_size=32,
            shared_expert_intermediate_size=64,
            num_experts=4,
            **_DEC,
        ),
        "olmoe": _e("decoder", "OlmoeModel", "OlmoeConfig", "text", num_experts=4, **_MOE),
        "phi": _e("decoder", "PhiModel", "PhiConfig", "text", **_ENC),
        "phi3": _e("decoder", "Phi3Model", "Phi3Config", "text", **_DEC),
        "stablelm": _e("decoder", "StableLmModel", "StableLmConfig", "text", **_DEC),
        "olmo": _e("decoder", "OlmoModel", "OlmoConfig", "text", **_DEC),
        "codegen": _e(
            "decoder",
            "CodeGenModel",
            "CodeGenConfig",
            "text",
            **_TEXT,
            n_embd=32,
            n_layer=2,
            n_head=4,
            rotary_dim=4,
            n_positions=64,
            n_ctx=64,
        ),
        # encoder-decoders
        "bart": _e("encoder-decoder", "BartModel", "BartConfig", "seq2seq", **_S2S),
        "mbart": _e("encoder-decoder", "MBartModel", "MBartConfig", "seq2seq", **_S2S),
        "pegasus": _e("encoder-decoder", "PegasusModel", "PegasusConfig", "seq2seq", **_S2S),
        "marian": _e(
            "encoder-decoder",
            "MarianModel",
            "MarianConfig",
            "seq2seq",
            decoder_vocab_size=100,
            **_S2S,
        ),
        "t5": _e(
            "encoder-decoder",
            "T5Model",
            "T5Config",
            "seq2seq",
            **_TEXT,
            d_model=32,
            d_kv=8,
            d_ff=64,
            num_layers=1,
            num_heads=4,
        ),
        # vision
        "vit": _e("vision", "ViTModel", "ViTConfig", "image", **_VIT),
        "deit": _e("vision", "DeiTModel", "DeiTConfig", "image", **_VIT),
        "beit": _e("vision", "BeitModel", "BeitConfig", "image", **_VIT),
        "dinov2": _e("vision", "Dinov2Model", "Dinov2Config", "image", **_VIT),
        "swin": _e(
            "vision",
            "SwinModel",
            "SwinConfig",
            "image",
            image_size=32,
            patch_size=4,
            embed_dim=16,
            depths=[1, 1],
            num_heads=[2, 2],
            window_size=4,
        ),
        "convnext": _e(
            "vision",
            "ConvNextModel",
            "ConvNextConfig",
            "image",
            image_size=32,
            hidden_sizes=[8, 16],
            depths=[1, 1],
            num_stages=2,
        ),
        "resnet": _e(
            "vision",
            "ResNetModel",
            "ResNetConfig",
            "image",
            embedding_size=8,
            hidden_sizes=[8, 16],
            depths=[1, 1],
            layer_type="bottleneck",
        ),
        "regnet": _e(
            "vision",
            "RegNetModel",
            "RegNetConfig",
            "image",
            embedding_size=8,
            hidden_sizes=[8, 16],
            depths=[1, 1],
            groups_width=4,
        ),
        "mobilevit": _e(
            "vision",
            "MobileViTModel",
            "MobileViTConfig",
            "image",
            image_size=32,
            hidden_sizes=[16, 24, 32],
            neck_hidden_sizes=[8, 8, 16, 16, 24, 24, 32],
        ),
        # audio
        "whisper": _e(
            "encoder-decoder",
            "WhisperModel",
            "WhisperConfig",
            "audio",
            **_S2S,
            num_mel_bins=16,
            max_source_positions=16,
            max_target_positions=64,
        ),
    }
)
FAMILIES = ("encoder", "decoder", "encoder-decoder", "vision")
_SEQ = 12
_IMAGE = 32


class _FirstOutput(nn.Module):
    """The model's first output tensor (``last_hidden_state`` for the base models)."""

    def __init__(self, model: nn.Module, kind: str) -> None:
        super().__init__()
        self.model = model
        self.kind = kind

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        names = {
            "text": ("input_ids",),
            "image": ("pixel_values",),
            "seq2seq": ("input_ids", "decoder_input_ids"),
            "audio": ("input_features", "decoder_input_ids"),
        }[self.kind]
        return self.model(**dict(zip(names, inputs)))[0]


def names() -> list[str]:
    """Every architecture of the suite."""
    return list(ENTRIES)


def load(
    name: str, seed: int = 0, attention: str | None = None
) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """The model (eval mode, random weights from ``seed``) and example inputs of ``name``;
    ``attention`` picks transformers' attention implementation (``"eager"``, ``"sdpa"``;
    default: transformers' own default, SDPA where the model supports it)."""
    if name not in ENTRIES:
        raise UnknownModelError(f"unknown suite architecture {name!r}; known: {', '.join(ENTRIES)}")
    import transformers

    entry = ENTRIES[name]
    torch.manual_seed(seed)
    config = getattr(transformers, entry["config"])(**entry["fields"])
    if attention is not None:
        config._attn_implementation = attention
    model = _FirstOutput(getattr(transformers, entry["model"])(config), entry["kind"]).eval()
    inputs = inputs_of(entry, seed)
    if entry["kind"] == "image":  # random BatchNorm statistics let the activations vanish
        recalibrate_batchnorm(model, tuple(inputs[0].shape), seed)
    return model, inputs


def inputs_of(entry: Mapping[str, Any], seed: int) -> tuple[torch.Tensor, ...]:
    """Example inputs of an entry, drawn from ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    vocab = entry["fields"].get("vocab_size", 100)
    ids = torch.randint(3, vocab, (1, _SEQ), generator=gen)
    if entry["kind"] == "text":
        return (ids,)
    if entry["kind"] == "seq2seq":
        return ids, torch.randint(3, vocab, (1, _SEQ // 2), generator=gen)
    if entry["kind"] == "audio":
        mels = entry["fields"]["num_mel_bins"]
        frames = 2 * entry["fields"]["max_source_positions"]
        features = torch.randn(1, mels, frames, generator=gen)
        return features, torch.randint(3, vocab, (1, _SEQ // 2), generator=gen)
    return (torch.randn(1, 3, _IMAGE, _IMAGE, generator=gen),)
