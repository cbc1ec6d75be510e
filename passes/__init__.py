"""Relax passes of plus_tvm, one pass per file, each named after its class.

The pipeline's order, and why each pass is where it is, are the phase lists of
``plus_tvm.pipeline``; which paper each belongs to is the README's map.
"""

from .annotate_map_pattern import AnnotateMapPattern
from .apply_schedule_rules import ApplyScheduleRules
from .bind_unbound_gpu_blocks import BindUnboundGPUBlocks
from .canonicalize_batch_matmul import CanonicalizeBatchMatmul
from .canonicalize_sdpa import CanonicalizeSDPA
from .check_index_bounds import CheckIndexBounds
from .conv1d_as_conv2d import Conv1dAsConv2d
from .convert_to_channels_last import ConvertToChannelsLast
from .declare_capture_vars import DeclareCaptureVars
from .dp_fuse_ops import DPFuseOps
from .expand_integer_power import ExpandIntegerPower
from .fold_pad_into_conv import FoldPadIntoConv
from .fold_static_subgraphs import FoldStaticSubgraphs
from .full_as_broadcast import FullAsBroadcast
from .global_pool_to_mean import GlobalPoolToMean
from .infinite_extreme_identity import InfiniteExtremeIdentity
from .merge_sibling_linears import MergeSiblingLinears
from .plus_dispatch import PlusDispatch
from .propagate_nan import PropagateNaN
from .prove_slices_inbound import ProveSlicesInbound
from .rewrite_cuda_graph import RewriteCUDAGraph
from .rewrite_view_builtins import RewriteViewBuiltins
from .route_cuda_graph_runtime import RouteCUDAGraphRuntime
from .select_cuda_graph_regions import SelectCUDAGraphRegions
from .simplify_views import SimplifyViews
from .sink_row_reshapes import SinkRowReshapes
from .stage_graph_inputs import StageGraphInputs
from .stage_graph_outputs import StageGraphOutputs
from .wrap_take_indices import WrapTakeIndices

__all__ = [
    "AnnotateMapPattern",
    "ApplyScheduleRules",
    "BindUnboundGPUBlocks",
    "CanonicalizeSDPA",
    "CheckIndexBounds",
    "ConvertToChannelsLast",
    "DeclareCaptureVars",
    "DPFuseOps",
    "ExpandIntegerPower",
    "FoldPadIntoConv",
    "FoldStaticSubgraphs",
    "Conv1dAsConv2d",
    "FullAsBroadcast",
    "GlobalPoolToMean",
    "InfiniteExtremeIdentity",
    "MergeSiblingLinears",
    "PlusDispatch",
    "PropagateNaN",
    "ProveSlicesInbound",
    "RewriteCUDAGraph",
    "RewriteViewBuiltins",
    "RouteCUDAGraphRuntime",
    "SelectCUDAGraphRegions",
    "SimplifyViews",
    "SinkRowReshapes",
    "StageGraphInputs",
    "StageGraphOutputs",
    "CanonicalizeBatchMatmul",
    "WrapTakeIndices",
]
