"""The file format of the ONNX node-test cache: one ``.npz`` that loading cannot run code from.

The cache was a pickle, and unpickling a file runs whatever code it names: a cache file someone
else could write would run as the user. NumPy's ``.npz`` read with ``allow_pickle=False``
holds only plain arrays (an object array, the one kind that would need pickle, is refused), so
a damaged or planted file can fail to load but cannot execute anything. (A digest kept outside
the file would also work, but only while that digest is itself out of reach; this needs no
trust at all.)

Layout: ``index`` is the JSON list of the tests' scalar fields (name, op, tolerances, how many
inputs and outputs each data set has) as bytes; ``c<i>.model`` the i-th test's serialized
``onnx.ModelProto`` as bytes; ``c<i>.s<j>.i<k>`` / ``c<i>.s<j>.o<k>`` the arrays of its data sets.

This module imports numpy alone: the conformance worker reads the cache without importing
plus_tvm (a ``tvm`` worker is TVM alone), as a sibling module of its script.
"""

from __future__ import annotations

import io
import json
import zipfile

import numpy as np

INDEX = "index"


class StoreError(ValueError):
    """The file is not a readable node-test store (damaged, truncated, or another format)."""


def _bytes(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype=np.uint8)


def dumps(cases: list[dict]) -> bytes:
    """The store of ``cases`` (dicts with NodeCase's fields) as bytes."""
    index, arrays = [], {}
    for i, case in enumerate(cases):
        sets = []
        for j, (inputs, outputs) in enumerate(case["data_sets"]):
            sets.append([len(inputs), len(outputs)])
            for k, array in enumerate(inputs):
                arrays[f"c{i}.s{j}.i{k}"] = np.asarray(array)
            for k, array in enumerate(outputs):
                arrays[f"c{i}.s{j}.o{k}"] = np.asarray(array)
        arrays[f"c{i}.model"] = _bytes(case["model"])
        index.append(
            {
                "name": case["name"],
                "op": case["op"],
                "rtol": float(case["rtol"]),
                "atol": float(case["atol"]),
                "sets": sets,
            }
        )
    arrays[INDEX] = _bytes(json.dumps(index).encode())
    out = io.BytesIO()
    np.savez(out, **arrays)
    return out.getvalue()


def load(path: str) -> list[dict]:
    """The tests stored at ``path``, as dicts with NodeCase's fields.

    Raises
    ------
    OSError
        The file cannot be read.
    StoreError
        It is not a store this module wrote (never anything that runs code).
    """
    try:
        with np.load(path, allow_pickle=False) as store:
            index = json.loads(store[INDEX].tobytes())
            return [_case(store, i, entry) for i, entry in enumerate(index)]
    except (AttributeError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile) as err:
        raise StoreError(f"{path}: not a node-test store ({type(err).__name__}: {err})") from None


def _case(store: np.lib.npyio.NpzFile, i: int, entry: dict) -> dict:
    sets = []
    for j, (n_in, n_out) in enumerate(entry["sets"]):
        inputs = tuple(store[f"c{i}.s{j}.i{k}"] for k in range(n_in))
        outputs = tuple(store[f"c{i}.s{j}.o{k}"] for k in range(n_out))
        sets.append((inputs, outputs))
    return {
        "name": str(entry["name"]),
        "op": str(entry["op"]),
        "model": store[f"c{i}.model"].tobytes(),
        "data_sets": tuple(sets),
        "rtol": float(entry["rtol"]),
        "atol": float(entry["atol"]),
    }
