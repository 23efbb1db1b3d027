"""Compiler targets: the samples of one op x dtype compiled as one graph.

On a compiler target compiling is nearly all of an item's cost (inductor on the CPU: ~0.4 s of
dynamo, AOTAutograd, code generation and a C++ build per graph, against microseconds to run
it), and every item used to compile its own graph. A :class:`Batch` calls the op on up to
``size`` samples inside one function, compiled once, and hands each item its own result from
it. What the item then does (the CPU reference, the comparison, the contracts, the verdict) is
unchanged.

A batch is kept only when it proves that every sample in it was compiled: the backend compiled
exactly one graph with no graph break (:meth:`conformance.targets.Target.batch_problem`), so
no sample's call ran eager between graphs. A batch that fails (a compile error, an export the
backend refuses, a graph break, an exception at run time) is bisected: its halves are tried,
and the failing half is split again until the sample that fails is alone; a failure found in
both halves is not one sample's, and their samples run as items of their own. A sample that is
not in a kept batch runs exactly as it did without batching. And an item whose batched result
does not pass is run again on its own (:func:`conformance.sweep.run_group` does that): its
verdict is always what a call of that sample alone gets.

Random ops are never batched (one RNG stream would run through all samples). The supervisor
runs a batch in its own phase (``batch``): a batch that kills or hangs its worker is nobody's
crash, and the group continues unbatched (:class:`conformance.work.Skip` ``batch``).
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from conformance.targets import Compiled, Target

from .compare import leaves
from .execute import (
    backward_grads,
    err,
    grad_inputs,
    invoke,
    leafify,
    on_device,
    out_like,
    phase,
    proof,
    to_cpu,
)

#: Samples per compiled graph unless ``--compile-batch`` says otherwise (1: no batching).
DEFAULT_SIZE = Target.default_batch
#: The variants a batch runs (``mode``).
MODES = ("function", "inplace", "out", "backward")
#: The phase a worker reports while it runs a batch (:func:`conformance.check.execute.phase`).
BATCH_PHASE = "batch"


@dataclass
class Computed:
    """One sample's result from a kept batch, as :func:`conformance.check.execute.run_item` takes it."""

    result: Any  # on the device (the function's result, or the input gradients for backward)
    sample: Any  # the device sample it was computed from
    proof: dict[str, Any]
    duration_s: float  # the batch's call time, shared out over its samples
    repeats: list[Any] = field(default_factory=list)  # later identical calls' results, on the CPU
    record: Compiled | None = None  # what the backend compiled for the batch (its op trace reads it)


@dataclass
class Attempt:
    """One try of a batch: which samples, and why it was not kept (None: kept)."""

    indices: tuple[int, ...]
    problem: str | None


class Batch:
    """``fn`` on ``samples`` (index -> CPU sample) on ``target``, up to ``size`` samples per
    compiled graph; computed on the first :meth:`get`.

    ``mode`` is the OpInfo variant ``fn`` is: ``function``, ``inplace``, ``out`` (``outs`` gives
    per index the CPU's result, whose shapes the ``out=`` tensors take, as
    :func:`conformance.check.execute.invoke` gives them on a compiler target) or ``backward`` (the
    samples carry ``requires_grad`` and the result is the input gradients for the upstream
    gradients ``upstream`` gives per index: the CPU's, so both sides use the same).
    ``repeat``: indices whose sample is called twice more through the same compiled graph (the
    determinism contract's two identical calls)."""

    def __init__(self, target: Target, fn: Callable[..., Any], samples: dict[int, Any], *, size: int = DEFAULT_SIZE,
                 mode: str = "function", upstream: dict[int, list[torch.Tensor]] | None = None,
                 outs: dict[int, Any] | None = None, repeat: Collection[int] = ()) -> None:
        if size < 2:
            raise ValueError(f"a batch needs a size of at least 2, not {size!r}")
        if mode not in MODES:
            raise ValueError(f"batch mode {mode!r}: expected one of {', '.join(MODES)}")
        self.target, self.fn, self.samples, self.size, self.mode = target, fn, samples, size, mode
        self.upstream = upstream or {}
        self.outs = outs or {}
        self.repeat = frozenset(repeat)
        self.results: dict[int, Computed] = {}
        self.attempts: list[Attempt] = []
        self._done = False

    def get(self, index: int) -> Computed | None:
        """The sample's result from a kept batch; None: it runs as an item of its own."""
        if not self._done:
            self._done = True
            self.run()
        return self.results.get(index)

    def run(self) -> None:
        indices = sorted(self.samples)
        chunks = -(-len(indices) // self.size)  # as few batches as the size allows, of even sizes
        for k in range(chunks):
            chunk = tuple(indices[k * len(indices) // chunks:(k + 1) * len(indices) // chunks])
            if len(chunk) > 1 and not self._attempt(chunk):
                self._bisect(chunk)

    # -- bisection -------------------------------------------------------------------------
    def _bisect(self, failed: tuple[int, ...]) -> None:
        """``failed`` failed as one batch: keep what of it compiles, down to the failing sample."""
        half = len(failed) // 2
        left, right = failed[:half], failed[half:]
        left_ok = len(left) > 1 and self._attempt(left)
        right_ok = len(right) > 1 and self._attempt(right)
        if not left_ok and not right_ok:
            return  # not one sample's failure (or halves of one): every sample runs alone
        for part, ok in ((left, left_ok), (right, right_ok)):
            if not ok and len(part) > 1:
                self._bisect(part)

    def _attempt(self, chunk: tuple[int, ...]) -> bool:
        phase(BATCH_PHASE)
        problem = None
        try:
            problem = self._compute(chunk)
        except Exception as exc:  # noqa: BLE001 - any failure sends the batch to bisection
            problem = err(exc)
        self.attempts.append(Attempt(chunk, problem))
        return problem is None

    def _compute(self, chunk: tuple[int, ...]) -> str | None:
        target = self.target
        structures, tensors, dev_samples = [], [], []
        for i in chunk:
            s, flat_tensors, structure = self._prepare(i)
            structures.append(structure)
            tensors += flat_tensors
            dev_samples.append(s)
        compiled = target.wrap(_batched(self.fn, structures))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t0 = time.perf_counter()
            outs = compiled(*tensors)
            if self.mode == "backward":
                results = _gradients(outs, dev_samples, [self.upstream[i] for i in chunk], target.device)
            else:
                results = list(outs)
            target.synchronize()
            took = time.perf_counter() - t0
        record = target.compiled()
        if record is None:
            return "the target compiled nothing (not a compiler target)"
        why = target.batch_problem(record)
        if why is not None:
            return why
        evidence = proof(target, results)
        evidence["compile_s"] = round(record.compile_s / len(chunk), 4)
        repeats = self._repeats(compiled, chunk) if self.repeat else {}
        for pos, i in enumerate(chunk):
            item_proof = {**evidence, "device": sorted({str(x.device) for x in leaves(results[pos])
                                                        if isinstance(x, torch.Tensor)}),
                          "batch": {"samples": len(chunk), "first": chunk[0], "compile_s": round(record.compile_s, 4)}}
            self.results[i] = Computed(results[pos], dev_samples[pos], item_proof, took / len(chunk),
                                       repeats.get(i, []), record)
        return None

    def _prepare(self, i: int) -> tuple[Any, list[torch.Tensor], tuple[Any, list[Any], list[int], Any]]:
        """Sample ``i`` on the device, its tensors in call order (``out=`` tensors last) and the
        structure :func:`_batched` rebuilds the call from."""
        dev = self.target.device
        s = leafify(self.samples[i], dev) if self.mode == "backward" else on_device(self.samples[i], dev)
        flat, spec = tree_flatten((s.input, s.args, s.kwargs))
        where = [k for k, x in enumerate(flat) if isinstance(x, torch.Tensor)]
        tensors = [flat[k] for k in where]
        out = None
        if self.mode == "out":
            made = out_like(self.outs[i], dev, sized=True)
            out = 1 if isinstance(made, torch.Tensor) else len(made)
            tensors += [made] if isinstance(made, torch.Tensor) else list(made)
        return s, tensors, (spec, [None if k in where else x for k, x in enumerate(flat)], where, out)

    def _repeats(self, compiled: Callable[..., Any], chunk: tuple[int, ...]) -> dict[int, list[Any]]:
        """Two more calls of the same compiled graph on fresh copies, for the samples in
        ``repeat``; nothing when one raises (determinism then calls the op on its own)."""
        wanted = [pos for pos, i in enumerate(chunk) if i in self.repeat]
        if not wanted:
            return {}
        out: dict[int, list[Any]] = {chunk[pos]: [] for pos in wanted}
        try:
            for _ in range(2):
                tensors = [t for i in chunk for t in self._prepare(i)[1]]
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    again = compiled(*tensors)
                self.target.synchronize()
                for pos in wanted:
                    out[chunk[pos]].append(to_cpu(again[pos]))
        except Exception:  # noqa: BLE001
            return {}
        return out


def _batched(fn: Callable[..., Any], structures: list[tuple[Any, list[Any], list[int], Any]]) -> Callable[..., Any]:
    """One function calling ``fn`` on every sample: its tensors are the positional arguments
    (graph inputs, not constants), everything else is rebuilt from each sample's structure. A
    sample with ``out=`` tensors (their count in the structure) returns them unless ``fn``
    returns something, as :func:`conformance.check.execute.invoke` does."""
    def batched(*tensors: torch.Tensor) -> tuple[Any, ...]:
        outs = []
        k = 0
        for spec, template, where, n_out in structures:
            flat = list(template)
            for pos in where:
                flat[pos] = tensors[k]
                k += 1
            inp, args, kwargs = tree_unflatten(flat, spec)
            if n_out is None:
                outs.append(fn(inp, *args, **kwargs))
                continue
            out = tensors[k] if n_out == 1 else tuple(tensors[k:k + n_out])
            k += n_out
            ret = fn(inp, *args, **kwargs, out=out)
            outs.append(out if ret is None else ret)
        return tuple(outs)

    batched.__name__ = f"batch_of_{getattr(fn, '__name__', 'op')}"
    return batched


def _gradients(outs: tuple[Any, ...], samples: list[Any], upstream: list[list[torch.Tensor]],
               device: str | torch.device) -> list[list[Any]]:
    """Each sample's input gradients from one ``autograd.grad`` over every sample's outputs."""
    all_outs, all_up, all_inputs, counts = [], [], [], []
    for out, s, up in zip(outs, samples, upstream, strict=True):
        diff = [o for o in leaves(out) if isinstance(o, torch.Tensor) and o.requires_grad]
        if not diff:
            raise ValueError("no differentiable output")
        if len(diff) != len(up):
            raise ValueError(f"{len(diff)} differentiable outputs on the target, {len(up)} on the CPU")
        inputs = grad_inputs(s)
        all_outs += diff
        all_up += [g.to(device) for g in up]
        all_inputs += inputs
        counts.append(len(inputs))
    grads = list(torch.autograd.grad(all_outs, all_inputs, all_up, allow_unused=True))
    results, k = [], 0
    for n in counts:
        results.append(grads[k:k + n])
        k += n
    return results


def cpu_upstream(fn: Callable[..., Any], samples: dict[int, Any]) -> dict[int, list[torch.Tensor]]:
    """The upstream gradients the CPU reference draws for each sample (as
    :func:`conformance.check.execute.run_backward` does); samples whose CPU backward fails are left out."""
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i, s in samples.items():
            try:
                _grads, up = backward_grads(fn, leafify(s, "cpu"), None, "cpu")
            except Exception:  # noqa: BLE001 - its item reports the CPU's failure
                continue
            out[i] = up
    return out


class OpBatches:
    """The batches of one op x dtype group, each made on first use: one per variant and
    callable (the function; the method and aliases the variants contract compares with it; the
    in-place and ``out=`` variants; backward).

    ``samples``: per variant, index -> CPU sample of the items still to run (callables other
    than the variant's own run on the function samples); ``repeat``: the indices whose function
    call the determinism contract repeats."""

    def __init__(self, target: Target, info: Any, samples: dict[str, dict[int, Any]], *, size: int = DEFAULT_SIZE,
                 repeat: Collection[int] = ()) -> None:
        self.target, self.info, self.size = target, info, size
        self.samples = samples
        self.repeat = frozenset(repeat)
        self._made: dict[tuple[str, int], tuple[Callable[..., Any], Batch]] = {}

    def get(self, variant: str, fn: Callable[..., Any], index: int) -> Computed | None:
        """``fn`` (of ``variant``) on sample ``index`` from its batch; None: the item runs on its own."""
        if variant not in MODES:
            return None
        samples = self.samples.get(variant, {})
        if index not in samples:
            return None
        held = self._made.get((variant, id(fn)))
        if held is None:
            held = self._made[(variant, id(fn))] = (fn, self._batch(variant, fn, samples))
        return held[1].get(index)

    def _batch(self, variant: str, fn: Callable[..., Any], samples: dict[int, Any]) -> Batch:
        if variant == "backward":
            phase("cpu")  # the CPU's upstream gradients first: both sides use the same
            upstream = cpu_upstream(fn, samples)
            return Batch(self.target, fn, {i: s for i, s in samples.items() if i in upstream}, size=self.size,
                         mode="backward", upstream=upstream)
        if variant == "out":
            phase("cpu")  # the out= tensors take the shapes of the CPU's result
            outs = cpu_results(self.info.op, samples)
            return Batch(self.target, fn, {i: s for i, s in samples.items() if i in outs}, size=self.size,
                         mode="out", outs=outs)
        repeat = self.repeat if variant == "function" and fn is self.info.op else ()
        phase("cpu")  # samples the CPU rejects are left to their items (each reports a skip)
        valid = cpu_results(fn, samples, variant)
        return Batch(self.target, fn, {i: s for i, s in samples.items() if i in valid}, size=self.size, mode=variant,
                     repeat=repeat)

    def attempts(self) -> list[Attempt]:
        return [a for _, b in self._made.values() for a in b.attempts]


def cpu_results(fn: Callable[..., Any], samples: dict[int, Any], variant: str = "function") -> dict[int, Any]:
    """The CPU's results of ``fn`` as ``variant`` (function or inplace) per sample; samples it
    fails on are left out."""
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i, s in samples.items():
            try:
                out[i] = invoke(fn, variant, on_device(s, "cpu"), "cpu", None)
            except Exception:  # noqa: BLE001 - its item reports the CPU's failure
                continue
    return out
