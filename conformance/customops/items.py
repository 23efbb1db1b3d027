"""The items of one custom op x dtype, each executed, compared and decided into one result row.

Variants (an item per sample of each):

- ``opcheck``: ``torch.library.opcheck``'s four tests on the device (:mod:`.opcheck`), stored as the
  row's contract checks (``contracts``, ``contract_failed``) under their own names. An op with a
  declared reference passes as ``pass``; one without is ``structural`` ("checked structurally
  only"), never a pass of its values. A failed test makes the item ``contract``.
- ``custom_fwd``: the op's result on the device against its reference on the CPU in the same dtype.
- ``custom_bwd``: the gradients of the sample's ``wrt`` inputs, the same seeded cotangents on both
  sides, the device's autograd (the op's registered formula) against the reference's.
- ``custom_compile``: the op compiled with the target's ``torch.compile`` backend (one full graph,
  which must call the op: else it ran eager and the item is an ``error``), forward and, where
  the sample differentiates, backward through the compiled graph, against the reference.

Values are held to the ledger's tolerance for the target and dtype (as every op item), with the
float64 arbiter: the reference computed on float64 copies forgives a target closer to the exact
value than the CPU is. Only ops with a reference have value items.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Container, Iterator
from types import SimpleNamespace
from typing import Any

import torch

from conformance.check.compare import Meta, arbitrate, compare, leaves
from conformance.check.contracts import Check
from conformance.check.execute import err, phase, proof, signature
from conformance.check.fingerprint import fingerprint
from conformance.check.placement import to_cpu
from conformance.check.verdict import Status, decide, decide_opcheck, decide_unrun
from conformance.targets.base import OpTrace
from conformance.work import ItemKey

from .discovery import device_key, resolve
from .generated import SAMPLES, on_device, schema_samples
from .opcheck import CHECKS, run_checks
from .references import Reference, Sample, reference_for
from .variants import BWD, COMPILE, FWD, OPCHECK

STRUCTURAL_ONLY = "no reference declared for this op: checked structurally only (opcheck), its values are not checked"
Row = dict[str, Any]


def op_rows(target: Any, name: str, dtype: str, config: Any, skip: Container[str],
            on_start: Callable[[str], None] | None) -> Iterator[Row]:
    """Every item of the custom op ``name`` (an overload name) in ``dtype`` not in ``skip``."""
    dt = getattr(torch, dtype)
    ref = reference_for(name)
    unmade = str(ItemKey(name, OPCHECK, dtype, -1))  # the row of an op whose samples could not be made
    announced = None
    if ref is None:
        # generating inputs from the schema runs the op on the device: a crash there is charged
        # to the first item not yet recorded (so each restart after one moves on, and it ends)
        pending = [k for k in (*(str(ItemKey(name, OPCHECK, dtype, i)) for i in range(SAMPLES)), unmade)
                   if k not in skip]
        if not pending:
            return
        announced = pending[0]
        if on_start is not None:
            on_start(announced)
    try:
        op = resolve(name)
        if ref is not None:
            samples, why = ref.samples(dt, config.seed), ""
        else:
            phase("target")
            samples, why = schema_samples(target, op, dt)
    except Exception as exc:  # noqa: BLE001 - no samples: one row says why
        if unmade not in skip:
            yield {**_base(unmade, config), "status": decide_unrun("harness").value,
                   "error": f"infra: the op's samples could not be made: {err(exc)}"}
        return
    if not samples:
        if unmade not in skip:
            yield {**_base(unmade, config), "status": decide_unrun("cpu").value,
                   "error": f"no valid input: none of the calls generated from the op's schema ran on the device ({why})"}
        return
    plan = [(OPCHECK, i) for i in range(len(samples))]
    if ref is not None:
        plan += [(FWD, i) for i in range(len(samples))]
        plan += [(BWD, i) for i, s in enumerate(samples) if s.wrt]
        plan += [(COMPILE, i) for i in range(len(samples))]
    for variant, index in plan:
        key = str(ItemKey(name, variant, dtype, index))
        if key in skip:
            continue
        if on_start is not None and key != announced:
            on_start(key)
        announced = None
        start = time.perf_counter()
        try:
            row = ITEMS[variant](target, op, ref, samples[index], key, config)
        except Exception as exc:  # noqa: BLE001 - the harness failed on this item
            row = {**_base(key, config), "status": decide_unrun("harness").value,
                   "error": f"infra: the harness failed on this item: {err(exc)}"}
        row.setdefault("duration_s", time.perf_counter() - start)
        yield row


def item_row(target: Any, key: str, config: Any) -> Row:
    """The one item ``key`` (``neuron::rms_norm.default|custom_fwd|float32|0``) run again as
    :func:`op_rows` runs it: its sample regenerated the same way (the reference's seeded
    generator, else the derandomized walk of the op's schema on the target), the same check, the
    same decision. What a repro script calls. ValueError: an item that cannot be made again."""
    k = ItemKey.parse(key)
    if k.variant not in ITEMS:
        raise ValueError(f"item {key}: {k.variant!r} is not a custom-op variant ({', '.join(ITEMS)})")
    index = int(k.sample)
    if index < 0:
        raise ValueError(f"item {key}: sample {index} is the row saying why the op's items could not be made, "
                         "not an item")
    op, ref, dt = resolve(k.name), reference_for(k.name), getattr(torch, k.dtype)
    if ref is None and k.variant != OPCHECK:
        raise ValueError(f"item {key}: no reference is declared for {k.name} any more, so it has no {k.variant} item")
    samples = ref.samples(dt, config.seed) if ref is not None else schema_samples(target, op, dt)[0]
    if index >= len(samples):
        raise ValueError(f"item {key}: sample {index} no longer exists (the op has {len(samples)} now)")
    start = time.perf_counter()
    row = ITEMS[k.variant](target, op, ref, samples[index], key, config)
    row.setdefault("duration_s", time.perf_counter() - start)
    return row


def _base(key: str, config: Any) -> Row:
    k = ItemKey.parse(key)
    return {"item_key": key, "op": k.name, "variant": k.variant, "dtype": k.dtype, "sample": k.sample,
            "seed": config.seed, "duration_s": 0.0}


def _signature(sample: Sample) -> str:
    args = sample.args
    return signature(SimpleNamespace(input=args[0] if args else None, args=args[1:], kwargs=sample.kwargs))


def _placed(sample: Sample, target: Any, every_float: bool = False) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Fresh device copies of the sample's arguments, its ``wrt`` inputs (every floating one when
    ``every_float``) leaves that require grad."""
    args = []
    for i, a in enumerate(sample.args):
        a = on_device(a, target)
        if isinstance(a, torch.Tensor):
            a = a.detach()
            if (i in sample.wrt or every_float) and a.is_floating_point():
                a.requires_grad_()
        args.append(a)
    return tuple(args), {k: on_device(v, target) for k, v in sample.kwargs.items()}


def _cpu(sample: Sample, cast: torch.dtype | None = None, grad: bool = False) -> tuple[list[Any], dict[str, Any]]:
    """CPU copies of the sample's arguments (floating ones cast to ``cast``), its ``wrt`` inputs
    leaves that require grad when ``grad``."""
    def one(i: int | None, a: Any) -> Any:
        if not isinstance(a, torch.Tensor):
            return a
        t = a.detach().to(cast if cast is not None and a.is_floating_point() else a.dtype, copy=True)
        return t.requires_grad_() if grad and i in sample.wrt and t.is_floating_point() else t

    return [one(i, a) for i, a in enumerate(sample.args)], {k: one(None, v) for k, v in sample.kwargs.items()}


def _detached(value: Any) -> Any:
    return [x.detach() if isinstance(x, torch.Tensor) else x for x in leaves(value)]


def _grads(fn: Callable[..., Any], args: Any, kwargs: dict[str, Any], wrt: tuple[int, ...], seed: int, index: int,
           cots: list[torch.Tensor] | None = None) -> tuple[list[Any], list[Any], list[torch.Tensor]]:
    """``fn``'s outputs, the gradients of ``args[wrt]`` and the cotangents (seeded from ``seed`` and
    the item's ``index`` unless given: both sides of an item use the same)."""
    out = fn(*args, **kwargs)
    outs = [o for o in leaves(out) if isinstance(o, torch.Tensor) and o.requires_grad]
    if not outs:
        raise RuntimeError("no output requires grad: the op has no autograd formula for these inputs")
    if cots is None:
        gen = torch.Generator().manual_seed((seed * 7919 + index) % 2**63)
        cots = [torch.randn(o.shape, generator=gen, dtype=torch.float32).to(o.dtype) for o in outs]
    grads = torch.autograd.grad(outs, [args[i] for i in wrt],
                                [c.to(o.device, o.dtype) for c, o in zip(cots, outs, strict=True)], allow_unused=True)
    return _detached(out), [None if g is None else g.detach() for g in grads], cots


def _judge(row: Row, cpu: Any, got: Any, arbiter: Callable[[], Any], tol: Any,
           device_meta: list[Meta] | None = None) -> tuple[bool, str | None]:
    """Compare ``got`` (on the CPU) with the reference ``cpu``, the float64 arbiter deciding a
    failure; the evidence into ``row``. Returns (close, why not)."""
    ev = compare(cpu, got, atol=tol.atol, rtol=tol.rtol, device_meta=device_meta)
    arb = None
    if not ev.close and ev.dtype_ok and ev.shape_ok:
        arb = arbiter()
        if arb is not None:
            ev = arbitrate(ev, cpu, got, arb, atol=tol.atol)
    if ev.dtype_ok and ev.shape_ok:
        against_cpu = arb is None or ev.close
        row["fingerprint"] = fingerprint(got, cpu if against_cpu else arb, ref_kind="cpu" if against_cpu else "float64")
    row.update(ev.row())
    return ev.close, None if ev.close else ev.detail


def _reference(ref: Reference, sample: Sample, cast: torch.dtype | None = None, *, seed: int = 0,
               index: int = 0, cots: list[torch.Tensor] | None = None) -> tuple[list[Any], list[Any], list[Any]]:
    """The reference's (outputs, gradients of ``wrt``, cotangents) on CPU copies of the sample
    (cast to ``cast``: the float64 arbiter); no gradients when the sample differentiates nothing."""
    args, kwargs = _cpu(sample, cast, grad=bool(sample.wrt))
    if not sample.wrt:
        return _detached(ref.fn(*args, **kwargs)), [], []
    return _grads(ref.fn, args, kwargs, sample.wrt, seed, index,
                  None if cots is None else [c.to(cast) if cast is not None else c for c in cots])


def _arbiter(ref: Reference, sample: Sample, part: int, **kw: Any) -> Any:
    """Part ``part`` (0: outputs, 1: gradients) of the reference on float64 copies (None: it cannot)."""
    try:
        return _reference(ref, sample, torch.float64, **kw)[part]
    except Exception:  # noqa: BLE001 - the reference cannot take float64
        return None


def _row(target: Any, sample: Sample, key: str, config: Any, proof_: dict[str, Any]) -> tuple[Row, Any]:
    k = ItemKey.parse(key)
    tol = config.ledger.tolerance(k.name, k.variant, k.dtype, target.name)
    return {**_base(key, config), "atol": tol.atol, "rtol": tol.rtol, "tol_source": tol.source,
            "comparator": "allclose", "signature": _signature(sample), "proof": proof_}, tol


def _decided(row: Row, target: Any, config: Any, *, cpu_error: str | None = None, target_error: str | None = None,
             close: bool = False, why: str | None = None, trace: OpTrace | None = None,
             graphs: int | None = None) -> Row:
    xfail = config.ledger.expected_failure(row["op"], row["variant"], row["dtype"], target.name)
    fallback = sorted(trace.fallback) if trace is not None else []
    row.update(native_ops=sorted(trace.native) if trace is not None else [], fallback_ops=fallback,
               reached_ops=sorted(trace.reached) if trace is not None else [])
    status = decide(cpu_error=cpu_error, target_error=target_error, close=close, fallback=fallback,
                    expected_failure=xfail.statuses if xfail else None, graphs=graphs)
    row["status"] = status.value
    row["error"] = f"CPU reference failed: {cpu_error}" if cpu_error else target_error or why
    if status in (Status.XFAIL, Status.XPASS) and xfail is not None:
        row["error"] = f"{row['error'] or 'passed'} [expected failure: {xfail.where}: {xfail.reason}]"
    return row


def _forward(target: Any, op: Any, ref: Reference, sample: Sample, key: str, config: Any) -> Row:
    row, tol = _row(target, sample, key, config, {"reference": ref.source})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        phase("cpu")
        try:
            args, kwargs = _cpu(sample)
            cpu = _detached(ref.fn(*args, **kwargs))
        except Exception as exc:  # noqa: BLE001 - no reference for this sample: skipped
            return _decided(row, target, config, cpu_error=err(exc))
        phase("target")
        trace = None
        try:
            args, kwargs = _placed(sample, target)
            with target.trace() as trace:
                t0 = time.perf_counter()
                out = op(*args, **kwargs)
                target.synchronize()
                row["duration_s"] = time.perf_counter() - t0
            row["proof"].update(proof(target, out))
            meta = [Meta.of(x) for x in leaves(out) if isinstance(x, torch.Tensor)]
            got = _detached(to_cpu(out))
        except Exception as exc:  # noqa: BLE001 - the target's failure is the finding
            return _decided(row, target, config, target_error=err(exc), trace=trace)
    close, why = _judge(row, cpu, got, lambda: _arbiter(ref, sample, 0), tol, meta)
    return _decided(row, target, config, close=close, why=why, trace=trace)


def _backward(target: Any, op: Any, ref: Reference, sample: Sample, key: str, config: Any) -> Row:
    row, tol = _row(target, sample, key, config, {"reference": ref.source, "wrt": list(sample.wrt)})
    index = int(ItemKey.parse(key).sample)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        phase("cpu")
        try:
            _, cpu, cots = _reference(ref, sample, seed=config.seed, index=index)
        except Exception as exc:  # noqa: BLE001
            return _decided(row, target, config, cpu_error=err(exc))
        phase("target")
        trace = None
        try:
            args, kwargs = _placed(sample, target)
            with target.trace() as trace:
                t0 = time.perf_counter()
                _, grads, _ = _grads(op, args, kwargs, sample.wrt, config.seed, index, cots)
                target.synchronize()
                row["duration_s"] = time.perf_counter() - t0
            row["proof"].update(proof(target, grads))
            got = to_cpu(grads)
        except Exception as exc:  # noqa: BLE001
            return _decided(row, target, config, target_error=err(exc), trace=trace)
    close, why = _judge(row, cpu, got, lambda: _arbiter(ref, sample, 1, cots=cots), tol)
    return _decided(row, target, config, close=close, why=f"gradients: {why}" if why else None, trace=trace)


def _counting(backend: Any, stats: dict[str, Any]) -> Callable[..., Any]:
    """The target's compile backend, counting the graphs it is handed and the ops they call."""
    compiler = torch._dynamo.lookup_backend(backend) if isinstance(backend, str) else backend

    def counted(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        stats["graphs"] += 1
        stats["ops"].update(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return compiler(gm, example_inputs)

    counted.__name__ = getattr(compiler, "__name__", "backend") if not isinstance(backend, str) else backend
    return counted


def _compile_error(exc: BaseException) -> str:
    """The error of a compiled call, with its cause where the first line only says who raised
    (dynamo's ``BackendCompilerFailed: backend='neuron' raised:``)."""
    text = err(exc)
    cause = getattr(exc, "inner_exception", None) or exc.__cause__
    return f"{text} {err(cause)}"[:2000] if cause is not None and text.rstrip().endswith(":") else text


def _compiled(target: Any, op: Any, ref: Reference, sample: Sample, key: str, config: Any) -> Row:
    backend = target.compile_backend()
    name = backend if isinstance(backend, str) else getattr(backend, "__name__", type(backend).__name__)
    row, tol = _row(target, sample, key, config, {"reference": ref.source, "backend": name})
    index = int(ItemKey.parse(key).sample)
    stats: dict[str, Any] = {"graphs": 0, "ops": set()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        phase("cpu")
        try:
            cpu_out, cpu_grads, cots = _reference(ref, sample, seed=config.seed, index=index)
        except Exception as exc:  # noqa: BLE001
            return _decided(row, target, config, cpu_error=err(exc))
        phase("target")
        try:
            torch._dynamo.reset()  # a fresh cache: no earlier item's graphs, no recompile limit reached
            fn = torch.compile(lambda *a, **k: op(*a, **k), backend=_counting(backend, stats), fullgraph=True,
                               dynamic=False)
            args, kwargs = _placed(sample, target)
            t0 = time.perf_counter()
            if sample.wrt:
                out, grads, _ = _grads(fn, args, kwargs, sample.wrt, config.seed, index, cots)
            else:
                out, grads = _detached(fn(*args, **kwargs)), []
            target.synchronize()
            row["duration_s"] = time.perf_counter() - t0
            got_out, got_grads = to_cpu(out), to_cpu(grads)
        except Exception as exc:  # noqa: BLE001
            row["proof"].update(graphs=stats["graphs"], graph_ops=sorted(stats["ops"]))
            return _decided(row, target, config, target_error=_compile_error(exc), graphs=stats["graphs"] or None)
    row["proof"].update(graphs=stats["graphs"], graph_ops=sorted(stats["ops"]),
                        device=sorted({str(x.device) for x in out if isinstance(x, torch.Tensor)}))
    called = op.name().replace("::", ".")  # how an FX node's target prints the op: neuron.rms_norm.default
    if stats["graphs"] and not any(o.startswith(called) for o in stats["ops"]):
        return _decided(row, target, config, graphs=stats["graphs"],
                        target_error=f"infra: the compiled graph does not call {op.name()} (it calls "
                                     f"{', '.join(sorted(stats['ops'])) or 'nothing'}): the op ran outside it")
    close, why = _judge(row, cpu_out, got_out, lambda: _arbiter(ref, sample, 0), tol)
    if not close:
        why = f"compiled forward: {why}"
    elif sample.wrt:
        close, why = _judge(row, cpu_grads, got_grads, lambda: _arbiter(ref, sample, 1, cots=cots), tol)
        why = f"compiled backward: gradients: {why}" if why else None
    return _decided(row, target, config, close=close, why=why, graphs=stats["graphs"])


def _opcheck(target: Any, op: Any, ref: Reference | None, sample: Sample, key: str, config: Any) -> Row:
    proof_ = {"reference": ref.source} if ref is not None else {"structural_only": STRUCTURAL_ONLY}
    row, tol = _row(target, sample, key, config, proof_)
    row["comparator"] = None
    phase("target")
    t0 = time.perf_counter()
    checks: dict[str, Check] = run_checks(op, lambda every: _placed(sample, target, every), device_key(target.device),
                                          tol.atol, tol.rtol)
    row["duration_s"] = time.perf_counter() - t0
    failed = [name for name in CHECKS if checks[name].outcome == "fail"]
    row["contracts"] = {name: c.as_json() for name, c in checks.items()}
    row["contract_failed"] = ",".join(failed) or None
    xfail = config.ledger.expected_failure(row["op"], row["variant"], row["dtype"], target.name)
    status = decide_opcheck(failed, has_reference=ref is not None, expected_failure=xfail.statuses if xfail else None)
    row["status"] = status.value
    row["error"] = ("; ".join(f"opcheck {name}: {checks[name].detail}" for name in failed) or
                    (STRUCTURAL_ONLY if status is Status.STRUCTURAL else None))
    if status in (Status.XFAIL, Status.XPASS) and xfail is not None:
        row["error"] = f"{row['error'] or 'passed'} [expected failure: {xfail.where}: {xfail.reason}]"
    return row


ITEMS: dict[str, Callable[..., Row]] = {OPCHECK: _opcheck, FWD: _forward, BWD: _backward, COMPILE: _compiled}
