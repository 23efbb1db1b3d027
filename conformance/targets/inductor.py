"""``inductor``: ``torch.compile`` (inductor) on the CPU against eager CPU."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .base import Target, register


@register
class InductorTarget(Target):
    name = "inductor"
    description = "torch.compile(backend='inductor') on CPU vs eager CPU"
    device = "cpu"

    def setup(self) -> None:
        import torch._dynamo

        torch._dynamo.config.cache_size_limit = 64
        if self.ref.is_default:
            self.build = f"inductor-{torch.__version__}"

    def repro_setup(self) -> tuple[str, str]:
        return "", "torch.compile({fn}, backend='inductor', dynamic=False)"

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        compiled = torch.compile(fn, backend="inductor", dynamic=False, fullgraph=False)

        def run(*args: Any, **kwargs: Any) -> Any:
            return compiled(*args, **kwargs)

        return run
