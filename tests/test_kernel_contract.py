"""Each library kernel's Python class is the one source of its contract (issue 36 item 3): its
name and config keys (``spec``), the dtypes it takes, whether it has a native C++ form, in which
dtypes and for which configs. Everything else is checked against it here: the C++ parsers
(through their exported ``<prefix>_parse``), the native kernel table, and the warehouse
entries' dtypes."""

from __future__ import annotations

import re
from pathlib import Path

import plus_tvm.runtime as rt
import pytest
from plus_tvm.runtime import native
from plus_tvm.runtime._common import ConfigSpec, LibraryKernel, flag

NATIVE = sorted(native.native_kernels(rt.KERNELS))
UNKNOWN_KEY = "zz_not_a_key"
BAD_VALUE = "x!"


@pytest.fixture(scope="module", autouse=True)
def natives():
    if not rt.use_native():
        pytest.fail(f"native kernels unavailable: {native.status()['reason']}")


def understood(kernel: str, config: str) -> bool:
    result = native.parse(kernel, config)
    assert result is not None, f"{kernel}: no native parser loaded"
    return result[0]


def test_kernels_are_named_by_their_spec():
    for name, kernel in rt.KERNELS.items():
        assert kernel.name == kernel.spec.kernel == name
        assert set(kernel.native_dtypes) <= set(kernel.dtypes)


def test_every_key_is_documented_with_its_kernel():
    """The kernel's module or class docstring names each key of its spec (``key`` or key=)."""
    import sys

    for name, kernel in rt.KERNELS.items():
        doc = (sys.modules[type(kernel).__module__].__doc__ or "") + (type(kernel).__doc__ or "")
        missing = [k for k in kernel.spec.fields if not re.search(rf"(``|\b){k}(=|``)", doc)]
        assert not missing, f"{name}: keys {missing} not in its docstring"


def test_a_name_other_than_the_specs_is_refused():
    spec = ConfigSpec("plus.contract_probe", on=flag())
    with pytest.raises(TypeError, match="plus.contract_probe"):
        type("Probe", (LibraryKernel,), {"spec": spec, "name": "plus.other"})
    with pytest.raises(TypeError, match="native_dtypes"):
        type("Probe", (LibraryKernel,), {"spec": spec, "native_dtypes": ("int8",)})
    assert type("Probe", (LibraryKernel,), {"spec": spec}).name == "plus.contract_probe"


def test_the_native_table_is_the_kernels_declaration():
    """The kernels installed natively are exactly those declaring native dtypes."""
    assert NATIVE == sorted(native.status()["kernels"])
    assert {"plus.linear", "plus.conv2d"} <= set(NATIVE)


@pytest.mark.parametrize("kernel", NATIVE)
def test_cpp_parser_takes_every_spec_key_and_value(kernel):
    spec = rt.KERNELS[kernel].spec
    for key, field in spec.fields.items():
        for sample in field.samples:
            spec.parse(f"{key}={sample}")  # a value of the contract
            assert understood(kernel, f"{key}={sample}"), f"{kernel}: C++ refuses {key}={sample}"
        with pytest.raises(ValueError):
            spec.parse(f"{key}={BAD_VALUE}")
        assert not understood(kernel, f"{key}={BAD_VALUE}"), f"{kernel}: C++ takes {key}=x!"
    assert not understood(kernel, f"{UNKNOWN_KEY}=1")


def _cpp_keys() -> set[str]:
    """Every key a C++ parser compares against (``key == "..."`` in the native sources and
    headers)."""
    keys: set[str] = set()
    for name in native.SOURCES:
        keys |= set(re.findall(r'key == "(\w+)"', (Path(native.SOURCE_DIR) / name).read_text()))
    return keys


@pytest.mark.parametrize("kernel", NATIVE)
def test_cpp_parser_takes_no_key_outside_the_spec(kernel):
    """A key the C++ parser of ``kernel`` understands with any value of any contract must be
    one of its spec's keys."""
    spec = rt.KERNELS[kernel].spec
    values = {s for k in rt.KERNELS.values() for f in k.spec.fields.values() for s in f.samples}
    assert set(spec.fields) <= _cpp_keys()  # (the scan sees the parsers)
    for key in sorted(_cpp_keys() - set(spec.fields)):
        taken = [v for v in sorted(values) if understood(kernel, f"{key}={v}")]
        assert not taken, f"{kernel}: C++ takes {key}={taken[0]}, a key its spec lacks"


@pytest.mark.parametrize("kernel", NATIVE)
def test_cpp_native_decision_is_the_kernels(kernel):
    """Which configs run natively: the C++ ``cfg.native`` and ``native_config`` agree, for the
    defaults and every single-key variation."""
    python = rt.KERNELS[kernel]
    configs = [""] + [f"{k}={s}" for k, f in python.spec.fields.items() for s in f.samples]
    for config in configs:
        result = native.parse(kernel, config)
        assert result is not None
        want = bool(python.native_config(python.spec.parse(config)))
        assert result == (True, want), f"{kernel} {config!r}: C++ {result}, Python {want}"


def test_runs_natively_follows_the_kernel():
    assert native.runs_natively("plus.linear", {"w": "nk"}, "float32")
    assert not native.runs_natively("plus.linear", {"w": "nk", "parts": 2}, "float32")
    assert not native.runs_natively("plus.linear", {"w": "nk", "prepack": False}, "float32")
    assert native.runs_natively("plus.conv2d", {"layout": "nhwc"}, "float32")
    assert not native.runs_natively("plus.conv2d", {"layout": "nchw"}, "float32")
    assert not native.runs_natively("plus.softmax", {}, "float32")  # no native form
    assert not native.runs_natively("plus.linear", {"w": "nk"}, "float64")


# ------------------------------------------------------------------------------- warehouse
def test_every_binder_calls_the_kernel_that_declares_it():
    """Each warehouse implementation (a binder) is declared by one kernel, whose spec its
    binder module builds calls with."""
    import importlib

    from plus_tvm.dispatch import BINDERS

    declared = [i for k in rt.KERNELS.values() for i in k.implementations]
    assert sorted(declared) == sorted(BINDERS)
    for kernel in rt.KERNELS.values():
        for impl in kernel.implementations:
            module = importlib.import_module(BINDERS[impl].__module__)
            assert any(v is kernel.spec for v in vars(module).values()), (impl, kernel.name)


def test_shipped_implementations_take_only_their_kernels_dtypes():
    from plus_tvm.pattern_warehouse import implementation_kernels, load_warehouse

    kernels = implementation_kernels()
    for entry in load_warehouse(use_env=False):
        for impl in entry.implementations:
            assert impl.dtypes is not None
            assert set(impl.dtypes) <= set(kernels[impl.name][1]), (entry.name, impl.name)


GEMM_ENTRY = '''name = "{name}"
priority = 1000
allow_prologue = true
allow_epilogue = true
graph = """
loop0 [M, para]
  loop1 [N, para]
    loop2 [K, non-para, (dot)]
"""
{constraints}
[[implementation]]
name = "torch.linear"
{dtypes}
'''


def _entry(tmp_path, name: str, constraints: str = "", dtypes: str = "") -> str:
    path = tmp_path / f"{name}.toml"
    path.write_text(GEMM_ENTRY.format(name=name, constraints=constraints, dtypes=dtypes))
    return str(path)


def test_an_implementation_declaring_a_dtype_its_kernel_does_not_take_fails_to_load(tmp_path):
    from plus_tvm.pattern_warehouse import WarehouseError, load_entry

    path = _entry(tmp_path, "ints", dtypes='dtypes = ["float32", "int8"]')
    with pytest.raises(WarehouseError, match=r"ints\.toml:13: .*int8.*plus\.linear") as err:
        load_entry(path, kernel_dtypes={"torch.linear": ("plus.linear", ("float32",))})
    assert "it takes float32" in str(err.value)
    # the entry's constraint is what an implementation without its own dtypes declares
    path = _entry(tmp_path, "wide", constraints='[constraints]\ndtype = ["float64"]')
    with pytest.raises(WarehouseError, match=r"wide\.toml:\d+: .*float64"):
        load_entry(path, kernel_dtypes={"torch.linear": ("plus.linear", ("float32",))})
    # with the kernels' real declarations (the default)
    from plus_tvm.pattern_warehouse import load_warehouse

    _entry(tmp_path, "ints", dtypes='dtypes = ["int8"]')
    with pytest.raises(WarehouseError, match="int8"):
        load_warehouse([str(tmp_path)], use_env=False)


def test_a_dtype_no_implementation_takes_is_declined_and_said(tmp_path):
    """An entry whose one implementation takes bfloat16 only: a float32 GEMM is not given to
    it (the stats say why) and goes on to the next entry."""
    import numpy as np
    import plus_tvm
    import torch
    from plus_tvm import Options

    _entry(tmp_path, "gemm_bf16_only", dtypes='dtypes = ["bfloat16"]')
    module = torch.nn.Linear(32, 48).eval()
    x = torch.randn(64, 32)
    options = Options(dispatch_cost_model=False, warehouse=(str(tmp_path),))
    compiled = plus_tvm.compile(module, example_args=(x,), options=options)
    with torch.no_grad():
        np.testing.assert_allclose(np.asarray(compiled(x)), module(x).numpy(), rtol=1e-4, atol=1e-4)
    dispatch = compiled.stats["dispatch"]
    assert dispatch["declined"].get("gemm_bf16_only: torch.linear takes no float32", 0) >= 1
    assert dict(dispatch["library"]).get("gemm_epilogue") == 1
