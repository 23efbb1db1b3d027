"""Causal LMs for tests/test_audit_generate.py (``conformance audit MODULE:CALLABLE --generate``):
the generation lane's tiny llama, seeded random weights, nothing downloaded."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def tiny_llama():  # noqa: ANN201
    """The lane's hf.llama with 64 positions and its logit spread (initializer_range 0.3)."""
    from conformance.generate import lms

    return lms.build("hf.llama", 64, 0.3)


def not_an_lm():  # noqa: ANN201 - a module with example inputs, but no generate
    import torch

    return torch.nn.Linear(4, 4), (torch.randn(2, 4),)
