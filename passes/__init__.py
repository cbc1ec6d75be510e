"""Relax passes of plus_tvm, one pass per file, each named after its class.

Paper map (the pipeline's order is ``plus_tvm.pipeline``):

- paper 000, PluS: ``PlusDispatch`` (identify +Graphs, bind library calls), ``MergeSiblingLinears``,
  and the canonicalizations that bring every form of a pattern to one warehouse entry
  (``CanonicalizeSDPA``, ``CanonicalizeBatchMatmul``, ``SinkRowReshapes``, ``Conv1dAsConv2d``,
  ``GlobalPoolToMean``, ``FoldPadIntoConv``, ``ConvertToChannelsLast``, ``SimplifyViews``);
- paper 004, mapping types: ``AnnotateMapPattern``, ``DPFuseOps``;
- paper 002, PowerFusion: ``ApplyScheduleRules`` (with the GIR rules of ``plus_tvm.schedules``);
- paper 001, PyGraph, and paper 003 section 4.5: ``DeclareCaptureVars``, ``StageGraphInputs``,
  ``StageGraphOutputs``, ``RewriteViewBuiltins``, ``RewriteCUDAGraph``,
  ``SelectCUDAGraphRegions``, ``RouteCUDAGraphRuntime``;
- correctness and clean-up, no paper: ``ProveSlicesInbound``, ``FullAsBroadcast``,
  ``FoldStaticSubgraphs``, ``WrapTakeIndices``, ``ExpandIntegerPower``, ``PropagateNaN``.
"""

from .annotate_map_pattern import AnnotateMapPattern
from .apply_schedule_rules import ApplyScheduleRules
from .canonicalize_batch_matmul import CanonicalizeBatchMatmul
from .canonicalize_sdpa import CanonicalizeSDPA
from .conv1d_as_conv2d import Conv1dAsConv2d
from .convert_to_channels_last import ConvertToChannelsLast
from .declare_capture_vars import DeclareCaptureVars
from .dp_fuse_ops import DPFuseOps
from .expand_integer_power import ExpandIntegerPower
from .fold_pad_into_conv import FoldPadIntoConv
from .fold_static_subgraphs import FoldStaticSubgraphs
from .full_as_broadcast import FullAsBroadcast
from .global_pool_to_mean import GlobalPoolToMean
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
    "CanonicalizeSDPA",
    "ConvertToChannelsLast",
    "DeclareCaptureVars",
    "DPFuseOps",
    "ExpandIntegerPower",
    "FoldPadIntoConv",
    "FoldStaticSubgraphs",
    "Conv1dAsConv2d",
    "FullAsBroadcast",
    "GlobalPoolToMean",
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
