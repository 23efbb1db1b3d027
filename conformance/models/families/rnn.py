"""Recurrent sequence models: fused ``nn.LSTM``/``nn.GRU``/``nn.RNN`` or explicitly unrolled
``LSTMCell``/``GRUCell`` loops; uni- or bidirectional; last-step or per-step head.

Example:
    >>> from conformance.models.registry import enumerate_graphs
    >>> spec = next(enumerate_graphs(["rnn"]))
    >>> spec.build()(*spec.example_inputs()).shape
    torch.Size([2, 5])
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from conformance.models.family import Family, Params, ce_loss, pick, randn

IN_FEATURES, CLASSES = 8, 5
FUSED = {"lstm": nn.LSTM, "gru": nn.GRU, "rnn": nn.RNN}
CELLS = {"lstm_unrolled": nn.LSTMCell, "gru_unrolled": nn.GRUCell}
GRID = {
    "cell": ["lstm", "gru", "rnn", "lstm_unrolled", "gru_unrolled"],
    "hidden": [8, 16, 32],
    "layers": [1, 2],
    "dir": ["uni", "bi"],
    "seq": [4, 8],
    "head": ["last", "all"],
}


class Unrolled(nn.Module):
    """Stacked (optionally bidirectional) cell loop with the ``nn.LSTM`` calling convention."""

    def __init__(self, cell: type[nn.Module], hidden: int, layers: int, bidir: bool):
        super().__init__()
        dirs = 2 if bidir else 1
        self.cells = nn.ModuleList(
            nn.ModuleList(cell(IN_FEATURES if i == 0 else hidden * dirs, hidden) for _ in range(dirs))
            for i in range(layers)
        )
        self.lstm = cell is nn.LSTMCell

    def run(self, cell: nn.Module, x: Tensor, reverse: bool) -> Tensor:
        steps = range(x.shape[1] - 1, -1, -1) if reverse else range(x.shape[1])
        h, outs = None, {}
        for t in steps:
            h = cell(x[:, t], h)
            outs[t] = h[0] if self.lstm else h
        return torch.stack([outs[t] for t in range(x.shape[1])], dim=1)

    def forward(self, x: Tensor) -> tuple[Tensor, None]:
        for layer in self.cells:
            x = torch.cat([self.run(cell, x, reverse=i == 1) for i, cell in enumerate(layer)], dim=-1)
        return x, None


class RNNModel(nn.Module):
    def __init__(self, p: Params):
        super().__init__()
        bidir, h, cell = p["dir"] == "bi", p["hidden"], p["cell"]
        if cell in FUSED:
            self.rnn = FUSED[cell](IN_FEATURES, h, p["layers"], batch_first=True, bidirectional=bidir)
        else:
            self.rnn = Unrolled(CELLS[cell], h, p["layers"], bidir)
        self.last = p["head"] == "last"
        self.head = nn.Linear(h * (2 if bidir else 1), CLASSES)

    def forward(self, x: Tensor) -> Tensor:
        y, _ = self.rnn(x)
        return self.head(y[:, -1] if self.last else y)


def inputs(p: Params, variant: int, gen: torch.Generator) -> tuple:
    return (randn(gen, 2, pick(variant, (p["seq"], p["seq"] // 2, p["seq"] + p["seq"] // 2)), IN_FEATURES),)


FAMILY = Family(
    name="rnn",
    description="LSTM/GRU/RNN (fused modules and unrolled cells)",
    grid=GRID,
    id_fmt="{cell}.h{hidden}l{layers}.{dir}.s{seq}.{head}",
    build=RNNModel,
    inputs=inputs,
    loss=ce_loss,
)
