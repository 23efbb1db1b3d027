"""The perf lane's decode items: the latency of one greedy decode step of a causal LM (per-token
decode latency), a KV cache filled with a prompt of the bucket's length.

An item is ``PerfItem("decode", "hf.llama", dtype, "b32", index=32, signature)``: the model of
:func:`conformance.generate.lms.build` (seeded weights, the generation data file's
``initializer_range``, room for the bucket and :data:`EXTRA` tokens) in ``dtype`` (float32 or
bfloat16), on the target. :func:`prepare` fills the cache the generation lane decodes with
(:func:`conformance.generate.decode.cache_kind`: a ``transformers.StaticCache`` of
``bucket + EXTRA`` slots where the architecture supports one, else a ``DynamicCache``; the
dynamic one too where a static one could not be put back after a step: a sliding window shorter
than its slots) with the bucket's first prompt (:func:`~conformance.generate.lms.prompts`), and returns a call that runs
one decode step under ``torch.no_grad()``: the first token of the bucket's fixed continuation
(:func:`~conformance.generate.lms.continuation`, so the input does not depend on what a build
computed) at position ``bucket``, then ``cache.crop(-1)``. The crop puts the cache back as the
prefill left it, so every timed call is the same step: in transformers 5.25 a static layer
writes at its own running length (``cumulative_length``), not at a position it is given, and a
dynamic layer concatenates; neither would repeat without it. The cache records its past
(``activate_past_recording``, as ``generate`` does before rolling back) so sliding-window and
linear-attention layers can be cropped too; a cache that still cannot be put back
(``is_croppable`` false), a model that caches nothing (its prefill leaves no tokens in the cache)
or a step that does not repeat (its second call's logits differ from its first's) is refused at
preparation with the reason: the item is ``skip``, its baseline cannot run it.

The signature (the inputs' identity, equal on both workers or the item is not compared) names
the step's input, the cache and a CRC of the weights in ``dtype``: both workers, and the process
that chose the items, must have built the same model.

Example::

    >>> from conformance.perf.decode import label
    >>> label(32)
    'b32'
"""

from __future__ import annotations

import inspect
import warnings
import zlib
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from .items import PerfItem

KIND = "decode"
DTYPES = ("float32", "bfloat16")
#: Cache slots beyond the bucket (a static cache's ``max_cache_len`` is ``bucket + EXTRA``).
EXTRA = 8


def label(bucket: int) -> str:
    return f"b{bucket}"


def _model(model_id: str, dtype: str, bucket: int) -> nn.Module:
    from conformance.datafiles import generation
    from conformance.generate import lms

    return lms.build(model_id, bucket + EXTRA, generation().initializer_range).to(getattr(torch, dtype))


def _weights_crc(model: nn.Module) -> int:
    crc = 0
    for t in model.state_dict().values():
        if t.numel():
            crc = zlib.crc32(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes(), crc)
    return crc


def _cache(model: nn.Module, bucket: int) -> Any:
    """An empty cache for ``model`` at ``bucket``: static where the architecture decodes with one
    and it can be put back after a step, else dynamic."""
    from transformers import DynamicCache, StaticCache

    from conformance.generate.decode import cache_kind

    if cache_kind(model) == "static":
        cache = StaticCache(config=model.config, max_cache_len=bucket + EXTRA)
        if cache.is_croppable:
            return cache
    return DynamicCache(config=model.config)


def _signature(model: nn.Module, bucket: int) -> str:
    from transformers import StaticCache

    static = isinstance(_cache(model, bucket), StaticCache)
    cache = f"static cache {bucket}/{bucket + EXTRA}" if static else f"dynamic cache {bucket}"
    n = sum(p.numel() for p in model.parameters())
    return f"i64[1,1], {cache}, {n:,} weights crc {_weights_crc(model):08x}"


def decode_items(models: list[str], dtypes: tuple[str, ...], buckets: tuple[int, ...]
                 ) -> tuple[list[PerfItem], list[tuple[str, str, str]]]:
    """The decode items of causal LMs ``models`` (ids) in ``dtypes`` (those of :data:`DTYPES`) at
    ``buckets``, and ``(model, dtype, why)`` for each pair that has none (the library cannot
    build it)."""
    from conformance.models.zoo import ZooSkip

    items: list[PerfItem] = []
    none: list[tuple[str, str, str]] = []
    for model_id in models:
        for dtype in (d for d in dtypes if d in DTYPES):
            try:
                for bucket in buckets:
                    sig = _signature(_model(model_id, dtype, bucket), bucket)
                    items.append(PerfItem(KIND, model_id, dtype, label(bucket), bucket, sig))
            except ZooSkip as exc:
                none.append((model_id, dtype, str(exc)))
    return items, none


def prepare(item: PerfItem, target: Any) -> tuple[Callable[[], Any], str]:
    """A zero-argument call that runs one decode step of ``item`` on ``target`` (see the module
    doc), and the signature of what it was built from."""
    from conformance.generate import lms

    bucket = item.index
    model = _model(item.subject, item.dtype, bucket)
    sig = _signature(model, bucket)
    vocab = lms.vocab(model)
    prompt = lms.prompts(item.subject, bucket, vocab=vocab, n=1)[0]
    token = lms.continuation(item.subject, bucket, vocab=vocab, n=1)
    model = model.to(target.device)
    cache = _cache(model, bucket)
    fwd = target.wrap(model)
    dev = target.device
    ids, prompt = token.to(dev), prompt.to(dev)
    step_kw: dict[str, Any] = {"cache": cache, "use_cache": True}
    if "position_ids" in inspect.signature(model.forward).parameters:
        step_kw["position_ids"] = torch.tensor([[bucket]], device=dev)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        fwd(input_ids=prompt, cache=cache, use_cache=True)
    cached = int(cache.get_seq_length())
    if cached != bucket:
        raise ValueError(f"{item.subject}: its prefill of {bucket} tokens leaves {cached} in the cache "
                         "(no KV cache to decode with)")
    cache.activate_past_recording(recurrent_states_to_keep=1)
    if not cache.is_croppable:
        raise ValueError(f"{item.subject}: its {type(cache).__name__} cannot be put back after a step "
                         f"(a layer whose past is not recoverable: {sorted({type(x).__name__ for x in cache.layers})})")

    def step() -> torch.Tensor:
        with torch.no_grad():
            out = fwd(input_ids=ids, **step_kw)
        cache.crop(-1)
        return out.logits

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        first, second = step().float().cpu(), step().float().cpu()
    if int(cache.get_seq_length()) != bucket or not torch.allclose(first, second, rtol=1e-3, atol=1e-3):
        raise ValueError(f"{item.subject}: a decode step does not repeat (the cache holds {int(cache.get_seq_length())} "
                         f"tokens after it, not {bucket}, or its logits move from call to call)")
    return step, sig
