"""RewriteCUDAGraph: TVM's CUDA-graph rewrite, switched on by plus_tvm's options.

TVM's ``relax.transform.RewriteCUDAGraph`` only acts when the PassContext config
``relax.backend.use_cuda_graph`` is true, and new config keys cannot be registered from Python.
This pass runs TVM's rewrite under a context with that key set, so ``Options.cuda_graph`` decides
capture without the user having to know the config key.
"""

from __future__ import annotations

import tvm
from tvm import relax

_CONFIG_KEY = "relax.backend.use_cuda_graph"


@tvm.transform.module_pass(opt_level=0, name="RewriteCUDAGraph")
class RewriteCUDAGraph:
    """Lift runs of kernels with static arguments into captured CUDA graphs.

    Parameters
    ----------
    enabled : bool
        When false the module is returned unchanged.
    """

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled

    def transform_module(self, mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        if not self.enabled:
            return mod
        config = dict(ctx.config)
        config[_CONFIG_KEY] = True
        with tvm.transform.PassContext(opt_level=ctx.opt_level, config=config):
            return relax.transform.RewriteCUDAGraph()(mod)
