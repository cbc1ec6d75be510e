"""Random ATen ops refused with a clear error, where TVM 0.27 imports them silently wrong.

TVM 0.27's torch importer turns ``randn`` / ``randn_like`` into one ``np.random.randn`` draw
baked into the model as a constant (every call then returns the same "random" tensor),
``exponential_`` into zeros, and ``bernoulli(p)`` into its input (right only for dropout in
eval mode, where it never appears). A compiled model cannot reproduce torch's random stream,
and a constant in its place is a silently different model (Reformer's LSH attention hashes
with ``torch.randn`` in ``forward``). These ops are refused, naming the op, the node and the
source line; the torch host fallback does not take random ops either.
"""

from __future__ import annotations

from typing import Any

from .errors import UnsupportedOperatorError

# ATen overloads whose 0.27 converter is not random (overload -> what 0.27 makes of it)
SILENTLY_WRONG = {
    "randn.default": "one draw baked in as a constant",
    "randn_like.default": "one draw baked in as a constant",
    "exponential.default": "zeros",
    "bernoulli.p": "its input unchanged",
}


def _refuse(key: str):
    def convert(node: Any, importer: Any) -> None:
        del importer
        from .frontend import node_location

        raise UnsupportedOperatorError(
            f"torch operator {node.target} at node '{node.name}'{node_location(node)} draws "
            f"random numbers in forward; a compiled model cannot reproduce torch's random "
            f"stream (TVM's importer would make it {SILENTLY_WRONG[key]}). Draw them outside "
            "the model and pass them as an input, or call model.eval() if it is dropout."
        )

    return convert


RANDOM_REFUSALS = {key: _refuse(key) for key in SILENTLY_WRONG}
