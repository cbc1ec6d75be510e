"""A learned kernel-time model: two xgboost regressors (TIR kernels, library calls) of
``log2`` microseconds, trained by ``plus-tvm calibrate`` on this machine's measurements.

The model file is JSON: the feature lists it was trained on (:mod:`.features`), the library
kernel names in the order the ``kernel`` feature numbers them, each booster as xgboost's own
JSON, and how the model was made (machine key, samples, held-out accuracy). Its identity is the
hash of the file, and enters :meth:`plus_tvm.Options.digest` through ``cost_model_id``.

Where a model is looked for (:func:`model_path`): ``Options.cost_model_file`` when set, else
the user's calibration for this machine and target (``<cache root>/costmodel-<kind>-<key>.json``,
see :mod:`plus_tvm.paths`; :func:`calibration`: a damaged one is named in a warning and
ignored), else the model shipped with the package for the target kind (trained on this
project's 2-core CI machine type).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence

import numpy as np

from ..errors import PlusError
from ..paths import private_dir, read_json
from .features import (
    CHOICE_FEATURES,
    GIR_PLAN_FEATURES,
    LIBRARY_FEATURES,
    SUBGRAPH_FEATURES,
    TIR_FEATURES,
    subgraph_features,
)

FORMAT = "plus_tvm.costmodel/1"
_SHIPPED = os.path.join(os.path.dirname(__file__), "data")


class CostModelError(PlusError):
    """A cost model file that cannot be read or was made for something else."""


def user_path(kind: str, key: str) -> str:
    """Where ``plus-tvm calibrate`` stores the model of target kind ``kind`` on the machine
    ``key`` (:func:`plus_tvm.gir.model.figures_key`); the cache root is created (private)
    where missing."""
    return os.path.join(private_dir(), f"costmodel-{kind}-{key}.json")


def shipped_path(kind: str) -> str:
    """The model the package ships for target kind ``kind`` (it may not exist)."""
    return os.path.join(_SHIPPED, f"costmodel-{kind}.json")


def model_problem(data: object) -> str | None:
    """What makes ``data`` (a model file's JSON) unusable, without building its boosters
    (:meth:`LearnedCostModel.load` checks those); None: nothing."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return f"not a cost model (expected format {FORMAT!r})"
    for name, expected in PARTS:
        part = data.get(name)
        if part is None:
            continue
        if not isinstance(part, dict) or not isinstance(part.get("booster"), str):
            return f"its {name} model is damaged"
        features = part.get("features")
        if not isinstance(features, list) or tuple(features) != expected:
            return f"its {name} model was trained on other features (run `plus-tvm calibrate`)"
    return None


def calibration(kind: str, key: str) -> str | None:
    """The user's calibrated model for target kind ``kind`` on machine ``key`` when there is
    a usable one; a damaged or stale file is named in a
    :class:`~plus_tvm.paths.CacheWarning` and ignored (None)."""
    path = user_path(kind, key)
    return path if read_json(path, model_problem) is not None else None


def model_path(kind: str, key: str) -> str | None:
    """The user's calibrated model for this machine (:func:`calibration`), else the shipped
    one, else None."""
    calibrated = calibration(kind, key)
    if calibrated is not None:
        return calibrated
    return shipped_path(kind) if os.path.exists(shipped_path(kind)) else None


#: the regressors a model file may hold: TIR kernels, library calls, the TIR of a matched
#: subgraph (its operators as :func:`.features.subgraph_features` sums them), and the choice
#: itself (``log2`` of TIR time over library time, :func:`.features.choice_features`), and a
#: kernel under one GIR plan (:func:`.features.gir_plan_features`)
PARTS = (
    ("tir", TIR_FEATURES),
    ("library", LIBRARY_FEATURES),
    ("subgraph", SUBGRAPH_FEATURES),
    ("choice", CHOICE_FEATURES),
    ("gir_plan", GIR_PLAN_FEATURES),
)


def _booster(raw: str) -> object:
    import xgboost

    booster = xgboost.Booster()
    booster.load_model(bytearray(raw.encode()))
    return booster


class LearnedCostModel:
    """Predicted microseconds of TIR kernels and library calls (see the module docstring)."""

    def __init__(self, data: dict, identity: str, path: str = "") -> None:
        self.data = data
        self.identity = identity
        self.path = path
        self.kind = str(data.get("target_kind", ""))
        self.kernels = tuple(data.get("kernels", ()))
        self._parts = {}
        for name, expected in PARTS:
            part = data.get(name)
            if part is None:
                continue
            features = tuple(part["features"])
            if features != expected:
                raise CostModelError(
                    f"{path or 'cost model'}: its {name} model was trained on features "
                    f"{list(features)}, this plus_tvm computes {list(expected)}; "
                    "run `plus-tvm calibrate` again"
                )
            self._parts[name] = _booster(part["booster"])

    @classmethod
    def load(cls, path: str) -> LearnedCostModel:
        """Read a model file; :class:`CostModelError` names the file when it is not one."""
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except OSError as err:
            raise CostModelError(f"cannot read cost model {path}: {err.strerror}") from None
        try:
            data = json.loads(raw)
        except ValueError as err:
            raise CostModelError(f"{path}: not a cost model (invalid JSON: {err})") from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise CostModelError(f"{path}: not a cost model (expected format {FORMAT!r})")
        from xgboost.core import XGBoostError  # (here: compiling without a model never loads it)

        try:
            return cls(data, hashlib.sha256(raw).hexdigest()[:16], path)
        except (AttributeError, KeyError, TypeError, ValueError, XGBoostError) as err:
            raise CostModelError(f"{path}: a damaged cost model ({err})") from None

    def has(self, part: str) -> bool:
        return part in self._parts

    def _predict(self, part: str, rows: Sequence[Sequence[float]]) -> list[float]:
        if not rows:
            return []
        booster = self._parts[part]
        logs = booster.inplace_predict(np.asarray(rows, dtype=np.float32))
        return [float(2.0**v) for v in np.atleast_1d(logs)]

    def predict_tir_us(self, vectors: Sequence[dict]) -> list[float]:
        """Microseconds of each TIR kernel (vectors from :func:`.features.tir_features`)."""
        return self._predict("tir", [[v[f] for f in TIR_FEATURES] for v in vectors])

    def predict_gir_plan_us(self, vectors: Sequence[dict]) -> list[float]:
        """Microseconds of a kernel under each GIR plan (vectors from
        :func:`.features.gir_plan_features`)."""
        return self._predict("gir_plan", [[v[f] for f in GIR_PLAN_FEATURES] for v in vectors])

    def predict_subgraph_us(self, members: Sequence[dict]) -> float:
        """Microseconds of the kernels the pipeline makes of a subgraph whose operators, each
        legalized alone, have the TIR vectors ``members``: the subgraph regressor when the
        model has one, else the sum of the operators' predicted times."""
        if "subgraph" in self._parts:
            vector = subgraph_features(members)
            return self._predict("subgraph", [[vector[f] for f in SUBGRAPH_FEATURES]])[0]
        return sum(self.predict_tir_us(members))

    def predict_ratio(self, vector: dict) -> float | None:
        """TIR time over library time of one choice (a :func:`.features.choice_features`
        vector), or None when the model has no choice regressor."""
        if "choice" not in self._parts:
            return None
        row = [self._number(vector[f]) for f in CHOICE_FEATURES]
        return self._predict("choice", [row])[0]

    def _number(self, value: object) -> float:
        """A feature as a number: a library kernel's name by its position in ``kernels``."""
        if isinstance(value, str):
            return float(self.kernels.index(value) if value in self.kernels else -1)
        return float(value)

    def library_row(self, vector: dict) -> list[float]:
        """A library vector as the model's numbers (the kernel name by position)."""
        return [self._number(vector[f]) for f in LIBRARY_FEATURES]

    def predict_library_us(self, vectors: Sequence[dict]) -> list[float]:
        """Microseconds of each library call (vectors from
        :func:`.features.library_features`)."""
        return self._predict("library", [self.library_row(v) for v in vectors])

    def describe(self) -> dict:
        """What the stats and ``plus-tvm calibrate`` show of the model."""
        keep = ("target_kind", "machine", "created", "samples", "accuracy", "calibrate_s")
        return {"id": self.identity, "path": self.path, **{k: self.data.get(k) for k in keep}}
