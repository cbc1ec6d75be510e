"""DeclareCaptureVars: bounded symbolic sizes captured per value (PyGraph 4.1, in Relax terms).

TVM's ``RewriteCUDAGraph`` ends a capture region at any kernel whose arguments have a symbolic
size, unless the function lists that size's variable in
``relax.rewrite_cuda_graph.capture_symbolic_vars``; then the runtime captures one graph per value
of it (keyed by the shape values) and never frees them. This pass declares the variables whose
bounds are known and narrow: a function attribute ``tir_var_upper_bound`` (what the frontends
emit for a ``torch.export.Dim(max=...)``; ``StaticPlanBlockMemory`` plans the buffers for the
upper bound), with ``tir_var_lower_bound`` or 1 as the low end, admitting at most ``max_sizes``
values. So the number of graphs per function is bounded at compile time; a wider or unbounded
size stays undeclared and its kernels run outside the graph (``stats["cuda_graph"]`` says
"symbolic size"). Variables a user already declared are kept.
"""

from __future__ import annotations

import tvm
from tvm import relax

from ..symbolic_bounds import lower_bounds, upper_bounds
from ._dataflow_rewrite import map_functions

CAPTURE_ATTR = "relax.rewrite_cuda_graph.capture_symbolic_vars"


@tvm.transform.module_pass(opt_level=0, name="DeclareCaptureVars")
class DeclareCaptureVars:
    """Declare symbolic sizes with at most ``max_sizes`` values as CUDA-graph capture variables.

    Parameters
    ----------
    max_sizes : int
        Most values (graphs) one declared size may have; 0 declares none.
    """

    def __init__(self, max_sizes: int = 32) -> None:
        self.max_sizes = max_sizes

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return map_functions(mod, self._declare)

    def _declare(self, func: relax.Function) -> relax.Function:
        names = self._declared(func)
        return func if names is None else func.with_attr(CAPTURE_ATTR, names)

    def _declared(self, func: relax.Function) -> list[str] | None:
        upper = upper_bounds(func)
        if not upper or self.max_sizes <= 0:
            return None
        lower = lower_bounds(func)
        have = [str(n) for n in (func.attrs.get(CAPTURE_ATTR) or [])]
        new = [
            name
            for name, high in sorted(upper.items())
            if name not in have and high - lower.get(name, 1) + 1 <= self.max_sizes
        ]
        return have + new if new else None
