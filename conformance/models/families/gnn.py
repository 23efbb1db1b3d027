"""Graph neural networks by explicit message passing over an ``edge_index`` (``index_add``,
``scatter_reduce``): GCN, GraphSAGE (mean), GIN (sum + MLP), GAT (scatter softmax);
node classification or graph classification (mean pooling by a ``batch`` vector).

Example:
    >>> from conformance.models.registry import enumerate_graphs
    >>> spec = next(enumerate_graphs(["gnn"]))
    >>> x, edge_index, batch = spec.example_inputs()
    >>> spec.build()(x, edge_index, batch).shape
    torch.Size([8, 4])
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from conformance.models.family import Family, Params, ce_loss, pick, randint, randn
from conformance.models.layers import make_act

IN_FEATURES, CLASSES, GRAPHS, EDGES_PER_NODE = 8, 4, 2, 3
GRID = {
    "conv": ["gcn", "sage", "gin", "gat"],
    "hidden": [8, 16, 32],
    "layers": [1, 2],
    "act": ["relu", "elu"],
    "task": ["node", "graph"],
    "nodes": [8, 16],
}


def segment_sum(values: Tensor, index: Tensor, n: int) -> Tensor:
    return values.new_zeros((n, *values.shape[1:])).index_add(0, index, values)


class MessagePassing(nn.Module):
    def __init__(self, cin: int, cout: int, kind: str):
        super().__init__()
        self.kind = kind
        self.lin = nn.Linear(cin, cout, bias=kind != "gin")
        if kind == "sage":
            self.root = nn.Linear(cin, cout, bias=False)
        if kind == "gin":
            self.eps = nn.Parameter(torch.zeros(1))
            self.mlp = nn.Sequential(nn.ReLU(), nn.Linear(cout, cout))
        if kind == "gat":
            self.att_src, self.att_dst = (
                nn.Parameter(torch.randn(cout) * 0.1),
                nn.Parameter(torch.randn(cout) * 0.1),
            )

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        n = x.shape[0]
        loops = torch.arange(n, device=x.device)
        src, dst = torch.cat([edge_index[0], loops]), torch.cat([edge_index[1], loops])
        h = self.lin(x)
        if self.kind == "gcn":
            deg = segment_sum(torch.ones_like(dst, dtype=x.dtype), dst, n)
            norm = deg.rsqrt()
            return segment_sum(h[src] * (norm[src] * norm[dst]).unsqueeze(-1), dst, n)
        if self.kind == "sage":
            idx = dst.unsqueeze(-1).expand(-1, x.shape[1])
            agg = x.new_zeros(x.shape).scatter_reduce(0, idx, x[src], "mean", include_self=False)
            return self.lin(agg) + self.root(x)
        if self.kind == "gin":
            return self.mlp((1 + self.eps) * h + segment_sum(h[edge_index[0]], edge_index[1], n))
        score = F.leaky_relu((h * self.att_src).sum(-1)[src] + (h * self.att_dst).sum(-1)[dst], 0.2)
        smax = score.new_zeros(n).scatter_reduce(0, dst, score, "amax", include_self=False)
        alpha = (score - smax[dst]).exp()
        alpha = alpha / segment_sum(alpha, dst, n)[dst]
        return segment_sum(h[src] * alpha.unsqueeze(-1), dst, n)


class GNN(nn.Module):
    def __init__(self, p: Params):
        super().__init__()
        h = p["hidden"]
        self.convs = nn.ModuleList(
            MessagePassing(IN_FEATURES if i == 0 else h, h, p["conv"]) for i in range(p["layers"])
        )
        self.act, self.graph_task = make_act(p["act"]), p["task"] == "graph"
        self.head = nn.Linear(h, CLASSES)

    def forward(self, x: Tensor, edge_index: Tensor, batch: Tensor) -> Tensor:
        for conv in self.convs:
            x = self.act(conv(x, edge_index))
        if self.graph_task:
            counts = segment_sum(torch.ones_like(batch, dtype=x.dtype), batch, GRAPHS)
            x = segment_sum(x, batch, GRAPHS) / counts.unsqueeze(-1)
        return self.head(x)


def inputs(p: Params, variant: int, gen: torch.Generator) -> tuple:
    n = pick(variant, (p["nodes"], p["nodes"] // 2, p["nodes"] * 2))
    batch = (torch.arange(n) >= n // 2).long()
    return randn(gen, n, IN_FEATURES), randint(gen, n, 2, EDGES_PER_NODE * n), batch


FAMILY = Family(
    name="gnn",
    description="Graph neural networks (GCN/SAGE/GIN/GAT message passing via index_add/scatter_reduce)",
    grid=GRID,
    id_fmt="{conv}.h{hidden}l{layers}.{act}.{task}.n{nodes}",
    build=GNN,
    inputs=inputs,
    loss=ce_loss,
)
