"""luce.ops.launch_count on a fake runtime: graph nodes counted by kind."""
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
    """cudaGraphGetNodes / cudaGraphNodeGetType over a graph given as a list of node types."""

    def __init__(self, fail_at: str = ""):
        self.fail_at = fail_at

    def cudaGraphGetNodes(self, graph, n):
        err = 1 if self.fail_at == "nodes" else 0
        if n == 0:
            return err, None, len(graph)
        return err, list(range(min(n, len(graph)))), min(n, len(graph))

    def cudaGraphNodeGetType(self, node):
        return (1 if self.fail_at == "type" else 0), self.graph[node]


def count(types, fail_at=""):
    rt = FakeRuntime(fail_at)
    rt.graph = types
    return count_graph_nodes(rt, types)


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


@pytest.mark.parametrize("fail_at", ["nodes", "type"])
def test_runtime_errors_raise(fail_at):
    with pytest.raises(RuntimeError, match="cudaGraph"):
        count([NodeType.cudaGraphNodeTypeKernel], fail_at)
