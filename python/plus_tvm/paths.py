"""plus_tvm's one cache root, and the checks that keep what it loads from there its own.

Everything plus_tvm builds or measures once per machine lives under one root
(:func:`cache_root`: ``$PLUS_TVM_CACHE_DIR``, else ``$XDG_CACHE_HOME/plus_tvm``): the native
kernels it compiles and then loads into the process (``native/``), CUDA-graph decisions,
measured GIR figures, calibrated cost models, the ONNX node-test cache.

**Why private.** Loading a shared object runs its code, and cached decisions steer what runs:
whoever can write into the cache can run code as the user. So every folder plus_tvm uses there
comes from :func:`private_dir`, which creates missing folders with mode 0700 (whatever the
umask) and refuses, with :class:`~plus_tvm.errors.UnsafeCacheError`, a folder that is not owned
by the current user or is writable by group or others; :func:`read_private` refuses such a
file the same way. Digests kept beside a file in the cache (the native libraries' manifests)
guard against accidents (a truncated or half-written file) and, only because the folder is
private, against other users: someone who can write the folder can rewrite the manifest too.

Files are written with :func:`write_private`: a temporary file in the same folder (mode 0600)
renamed over the target, so a reader never sees half a file, and a library already mapped by a
running process keeps its (unlinked) inode instead of being truncated under it.

No TVM or torch import: the runtime-only path uses this module.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path

from . import env
from .errors import CacheDirError, UnsafeCacheError

PRIVATE_MODE = 0o700


class CacheWarning(UserWarning):
    """A cache file was damaged or not what it should be; it is ignored (and rebuilt)."""


def cache_root() -> Path:
    """The cache root as configured (:func:`plus_tvm.env.cache_dir`); not created here."""
    return Path(env.cache_dir())


def _current_uid() -> int:
    """The user the cache must belong to (a seam: tests stand in another user here)."""
    return os.geteuid()


def check_private(path: str | os.PathLike, st: os.stat_result | None = None) -> None:
    """Refuse ``path`` (its ``stat``: ``st``) unless the current user owns it and neither group
    nor others may write it.

    Raises
    ------
    UnsafeCacheError
        Naming the path, what is wrong and how to fix it.
    """
    st = os.stat(path) if st is None else st
    kind = "folder" if stat.S_ISDIR(st.st_mode) else "file"
    uid = _current_uid()
    if st.st_uid != uid:
        raise UnsafeCacheError(
            f"{path}: plus_tvm's cache {kind} is owned by uid {st.st_uid}, not by you (uid "
            f"{uid}), so it could hold code planted by someone else; remove it, or set "
            f"{env.CACHE_DIR} to a folder of your own"
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafeCacheError(
            f"{path}: plus_tvm's cache {kind} is writable by group or others (mode "
            f"{stat.S_IMODE(st.st_mode):o}), so it could hold code planted by someone else; "
            f"remove it or make it private (chmod go-w {path})"
        )


def _private_folder(folder: Path) -> None:
    """Create ``folder`` with mode 0700 if it is missing, then check it."""
    try:
        os.mkdir(folder, PRIVATE_MODE)
    except FileExistsError:
        pass  # (here before, or made by another process just now): checked below
    else:
        os.chmod(folder, PRIVATE_MODE)  # the umask may have taken bits we asked for
    st = os.stat(folder)
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeCacheError(f"{folder}: plus_tvm's cache needs a folder here; remove the file")
    check_private(folder, st)


def private_dir(*parts: str, root: str | os.PathLike | None = None) -> Path:
    """``root / parts...`` (``root``: :func:`cache_root`), each folder from ``root`` down
    created with mode 0700 where missing, and each checked by :func:`check_private`.

    The folders above ``root`` (``~/.cache``) are created as usual where missing and not
    checked: they are the user's, not plus_tvm's.

    Raises
    ------
    UnsafeCacheError
        A folder on the way is another user's, is writable by group or others, or is a file.
    """
    folder = Path(root) if root is not None else cache_root()
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        _private_folder(folder)
        for part in parts:
            folder = folder / part
            _private_folder(folder)
    except OSError as err:  # (not writable, on /proc, a read-only or full disk ...)
        raise CacheDirError(
            f"cannot use {folder} as plus_tvm's cache folder: {err.strerror or err}; set "
            f"{env.CACHE_DIR} to a folder you can write"
        ) from None
    return folder


def read_private(path: str | os.PathLike) -> bytes | None:
    """The bytes of the cache file ``path``, None when it does not exist; the open file is
    checked (:func:`check_private`), so what is read is what was checked.

    Raises
    ------
    UnsafeCacheError
        The file is another user's or writable by group or others.
    """
    try:
        with open(path, "rb") as f:
            check_private(path, os.fstat(f.fileno()))
            return f.read()
    except (FileNotFoundError, NotADirectoryError):
        return None


def write_private(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically: a temporary file (mode 0600) in the same folder,
    renamed over ``path``. The folder must exist (a :func:`private_dir`)."""
    folder = os.path.dirname(os.fspath(path)) or "."
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def damaged(path: str | os.PathLike, problem: str) -> None:
    """Warn (:class:`CacheWarning`) that the cache file ``path`` is ignored because of
    ``problem``."""
    warnings.warn(
        f"{path}: ignored a damaged plus_tvm cache file ({problem}); it is rebuilt when "
        "plus_tvm next writes it",
        CacheWarning,
        stacklevel=3,
    )


def read_json(path: str | os.PathLike, check: Callable[[object], str | None]) -> object | None:
    """The JSON value of the cache file ``path`` when it exists, parses and passes ``check``
    (which returns what is wrong with a value, or None); otherwise None, with a
    :class:`CacheWarning` naming the file and the problem when it exists but is damaged.

    Raises
    ------
    UnsafeCacheError
        As :func:`read_private`.
    """
    try:
        raw = read_private(path)
    except IsADirectoryError:
        damaged(path, "a folder, not a file")
        return None
    except OSError as err:  # (not UnsafeCacheError, which is no OSError: it propagates)
        damaged(path, f"unreadable: {err.strerror or err}")
        return None
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError) as err:  # (UnicodeDecodeError is a ValueError)
        damaged(path, f"not JSON: {err}")
        return None
    problem = check(value)
    if problem is not None:
        damaged(path, problem)
        return None
    return value


def write_json(path: str | os.PathLike, value: object) -> None:
    """:func:`write_private` of ``value`` as JSON."""
    write_private(path, json.dumps(value, indent=1, sort_keys=True).encode())
