"""SelectCUDAGraphRegions: keep a CUDA graph only where it pays (PyGraph section 4.3).

``cuda_graph=always`` replays every region TVM's rewrite captured. With ``cuda_graph=auto`` this
pass runs the capture passes (staging, planning, ``RewriteCUDAGraph``) and the plain planning
on the same input, and estimates per region the host time a replay saves (its kernels' and
library calls' launches) against the graph launch (``GraphCost``). A region that does not pay
is un-captured: its capture function is called like any other function, so its kernels launch
one by one, in the same static buffers. When the regions kept do not pay for the staging copies
capture needed, the plain module is returned (no copies, no graphs). What the GPU then measures
on first call (``RouteCUDAGraphRuntime``) can only drop a kept region, never add one.
"""

from __future__ import annotations

import json

import tvm
from tvm import relax

from ..costmodel import GraphCost
from ._capture_calls import bindings, capture_call, rewrite_capture_calls
from ._graph_staging import is_kernel_call, is_library_call, staging_copies, tensor_bytes

#: the module attribute holding the selection's estimates (JSON)
SELECTION_ATTR = "plus.cuda_graph_selection"


@tvm.transform.module_pass(opt_level=0, name="SelectCUDAGraphRegions")
class SelectCUDAGraphRegions:
    """Capture where the estimate says it pays (module docstring).

    Parameters
    ----------
    capture : list of Pass
        Phase 6's capture passes (staging, planning, ``RewriteCUDAGraph``).
    plain : list of Pass
        Planning without capture (what ``cuda_graph=off`` runs).
    cost : GraphCost
        Launch and copy costs of the estimate.

    The result carries the module attribute ``plus.cuda_graph_selection`` (JSON,
    :data:`SELECTION_ATTR`): ``costs`` (the figures used and their source, a GPU's
    calibration or the constants), ``staging_us``, ``saving_us``, ``plain`` (nothing kept) and
    ``regions``, per region its name, kernels, library calls, estimated saving (us) and
    whether it was kept (``stats["cuda_graph"]["selection"]``).
    """

    def __init__(
        self,
        capture: list[tvm.transform.Pass],
        plain: list[tvm.transform.Pass],
        cost: GraphCost | None = None,
    ) -> None:
        self.capture = capture
        self.plain = plain
        self.cost = cost or GraphCost()

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        captured = tvm.transform.Sequential(self.capture)(mod)
        decisions: list[dict[str, object]] = []
        saving = {}
        regions = [
            capture.region
            for func in _relax_functions(captured)
            for b in bindings(func)
            if (capture := capture_call(b.value)) is not None
        ]
        for region in dict.fromkeys(regions):  # each capture function once, in program order
            inner = [b.value for b in bindings(captured[region])]
            kernels = sum(is_kernel_call(v, captured) for v in inner)
            library = sum(is_library_call(v) for v in inner)
            saving[region] = self.cost.region_saving_us(kernels, library)
            decisions.append(
                {
                    "region": region.name_hint,
                    "kernels": kernels,
                    "library_calls": library,
                    "saving_us": round(saving[region], 2),
                    "kept": saving[region] > 0,
                }
            )
        copied = [
            tensor_bytes(call.args[0].ty)
            for func in _relax_functions(captured)
            for call in staging_copies(captured, func)
        ]
        staging = self.cost.staging_us(copied)
        kept = sum(s for s in saving.values() if s > 0)
        plain = kept <= staging
        if plain:
            for d in decisions:
                d["kept"] = False
        selection = {
            "costs": self.cost.describe(),  # which figures: a GPU's calibration or constants
            "staging_us": round(staging, 2),
            "saving_us": round(kept, 2),
            "plain": plain,
            "regions": decisions,
        }
        if plain:
            out = tvm.transform.Sequential(self.plain)(mod)
            return out.with_attr(SELECTION_ATTR, json.dumps(selection))

        def uncapture(call: relax.Call, capture) -> relax.Expr | None:
            if saving[capture.region] > 0:
                return None
            return relax.Call(capture.region, list(capture.args.fields))

        out = rewrite_capture_calls(captured, uncapture)
        return out.with_attr(SELECTION_ATTR, json.dumps(selection))


def _relax_functions(mod: tvm.IRModule) -> list[relax.Function]:
    return [
        f
        for _, f in mod.functions_items()
        if isinstance(f, relax.Function) and isinstance(f.body, relax.SeqExpr)
    ]
