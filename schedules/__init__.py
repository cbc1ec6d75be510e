"""TensorIR schedule rules of plus_tvm (one rule per file, per target family).

Phase 4 of the pipeline (``plus_tvm.pipeline.schedule_phase``) tries the rules of this package
before TVM's own dlight rules: with ``Options.gir`` on, ``GIRLLVM`` on CPU and ``GIRCUDA`` on GPU
schedule memory-intensive kernels through GIR plans (PowerFusion, paper 002); on CPU
``ParallelSpatialLLVM`` then runs the large element-wise blocks of the kernels GIR declined on
every core; on GPU ``RecomputeReductionCUDA`` runs a squeeze-excite's gate (a few reduced values
scaling a large tensor) as one thread per element instead of dlight's grid of a few blocks, and
``MatmulWithoutTensorCores`` is dlight's ``gpu.Matmul`` kept off its float16 / int8 tensor-core
path (TVM 0.27's WMMA tensorize segfaults).
All of them are ``ReasonedRule``s: they say why they decline a kernel.
"""

from .gir_cuda import GIRCUDA
from .gir_llvm import GIRLLVM
from .matmul_without_tensor_cores import MatmulWithoutTensorCores
from .parallel_spatial_llvm import ParallelSpatialLLVM
from .reasoned_rule import ReasonedRule
from .recompute_reduction_cuda import RecomputeReductionCUDA

__all__ = [
    "GIRCUDA",
    "GIRLLVM",
    "MatmulWithoutTensorCores",
    "ParallelSpatialLLVM",
    "ReasonedRule",
    "RecomputeReductionCUDA",
]
