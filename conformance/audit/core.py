"""The audit itself: the steps in order, and the verdict from what they found."""

from __future__ import annotations

import copy
import time
import warnings
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from . import generate as gen
from .compile_sweep import compile_sweep
from .loading import as_inputs, load_callable, load_model, make_inputs, parse_shape_set
from .ops import export_histogram, find_risks, isolated_check, sweep_status
from .parity import first_divergent, forward_parity, train_parity
from .results import AuditConfig, AuditInputError, AuditResult, GenerateConfig, OpRow
from .trace import Recorder, cpu_run, error_text, inputs_label, main_dtype, to_cpu


def audit(model: nn.Module, inputs: tuple, target: Any, config: AuditConfig | None = None) -> AuditResult:
    """Audit ``model(*inputs)`` (CPU originals, never mutated) on ``target``."""
    config = config or AuditConfig()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _audit(model, inputs, target, config)


def _audit(model: nn.Module, inputs: tuple, target: Any, config: AuditConfig) -> AuditResult:
    from conformance.check.ledger import Ledger
    from conformance.models.runner import model_tolerance

    timings: dict[str, float] = {}
    t_all = t0 = time.perf_counter()
    model = copy.deepcopy(model).eval()
    dtype_name = main_dtype(model)
    led = config.ledger or Ledger.load()
    tol = model_tolerance(SimpleNamespace(ledger=led), config.model_label, dtype_name, target.name)
    res = AuditResult(model=config.model_label, target=target.name, build=target.build,
                      torch_version=torch.__version__, inputs=inputs_label(inputs),
                      shape_sets=[inputs_label(inputs), *config.shape_labels],
                      tolerance={"dtype": dtype_name, "fwd_rtol": tol.fwd_rtol, "grad_rtol": tol.grad_rtol,
                                 "loss_rtol": tol.loss_rtol, "source": tol.source},
                      capture={})
    # 1. CPU reference (bad input when it fails) with dtype/layout facts.
    cpu_out, cpu_rec = cpu_run(model, inputs)
    timings["cpu_s"] = time.perf_counter() - t0

    # 2. Eager run on the target: counts, native/fallback, recorded inputs per overload.
    t0 = time.perf_counter()
    tgt_model = copy.deepcopy(model).to(target.device)
    tgt_rec = Recorder(record=True)
    tgt_out = None
    native: set[str] = set()
    fallback: set[str] = set()
    try:
        tgt_inputs = target.to_device(inputs)
        with torch.no_grad(), target.trace() as tr:
            with tgt_rec:
                out = tgt_model(*tgt_inputs)
            target.synchronize()
        native, fallback = set(tr.native), set(tr.fallback)
        tgt_out = to_cpu(out)
    except Exception as exc:  # noqa: BLE001
        res.target_error = error_text(exc)
    timings["target_eager_s"] = time.perf_counter() - t0

    # 3. Export capture.
    t0 = time.perf_counter()
    export_hist, export_records = export_histogram(model, inputs, res)
    timings["export_s"] = time.perf_counter() - t0

    # 4. Op inventory and per-op status (sweep results, else isolated checks).
    t0 = time.perf_counter()
    counts = tgt_rec.counts if res.target_error is None else cpu_rec.counts
    order = tgt_rec.order if res.target_error is None else cpu_rec.order
    if res.target_error is not None:
        order = list(dict.fromkeys([*tgt_rec.order, *cpu_rec.order]))
    placed: dict[str, tuple[str, str]] = {}  # where the stored sweep saw each overload run
    sweep = sweep_status(config.db_path, target, [*order, *(export_hist or {})], res, placed)
    for name in order:
        row = OpRow(name, eager_calls=counts.get(name, 0) or tgt_rec.counts.get(name, 0),
                    export_calls=None if export_hist is None else export_hist.get(name, 0))
        if name in fallback:
            row.on_target = "fallback"
        elif name in native:
            row.on_target = "native"
        elif name in tgt_rec.counts:
            row.on_target = "native" if res.target_error is None else "reached"
            if placed.get(name, ("",))[0] == "fallback":  # the device reported the fallback under another overload
                row.on_target = "fallback"
        if name in sweep:
            row.status, row.source, row.detail = sweep[name]
            if row.on_target == "fallback" and name not in fallback and placed.get(name, ("", ""))[1]:
                row.detail = f"{row.detail}; {placed[name][1]}"
        else:
            isolated_check(row, tgt_rec.records.get(name, []), target, tol.fwd_rtol)
        res.ops.append(row)
    if export_hist:
        for name, n in export_hist.items():
            if name in counts or name in tgt_rec.counts:
                continue
            row = OpRow(name, eager_calls=0, export_calls=n, on_target="not run")
            if name in sweep:
                row.status, row.source, row.detail = sweep[name]
                if name in placed:  # only in the exported graph: where the sweep ran it
                    row.on_target = placed[name][0]
                    row.detail = "; ".join(filter(None, [row.detail, placed[name][1]]))
            else:
                isolated_check(row, export_records.get(name, []), target, tol.fwd_rtol)
            res.ops.append(row)
    timings["op_checks_s"] = time.perf_counter() - t0

    # 5. Risks.
    res.risks = find_risks(model, inputs, cpu_rec, res.ops)

    # 6. Forward parity per output (+ gradients and training).
    t0 = time.perf_counter()
    failing_parity = False
    if tgt_out is not None:
        failing_parity = forward_parity(cpu_out, tgt_out, tol, res)
    timings["parity_s"] = time.perf_counter() - t0
    if config.train and res.target_error is None:
        t0 = time.perf_counter()
        failing_parity |= train_parity(model, inputs, target, tol, config.seed, res)
        timings["train_s"] = time.perf_counter() - t0
    if failing_parity or res.target_error is not None:
        t0 = time.perf_counter()
        backward = res.target_error is None and all(o.ok for o in res.outputs)
        first_divergent(model, inputs, target, tol.fwd_rtol, backward, config.seed, res)
        timings["localize_s"] = time.perf_counter() - t0

    # 7. Compile: recompiles and latency per shape set.
    if res.target_error is None:
        t0 = time.perf_counter()
        sets = [inputs, *config.shape_sets]
        labels = [inputs_label(inputs), *config.shape_labels]
        compile_sweep(model, sets, labels, target, tol.fwd_rtol, config, res)
        timings["compile_s"] = time.perf_counter() - t0

    # 8. Generation (--generate): greedy decoding per dtype x mode x bucket against the CPU.
    if config.generate is not None:
        t0 = time.perf_counter()
        gen.run_generation(model, target, config.model_label, config.generate, res)
        timings["generate_s"] = time.perf_counter() - t0

    decide(res)
    res.causes = causes_of(res)
    timings["total_s"] = time.perf_counter() - t_all
    res.timings = {k: round(v, 3) for k, v in timings.items()}
    return res


def causes_of(res: AuditResult) -> list[dict[str, Any]]:
    """The error causes of the audit's failures, as the sweep names them (the same signatures,
    so a cause the nightly has met shows the builds it was seen in), with what the knowledge file
    says about each."""
    from conformance.triage.causes import explain
    from conformance.triage.signature import Signature, op_signature

    found = []
    if res.target_error:
        found.append((op_signature({"status": "error", "error": res.target_error}), "the model on the target"))
    for o in res.ops:
        if o.marked == "failing":
            sig = (Signature("mismatch", "", "values differ", o.name) if o.status == "mismatch"
                   else op_signature({"status": o.status, "error": o.detail, "op": o.name}))
            found.append((sig, o.name))
    if any(not o.ok for o in res.outputs) and res.first_divergent_op:
        found.append((Signature("mismatch", "", "forward values differ", res.first_divergent_op), "forward parity"))
    found += gen.found_causes(res)
    return explain(found, (res.db or {}).get("path"))


def decide(res: AuditResult) -> None:
    blockers: list[str] = []
    if res.target_error:
        blockers.append(f"the model raises on {res.target} {res.build}: {res.target_error.splitlines()[0][:300]}")
    bad_out = [o for o in res.outputs if not o.ok]
    div = f"; first divergent op {res.first_divergent_op}" if res.first_divergent_op else ""
    if bad_out:
        blockers.append(f"forward parity fails for {', '.join(o.name or f'output {o.index}' for o in bad_out)} "
                        f"({bad_out[0].detail}){div}")
    if res.gradients is not None and not res.gradients["ok"]:
        blockers.append(f"gradients diverge ({res.gradients['detail']})" + (div if not bad_out else ""))
    if res.training is not None and not res.training["ok"] and (res.gradients or {}).get("ok", True):
        blockers.append(f"training diverges ({res.training['detail']})")
    for o in res.ops:
        if o.marked == "failing":
            blockers.append(f"{o.name} fails ({o.source}): {o.detail}")
    if res.compile.get("error"):
        blockers.append(f"torch.compile(backend={res.compile['backend']!r}) fails: {res.compile['error'][:300]}")
    bad_shapes = [s for s in res.shapes if s.parity_ok is False]
    if bad_shapes and not bad_out:
        blockers.append("compiled outputs diverge from the CPU at " + ", ".join(s.inputs for s in bad_shapes))
    blockers += gen.blockers(res)
    res.blockers = blockers
    res.fallbacks = [o.name for o in res.ops if o.on_target == "fallback" and o.marked != "failing"]
    res.fallbacks += [f for f in gen.fallbacks(res) if f not in res.fallbacks]
    w = []
    if res.compile.get("recompiles"):
        w.append(f"{res.compile['recompiles']} recompile(s) across the shape sets: "
                 + ", ".join(res.compile["recompiled_shapes"]))
    if res.capture and not res.capture.get("ok"):
        w.append("torch.export cannot capture the model: the audit used eager dispatch tracing")
    for r in res.risks:
        w.append(f"{r.kind}: {r.what}")
    w += gen.notes(res)
    res.warnings = w
    res.verdict = "blocked" if blockers else ("ready with fallbacks" if res.fallbacks else "ready")


def run_audit(model_ref: str, *, inputs_ref: str | None = None, input_shapes: tuple[str, ...] = (),
              shapes: tuple[str, ...] = (), target_name: str = "neuron-emu", build: str | None = None,
              train: bool = False, db_path: str | None = None, seed: int = 0,
              timed_iters: int = 5, generate: GenerateConfig | None = None) -> AuditResult:
    from conformance.targets import get_target

    shape_specs = parse_shape_set(";".join(input_shapes)) if input_shapes else None
    extra = [parse_shape_set(s) for s in shapes]
    model, inputs = load_model(model_ref, seed)
    if generate is not None:
        gen.check_lm(model, model_ref)
    if inputs_ref:
        fn = load_callable(inputs_ref)
        try:
            inputs = as_inputs(fn(), inputs_ref)
        except AuditInputError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise AuditInputError(f"{inputs_ref} raised {type(exc).__name__}: {exc}") from None
    elif shape_specs:
        inputs = make_inputs(shape_specs, model, seed)
    elif inputs is None and generate is not None:
        inputs = gen.example_inputs(model, model_ref, generate)
    if inputs is None:
        raise AuditInputError(f"{model_ref} returned no example inputs: give --input-shape or --inputs")
    target = get_target(target_name, build)
    sets = [make_inputs(s, model, seed + 1 + i) for i, s in enumerate(extra)]
    cfg = AuditConfig(train=train, shape_sets=sets, shape_labels=[inputs_label(x) for x in sets], db_path=db_path,
                      model_label=model_ref, seed=seed, timed_iters=timed_iters, generate=generate)
    return audit(model, inputs, target, cfg)
