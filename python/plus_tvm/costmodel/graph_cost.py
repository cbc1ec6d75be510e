"""Does a CUDA graph pay? The compile-time estimate of ``cuda_graph=auto`` (PyGraph 4.3).

Without a GPU the decision is an estimate from the IR: a region's kernels and library calls
each cost a launch from the host when they run without a graph, while its replay costs one
graph launch (and the call into ``plus.cuda_graph.run_or_capture``) plus a little per node.
The staging copies that capture needed (``StageGraphInputs`` / ``StageGraphOutputs``) are paid
per call whatever the regions do, so a function keeps its graphs only when the kept regions
save more than its copies cost. On the GPU the first call measures each kept region with and
without its graph and keeps the faster (``plus_tvm.runtime.cuda_graph``).

The figures are the launch costs the PyGraph paper reports (5-10 us per kernel launched from
the host, section 1) and the crossing into a Python library kernel measured on this project's
CPU (10-15 us); they have not been measured on a GPU here, which is why the runtime measures.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GraphCost:
    """Per-replay costs in microseconds (and bytes per microsecond for copies)."""

    kernel_launch_us: float = 5.0  # VM dispatch + cuLaunchKernel of one generated kernel
    library_call_us: float = 12.0  # VM -> Python -> torch/cuBLAS crossing of a library kernel
    graph_launch_us: float = 8.0  # cudaGraphLaunch + the plus.cuda_graph call from the VM
    node_us: float = 0.1  # per captured node on replay
    copy_bytes_per_us: float = 1.0e6  # device-to-device copy, about 1 TB/s

    def region_saving_us(self, kernels: int, library_calls: int) -> float:
        """Host time a replayed region saves per call (negative: the graph costs more)."""
        launched = kernels * self.kernel_launch_us + library_calls * self.library_call_us
        return launched - self.graph_launch_us - (kernels + library_calls) * self.node_us

    def staging_us(self, copied_bytes: list[int]) -> float:
        """Per call cost of the staging copies (one launch and the bytes each)."""
        return sum(self.kernel_launch_us + n / self.copy_bytes_per_us for n in copied_bytes)
