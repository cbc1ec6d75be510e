"""Relax passes of plus_tvm, one pass per file, each named after its class."""

from .annotate_map_pattern import AnnotateMapPattern
from .apply_schedule_rules import ApplyScheduleRules
from .dp_fuse_ops import DPFuseOps
from .rewrite_cuda_graph import RewriteCUDAGraph

__all__ = ["AnnotateMapPattern", "ApplyScheduleRules", "DPFuseOps", "RewriteCUDAGraph"]
