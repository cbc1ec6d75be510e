"""Bad input to compile_lm and CompiledLM.generate (issue 38): a clear plus_tvm error naming the
limit, raised before anything runs (the compiled steps here refuse to be called)."""

from __future__ import annotations

import plus_tvm
import pytest
import torch
from plus_tvm.errors import InputError, ModelLoadError, OptionsError
from plus_tvm.lm.checks import Limits
from plus_tvm.lm.compiled_lm import CompiledLM
from plus_tvm.lm.export import CacheLayout


class _MustNotRun:
    stats: dict = {}

    def __call__(self, *args, **kwargs):
        raise AssertionError("a compiled step ran on input that should have been refused")


@pytest.fixture
def lm() -> CompiledLM:
    layout = CacheLayout(((2, 8), (2, 8)), torch.float32)
    limits = Limits(max_batch=2, max_length=16, vocab_size=100)
    return CompiledLM(_MustNotRun(), _MustNotRun(), layout, limits, eos_token_id=2)


def _ids(batch: int, length: int) -> torch.Tensor:
    return torch.randint(3, 100, (batch, length))


@pytest.mark.parametrize(
    "ids,new,message",
    [
        (_ids(1, 12), 5, "prompt length 12 + max_new_tokens 5 = 17 is above max_length=16"),
        (_ids(1, 17), 0, "is above max_length=16"),
        (_ids(3, 4), 2, "batch 3 is above max_batch=2"),
        (_ids(1, 0), 2, "empty prompt"),
        (_ids(0, 4), 2, "the batch is empty"),
        (
            torch.tensor([[5, 100, 7]]),
            2,
            "token id 100 in input_ids is outside the vocabulary [0, 100)",
        ),
        (torch.tensor([[5, -1, 7]]), 2, "token id -1 in input_ids is outside the vocabulary"),
        (torch.tensor([5, 6, 7]), 2, "must be 2-D [batch, length]"),
        (torch.tensor([[5.0, 6.0]]), 2, "must hold integers"),
        (_ids(1, 4), -1, "max_new_tokens must be >= 0"),
        (_ids(1, 4), 2.5, "max_new_tokens must be an int"),
    ],
)
def test_refused_before_anything_runs(lm, ids, new, message):
    with pytest.raises(InputError, match="generate: ") as err:
        lm.generate(ids, new)
    assert message in str(err.value)


@pytest.mark.parametrize(
    "mask,message",
    [
        (torch.tensor([[1, 1, 1, 0]]), "must pad on the left"),
        (torch.tensor([[1, 0, 1, 1]]), "must pad on the left"),
        (torch.tensor([[0, 2, 1, 1]]), "only 0 and 1"),
        (torch.tensor([[1, 1, 1]]), "attention_mask has shape (1, 3), input_ids (1, 4)"),
    ],
)
def test_bad_attention_mask(lm, mask, message):
    with pytest.raises(InputError) as err:
        lm.generate(_ids(1, 4), 2, attention_mask=mask)
    assert message in str(err.value)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"eos_token_id": 100}, "eos_token_id 100 is not a token id in [0, 100)"),
        ({"do_sample": True, "temperature": 0.0}, "temperature must be > 0"),
        ({"top_p": 0.0}, "top_p must be in (0, 1]"),
        ({"top_k": -1}, "top_k must be an integer >= 0"),
    ],
)
def test_bad_generation_settings(lm, kwargs, message):
    with pytest.raises(InputError) as err:
        lm.generate(_ids(1, 4), 2, **kwargs)
    assert message in str(err.value)


def test_no_new_tokens_returns_the_prompt(lm):
    ids = _ids(2, 4)
    assert torch.equal(lm.generate(ids, 0), ids)


@pytest.mark.parametrize(
    "kwargs,error,message",
    [
        ({"max_batch": 0}, OptionsError, "max_batch must be an int >= 1"),
        ({"max_length": 2}, OptionsError, "max_length must be an int >= 3"),
        ({"max_batch": True}, OptionsError, "max_batch must be an int"),
    ],
)
def test_compile_lm_limits(kwargs, error, message):
    model = torch.nn.Linear(2, 2)
    with pytest.raises(error) as err:
        plus_tvm.compile_lm(model, **kwargs)
    assert message in str(err.value)


def test_compile_lm_needs_a_causal_lm():
    with pytest.raises(ModelLoadError, match="takes no cache"):
        plus_tvm.compile_lm(torch.nn.Linear(2, 2).eval())
    with pytest.raises(ModelLoadError, match="expects a torch causal LM module"):
        plus_tvm.compile_lm("zoo:gpt2")


def test_compile_lm_refuses_a_training_model():
    from plus_tvm.lm.models import load_causal_lm

    model = load_causal_lm("arch:gpt2").train()
    with pytest.raises(ModelLoadError, match="training mode"):
        plus_tvm.compile_lm(model)


def test_unknown_model_reference():
    from plus_tvm.errors import UnknownModelError
    from plus_tvm.lm.models import load_causal_lm

    with pytest.raises(UnknownModelError, match="arch:bert"):
        load_causal_lm("arch:bert")
    with pytest.raises(UnknownModelError, match="not a causal LM"):
        load_causal_lm("zoo:bert-base-tiny")


def test_max_batch_two_compiles_and_refuses_three():
    """max_batch equal to the export's example batch (2): the program once came out with sizes
    TVM could not infer (GPT-2's view failed to import); the compiled range is wider than the
    limit, which generate enforces."""
    from plus_tvm.lm.models import load_causal_lm

    model = load_causal_lm("arch:gpt2")
    compiled = plus_tvm.compile_lm(model, max_batch=2, max_length=16)
    ids = torch.randint(3, 100, (2, 4))
    out = compiled.generate(ids, 3, eos_token_id=[])
    ref = model.generate(
        ids, max_new_tokens=3, min_new_tokens=3, do_sample=False, eos_token_id=[], use_cache=True
    )
    assert torch.equal(out, ref)
    with pytest.raises(InputError, match="batch 3 is above max_batch=2"):
        compiled.generate(torch.randint(3, 100, (3, 4)), 2)
