"""Model-graph generator: small plain-``torch.nn`` model families enumerated into ATen graphs.

Example:
    >>> from conformance.models import enumerate_graphs
    >>> [s.model_id for s in enumerate_graphs(["mlp"], limit=2)]
    ['mlp.d1w16.relu.none.bias', 'mlp.d1w16.relu.none.nobias']
"""

from .registry import FAMILIES, GraphSpec, aten_histogram, enumerate_graphs, graph_hash, spec_by_id

__all__ = ["FAMILIES", "GraphSpec", "aten_histogram", "enumerate_graphs", "graph_hash", "spec_by_id"]
