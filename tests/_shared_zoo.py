"""One float32 ``plus_tvm.compile`` (default options, the host CPU) per tiny zoo model and form
for the whole test session, for the files that compile the same zoo model the same way:

- ``zoo_compiled(name)``: ``plus_tvm.compile("zoo:NAME", "llvm")`` (tests/test_models.py's torch
  frontend, tests/test_hostile_inputs.py's NaN image; its statistics are ``inspect("zoo:NAME")``'s
  less ``compile_s``: tests/test_fold_static_subgraphs.py);
- ``module_compiled(name)``: ``plus_tvm.compile(module, example_args=inputs)`` of
  ``zoo.load(NAME)`` (the runtime-only, deploy and CUDA-graph files' exports and weights, the
  float32 twin of tests/test_half_precision.py).

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
