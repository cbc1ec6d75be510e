"""One float32 ``plus_tvm.compile`` (default options, the host CPU) per tiny zoo model and form
for the whole test session, for the files that compile the same zoo model the same way:

- ``zoo_compiled(name)``: ``plus_tvm.compile("zoo:NAME", "llvm")`` (tests/test_models.py's torch
  frontend, tests/test_hostile_inputs.py's NaN image; its statistics are ``inspect("zoo:NAME")``'s
  less ``compile_s``: tests/test_fold_static_subgraphs.py);
- ``module_compiled(name)``: ``plus_tvm.compile(module, example_args=inputs)`` of
  ``zoo.load(NAME)`` (the runtime-only, deploy and CUDA-graph files' exports and weights, the
  float32 twin of tests/test_half_precision.py);
- ``half_compiled(name, dtype)``: the same in a half ``dtype`` (the module cast with
  ``.to(dtype)``, its floating inputs too: tests/test_half_precision.py's accuracy check and
  half twin).

Callers get a copy of the module and inputs; the compiled model reads the weights of the
module it was compiled from, which no caller is handed (a test that changes weights in place,
or the compiled model's state, needs its own compile)."""

from __future__ import annotations

import copy
import functools

import plus_tvm
import torch
from conftest import strict_pass_context
from plus_tvm import zoo


@functools.cache
def _zoo(name: str) -> plus_tvm.CompiledModel:
    with strict_pass_context():  # (checked as in a test, whoever compiles it first)
        return plus_tvm.compile(f"zoo:{name}", "llvm")


@functools.cache
def _loaded(name: str) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    return zoo.load(name)


@functools.cache
def _module(name: str) -> plus_tvm.CompiledModel:
    model, inputs = _loaded(name)
    with strict_pass_context():  # (checked as in a test, whoever compiles it first)
        return plus_tvm.compile(model, example_args=inputs)


@functools.cache
def _half(name: str, dtype: torch.dtype) -> tuple[torch.nn.Module, tuple, plus_tvm.CompiledModel]:
    model, inputs = _loaded(name)
    half = copy.deepcopy(model).eval().to(dtype)
    hargs = tuple(a.to(dtype) if a.is_floating_point() else a for a in inputs)
    with strict_pass_context():  # (checked as in a test, whoever compiles it first)
        return half, hargs, plus_tvm.compile(half, example_args=hargs)


def zoo_compiled(name: str) -> plus_tvm.CompiledModel:
    """``plus_tvm.compile("zoo:NAME", "llvm")``, compiled once per session."""
    return _zoo(name)


def zoo_stats(name: str) -> dict:
    """A copy of the statistics of ``zoo_compiled(name)``."""
    return copy.deepcopy(dict(_zoo(name).stats))


def module_compiled(
    name: str,
) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...], plus_tvm.CompiledModel]:
    """``(module, inputs, compiled)``: ``zoo.load(name)`` (copies) and
    ``plus_tvm.compile(module, example_args=inputs)``, compiled once per session."""
    model, inputs = _loaded(name)
    return copy.deepcopy(model), tuple(t.clone() for t in inputs), _module(name)


def half_compiled(
    name: str, dtype: torch.dtype
) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...], plus_tvm.CompiledModel]:
    """``(half, hargs, compiled)``: ``zoo.load(name)``'s module cast to ``dtype`` and its inputs
    (floating ones cast; copies), and ``plus_tvm.compile(half, example_args=hargs)``, compiled
    once per session."""
    half, hargs, compiled = _half(name, dtype)
    return copy.deepcopy(half), tuple(t.clone() for t in hargs), compiled
