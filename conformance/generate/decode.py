"""Greedy decoding as a server runs it, on one device: transformers' ``generate`` with the KV cache
a server uses (a static cache where the architecture supports one, the dynamic cache otherwise),
each step timed, its logits kept.

``generate`` is the serving stand-in because it is what a team runs before a server: the cache
update, the masks and the position bookkeeping are the library's, not ours. A step's time is taken
when ``generate`` asks its stopping criterion whether to go on (after the step's token is chosen),
with the device synchronized: the first is the prefill (the prompt's forward and its token), the
others one decode step each.

The compiled mode compiles the model's forward with the target's ``torch.compile`` backend
(counted: :class:`conformance.models.timing.CountingBackend`) under automatic dynamic shapes, as a
user who compiles the model and calls ``generate`` meets it; the graphs compiled while one bucket
decodes are that bucket's recompiles.

Example::

    >>> import torch
    >>> from torch import nn
    >>> from conformance.generate.decode import log_likelihood
    >>> class Uniform(nn.Module):
    ...     def forward(self, input_ids, **kw):
    ...         return type("Out", (), {"logits": torch.zeros(*input_ids.shape, 4)})()
    >>> round(log_likelihood(Uniform(), torch.tensor([[1, 2]]), torch.tensor([[3, 0]]), "cpu"), 4)
    -1.3863
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn


@dataclass
class Decoded:
    """One prompt decoded greedily on one device."""

    tokens: list[int]  # the new tokens
    logits: list[torch.Tensor] = field(repr=False)  # per new token, the float32 logits it was chosen from (on the CPU)
    prefill_s: float
    step_s: list[float]  # each decode step after the prefill
    cache: str  # static | dynamic


def cache_kind(model: nn.Module) -> str:
    """``static`` where the architecture can decode with a static cache (the one a compiled server
    keeps), else ``dynamic``."""
    return "static" if getattr(model, "_can_compile_fullgraph", False) else "dynamic"


class _Clock:
    """A stopping criterion that never stops: it timestamps each step (device synchronized)."""

    def __init__(self, sync: Callable[[], None]) -> None:
        self.sync, self.marks = sync, []

    def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
        self.sync()
        self.marks.append(time.perf_counter())
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


def decode(model: nn.Module, prompt: torch.Tensor, new_tokens: int, *, device: str | torch.device,
           cache: str, sync: Callable[[], None] = lambda: None) -> Decoded:
    """Greedy-decode ``new_tokens`` tokens after ``prompt`` (batch 1) with ``model`` (on ``device``)."""
    from transformers import StoppingCriteriaList

    ids = prompt.to(device)
    clock = _Clock(sync)
    # transformers sizes a static cache to the longest generate() the model has seen: each decode is
    # sized to its own prompt (what is measured must not depend on the buckets decoded before it)
    model.__dict__.pop("_previous_max_cache_length", None)
    kwargs: dict[str, Any] = {"cache_implementation": "static"} if cache == "static" else {}
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        sync()
        t0 = time.perf_counter()
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, do_sample=False, num_beams=1,
                             stopping_criteria=StoppingCriteriaList([clock]), output_logits=True,
                             return_dict_in_generate=True, pad_token_id=0, **kwargs)
    tokens = out.sequences[0, ids.shape[1]:].to("cpu").tolist()
    logits = [step[0].detach().to("cpu", torch.float32) for step in out.logits]
    marks = [t0, *clock.marks]
    steps = [b - a for a, b in zip(marks, marks[1:], strict=False)]
    return Decoded(tokens=tokens, logits=logits, prefill_s=steps[0] if steps else 0.0, step_s=steps[1:], cache=cache)


def log_likelihood(model: nn.Module, prompt: torch.Tensor, continuation: torch.Tensor,
                   device: str | torch.device) -> float:
    """Mean log-probability (nats per token) of ``continuation`` after ``prompt``, teacher-forced in
    one forward (the logits taken in float32 on the CPU)."""
    seq = torch.cat([prompt, continuation], dim=1).to(device)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        out = model(input_ids=seq, use_cache=False)
    logits = out.logits[0].detach().to("cpu", torch.float32)
    n = continuation.shape[1]
    start = prompt.shape[1] - 1
    logp = torch.log_softmax(logits[start:start + n], dim=-1)
    return float(logp.gather(1, continuation[0].view(-1, 1)).mean())


def compiled(model: nn.Module, backend: Any) -> Any:
    """Compile ``model``'s forward in place with a counting wrapper around ``backend``; the counter."""
    from conformance.models.timing import CountingBackend

    counter = CountingBackend(backend)
    model.forward = torch.compile(model.forward, backend=counter)
    return counter
