"""Random ops in forward are refused naming the op and the source line: TVM 0.27 would bake a
randn draw in as a constant, make exponential_ zeros and bernoulli its input."""

from __future__ import annotations

import plus_tvm
import pytest
import torch
from plus_tvm.errors import UnsupportedOperatorError


class _Noisy(torch.nn.Module):
    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.how == "randn_like":
            return x + torch.randn_like(x)
        if self.how == "randn":
            return x + torch.randn(4, 8)
        if self.how == "bernoulli":
            return x * torch.bernoulli(x.sigmoid())
        return x + torch.empty_like(x).exponential_()


# the op named: bernoulli reaches the importer decomposed into rand + lt
@pytest.mark.parametrize(
    "how, op",
    [("randn_like", "randn_like"), ("randn", "randn"), ("bernoulli", "rand"),
     ("exponential", "exponential")],
)
def test_a_random_op_in_forward_is_refused_naming_it_and_its_line(how, op):
    with pytest.raises(UnsupportedOperatorError) as info:
        plus_tvm.compile(_Noisy(how).eval(), "llvm", example_args=(torch.randn(4, 8),))
    message = str(info.value)
    assert "random" in message and f"{op}." in message
    assert "test_torch_random_refusal.py" in message  # the user's line


def test_dropout_in_eval_mode_is_not_random_and_compiles():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.5)).eval()
    x = torch.randn(4, 8)
    cm = plus_tvm.compile(model, "llvm", example_args=(x,))
    torch.testing.assert_close(cm(x), model(x), rtol=1e-5, atol=1e-5)
