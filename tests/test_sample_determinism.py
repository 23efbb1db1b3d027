"""An OpInfo sample is a function of the seed alone: what runs between two samples (a random op
on the CPU, a device drawing from the global generator) and the process's own random state do
not change it, or the builds of a nightly (separate processes) and ``conformance repro`` would
see other inputs under the same item key (they did: ``nn.functional.gaussian_nll_loss`` draws
its ``eps`` from Python's ``random``, and the gate reported it flaky between builds)."""

from __future__ import annotations

import random

import torch

from conformance.inputs.opinfo import DEFAULT_SEED, by_name, samples, seed_all


def _content(op: str, between=None) -> list[tuple]:
    out = []
    for s in samples(by_name()[op], torch.float32):
        out.append((s.input.clone(), [a.clone() if isinstance(a, torch.Tensor) else a for a in s.args],
                    {k: v for k, v in s.kwargs.items()}))
        if between is not None:
            between()
    return out


def _same(a: list[tuple], b: list[tuple]) -> bool:
    return len(a) == len(b) and all(
        torch.equal(x[0], y[0]) and x[2] == y[2]
        and all(torch.equal(p, q) if isinstance(p, torch.Tensor) else p == q for p, q in zip(x[1], y[1], strict=True))
        for x, y in zip(a, b, strict=True))


def test_samples_do_not_depend_on_what_runs_between_them():
    plain = _content("nn.functional.gaussian_nll_loss")
    assert _same(plain, _content("nn.functional.gaussian_nll_loss", between=lambda: torch.rand(7)))
    assert _same(plain, _content("nn.functional.gaussian_nll_loss", between=lambda: torch.randn(3).bernoulli_()))


def test_samples_do_not_depend_on_the_process_random_state():
    random.seed(1)
    a = _content("nn.functional.gaussian_nll_loss")
    random.seed(2)
    torch.manual_seed(3)
    b = _content("nn.functional.gaussian_nll_loss")
    assert _same(a, b)
    assert any("eps" in kw for _, _, kw in a)  # the op draws an eps from Python's random


def test_the_caller_starts_from_the_seeded_state():
    """The items run after the generator starts see the global generator as seeded (their
    random ops draw what they drew before), not the generator's leftovers."""
    gen = samples(by_name()["add"], torch.float32)
    next(gen)
    after_one = torch.rand(4)
    next(gen)
    seed_all(DEFAULT_SEED)
    assert torch.equal(after_one, torch.rand(4))
