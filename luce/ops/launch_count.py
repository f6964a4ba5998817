"""Launches per step: the node kinds of a captured CUDA graph (one node per kernel launch,
memset or copy), counted once per capture (luce.ops.cuda_graph) and reported by
tools/bench_decode.py as launches per step and per layer.

`count_graph_nodes(rt, graph)` takes the runtime module (cuda.bindings.runtime, or a fake
with the same three calls in tests): cudaGraphGetNodes(graph, 0) -> (err, None, n),
cudaGraphGetNodes(graph, n) -> (err, nodes, n), cudaGraphNodeGetType(node) -> (err, type).
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


def count_graph_nodes(rt, graph) -> NodeCounts:
    """The nodes of `graph` (a cudaGraph_t) by kind."""
    err, _, n = rt.cudaGraphGetNodes(graph, 0)
    if int(err) != 0:
        raise RuntimeError(f"cudaGraphGetNodes failed: {err}")
    counts = NodeCounts()
    if n == 0:
        return counts
    err, nodes, n = rt.cudaGraphGetNodes(graph, n)
    if int(err) != 0:
        raise RuntimeError(f"cudaGraphGetNodes failed: {err}")
    for node in nodes[:n]:
        err, node_type = rt.cudaGraphNodeGetType(node)
        if int(err) != 0:
            raise RuntimeError(f"cudaGraphNodeGetType failed: {err}")
        name = getattr(node_type, "name", str(node_type))
        counts.by_type[name] = counts.by_type.get(name, 0) + 1
        kind = _field(name)
        setattr(counts, kind, getattr(counts, kind) + 1)
    return counts
