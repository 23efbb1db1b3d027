"""``cuda``: a CUDA GPU, when one is present."""

from __future__ import annotations

import torch

from .base import Target, TargetError, register


@register
class CudaTarget(Target):
    name = "cuda"
    description = "eager CUDA vs eager CPU"
    device = "cuda"

    def setup(self) -> None:
        if not torch.cuda.is_available():
            raise TargetError("target 'cuda' needs a CUDA device; torch.cuda.is_available() is False here")
        if self.ref.is_default:
            self.build = f"cuda-{torch.version.cuda}-{torch.cuda.get_device_name(0)}".replace(" ", "_")

    def synchronize(self) -> None:
        torch.cuda.synchronize()
