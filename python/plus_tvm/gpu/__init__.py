"""Compile here, run there: the GPU bundle (:mod:`.bundle`, on the CPU machine) and its check
(:mod:`.check`, on the GPU machine with TVM's runtime library alone). Nothing is imported here,
so that :mod:`.check` imports without TVM's compiler library."""
