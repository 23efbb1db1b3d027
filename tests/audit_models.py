"""Small models for tests/test_audit.py (importable as ``audit_models``)."""

from __future__ import annotations

import torch
from torch import nn


class Native(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def native() -> tuple[nn.Module, tuple]:
    return Native(), (torch.randn(2, 8),)


class CumProd(nn.Module):
    """cumprod is not native on emulated build 2.31.0 (found by running it there)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cumprod(torch.sigmoid(self.fc(x)), dim=-1)


def cumprod() -> nn.Module:
    return CumProd()


class Gelu(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(nn.functional.gelu(self.fc1(x)))


def gelu() -> tuple[nn.Module, tuple]:
    return Gelu(), (torch.randn(4, 8),)


class F64Seq(nn.Module):
    """float64 buffer, variable sequence length."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(32, 8)
        self.register_buffer("scale", torch.full((8,), 0.5, dtype=torch.float64))
        self.fc = nn.Linear(8, 8)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens) * self.scale.float()
        return self.fc(h).mean(dim=1)


def f64seq() -> nn.Module:
    return F64Seq()


class DataDependent(nn.Module):
    """Data-dependent control flow: torch.export cannot capture it."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        if h.sum() > 0:
            return torch.relu(h)
        return torch.tanh(h)


def data_dependent() -> tuple[nn.Module, tuple]:
    return DataDependent(), (torch.randn(2, 8),)


def raises() -> nn.Module:
    raise RuntimeError("cannot build")


def not_a_module() -> int:
    return 3


def cpu_fails() -> tuple[nn.Module, tuple]:
    return Native(), (torch.randn(2, 5),)  # Linear(8, ...) on 5 features


@torch.library.custom_op("audit_models::scale", mutates_args=())
def _scale(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@_scale.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


class Custom(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _scale(self.fc(x))


def custom() -> nn.Module:
    return Custom()


def custom_inputs() -> torch.Tensor:
    return torch.randn(3, 8)


_LIB = torch.library.Library("audit_cpp", "DEF")  # like a C++ extension: a CPU kernel only
_LIB.define("shift(Tensor x) -> Tensor")
_LIB.impl("shift", lambda x: x + 1, "CPU")


class CpuOnly(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.audit_cpp.shift(x) * 3


def cpu_only() -> tuple[nn.Module, tuple]:
    return CpuOnly(), (torch.randn(4),)
