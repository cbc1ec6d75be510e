"""torch's CUDA calls made no-ops, for running the GPU check's path on the CPU."""

from __future__ import annotations

import torch


def cuda_on_the_cpu(monkeypatch) -> None:  # noqa: ANN001
    """``torch.cuda`` reports a device (named ``CPU``), and ``.cuda()`` of a tensor or a
    module returns it as it is."""
    for name, fn in {
        "is_available": lambda: True,
        "get_device_name": lambda *a: "CPU",
        "synchronize": lambda *a: None,
        "mem_get_info": lambda *a: (0, 0),
    }.items():
        monkeypatch.setattr(torch.cuda, name, fn)
    monkeypatch.setattr(torch.Tensor, "cuda", lambda self, *a, **k: self)
    monkeypatch.setattr(torch.nn.Module, "cuda", lambda self, *a, **k: self)
