"""Which half-precision dtypes this CPU computes natively: the one check that both oneDNN paths
(the native kernels' own oneDNN and torch's) ask before taking a bfloat16 / float16 call."""

from __future__ import annotations

import functools

# CPU flags (``/proc/cpuinfo``) under which oneDNN computes a half dtype natively (its
# avx512_core_bf16 / avx512_core_fp16 / AMX code); elsewhere it would emulate it, slower than
# the Python kernels' other paths
HALF_CPU_FLAGS = {"bfloat16": ("avx512_bf16", "amx_bf16"), "float16": ("avx512_fp16", "amx_fp16")}


@functools.lru_cache(maxsize=1)
def cpu_dtypes() -> tuple[str, ...]:
    """The float dtypes oneDNN computes natively on this CPU: float32, and bfloat16 / float16
    where the CPU has the instructions for them (Linux's CPU flags; elsewhere float32 only)."""
    try:
        with open("/proc/cpuinfo") as f:
            line = next((ln for ln in f if ln.startswith("flags")), "")
    except OSError:
        line = ""
    flags = set(line.partition(":")[2].split())
    half = [d for d, needs in HALF_CPU_FLAGS.items() if flags.intersection(needs)]
    return ("float32", *half)
