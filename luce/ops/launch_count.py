"""Launches per step: the node kinds of a captured GPU graph (one node per kernel launch,
memset or copy), counted once per capture (luce.ops.cuda_graph) and reported by
tools/bench_decode.py as launches per step and per layer.

`count_graph_nodes(runtime, graph)` takes a luce.ops.gpu_runtime.GpuRuntime (its
graph_node_types: the type name of each node) and counts them by kind.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class NodeCounts:
    """Nodes of one graph by kind: kernels, memsets, memcpys, other (events, child graphs)."""

    kernels: int = 0
    memsets: int = 0
    memcpys: int = 0
    other: int = 0
    by_type: dict = field(default_factory=dict)   # runtime node type name -> count

    @property
    def launches(self) -> int:
        """Everything the GPU runs in order: kernels, memsets and copies."""
        return self.kernels + self.memsets + self.memcpys

    def per_layer(self, n_layer: int) -> float:
        """Launches per step divided by the layer count (the embedding, LM head and argmax
        included: an upper bound of one layer's share)."""
        if n_layer <= 0:
            raise ValueError(f"per_layer needs a positive layer count, got {n_layer}")
        return self.launches / n_layer

    def as_dict(self) -> dict:
        return {"kernels": self.kernels, "memsets": self.memsets, "memcpys": self.memcpys, "other": self.other,
                "launches": self.launches}


def _field(type_name: str) -> str:
    """NodeCounts field of a node type name (cudaGraphNodeTypeKernel -> 'kernels')."""
    name = type_name.lower()
    for kind in ("kernel", "memset", "memcpy"):
        if kind in name:
            return kind + "s"
    return "other"


def count_node_types(names) -> NodeCounts:
    """Node type names (cudaGraphNodeTypeKernel, hipGraphNodeTypeMemset, ...) by kind."""
    counts = NodeCounts()
    for name in names:
        counts.by_type[name] = counts.by_type.get(name, 0) + 1
        kind = _field(name)
        setattr(counts, kind, getattr(counts, kind) + 1)
    return counts


def count_graph_nodes(runtime, graph) -> NodeCounts:
    """The nodes of `graph` (a captured graph of `runtime`) by kind."""
    return count_node_types(runtime.graph_node_types(graph))
