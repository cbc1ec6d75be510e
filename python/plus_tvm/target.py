"""Turn the names users type (``llvm``, ``cuda``, a JSON dict) into TVM 0.27 targets.

TVM 0.27 rejects string CLI forms such as ``"llvm -mcpu=..."`` and crashes on a raw dict given to
``tvm.compile``, so every entry point goes through :func:`resolve_target`.
"""

from __future__ import annotations

import json
import os

import tvm

from .errors import TVM_FAILURE, TargetError, is_refusal

DEFAULT_CUDA_ARCH = "sm_90"


def host_target() -> tvm.target.Target:
    """The host CPU as an llvm target with its cores and micro-architecture."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return tvm.target.Target(
        {
            "kind": "llvm",
            "num-cores": int(cores or 1),
            "mcpu": tvm.target.codegen.llvm_get_system_cpu(),
        }
    )


def _cuda_target(arch: str | None = None) -> tvm.target.Target:
    if arch is None:
        dev = tvm.cuda(0)
        arch = f"sm_{dev.compute_version.replace('.', '')}" if dev.exist else DEFAULT_CUDA_ARCH
    return tvm.target.Target({"kind": "cuda", "arch": arch}, host=host_target())


def resolve_target(target: str | dict | tvm.target.Target | None) -> tvm.target.Target:
    """Resolve a target given by name, JSON text, dict or ``Target``.

    ``"llvm"``/``"cpu"`` is the host CPU with its core count and ``mcpu``; ``"cuda"`` is the local
    GPU's architecture, or sm_90 when no GPU is present (code generation needs no device).
    """
    return _supported(_resolve(target))


#: the target kinds plus_tvm compiles for and runs on (the pipeline's phases and the runtime's
#: devices are written for these)
KINDS = ("llvm", "cuda")


def _supported(target: tvm.target.Target) -> tvm.target.Target:
    kind = target.kind.name
    if kind not in KINDS:
        raise TargetError(
            f"target kind {kind!r} is not supported: plus_tvm compiles for {', '.join(KINDS)} "
            "(TVM's own pipeline may take others: tvm.compile without plus)"
        )
    return target


def _resolve(target: str | dict | tvm.target.Target | None) -> tvm.target.Target:
    if target is None:
        target = "llvm"
    if isinstance(target, tvm.target.Target):
        return target
    if isinstance(target, str):
        text = target.strip()
        if text.startswith("{"):
            try:
                target = json.loads(text)
            except json.JSONDecodeError as err:
                raise TargetError(f"target JSON is not valid: {err}") from None
        elif text in ("llvm", "cpu"):
            return host_target()
        elif text in ("cuda", "gpu"):
            return _cuda_target()
        else:
            raise TargetError(
                f"unknown target {text!r}: use 'llvm', 'cuda' or a JSON dict such as "
                '\'{"kind": "cuda", "arch": "sm_90"}\''
            )
    if isinstance(target, dict):
        spec = dict(target)
        try:
            if spec.get("kind") == "cuda" and "host" not in spec:
                return tvm.target.Target(spec, host=host_target())
            return tvm.target.Target(spec)
        except TVM_FAILURE as err:  # an unknown kind or attribute, a value of the wrong type
            if not is_refusal(err):
                raise
            raise TargetError(f"invalid target {spec!r}: {str(err).splitlines()[-1]}") from None
    raise TargetError(f"target must be a name, JSON text, dict or tvm Target, got {type(target)}")


def _kind_and_attrs(target: tvm.target.Target | dict) -> tuple[str, dict]:
    """A target's kind and attributes; a dict is a target's JSON form, which a deployed model
    keeps where TVM's compiler library (which builds ``Target`` objects) is absent."""
    if isinstance(target, dict):
        return str(target.get("kind", "")), target
    return target.kind.name, target.attrs


def device_for(target: tvm.target.Target | dict) -> tvm.runtime.Device:
    """The runtime device on which code for ``target`` runs."""
    kind, _ = _kind_and_attrs(target)
    if kind == "llvm":
        return tvm.cpu(0)
    if kind == "cuda":
        return tvm.cuda(0)
    raise TargetError(f"no runtime device for target kind {kind!r}")


def target_name(target: tvm.target.Target | dict) -> str:
    """Short human-readable form used in stats (``llvm -mcpu=znver4``, ``cuda sm_90``)."""
    kind, attrs = _kind_and_attrs(target)
    if kind == "llvm":
        mcpu = attrs.get("mcpu", "")
        return f"llvm -mcpu={mcpu}" if mcpu else "llvm"
    if kind == "cuda":
        return f"cuda {attrs.get('arch', '')}".strip()
    return kind


def target_json(target: tvm.target.Target | dict) -> dict:
    """The JSON form of ``target`` (what an exported model records)."""
    return dict(target) if isinstance(target, dict) else json.loads(str(target))
