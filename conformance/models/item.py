"""One model item, eager or compile: run it on the target and the CPU, compare, decide, localize.

:func:`prepare` looks up, builds and traces a graph once per group (:class:`Prepared`);
:func:`run_item` runs one mode of it (:mod:`conformance.models.training` on both sides, the
closeness of :mod:`conformance.models.evidence`, compile counts and latency from
:mod:`conformance.models.timing`) and builds its row, without keys; a failing item is localized
(:mod:`conformance.models.localize`) to its first divergent or raising op. A target that exports
the model (``exports``) gets an inference-only item instead.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from conformance.check.execute import phase
from conformance.check.fingerprint import fingerprint
from conformance.check.verdict import NOT_COMPILED, Status, decide
from conformance.targets.base import TargetError

from .evidence import forward_evidence, grad_evidence, loss_close, model_tolerance, run_to_run_noise
from .selection import resolve_spec
from .timing import TIMED_ITERS, WARMUP, CountingBackend, inference, percentile, shape_sweep, time_forward
from .training import TRAIN_STEPS, SideResult, cast, detach_cpu, train_side
from .zoo import LIBRARIES, ZooSkip


def error_text(exc: BaseException) -> str:
    """``Type: message`` of an exception, cut to a row's 2000 characters."""
    return f"{type(exc).__name__}: {exc}"[:2000]


@dataclass
class Prepared:
    spec: Any
    model: nn.Module  # float32, initial weights, never run
    inputs: tuple  # float32 canonical inputs
    graph_hash: str | None = None
    aten_ops: dict[str, int] | None = None
    trace_error: str | None = None  # a zoo architecture make_fx could not trace (no hash, no histogram)
    topology: str | None = None  # a zoo architecture's graph hash with its sizes blanked (tracing.topology_hash)


def prepare(model_id: str) -> Prepared:
    """Look up, build and trace a spec; raises with a message naming the failing stage."""
    from .tracing import hash_graph, histogram, topology_hash, trace

    try:
        spec = resolve_spec(model_id)
    except Exception as exc:  # noqa: BLE001
        raise RuntimeError(f"unknown model: {error_text(exc)}") from exc
    try:
        model = spec.build()
        inputs = spec.example_inputs()
    except ZooSkip:
        raise  # the library cannot give this architecture here: the lane stores a skip with its reason
    except Exception as exc:  # noqa: BLE001
        raise RuntimeError(f"model construction failed: {error_text(exc)}") from exc
    try:
        gm = trace(copy.deepcopy(model), inputs)
    except Exception as exc:  # noqa: BLE001
        if spec.family in LIBRARIES:
            # a library's architecture that make_fx cannot trace still runs the protocol (parity,
            # gradients, training, compile); only its structural hash and ATen histogram are missing
            return Prepared(spec, model, inputs, None, None, trace_error=f"make_fx trace failed: {error_text(exc)}")
        raise RuntimeError(f"export (make_fx trace) failed: {error_text(exc)}") from exc
    # a zoo architecture also gets its size-blind hash: width variants count as one distinct graph
    topology = topology_hash(gm) if spec.family in LIBRARIES else None
    return Prepared(spec, model, inputs, hash_graph(gm), histogram(gm), topology=topology)


def _localized(row: dict[str, Any], find: Callable[[], Any], none_found: str) -> None:
    """Store what ``find`` (a localization) names in ``row``: the op and its detail, ``none_found``
    when it names none, or why it failed."""
    try:
        div = find()
    except Exception as exc:  # noqa: BLE001
        row["first_divergent_detail"] = f"localization failed: {error_text(exc)}"[:2000]
        return
    if div is not None:
        row["first_divergent_op"] = div.op
        row["first_divergent_detail"] = div.detail
    else:
        row["first_divergent_detail"] = none_found


def run_item(target: Any, prep: Prepared, dtype_name: str, mode: str, config: Any, *,
             train_steps: int = TRAIN_STEPS, timed_iters: int = TIMED_ITERS,
             localize_failures: bool = True) -> dict[str, Any]:
    """Execute, compare and decide one model item (eager or compile); the row without keys."""
    spec = prep.spec
    dtype = getattr(torch, dtype_name)
    tol = model_tolerance(config, spec.model_id, dtype_name, target.name)
    xfail = config.ledger.expected_failure(spec.model_id, "model", dtype_name, target.name)
    seed = int(getattr(config, "seed", 0) or 0)
    if mode == "compile" and getattr(target, "exports", False):
        return _exported_item(target, prep, dtype, tol, xfail, seed)
    row: dict[str, Any] = {}

    inputs = cast(prep.inputs, dtype)
    phase("cpu")  # a worker killed meanwhile (a hang, a timeout) says nothing about the target
    cpu = _cpu_side(prep, dtype, inputs, train_steps, seed, getattr(config, "refcache", None))
    phase("target")
    # Target.
    counter: CountingBackend | None = None
    tgt = SideResult()
    tgt_model: nn.Module | None = None
    fn: Callable[..., Any] | None = None
    if cpu.error is None:
        try:
            tgt_model = copy.deepcopy(prep.model).to(dtype).to(target.device)
            tgt_inputs = target.to_device(inputs)
            if mode == "compile":
                torch._dynamo.reset()
                counter = CountingBackend(target.compile_backend())
                # PyTorch's default, automatic dynamic shapes, as a user compiles: the canonical
                # shape (training, then inference) is static; the shape sweep's first new shape
                # compiles once more with the changed sizes symbolic (timing.shape_sweep)
                fn = torch.compile(tgt_model, backend=counter, dynamic=None)
            elif target.compiler:  # run_model_group plans no such item
                raise TargetError(f"an eager model item on compiler target {target.name!r} would not "
                                  "run the compiler; its model items are compile items")
            else:
                fn = target.wrap(tgt_model)  # eager on the target
            tgt = train_side(spec, tgt_model, fn, tgt_inputs, target, train_steps, seed,
                             compiled=mode == "compile")
        except Exception as exc:  # noqa: BLE001
            tgt = SideResult(error=error_text(exc))
    row["native_ops"] = sorted(tgt.native or ())
    row["fallback_ops"] = sorted(tgt.fallback or ())

    close, problems = False, []
    if cpu.error is None and tgt.error is None:
        ev, fwd_err, fwd_detail = forward_evidence(cpu.out, tgt.out, tol)
        row["max_abs_err"], row["max_rel_err"] = ev.row()["max_abs_err"], ev.row()["max_rel_err"]
        # what fwd_rtol judges (normwise); the two above are element-wise evidence only
        row["fwd_rel_err"] = fwd_err if math.isfinite(fwd_err) else 1e308
        if fwd_detail:
            problems.append(f"forward: {fwd_detail}")
        g_close, g_err, g_detail = grad_evidence(cpu.grads or {}, tgt.grads or {}, tol)
        row["grad_max_rel_err"] = g_err if math.isfinite(g_err) else 1e308
        if not g_close:
            problems.append(f"backward: {g_detail}")
        l_close, l_detail = loss_close(cpu.losses or [], tgt.losses or [], tol)
        if not l_close:
            problems.append(f"training: {l_detail}")
        row["loss_curve"] = {"target": tgt.losses, "cpu": cpu.losses}
        row["noise"] = run_to_run_noise(tgt.out, tgt.again)
        # the first forward's output and the first step's gradients: the gradients hold most of
        # a small model's elements, and a paired test needs many
        row["fingerprint"] = fingerprint((tgt.out, tgt.grads or {}), (cpu.out, cpu.grads or {}),
                                         ref_kind="cpu")
        close = not fwd_detail and g_close and l_close
    status = decide(cpu_error=cpu.error, target_error=tgt.error, close=close,
                    fallback=sorted(tgt.fallback or ()), expected_failure=xfail.statuses if xfail else None)
    error = (f"CPU reference failed: {cpu.error}" if cpu.error else tgt.error) or \
        ("; ".join(problems) or None)
    if status in (Status.XFAIL, Status.XPASS) and xfail is not None:
        error = f"{error or 'passed'} [expected failure: {xfail.where}: {xfail.reason}]"
    if problems and cpu.error is None and tgt.error is None:
        error = f"{error} [tolerance from {tol.source}]"
    row["status"], row["error"] = status.value, error

    # Localize a numeric failure to its first divergent op.
    if localize_failures and problems and cpu.error is None and tgt.error is None:
        from .localize import localize

        backward = not any(p.startswith("forward") for p in problems)
        _localized(row, lambda: localize(prep.model, prep.inputs, target, dtype, tol=tol.fwd_rtol,
                                         backward=backward, seed=seed),
                   "no op of the eager ATen graph diverges beyond tolerance, locally or along the "
                   "device's chain"
                   + ("; if the eager item passes, compilation introduces the divergence" if mode == "compile"
                      else "; the error builds up in the training loss/steps rather than in one op"))
    # Localize an error the target raised to the op that raised it (a graph traced on the CPU
    # holds the CPU's decompositions, not the kernels the device is handed: the model runs again).
    elif localize_failures and cpu.error is None and tgt.error is not None:
        from .localize import raising_op

        _localized(row, lambda: raising_op(prep.model, prep.inputs, target, dtype, loss=spec.loss, seed=seed),
                   "no ATen op raises when the model runs eager on the target"
                   + ("; compiling it (torch.compile with the target's backend) raises" if mode == "compile"
                      else "; the error is raised outside the ops (placement, synchronization or the loss)"))

    # Performance: compile counts, shape sweep and latency.
    if tgt.error is None and fn is not None and cpu.error is None:
        try:
            assert tgt_model is not None
            with inference(tgt_model):
                if mode == "compile":
                    assert counter is not None
                    row.update(shape_sweep(spec, fn, dtype, target, counter, tgt.first_s, timed_iters))
                    failed = [s for s in row["shapes"] if "error" in s]
                    if failed:
                        before = row["error"] + "; " if row["error"] else ""
                        row["error"] = (f"{before}shape sweep failed at {len(failed)} of {len(row['shapes'])} "
                                        f"shapes (first {failed[0]['shape']}: {failed[0]['error']})")[:2000]
                elif timed_iters:
                    times = time_forward(fn, target.to_device(inputs), target, WARMUP + timed_iters)[WARMUP:]
                    row["p50_ms"], row["p99_ms"] = percentile(times, 0.5), percentile(times, 0.99)
        except Exception as exc:  # noqa: BLE001
            before = row["error"] + "; " if row["error"] else ""
            row["error"] = f"{before}latency sweep failed: {error_text(exc)}"[:2000]
    return row


def _cpu_side(prep: Prepared, dtype: torch.dtype, inputs: tuple, train_steps: int, seed: int,
              refcache: str | None) -> SideResult:
    """The CPU reference of a model item: the same for its eager and compile items and for every
    build, so taken from the reference cache (:mod:`conformance.check.refcache`) where it holds it
    for this graph (its traced ATen graph's hash), weights, inputs, dtype, steps and seed."""
    from conformance.check.refcache import content_digest, open_cache

    def compute() -> SideResult:
        cpu_model = copy.deepcopy(prep.model).to(dtype)
        try:
            return train_side(prep.spec, cpu_model, cpu_model, inputs, None, train_steps, seed)
        except Exception as exc:  # noqa: BLE001
            return SideResult(error=error_text(exc))

    refs = open_cache(refcache)
    if refs is None or prep.graph_hash is None:
        return compute()
    hint = f"model|{prep.spec.model_id}|{dtype}|{train_steps}|{seed}"

    def digest() -> str:
        return content_digest((prep.graph_hash, getattr(prep.spec, "loss", None), str(dtype), train_steps, seed,
                               dict(prep.model.state_dict()), inputs))

    fields = ("out", "grads", "losses", "first_s", "error")
    return refs.through(hint, digest, compute, (lambda side: {f: getattr(side, f) for f in fields},
                                                lambda stored: SideResult(**stored)))


def _exported_item(target: Any, prep: Prepared, dtype: torch.dtype, tol: Any, xfail: Any,
                   seed: int) -> dict[str, Any]:
    """A model item on a target that exports the model and runs it elsewhere (``exports``:
    onnxruntime, inference only): the forward in eval mode, without gradients, against the CPU's;
    nothing is trained. An export the target refuses is ``unsupported`` with its reason."""
    inputs = cast(prep.inputs, dtype)
    phase("cpu")
    cpu_out = tgt_out = None
    cpu_error = tgt_error = None
    try:
        with inference(cpu_model := copy.deepcopy(prep.model).to(dtype)):
            torch.manual_seed(seed)
            cpu_out = detach_cpu(cpu_model(*inputs))
    except Exception as exc:  # noqa: BLE001
        cpu_error = error_text(exc)
    record = None
    phase("target")
    if cpu_error is None:
        try:
            tgt_model = copy.deepcopy(prep.model).to(dtype)
            fn = target.wrap(tgt_model)
            with inference(tgt_model):
                torch.manual_seed(seed)
                t0 = time.perf_counter()
                tgt_out = detach_cpu(fn(*target.to_device(inputs)))
                first_s = time.perf_counter() - t0
        except Exception as exc:  # noqa: BLE001
            tgt_error = error_text(exc)
        record = target.compiled()
    row: dict[str, Any] = {"native_ops": [], "fallback_ops": []}
    close, detail = False, ""
    if cpu_error is None and tgt_error is None:
        ev, fwd_err, detail = forward_evidence(cpu_out, tgt_out, tol)
        row["max_abs_err"], row["max_rel_err"] = ev.row()["max_abs_err"], ev.row()["max_rel_err"]
        row["fwd_rel_err"] = fwd_err if math.isfinite(fwd_err) else 1e308
        row["fingerprint"] = fingerprint(tgt_out, cpu_out, ref_kind="cpu")
        row["compile_s"] = first_s
        close = not detail
    status = decide(cpu_error=cpu_error, target_error=tgt_error, close=close,
                    expected_failure=xfail.statuses if xfail else None,
                    graphs=record.graphs if record is not None and tgt_error is None else None)
    error = (f"CPU reference failed: {cpu_error}" if cpu_error else tgt_error) or (
        f"forward: {detail} [tolerance from {tol.source}]" if detail else None)
    if status is Status.ERROR and error is None:
        error = f"{NOT_COMPILED} (no model was run by {target.name!r})"
    if status in (Status.XFAIL, Status.XPASS) and xfail is not None:
        error = f"{error or 'passed'} [expected failure: {xfail.where}: {xfail.reason}]"
    row["status"], row["error"] = status.value, error
    return row
