"""TVM's own default Relax pipeline for a target: the ``--pipeline tvm`` baseline, split at the
point where plus's is split (before dataflow lowering) so that both report comparable kernel
statistics."""

from __future__ import annotations

import importlib

import tvm

from .target import resolve_target


def tvm_pipeline(target: str | dict | tvm.target.Target | None = None) -> tvm.transform.Pass:
    """TVM's own default Relax pipeline for the target, as one pass."""
    tgt = resolve_target(target)
    return tvm.transform.Sequential(
        tvm_pre_lowering_passes(tgt) + tvm_post_lowering_passes(tgt), name="tvm_default"
    )


def _backend(target: tvm.target.Target):  # noqa: ANN202
    """The module of TVM's per-target pipeline (``tvm.relax.backend.<family>.pipeline``),
    imported directly: ``relax.pipeline.dataflow_lower_passes`` is broken in 0.27 (the backend
    packages do not export ``dataflow_lower_passes``)."""
    kind = target.kind.name
    gpu = "gpu" in target.keys
    family = kind if kind in ("cuda", "rocm") else ("gpu_generic" if gpu else "cpu_generic")
    return importlib.import_module(f"tvm.relax.backend.{family}.pipeline")


def tvm_pre_lowering_passes(target: tvm.target.Target) -> list[tvm.transform.Pass]:
    """TVM's default pipeline up to (not including) dataflow lowering."""
    backend = _backend(target)
    return list(backend.library_dispatch_passes(target)) + list(backend.legalize_passes(target))


def tvm_post_lowering_passes(target: tvm.target.Target) -> list[tvm.transform.Pass]:
    """The rest of TVM's default pipeline: dataflow lowering and finalization."""
    backend = _backend(target)
    return list(backend.dataflow_lower_passes(target)) + list(backend.finalize_passes(target))
