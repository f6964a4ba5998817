"""luce.ops.launch_count on a fake runtime: graph nodes counted by kind (the runtimes' own
graph_node_types run on the H200: tests/models/test_graphed_forward_cuda.py)."""
from __future__ import annotations

import enum

import pytest

from luce.ops.launch_count import NodeCounts, count_graph_nodes


class NodeType(enum.Enum):
    cudaGraphNodeTypeKernel = 0
    cudaGraphNodeTypeMemcpy = 1
    cudaGraphNodeTypeMemset = 2
    cudaGraphNodeTypeEventRecord = 7


class FakeRuntime:
    """graph_node_types (luce.ops.gpu_runtime) over a graph given as a list of node types."""

    def graph_node_types(self, graph):
        return [t.name for t in graph]


def count(types):
    return count_graph_nodes(FakeRuntime(), types)


def test_counts_each_kind():
    K, C, S, E = (NodeType.cudaGraphNodeTypeKernel, NodeType.cudaGraphNodeTypeMemcpy,
                  NodeType.cudaGraphNodeTypeMemset, NodeType.cudaGraphNodeTypeEventRecord)
    got = count([K, K, S, K, C, E, K])
    assert (got.kernels, got.memsets, got.memcpys, got.other) == (4, 1, 1, 1)
    assert got.launches == 6
    assert got.by_type == {"cudaGraphNodeTypeKernel": 4, "cudaGraphNodeTypeMemset": 1,
                           "cudaGraphNodeTypeMemcpy": 1, "cudaGraphNodeTypeEventRecord": 1}
    assert got.as_dict() == {"kernels": 4, "memsets": 1, "memcpys": 1, "other": 1, "launches": 6}


def test_empty_graph():
    assert count([]).launches == 0


def test_per_layer():
    assert NodeCounts(kernels=50, memsets=6).per_layer(4) == 14.0
    with pytest.raises(ValueError, match="positive layer count"):
        NodeCounts().per_layer(0)
