"""Per-op status: the export capture, the stored sweep's verdicts, isolated checks of recorded calls, and
dtype/layout risks."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_map

from conformance.check.compare import leaves

from .results import PLUMBING, AuditResult, OpRow, Risk
from .trace import INT32_MAX, INT32_MIN, Record, Recorder, devices_to, error_text, to_cpu


@contextlib.contextmanager
def silenced() -> Iterator[None]:
    """torch.export logs graphs and guard failures (logging, stdout): keep the report clean."""
    import io
    import logging

    log = logging.getLogger("torch")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        log.setLevel(level)


def export_histogram(model: nn.Module, inputs: tuple,
                      res: AuditResult) -> tuple[dict[str, int] | None, dict[str, list[Record]]]:
    """The core-ATen histogram of the ``torch.export`` graph and its calls' inputs (recorded by
    running the exported graph on the CPU); (None, {}) when export cannot capture the model."""
    from conformance.models.tracing import histogram
    from conformance.structure import FlatModule

    flat = FlatModule(copy.deepcopy(model), tuple(inputs))  # caches and ModelOutputs in or out: tensors only
    try:
        with silenced():
            ep = torch.export.export(flat, flat.flat_inputs(), strict=False).run_decompositions()
    except Exception as exc:  # noqa: BLE001
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        res.capture = {"method": "eager dispatch trace", "ok": False,
                       "detail": f"torch.export cannot capture the model ({type(exc).__name__}: {first[:200]}); "
                                 "falling back to eager tracing with a dispatch mode"}
        return None, {}
    hist = histogram(ep.graph_module)
    rec = Recorder(record=True)
    try:
        with torch.no_grad(), rec:
            ep.module()(*flat.flat_inputs())
    except Exception:  # noqa: BLE001 - export-only ops stay unchecked
        pass
    res.capture = {"method": "torch.export", "ok": True,
                   "detail": f"torch.export captured the model: {sum(hist.values())} core ATen op nodes, "
                             f"{len(hist)} overloads"}
    return hist, rec.records


def out_overload(name: str) -> str:
    """The out= overload of the op ``name`` belongs to (``aten::logical_not_.default`` ->
    ``aten::logical_not.out``)."""
    base = name.rsplit(".", 1)[0] if name.count(".") else name
    return f"{base.removesuffix('_')}.out"


def sweep_status(db_path: str | None, target: Any, names: list[str], res: AuditResult,
                 placement: dict[str, tuple[str, str]] | None = None) -> dict[str, tuple[str, str, str]]:
    """name -> (status, source, detail) for the overloads the build's stored sweep covers; fills
    ``placement`` (name -> ("native" | "fallback", why)) with where the sweep saw each run."""
    placement = {} if placement is None else placement
    if not db_path:
        return {}
    from opdb import Store
    from opdb.queries_audit import latest_finished_run, sweep_coverage

    if not Path(db_path).exists():
        res.db = {"path": db_path, "run": None, "detail": "no such database; every op checked in isolation"}
        return {}
    with Store.open(db_path, create=False) as st:
        run = latest_finished_run(st, target.name, target.build)
        if run is None:
            res.db = {"path": db_path, "run": None,
                      "detail": f"no finished run of {target.name} {target.build}; every op checked in isolation"}
            return {}
        cov = sweep_coverage(st, run["id"], [*names, *(out_overload(n) for n in names)])
    out = {}
    for name in dict.fromkeys(names):
        c = cov.get(name)
        if c is None:
            continue
        samples = c["samples"] or 0
        if c["state"] != "exercised" or samples == 0:
            continue
        failing = c["failing_samples"] or 0
        if failing * 2 > samples:  # most sweep samples reaching it fail: the op itself is at fault
            out[name] = ("mismatch", f"sweep {run['id']}", f"{failing} of {samples} sweep samples reaching it fail")
        else:
            detail = f"{samples} sweep sample{'' if samples == 1 else 's'}" + (f", {failing} failing" if failing else "")
            out[name] = ("pass", f"sweep {run['id']}", detail)
        # where it runs: its own samples, else (a functional or in-place overload that no sample ran
        # natively) through its out= overload, as structured kernels do: the device reports the fallback there
        via = cov.get(out_overload(name)) or {}
        if c["fallback_samples"]:
            placement[name] = ("fallback", f"{c['fallback_samples']} of {samples} sweep samples fall back")
        elif not c["native_samples"] and via.get("fallback_samples"):
            placement[name] = ("fallback", f"falls back through {out_overload(name)} "
                                           f"({via['fallback_samples']} of {via['samples']} sweep samples)")
        elif c["native_samples"]:
            placement[name] = ("native", "")
    res.db = {"path": db_path, "run": run["id"], "detail": f"{len(out)} of {len(names)} overloads from the sweep "
                                                            f"of run {run['id']} ({run['started_at']})"}
    return out


def isolated_check(row: OpRow, records: list[Record], target: Any, tol: float) -> None:
    from conformance.models.localize import rel_l2

    if row.name in PLUMBING:
        row.status, row.source, row.detail = "skip", "", "device plumbing (copies, allocation)"
        return
    if not records:
        row.status, row.detail = "unchecked", "no recorded call"
        return
    dev = torch.device(target.device)
    row.source = "isolated check"
    worst = 0.0
    for rec in records:
        func = rec.func
        if torch.Tag.nondeterministic_seeded in getattr(func, "tags", ()):
            row.status, row.detail = "skip", "random op: not compared"
            return
        try:
            c_args, c_kwargs = tree_map(lambda x: x.clone() if isinstance(x, torch.Tensor) else x, (rec.args, rec.kwargs))
            out_c = func(*c_args, **c_kwargs)
        except Exception as exc:  # noqa: BLE001
            row.status, row.detail = "skip", f"CPU reference fails in isolation: {error_text(exc)}"
            return
        try:
            t_args, t_kwargs = devices_to((rec.args, rec.kwargs), dev)
            with target.trace() as tr:
                out_t = to_cpu(func(*t_args, **t_kwargs))
                target.synchronize()
            if row.on_target in ("not run", "native", "fallback") and row.eager_calls == 0:
                # only in the exported graph: how it runs in isolation (an overload it calls may fall back)
                fb = sorted(set(tr.fallback) - PLUMBING)
                row.on_target = "fallback" if fb else "native"
                if fb and fb != [row.name]:
                    row.detail = f"falls back through {', '.join(fb)}"
        except Exception as exc:  # noqa: BLE001
            row.status, row.detail = "error", f"raises on the target: {error_text(exc)}"
            return
        if not any(isinstance(x, torch.Tensor) for x in leaves(out_c)):
            continue
        worst = max(worst, rel_l2(to_cpu(out_c), out_t))
    row.err = worst
    if worst <= tol:
        row.status = "pass"
    else:
        row.status = "mismatch"
        row.detail = f"||t - c|| / ||c|| = {worst:.3g} > {tol:g} with the model's recorded inputs"


def find_risks(model: nn.Module, inputs: tuple, rec: Recorder, ops: list[OpRow]) -> list[Risk]:
    risks: list[Risk] = []

    def tensors() -> list[tuple[str, torch.Tensor]]:
        out = [(f"parameter {n}", p) for n, p in model.named_parameters()]
        out += [(f"buffer {n}", b) for n, b in model.named_buffers()]
        out += [(f"input {i}", x) for i, x in enumerate(inputs) if isinstance(x, torch.Tensor)]
        return out

    for what, t in tensors():
        desc = f"{what} {list(t.shape)} {str(t.dtype).removeprefix('torch.')}"
        if t.dtype == torch.float64:
            risks.append(Risk("float64", desc, "Neuron devices have no native float64; expect emulation, "
                                               "fallback or a silent downcast"))
        elif t.is_complex():
            risks.append(Risk("complex", desc, "complex dtypes are not native on Neuron devices"))
        elif t.dtype == torch.int64 and t.numel() and (int(t.min()) < INT32_MIN or int(t.max()) > INT32_MAX):
            risks.append(Risk("int64_range", desc, f"values in [{int(t.min())}, {int(t.max())}] exceed int32; "
                                                    "int64 is computed as int32 on Neuron devices"))
        elif t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous():
            risks.append(Risk("channels_last", desc, "channels_last layout: the device may copy to contiguous"))
    notes = {"float64": "produce float64 tensors", "complex": "produce complex tensors",
             "channels_last": "produce channels_last tensors",
             "int64_range": "produce int64 values outside the int32 range"}
    for kind, names in rec.seen.items():
        names = sorted(names - PLUMBING)
        if names and not any(r.kind == kind for r in risks):
            risks.append(Risk(kind, f"{len(names)} op(s) {notes[kind]}: " + ", ".join(names[:6])
                              + (" ..." if len(names) > 6 else "")))
        elif names:
            risks.append(Risk(kind, f"intermediates: {len(names)} op(s) {notes[kind]}: "
                                    + ", ".join(names[:6]) + (" ..." if len(names) > 6 else "")))
    for row in ops:
        ns = row.name.split("::", 1)[0]
        if ns not in ("aten", "prim", "prims"):
            how = {"fallback": "runs through the CPU fallback", "native": "runs on the target",
                   "failing": "fails on the target"}.get(row.marked, "not run on the target")
            kind = "torch.library custom op" if ns not in ("quantized", "mkldnn") else f"{ns} op"
            risks.append(Risk("custom_op", f"{kind} {row.name} ({row.eager_calls} calls)",
                              f"{how}{': ' + row.detail if row.detail else ''}"))
    return risks
