"""The fixed costs of a CPU decode step, kept small with every safety property: the index check
runs in C++ (``native/index_check.cc``: no VM -> Python crossing for ids in range, the same
error as the Python check for an id out of range, which words it), and the step's
intermediates are planned once under the upper bounds of batch and length (only its outputs
are sized per call); greedy tokens stay transformers'."""

from __future__ import annotations

import contextlib
import threading

import numpy as np
import plus_tvm.runtime as rt
import pytest
import torch
import tvm
import tvm_ffi
from _shared_lm import MAX_BATCH, MAX_LENGTH, compiled_lm
from plus_tvm.runtime import index_check, native


@pytest.fixture(scope="module")
def gpt2():
    return compiled_lm("gpt2")  # (tests/_shared_lm.py: compiled once per session)


def _in_new_thread(fn):  # noqa: ANN001, ANN202
    """``fn()`` in a thread of its own, whose compiled steps build their VMs there (a VM
    resolves ``plus.check_indices`` when it is built)."""
    result = {}

    def target() -> None:
        try:
            result["value"] = fn()
        except BaseException as err:  # noqa: BLE001 (handed to the caller)
            result["error"] = err

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    return result["value"]


@contextlib.contextmanager
def _registered(check):  # noqa: ANN001, ANN202
    """``check`` as ``plus.check_indices`` inside the block, the package's own after it."""
    tvm_ffi.register_global_func(index_check.NAME, check, override=True)
    try:
        yield
    finally:
        index_check.register()


def _counting(calls: list):  # noqa: ANN202
    def check(indices, extents, config):  # noqa: ANN001, ANN202
        calls.append(str(config))
        return index_check.run(indices, extents, config)

    return check


def _native():  # noqa: ANN202
    assert rt.use_native(), native.status()["reason"]
    return tvm_ffi.get_global_func(index_check.NAME)


def _outcome(fn, *args):  # noqa: ANN001, ANN002, ANN202
    try:
        return fn(*args).numpy()
    except RuntimeError as err:
        return str(err)


def test_native_check_answers_as_the_python_check():
    check = _native()
    assert index_check.native_check() is not None
    rng = np.random.default_rng(0)
    configs = [
        index_check.config_text("take", "n1", negative=neg, last=last, source=src)
        for neg in (False, True)
        for last in (False, True)
        for src in ("", "input_ids")
    ]
    answered = {"copy": 0, "error": 0}
    for case in range(400):
        config = configs[case % len(configs)]
        last = "last=1" in config
        dtype = (np.int64, np.int32)[case % 2]
        shape = tuple(int(s) for s in rng.integers(1, 4, size=int(rng.integers(1, 4))))
        extents = [int(e) for e in rng.integers(1, 9, size=shape[-1] if last else 1)]
        neg = "neg=1" in config
        values = rng.integers(0, min(extents), size=shape).astype(dtype)
        if case % 3:  # one value on or just past an edge of its range
            pos = tuple(int(rng.integers(0, s)) for s in shape)
            high = extents[pos[-1]] if last else extents[0]
            low = -high if neg else 0
            values[pos] = (low - 1, low, high - 1, high)[int(rng.integers(0, 4))]
        args = (tvm.runtime.tensor(values), tvm_ffi.Shape(extents), config)
        want = _outcome(index_check.run, *args)
        got = _outcome(check, *args)
        if isinstance(want, str):
            assert got == want and "index out of range" in got
            answered["error"] += 1
        else:
            assert isinstance(got, np.ndarray) and got.dtype == dtype
            assert np.array_equal(got, values)
            answered["copy"] += 1
    assert min(answered.values()) > 100  # (both outcomes, many times)


def test_native_check_returns_a_copy_on_every_bound():
    check = _native()
    config = index_check.config_text("take", "n", negative=True, last=False)
    for value in (-5, 4):  # the first and last value in range
        src = tvm.runtime.tensor(np.array([[value]], dtype=np.int64))
        out = check(src, tvm_ffi.Shape([5]), config)
        src.copyfrom(np.array([[0]], dtype=np.int64))
        assert int(out.numpy()[0, 0]) == value  # (not a view of the input)
    for value in (-6, 5):
        with pytest.raises(RuntimeError, match=rf"index {value} at position \[0, 0\]"):
            check(tvm.runtime.tensor(np.array([[value]])), tvm_ffi.Shape([5]), config)


def _prompts(batch: int, length: int = 8) -> tuple:
    gen = torch.Generator().manual_seed(batch + length)
    ids = torch.randint(3, 100, (batch, length), generator=gen)
    return ids, torch.ones_like(ids)


def test_decode_checks_ids_without_entering_python(gpt2):
    model, lm = gpt2
    _native()
    ids, mask = _prompts(2)
    with torch.no_grad():
        want = model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False)
    python_calls, fallback_calls = [], []
    # the Python check: called at every step (the prefill's and each decode step's gathers)
    with _registered(_counting(python_calls)):
        out = _in_new_thread(lambda: lm.generate(ids, 6, attention_mask=mask))
    assert torch.equal(out, want)
    assert len(python_calls) >= 6
    # the native one: the same checks, none of them through Python
    with _registered(index_check.native_check(_counting(fallback_calls))):
        out = _in_new_thread(lambda: lm.generate(ids, 6, attention_mask=mask))
    assert torch.equal(out, want)
    assert fallback_calls == []


def test_decode_id_out_of_range_gives_the_same_clear_error(gpt2):
    _, lm = gpt2
    _native()
    ids, mask = _prompts(1)
    positions = torch.arange(8)[None]
    _, *fresh = lm.prefill(ids, mask, positions)
    past = [
        torch.cat([torch.as_tensor(f), torch.zeros_like(torch.as_tensor(f[:1]))]) for f in fresh
    ]
    step_mask = torch.ones(1, 9, dtype=torch.long)
    vocab = lm.limits.vocab_size

    def step(token: int):  # the loop's own call (no input check before the VM's)
        return lambda: lm._decode_step(
            torch.tensor([[token]]), step_mask, positions[:, -1:] + 1, past
        )

    messages = []
    for check in (index_check.run, index_check.native_check()):
        with _registered(check):
            _in_new_thread(step(vocab - 1))  # (in range: runs)
            with pytest.raises(Exception, match="index out of range") as err:
                _in_new_thread(step(vocab))
        messages.append(str(err.value))
    assert messages[0] == messages[1]
    assert f"index {vocab} at position [0, 0]" in messages[0]
    assert f"is outside [0, {vocab})" in messages[0] and "embedding" in messages[0]


def _storage_sizes(lm, batch: int, known: int) -> list[int]:  # noqa: ANN001
    """The bytes of every storage the decode step allocates, in order, for ``batch``
    sequences with ``known`` positions cached."""
    sizes: list[int] = []

    def instrument(func, symbol, before, ret, *args):  # noqa: ANN001, ANN202
        if before and str(symbol) == "vm.builtin.alloc_storage":
            sizes.append(int(args[1][0]))
        return 0

    ids = torch.randint(3, 100, (batch, 1))
    mask = torch.ones(batch, known + 1, dtype=torch.long)
    past = [torch.zeros(known + 1, batch, h, d) for h, d in lm.layout.shapes]
    step = (ids, mask, torch.full((batch, 1), known), past)
    lm._decode_step(*step)  # (this thread's VM exists now)
    vm = lm.decode._local.vm
    vm.set_instrument(tvm_ffi.convert(instrument))
    try:
        lm._decode_step(*step)
    finally:
        vm.set_instrument(tvm_ffi.convert(lambda *args: 0))
    return sizes


def test_decode_storage_is_planned_under_the_upper_bounds(gpt2):
    _, lm = gpt2
    small = _storage_sizes(lm, 1, 4)
    large = _storage_sizes(lm, MAX_BATCH, MAX_LENGTH - 2)
    assert len(small) == len(large) > 0  # as many allocations per call at every size
    # only the step's outputs (the logits and each cache tensor's new position) are sized per
    # call: every intermediate has one storage of its largest size, planned when compiled
    outputs = 1 + len(lm.layout.shapes)
    sized_per_call = [i for i, (a, b) in enumerate(zip(small, large)) if a != b]
    assert len(sized_per_call) <= outputs
    assert len(small) - len(sized_per_call) >= 2 * outputs  # (the plan holds most of them)
