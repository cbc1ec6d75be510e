"""What a torch.export / ONNX Runtime user expects of plus_tvm.compile (issue 37): transformers
models with their default ``use_cache``, outputs in the model's own structure, keyword inputs,
ONNX output names, ``dynamic_shapes`` on ``compile``, and models left in training mode."""

from __future__ import annotations

import collections
import io
import json
import warnings

import numpy as np
import plus_tvm
import pytest
import torch
from plus_tvm.errors import InputError, ModelLoadError, OptionsError
from plus_tvm.output_structure import NamedOutputs
from torch import nn


# ----------------------------------------------------------------------------- transformers
def _gpt2():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(
        n_layer=1,
        n_head=2,
        n_embd=16,
        vocab_size=64,
        n_positions=32,
        bos_token_id=0,
        eos_token_id=0,
    )
    return transformers.GPT2LMHeadModel(config).eval()


def test_a_transformers_model_with_its_default_use_cache_compiles():
    model = _gpt2()
    assert model.config.use_cache is True
    ids = torch.randint(0, 64, (1, 8))
    mask = torch.ones(1, 8, dtype=torch.int64)
    with pytest.warns(UserWarning, match="use_cache=False.*compile_lm"):
        cm = plus_tvm.compile(model, example_args=(ids,), example_kwargs={"attention_mask": mask})
    assert model.config.use_cache is True  # the user's config is restored
    out = cm(ids, attention_mask=mask)
    want = model(ids, attention_mask=mask, use_cache=False)
    assert type(out) is type(want) and list(out.keys()) == ["logits"]
    np.testing.assert_allclose(out.logits.numpy(), want.logits.detach().numpy(), atol=1e-4)
    assert cm.output_names == ["logits"] and cm.input_names == ["input_ids", "attention_mask"]
    got = cm(attention_mask=mask.numpy(), input_ids=ids.numpy())["logits"]
    assert isinstance(got, np.ndarray)
    np.testing.assert_allclose(got, want.logits.detach().numpy(), atol=1e-4)
    with pytest.raises(ModelLoadError, match="use_cache=True: the KV cache is no output"):
        plus_tvm.compile(model, example_args=(ids,), example_kwargs={"use_cache": True})


# ---------------------------------------------------------------------------------- outputs
Pair = collections.namedtuple("Pair", "low high")


class Structured(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x):
        y = self.lin(x)
        return {"a": y, "b": (x + 1, [y * 2]), "c": Pair(x.min(), x.max())}


def test_outputs_come_in_the_structure_the_model_returns():
    model = Structured().eval()
    x = torch.randn(2, 4)
    cm = plus_tvm.compile(model, example_args=(x,))
    out, want = cm(x), model(x)
    assert list(out) == ["a", "b", "c"] and isinstance(out["b"], tuple)
    assert isinstance(out["b"][1], list) and isinstance(out["c"], Pair)
    flat_out = [out["a"], out["b"][0], out["b"][1][0], out["c"].low, out["c"].high]
    flat_want = [want["a"], want["b"][0], want["b"][1][0], want["c"].low, want["c"].high]
    for got, ref in zip(flat_out, flat_want):
        np.testing.assert_allclose(got.numpy(), ref.detach().numpy(), rtol=1e-5, atol=1e-5)
    assert cm.output_names == ["a", "b.0", "b.1.0", "c.low", "c.high"]
    assert set(cm.run_named(x.numpy())) == set(cm.output_names)


def test_a_saved_model_keeps_names_and_structure_and_an_old_json_still_loads(tmp_path):
    model = Structured().eval()
    x = torch.randn(2, 4)
    cm = plus_tvm.compile(model, example_args=(x,))
    path = str(tmp_path / "m.so")
    cm.export_library(path)
    loaded = plus_tvm.load(path)
    out = loaded(x=x.numpy())
    assert list(out) == ["a", "b", "c"] and loaded.output_names == cm.output_names
    np.testing.assert_allclose(out["a"], cm(x)["a"].numpy(), rtol=1e-5)
    with open(path + ".json") as f:
        meta = json.load(f)
    meta["io"]["input_names"] = ["x", "y"]  # names that do not fit the inputs
    with open(path + ".json", "w") as f:
        json.dump(meta, f)
    with pytest.raises(ModelLoadError, match="malformed.*2 input names for 1 inputs"):
        plus_tvm.load(path)
    del meta["io"]  # a model exported before the names were kept
    with open(path + ".json", "w") as f:
        json.dump(meta, f)
    old = plus_tvm.load(path)
    flat = old(x.numpy())
    assert isinstance(flat, tuple) and len(flat) == 5 and old.output_names is None
    assert list(old.run_named(x.numpy())) == [f"output{i}" for i in range(5)]


def test_named_outputs_read_by_key_attribute_and_position():
    out = NamedOutputs(logits=1, hidden=2)
    assert out.logits == out["logits"] == out[0] == 1 and out.to_tuple() == (1, 2)
    with pytest.raises(AttributeError, match="no output 'loss'"):
        _ = out.loss


# --------------------------------------------------------------------------- keyword inputs
class ThreeInputs(nn.Module):
    def forward(self, input_ids, attention_mask=None, scale=None):
        return input_ids * attention_mask + scale


def test_keyword_inputs_bind_as_python_binds_a_call():
    model = ThreeInputs().eval()
    a, m, s = torch.randn(2, 3), torch.randn(2, 3), torch.randn(2, 3)
    # keyword examples in another order: the inputs follow forward's signature
    kwargs = {"scale": s, "attention_mask": m}
    cm = plus_tvm.compile(model, example_args=(a,), example_kwargs=kwargs)
    assert cm.input_names == ["input_ids", "attention_mask", "scale"]
    want = (a * m + s).numpy()
    for got in (
        cm(a, m, s),
        cm(a, scale=s, attention_mask=m),
        cm(input_ids=a, attention_mask=m, scale=s),
    ):
        np.testing.assert_allclose(got.numpy(), want, atol=1e-6)
    with pytest.raises(InputError, match="no input named 'mask'.*input_ids, attention_mask"):
        cm(a, mask=m, scale=s)
    with pytest.raises(InputError, match="missing input.*'scale'"):
        cm(a, attention_mask=m)
    with pytest.raises(InputError, match="'input_ids' given twice"):
        cm(a, input_ids=a, attention_mask=m, scale=s)
    with pytest.raises(InputError, match="takes 3 input"):
        cm(a, m, s, a, scale=s)


def test_a_dict_of_example_inputs_is_keyword_inputs():
    model = ThreeInputs().eval()
    a, m, s = torch.randn(2, 3), torch.randn(2, 3), torch.randn(2, 3)
    cm = plus_tvm.compile(model, example_args={"scale": s, "attention_mask": m, "input_ids": a})
    assert cm.input_names == ["input_ids", "attention_mask", "scale"]
    got = cm(scale=s, input_ids=a, attention_mask=m).numpy()
    np.testing.assert_allclose(got, (a * m + s).numpy(), atol=1e-6)
    with pytest.raises(ModelLoadError, match="given in example_args and example_kwargs"):
        plus_tvm.compile(model, example_args={"scale": s}, example_kwargs={"scale": s})


class Flags(nn.Module):
    def forward(self, x, double=False, pair=True):
        y = x * 2 if double else x
        return (y, y + 1) if pair else y


def test_plain_keyword_values_are_bound_into_the_export():
    model = Flags().eval()
    x = torch.randn(2, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # (no use_cache warning: none is on)
        cm = plus_tvm.compile(
            model, example_args=(x,), example_kwargs={"double": True, "pair": False}
        )
    assert cm.input_names == ["x"] and "forward" not in vars(model)  # the module is untouched
    np.testing.assert_allclose(cm(x).numpy(), (x * 2).numpy())


# ------------------------------------------------------------------------------------- ONNX
def _onnx_model():
    class TwoOut(nn.Module):
        def forward(self, x):
            return x * 2, x + 1

    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            TwoOut(),
            (torch.randn(2, 3),),
            buf,
            input_names=["input.1"],
            output_names=["y", "z"],
            dynamo=False,
        )
    import onnx

    return onnx.load_from_string(buf.getvalue())


def test_onnx_input_and_output_names_are_kept():
    cm = plus_tvm.compile(_onnx_model())
    x = np.random.default_rng(0).standard_normal((2, 3)).astype("float32")
    assert cm.output_names == ["y", "z"] and cm.input_names == ["input.1"]
    y, z = cm.run(None, {"input.1": x})
    np.testing.assert_allclose(y, x * 2, rtol=1e-6)
    (only_z,) = cm.run(["z"], {"input.1": x})
    np.testing.assert_allclose(only_z, x + 1, rtol=1e-6)
    named = cm.run_named(x)
    assert list(named) == ["y", "z"]
    np.testing.assert_allclose(cm(**{"input.1": x})[1], named["z"])
    with pytest.raises(InputError, match=r"no output\(s\) \['w'\].*\['y', 'z'\]"):
        cm.run(["w"], {"input.1": x})


def test_plus_tvm_run_writes_the_onnx_output_names(tmp_path, capsys):
    from plus_tvm import cli

    path = tmp_path / "two.onnx"
    path.write_bytes(_onnx_model().SerializeToString())
    x = np.ones((2, 3), "float32")
    np.savez(tmp_path / "in.npz", **{"input.1": x})
    out = tmp_path / "out.npz"
    argv = ["run", str(path), "--inputs", str(tmp_path / "in.npz"), "--output", str(out)]
    assert cli.main(argv) == 0
    assert "y: shape (2, 3)" in capsys.readouterr().out
    saved = np.load(out)
    assert sorted(saved.files) == ["y", "z"]
    np.testing.assert_allclose(saved["z"], x + 1)


# --------------------------------------------------------------------------- dynamic shapes
def test_compile_takes_dynamic_shapes():
    model = nn.Sequential(nn.Linear(4, 5), nn.ReLU()).eval()
    batch = torch.export.Dim("batch", min=1, max=64)
    cm = plus_tvm.compile(
        model, example_args=(torch.randn(3, 4),), dynamic_shapes={"input": {0: batch}}
    )
    assert isinstance(cm.inputs[0].shape[0], str)  # a symbolic dim
    for n in (2, 7):
        x = torch.randn(n, 4)
        np.testing.assert_allclose(cm(x).numpy(), model(x).detach().numpy(), atol=1e-5)
    with pytest.raises(InputError, match="compiled for"):
        cm(torch.randn(65, 4))  # beyond the Dim's max


# ---------------------------------------------------------------------------- training mode
class WithDropout(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.norm = nn.BatchNorm1d(4)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(self.norm(self.lin(x)))


def test_a_model_in_training_mode_is_refused_naming_the_module():
    model = WithDropout()  # (a new module is in training mode)
    x = torch.randn(3, 4)
    refused = r"training mode: BatchNorm1d at 'norm'.*model\.eval\(\)"
    with pytest.raises(ModelLoadError, match=refused):
        plus_tvm.compile(model, example_args=(x,))
    assert model.training and model.norm.training  # never flipped
    # a module in training mode whose graph does not depend on it compiles
    plain = nn.Linear(4, 2)
    np.testing.assert_allclose(
        plus_tvm.compile(plain, example_args=(x,))(x).numpy(), plain(x).detach(), atol=1e-6
    )


def test_train_mode_eval_compiles_an_eval_copy():
    model = WithDropout()
    x = torch.randn(3, 4)
    with torch.no_grad():
        model.norm.running_mean.fill_(0.5)
    cm = plus_tvm.compile(model, example_args=(x,), options=plus_tvm.Options(train_mode="eval"))
    assert model.training and model.drop.training  # the user's module keeps its mode
    want = WithDropout.forward(model.eval(), x).detach().numpy()
    np.testing.assert_allclose(cm(x).numpy(), want, atol=1e-5)
    with pytest.raises(OptionsError, match="train_mode='train' is not one of"):
        plus_tvm.Options(train_mode="train")


def test_only_ops_that_differ_in_training_count():
    from plus_tvm.torch_model_prep import training_ops

    class Recurrent(nn.Module):
        def __init__(self, dropout: float) -> None:
            super().__init__()
            self.rnn = nn.LSTM(4, 4, num_layers=2, batch_first=True, dropout=dropout)

        def forward(self, x):
            return nn.functional.dropout(self.rnn(x)[0], 0.0, training=self.training)

    x = torch.randn(1, 3, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (torch's note on the LSTM's flat weights)
        same = torch.export.export(Recurrent(0.0), (x,))
        differs = torch.export.export(Recurrent(0.3), (x,))
    assert training_ops(same) == []  # dropout of probability 0: the same in both modes
    assert training_ops(differs) == [("rnn", "LSTM", "lstm")]


def test_a_transformers_model_built_from_its_config_is_in_training_mode():
    model = _gpt2().train()  # (a model built from a config, not from_pretrained)
    ids = torch.randint(0, 64, (1, 8))
    with pytest.raises(ModelLoadError, match="Dropout at 'transformer.drop' runs dropout"):
        plus_tvm.compile(model, example_args=(ids,))
    assert model.config.use_cache is True and model.training
