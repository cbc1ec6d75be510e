"""plus_tvm.schedule_fallback: a kernel whose plus schedule TVM cannot build is built with TVM's
own schedule; the compile succeeds, says so, and computes what torch computes."""

from __future__ import annotations

import warnings

import numpy as np
import plus_tvm
import pytest
import torch
import tvm
from plus_tvm import Options, schedule_fallback
from plus_tvm import schedules as s
from plus_tvm.errors import InternalCompileError
from tvm import s_tir, te
from tvm.s_tir.dlight.base.schedule_rule import ScheduleRule

NESTED = "Nested parallel loop is not supported"


class Model(torch.nn.Module):
    """A sigmoid and a softmax (TIR kernels, no library call)."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.sigmoid(x) * 2.0, torch.softmax(x, dim=-1)


class NestedParallel(ScheduleRule):
    """Wraps a CPU rule: a kernel computing a sigmoid gets its two outer loops ``parallel``
    each (the primitives accept it; TVM's LLVM code generation refuses nested parallel loops);
    every other kernel goes to the wrapped rule."""

    def __init__(self, rule: ScheduleRule) -> None:
        self.rule = rule

    def apply_with_reason(self, func, target):
        if "sigmoid" not in func.script():
            return self.rule.apply_with_reason(func, target)
        sch = s_tir.Schedule(func)
        for block in sch.get_child_blocks(sch.get_sblock("root")):
            loops = sch.get_loops(block)
            if len(loops) >= 2:
                sch.parallel(loops[0])
                sch.parallel(loops[1])
        return sch, None


@pytest.fixture
def broken(monkeypatch):
    """Phase 4's first CPU rule (GIR) breaks the sigmoid kernel."""
    real = s.GIRLLVM
    monkeypatch.setattr(s, "GIRLLVM", lambda **kw: NestedParallel(real(**kw)))


def _case():
    torch.manual_seed(0)
    model = Model().eval()
    x = torch.randn(64, 256)
    with torch.no_grad():
        want = [t.numpy() for t in model(x)]
    return model, x, want


def test_a_kernel_that_fails_to_build_falls_back(broken):
    model, x, want = _case()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cm = plus_tvm.compile(model, "llvm", (x,))
    fallbacks = cm.stats["schedule_fallbacks"]
    assert len(fallbacks) == 1
    name = fallbacks[0]["function"]
    assert "sigmoid" in name and NESTED in fallbacks[0]["error"]
    assert any(name in str(w.message) for w in caught if w.category is RuntimeWarning)
    assert sum(cm.stats["schedule"]["scheduled"].values()) == 2  # the softmax keeps plus's
    for got, ref in zip(cm(x.numpy()), want):
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


def test_without_the_fallback_the_compile_fails(broken):
    model, x, _ = _case()
    with pytest.raises(InternalCompileError, match=NESTED):
        plus_tvm.compile(model, "llvm", (x,), Options(schedule_fallback=False))


def test_a_compile_that_builds_has_no_fallback():
    model, x, want = _case()
    cm = plus_tvm.compile(model, "llvm", (x,))
    assert "schedule_fallbacks" not in cm.stats
    for got, ref in zip(cm(x.numpy()), want):
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


def _unit_case():
    """A relax module calling one scheduled kernel (nested parallel: it fails to build), and
    the module before the schedule."""
    from tvm import relax

    a = te.placeholder((64, 128), "float32", name="a")
    b = te.compute((64, 128), lambda i, j: a[i, j] * 2.0 + 1.0, name="b")
    plain = te.create_prim_func([a, b]).with_attr("global_symbol", "scale")
    sch = s_tir.Schedule(plain)
    i, j = sch.get_loops(sch.get_sblock("b"))
    sch.parallel(i)
    sch.parallel(j)
    scheduled = sch.mod["main"].with_attr("tirx.is_scheduled", True)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((64, 128), "float32"))
    with bb.function("main", [x]):
        gv = bb.add_func(plain, "scale")
        out = bb.emit(relax.call_tir(gv, [x], relax.TensorType((64, 128), "float32")))
        bb.emit_func_output(out)
    before = bb.get()
    after = tvm.IRModule(dict(before.functions_items()))
    after[before.get_global_var("scale")] = scheduled
    post = tvm.transform.Sequential([relax.get_pipeline("default")], name="post")
    return before, after, post


def test_a_fallback_that_fails_too_names_the_kernel():
    before, after, post = _unit_case()
    target = tvm.target.Target({"kind": "llvm"})
    text = after.script()
    with pytest.raises(schedule_fallback.ScheduleFallbackError, match="scale") as err:
        schedule_fallback.build(after, target, post, before, lambda m: after)  # same schedule
    assert NESTED in str(err.value) and NESTED in str(err.value.__cause__)
    assert after.script() == text  # the input module is unchanged
    exe, fallbacks = schedule_fallback.build(after, target, post, before, lambda m: m)
    assert [f.function for f in fallbacks] == ["scale"]
    vm = tvm.relax.VirtualMachine(exe, tvm.cpu())
    x = np.random.default_rng(0).standard_normal((64, 128)).astype("float32")
    np.testing.assert_allclose(vm["main"](tvm.runtime.tensor(x)).numpy(), x * 2 + 1, rtol=1e-6)
    assert after.script() == text
