"""The generation lane as a work kind (:data:`GENERATE`): a group per causal LM x dtype, an item per
mode x prompt-length bucket (``gen:hf.llama|gen_eager|bfloat16|128``), rows in ``gen_results``.

A group builds the model once on the CPU (:mod:`.lms`), decodes each bucket's prompts there
(shared by the modes), then on the target: eager (the model moved to the device) and compiled (its
forward compiled with the target's backend under automatic dynamic shapes; buckets in increasing
order, so a bucket's ``recompiles`` are the graphs its new lengths cost). Per item:

* every prompt greedy-decoded (:mod:`.decode`) and judged against the CPU (:mod:`.judge`);
* the log-likelihood of the fixed continuation on both;
* the first prompt decoded ``timing_repeats`` more times on the target: prefill and per-token
  decode time (p50, p99 over every timed step), the CPU's beside them;
* the overloads that fell back to the CPU while decoding (the target's op trace);
* at a wide flip or a log-likelihood shift, on an eager target, the decode up to the divergence run
  again under :func:`conformance.check.localize.locate` (every ATen call the device is handed also
  run on the CPU on the device's own inputs): the worst kernel that diverges alone is the row's
  ``first_divergent_op`` (:func:`conformance.check.blame.local_blame`).

One item is :func:`measure` on a :class:`Decoding` (the model and what its items share), which
``conformance audit --generate`` calls with a user's model (:mod:`conformance.audit.generate`).

An architecture the library cannot build, or whose CPU decode fails, is a ``skip`` row per item
with the reason; a target that raises is the item's error (or ``unsupported_*``, from its message).

Example::

    >>> from conformance.work import Selection
    >>> GENERATE.groups(Selection())
    []
    >>> GENERATE.synthetic_row(ItemKey("gen:hf.llama", "gen_compile", "bfloat16", 128))["mode"]
    'compile'
"""

from __future__ import annotations

import contextlib
import copy
import json
import statistics
import time
from collections.abc import Callable, Container, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from conformance.work import NOTHING, Group, ItemKey, Selection

PREFIX = "gen:"
MODES = {"gen_eager": "eager", "gen_compile": "compile"}
VARIANT_OF = {m: v for v, m in MODES.items()}
DTYPES = ("float32", "bfloat16")
Row = dict[str, Any]


@dataclass(frozen=True)
class Options:
    """A run's generation options (``RunSpec.gen_*``), the data file's defaults where not given."""

    modes: tuple[str, ...]
    buckets: tuple[int, ...]
    new_tokens: int

    @classmethod
    def of(cls, config: Any) -> Options:
        from conformance.datafiles import generation

        s = generation()
        modes, buckets, new_tokens = (tuple(getattr(config, "generation", ()) or ()) + ((), (), None))[:3]
        return cls(tuple(modes) or ("eager", "compile"), tuple(sorted(buckets)) or s.buckets, new_tokens or s.new_tokens)


def model_of(name: str) -> str:
    return name.removeprefix(PREFIX)


def _ms(xs: list[float], q: float) -> float | None:
    """The ``q`` quantile of ``xs`` (seconds) in milliseconds, linearly interpolated (None: no time)."""
    if not xs:
        return None
    s = sorted(xs)
    k = (len(s) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return round((s[lo] + (s[hi] - s[lo]) * (k - lo)) * 1e3, 4)


class GenerationLane:
    """The work kind: one group per selected causal LM x dtype of :data:`DTYPES` the run asks for."""

    name = "generate"
    table = "gen_results"
    variants = tuple(MODES)
    crash_safe_factor = 0
    # a group decodes every bucket's prompts on the CPU and the target, twice for compile
    timeout_factor = 5

    def groups(self, selection: Selection) -> list[Group]:
        if not selection.generate:
            return []
        from conformance.select import parse_dtypes

        from . import lms

        dtypes = [d for d in parse_dtypes(selection.dtypes) if d in DTYPES] if selection.dtypes else ["float32"]
        return [Group(PREFIX + m, d, self.name) for m in lms.select(selection.generate) for d in dtypes]

    def run(self, target: Any, group: Group, config: Any, *, skip: Container[str] = NOTHING,
            on_start: Callable[[str], None] | None = None) -> Iterator[Row]:
        return run_group(target, group, config, skip=skip, on_start=on_start)

    def synthetic_row(self, key: ItemKey) -> Row:
        return {"model_id": model_of(key.name), "mode": MODES.get(key.variant, key.variant), "dtype": key.dtype,
                "bucket": key.sample if isinstance(key.sample, int) else None}


GENERATE = GenerationLane()


def _base(key: ItemKey, params: dict[str, Any] | None, n_new: int) -> Row:
    return {"item_key": str(key), "model_id": model_of(key.name), "dtype": key.dtype, "mode": MODES[key.variant],
            "bucket": key.sample, "new_tokens": n_new, "params": json.dumps(params) if params else None}


def run_group(target: Any, group: Group, config: Any, *, skip: Container[str] = NOTHING,
              on_start: Callable[[str], None] | None = None) -> Iterator[Row]:
    from conformance.check.execute import phase
    from conformance.datafiles import generation
    from conformance.models.zoo import ZooSkip

    from . import decode, lms

    settings, opts = generation(), Options.of(config)
    model_id, dtype = model_of(group.op), getattr(torch, group.dtype)
    keys = [ItemKey(group.op, VARIANT_OF[m], group.dtype, b) for m in opts.modes for b in opts.buckets]
    todo = [k for k in keys if str(k) not in skip]
    if not todo:
        return
    if getattr(target, "compiler", False):  # a compiler target compiles every item: its items are compile items
        todo = [k for k in todo if MODES[k.variant] == "compile"] or todo
    if on_start is not None:
        on_start(str(todo[0]))
    phase("cpu")
    positions = max(opts.buckets) + max(opts.new_tokens, settings.continuation) + 8
    try:
        model = lms.build(model_id, positions, settings.initializer_range).to(dtype)
        vocab = lms.vocab(model)
        kind = decode.cache_kind(model)
        params = {"library": "hf", "model_type": model_id.removeprefix("hf."), "vocab": vocab, "cache": kind,
                  "parameters": sum(p.numel() for p in model.parameters())}
    except ZooSkip as exc:
        for k in todo:
            yield {**_base(k, None, opts.new_tokens), "status": "skip", "error": str(exc)}
        return
    decoding = Decoding(target, model, model_id, group.dtype, opts, settings, kind, vocab)
    for key in todo:
        if on_start is not None:
            on_start(str(key))
        row = _base(key, params, opts.new_tokens) | {"cache": kind, "prompts": settings.prompts}
        t0 = time.perf_counter()  # the CPU's decodes of a bucket are charged to its first item
        found = measure(decoding, MODES[key.variant], int(key.sample))
        yield {**row, **found, "duration_s": round(time.perf_counter() - t0, 4)}


@dataclass
class Decoding:
    """One causal LM decoded on ``target`` against the CPU: what :func:`measure` needs for any of
    its (mode, bucket) items, and what it keeps across them (each bucket's CPU side, shared by the
    modes; each mode's device copy, so a compiled model's later buckets count their recompiles).

    ``model`` is the CPU original in the item's dtype (never mutated); ``seed_id`` seeds the
    prompts and the continuation (:func:`.lms.prompts`: the lane's model id, the audit's label);
    ``kind`` is its cache (:func:`.decode.cache_kind`), ``vocab`` its vocabulary (:func:`.lms.vocab`).
    """

    target: Any
    model: Any
    seed_id: str
    dtype: str
    opts: Options
    settings: Any
    kind: str
    vocab: int
    reference: dict[int, Any] = field(default_factory=dict)
    devices: dict[str, Any] = field(default_factory=dict)

    @property
    def rtol(self) -> float:
        return self.settings.logits_rtol(self.target.name, self.dtype)

    @property
    def loglik_tol(self) -> float:
        return self.settings.max_shift(self.target.name, self.dtype)


def measure(d: Decoding, mode: str, bucket: int) -> Row:
    """One item: ``bucket``'s prompts greedy-decoded on the target in ``mode`` (eager | compile)
    and judged against the CPU: the row's figures, its ``status`` and ``error`` (the module doc
    says which). Buckets of one mode in increasing order: a bucket's ``recompiles`` are the graphs
    compiled since the previous one."""
    from conformance.check.execute import err, phase
    from conformance.check.verdict import decide

    from . import decode, judge

    target, settings, opts, kind = d.target, d.settings, d.opts, d.kind
    rtol, loglik_tol = d.rtol, d.loglik_tol
    phase("cpu")
    if bucket not in d.reference:
        try:
            d.reference[bucket] = _cpu_side(d.model, d.seed_id, bucket, d.vocab, opts, settings, kind)
        except Exception as exc:  # noqa: BLE001 - the CPU cannot decode it: nothing to say about the target
            d.reference[bucket] = exc
    ref = d.reference[bucket]
    if isinstance(ref, Exception):
        return {"status": "skip", "error": f"fails on the CPU: {err(ref)}"}
    phase("target")
    try:
        if mode not in d.devices:
            d.devices[mode] = _device_model(d.model, target, mode)
        dev_model, counter = d.devices[mode]
        before = counter.compiles if counter is not None else 0
        # Dynamo runs a frame eager under a dispatch mode: the compiled decode is not op-traced
        # (its fallbacks are the eager mode's)
        with target.trace() if counter is None else contextlib.nullcontext() as trace:
            outs = [decode.decode(dev_model, p, opts.new_tokens, device=target.device, cache=kind,
                                  sync=target.synchronize) for p in ref["prompts"]]
        compiled = counter.compiles if counter is not None else 0
        # timed outside the op trace: its dispatch mode would be timed with every op
        timed = [decode.decode(dev_model, ref["prompts"][0], opts.new_tokens, device=target.device,
                               cache=kind, sync=target.synchronize) for _ in range(settings.timing_repeats)]
        ll_t = decode.log_likelihood(dev_model, ref["prompts"][0], ref["continuation"], target.device)
    except Exception as exc:  # noqa: BLE001 - the target's failure is the item's verdict
        return {"status": decide(cpu_error=None, target_error=err(exc), close=False).value, "error": err(exc)}
    seqs = [judge.judge_sequence(c, t, rtol=rtol, factor=settings.near_tie_factor)
            for c, t in zip(ref["decoded"], outs, strict=True)]
    verdict = judge.judge(seqs, ref["loglik"], ll_t, loglik_tol)
    timing = timed or outs  # the repeats: the first decodes of a compiled bucket include its compiles
    steps = [s for t in timing for s in t.step_s]
    rep = verdict.reported
    row: Row = dict(
        agreement=round(verdict.agreement, 4), near_tie_flips=verdict.near_tie, wide_flips=verdict.wide,
        first_divergence=verdict.first_divergence,
        margin=rep.margin if rep else None, margin_tol=rep.bound if rep else None,
        logits_rel_err=round(judge.shared_prefix_err(list(zip(ref["decoded"], outs, seqs, strict=True))), 6),
        loglik_cpu=round(ref["loglik"], 6), loglik_target=round(ll_t, 6),
        loglik_shift=round(verdict.loglik_shift, 6), loglik_tol=loglik_tol,
        prefill_ms=round(statistics.median(t.prefill_s for t in timing) * 1e3, 4),
        decode_p50_ms=_ms(steps, 0.5), decode_p99_ms=_ms(steps, 0.99),
        cpu_decode_p50_ms=_ms(ref["steps"], 0.5), cpu_decode_p99_ms=_ms(ref["steps"], 0.99),
        fallback_ops=json.dumps(sorted(trace.fallback)) if trace is not None else None,
        evidence=json.dumps({"sequences": [s.as_dict() for s in seqs], "rtol": rtol,
                             "near_tie_factor": settings.near_tie_factor}))
    if counter is not None:
        row.update(recompiles=compiled - before, graphs=counter.compiles)
    if not verdict.close and mode == "eager" and not getattr(target, "compiler", False):
        row.update(_localise(target, dev_model, ref, seqs, kind, opts.new_tokens))
    status = decide(cpu_error=None, target_error=None, close=verdict.close,
                    fallback=sorted(trace.fallback) if trace is not None else (),
                    graphs=counter.compiles if counter is not None else None)
    return {**row, "status": status.value, "error": verdict.reason or None}


def _cpu_side(model: Any, model_id: str, bucket: int, vocab: int, opts: Options, settings: Any, kind: str) -> dict:
    from . import decode, lms

    prompts = lms.prompts(model_id, bucket, vocab=vocab, n=settings.prompts)
    cont = lms.continuation(model_id, bucket, vocab=vocab, n=settings.continuation)
    decoded = [decode.decode(model, p, opts.new_tokens, device="cpu", cache=kind) for p in prompts]
    return {"prompts": prompts, "continuation": cont, "decoded": decoded,
            "loglik": decode.log_likelihood(model, prompts[0], cont, "cpu"),
            "steps": [s for d in decoded for s in d.step_s]}


def _device_model(model: Any, target: Any, mode: str) -> tuple[Any, Any]:
    from . import decode

    dev = copy.deepcopy(model)
    dev = target.to_device(dev) if not isinstance(dev, torch.nn.Module) else dev.to(target.device)
    if mode != "compile":
        return dev, None
    # a worker decodes one model after another: the graphs Dynamo compiled for the last one (another
    # dtype, or an architecture sharing its modeling code) must not be reused, or be counted as this one's
    torch._dynamo.reset()
    return dev, decode.compiled(dev, target.compile_backend())


def _localise(target: Any, dev_model: Any, ref: dict, seqs: list, kind: str, n_new: int) -> Row:
    """The first divergent op of the first wide flip's prompt (else the first prompt: a
    log-likelihood shift), its decode up to that position run under the differential mode."""
    from conformance.check.blame import local_blame
    from conformance.check.localize import locate

    from . import decode

    wide = [(i, s) for i, s in enumerate(seqs) if s.kind == "wide"]
    index, seq = wide[0] if wide else (0, None)
    upto = min(n_new, (seq.position or 0) + 1) if seq is not None else n_new
    found = locate(target, lambda: decode.decode(dev_model, ref["prompts"][index], upto, device=target.device,
                                                 cache=kind, sync=target.synchronize))
    if not found:
        return {}
    op, _ = local_blame({"locus": found})
    detail = {"prompt": index, "new_tokens": upto, **found}
    return {"first_divergent_op": op or None, "first_divergent_detail": json.dumps(detail)}
