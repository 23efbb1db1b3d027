"""Model-graph items of a run: parity, gradients, a short training run and compile behaviour.

A *group* is one graph x dtype (``Group(op=model_id, dtype, kind="model")``); it has two items,
``{model_id}|eager|{dtype}|0`` and ``{model_id}|compile|{dtype}|0``. Per item, on the target
against eager CPU from identical weights and data:

* the ATen op histogram and structural hash of the forward graph (``make_fx``, fake mode) and the
  overloads that ran natively or fell back on the device (``target.trace()`` of the real run);
* forward parity (``compare`` + ``decide``, the op sweep's evidence and verdict rules) at a
  model-level tolerance (:func:`model_tolerance`);
* backward: every parameter's gradient (``grad_max_rel_err``);
* a ``TRAIN_STEPS``-step SGD run on both sides; both loss curves are stored and compared
  (the first step's forward/backward *is* the parity run);
* ``compile`` items run the same protocol through ``torch.compile(backend=<target's>,
  dynamic=False)`` wrapped in a counting backend (device-generic), then sweep the spec's shape
  variants in inference (``eval()``, ``no_grad``, as ``conformance audit`` does) recording
  recompiles and p50/p99 forward latency after warm-up;
* a failing item is localized (:mod:`conformance.models.localize`) to its first divergent op.

A spec that cannot be looked up, built or traced yields ``error`` rows for its items; nothing
raises out of :func:`run_model_group`. :data:`MODEL` is this work kind; which graphs a run
selects is :mod:`conformance.models.selection`.

Example::

    >>> from conformance.models.runner import run_model_group
    >>> from conformance.models.selection import model_groups
    >>> from conformance.sweep import SweepConfig
    >>> from conformance.targets import get_target
    >>> g = model_groups(["mlp"], ["float32"], limit=1)[0]
    >>> g.key
    'mlp.d1w16.relu.none.bias|float32'
    >>> [r["status"] for r in run_model_group(get_target("cpu"), g, SweepConfig(), modes=("eager",))]
    ['pass']
"""

from __future__ import annotations

import contextlib
import copy
import math
import time
import traceback
from collections.abc import Callable, Container, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_map

from conformance import datafiles
from conformance.check.compare import Evidence, compare, leaves
from conformance.check.fingerprint import fingerprint
from conformance.check.verdict import NOT_COMPILED, Status, decide, decide_unrun
from conformance.structure import label, map_tensors, named_leaves
from conformance.targets.base import TargetError
from conformance.work import NOTHING, Group, ItemKey, Selection

from .localize import rel_l2
from .selection import model_groups, model_key, resolve_spec

MODES = ("eager", "compile")
TRAIN_STEPS = 3
LR = 0.01
WARMUP = 1
TIMED_ITERS = 5


# -- tolerances ----------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelTolerance:
    fwd_rtol: float  # ||t - c|| / ||c|| per float output tensor (and per node when localizing)
    grad_rtol: float  # per parameter, normwise, floored at 10 % of the largest gradient norm
    loss_rtol: float  # per SGD step, |l_t - l_c| / max(|l_c|, 1)
    atol: float  # the ledger's elementwise tolerance, for the evidence fields only
    rtol: float
    source: str


def model_tolerance(config: Any, model_id: str, dtype: str, target: str) -> ModelTolerance:
    """Ledger tolerance for (model_id, "model", dtype, target), widened to the model-level floor
    of ``data/model_tolerances.toml`` (see there for what each bound means)."""
    import fnmatch

    tol = config.ledger.tolerance(model_id, "model", dtype, target)
    floor = None
    for f in datafiles.model_floors():
        if fnmatch.fnmatchcase(target, f.target) and fnmatch.fnmatchcase(dtype, f.dtype):
            floor = f
    fwd = max(tol.rtol, floor.fwd_rtol if floor else 0.0)
    grad = max(tol.rtol, floor.grad_rtol if floor else 0.0)
    loss = max(tol.rtol, floor.loss_rtol if floor else 0.0)
    src = tol.source if floor is None or fwd == tol.rtol else \
        f"{datafiles.MODEL_TOLERANCES.name}: {floor.reason} (ledger: {tol.source})"
    return ModelTolerance(fwd, grad, loss, tol.atol, tol.rtol, src)


# -- helpers -------------------------------------------------------------------------------
def _cast(tree: Any, dtype: torch.dtype) -> Any:
    return tree_map(lambda x: x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x, tree)


def _to_cpu(tree: Any) -> Any:
    """Device tensors to the CPU (differentiable: gradients flow back to the device)."""
    return map_tensors(lambda x: x.to("cpu"), tree)


def _detach_cpu(tree: Any) -> Any:
    return map_tensors(lambda x: x.detach().to("cpu"), tree)


def _localized(row: dict[str, Any], find: Callable[[], Any], none_found: str) -> None:
    """Store what ``find`` (a localization) names in ``row``: the op and its detail, ``none_found``
    when it names none, or why it failed."""
    try:
        div = find()
    except Exception as exc:  # noqa: BLE001
        row["first_divergent_detail"] = f"localization failed: {_err(exc)}"[:2000]
        return
    if div is not None:
        row["first_divergent_op"] = div.op
        row["first_divergent_detail"] = div.detail
    else:
        row["first_divergent_detail"] = none_found


def _err(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:2000]


def percentile(xs: Sequence[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    k = (len(s) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def forward_evidence(cpu_out: Any, tgt_out: Any, tol: ModelTolerance) -> tuple[Evidence, float, str]:
    """(op-sweep evidence at the ledger tolerance, normwise error, failure detail or "").

    The evidence fields (max_abs_err, max_rel_err, shapes, dtypes) are the op sweep's; closeness
    is normwise (``rel_l2 <= fwd_rtol``) plus matching structure, shapes and dtypes.
    """
    c_l, t_l = named_leaves(cpu_out), named_leaves(tgt_out)  # ModelOutputs and caches walked
    ev = compare([x for _, x in c_l], [x for _, x in t_l], atol=tol.atol, rtol=tol.rtol)
    err = rel_l2(cpu_out, tgt_out)
    if [p for p, _ in c_l] != [p for p, _ in t_l]:
        return ev, err, (ev.detail or "output structure differs") + \
            f" (target leaves {[label(p) for p, _ in t_l][:6]}, CPU {[label(p) for p, _ in c_l][:6]})"
    if not (ev.shape_ok and ev.dtype_ok):
        return ev, err, ev.detail or "output structure differs"
    if not err <= tol.fwd_rtol:
        where = ""
        if len(c_l) > 1:  # name the worst leaf
            worst = max(zip(c_l, t_l, strict=True), key=lambda ct: rel_l2(ct[0][1], ct[1][1]))
            where = f"{label(worst[0][0])}: "
        return ev, err, (f"{where}||t - c|| / ||c|| = {err:.3g} > fwd_rtol={tol.fwd_rtol:g} "
                         f"(max abs err {ev.max_abs_err:.3g})")
    return ev, err, ""


def grad_evidence(cpu_grads: dict[str, torch.Tensor | None], tgt_grads: dict[str, torch.Tensor | None],
                  tol: ModelTolerance) -> tuple[bool, float, str]:
    """(close, worst per-parameter error, detail) over every parameter's gradient.

    A parameter's error is ``||g_t - g_c|| / max(||g_c||, 0.1 * largest ||g_c||)``: a bias that
    feeds a norm has ~0 gradient on both sides and must not dominate.
    """
    norms = {n: float(g.double().norm()) for n, g in cpu_grads.items() if g is not None}
    floor = 0.1 * max(norms.values(), default=0.0)
    worst, bad = 0.0, []
    for name, gc in cpu_grads.items():
        gt = tgt_grads.get(name)
        if gc is None and gt is None:
            continue
        if gc is None or gt is None or gc.shape != gt.shape:
            why = "missing" if gt is None else "unexpected" if gc is None else f"shape {list(gt.shape)} vs {list(gc.shape)}"
            bad.append(f"{name}: gradient {why} on target")
            worst = math.inf
            continue
        diff = (gt.double() - gc.double())
        num = float(diff.norm()) if bool(torch.isfinite(diff).all()) else math.inf
        den = max(norms[name], floor)
        e = num / den if den > 0 else (0.0 if num == 0 else math.inf)
        worst = max(worst, e)
        if not e <= tol.grad_rtol:
            bad.append(f"{name}: {e:.3g}")
    detail = "" if not bad else (f"gradients outside grad_rtol={tol.grad_rtol:g}: " + "; ".join(bad[:5])
                                 + (f" (+{len(bad) - 5} more)" if len(bad) > 5 else ""))
    return not bad, worst, detail


def loss_close(cpu: Sequence[float], tgt: Sequence[float], tol: ModelTolerance) -> tuple[bool, str]:
    if len(cpu) != len(tgt):
        return False, f"loss curve has {len(tgt)} steps on target vs {len(cpu)} on CPU"
    for i, (c, t) in enumerate(zip(cpu, tgt, strict=True)):
        if math.isnan(c) and math.isnan(t):
            continue
        if not (abs(t - c) <= tol.loss_rtol * max(abs(c), 1.0)):
            return False, f"loss curve diverges at step {i}: target {t:.6g} vs CPU {c:.6g} (loss_rtol={tol.loss_rtol:g})"
    return True, ""


# -- compile counting (device-generic) -----------------------------------------------------
class CountingBackend:
    """A ``torch.compile`` backend that counts graph compilations and delegates to ``inner``."""

    def __init__(self, inner: str | Callable[..., Any]):
        self.inner = torch._dynamo.lookup_backend(inner) if isinstance(inner, str) else inner
        self.compiles = 0
        self.seconds = 0.0

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Any, **kwargs: Any) -> Any:
        self.compiles += 1
        t0 = time.perf_counter()
        try:
            return self.inner(gm, example_inputs, **kwargs)
        finally:
            self.seconds += time.perf_counter() - t0


# -- one side of the protocol --------------------------------------------------------------
@dataclass
class SideResult:
    out: Any = None  # first forward output (CPU copy, detached)
    grads: dict[str, torch.Tensor | None] | None = None  # first step's gradients (CPU copies)
    losses: list[float] | None = None
    again: Any = None  # the first forward repeated on the same weights and inputs (target side)
    first_s: float = 0.0  # wall time of the first forward+backward
    native: set[str] | None = None
    fallback: set[str] | None = None
    error: str | None = None


def train_side(spec: Any, model: nn.Module, fn: Callable[..., Any], inputs: tuple, target: Any | None,
               steps: int, seed: int, *, compiled: bool = False) -> SideResult:
    """Forward + backward (+ SGD step) ``steps`` times on one side.

    On the target side the first forward is repeated once, eager, without gradients, on the same
    weights, inputs and random seed (buffers such as batch-norm statistics restored after it):
    the target's own run-to-run noise, against which the gate judges a model's error growth.

    The target's op trace covers one step: the first (eager), or the second for a compiled
    callable, run with ``set_stance("eager_on_recompile")`` so that frames a dispatch-tracing
    mode exposes are not compiled (cached graphs still run) and compile counts stay clean.
    """
    res = SideResult(losses=[])
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    trace_at = 1 if compiled else 0  # a single compiled step is not traced
    for step in range(steps):
        torch.manual_seed(seed + step)
        opt.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        if step == trace_at and target is not None:
            stance = torch.compiler.set_stance("eager_on_recompile") if compiled else contextlib.nullcontext()
            with stance, target.trace() as tr:
                out = fn(*inputs)
                loss = spec.loss(_to_cpu(out))
                loss.backward()
            target.synchronize()
            res.native, res.fallback = set(tr.native), set(tr.fallback)
        else:
            out = fn(*inputs)
            loss = spec.loss(_to_cpu(out))
            loss.backward()
            if target is not None:
                target.synchronize()
        if step == 0:
            res.first_s = time.perf_counter() - t0
            res.out = _detach_cpu(out)
            if target is not None:
                res.again = _repeat(model, inputs, seed)
            res.grads = {n: (p.grad.detach().to("cpu").clone() if p.grad is not None else None)
                         for n, p in model.named_parameters()}
        res.losses.append(float(loss.detach().float()))
        opt.step()
    return res


def _repeat(model: nn.Module, inputs: tuple, seed: int) -> Any:
    """The first forward once more (eager, no gradients; buffers restored after it)."""
    buffers = {n: b.detach().clone() for n, b in model.named_buffers()}
    torch.manual_seed(seed)
    try:
        with torch.no_grad():
            return _detach_cpu(model(*inputs))
    except Exception:  # noqa: BLE001 - no noise estimate; the parity run already said what failed
        return None
    finally:
        with torch.no_grad():
            for n, b in model.named_buffers():
                b.copy_(buffers[n])


def run_to_run_noise(first: Any, again: Any) -> float | None:
    """max |again - first| / max |first| over the floating outputs (None: not measurable)."""
    if again is None:
        return None
    num = den = 0.0
    a_l, b_l = [x for _, x in named_leaves(first)], [x for _, x in named_leaves(again)]
    if len(a_l) != len(b_l):
        return None
    for a, b in zip(a_l, b_l, strict=True):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or not a.is_floating_point() \
                or a.shape != b.shape or not a.numel():
            continue
        a64, b64 = a.double(), b.double()
        fin = torch.isfinite(a64) & torch.isfinite(b64)
        if fin.any():
            num = max(num, float((a64[fin] - b64[fin]).abs().max()))
            den = max(den, float(a64[fin].abs().max()))
    return num / den if den else (0.0 if not num else None)


def _time_forward(fn: Callable[..., Any], inputs: tuple, target: Any, iters: int) -> list[float]:
    out = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn(*inputs)
        target.synchronize()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


# -- the group -----------------------------------------------------------------------------
@dataclass
class _Prepared:
    spec: Any
    model: nn.Module  # float32, initial weights, never run
    inputs: tuple  # float32 canonical inputs
    graph_hash: str | None = None
    aten_ops: dict[str, int] | None = None


def _prepare(model_id: str) -> _Prepared:
    """Look up, build and trace a spec; raises with a message naming the failing stage."""
    from .tracing import hash_graph, histogram, trace

    try:
        spec = resolve_spec(model_id)
    except Exception as exc:  # noqa: BLE001
        raise RuntimeError(f"unknown model: {_err(exc)}") from exc
    try:
        model = spec.build()
        inputs = spec.example_inputs()
    except Exception as exc:  # noqa: BLE001
        raise RuntimeError(f"model construction failed: {_err(exc)}") from exc
    try:
        gm = trace(copy.deepcopy(model), inputs)
    except Exception as exc:  # noqa: BLE001
        raise RuntimeError(f"export (make_fx trace) failed: {_err(exc)}") from exc
    return _Prepared(spec, model, inputs, hash_graph(gm), histogram(gm))


def run_model_group(target: Any, group: Group, config: Any, *, skip: Container[str] = NOTHING,
                    on_start: Callable[[str], None] | None = None, modes: Sequence[str] | None = None,
                    train_steps: int = TRAIN_STEPS, timed_iters: int = TIMED_ITERS,
                    localize_failures: bool = True) -> Iterator[dict[str, Any]]:
    """Yield one row per item (mode) of a model group; items in ``skip`` are not run.

    ``train_steps`` (>= 1; the first is the parity run), ``timed_iters`` (0: no latency; the
    compile shape sweep still records recompiles) and ``localize_failures`` trade depth for speed.
    """
    modes = modes if modes is not None else getattr(config, "model_modes", MODES)
    if getattr(target, "compiler", False):
        # an eager item would run the model as it is, on the CPU, and compare the CPU with itself:
        # a pass that says nothing about the compiler. A compiler target's items are compiled.
        modes = [m for m in modes if m != "eager"]
    keys = [(m, model_key(group.op, m, group.dtype)) for m in modes]
    todo = [(m, k) for m, k in keys if k not in skip]
    if not todo:
        return
    family = group.op.split(".", 1)[0]
    base = {"model_id": group.op, "family": family, "dtype": group.dtype}
    start = time.perf_counter()
    if on_start:
        on_start(todo[0][1])
    try:
        prep = _prepare(group.op)
    except Exception as exc:  # noqa: BLE001 - the graph's own error, never the sweep's
        msg = str(exc) if isinstance(exc, RuntimeError) else _err(exc)
        for i, (mode, key) in enumerate(todo):
            if i and on_start:
                on_start(key)
            yield {**base, "item_key": key, "mode": mode, "status": decide_unrun("harness").value, "error": msg,
                   "duration_s": time.perf_counter() - start if i == 0 else 0.0}
        return
    base.update(params=dict(prep.spec.params), graph_hash=prep.graph_hash, aten_ops=prep.aten_ops)
    for i, (mode, key) in enumerate(todo):
        if i and on_start:
            on_start(key)
        t0 = time.perf_counter()
        try:
            row = run_item(target, prep, group.dtype, mode, config, train_steps=train_steps,
                           timed_iters=timed_iters, localize_failures=localize_failures)
        except Exception as exc:  # noqa: BLE001 - a harness bug must not end the sweep
            row = {"status": decide_unrun("harness").value,
                   "error": f"harness error: {_err(exc)}\n{traceback.format_exc(limit=-3)}"[:2000]}
        dur = time.perf_counter() - (start if i == 0 else t0)  # the first item carries build and trace
        yield {**base, **row, "item_key": key, "mode": mode, "duration_s": dur}


def run_item(target: Any, prep: _Prepared, dtype_name: str, mode: str, config: Any, *,
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

    cpu_model = copy.deepcopy(prep.model).to(dtype)
    inputs = _cast(prep.inputs, dtype)
    # CPU reference.
    try:
        cpu = train_side(spec, cpu_model, cpu_model, inputs, None, train_steps, seed)
    except Exception as exc:  # noqa: BLE001
        cpu = SideResult(error=_err(exc))
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
                fn = torch.compile(tgt_model, backend=counter, dynamic=False)
            elif target.compiler:  # run_model_group plans no such item
                raise TargetError(f"an eager model item on compiler target {target.name!r} would not "
                                  "run the compiler; its model items are compile items")
            else:
                fn = target.wrap(tgt_model)  # eager on the target
            tgt = train_side(spec, tgt_model, fn, tgt_inputs, target, train_steps, seed, compiled=mode == "compile")
        except Exception as exc:  # noqa: BLE001
            tgt = SideResult(error=_err(exc))
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
        row["fingerprint"] = fingerprint((tgt.out, tgt.grads or {}), (cpu.out, cpu.grads or {}), ref_kind="cpu")
        close = not fwd_detail and g_close and l_close
    status = decide(cpu_error=cpu.error, target_error=tgt.error, close=close, fallback=sorted(tgt.fallback or ()),
                    expected_failure=xfail.statuses if xfail else None)
    error = (f"CPU reference failed: {cpu.error}" if cpu.error else tgt.error) or ("; ".join(problems) or None)
    if status in (Status.XFAIL, Status.XPASS) and xfail is not None:
        error = f"{error or 'passed'} [expected failure: {xfail.where}: {xfail.reason}]"
    if problems and cpu.error is None and tgt.error is None:
        error = f"{error} [tolerance from {tol.source}]"
    row["status"], row["error"] = status.value, error

    # Localize a numeric failure to its first divergent op.
    if localize_failures and problems and cpu.error is None and tgt.error is None:
        from .localize import localize

        _localized(row, lambda: localize(prep.model, prep.inputs, target, dtype, tol=tol.fwd_rtol,
                                         backward=not any(p.startswith("forward") for p in problems), seed=seed),
                   "no op of the eager ATen graph diverges beyond tolerance, locally or along the device's chain"
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
            with _inference(tgt_model):
                if mode == "compile":
                    assert counter is not None
                    row.update(_shape_sweep(spec, fn, dtype, target, counter, tgt.first_s, timed_iters))
                elif timed_iters:
                    times = _time_forward(fn, target.to_device(inputs), target, WARMUP + timed_iters)[WARMUP:]
                    row["p50_ms"], row["p99_ms"] = percentile(times, 0.5), percentile(times, 0.99)
        except Exception as exc:  # noqa: BLE001
            row["error"] = f"{row['error'] + '; ' if row['error'] else ''}latency sweep failed: {_err(exc)}"[:2000]
    return row


def _exported_item(target: Any, prep: _Prepared, dtype: torch.dtype, tol: Any, xfail: Any, seed: int) -> dict[str, Any]:
    """A model item on a target that exports the model and runs it elsewhere (``exports``:
    onnxruntime, inference only): the forward in eval mode, without gradients, against the CPU's;
    nothing is trained. An export the target refuses is ``unsupported`` with its reason."""
    inputs = _cast(prep.inputs, dtype)
    cpu_out = tgt_out = None
    cpu_error = tgt_error = None
    try:
        with _inference(cpu_model := copy.deepcopy(prep.model).to(dtype)):
            torch.manual_seed(seed)
            cpu_out = _detach_cpu(cpu_model(*inputs))
    except Exception as exc:  # noqa: BLE001
        cpu_error = _err(exc)
    record = None
    if cpu_error is None:
        try:
            tgt_model = copy.deepcopy(prep.model).to(dtype)
            fn = target.wrap(tgt_model)
            with _inference(tgt_model):
                torch.manual_seed(seed)
                t0 = time.perf_counter()
                tgt_out = _detach_cpu(fn(*target.to_device(inputs)))
                first_s = time.perf_counter() - t0
        except Exception as exc:  # noqa: BLE001
            tgt_error = _err(exc)
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


def _shape(inputs: tuple) -> list[Any]:
    return [list(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__ for x in leaves(inputs)]


@contextlib.contextmanager
def _inference(model: nn.Module) -> Iterator[None]:
    """``model`` in eval mode under ``no_grad`` (its training flags restored after): the latency
    a model is deployed with, and for a compiled model an inference graph per shape, which the
    backend lowers in about half the time of a joint forward-backward one (measured on one graph
    per family; the canonical shape's extra dynamo trace takes most of that back)."""
    flags = {m: m.training for m in model.modules()}
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        for m, training in flags.items():
            m.training = training


def _shape_sweep(spec: Any, fn: Callable[..., Any], dtype: torch.dtype, target: Any, counter: CountingBackend,
                 first_s: float, timed_iters: int = TIMED_ITERS) -> dict[str, Any]:
    """Compile count of the canonical shape, then each shape variant's recompiles, and latency at
    each (run in inference: the canonical shape compiles its inference graph here)."""
    shapes, recompiles = [], 0
    for v, inputs in enumerate(spec.shape_variants()):
        x = target.to_device(_cast(inputs, dtype))
        before = counter.compiles
        fn(*x)  # first call at this shape: compiles when the shape (or the inference mode) is new
        target.synchronize()
        n = counter.compiles - before
        if v:
            recompiles += n
        times = _time_forward(fn, x, target, WARMUP + timed_iters)[WARMUP:] if timed_iters else []
        shapes.append({"shape": _shape(inputs), "recompiled": bool(v and n), "compiles": n,
                       "p50_ms": percentile(times, 0.5), "p99_ms": percentile(times, 0.99)})
    return {"recompiles": recompiles, "compile_s": first_s, "shapes": shapes,
            "p50_ms": shapes[0]["p50_ms"], "p99_ms": shapes[0]["p99_ms"]}


class ModelRunner:
    """The work kind: one group per graph x dtype of the selected families; two items per
    group, one per mode (``{model_id}|eager|{dtype}|0``, ``...|compile|...``)."""

    name = "model"
    table = "model_results"
    variants = MODES
    crash_safe_factor = 0  # no crash-safe mode: a death is the item's crash or the reference's

    def groups(self, selection: Selection) -> list[Group]:
        if not selection.models:
            return []
        return model_groups(selection.models, selection.dtypes, limit=selection.model_limit)

    def run(self, target: Any, group: Group, config: Any, *, skip: Container[str] = NOTHING,
            on_start: Callable[[str], None] | None = None) -> Iterator[dict[str, Any]]:
        return run_model_group(target, group, config, skip=skip, on_start=on_start)

    def synthetic_row(self, key: ItemKey) -> dict[str, Any]:
        return {"model_id": key.name, "mode": key.variant, "dtype": key.dtype, "family": key.name.split(".")[0]}


MODEL = ModelRunner()
