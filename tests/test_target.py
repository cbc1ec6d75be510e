"""plus_tvm.target: names, JSON text and dicts to TVM 0.27 targets."""

from __future__ import annotations

import json
import os

import pytest
import tvm
from plus_tvm import TargetError
from plus_tvm.target import device_for, resolve_target, target_name


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


@pytest.mark.parametrize("name", ["llvm", "cpu", " llvm ", None])
def test_llvm_is_host_cpu(name):
    tgt = resolve_target(name)
    assert tgt.kind.name == "llvm"
    assert int(tgt.attrs["num-cores"]) == _cores()
    assert str(tgt.attrs["mcpu"]) == tvm.target.codegen.llvm_get_system_cpu()
    assert target_name(tgt) == f"llvm -mcpu={tvm.target.codegen.llvm_get_system_cpu()}"
    assert device_for(tgt) == tvm.cpu(0)


@pytest.mark.parametrize("name", ["cuda", "gpu"])
def test_cuda_name(name):
    tgt = resolve_target(name)
    assert tgt.kind.name == "cuda"
    dev = tvm.cuda(0)
    expected = f"sm_{dev.compute_version.replace('.', '')}" if dev.exist else "sm_90"
    assert str(tgt.attrs["arch"]) == expected
    assert "gpu" in tgt.keys
    assert tgt.host is not None and tgt.host.kind.name == "llvm"
    assert int(tgt.host.attrs["num-cores"]) == _cores()
    assert target_name(tgt) == f"cuda {expected}"
    assert device_for(tgt) == tvm.cuda(0)


def test_json_text():
    tgt = resolve_target('{"kind": "cuda", "arch": "sm_80"}')
    assert tgt.kind.name == "cuda"
    assert str(tgt.attrs["arch"]) == "sm_80"
    assert tgt.host.kind.name == "llvm"  # a cuda dict without host gets the host CPU


def test_dict_llvm():
    tgt = resolve_target({"kind": "llvm", "num-cores": 1})
    assert tgt.kind.name == "llvm"
    assert int(tgt.attrs["num-cores"]) == 1
    assert tgt.host is None or tgt.host.kind.name == "llvm"


def test_dict_cuda_with_explicit_host_kept():
    tgt = resolve_target({"kind": "cuda", "arch": "sm_75", "host": {"kind": "llvm"}})
    assert str(tgt.attrs["arch"]) == "sm_75"
    assert "num-cores" not in tgt.host.attrs  # the explicit host, not host_target()


def test_target_passthrough_and_roundtrip():
    tgt = tvm.target.Target({"kind": "llvm", "num-cores": 3})
    assert resolve_target(tgt) is tgt
    again = resolve_target(json.loads(str(resolve_target("llvm"))))
    assert again.kind.name == "llvm" and int(again.attrs["num-cores"]) == _cores()


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        ("tpu", "unknown target 'tpu'"),
        ("llvm -mcpu=skylake", "unknown target"),
        ('{"kind": ', "not valid"),
        ({"kind": "nonsense"}, "nonsense"),
        ({"arch": "sm_80"}, "invalid target"),
        ({"kind": "llvm", "num-cores": "many"}, "num-cores"),
        ({"kind": "cuda", "bogus": 1}, "bogus"),
        (42, "int"),
    ],
)
def test_bad_targets(bad, match):
    with pytest.raises(TargetError, match=match):
        resolve_target(bad)


def test_no_device_for_other_kinds():
    with pytest.raises(TargetError, match="c"):
        device_for(tvm.target.Target({"kind": "c"}))
