"""GIR plans ranked by predicted time (``Options.gir_cost="learned"``).

GIR's search (paper 002, section 6) ranks a kernel's candidate plans with an analytic
performance model: bytes per memory level over the machine's bandwidths, synchronizations and
occupancy. Here the learned model's ``gir_plan`` regressor, trained by ``plus-tvm calibrate`` on
the measured times of several plans of each kernel, predicts each of the analytic model's
``top`` best plans from the kernel's TIR vector, the plan's template parameters and the
analytic estimate (:func:`.features.gir_plan_features`), and the fastest prediction is lowered.
"""

from __future__ import annotations

from tvm import tirx

from .features import KernelContext, gir_plan_features, tir_features
from .learned import LearnedCostModel

#: how many of the analytic model's best plans the learned model ranks: calibrate measures as
#: many per kernel, so the model has seen plans of this rank
TOP = 4


class LearnedPlanRanker:
    """A :class:`plus_tvm.gir.search.PlanRanker` on a learned cost model.

    Parameters
    ----------
    model : LearnedCostModel
        A model with a ``gir_plan`` regressor.
    context : KernelContext
        The target's vector lanes and TVM's threads (``gir`` is set: the kernels are GIR's).
    top : int
        How many of the analytic model's best plans are ranked.
    """

    def __init__(self, model: LearnedCostModel, context: KernelContext, top: int = TOP) -> None:
        if not model.has("gir_plan"):
            raise ValueError(
                f"{model.path or 'the cost model'} has no GIR plan regressor "
                "(trained before plus_tvm measured GIR plans): run `plus-tvm calibrate` again"
            )
        self.model = model
        self.context = context
        self.top = top

    def predict_us(self, func: tirx.PrimFunc, plans: list) -> list[float] | None:
        """Predicted microseconds of each plan of ``func``; None where the kernel has symbolic
        extents (its vector needs sizes the schedule does not know)."""
        vector = tir_features(
            func, gir=True, lanes=self.context.lanes, threads=self.context.threads
        )
        if vector is None:
            return None
        rows = [
            gir_plan_features(vector, p.kernel.structure, p.params, p.estimate.seconds)
            for p in plans
        ]
        return self.model.predict_gir_plan_us(rows)
