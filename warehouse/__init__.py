"""The pattern warehouse shipped with plus_tvm: one entry per file (PluS, paper 000)."""
