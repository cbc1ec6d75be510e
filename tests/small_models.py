"""Small torch models shared by several test files."""

from __future__ import annotations

import torch


class SmallNet(torch.nn.Module):
    """linear -> gelu -> layer norm -> linear: a few kernels, fusible epilogues, a reduction."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.norm = torch.nn.LayerNorm(16)
        self.fc2 = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.norm(torch.nn.functional.gelu(self.fc1(x))))
