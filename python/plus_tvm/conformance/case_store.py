"""The file format of the ONNX node-test cache: one ``.npz`` that loading cannot run code from.

The cache was a pickle, and unpickling a file runs whatever code it names: a cache file someone
else could write would run as the user. NumPy's ``.npz`` read with ``allow_pickle=False``
holds only plain arrays (an object array, the one kind that would need pickle, is refused), so
a damaged or planted file can fail to load but cannot execute anything. (A digest kept outside
the file would also work, but only while that digest is itself out of reach; this needs no
trust at all.)

Layout: ``index`` is the JSON list of the tests' scalar fields (name, op, tolerances, how many
inputs and outputs each data set has, which arrays are bfloat16) as bytes; ``c<i>.model`` the
i-th test's serialized ``onnx.ModelProto`` as bytes; ``c<i>.s<j>.i<k>`` / ``c<i>.s<j>.o<k>`` the
arrays of its data sets. A bfloat16 array (``ml_dtypes.bfloat16``, which ``.npz`` cannot name)
is stored as its uint16 bits and listed in its test's ``bfloat16`` entry.

This module imports numpy alone (and ``ml_dtypes`` when a bfloat16 array is read): the
conformance worker reads the cache without importing plus_tvm (a ``tvm`` worker is TVM alone),
as a sibling module of its script.
"""

from __future__ import annotations

import io
import json
import zipfile

import numpy as np

INDEX = "index"
BFLOAT16 = "bfloat16"
FORMAT = "format"
VERSION = 2  # 2: bfloat16 arrays (a store of version 1, unmarked, has no bfloat16 tests)


class StoreError(ValueError):
    """The file is not a readable node-test store (damaged, truncated, or another format)."""


class StaleStoreError(StoreError):
    """The file is a store of an older version (it lacks tests this version keeps)."""


def _bytes(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype=np.uint8)


def dumps(cases: list[dict]) -> bytes:
    """The store of ``cases`` (dicts with NodeCase's fields) as bytes."""
    index, arrays = [], {}
    for i, case in enumerate(cases):
        sets, bf16 = [], []
        for j, (inputs, outputs) in enumerate(case["data_sets"]):
            sets.append([len(inputs), len(outputs)])
            named = [(f"c{i}.s{j}.i{k}", a) for k, a in enumerate(inputs)]
            named += [(f"c{i}.s{j}.o{k}", a) for k, a in enumerate(outputs)]
            for key, array in named:
                array = np.asarray(array)
                if array.dtype.name == BFLOAT16:
                    array = array.view(np.uint16)
                    bf16.append(key)
                arrays[key] = array
        arrays[f"c{i}.model"] = _bytes(case["model"])
        index.append(
            {
                "name": case["name"],
                "op": case["op"],
                "rtol": float(case["rtol"]),
                "atol": float(case["atol"]),
                "sets": sets,
                BFLOAT16: bf16,
            }
        )
    arrays[INDEX] = _bytes(json.dumps(index).encode())
    arrays[FORMAT] = np.asarray(VERSION, dtype=np.int64)
    out = io.BytesIO()
    np.savez(out, **arrays)
    return out.getvalue()


def load(path: str) -> list[dict]:
    """The tests stored at ``path``, as dicts with NodeCase's fields.

    Raises
    ------
    OSError
        The file cannot be read.
    StaleStoreError
        It is a store of an older version (a StoreError too).
    StoreError
        It is not a store this module wrote (never anything that runs code).
    """
    try:
        with np.load(path, allow_pickle=False) as store:
            version = int(store[FORMAT]) if FORMAT in store.files else 1
            if version != VERSION:
                raise StaleStoreError(f"{path}: a node-test store of version {version}")
            index = json.loads(store[INDEX].tobytes())
            return [_case(store, i, entry) for i, entry in enumerate(index)]
    except StaleStoreError:
        raise
    except (AttributeError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile) as err:
        raise StoreError(f"{path}: not a node-test store ({type(err).__name__}: {err})") from None


def _case(store: np.lib.npyio.NpzFile, i: int, entry: dict) -> dict:
    bf16 = frozenset(entry.get(BFLOAT16, ()))

    def array(key: str) -> np.ndarray:
        value = store[key]
        if key in bf16:
            import ml_dtypes

            if value.dtype != np.uint16:
                raise ValueError(f"{key}: bfloat16 bits stored as {value.dtype}")
            value = value.view(ml_dtypes.bfloat16)
        return value

    sets = []
    for j, (n_in, n_out) in enumerate(entry["sets"]):
        inputs = tuple(array(f"c{i}.s{j}.i{k}") for k in range(n_in))
        outputs = tuple(array(f"c{i}.s{j}.o{k}") for k in range(n_out))
        sets.append((inputs, outputs))
    return {
        "name": str(entry["name"]),
        "op": str(entry["op"]),
        "model": store[f"c{i}.model"].tobytes(),
        "data_sets": tuple(sets),
        "rtol": float(entry["rtol"]),
        "atol": float(entry["atol"]),
    }
