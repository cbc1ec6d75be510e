"""A library implementation as one unit: the kernel declares its name, config spec and cost;
binders build configs through the spec; kernels and binders are found without tables."""

from __future__ import annotations

import importlib
import pkgutil

import pytest
import torch
from plus_tvm import runtime
from plus_tvm.dispatch import BINDERS, known_implementations
from plus_tvm.dispatch.binders import LibraryCall
from plus_tvm.pattern_warehouse import load_warehouse
from plus_tvm.runtime import KERNELS, LibraryKernel
from plus_tvm.runtime.perf import library_gflops
from plus_tvm.runtime.rms_norm import RMS_NORM_SPEC


def test_a_config_the_kernel_does_not_take_fails_when_the_call_is_built():
    with pytest.raises(ValueError, match="plus.rms_norm: unknown config key 'gama'"):
        LibraryCall(RMS_NORM_SPEC, [], {"gama": True}, 0, [0])
    with pytest.raises(ValueError, match="plus.rms_norm: bad value 'x' for config key 'eps'"):
        LibraryCall(RMS_NORM_SPEC, [], {"eps": "x"}, 0, [0])
    call = LibraryCall(RMS_NORM_SPEC, [], {"gamma": True, "eps": 1e-5}, 0, [0])
    assert call.kernel == "plus.rms_norm" and call.config_text() == "eps=1e-05;gamma=1"
    assert RMS_NORM_SPEC.parse(call.config_text()) == (True, 1e-5)


def test_every_kernel_file_holds_one_kernel_and_every_kernel_is_registered():
    for info in pkgutil.iter_modules(runtime.__path__):
        if info.name.startswith("_") or info.name in runtime._NOT_KERNELS:  # (services)
            continue
        module = importlib.import_module(f"plus_tvm.runtime.{info.name}")
        own = [
            obj
            for obj in vars(module).values()
            if isinstance(obj, type)
            and issubclass(obj, LibraryKernel)
            and obj.__module__ == module.__name__
        ]
        assert len(own) == 1, f"{info.name}.py defines {own}"
        kernel = KERNELS[own[0].name]
        assert type(kernel) is own[0] and kernel.spec.kernel == kernel.name


def test_costs_are_the_kernels_own_and_probes_run():
    for name, kernel in KERNELS.items():
        assert library_gflops(name, "llvm", measure=False) == kernel.cpu_gflops > 0
        assert library_gflops(name, "cuda", measure=False) == kernel.cuda_gflops > 0
        probe = kernel.probe(lambda *shape: torch.randn(*shape))
        if probe is None:
            continue
        inputs, config, out, flops = probe
        cfg = kernel.spec.parse(config)
        assert len(inputs) == kernel.num_inputs(cfg) and flops > 0
        type(kernel)().run(cfg, inputs, out)  # a private instance: no shared packed weights
        assert torch.isfinite(out).all()


def test_every_warehouse_implementation_has_a_binder():
    names = {impl.name for entry in load_warehouse() for impl in entry.implementations}
    assert names <= set(BINDERS) == set(known_implementations())
