"""TensorIR schedule rules of plus_tvm (one rule per file, per target family).

Phase 4 of the pipeline (``plus_tvm.pipeline.schedule_phase``) tries the rules of this package
before TVM's own dlight rules: with ``Options.gir`` on, ``GIRLLVM`` on CPU and ``GIRCUDA`` on GPU
schedule memory-intensive kernels through GIR plans (PowerFusion, paper 002); on CPU
``ParallelSpatialLLVM`` then runs the large element-wise blocks of the kernels GIR declined on
every core.
"""

from .gir_cuda import GIRCUDA
from .gir_llvm import GIRLLVM
from .parallel_spatial_llvm import ParallelSpatialLLVM

__all__ = ["GIRCUDA", "GIRLLVM", "ParallelSpatialLLVM"]
