"""The one analysis of TIR blocks, shared by the three papers' models of a kernel.

Every fusion and scheduling decision of plus_tvm starts from the same reading of a PrimFunc:
its blocks (:mod:`.walk`), and per block its loops, unit iterators, writes, reads with each
index mapped onto the loops, and its reduction operator (:class:`BlockInfo`). Each model reads
it in its own paper's terms:

- ``mapping/`` (paper 004): the mapping class of a kernel (OneToOne, Reorganize, ...);
- ``plusgraph/`` (PluS, paper 000): the +Loop operators merged into +Graphs;
- ``gir/`` (PowerFusion, paper 002): the basic memory operators and the row structure.

:mod:`.rebuild` rewrites expressions and block bodies bottom-up (TVM 0.27 has no Python
``StmtExprMutator``).
"""

from .block import (
    REDUCTION,
    SPATIAL,
    TRANSCENDENTAL,
    BlockInfo,
    block_infos,
    count_ops,
    expr_ops,
    is_data_parallel,
    is_unit,
)
from .walk import (
    blocks,
    expr_vars,
    gathers,
    has_load,
    if_then_else,
    is_opaque,
    loads,
    nodes,
    static_shared_bytes,
    stores,
    stores_any,
    walk_expr,
    written_params,
)

__all__ = [
    "REDUCTION",
    "SPATIAL",
    "TRANSCENDENTAL",
    "BlockInfo",
    "block_infos",
    "blocks",
    "count_ops",
    "expr_ops",
    "expr_vars",
    "is_data_parallel",
    "gathers",
    "has_load",
    "if_then_else",
    "is_opaque",
    "is_unit",
    "loads",
    "nodes",
    "static_shared_bytes",
    "stores",
    "stores_any",
    "walk_expr",
    "written_params",
]
