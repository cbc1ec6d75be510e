"""What a failed ``torch.export`` of the user's module says to the user.

The common failure on real models is a Python branch on a tensor's value (``if
mask.any().item():``, ``if bool(t):``): torch.export captures one graph for every input and
stops with "Could not guard on data-dependent expression Eq(u0, 1)", a message about sympy
symbols whose useful part, the user's source line, sits near the end of a long graph dump
("Caused by: (transformers/models/longformer/modeling_longformer.py:549 in forward)").
Longformer meets it (``if is_global_attn:``, computed from the global attention mask). Where
``bool(tensor)`` goes through torch's own function mode (``not t.all()``: BART's float16 clamp,
``if hidden_states.dtype == torch.float16 and not torch.isfinite(hidden_states).all():``), the
"Caused by" frame is torch's and the user's line is the one under "The following call raised
this error". :func:`export_failure_message` names that line and says what to change; any other
failure keeps its first line.
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
import sys
from collections.abc import Iterator

__all__ = ["export_failure_message", "is_data_dependent", "partial_graph_dropped"]

_CAUSED_BY = re.compile(r"Caused by: \(([^)]*)\)")
_CALL = re.compile(
    r"The following call raised this error:\s*\n"
    r'\s*File "([^"]+)", line (\d+), in (\S+)\n\s*([^\n]*)'
)
# where a frame path starts inside torch itself (then the frame is not the user's)
_TORCH_FRAME = re.compile(r"(^|/)(torch|_export|_dynamo|fx)/")
_GUARD = re.compile(r"Could not guard on data-dependent expression ([^\n]*?)(?: \(unhinted|\.|$)")


def export_failure_message(name: str, err: BaseException) -> str:
    """``torch.export failed for NAME: ...``: for a branch on a tensor's value, where it is
    and what to do about it; otherwise the error's first line."""
    text = str(err).strip()
    first = text.splitlines()[0] if text else type(err).__name__
    guard = _GUARD.search(text)
    if guard is None or "data-dependent" not in text:
        return f"torch.export failed for {name}: {first}"
    at = _branch_location(text)
    return (
        f"torch.export failed for {name}: the model branches on the value of a tensor{at} "
        f"(a Python `if` on `.item()` or `bool(tensor)`; torch says: could not guard on "
        f"data-dependent expression {guard.group(1).strip()}). One compiled graph serves every "
        "input, so such a branch cannot be compiled: write it with torch.where / torch.cond, "
        "or take the branch outside the compiled module"
    )


def is_data_dependent(err: BaseException) -> bool:
    """Whether a failed export stopped at a branch on a tensor's value (torch could not guard
    on a data-dependent expression), anywhere in the exception's chain."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if _GUARD.search(str(err)) and "data-dependent" in str(err):
            return True
        err = err.__cause__ or err.__context__
    return False


@contextlib.contextmanager
def partial_graph_dropped() -> Iterator[None]:
    """Around a ``torch.export`` that may stop at a branch on a value: torch prints the graph
    traced so far on stderr before raising (``print(e.partial_fx_graph, file=sys.stderr)``),
    a page of noise where plus_tvm compiles the branch by speculation or names its line.
    That print is dropped, and so is torch's warning that it found no source line to suggest a
    ``torch._check`` at ("Unable to find user code corresponding to {u0}"); anything else the
    export wrote on stderr is written after it."""
    held = io.StringIO()
    failed: BaseException | None = None
    shapes_log = logging.getLogger("torch.fx.experimental.symbolic_shapes")
    shapes_log.addFilter(_no_user_code_warning)
    try:
        with contextlib.redirect_stderr(held):
            yield
    except BaseException as err:
        failed = err
        raise
    finally:
        shapes_log.removeFilter(_no_user_code_warning)
        text = held.getvalue()
        graph = getattr(failed, "partial_fx_graph", None)
        if graph is not None and is_data_dependent(failed):
            text = text.replace(f"{graph}\n", "")
        if text:
            sys.stderr.write(text)


def _no_user_code_warning(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith("Unable to find user code corresponding to")


def _branch_location(text: str) -> str:
    """`` at FILE:LINE in FUNCTION`` of the branch (the user's frame, with its source line
    where torch printed it), or ``""``."""
    caused = _CAUSED_BY.search(text)
    if caused and not _TORCH_FRAME.search(caused.group(1)):
        return f" at {caused.group(1)}"
    call = _CALL.search(text)
    if call is not None:
        path, line, function, source = call.groups()
        path = path.split("site-packages/")[-1]
        code = f" (`{source.strip()}`)" if source.strip() else ""
        return f" at {path}:{line} in {function}{code}"
    return f" at {caused.group(1)}" if caused else ""
