"""The pattern warehouse shipped with plus_tvm: one entry per file (PluS, paper 000, section 4.3).

This package holds data only; :mod:`plus_tvm.pattern_warehouse` loads it (with
``importlib.resources``) together with the folders of ``$PLUS_TVM_WAREHOUSE`` and
``Options.warehouse``. Loading parses TOML and never executes code from an entry folder. Check a
folder with ``plus-tvm warehouse validate DIR``.

Each entry is a TOML file ``NAME.toml``::

    name = "gemm_epilogue"          # required, equal to the file name without .toml
    description = "..."             # optional
    allow_prologue = true           # algorithm 2's fusion directions (default false)
    allow_epilogue = true
    priority = 100                  # optional int (default 0): higher is tried first when several
                                    # entries match the same subgraph
    batched = true                  # optional (default false): the graph also matches when every
                                    # nest runs under one leading parallel loop (a batch axis the
                                    # implementation takes itself, as a convolution's N)
    graph = \"\"\"
    loop0 [M, para]
      loop1 [N, para]
        loop2 [K, non-para, (dot)]
    \"\"\"                             # required: the +Graph, one loop per line, 2 spaces per level

    [constraints]                   # optional
    dtype = ["float32", "float16"]  # allowed element dtypes of the subgraph's tensors
    static_sizes = false            # true: every loop size must be a compile-time integer
    layout = "any"                  # free string checked by the implementation binder ("NCHW")

    [[implementation]]              # one or more, tried in order
    name = "torch.linear"           # a name registered with plus_tvm.dispatch
    target = "any"                  # "llvm" | "cuda" | "any" (default "any")
    when = "M >= 16 and N * K >= 4096"   # optional, over the graph's size names: integers,
                                         # + - * // %, comparisons, and/or/not, parentheses
    dtypes = ["float32", "bfloat16"]     # optional: the dtypes it takes (default: the
                                         # constraint's dtype, else its kernel's); a dtype its
                                         # library kernel does not take is a load error

A subgraph whose dtype no implementation takes is left to TIR, and ``stats["dispatch"]
["declined"]`` says so (``"<entry>: <implementation> takes no <dtype>"``).

Several implementations with different ``target`` / ``when`` route one pattern by target and
size (dynamic-shape routing). Every error names ``file:line``. Entry names are unique across all
folders.
"""
