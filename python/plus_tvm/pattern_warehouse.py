"""The pattern warehouse (PluS section 4.3): +Graph patterns mapped to library implementations.

Each entry is one TOML file ``NAME.toml``: a +Graph skeleton (the paper's ``loop0 [M, para]``
notation), the ``allow_prologue`` / ``allow_epilogue`` flags of algorithm 2, a priority,
whether the pattern also matches under a leading batch loop (``batched``),
constraints on the matched subgraph and one or more implementations, each bound to a target and
optionally to a shape condition (``when``), which routes one pattern to different kernels by
size, as PluS routes attention to different vendors by batch size. See
``plus_tvm.warehouse``'s docstring for the format.

Entries are data: loading parses TOML and +Graph text and never executes code from an entry
folder. Every problem is a :class:`WarehouseError` whose message starts with ``path:line:``.

Sources, in this order (names must be unique across all of them):

1. the entries shipped in the package (``plus_tvm.warehouse``);
2. each folder of the ``PLUS_TVM_WAREHOUSE`` environment variable (``os.pathsep``-separated);
3. the folders passed to :func:`load_warehouse` (``Options.warehouse``).
"""

from __future__ import annotations

import ast
import difflib
import functools
import hashlib
import importlib.resources
import json
import numbers
import os
import re
import textwrap
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from . import env as _env
from .errors import PlusError

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: tomllib is the standard-library copy of tomli
    import tomli as tomllib

if TYPE_CHECKING:  # the parser is imported when entries are loaded
    from .plusgraph import PlusGraph

ENV_VAR = _env.WAREHOUSE  # (the name defined in plus_tvm.env; kept here for callers)
TARGETS = ("llvm", "cuda", "any")

_TOP_KEYS = (
    "name",
    "description",
    "allow_prologue",
    "allow_epilogue",
    "priority",
    "batched",
    "graph",
    "constraints",
    "implementation",
)
_CONSTRAINT_KEYS = ("dtype", "static_sizes", "layout")
_IMPL_KEYS = ("name", "target", "when", "dtypes")
_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")
_DTYPE_RE = re.compile(r"^(bool|(u?int|float|bfloat)[0-9]+(_[A-Za-z0-9]+)?)$")


class WarehouseError(PlusError, ValueError):
    """A warehouse entry or folder is invalid; the message starts with ``path:line: ``.

    ``path``, ``line`` (``None`` for a folder-level problem, then the message starts with
    ``path: ``) and ``msg`` are kept as attributes.
    """

    def __init__(self, path: str, line: int | None, msg: str) -> None:
        self.path = path
        self.line = line
        self.msg = msg
        where = f"{path}:{line}" if line is not None else path
        super().__init__(f"{where}: {msg}")


class UnknownEntryError(PlusError, KeyError):
    """:meth:`Warehouse.get` was asked for a name that no entry has."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else ""


# ----------------------------------------------------------------------------- when conditions
_BIN_OPS = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.FloorDiv: lambda a, b: a // b,
    ast.Mod: lambda a, b: a % b,
}
_CMP_OPS = {
    ast.Eq: lambda a, b: a == b,
    ast.NotEq: lambda a, b: a != b,
    ast.Lt: lambda a, b: a < b,
    ast.LtE: lambda a, b: a <= b,
    ast.Gt: lambda a, b: a > b,
    ast.GtE: lambda a, b: a >= b,
}
MAX_WHEN_CHARS = 2000  # a size condition is a handful of comparisons
_WHEN_HELP = "allowed: size names, integers, + - * // %, comparisons, and/or/not, parentheses"


class _WhenSyntaxError(Exception):
    pass


def _segment(text: str, node: ast.AST) -> str:
    return ast.get_source_segment(text, node) or type(node).__name__


def check_when(text: str, size_names: Collection[str]) -> None:
    """Validate a ``when`` condition; raises ``ValueError`` naming the offending token.

    The grammar is a whitelist over Python's ``ast``: size names of the graph, integer
    literals, ``+ - * // %``, comparisons, ``and``/``or``/``not`` and parentheses; the whole
    condition must be a boolean (a comparison or a logical combination of them).
    """
    if len(text) > MAX_WHEN_CHARS:
        raise ValueError(
            f"when condition is {len(text)} characters long; at most {MAX_WHEN_CHARS} are allowed"
        )
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as err:
        raise ValueError(
            f"when = {text!r} is not a valid condition: {err.msg} at column {err.offset}"
        ) from None
    except (RecursionError, MemoryError):
        raise ValueError("when condition is nested too deeply to parse") from None
    src = text.strip()

    def kind(node: ast.AST) -> str:  # "int" or "bool"
        if isinstance(node, ast.Constant):
            if isinstance(node.value, int) and not isinstance(node.value, bool):
                return "int"
            raise ValueError(f"{_segment(src, node)!r} is not allowed in when ({_WHEN_HELP})")
        if isinstance(node, ast.Name):
            if node.id not in size_names:
                names = ", ".join(sorted(size_names)) or "none"
                raise ValueError(
                    f"unknown size name {node.id!r} in when (sizes of the graph: {names})"
                )
            return "int"
        if isinstance(node, ast.BinOp) and type(node.op) in _BIN_OPS:
            for side in (node.left, node.right):
                if kind(side) != "int":
                    raise ValueError(f"{_segment(src, side)!r} must be an integer expression")
            return "int"
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            if kind(node.operand) != "int":
                raise ValueError(f"{_segment(src, node.operand)!r} must be an integer expression")
            return "int"
        if isinstance(node, ast.Compare) and all(type(op) in _CMP_OPS for op in node.ops):
            for side in (node.left, *node.comparators):
                if kind(side) != "int":
                    raise ValueError(f"{_segment(src, side)!r} must be an integer expression")
            return "bool"
        if isinstance(node, ast.BoolOp):
            for value in node.values:
                if kind(value) != "bool":
                    raise ValueError(f"{_segment(src, value)!r} must be a condition")
            return "bool"
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            if kind(node.operand) != "bool":
                raise ValueError(f"{_segment(src, node.operand)!r} must be a condition")
            return "bool"
        if isinstance(node, ast.Call):
            raise ValueError(f"function call {_segment(src, node)!r} is not allowed in when")
        raise ValueError(f"{_segment(src, node)!r} is not allowed in when ({_WHEN_HELP})")

    try:
        top = kind(tree.body)
    except RecursionError:
        raise ValueError("when condition is nested too deeply") from None
    if top != "bool":
        raise ValueError(f"when = {text!r} must be a condition (e.g. a comparison), not a number")


@functools.lru_cache(maxsize=256)
def _when_tree(text: str) -> ast.expr:
    return ast.parse(text.strip(), mode="eval").body


class _UnknownError(Exception):
    """A referenced size is symbolic or missing, or the arithmetic is undefined."""


def _as_int(value: object) -> int | None:
    """``value`` as an int when it is a known size (int, numpy int, TVM ``IntImm``)."""
    value = getattr(value, "value", value)  # tvm IntImm; a symbolic tirx.Var has no value
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        return None
    return int(value)


def _eval(node: ast.expr, sizes: Mapping[str, object]) -> object:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        value = _as_int(sizes.get(node.id))
        if value is None:
            raise _UnknownError
        return value
    if isinstance(node, ast.BinOp):
        left, right = _eval(node.left, sizes), _eval(node.right, sizes)
        if isinstance(node.op, (ast.FloorDiv, ast.Mod)) and right == 0:
            raise _UnknownError
        return _BIN_OPS[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp):
        if isinstance(node.op, ast.Not):
            value = _eval3(node.operand, sizes)
            return None if value is None else not value
        value = _eval(node.operand, sizes)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.Compare):
        left = _eval(node.left, sizes)
        for op, comparator in zip(node.ops, node.comparators):
            right = _eval(comparator, sizes)
            if not _CMP_OPS[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.BoolOp):
        # three-valued logic: a known False decides ``and`` (a known True ``or``) even when the
        # other operands are unknown
        results = [_eval3(v, sizes) for v in node.values]
        decisive = isinstance(node.op, ast.Or)
        if decisive in results:
            return decisive
        return None if None in results else not decisive
    raise _UnknownError  # unreachable for validated conditions


def _eval3(node: ast.expr, sizes: Mapping[str, object]) -> bool | None:
    try:
        value = _eval(node, sizes)
    except _UnknownError:
        return None
    return None if value is None else bool(value)


# ----------------------------------------------------------------------------- the data model
@dataclass(frozen=True)
class Implementation:
    """One binding of an entry: a dispatch implementation name, a target and a shape condition.

    Parameters
    ----------
    name : str
        A name registered with the dispatch binder (``plus_tvm.dispatch``).
    target : {"llvm", "cuda", "any"}
        Target kind the implementation runs on.
    when : str or None
        Condition over the +Graph's size names (e.g. ``"M >= 512"``); ``None`` always applies.
    line : int
        Line of the implementation in its entry file (for messages).
    dtypes : tuple of str or None
        The element dtypes it takes: its own ``dtypes``, else the entry's ``[constraints]
        dtype``, else those of its library kernel (``LibraryKernel.dtypes``); ``None``: any. A
        subgraph in another dtype is not given to it (the dispatcher declines it, saying so).
    """

    name: str
    target: str
    when: str | None
    line: int
    dtypes: tuple[str, ...] | None = None

    def takes(self, dtypes: Collection[str]) -> bool:
        """Whether it takes tensors of every dtype in ``dtypes``."""
        return self.dtypes is None or all(str(d) in self.dtypes for d in dtypes)

    def evaluate(self, sizes: Mapping[str, int]) -> bool | None:
        """Evaluate ``when`` for concrete sizes (name -> int).

        Returns ``True`` without a condition, ``None`` when the answer depends on a size that is
        missing from ``sizes`` or not an integer (symbolic), else the condition's value.
        """
        if self.when is None:
            return True
        return _eval3(_when_tree(self.when), sizes)

    def matches_target(self, target: object) -> bool:
        """Whether it runs on ``target`` (a kind name or a ``tvm.target.Target``)."""
        kind = getattr(getattr(target, "kind", None), "name", target)
        return self.target == "any" or self.target == kind

    def to_dict(self) -> dict[str, object]:
        """JSON-ready fields (without the line)."""
        dtypes = list(self.dtypes) if self.dtypes is not None else None
        return {"name": self.name, "target": self.target, "when": self.when, "dtypes": dtypes}


@dataclass(frozen=True)
class Constraints:
    """Constraints on a subgraph matched by an entry.

    Parameters
    ----------
    dtypes : tuple of str or None
        Element dtypes the subgraph's tensors may have; ``None`` allows any.
    static_sizes : bool
        Every loop size must be a compile-time integer.
    layout : str or None
        Free-form layout (e.g. ``"NCHW"``) checked by the implementation binder; ``None`` or
        ``"any"`` means no constraint.
    """

    dtypes: tuple[str, ...] | None = None
    static_sizes: bool = False
    layout: str | None = None

    def admits(self, dtypes: Collection[str], sizes: Mapping[str, object] | None = None) -> bool:
        """Whether tensors of ``dtypes`` and loop ``sizes`` (name -> int or symbolic) pass."""
        sizes = sizes or {}
        if self.dtypes is not None and any(str(d) not in self.dtypes for d in dtypes):
            return False
        if self.static_sizes and any(_as_int(v) is None for v in sizes.values()):
            return False
        return True

    def to_dict(self) -> dict[str, object]:
        """JSON-ready fields."""
        return {
            "dtype": list(self.dtypes) if self.dtypes is not None else None,
            "static_sizes": self.static_sizes,
            "layout": self.layout,
        }


@dataclass(frozen=True)
class WarehouseEntry:
    """One pattern of the warehouse, as loaded from ``path``.

    ``graph`` is the parsed +Graph; ``graph_text`` is the text as written in the file
    (``graph.to_text()`` gives the canonical form). ``implementations`` are tried in order.
    """

    name: str
    description: str
    graph: PlusGraph = field(compare=False, hash=False)
    graph_text: str
    allow_prologue: bool
    allow_epilogue: bool
    priority: int
    constraints: Constraints
    implementations: tuple[Implementation, ...]
    path: str
    batched: bool = False  # the pattern may run under one leading batch loop (match.unbatched)

    def candidates(self, target: object) -> tuple[Implementation, ...]:
        """Implementations that run on ``target`` (kind name or ``Target``), in order."""
        return tuple(i for i in self.implementations if i.matches_target(target))

    def select(self, target: object, sizes: Mapping[str, int]) -> Implementation | None:
        """The first implementation for ``target`` whose condition is true for ``sizes``.

        Conditions that cannot be decided (symbolic sizes) are skipped; a caller routing at run
        time uses :meth:`candidates` and :meth:`Implementation.evaluate` instead.
        """
        for impl in self.candidates(target):
            if impl.evaluate(sizes) is True:
                return impl
        return None

    def to_dict(self, *, with_path: bool = True) -> dict[str, object]:
        """JSON-ready fields; the graph in canonical text."""
        out: dict[str, object] = {
            "name": self.name,
            "description": self.description,
            "priority": self.priority,
            "allow_prologue": self.allow_prologue,
            "allow_epilogue": self.allow_epilogue,
            "batched": self.batched,
            "graph": self.graph.to_text(),
            "constraints": self.constraints.to_dict(),
            "implementations": [i.to_dict() for i in self.implementations],
        }
        if with_path:
            out["path"] = self.path
        return out


@dataclass(frozen=True)
class Warehouse:
    """An immutable set of entries, ordered by decreasing priority, then name.

    ``dirs`` are the folders the entries were loaded from, in loading order.
    """

    entries: tuple[WarehouseEntry, ...] = ()
    dirs: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        entries = tuple(sorted(self.entries, key=lambda e: (-e.priority, e.name)))
        object.__setattr__(self, "entries", entries)
        object.__setattr__(self, "dirs", tuple(self.dirs))
        seen: dict[str, WarehouseEntry] = {}
        for e in entries:
            if e.name in seen:
                raise WarehouseError(
                    e.path, 1, f"duplicate entry name {e.name!r} (also in {seen[e.name].path})"
                )
            seen[e.name] = e

    def __iter__(self) -> Iterator[WarehouseEntry]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, name: object) -> bool:
        return any(e.name == name for e in self.entries)

    def names(self) -> list[str]:
        """Entry names in priority order."""
        return [e.name for e in self.entries]

    def get(self, name: str) -> WarehouseEntry:
        """The entry called ``name``; :class:`UnknownEntryError` names close matches."""
        for e in self.entries:
            if e.name == name:
                return e
        names = sorted(self.names())
        close = difflib.get_close_matches(name, names, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise UnknownEntryError(
            f"no warehouse entry named {name!r}{hint} (entries: {', '.join(names) or 'none'})"
        )

    def digest(self) -> str:
        """A stable hash of the entries' contents (not their file paths), for cache keys."""
        data = [e.to_dict(with_path=False) for e in self.entries]
        text = json.dumps(data, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


# ----------------------------------------------------------------------------- loading
def package_dir() -> str:
    """The folder of the entries shipped with plus_tvm."""
    return str(importlib.resources.files("plus_tvm.warehouse"))


def env_folders() -> tuple[str, ...]:
    """The folders ``$PLUS_TVM_WAREHOUSE`` names now (``os.pathsep``-separated)."""
    return _env.warehouse_folders()


def load_warehouse(
    extra_dirs: Sequence[str] = (),
    *,
    use_env: bool = True,
    env_dirs: Sequence[str] | None = None,
    known_implementations: Collection[str] | None = None,
    kernel_dtypes: Mapping[str, tuple[str, Collection[str]]] | None = None,
) -> Warehouse:
    """Load the shipped entries, then ``$PLUS_TVM_WAREHOUSE``'s folders, then ``extra_dirs``.

    Parameters
    ----------
    extra_dirs : sequence of str
        More entry folders (``Options.warehouse``); only ``*.toml`` files are read.
    use_env : bool
        Also read the folders of the ``PLUS_TVM_WAREHOUSE`` environment variable
        (``os.pathsep``-separated).
    env_dirs : sequence of str, optional
        Those folders as read earlier (``Options.warehouse_env``); the environment is then not
        read again.
    known_implementations : collection of str, optional
        Implementation names entries may use; default: ``plus_tvm.dispatch.known_implementations()``
        where that module exists (otherwise names are not checked).
    kernel_dtypes : mapping, optional
        Implementation name -> (library kernel name, the dtypes it takes); an implementation
        declaring another dtype (its ``dtypes`` or the entry's ``[constraints] dtype``) is an
        error. Default: :func:`implementation_kernels` (the kernels' own declarations).

    Returns
    -------
    Warehouse

    Raises
    ------
    WarehouseError
        ``path:line: what`` for the first invalid entry, a duplicate name (naming both files) or
        a missing folder.
    """
    if isinstance(extra_dirs, str):
        extra_dirs = (extra_dirs,)
    if known_implementations is None:
        try:
            from .dispatch import known_implementations as _known
        except ImportError:
            known = None
        else:
            known = frozenset(_known())
    else:
        known = frozenset(known_implementations)
    kernels = implementation_kernels() if kernel_dtypes is None else kernel_dtypes

    sources: list[tuple[str, str]] = [(package_dir(), "the shipped warehouse")]
    if use_env or env_dirs is not None:
        env = env_folders() if env_dirs is None else tuple(env_dirs)
        sources += [(d, ENV_VAR) for d in env]
    sources += [(str(d), "the extra folders (Options.warehouse)") for d in extra_dirs]

    entries: dict[str, WarehouseEntry] = {}
    loaded_dirs: list[str] = []
    seen_dirs: set[str] = set()
    for folder, origin in sources:
        if not os.path.isdir(folder):
            what = "does not exist" if not os.path.exists(folder) else "is not a folder"
            raise WarehouseError(folder, None, f"warehouse folder {what} (from {origin})")
        real = os.path.realpath(folder)
        if real in seen_dirs:  # the same folder named twice (env and options): read it once
            continue
        seen_dirs.add(real)
        loaded_dirs.append(folder)
        for fname in sorted(os.listdir(folder)):
            path = os.path.join(folder, fname)
            if not fname.endswith(".toml") or fname.startswith(".") or not os.path.isfile(path):
                continue
            entry = load_entry(path, known_implementations=known, kernel_dtypes=kernels)
            if entry.name in entries:
                first = entries[entry.name]
                raise WarehouseError(
                    path,
                    _KeyLines(_read(path)).line(("name",)),
                    f"duplicate entry name {entry.name!r}: already defined in {first.path}",
                )
            entries[entry.name] = entry
    return Warehouse(tuple(entries.values()), tuple(loaded_dirs))


def _read(path: str) -> str:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as err:
        raise WarehouseError(path, None, f"cannot read entry file: {err.strerror}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise WarehouseError(path, line, "entry file is not UTF-8 text") from None


class _KeyLines:
    """Line numbers of the keys and tables of a TOML text (tomllib does not report them).

    A light scan that understands the subset entries use: ``[table]``, ``[[array]]``,
    ``key = value`` with dotted or quoted keys, and multi-line strings.
    """

    _BARE = r"""(?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*')"""
    _KEY_RE = re.compile(rf"^({_BARE}(?:\s*\.\s*{_BARE})*)\s*=(.*)$")

    def __init__(self, text: str) -> None:
        self.lines: dict[tuple, int] = {}
        self.values: dict[tuple, str] = {}  # raw text after ``=`` on the key's line
        self.n_lines = max(len(text.splitlines()), 1)
        table: tuple = ()
        counts: dict[tuple, int] = {}
        in_string: str | None = None
        self.unclosed_string: int | None = None  # line of a multi-line string never closed
        for i, raw in enumerate(text.splitlines(), start=1):
            if in_string is not None:
                if in_string in raw:
                    in_string = self.unclosed_string = None
                continue
            s = raw.strip()
            if not s or s.startswith("#"):
                continue
            if s.startswith("[["):
                name = self._split(s[2:].split("]]", 1)[0])
                counts[name] = counts.get(name, -1) + 1
                table = (*name, counts[name])
                self.lines.setdefault(name, i)
                self.lines[table] = i
                continue
            if s.startswith("["):
                table = self._split(s[1:].split("]", 1)[0])
                self.lines.setdefault(table, i)
                continue
            m = self._KEY_RE.match(raw.lstrip())
            if not m:
                continue
            key = (*table, *self._split(m.group(1)))
            self.lines.setdefault(key, i)
            value = m.group(2).lstrip()  # trailing blanks may belong to a multi-line string
            self.values.setdefault(key, value)
            for delim in ('"""', "'''"):
                if value.startswith(delim) and delim not in value[3:]:
                    in_string, self.unclosed_string = delim, i
                    break

    @staticmethod
    def _split(dotted: str) -> tuple:
        return tuple(p.strip().strip("\"'") for p in dotted.split("."))

    def line(self, key: tuple) -> int:
        """Line of ``key`` or of its closest enclosing key or table; 1 when unknown."""
        for n in range(len(key), 0, -1):
            if key[:n] in self.lines:
                return self.lines[key[:n]]
        return 1


def _toml_error_line(err: tomllib.TOMLDecodeError, keys: _KeyLines) -> tuple[int, str]:
    msg = str(err)
    m = re.search(r"\s*\(at line (\d+), column (\d+)\)$", msg)
    if m:
        return int(m.group(1)), f"{msg[: m.start()]} (column {m.group(2)})"
    m = re.search(r"\s*\(at end of document\)$", msg)
    if m and keys.unclosed_string is not None:
        return keys.unclosed_string, f"{msg[: m.start()]}: the string opened here is never closed"
    if m:
        return keys.n_lines, f"{msg[: m.start()]} (at end of file)"
    return getattr(err, "lineno", None) or 1, msg


def _type_name(value: object) -> str:
    return {
        bool: "a boolean",
        int: "an integer",
        float: "a float",
        str: "a string",
        list: "an array",
        dict: "a table",
    }.get(type(value), type(value).__name__)


def implementation_kernels() -> dict[str, tuple[str, tuple[str, ...]]]:
    """Implementation name -> (library kernel, the dtypes it takes), as each kernel declares
    them (``LibraryKernel.implementations`` and ``dtypes``, ``plus_tvm.runtime``)."""
    from .runtime import KERNELS

    return {i: (k.name, tuple(k.dtypes)) for k in KERNELS.values() for i in k.implementations}


def load_entry(
    path: str,
    *,
    known_implementations: Collection[str] | None = None,
    kernel_dtypes: Mapping[str, tuple[str, Collection[str]]] | None = None,
) -> WarehouseEntry:
    """Load and validate one entry file (see :func:`load_warehouse`)."""
    from .plusgraph import PlusGraphSyntaxError, parse_plusgraph

    text = _read(path)
    keys = _KeyLines(text)

    def fail(key: tuple, msg: str) -> WarehouseError:
        return WarehouseError(path, keys.line(key), msg)

    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        line, msg = _toml_error_line(err, keys)
        raise WarehouseError(path, line, f"TOML syntax error: {msg}") from None

    def unknown_keys(table: Mapping, allowed: Sequence[str], prefix: tuple, where: str) -> None:
        for k in table:
            if k not in allowed:
                close = difflib.get_close_matches(k, allowed, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise fail(
                    (*prefix, k),
                    f"unknown key {k!r} in {where}{hint} (allowed: {', '.join(allowed)})",
                )

    def typed(table: Mapping, key: str, types: tuple, what: str, prefix: tuple, default=None):
        if key not in table:
            return default
        value = table[key]
        # bool is an int in Python; a TOML boolean is never a valid integer here
        if not isinstance(value, types) or (bool not in types and isinstance(value, bool)):
            raise fail((*prefix, key), f"{key} must be {what}, got {_type_name(value)}")
        return value

    unknown_keys(doc, _TOP_KEYS, (), "the entry")
    stem = os.path.basename(path)[: -len(".toml")]
    if "name" not in doc:
        raise WarehouseError(path, 1, f"missing key 'name' (expected name = {stem!r})")
    name = typed(doc, "name", (str,), "a string", ())
    if not _NAME_RE.match(name):
        raise fail(("name",), f"entry name {name!r} must match {_NAME_RE.pattern}")
    if name != stem:
        raise fail(
            ("name",), f"entry name {name!r} does not match its file name {stem + '.toml'!r}"
        )
    description = typed(doc, "description", (str,), "a string", (), "")
    allow_prologue = typed(doc, "allow_prologue", (bool,), "true or false", (), False)
    allow_epilogue = typed(doc, "allow_epilogue", (bool,), "true or false", (), False)
    priority = typed(doc, "priority", (int,), "an integer", (), 0)
    batched = typed(doc, "batched", (bool,), "true or false", (), False)

    # the graph
    if "graph" not in doc:
        raise WarehouseError(path, 1, "missing key 'graph' (the +Graph text)")
    graph_text = typed(doc, "graph", (str,), "a string", ())
    graph_text = textwrap.dedent(graph_text)
    if not graph_text.strip():
        raise fail(("graph",), "graph is empty")
    try:
        graph = parse_plusgraph(graph_text)
    except PlusGraphSyntaxError as err:
        raise WarehouseError(path, _graph_line(keys, err.line), f"bad +Graph: {err.msg}") from None
    if not any(True for _ in graph.loops()):
        raise fail(("graph",), "graph has no loops")
    size_names = set(graph.size_names())

    # constraints
    cons_table = typed(doc, "constraints", (dict,), "a table ([constraints])", (), {})
    unknown_keys(cons_table, _CONSTRAINT_KEYS, ("constraints",), "[constraints]")
    dtypes = typed(cons_table, "dtype", (list,), "an array of dtype strings", ("constraints",))
    if dtypes is not None:
        for d in dtypes:
            if not isinstance(d, str) or not _DTYPE_RE.match(d):
                raise fail(("constraints", "dtype"), f"{d!r} is not a dtype (e.g. 'float32')")
        dtypes = tuple(dtypes)
    static_sizes = typed(
        cons_table, "static_sizes", (bool,), "true or false", ("constraints",), False
    )
    layout = typed(cons_table, "layout", (str,), "a string", ("constraints",))
    constraints = Constraints(dtypes, static_sizes, None if layout == "any" else layout)

    # implementations
    if "implementation" not in doc:
        raise WarehouseError(
            path, keys.n_lines, "missing [[implementation]] (at least one is required)"
        )
    impls = doc["implementation"]
    if not isinstance(impls, list) or not all(isinstance(t, dict) for t in impls):
        raise fail(
            ("implementation",),
            "implementation must be an array of tables: write [[implementation]]",
        )
    if not impls:
        raise fail(("implementation",), "at least one [[implementation]] is required")
    implementations = []
    for idx, table in enumerate(impls):
        prefix = ("implementation", idx)
        unknown_keys(table, _IMPL_KEYS, prefix, "[[implementation]]")
        if "name" not in table:
            raise fail(prefix, "[[implementation]] is missing 'name'")
        impl_name = typed(table, "name", (str,), "a string", prefix)
        if known_implementations is not None and impl_name not in known_implementations:
            close = difflib.get_close_matches(impl_name, sorted(known_implementations), n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise fail((*prefix, "name"), f"unknown implementation {impl_name!r}{hint}")
        target = typed(table, "target", (str,), "a string", prefix, "any")
        if target not in TARGETS:
            raise fail(
                (*prefix, "target"), f"unknown target {target!r} (one of {', '.join(TARGETS)})"
            )
        when = typed(table, "when", (str,), "a string", prefix)
        if when is not None:
            try:
                check_when(when, size_names)
            except ValueError as err:
                raise fail((*prefix, "when"), str(err)) from None
            when = when.strip()
        impl_dtypes = typed(table, "dtypes", (list,), "an array of dtype strings", prefix)
        for d in impl_dtypes or ():
            if not isinstance(d, str) or not _DTYPE_RE.match(d):
                raise fail((*prefix, "dtypes"), f"{d!r} is not a dtype (e.g. 'float32')")
        takes = tuple(impl_dtypes) if impl_dtypes is not None else dtypes
        kernel, kernel_takes = (kernel_dtypes or {}).get(impl_name, (None, None))
        if kernel is not None and takes is not None:
            other = [d for d in takes if d not in kernel_takes]
            if other:
                where = (*prefix, "dtypes") if impl_dtypes is not None else ("constraints", "dtype")
                raise fail(
                    where,
                    f"implementation {impl_name!r} declares {', '.join(other)}, which its kernel "
                    f"{kernel} does not take (it takes {', '.join(kernel_takes)})",
                )
        if takes is None and kernel is not None:
            takes = tuple(kernel_takes)
        implementations.append(
            Implementation(impl_name, target, when, keys.line(prefix), takes)
        )

    return WarehouseEntry(
        name=name,
        description=description,
        graph=graph,
        graph_text=graph_text,
        allow_prologue=allow_prologue,
        allow_epilogue=allow_epilogue,
        priority=priority,
        constraints=constraints,
        implementations=tuple(implementations),
        path=path,
        batched=batched,
    )


def _graph_line(keys: _KeyLines, graph_line: int | None) -> int:
    """File line of line ``graph_line`` (1-based) of the ``graph`` string."""
    start = keys.line(("graph",))
    value = keys.values.get(("graph",), "")
    if not graph_line or value[:3] not in ('"""', "'''"):
        return start  # a one-line string: every graph line is on the key's line
    # TOML drops a newline right after the opening delimiter; then text line 1 is the next line
    first = start + 1 if value[3:].rstrip("\r\n") == "" else start
    return first + graph_line - 1


__all__ = [
    "ENV_VAR",
    "TARGETS",
    "Constraints",
    "Implementation",
    "UnknownEntryError",
    "Warehouse",
    "WarehouseEntry",
    "WarehouseError",
    "check_when",
    "implementation_kernels",
    "load_entry",
    "load_warehouse",
    "package_dir",
]
