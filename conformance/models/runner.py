"""Model-graph items of a run: parity, gradients, a short training run and compile behaviour.

A *group* is one graph x dtype (``Group(op=model_id, dtype, kind="model")``); it has two items,
``{model_id}|eager|{dtype}|0`` and ``{model_id}|compile|{dtype}|0``. Per item, on the target
against eager CPU from identical weights and data:

* the ATen op histogram and structural hash of the forward graph (``make_fx``, fake mode) and the
  overloads that ran natively or fell back on the device (``target.trace()`` of the real run);
* forward parity (``compare`` + ``decide``, the op sweep's evidence and verdict rules) at a
  model-level tolerance (:func:`~conformance.models.evidence.model_tolerance`);
* backward: every parameter's gradient (``grad_max_rel_err``);
* a ``TRAIN_STEPS``-step SGD run on both sides; both loss curves are stored and compared
  (the first step's forward/backward *is* the parity run);
* ``compile`` items run the same protocol through ``torch.compile(backend=<target's>)``
  with automatic dynamic shapes (``dynamic=None``, PyTorch's default) wrapped in a counting
  backend (device-generic), then sweep the spec's shape variants in inference (``eval()``,
  ``no_grad``) recording per shape the recompiles a user meets (Dynamo's one dynamic recompile,
  a backend's own per-shape lowerings), whether a dynamic graph served it, and p50/p99 forward
  latency after warm-up;
* a failing item is localized (:mod:`conformance.models.localize`) to its first divergent op.

A spec that cannot be looked up, built or traced yields ``error`` rows for its items; nothing
raises out of :func:`run_model_group`. :data:`MODEL` is this work kind; which graphs a run
selects is :mod:`conformance.models.selection`. This module holds the group and the work kind;
one item is :mod:`conformance.models.item`, one side of it :mod:`conformance.models.training`,
its closeness :mod:`conformance.models.evidence`, its compile counts and latency
:mod:`conformance.models.timing`.

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

import time
import traceback
from collections.abc import Callable, Container, Iterator, Sequence
from typing import Any

from conformance.check.execute import phase
from conformance.check.verdict import decide_unrun
from conformance.work import NOTHING, Group, ItemKey, Selection

from .evidence import (
    ModelTolerance,
    forward_evidence,
    grad_evidence,
    loss_close,
    model_tolerance,
    run_to_run_noise,
)
from .item import Prepared, error_text, prepare, run_item
from .selection import model_groups, model_key, resolve_spec
from .timing import TIMED_ITERS, WARMUP, CountingBackend, percentile
from .training import LR, TRAIN_STEPS, SideResult, cast, train_side
from .zoo import LIBRARIES, ZooSkip

__all__ = [
    "LR", "MODEL", "MODES", "TIMED_ITERS", "TRAIN_STEPS", "WARMUP", "CountingBackend", "ModelRunner",
    "ModelTolerance", "Prepared", "SideResult", "forward_evidence", "grad_evidence", "loss_close",
    "model_tolerance", "percentile", "run_item", "run_model_group", "run_to_run_noise", "train_side",
]

MODES = ("eager", "compile")

# the names these helpers had here before the split (benchmarks/bench_models_run.py reads them)
_prepare = prepare
_cast = cast


def run_model_group(target: Any, group: Group, config: Any, *, skip: Container[str] = NOTHING,
                    on_start: Callable[[str], None] | None = None, modes: Sequence[str] | None = None,
                    train_steps: int = TRAIN_STEPS, timed_iters: int = TIMED_ITERS,
                    localize_failures: bool = True) -> Iterator[dict[str, Any]]:
    """Yield one row per item (mode) of a model group; items in ``skip`` are not run.

    ``train_steps`` (>= 1; the first is the parity run), ``timed_iters`` (0: no latency; the
    compile shape sweep still records recompiles) and ``localize_failures`` trade depth for speed.
    """
    if modes is None:
        zoo = getattr(config, "zoo_modes", ()) if group.op.split(".", 1)[0] in LIBRARIES else ()
        modes = zoo or getattr(config, "model_modes", MODES)
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
    phase("cpu")  # building and tracing the graph is the CPU's side: a timeout there is no verdict
    try:
        prep = prepare(group.op)
    except Exception as exc:  # noqa: BLE001 - the graph's own error, never the sweep's
        if isinstance(exc, ZooSkip):  # the library cannot give it here: no finding about the target
            status, msg = decide_unrun("cpu").value, f"skipped by the zoo: {exc}"[:2000]
            base["params"] = _params_of(group.op)
        else:
            status = decide_unrun("harness").value
            msg = str(exc) if isinstance(exc, RuntimeError) else error_text(exc)
        for i, (mode, key) in enumerate(todo):
            if i and on_start:
                on_start(key)
            yield {**base, "item_key": key, "mode": mode, "status": status,
                   "error": msg, "duration_s": time.perf_counter() - start if i == 0 else 0.0}
        return
    params = dict(prep.spec.params)
    if prep.trace_error:
        params["trace_error"] = prep.trace_error[:500]
    if prep.topology:
        params["graph_topology"] = prep.topology
    base.update(params=params, graph_hash=prep.graph_hash, aten_ops=prep.aten_ops)
    for i, (mode, key) in enumerate(todo):
        if i and on_start:
            on_start(key)
        t0 = time.perf_counter()
        try:
            row = run_item(target, prep, group.dtype, mode, config, train_steps=train_steps,
                           timed_iters=timed_iters, localize_failures=localize_failures)
        except Exception as exc:  # noqa: BLE001 - a harness bug must not end the sweep
            row = {"status": decide_unrun("harness").value,
                   "error": f"harness error: {error_text(exc)}\n{traceback.format_exc(limit=-3)}"[:2000]}
        dur = time.perf_counter() - (start if i == 0 else t0)  # the first item carries build and trace
        yield {**base, **row, "item_key": key, "mode": mode, "duration_s": dur}


def _params_of(model_id: str) -> dict[str, Any] | None:
    """A spec's params (library and architecture family of a zoo model), None when it cannot be looked up."""
    try:
        return dict(resolve_spec(model_id).params)
    except Exception:  # noqa: BLE001 - the row says why it was skipped; the params are a courtesy
        return None


class ModelRunner:
    """The work kind: one group per graph x dtype of the selected families; two items per
    group, one per mode (``{model_id}|eager|{dtype}|0``, ``...|compile|...``)."""

    name = "model"
    table = "model_results"
    variants = MODES
    crash_safe_factor = 0  # no crash-safe mode: a death is the item's crash or the reference's
    # build, trace, CPU training steps, target training steps, compile and shape sweep: a real
    # architecture on 2 cores takes minutes where a family's small graph takes seconds
    timeout_factor = 5

    def groups(self, selection: Selection) -> list[Group]:
        if not selection.models:
            return []
        return model_groups(selection.models, selection.dtypes, limit=selection.model_limit)

    def run(self, target: Any, group: Group, config: Any, *, skip: Container[str] = NOTHING,
            on_start: Callable[[str], None] | None = None) -> Iterator[dict[str, Any]]:
        return run_model_group(target, group, config, skip=skip, on_start=on_start)

    def synthetic_row(self, key: ItemKey) -> dict[str, Any]:
        return {"model_id": key.name, "mode": key.variant, "dtype": key.dtype,
                "family": key.name.split(".")[0]}


MODEL = ModelRunner()
