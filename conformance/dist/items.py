"""What the distributed lane checks: one collective x reduce op x dtype x world size x shape, its
seeded per-rank inputs, and the exact answer every rank should hold afterwards.

Every rank can build every other rank's input (they are seeded by the item and the rank), so each
rank computes the exact expected result itself, in float64 (integers exactly), without trusting
any transport. A correct backend's result differs from it only by the rounding of its dtype:

* integers, MIN/MAX, gathers, broadcasts and all-to-all: exactly;
* a floating reduction: within ``world_size * eps(float32) * sum(|x_i|)`` (any summation order in
  float32 or better) plus, for bfloat16/float16, half a unit in the last place of the exact result
  (one final rounding: what a backend that accumulates in float32 does). A backend that accumulates
  in bfloat16 step by step loses more on inputs with cancellation, and is caught.

Example::

    >>> items = enumerate_items(("all_reduce",), ("float32",), (2,))
    >>> [i.key for i in items][:2]
    ['all_reduce|sum|float32|2|empty', 'all_reduce|sum|float32|2|vector']
    >>> x = [rank_input(items[1], r) for r in range(2)]
    >>> bool(expected(items[1], x, 0).eq(x[0].double() + x[1].double()).all())
    True
"""

from __future__ import annotations

import zlib
from dataclasses import asdict, dataclass
from typing import Any

import torch

#: torch.distributed functions the lane calls, with the reduce ops each takes (None: no reduce op).
COLLECTIVES: dict[str, tuple[str, ...] | None] = {
    "all_reduce": ("sum", "product", "min", "max", "avg"),
    "reduce_scatter_tensor": ("sum", "min", "max", "avg"),
    "all_gather_into_tensor": None,
    "all_gather": None,
    "broadcast": None,
    "all_to_all_single": None,
    "send": None,  # a ring: rank r sends to r+1 and receives from r-1 (send and recv together)
    "barrier": None,
}
SHAPES = ("empty", "vector", "matrix", "noncontiguous")
A2A_SHAPES = ("even", "uneven", "empty")
DTYPES = ("float32", "bfloat16", "float16", "int64")
FLOATING = ("float32", "bfloat16", "float16", "float64")


@dataclass(frozen=True)
class DistItem:
    collective: str
    reduce_op: str  # sum | product | min | max | avg, or "" (no reduce op)
    dtype: str
    world_size: int
    shape: str

    @property
    def key(self) -> str:
        return f"{self.collective}|{self.reduce_op or '-'}|{self.dtype}|{self.world_size}|{self.shape}"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DistItem:
        return cls(**{k: d[k] for k in ("collective", "reduce_op", "dtype", "world_size", "shape")})


def enumerate_items(collectives: tuple[str, ...], dtypes: tuple[str, ...], world_sizes: tuple[int, ...]
                    ) -> list[DistItem]:
    """Every item of the selection, world size by world size (a process group per world size)."""
    out = []
    for ws in world_sizes:
        for c in collectives:
            if c not in COLLECTIVES:
                raise ValueError(f"collective {c!r}: one of {', '.join(COLLECTIVES)}")
            for dtype in dtypes if c != "barrier" else ("float32",):
                ops = COLLECTIVES[c] or ("",)
                for op in ops:
                    if op == "avg" and dtype not in FLOATING:
                        continue  # no AVG of integers (the backends refuse it)
                    shapes = (A2A_SHAPES if c == "all_to_all_single" else ("vector",) if c == "barrier"
                              else SHAPES[:-1] if c == "send" else SHAPES)  # point to point: contiguous only
                    for shape in shapes:
                        out.append(DistItem(c, op, dtype, ws, shape))
    return out


def _generator(item: DistItem, rank: int) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(f"{item.key}|{rank}".encode()))


def _numel(item: DistItem) -> tuple[int, ...]:
    """The shape of one rank's input (before a non-contiguous view)."""
    ws = item.world_size
    base = {"empty": (0,), "vector": (7,), "matrix": (4, 6), "noncontiguous": (6, 4)}[item.shape] \
        if item.shape in SHAPES else (0,)
    if item.collective == "reduce_scatter_tensor":
        return (0,) if item.shape == "empty" else (ws * base[0], *base[1:])
    return base


def split_sizes(item: DistItem, rank: int) -> tuple[list[int] | None, list[int] | None]:
    """all_to_all_single's (input, output) split sizes on ``rank`` (None: even)."""
    ws = item.world_size
    if item.shape == "uneven":
        sends = [(rank + d) % 3 + 1 for d in range(ws)]  # what rank sends to each d
        recvs = [(s + rank) % 3 + 1 for s in range(ws)]  # what each s sends to rank
        return sends, recvs
    if item.shape == "empty":
        return [0] * ws, [0] * ws
    return None, None


def rank_input(item: DistItem, rank: int) -> torch.Tensor:
    """Rank ``rank``'s input of ``item`` (on the CPU, contiguous unless the item's shape says not)."""
    g = _generator(item, rank)
    ws = item.world_size
    if item.collective == "all_to_all_single":
        sends, _ = split_sizes(item, rank)
        shape: tuple[int, ...] = (sum(sends),) if sends is not None else (3 * ws,)
    else:
        shape = _numel(item)
    dt = getattr(torch, item.dtype)
    if item.dtype in FLOATING:
        if item.reduce_op == "product":
            x = torch.rand(shape, generator=g, dtype=torch.float64) + 0.5
        else:
            x = torch.randn(shape, generator=g, dtype=torch.float64) * 4
        x = x.to(dt)
    else:
        hi = 4 if item.reduce_op == "product" else 100
        x = torch.randint(-hi, hi, shape, generator=g, dtype=torch.int64).to(dt)
    if item.shape == "noncontiguous":
        x = x.t()  # a transposed view: not contiguous
    return x


def expected(item: DistItem, inputs: list[torch.Tensor], rank: int) -> torch.Tensor | None:
    """What ``rank`` must hold after the collective, in float64 (int64 for integers); None for a
    barrier."""
    ws = item.world_size
    exact = [x.double() if item.dtype in FLOATING else x.long() for x in inputs]
    c, op = item.collective, item.reduce_op
    if c == "barrier":
        return None
    if c in ("all_reduce", "reduce_scatter_tensor"):
        stack = torch.stack([x.contiguous() for x in exact])
        red = {"sum": lambda s: s.sum(0), "avg": lambda s: s.sum(0) / ws, "product": lambda s: s.prod(0),
               "min": lambda s: s.min(0).values if s.numel() else s.sum(0),
               "max": lambda s: s.max(0).values if s.numel() else s.sum(0)}[op](stack)
        if c == "all_reduce":
            return red
        n = red.shape[0] // ws
        return red[rank * n:(rank + 1) * n]
    if c == "all_gather_into_tensor":
        return torch.cat([x.contiguous() for x in exact])
    if c == "all_gather":
        return torch.stack([x.contiguous() for x in exact])
    if c == "broadcast":
        return exact[0]
    if c == "send":
        return exact[(rank - 1) % ws]
    if c == "all_to_all_single":
        parts = []
        for s in range(ws):
            sends, _ = split_sizes(item, s)
            sizes = sends if sends is not None else [3] * ws
            start = sum(sizes[:rank])
            parts.append(exact[s][start:start + sizes[rank]])
        return torch.cat(parts)
    raise ValueError(f"collective {c!r}")


def tolerance(item: DistItem, inputs: list[torch.Tensor], rank: int, exact: torch.Tensor) -> torch.Tensor | None:
    """Per element of ``rank``'s result, how far a correct backend may lie from ``exact`` (None:
    it must be exact): see the module doc."""
    if item.dtype not in FLOATING or item.reduce_op in ("", "min", "max"):
        return None
    ws = item.world_size
    mags = torch.stack([x.double().abs().contiguous() for x in inputs])
    eps = torch.finfo(torch.float32).eps
    if item.reduce_op == "product":
        bound = ws * eps * mags.prod(0)
    else:
        bound = ws * eps * mags.sum(0) / (ws if item.reduce_op == "avg" else 1)
    if item.collective == "reduce_scatter_tensor":
        n = bound.shape[0] // ws
        bound = bound[rank * n:(rank + 1) * n]
    dt = getattr(torch, item.dtype)
    if dt in (torch.bfloat16, torch.float16):
        bound = bound + 0.5 * _ulp(exact, dt)
    return bound


def _ulp(x: torch.Tensor, dt: torch.dtype) -> torch.Tensor:
    """One unit in the last place of ``x`` rounded to ``dt`` (float64)."""
    fi = torch.finfo(dt)
    mant = {torch.bfloat16: 8, torch.float16: 11}[dt]
    e = torch.floor(torch.log2(x.abs().clamp_min(fi.tiny)))
    return torch.pow(2.0, e - (mant - 1))
