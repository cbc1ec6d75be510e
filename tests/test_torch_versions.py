"""The C++ pass over torch version counters that a CompiledModel runs before every call
(``runtime/native/torch_versions.cc``) and the Python reading it replaces."""

from __future__ import annotations

import pytest
import torch
from plus_tvm.compiled_model import WeightSource, _Followed
from plus_tvm.runtime.native import torch_versions


def _reader(tensors):
    reader = torch_versions.reader(tensors, [t._version for t in tensors])
    if reader is None:
        pytest.skip(f"no torch_versions library here: {torch_versions.unavailable_reason()}")
    return reader


def test_the_first_tensor_changed_in_place_is_found():
    base = torch.zeros(4, 6)
    tensors = [torch.ones(3), torch.nn.Parameter(torch.zeros(2)), base, base.t(), torch.ones(5)]
    reader = _reader(tensors)
    assert reader.first_changed() == -1
    tensors[4].add_(1.0)
    assert reader.first_changed() == 4
    with torch.no_grad():
        tensors[1].mul_(2.0)  # a parameter, changed under no_grad as an optimizer would
    assert reader.first_changed() == 1
    reader.seen(1, tensors[1]._version)
    assert reader.first_changed() == 4
    reader.seen(4, tensors[4]._version)
    assert reader.first_changed() == -1
    base[0, 0] = 5.0  # a view shares its base's counter
    assert reader.first_changed() == 2
    reader.seen(2, base._version)
    assert reader.first_changed() == 3


def test_objects_that_are_not_tensors_get_no_reader():
    assert torch_versions.reader([torch.ones(2), [1.0, 2.0]], [0, 0]) is None


@pytest.mark.parametrize("library", [True, False], ids=["cpp", "python"])
def test_followed_agrees_with_python_and_skips_tensors_without_a_counter(monkeypatch, library):
    if not library:  # as where the library cannot be built
        monkeypatch.setattr(torch_versions, "reader", lambda tensors, versions: None)
    with torch.inference_mode():
        frozen = torch.ones(3)  # no version counter: cannot be followed, must not crash
    weights = [torch.ones(2), frozen, torch.zeros(4)]
    followed = _Followed({i: WeightSource(f"w{i}", t) for i, t in enumerate(weights)})
    assert followed.positions == [0, 2]
    assert WeightSource("frozen", frozen).version() == 0
    assert followed.changed() == []
    weights[2].add_(1.0)
    weights[0].add_(1.0)
    assert followed.changed() == [0, 2]
    followed.seen(0, weights[0]._version)
    assert followed.changed() == [2]
    followed.seen(2, weights[2]._version)
    assert followed.changed() == []
