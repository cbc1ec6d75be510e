"""+Loop and +Graph: the loop-centric subgraph identifier of PluS (paper 000, section 4.1).

A +Graph is a forest of +Loops. Each +Loop has a *size* (an int, or a symbolic name when the
size is only known at run time), a *parallelism* (parallelizable or not: a loop carrying a
reduction is not) and the *operations* of the loop body; the tensors each loop reads and writes
are carried along for code generation but take no part in matching.

The canonical text is the paper's notation, one loop per line and nesting by indentation
(two spaces per level)::

    loop0 [M, para]
      loop1 [N, non-para, (reduceMax)]
        loop2 [K, non-para, (dot)]
      loop3 [N, para, (sub)]

Loops are numbered in pre-order. Sizes are printed as given (an int, ``M``, ``B*L`` after
collapsing); operations in the order they were first met. ``parse_plusgraph`` reads the same
text back (``para`` / ``non-para`` or the paper's long words ``parallelizable`` /
``non-parallelizable``; an optional trailing ``{in,...}:{out,...}`` tensor list is accepted).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from ..errors import PlusError

#: Operations that decide a code-generation schedule: a pattern that names one matches only
#: subgraphs whose loop performs it. Everything else is a trivial operation.
KEY_OPS = frozenset({"dot", "reduceSum", "reduceMax", "reduceMin", "reduceProd"})

Size = int | str


class PlusGraphSyntaxError(PlusError):
    """A +Graph text that does not parse; ``line`` is 1-based within the text."""

    def __init__(self, line: int, msg: str) -> None:
        super().__init__(f"line {line}: {msg}")
        self.line = line
        self.msg = msg


@dataclass(frozen=True)
class PlusLoop:
    """One +Loop: size, parallelism, operations, tensors, nested loops."""

    size: Size
    parallel: bool
    ops: tuple[str, ...] = ()
    children: tuple[PlusLoop, ...] = ()
    inputs: tuple[str, ...] = field(default=(), compare=False)
    outputs: tuple[str, ...] = field(default=(), compare=False)

    def walk(self) -> Iterator[PlusLoop]:
        """This loop and every loop nested in it, in pre-order."""
        yield self
        for child in self.children:
            yield from child.walk()

    @property
    def key_ops(self) -> frozenset[str]:
        return frozenset(op for op in self.ops if op in KEY_OPS)


@dataclass(frozen=True)
class PlusGraph:
    """A forest of +Loops (the identifier of one subgraph)."""

    roots: tuple[PlusLoop, ...]

    def loops(self) -> Iterator[PlusLoop]:
        for root in self.roots:
            yield from root.walk()

    def size_names(self) -> set[str]:
        """Symbolic size names (``M``, ``N`` ...) used anywhere in the graph."""
        names: set[str] = set()
        for loop in self.loops():
            if isinstance(loop.size, str):
                names.update(re.findall(r"[A-Za-z_][A-Za-z_0-9]*", loop.size))
        return names

    def has_skeleton(self) -> bool:
        """True when some loop is non-parallelizable (a skeleton operator, section 4.2)."""
        return any(not loop.parallel for loop in self.loops())

    def to_text(self, *, io: bool = False, key_ops_only: bool = False) -> str:
        """The canonical text; ``io`` appends each loop's ``{inputs}:{outputs}``."""
        lines: list[str] = []
        counter = iter(range(1 << 30))

        def emit(loop: PlusLoop, depth: int) -> None:
            ops = [op for op in loop.ops if op in KEY_OPS] if key_ops_only else list(loop.ops)
            par = "para" if loop.parallel else "non-para"
            body = f"{loop.size}, {par}" + (f", ({', '.join(ops)})" if ops else "")
            line = f"{'  ' * depth}loop{next(counter)} [{body}]"
            if io:
                line += f" {{{','.join(loop.inputs)}}}:{{{','.join(loop.outputs)}}}"
            lines.append(line)
            for child in loop.children:
                emit(child, depth + 1)

        for root in self.roots:
            emit(root, 0)
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.to_text()


_LINE = re.compile(
    r"^(?P<indent> *)loop(?P<num>\d+)\s*\[\s*(?P<size>[^,\]]+?)\s*,\s*(?P<par>[a-zA-Z-]+)\s*"
    r"(?:,\s*\((?P<ops>[^)]*)\)\s*)?\]\s*(?:\{(?P<ins>[^}]*)\}\s*:\s*\{(?P<outs>[^}]*)\})?\s*$"
)
_PAR = {"para": True, "parallelizable": True, "non-para": False, "non-parallelizable": False}
_SIZE = re.compile(r"^(\d+|[A-Za-z_][A-Za-z_0-9]*(\s*\*\s*([A-Za-z_][A-Za-z_0-9]*|\d+))*)$")


#: deepest loop nest a +Graph may declare (a tensor has no more axes than this in practice;
#: deeper text is refused with its line instead of exhausting Python's recursion)
MAX_DEPTH = 64


def parse_plusgraph(text: str) -> PlusGraph:
    """Parse the canonical text (see the module docstring) into a ``PlusGraph``.

    Blank lines and ``#`` comments are ignored. Raises ``PlusGraphSyntaxError`` naming the line.
    """
    # (depth, size, parallel, ops, ins, outs, children)
    stack: list[tuple[int, list]] = []
    roots: list[list] = []
    expected_num = 0
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].rstrip()
        if not line.strip():
            continue
        if "\t" in line:
            raise PlusGraphSyntaxError(lineno, "indent with spaces, not tabs")
        m = _LINE.match(line)
        if m is None:
            raise PlusGraphSyntaxError(
                lineno, f"expected `loopN [SIZE, para|non-para(, (ops))]`, got {raw.strip()!r}"
            )
        indent = len(m.group("indent"))
        if indent % 2:
            raise PlusGraphSyntaxError(lineno, "indentation must be a multiple of two spaces")
        depth = indent // 2
        if depth >= MAX_DEPTH:
            raise PlusGraphSyntaxError(
                lineno, f"loops nested {depth + 1} deep; a +Graph nests at most {MAX_DEPTH}"
            )
        if int(m.group("num")) != expected_num:
            raise PlusGraphSyntaxError(
                lineno, f"loops are numbered in order: expected loop{expected_num}"
            )
        expected_num += 1
        par = m.group("par").lower()
        if par not in _PAR:
            raise PlusGraphSyntaxError(lineno, f"parallelism must be para or non-para, not {par!r}")
        size_text = re.sub(r"\s+", "", m.group("size"))
        if not _SIZE.match(size_text):
            raise PlusGraphSyntaxError(lineno, f"bad loop size {m.group('size')!r}")
        size: Size = int(size_text) if size_text.isdigit() else size_text
        ops = tuple(o.strip() for o in (m.group("ops") or "").split(",") if o.strip())
        for op in ops:
            if not re.match(r"^[A-Za-z_][A-Za-z_0-9]*$", op):
                raise PlusGraphSyntaxError(lineno, f"bad operation name {op!r}")
        ins = tuple(t.strip() for t in (m.group("ins") or "").split(",") if t.strip())
        outs = tuple(t.strip() for t in (m.group("outs") or "").split(",") if t.strip())
        node = [size, _PAR[par], ops, ins, outs, []]
        while stack and stack[-1][0] >= depth:
            stack.pop()
        if depth == 0:
            roots.append(node)
        else:
            if not stack or stack[-1][0] != depth - 1:
                raise PlusGraphSyntaxError(lineno, "nested one level deeper than its parent")
            stack[-1][1][5].append(node)
        stack.append((depth, node))
    if not roots:
        raise PlusGraphSyntaxError(1, "empty +Graph")

    def freeze(node: list) -> PlusLoop:
        size, par, ops, ins, outs, children = node
        return PlusLoop(size, par, ops, tuple(freeze(c) for c in children), ins, outs)

    return PlusGraph(tuple(freeze(r) for r in roots))
