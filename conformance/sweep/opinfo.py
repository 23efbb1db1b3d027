"""One group of the op sweep: generate a group's samples, execute each variant, compare, and
decide — yielding one plain result row per item. The runner (:mod:`conformance.run`) handles
processes, isolation, resume and recording; :data:`OPINFO` is this work kind.

Example::

    >>> from conformance.sweep import SweepConfig, run_group
    >>> from conformance.work import Group
    >>> from conformance.targets import get_target
    >>> rows = list(run_group(get_target("cpu"), Group("abs", "float32"), SweepConfig()))
    >>> {r["status"] for r in rows}
    {'pass'}
"""

from __future__ import annotations

import time
from collections.abc import Callable, Container, Iterator
from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch

from conformance.check import comparators, contracts, localize, selfcheck
from conformance.check.batching import OpBatches
from conformance.check.compare import TWIN_FACTOR, arbitrate, compare, leaves, twin_errors
from conformance.check.contracts import DEFAULT_BUDGET
from conformance.check.execute import run_backward, run_item, signature, trace_changes_cpu
from conformance.check.fingerprint import fingerprint
from conformance.check.ledger import Ledger
from conformance.check.refcache import open_cache
from conformance.check.verdict import NOT_COMPILED, Status, decide, decide_unrun
from conformance.inputs.opinfo import DEFAULT_SEED, SPARSE_VARIANTS, by_name, samples, variant_fn
from conformance.select import VARIANTS, parse_dtypes, select_ops
from conformance.sweep import dtypes, ladder, reference
from conformance.targets import Target
from conformance.work import NOTHING, Group, ItemKey, Selection


@dataclass(frozen=True)
class SweepConfig:
    thorough: bool = False
    seed: int = DEFAULT_SEED
    variants: tuple[str, ...] = VARIANTS
    ledger: Ledger = field(default_factory=Ledger.load)
    max_samples: int | None = None  # per group; None = all
    model_modes: tuple[str, ...] = ("eager", "compile")  # model items per graph
    zoo_modes: tuple[str, ...] = ()  # a zoo architecture's model items (empty: model_modes)
    generation: tuple[Any, ...] = ()  # (modes, buckets, new tokens) of conformance.generate.lane.Options
    contracts: tuple[str, ...] = ("default",)  # see conformance.check.contracts.parse_contracts
    # samples per compiled graph on a compiler target that can batch them (1: each item compiles
    # its own; None: the target's default, Target.default_batch; see conformance.check.batching)
    compile_batch: int | None = None
    # the file of CPU-side results shared between runs (conformance.check.refcache); None: none
    refcache: str | None = None
    # samples per op x variant x dtype the budgeted contracts check before only new shape classes (0: every sample)
    contract_budget: int = DEFAULT_BUDGET
    # where the CPU reference is run again to see that it agrees with itself
    # (conformance.check.selfcheck): "failing", on items whose values fail, whose elements the
    # CPU does not reproduce are left out; "every", on every item, and one with any such
    # element is skipped (the schema search: an input outside the op's contract is no test);
    # "off", nowhere (benchmarks/false_alarms.py measures what it costs)
    reference_check: str = "failing"
    # the sizes op items run at: samples, ladder, all, or auto (conformance.sweep.ladder)
    sizes: str = "samples"
    # whose reference_inputs the reference variant runs: none, all or K/N (conformance.sweep.reference)
    reference_inputs: str = "none"

    def describe(self) -> dict[str, Any]:
        """The settings as JSON values (the ledger, a loaded file, and the cache's path aside)."""
        return {f.name: list(v) if isinstance(v := getattr(self, f.name), tuple) else v
                for f in fields(self) if f.name not in ("ledger", "refcache")}


def evaluate(target: Target, info: Any, op: str, variant: str, dtype: str, index: int, sample: Any,
             config: SweepConfig, *, peer: dict[str, Any] | None = None) -> dict[str, Any]:
    """Execute, compare, check the contracts of and decide one item; returns its result row
    (without run bookkeeping). ``peer``: the function variant's results on the same sample."""
    return _evaluate(target, info, op, variant, dtype, index, sample, config, peer)[0]


def _evaluate(target: Target, info: Any, op: str, variant: str, dtype: str, index: int, sample: Any,
              config: SweepConfig, peer: dict[str, Any] | None, batches: OpBatches | None = None,
              budget: contracts.Budget | None = None) -> tuple[dict[str, Any], Any]:
    target.use_own_rng(comparators.comparator_for(op) == "random")
    computed = None
    if batches is not None:
        computed = batches.get(variant, info.op if variant == "backward" else variant_fn(info, variant), index)
    row, out = _decided(target, info, op, variant, dtype, index, sample, config, peer,
                        batches if computed is not None else None, computed, budget)
    if computed is not None and not Status(row["status"]).passed and row["status"] != Status.SKIP.value:
        # A batched result that does not pass is not the verdict yet: the sample runs alone, as
        # a user would call it, and that decides (a compiler may treat an op differently beside
        # other samples' ops in one graph).
        in_batch = f"{row['status']}: {row.get('error') or ''}"[:300]
        row, out = _decided(target, info, op, variant, dtype, index, sample, config, peer, None, None, budget)
        row["proof"] = {**(row.get("proof") or {}), "batch": {
            "samples": computed.proof["batch"]["samples"], "alone": True, "in_batch": in_batch}}
    return row, out


#: Comparator kinds whose items the reference self-check leaves alone: a random op's values differ
#: from call to call by design, and a meta op's (``empty*``, ``resize_``) are undefined by design
#: (only shape, dtype and strides are compared, and must not be masked as "not reproducible").
UNCHECKED_KINDS = ("random", "meta")


def _decided(target: Target, info: Any, op: str, variant: str, dtype: str, index: int, sample: Any,
             config: SweepConfig, peer: dict[str, Any] | None, batches: OpBatches | None, computed: Any,
             budget: contracts.Budget | None = None) -> tuple[dict[str, Any], Any]:
    xfail = config.ledger.expected_failure(op, variant, dtype, target.name)
    kind = comparators.comparator_for(op)
    start = time.perf_counter()
    hint = f"opinfo|{ItemKey(op, variant, dtype, index)}|{config.seed}|{int(config.thorough)}"
    out = (run_backward(target, info, sample, computed=computed) if variant == "backward"
           else run_item(target, info, variant, sample, computed=computed, refs=open_cache(config.refcache),
                         ref_hint=None if kind == "random" else hint, guard=config.reference_check == "every",
                         check_first=config.reference_check == "every" and kind not in UNCHECKED_KINDS))
    # Tolerances follow the dtype of the result: exp of an int64 tensor is a float and is not
    # compared exactly.
    tol = config.ledger.tolerance(op, variant, _result_dtype(out.cpu, dtype), target.name)
    inp = sample.input if isinstance(sample.input, torch.Tensor) else None
    per_tensor = comparators.per_tensor_fn(kind, inp)
    strict = config.reference_check == "every"
    if config.reference_check == "off":
        out.again = None
    values = _values(out, tol, kind, per_tensor, peer, strict)
    if (values is not None and not values[0].close and variant != "backward" and not target.compiler
            and kind != "random" and trace_changes_cpu(info, variant, sample)):
        out, values = _untraced(target, info, variant, sample, out, values, tol, kind, per_tensor, peer, strict)
    row: dict[str, Any] = {
        "item_key": str(ItemKey(op, variant, dtype, index)), "op": op, "variant": variant, "dtype": dtype,
        "sample": index, "atol": tol.atol, "rtol": tol.rtol, "tol_source": tol.source, "comparator": kind,
        "native_ops": list(out.native), "fallback_ops": list(out.fallback), "reached_ops": list(out.reached),
        "proof": out.proof,
        "signature": signature(sample),
        "seed": config.seed,
    }
    close = False
    error = out.cpu_error and (out.cpu_error if out.cpu_error.startswith(selfcheck.NOT_REPRODUCIBLE)
                               else f"CPU reference failed: {out.cpu_error}")
    checks: dict[str, contracts.Check] = {}
    if values is not None:
        ev, ref, measurable = values
        if measurable:
            row["fingerprint"] = fingerprint(out.target, out.cpu if ref is None else ref,
                                             ref_kind="cpu" if ref is None else "float64")
        row.update(ev.row())
        close = ev.close
        error = None if close else ev.detail
        wanted = contracts.parse_contracts(config.contracts, target)
        if wanted:
            fn = info.op if variant == "backward" else variant_fn(info, variant)
            subject = contracts.Subject(target, info, variant, dtype, index, sample, fn, out, tol.atol, tol.rtol,
                                        per_tensor, kind, peer, batches, budget, row["signature"])
            checks = contracts.check(subject, wanted)
    elif out.target_error is not None:
        error = out.target_error
    failed = contracts.failed(checks)
    row["contracts"] = {name: c.as_json() for name, c in checks.items()} or None
    row["contract_failed"] = ",".join(failed) or None
    status = decide(cpu_error=out.cpu_error, target_error=out.target_error, close=close,
                    fallback=out.fallback, expected_failure=xfail.statuses if xfail else None,
                    graphs=out.graphs, contracts_failed=failed,
                    eager_reason="; ".join((out.proof or {}).get("break_reasons") or []))
    if out.target_error is None and out.graphs == 0 and status is not Status.SKIP:
        # the status says why (nothing compiled), and so must the text: a failed contract of the
        # eager run it was had overwritten it (linalg.solve out=: 'contract metadata: ...')
        error = (f"{NOT_COMPILED} ({_eager_why(out.proof)})" if status is Status.ERROR else
                 f"the compiler refused an input's layout, compiled no graph and ran eager ({_eager_why(out.proof)})")
    elif close and failed:
        error = contracts.summary(checks)
    if status in (Status.XFAIL, Status.XPASS) and xfail is not None:
        error = f"{error or 'passed'} [expected failure: {xfail.where}: {xfail.reason}]"
    if (target.recovery and out.target_error is not None and out.graphs != 0
            and status in (Status.ERROR, Status.UNSUPPORTED_DTYPE, Status.UNSUPPORTED_LAYOUT)):
        row["proof"] = {**(row.get("proof") or {}), "recovery": target.recovery}
    row["status"] = status.value
    row["error"] = error
    row["duration_s"] = out.duration_s or (time.perf_counter() - start)
    if status is Status.MISMATCH and out.rerun is not None and not target.compiler:
        # which of the kernels it reached is wrong, asked of the item itself (its error cause)
        locus = localize.locate(target, out.rerun)
        if locus is not None:
            row["proof"] = {**(row.get("proof") or {}), "locus": locus}
    return row, out


#: A passing item whose error takes more than this share of its tolerance is arbitrated too
#: (its float64 errors are recorded; the verdict stays the CPU comparison's): near the edge, how
#: far each side is from the exact value is worth knowing. Below it the arbiter cannot change
#: an answer and is not computed.
ARBITER_MARGIN = 0.5


def _values(out: Any, tol: Any, kind: str, per_tensor: Any, peer: dict[str, Any] | None, strict: bool = False
            ) -> tuple[Any, Any, bool] | None:
    """The value comparison of an item that ran on both sides: (evidence, the reference of its
    error fingerprint, whether the error is measurable); None when a side failed.

    The float64 arbiter (the same sample computed in float64 on the CPU) runs only where it can
    change an answer: on an item whose values fail the CPU comparison (the rule that forgives a
    target more accurate than the CPU) or come within :data:`ARBITER_MARGIN` of failing it. The
    fingerprint of an item whose values pass is taken against the CPU's result, which is the
    same for every build (so drift between builds shows); of an item that fails, against the
    float64 result (the gate explains how far from exact a failing item is).

    Where the values fail (or on every item when ``strict``), the CPU reference is run again
    (:func:`_reference_again`): its elements it does not reproduce are left out; when none is
    defined (when ``strict``: when any is undefined) the item is skipped (None, with
    ``out.cpu_error`` saying why)."""
    if out.cpu_error is not None or out.target_error is not None:
        return None
    ev = compare(out.cpu, out.target, atol=tol.atol, rtol=tol.rtol, device_meta=out.device_meta,
                 per_tensor=per_tensor, comparator=kind)
    undefined = None
    if (strict or not ev.close) and kind not in UNCHECKED_KINDS and out.again is not None:
        undefined = _reference_again(out)
        if undefined is None:  # nothing of the reference is defined: the item says nothing
            return None
        if strict and undefined.any:
            out.cpu_error = undefined.describe()
            return None
        if undefined.any:
            ev = compare(out.cpu, out.target, atol=tol.atol, rtol=tol.rtol, device_meta=out.device_meta,
                         per_tensor=per_tensor, comparator=kind)
    measurable = ev.dtype_ok and ev.shape_ok and kind == "allclose"
    arb = None
    # the float64 arbiter computes the undefined elements anew: where some are, it cannot judge
    if measurable and (not ev.close or ev.tol_used > ARBITER_MARGIN) and not (undefined and undefined.any):
        arb = _arbiter(out, peer)
    out.arbiter_result = arb
    if arb is not None:
        judged = arbitrate(ev, out.cpu, out.target, arb, atol=tol.atol)
        ev = judged if not ev.close else replace(ev, arbiter_err=judged.arbiter_err,
                                                 cpu_arbiter_err=judged.cpu_arbiter_err)
    if measurable and not ev.close and out.twin is not None:
        _single_precision(out)
    return ev, (arb if not ev.close else None), measurable


def _reference_again(out: Any) -> selfcheck.Undefined | None:
    """Reference self-consistency (:mod:`conformance.check.selfcheck`) of an item whose values
    failed: the CPU reference computed again on poisoned memory
    (:func:`conformance.check.selfcheck.again_on_poisoned`). The elements
    it does not reproduce are left out of the comparison (``out.target`` takes the reference's
    values there) and counted in ``proof.undefined``. None when nothing of the reference is
    defined, or the second run raises: ``out.cpu_error`` then says so, and the item is skipped."""
    runs, error = out.again()
    if error is not None:  # the same input, its surroundings poisoned, and the CPU raises
        out.cpu_error = f"{selfcheck.NOT_REPRODUCIBLE}: another CPU run of the same input raises {error}"[:2000]
        return None
    u = selfcheck.undefined(out.cpu, *runs)
    if u.everything:
        out.cpu_error = u.describe()
        return None
    if u.any:
        out.proof = {**out.proof, "undefined": u.as_json()}
        out.target = selfcheck.masked(u, out.target, out.cpu)
    return u


def _single_precision(out: Any) -> None:
    """A double-precision item that fails: whether its error is what computing it in single
    precision gives (the CPU's single-precision twin of the sample errs as much, within
    ``TWIN_FACTOR``). Evidence for the error cause (a device that computes float64 in float32 is
    one cause, not one per op), recorded in the proof; the verdict does not change."""
    errs = twin_errors(out.cpu, out.target, out.twin())
    if errs is not None:
        t_err, w_err = errs
        out.proof = {**out.proof, "single_precision": {
            "target_err": t_err, "twin_err": w_err, "explains": bool(w_err > 0 and t_err <= TWIN_FACTOR * w_err)}}


def _untraced(target: Target, info: Any, variant: str, sample: Any, out: Any, values: tuple[Any, Any, bool],
              tol: Any, kind: str, per_tensor: Any, peer: dict[str, Any] | None, strict: bool = False
              ) -> tuple[Any, tuple[Any, Any, bool]]:
    """An item whose values failed and whose result a dispatch mode changes on the CPU
    (:func:`conformance.check.execute.trace_changes_cpu`), run once more with the target's call outside
    the op trace.

    The trace is a ``TorchDispatchMode``, and under any dispatch mode PyTorch itself runs some
    ops differently (torch 2.13: ``linalg.matrix_rank(..., out=)`` with tensor tolerances leaves
    its ``out`` unwritten, so the target returned uninitialised memory, a different value each
    run). What a user of the device gets is the untraced call: when it passes, the verdict is
    its, the overloads named are the traced call's, and ``proof.trace_perturbed`` says what the
    trace had changed. When it fails too, the traced outcome stands. Only an op the trace
    changes on the CPU is re-run: a re-run of anything else would turn a device's flaky failure
    into a pass."""
    plain = run_item(target, info, variant, sample, traced=False)
    again = _values(plain, tol, kind, per_tensor, peer, strict)
    if again is None or not again[0].close:
        return out, values
    plain.native, plain.fallback, plain.reached = out.native, out.fallback, out.reached
    plain.proof = {**plain.proof, "trace_perturbed": f"under the op trace: {values[0].detail}"[:300]}
    return plain, again


def _result_dtype(result: Any, dtype: str) -> str:
    """The dtype of the first floating-point tensor of ``result`` (``dtype`` when none is)."""
    for x in leaves(result):
        if isinstance(x, torch.Tensor) and (x.is_floating_point() or x.is_complex()):
            return str(x.dtype).removeprefix("torch.")
    return dtype


def _eager_why(proof: dict[str, Any]) -> str:
    return (f"backend {proof.get('backend')!r}: {proof.get('frames', 0)} frames converted, "
            f"{proof.get('graph_breaks', 0)} graph breaks{_reasons(proof)}, outputs on {proof.get('device') or 'no device'}")


def _reasons(proof: dict[str, Any]) -> str:
    reasons = proof.get("break_reasons") or []
    return f" ({'; '.join(reasons)})" if reasons else ""


BACKWARD_DTYPES = ("float32", "bfloat16")


def plan(info: Any, config: SweepConfig, dtype: str = "float32") -> list[str]:
    """The forward variants the OpInfo has on its strided samples (backward, reference and the
    sparse variants, each with samples of its own, are planned separately)."""
    return [v for v in config.variants
            if v not in ("backward", reference.VARIANT, dtypes.VARIANT, *SPARSE_VARIANTS) and variant_fn(info, v) is not None]


def sparse_plan(info: Any, config: SweepConfig) -> list[str]:
    """The sparse variants the OpInfo has samples for (:data:`SPARSE_VARIANTS`)."""
    return [v for v in config.variants if v in SPARSE_VARIANTS and variant_fn(info, v) is not None]


def wants_backward(info: Any, config: SweepConfig, dtype: str) -> bool:
    if "backward" not in config.variants or dtype not in BACKWARD_DTYPES or not info.supports_autograd:
        return False
    return getattr(torch, dtype) in info.supported_backward_dtypes("cpu")


def run_group(target: Target, group: Group, config: SweepConfig, *, skip: Container[str] = NOTHING,
              on_start: Callable[[str], None] | None = None) -> Iterator[dict[str, Any]]:
    """Yield a row per item of ``group``; items whose key is in ``skip`` are not run.

    ``on_start(key)`` is called before each item executes, so a supervisor knows which item was
    in flight if the process dies. On a compiler target that can, each variant's samples are
    compiled a batch at a time (:mod:`conformance.check.batching`), unless ``skip`` says a batch of
    this group killed a worker (``Skip.batch``).
    """
    info = by_name()[group.op]
    want_samples, want_ladder = ladder.wanted(config.sizes, target.compiler)
    if (yield from dtypes.rows(target, info, group, config, skip, on_start, run=want_samples)):
        return  # a dtype the OpInfo does not claim on the CPU: its group holds the dtype probe alone
    if want_samples:
        yield from _sample_rows(target, info, group, config, skip, on_start)
        yield from reference.rows(info, group, config, lambda gen: _items(  # its own samples, as a sparse layout's
            target, info, group, reference.VARIANT, gen, config, skip, on_start), lambda exc: _generation_failed(
            group, reference.VARIANT, exc, config, skip))
    # the ladder's items are function-variant calls; an empty*'s values mean nothing
    if want_ladder and "function" in config.variants and comparators.comparator_for(group.op) != "meta":
        yield from _ladder_rows(target, info, group, config, skip, on_start)


def _ladder_rows(target: Target, info: Any, group: Group, config: SweepConfig, skip: Container[str],
                 on_start: Callable[[str], None] | None) -> Iterator[dict[str, Any]]:
    """The size ladder's rows (:mod:`conformance.sweep.ladder`): values only, each rung decided as
    a function-variant sample of that size."""
    values_only = replace(config, contracts=("none",))

    def evaluate_rung(numel: int, sample: Any) -> dict[str, Any]:
        try:
            return _evaluate(target, info, group.op, "function", group.dtype, numel, sample, values_only, None)[0]
        except Exception as exc:  # noqa: BLE001 - the harness failed on this item
            return harness_error(group, "function", numel, exc, config)

    try:
        gen = enumerate(samples(info, getattr(torch, group.dtype), seed=config.seed))
        yield from ladder.walk(info, group, gen, config.seed, evaluate_rung, skip, on_start)
    except Exception as exc:  # noqa: BLE001 - the sample generator itself failed
        yield from _generation_failed(group, ladder.VARIANT, exc, config, skip)


def _sample_rows(target: Target, info: Any, group: Group, config: SweepConfig, skip: Container[str],
                 on_start: Callable[[str], None] | None) -> Iterator[dict[str, Any]]:
    """The rows of the OpInfo's own samples: each planned variant, backward, the sparse layouts."""
    dtype = getattr(torch, group.dtype)
    variants = plan(info, config)
    batching = _batching(target, group, config, skip)
    budget = contracts.Budget(config.contract_budget)
    try:
        gen = _taken(samples(info, dtype, thorough=config.thorough, seed=config.seed), config.max_samples, batching)
        batches = None
        if batching:
            wanted = contracts.parse_contracts(config.contracts, target)
            repeat = range(contracts.DETERMINISM_SAMPLES) if "determinism" in wanted else ()
            batches = OpBatches(target, info, {v: {i: s for i, s in gen.ready if str(group.item(v, i)) not in skip}
                                               for v in variants}, size=batch_size(target, config), repeat=repeat)
        for index, sample in gen:
            peer = None  # the function variant's results, for the other variants' "variants" contract
            for variant in variants:
                key = str(group.item(variant, index))
                if key in skip:
                    continue
                if on_start:
                    on_start(key)
                try:
                    row, out = _evaluate(target, info, group.op, variant, group.dtype, index, sample, config, peer,
                                         batches, budget)
                except Exception as exc:  # noqa: BLE001 - the harness failed on this item, not the sample generator
                    yield harness_error(group, variant, index, exc, config)
                    continue
                if variant == "function" and out.cpu_error is None and out.target_error is None:
                    peer = {"cpu": out.cpu, "target": out.target, "arbiter": out.arbiter_result}
                yield row
        if wants_backward(info, config, group.dtype):
            gen = _taken(samples(info, dtype, thorough=config.thorough, seed=config.seed, requires_grad=True),
                         config.max_samples, batching)
            if batches is not None:
                batches.samples["backward"] = {i: s for i, s in gen.ready if str(group.item("backward", i)) not in skip}
            yield from _items(target, info, group, "backward", gen, config, skip, on_start, batches)
    except Exception as exc:  # noqa: BLE001 - the sample generator itself failed
        yield from _generation_failed(group, "function", exc, config, skip)
    for layout in sparse_plan(info, config):  # never batched: a compiled batch holds strided samples
        try:
            gen = _taken(samples(info, dtype, seed=config.seed, layout=layout), config.max_samples, False)
            yield from _items(target, info, group, layout, gen, config, skip, on_start)
        except Exception as exc:  # noqa: BLE001
            yield from _generation_failed(group, layout, exc, config, skip)


def _items(target: Target, info: Any, group: Group, variant: str, gen: Iterator[tuple[int, Any]],
           config: SweepConfig, skip: Container[str], on_start: Callable[[str], None] | None,
           batches: OpBatches | None = None) -> Iterator[dict[str, Any]]:
    """The rows of one variant with samples of its own (backward, a sparse layout)."""
    for index, sample in gen:
        key = str(group.item(variant, index))
        if key in skip:
            continue
        if on_start:
            on_start(key)
        try:
            row = _evaluate(target, info, group.op, variant, group.dtype, index, sample, config, None, batches)[0]
        except Exception as exc:  # noqa: BLE001 - the harness failed on this item, not the sample generator
            row = harness_error(group, variant, index, exc, config)
        yield row


def _generation_failed(group: Group, variant: str, exc: Exception, config: SweepConfig,
                       skip: Container[str]) -> Iterator[dict[str, Any]]:
    """The row of a sample generator that failed (item -1 of the variant), unless skipped."""
    key = str(group.item(variant, -1))
    if key not in skip:
        yield {"item_key": key, "op": group.op, "variant": variant, "dtype": group.dtype, "sample": -1,
               "status": decide_unrun("cpu").value, "error": f"sample generation failed: {type(exc).__name__}: {exc}"[:2000],
               "duration_s": 0.0, "seed": config.seed}


def batch_size(target: Target, config: SweepConfig) -> int:
    """Samples per compiled graph: ``--compile-batch``, else the target's default (1: none)."""
    if not target.batchable:
        return 1
    return config.compile_batch if config.compile_batch is not None else target.default_batch


def _batching(target: Target, group: Group, config: SweepConfig, skip: Container[str]) -> bool:
    """Whether this group's samples are compiled in batches: a target that can batch, a batch
    size above 1, not after a batch of this group killed a worker, and not a random op (one RNG
    stream would run through every sample of a batch)."""
    return (batch_size(target, config) > 1 and getattr(skip, "batch", True)
            and comparators.comparator_for(group.op) != "random")


class _taken:
    """``(index, sample)`` of a sample generator up to ``limit``. ``ready``: when batching, every
    sample generated up front (a batch needs them all); a generator failure is raised after the
    samples before it, as a lazy walk would."""

    def __init__(self, gen: Iterator[Any], limit: int | None, eager: bool) -> None:
        self.gen, self.limit = gen, limit
        self.ready: list[tuple[int, Any]] = []
        self.failure: Exception | None = None
        if eager:
            try:
                for index, sample in enumerate(gen):
                    if limit is not None and index >= limit:
                        break
                    self.ready.append((index, sample))
            except Exception as exc:  # noqa: BLE001 - raised where the lazy walk would raise it
                self.failure = exc
            self.gen = None

    def __iter__(self) -> Iterator[tuple[int, Any]]:
        if self.gen is None:
            yield from self.ready
            if self.failure is not None:
                raise self.failure
            return
        for index, sample in enumerate(self.gen):
            if self.limit is not None and index >= self.limit:
                return
            yield index, sample


def _arbiter(out: Any, peer: dict[str, Any] | None) -> Any:
    """The float64 arbiter of an item: the function variant's on the same sample where this item's
    CPU result has the same tensors (in-place and out= compute the same values), else its own."""
    if peer is not None and peer.get("arbiter") is not None and _same_tensors(peer["cpu"], out.cpu):
        return peer["arbiter"]
    return out.arbiter() if out.arbiter is not None else None


def _same_tensors(a: Any, b: Any) -> bool:
    la, lb = leaves(a), leaves(b)
    return len(la) == len(lb) and all(
        isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.dtype == y.dtype and x.shape == y.shape
        and torch.equal(x, y) for x, y in zip(la, lb, strict=True))


def harness_error(group: Group, variant: str, index: int, exc: Exception, config: SweepConfig) -> dict[str, Any]:
    """The row of an item the harness itself failed on (an error of the infrastructure, named so)."""
    return {"item_key": str(group.item(variant, index)), "op": group.op, "variant": variant, "dtype": group.dtype,
            "sample": index, "status": decide_unrun("harness").value, "duration_s": 0.0, "seed": config.seed,
            "error": f"infra: the harness failed on this item: {type(exc).__name__}: {exc}"[:2000]}


class OpInfoSweep:
    """The work kind: one group per (OpInfo, dtype) of the selection's OpInfo globs (all OpInfos
    unless only ``aten::`` globs were given) and dtypes; one of a dtype the OpInfo does not claim on
    the CPU holds only the dtype probe (:mod:`conformance.sweep.dtypes`), when that is asked for."""

    name = "opinfo"
    table = "op_results"
    variants = (*VARIANTS, ladder.VARIANT, "canary")
    crash_safe_factor, timeout_factor = 0, 1  # no crash-safe mode (a death is the item's or the reference's); one limit

    def groups(self, selection: Selection) -> list[Group]:
        # aten:: and custom-op (neuron::*) globs alone select no OpInfo (not, as no glob would, every one)
        if not selection.opinfo or ((selection.aten_globs or selection.custom_globs) and not selection.info_globs):
            return []
        infos, wanted = by_name(), parse_dtypes(selection.dtypes)
        probe = not selection.variants or dtypes.VARIANT in selection.variants
        return [Group(name, d) for name in select_ops(selection.info_globs) for d in wanted
                if probe or not dtypes.probe_only(infos[name], d)]

    def run(self, target: Target, group: Group, config: SweepConfig, *, skip: Container[str] = NOTHING,
            on_start: Callable[[str], None] | None = None) -> Iterator[dict[str, Any]]:
        return run_group(target, group, config, skip=skip, on_start=on_start)

    def synthetic_row(self, key: ItemKey) -> dict[str, Any]:
        return {"op": key.name, "variant": key.variant, "dtype": key.dtype, "sample": int(key.sample)}


OPINFO = OpInfoSweep()
