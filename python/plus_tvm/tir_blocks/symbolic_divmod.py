"""Fold the ``//`` and ``%`` of a reshape over symbolic sizes, which TVM's analyzer keeps.

A reshape between ``[b * n, d]`` and ``[b, n, d]`` with symbolic ``b`` and ``n`` reads
``x[(i * n + j) % (b * n), k]`` or ``y[i // n % b, i % n, k]``. For iterators ``i < b`` and
``j < n`` these are ``x[i * n + j, k]`` and ``y[i // n, i % n, k]``, but TVM 0.27's analyzer
cannot prove ``i * n + j < b * n`` (a product of two unknown sizes), so the modulo stays and
every analysis that classifies reads by their indices sees a gather (GIR then declined a
prefill's GELU: 9.8 ms instead of 0.85 on ``[8, 128, 3072]`` bfloat16).

The folds, for an index that is a sum of iterator terms ``c * v`` with coefficients provably
non-negative and an iterator-free rest:
- ``x % m`` is ``x`` when ``0 <= x`` and ``x``'s largest value (every iterator at its last
  point) is provably below ``m``;
- ``x // m`` is ``q`` when ``x = q * m + r`` term by term (each term of ``q * m`` carries the
  factor ``m``) with ``0 <= r < m`` proven the same way;
- ``(x // m) % k`` is ``x // m`` when ``x``'s largest value is below ``m * k``.
Sizes that are iterator extents are at least 1 (a loop that runs). Anything else is left as
it is.
"""

from __future__ import annotations

import tvm
import tvm_ffi
from tvm import tirx
from tvm.ir.prim.expr import BinaryOpExpr

from .walk import nodes

_BIG = 1 << 62


def fold_divmod(e: tvm.ir.Expr, extents: dict) -> tvm.ir.Expr:
    """``e`` with the provable folds of the module docstring made; ``extents`` maps each
    iterator (a ``tirx.Var``) to its extent (its domain starts at 0)."""
    if not extents:
        return e
    analyzer = tvm.sym.Analyzer()
    for var, extent in extents.items():
        analyzer.bind(var, tvm.ir.Range(tirx.const(0, str(var.ty)), extent))
        for size in _vars(extent):
            if size not in extents:
                analyzer.bind(size, tvm.ir.Range(tirx.const(1, str(size.ty)), _big(size)))

    def replace(node: tvm.ir.Expr) -> tvm.ir.Expr | None:
        if isinstance(node, tirx.FloorMod):
            return _fold_mod(node, extents, analyzer)
        if isinstance(node, tirx.FloorDiv):
            return _fold_div(node, extents, analyzer)
        return None

    return _mapped(e, replace)


def _mapped(e: tvm.ir.Expr, replace) -> tvm.ir.Expr:
    """``e`` rebuilt bottom-up through its binary operations, ``replace`` applied to each node
    after its operands (``None``: keep). An index is a small tree of those."""
    if isinstance(e, BinaryOpExpr):
        a, b = _mapped(e.a, replace), _mapped(e.b, replace)
        if not (a.same_as(e.a) and b.same_as(e.b)):
            e = type(e)(a, b)
    out = replace(e)
    return e if out is None else out


def _same(a: tvm.ir.Expr, b: tvm.ir.Expr) -> bool:
    return tvm_ffi.structural_equal(a, b, map_free_vars=False)


def _big(var: tirx.Var) -> tvm.ir.Expr:
    return tirx.const(_BIG if str(var.ty) == "int64" else (1 << 30), str(var.ty))


def _vars(e: tvm.ir.Expr) -> list:
    found: list = []
    for n in nodes(e):
        if isinstance(n, tirx.Var) and not any(n.same_as(f) for f in found):
            found.append(n)
    return found


def _terms(e: tvm.ir.Expr, extents: dict) -> list | None:
    """``e`` as ``[(iterator or None, coefficient)]`` summed, coefficients iterator-free; or
    ``None`` where ``e`` is not linear in the iterators that way."""
    if isinstance(e, tirx.Add):
        a, b = _terms(e.a, extents), _terms(e.b, extents)
        return None if a is None or b is None else a + b
    if isinstance(e, tirx.Var) and e in extents:
        return [(e, tirx.const(1, str(e.ty)))]
    if isinstance(e, tirx.Mul):
        for v, c in ((e.a, e.b), (e.b, e.a)):
            if isinstance(v, tirx.Var) and v in extents and not _uses_any(c, extents):
                return [(v, c)]
    if _uses_any(e, extents):
        return None
    return [(None, e)]


def _uses_any(e: tvm.ir.Expr, extents: dict) -> bool:
    return any(v in extents for v in _vars(e))


def _bounds_below(terms: list, m: tvm.ir.Expr, extents: dict, analyzer) -> bool:
    """``0 <= sum(terms) < m`` for every value of the iterators."""
    if not all(analyzer.can_prove(c >= 0) for _, c in terms):
        return False
    low = _sum([c for v, c in terms if v is None], str(m.ty))
    high = _sum([c if v is None else c * (extents[v] - 1) for v, c in terms], str(m.ty))
    # (as a difference: TVM proves ``b * n - 1 - n * b < 0`` but not ``b * n - 1 < n * b``)
    return analyzer.can_prove(low >= 0) and analyzer.can_prove(high - m < 0)


def _sum(parts: list, dtype: str) -> tvm.ir.Expr:
    total = tirx.const(0, dtype)
    for p in parts:
        total = total + p
    return total


def _fold_mod(node: tirx.FloorMod, extents: dict, analyzer) -> tvm.ir.Expr | None:
    x, m = node.a, node.b
    if isinstance(x, tirx.FloorDiv):  # (y // d) % k with y < d * k
        terms = _terms(x.a, extents)
        if terms is not None and _bounds_below(terms, x.b * m, extents, analyzer):
            return x
        return None
    terms = _terms(x, extents)
    if terms is not None and _bounds_below(terms, m, extents, analyzer):
        return x
    return None


def _fold_div(node: tirx.FloorDiv, extents: dict, analyzer) -> tvm.ir.Expr | None:
    terms = _terms(node.a, extents)
    if terms is None:
        return None
    m = node.b
    quotient, rest = [], []
    for v, c in terms:
        q = _without_factor(c, m)
        if q is None:
            rest.append((v, c))
        else:
            quotient.append(q if v is None else v * q)
    if not quotient or not _bounds_below(rest, m, extents, analyzer):
        return None
    if not all(analyzer.can_prove(c >= 0) for _, c in terms):
        return None
    return analyzer.simplify(_sum(quotient, str(m.ty)))


def _without_factor(c: tvm.ir.Expr, m: tvm.ir.Expr) -> tvm.ir.Expr | None:
    """``c / m`` when ``m`` is a factor of ``c`` as written (``m``, ``a * m``, ``m * a``)."""
    if _same(c, m):
        return tirx.const(1, str(m.ty))
    if isinstance(c, tirx.Mul):
        if _same(c.b, m):
            return c.a
        if _same(c.a, m):
            return c.b
    return None
