"""Files plus_tvm writes for the user (compiled models, ``--output``, ``--json``): whole or not
at all, at the path given, never through a link.

:func:`replace_atomically` writes into a new temporary file beside the target and renames it
over the target: a reader never sees half a file; an interrupted or failed write (a full disk,
``/dev/full``) leaves the old file as it was and no temporary behind; a symbolic link at the
target is replaced, never followed (so ``-o`` cannot overwrite a file elsewhere through one);
a library mapped by a running process keeps its old inode. No TVM or torch import.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Callable

from .errors import OutputWriteError


def check_target(path: str) -> None:
    """Raise :class:`OutputWriteError` unless a file can be written at ``path``: its folder
    exists and takes new files, and ``path`` is not a folder or a device. Nothing is created
    at ``path`` (a link there is not followed)."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise OutputWriteError(f"cannot write {path}: folder {folder} does not exist")
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as err:
        raise OutputWriteError(f"cannot write {path}: {err.strerror or err}") from None
    if mode is not None and not (stat.S_ISREG(mode) or stat.S_ISLNK(mode)):
        kind = "a folder" if stat.S_ISDIR(mode) else "not a regular file"
        raise OutputWriteError(f"cannot write {path}: it is {kind}")
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as err:
        raise OutputWriteError(f"cannot write {path}: {err.strerror or err}") from None


def replace_atomically(path: str, write: Callable[[str], None]) -> None:
    """``write(tmp)`` into a new file beside ``path``, then rename it to ``path``.

    The new file gets the mode a new file would (``0666`` less the umask). Any failure,
    including an ``OSError`` of ``write``, removes the temporary file; an ``OSError`` becomes
    an :class:`OutputWriteError` naming ``path``.
    """
    check_target(path)
    folder = os.path.dirname(os.path.abspath(path))
    base = os.path.basename(path)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{base}.", suffix=os.path.splitext(base)[1])
    try:
        os.close(fd)
        os.chmod(tmp, 0o666 & ~_umask())
        write(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())  # on disk before it takes the name (a full disk fails here)
        os.replace(tmp, path)
    except OSError as err:
        _remove(tmp)
        raise OutputWriteError(f"cannot write {path}: {err.strerror or err}") from None
    except BaseException:
        _remove(tmp)
        raise


def write_bytes(path: str, data: bytes) -> None:
    """:func:`replace_atomically` with ``data`` as the contents."""

    def write(tmp: str) -> None:
        with open(tmp, "wb") as f:
            f.write(data)

    replace_atomically(path, write)


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _umask() -> int:
    """The process's umask, read without changing it (``os.umask`` would, for every thread)."""
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    return 0o022
