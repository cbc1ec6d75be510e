# Sourced by scripts/demo and scripts/test: make .venv and install plus-tvm into it, once.
# Idempotent and quick when already set up (a stamp records what was installed).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PYTHON_BIN="${PYTHON:-python3}"
STAMP="$VENV/.plus-tvm-installed"
# (the native kernels' sources too: the install compiles them into the package, setup.py)
WANT="$(cat "$ROOT/pyproject.toml" "$ROOT/scripts/_bootstrap.sh" "$ROOT/setup.py" \
  "$ROOT"/python/plus_tvm/runtime/native/*.{cc,h} | sha256sum | cut -c1-16)"

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV" >&2
  "$PYTHON_BIN" -m venv "$VENV"
fi
if [ "$(cat "$STAMP" 2>/dev/null || true)" != "$WANT" ]; then
  echo "[setup] installing torch (CPU build) and plus-tvm[bench,dev] into $VENV" >&2
  "$VENV/bin/python" -m pip install -q --upgrade pip >&2
  # torch first and pinned: the CPU build lies on this machine's disk; left to the resolver,
  # pip would fetch a multi-GB CUDA build.
  "$VENV/bin/python" -m pip install -q "torch==2.13.0" >&2
  # the build step (setup.py) compiles the native kernels against oneDNN and tvm-ffi: installed
  # here first and built without isolation, so the library matches the versions this venv runs
  # and the build needs no index (without a C++ compiler the package installs without it)
  ONEDNN="sys_platform == 'linux' and platform_machine == 'x86_64'"
  "$VENV/bin/python" -m pip install -q "setuptools>=77" wheel "apache-tvm-ffi>=0.1.14.post0" \
    "onednn-cpu-gomp==2023.2.0; $ONEDNN" "onednn-devel-cpu-gomp==2023.2.0; $ONEDNN" >&2
  "$VENV/bin/python" -m pip install -q --no-build-isolation -e "$ROOT[bench,dev]" >&2
  echo "$WANT" > "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
