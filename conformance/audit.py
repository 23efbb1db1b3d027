"""Migration-readiness audit of a user's own model on a target (``conformance audit``).

What one audit does, all by running (never by reading a build manifest):

1. **Op inventory.** The model runs once in eager mode on the target under a counting dispatch
   mode inside ``target.trace()`` (every overload with its call count, native or fallback as the
   device reports it); ``torch.export`` captures the graph too (its histogram is shown next to
   the eager counts). A model ``torch.export`` cannot capture is audited from the eager trace
   alone, and the report says so. Each overload's status comes from the stored sweep of the
   same target+build (``--db``: coverage of its latest finished run) or, when the sweep does not
   cover it, from an isolated check: the call's recorded inputs run on the CPU and on the target,
   outputs compared normwise.
2. **Dtype and layout risks:** float64 params/buffers/inputs/intermediates, int64 values outside
   the int32 range, complex tensors, channels_last tensors, ops outside the ``aten`` namespace.
3. **Parity:** each forward output against the CPU (model-level tolerance of the ledger and
   ``data/model_tolerances.toml``); with ``train`` also every parameter gradient and a 3-step SGD run. A
   failure is localized to its first divergent op (:func:`conformance.models.localize.localize`,
   or the first op whose isolated check fails when the graph cannot be traced symbolically).
4. **Compile:** ``torch.compile(backend=<target's>, dynamic=False)`` with a counting backend over
   every input-shape set: compiles, recompiles, compiled parity and p50/p99 latency.
5. **Verdict:** ``ready`` / ``ready with fallbacks`` / ``blocked`` and the ranked blockers.

Example::

    >>> import torch
    >>> from conformance.audit import AuditConfig, audit
    >>> from conformance.targets import get_target
    >>> m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    >>> r = audit(m, (torch.randn(2, 4),), get_target("cpu"), AuditConfig(timed_iters=1))
    >>> r.verdict
    'ready'
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import json
import math
import sys
import time
import warnings
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

from .compare import leaves

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
RECORDS_PER_OP = 2  # isolated checks per overload (its first calls)
TRAIN_STEPS = 3
DEFAULT_INT_HIGH = 16  # integer inputs are drawn from [0, high): the smallest nn.Embedding size if any
# Overloads every device run reaches (copies to/from the device, allocation): not model ops.
PLUMBING = frozenset({"aten::_copy_from.default", "aten::empty_strided.default", "aten::empty.memory_format",
                      "aten::_to_copy.default", "aten::copy_.default", "aten::_copy_from_and_resize.default",
                      "aten::_local_scalar_dense.default",
                      "aten::_assert_tensor_metadata.default"})


class AuditInputError(ValueError):
    """Bad audit input (module path, callable, shapes, a model whose CPU run fails): exit 2."""


# -- input parsing ---------------------------------------------------------------------------
DTYPE_NAMES = {"float32": torch.float32, "float": torch.float32, "float64": torch.float64, "double": torch.float64,
               "float16": torch.float16, "half": torch.float16, "bfloat16": torch.bfloat16,
               "int64": torch.int64, "long": torch.int64, "int32": torch.int32, "int": torch.int32,
               "int16": torch.int16, "int8": torch.int8, "uint8": torch.uint8, "bool": torch.bool,
               "complex64": torch.complex64, "complex128": torch.complex128}


@dataclass(frozen=True)
class InputSpec:
    shape: tuple[int, ...]
    dtype: str

    def label(self) -> str:
        return f"[{','.join(map(str, self.shape))}] {self.dtype}"


def parse_shape_set(text: str) -> list[InputSpec]:
    """``"1,3,224,224:float32"`` (one input) or ``"2,16:int64;2,16:bool"`` (several inputs)."""
    specs = []
    for part in [p.strip() for p in text.split(";")]:
        if not part:
            raise AuditInputError(f"shape {text!r} does not parse: empty input; expected e.g. '1,3,224,224:float32'")
        dims, _, dt = part.partition(":")
        dt = (dt.strip() or "float32").lower().removeprefix("torch.")
        if dt not in DTYPE_NAMES:
            raise AuditInputError(f"shape {text!r} does not parse: unknown dtype {dt!r}; known: "
                                  f"{', '.join(sorted(DTYPE_NAMES))}")
        try:
            shape = tuple(int(d) for d in dims.split(",")) if dims.strip() else ()
        except ValueError:
            raise AuditInputError(f"shape {text!r} does not parse: dimensions must be integers, "
                                  "e.g. '1,3,224,224:float32'") from None
        if any(d < 0 for d in shape):
            raise AuditInputError(f"shape {text!r} does not parse: negative dimension")
        specs.append(InputSpec(shape, str(DTYPE_NAMES[dt]).removeprefix("torch.")))
    return specs


def load_callable(ref: str, what: str = "MODULE:CALLABLE") -> Any:
    if ":" not in ref:
        raise AuditInputError(f"{ref!r} is not {what} (e.g. examples.audit_example:build)")
    mod_name, _, attr = ref.partition(":")
    if "" not in sys.path and "." not in sys.path:
        sys.path.insert(0, "")  # the current directory, as `python -m` has it
    try:
        mod = importlib.import_module(mod_name)
    except Exception as exc:  # noqa: BLE001 - a user module: any import error is bad input
        raise AuditInputError(f"module {mod_name!r} does not import: {type(exc).__name__}: {exc}") from None
    obj: Any = mod
    for name in attr.split("."):
        if not hasattr(obj, name):
            raise AuditInputError(f"module {mod_name!r} has no attribute {attr!r}")
        obj = getattr(obj, name)
    if not callable(obj):
        raise AuditInputError(f"{ref} is not callable")
    return obj


def _int_high(model: nn.Module) -> int:
    sizes = [m.num_embeddings for m in model.modules() if isinstance(m, nn.Embedding)]
    return min(sizes) if sizes else DEFAULT_INT_HIGH


def make_inputs(specs: list[InputSpec], model: nn.Module, seed: int) -> tuple:
    """Seeded inputs: normal floats, integers in ``[0, smallest embedding)``, random bools."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for s in specs:
        dt = DTYPE_NAMES[s.dtype]
        if dt.is_floating_point or dt.is_complex:
            out.append(torch.randn(s.shape, generator=gen, dtype=dt))
        elif dt == torch.bool:
            out.append(torch.randint(0, 2, s.shape, generator=gen).bool())
        else:
            out.append(torch.randint(0, _int_high(model), s.shape, generator=gen, dtype=dt))
    return tuple(out)


def _as_inputs(value: Any, where: str) -> tuple:
    if isinstance(value, torch.Tensor):
        return (value,)
    if isinstance(value, (tuple, list)):
        return tuple(value)
    raise AuditInputError(f"{where} returned {type(value).__name__}; expected a tensor or a tuple of inputs")


def load_model(ref: str, seed: int = 0) -> tuple[nn.Module, tuple | None]:
    """Call ``MODULE:CALLABLE`` (seeded): an ``nn.Module``, or ``(module, example_inputs)``."""
    fn = load_callable(ref)
    torch.manual_seed(seed)
    try:
        value = fn()
    except Exception as exc:  # noqa: BLE001
        raise AuditInputError(f"{ref} raised {type(exc).__name__}: {exc}") from None
    inputs = None
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], nn.Module):
        value, inputs = value
        inputs = _as_inputs(inputs, ref)
    if not isinstance(value, nn.Module):
        raise AuditInputError(f"{ref} returned {type(value).__name__}; expected an nn.Module "
                              "or a tuple (nn.Module, example inputs)")
    return value, inputs


# -- results ---------------------------------------------------------------------------------
@dataclass
class OpRow:
    name: str  # "aten::addmm.default"
    eager_calls: int = 0  # calls in the eager run on the target (CPU run if the target run failed)
    export_calls: int | None = None  # nodes in the exported graph (None: not captured)
    on_target: str = "not run"  # native | fallback | not run
    status: str = "unchecked"  # pass | mismatch | error | skip | unchecked
    source: str = ""  # "isolated check" | "sweep <run id>"
    err: float | None = None  # normwise error of the isolated check
    detail: str = ""

    @property
    def marked(self) -> str:
        if self.status in ("mismatch", "error"):
            return "failing"
        return self.on_target


@dataclass
class Risk:
    kind: str  # float64 | int64_range | complex | channels_last | custom_op
    what: str
    detail: str = ""


@dataclass
class OutputParity:
    index: int
    shape: list[int]
    dtype: str
    ok: bool
    rel_err: float | None
    max_abs_err: float | None
    detail: str = ""


@dataclass
class ShapeRow:
    inputs: str
    compiles: int = 0
    recompiled: bool = False
    parity_ok: bool | None = None
    rel_err: float | None = None
    p50_ms: float | None = None
    p99_ms: float | None = None
    error: str = ""


@dataclass
class AuditResult:
    model: str
    target: str
    build: str
    torch_version: str
    inputs: str
    shape_sets: list[str]
    tolerance: dict[str, Any]
    capture: dict[str, Any]  # how the graph was captured: {"method", "ok", "detail"}
    db: dict[str, Any] | None = None
    ops: list[OpRow] = field(default_factory=list)
    risks: list[Risk] = field(default_factory=list)
    target_error: str | None = None
    outputs: list[OutputParity] = field(default_factory=list)
    gradients: dict[str, Any] | None = None
    training: dict[str, Any] | None = None
    first_divergent_op: str | None = None
    first_divergent_detail: str = ""
    compile: dict[str, Any] = field(default_factory=dict)
    shapes: list[ShapeRow] = field(default_factory=list)
    blockers: list[str] = field(default_factory=list)
    fallbacks: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    verdict: str = "ready"
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        return 1 if self.verdict == "blocked" else 0

    def as_json(self) -> dict[str, Any]:
        d = asdict(self)
        for o, row in zip(d["ops"], self.ops, strict=True):
            o["marked"] = row.marked
        d["exit_code"] = self.exit_code
        return _jsonable(d)


def _jsonable(v: Any) -> Any:
    if isinstance(v, float):
        return v if math.isfinite(v) else (None if math.isnan(v) else ("inf" if v > 0 else "-inf"))
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return v


# -- tracing ---------------------------------------------------------------------------------
def op_name(func: Any) -> str:
    return f"{func.namespace}::{func._schema.name.split('::', 1)[1]}.{func._overloadname}"


@dataclass
class _Record:
    func: Any
    args: Any  # CPU copies of the call's inputs, taken before it ran
    kwargs: Any


class _Recorder(TorchDispatchMode):
    """Counts every overload (any namespace), records the first calls' inputs (CPU copies) and
    notes dtype/layout facts of the outputs."""

    def __init__(self, record: bool = False, facts: bool = False) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()
        self.order: list[str] = []
        self.records: dict[str, list[_Record]] = {}
        self.record, self.facts = record, facts
        self.seen: dict[str, set[str]] = {"float64": set(), "complex": set(), "channels_last": set(),
                                          "int64_range": set()}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        name = op_name(func)
        if name not in self.counts:
            self.order.append(name)
        self.counts[name] += 1
        if self.record and len(self.records.setdefault(name, [])) < RECORDS_PER_OP:
            cpu = tree_map(lambda x: x.detach().to("cpu", copy=True) if isinstance(x, torch.Tensor) else x,
                           (args, kwargs))
            self.records[name].append(_Record(func, cpu[0], cpu[1]))
        out = func(*args, **kwargs)
        if self.facts:
            self._facts(name, out)
        return out

    def _facts(self, name: str, out: Any) -> None:
        for t in leaves(out):
            if not isinstance(t, torch.Tensor) or t.layout != torch.strided:
                continue
            if t.dtype == torch.float64:
                self.seen["float64"].add(name)
            elif t.is_complex():
                self.seen["complex"].add(name)
            elif t.dtype == torch.int64 and t.numel() and name not in self.seen["int64_range"]:
                if int(t.min()) < INT32_MIN or int(t.max()) > INT32_MAX:
                    self.seen["int64_range"].add(name)
            if t.dim() == 4 and t.shape[1] > 1 and t.shape[2] * t.shape[3] > 1 and \
                    t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous():
                self.seen["channels_last"].add(name)


def _err(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".strip()[:1000]


def _to_cpu(tree: Any) -> Any:
    return tree_map(lambda x: x.detach().to("cpu") if isinstance(x, torch.Tensor) else x, tree)


def _devices_to(tree: Any, dev: torch.device) -> Any:
    def one(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return x.to(dev)
        if isinstance(x, torch.device) and x.type == "cpu":
            return dev
        return x
    return tree_map(one, tree)


def _main_dtype(model: nn.Module) -> str:
    for p in list(model.parameters()) + list(model.buffers()):
        if p.is_floating_point():
            name = str(p.dtype).removeprefix("torch.")
            return name if name in ("float32", "float64", "bfloat16", "float16") else "float32"
    return "float32"


# -- the audit -------------------------------------------------------------------------------
@dataclass
class AuditConfig:
    train: bool = False
    shape_sets: list[tuple] = field(default_factory=list)  # extra input tuples for the shape sweep
    shape_labels: list[str] = field(default_factory=list)
    db_path: str | None = None
    model_label: str = "model"
    seed: int = 0
    timed_iters: int = 5
    warmup: int = 1
    ledger: Any = None


def _label(inputs: tuple) -> str:
    return "; ".join(f"[{','.join(map(str, x.shape))}] {str(x.dtype).removeprefix('torch.')}"
                     if isinstance(x, torch.Tensor) else type(x).__name__ for x in inputs)


def cpu_run(model: nn.Module, inputs: tuple, what: str = "the model") -> tuple[Any, _Recorder]:
    rec = _Recorder(facts=True)
    try:
        with torch.no_grad(), rec:
            out = model(*inputs)
    except Exception as exc:  # noqa: BLE001
        raise AuditInputError(f"{what} fails on the CPU with inputs {_label(inputs)}: {_err(exc)}") from None
    return _to_cpu(out), rec


def audit(model: nn.Module, inputs: tuple, target: Any, config: AuditConfig | None = None) -> AuditResult:
    """Audit ``model(*inputs)`` (CPU originals, never mutated) on ``target``."""
    config = config or AuditConfig()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _audit(model, inputs, target, config)


def _audit(model: nn.Module, inputs: tuple, target: Any, config: AuditConfig) -> AuditResult:
    from .ledger import Ledger
    from .models.runner import model_tolerance

    timings: dict[str, float] = {}
    t_all = t0 = time.perf_counter()
    model = copy.deepcopy(model).eval()
    dtype_name = _main_dtype(model)
    led = config.ledger or Ledger.load()
    tol = model_tolerance(SimpleNamespace(ledger=led), config.model_label, dtype_name, target.name)
    res = AuditResult(model=config.model_label, target=target.name, build=target.build,
                      torch_version=torch.__version__, inputs=_label(inputs),
                      shape_sets=[_label(inputs), *config.shape_labels],
                      tolerance={"dtype": dtype_name, "fwd_rtol": tol.fwd_rtol, "grad_rtol": tol.grad_rtol,
                                 "loss_rtol": tol.loss_rtol, "source": tol.source},
                      capture={})
    # 1. CPU reference (bad input when it fails) with dtype/layout facts.
    cpu_out, cpu_rec = cpu_run(model, inputs)
    timings["cpu_s"] = time.perf_counter() - t0

    # 2. Eager run on the target: counts, native/fallback, recorded inputs per overload.
    t0 = time.perf_counter()
    tgt_model = copy.deepcopy(model).to(target.device)
    tgt_rec = _Recorder(record=True)
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
        tgt_out = _to_cpu(out)
    except Exception as exc:  # noqa: BLE001
        res.target_error = _err(exc)
    timings["target_eager_s"] = time.perf_counter() - t0

    # 3. Export capture.
    t0 = time.perf_counter()
    export_hist, export_records = _export_histogram(model, inputs, res)
    timings["export_s"] = time.perf_counter() - t0

    # 4. Op inventory and per-op status (sweep results, else isolated checks).
    t0 = time.perf_counter()
    counts = tgt_rec.counts if res.target_error is None else cpu_rec.counts
    order = tgt_rec.order if res.target_error is None else cpu_rec.order
    if res.target_error is not None:
        order = list(dict.fromkeys([*tgt_rec.order, *cpu_rec.order]))
    sweep = _sweep_status(config.db_path, target, [*order, *(export_hist or {})], res)
    for name in order:
        row = OpRow(name, eager_calls=counts.get(name, 0) or tgt_rec.counts.get(name, 0),
                    export_calls=None if export_hist is None else export_hist.get(name, 0))
        if name in fallback:
            row.on_target = "fallback"
        elif name in native:
            row.on_target = "native"
        elif name in tgt_rec.counts:
            row.on_target = "native" if res.target_error is None else "reached"
        if name in sweep:
            row.status, row.source, row.detail = sweep[name]
        else:
            _isolated_check(row, tgt_rec.records.get(name, []), target, tol.fwd_rtol)
        res.ops.append(row)
    if export_hist:
        for name, n in export_hist.items():
            if name in counts or name in tgt_rec.counts:
                continue
            row = OpRow(name, eager_calls=0, export_calls=n, on_target="not run")
            if name in sweep:
                row.status, row.source, row.detail = sweep[name]
            else:
                _isolated_check(row, export_records.get(name, []), target, tol.fwd_rtol)
            res.ops.append(row)
    timings["op_checks_s"] = time.perf_counter() - t0

    # 5. Risks.
    res.risks = _risks(model, inputs, cpu_rec, res.ops)

    # 6. Forward parity per output (+ gradients and training).
    t0 = time.perf_counter()
    failing_parity = False
    if tgt_out is not None:
        failing_parity = _forward_parity(cpu_out, tgt_out, tol, res)
    timings["parity_s"] = time.perf_counter() - t0
    if config.train and res.target_error is None:
        t0 = time.perf_counter()
        failing_parity |= _train_parity(model, inputs, target, tol, config.seed, res)
        timings["train_s"] = time.perf_counter() - t0
    if failing_parity or res.target_error is not None:
        t0 = time.perf_counter()
        backward = res.target_error is None and all(o.ok for o in res.outputs)
        _first_divergent(model, inputs, target, tol.fwd_rtol, backward, config.seed, res)
        timings["localize_s"] = time.perf_counter() - t0

    # 7. Compile: recompiles and latency per shape set.
    if res.target_error is None:
        t0 = time.perf_counter()
        sets = [inputs, *config.shape_sets]
        labels = [_label(inputs), *config.shape_labels]
        _compile_sweep(model, sets, labels, target, tol.fwd_rtol, config, res)
        timings["compile_s"] = time.perf_counter() - t0

    _decide(res)
    timings["total_s"] = time.perf_counter() - t_all
    res.timings = {k: round(v, 3) for k, v in timings.items()}
    return res


@contextlib.contextmanager
def _silenced() -> Iterator[None]:
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


def _export_histogram(model: nn.Module, inputs: tuple,
                      res: AuditResult) -> tuple[dict[str, int] | None, dict[str, list[_Record]]]:
    """The core-ATen histogram of the ``torch.export`` graph and its calls' inputs (recorded by
    running the exported graph on the CPU); (None, {}) when export cannot capture the model."""
    from .models.tracing import histogram

    try:
        with _silenced():
            ep = torch.export.export(copy.deepcopy(model), tuple(inputs), strict=False).run_decompositions()
    except Exception as exc:  # noqa: BLE001
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        res.capture = {"method": "eager dispatch trace", "ok": False,
                       "detail": f"torch.export cannot capture the model ({type(exc).__name__}: {first[:200]}); "
                                 "falling back to eager tracing with a dispatch mode"}
        return None, {}
    hist = histogram(ep.graph_module)
    rec = _Recorder(record=True)
    try:
        with torch.no_grad(), rec:
            ep.module()(*inputs)
    except Exception:  # noqa: BLE001 - export-only ops stay unchecked
        pass
    res.capture = {"method": "torch.export", "ok": True,
                   "detail": f"torch.export captured the model: {sum(hist.values())} core ATen op nodes, "
                             f"{len(hist)} overloads"}
    return hist, rec.records


def _sweep_status(db_path: str | None, target: Any, names: list[str],
                  res: AuditResult) -> dict[str, tuple[str, str, str]]:
    """name -> (status, source, detail) for the overloads the build's stored sweep covers."""
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
        cov = sweep_coverage(st, run["id"], names)
    out = {}
    for name, c in cov.items():
        samples = c["samples"] or 0
        if c["state"] != "exercised" or samples == 0:
            continue
        failing = c["failing_samples"] or 0
        if failing * 2 > samples:  # most sweep samples reaching it fail: the op itself is at fault
            out[name] = ("mismatch", f"sweep {run['id']}", f"{failing} of {samples} sweep samples reaching it fail")
        else:
            detail = f"{samples} sweep samples" + (f", {failing} failing" if failing else "")
            out[name] = ("pass", f"sweep {run['id']}", detail)
    res.db = {"path": db_path, "run": run["id"], "detail": f"{len(out)} of {len(names)} overloads from the sweep "
                                                            f"of run {run['id']} ({run['started_at']})"}
    return out


def _isolated_check(row: OpRow, records: list[_Record], target: Any, tol: float) -> None:
    from .models.localize import rel_l2

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
            row.status, row.detail = "skip", f"CPU reference fails in isolation: {_err(exc)}"
            return
        try:
            t_args, t_kwargs = _devices_to((rec.args, rec.kwargs), dev)
            with target.trace() as tr:
                out_t = _to_cpu(func(*t_args, **t_kwargs))
                target.synchronize()
            if row.on_target in ("not run", "native", "fallback") and row.eager_calls == 0:
                # only in the exported graph: how it runs in isolation (an overload it calls may fall back)
                fb = sorted(set(tr.fallback) - PLUMBING)
                row.on_target = "fallback" if fb else "native"
                if fb and fb != [row.name]:
                    row.detail = f"falls back through {', '.join(fb)}"
        except Exception as exc:  # noqa: BLE001
            row.status, row.detail = "error", f"raises on the target: {_err(exc)}"
            return
        if not any(isinstance(x, torch.Tensor) for x in leaves(out_c)):
            continue
        worst = max(worst, rel_l2(_to_cpu(out_c), out_t))
    row.err = worst
    if worst <= tol:
        row.status = "pass"
    else:
        row.status = "mismatch"
        row.detail = f"||t - c|| / ||c|| = {worst:.3g} > {tol:g} with the model's recorded inputs"


def _risks(model: nn.Module, inputs: tuple, rec: _Recorder, ops: list[OpRow]) -> list[Risk]:
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


def _forward_parity(cpu_out: Any, tgt_out: Any, tol: Any, res: AuditResult) -> bool:
    from .compare import compare
    from .models.localize import rel_l2

    c_l, t_l = leaves(cpu_out), leaves(tgt_out)
    if len(c_l) != len(t_l):
        res.outputs.append(OutputParity(0, [], "", False, None, None,
                                        f"target returned {len(t_l)} values, CPU {len(c_l)}"))
        return True
    bad = False
    for i, (c, t) in enumerate(zip(c_l, t_l, strict=True)):
        if not isinstance(c, torch.Tensor):
            ok = c == t
            res.outputs.append(OutputParity(i, [], type(c).__name__, bool(ok), None, None,
                                            "" if ok else f"{t!r} vs {c!r}"))
            bad |= not ok
            continue
        ev = compare(c, t, atol=tol.atol, rtol=tol.rtol)
        err = rel_l2(c, t) if isinstance(t, torch.Tensor) else math.inf
        detail = ""
        if not (ev.shape_ok and ev.dtype_ok):
            detail = ev.detail or "structure differs"
        elif not err <= tol.fwd_rtol:
            detail = f"||t - c|| / ||c|| = {err:.3g} > fwd_rtol={tol.fwd_rtol:g}"
        res.outputs.append(OutputParity(i, list(c.shape), str(c.dtype).removeprefix("torch."), not detail,
                                        err, ev.max_abs_err, detail))
        bad |= bool(detail)
    return bad


def _loss(out: Any) -> torch.Tensor:
    fl = [o for o in leaves(out) if isinstance(o, torch.Tensor) and o.is_floating_point() and o.requires_grad]
    if not fl:
        raise AuditInputError("--train: the model's outputs carry no gradient (no float output depends on parameters)")
    return sum(o.float().square().mean() for o in fl)  # type: ignore[return-value]


def _train_parity(model: nn.Module, inputs: tuple, target: Any, tol: Any, seed: int, res: AuditResult) -> bool:
    from .models.runner import _train, grad_evidence, loss_close

    spec = SimpleNamespace(loss=_loss)
    cpu_m = copy.deepcopy(model).train()
    try:
        cpu = _train(spec, cpu_m, cpu_m, inputs, None, TRAIN_STEPS, seed)
    except AuditInputError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise AuditInputError(f"--train: the model's training step fails on the CPU: {_err(exc)}") from None
    try:
        tgt_m = copy.deepcopy(model).train().to(target.device)
        tgt = _train(spec, tgt_m, tgt_m, target.to_device(inputs), target, TRAIN_STEPS, seed)
    except Exception as exc:  # noqa: BLE001
        res.gradients = {"ok": False, "worst_rel_err": None, "detail": f"training step raises on the target: {_err(exc)}"}
        res.training = {"ok": False, "steps": TRAIN_STEPS, "detail": res.gradients["detail"]}
        return True
    g_ok, g_err, g_detail = grad_evidence(cpu.grads or {}, tgt.grads or {}, tol)
    res.gradients = {"ok": g_ok, "worst_rel_err": g_err, "parameters": len(cpu.grads or {}),
                     "detail": g_detail, "fallback_ops": sorted(tgt.fallback or ())}
    l_ok, l_detail = loss_close(cpu.losses or [], tgt.losses or [], tol)
    res.training = {"ok": l_ok, "steps": TRAIN_STEPS, "cpu_loss": cpu.losses, "target_loss": tgt.losses,
                    "detail": l_detail}
    return not (g_ok and l_ok)


def _first_divergent(model: nn.Module, inputs: tuple, target: Any, tol: float, backward: bool, seed: int,
                     res: AuditResult) -> None:
    from .models.localize import localize

    dtype = getattr(torch, _main_dtype(model))
    try:
        div = localize(model, inputs, target, dtype, tol=tol, backward=backward, seed=seed)
    except Exception as exc:  # noqa: BLE001 - e.g. data-dependent control flow: no symbolic graph
        bad = next((o for o in res.ops if o.status in ("mismatch", "error") and o.source == "isolated check"), None)
        if bad is not None:
            res.first_divergent_op = bad.name
            res.first_divergent_detail = (f"{bad.name}: {bad.detail} (first failing op of the eager trace; "
                                          f"localize could not trace the graph: {_err(exc)[:200]})")
        else:
            res.first_divergent_detail = f"localization failed: {_err(exc)[:300]}"
        return
    if div is not None:
        res.first_divergent_op, res.first_divergent_detail = div.op, div.detail
    else:
        res.first_divergent_detail = "no single op of the ATen graph diverges beyond tolerance"


def _compile_sweep(model: nn.Module, sets: list[tuple], labels: list[str], target: Any, tol: float,
                   config: AuditConfig, res: AuditResult) -> None:
    from .models.localize import rel_l2
    from .models.runner import CountingBackend, _percentile

    backend = target.compile_backend()
    res.compile = {"backend": backend if isinstance(backend, str) else getattr(backend, "__name__", "callable"),
                   "dynamic": False, "compiles": 0, "recompiles": 0, "compile_s": None, "error": None,
                   "recompiled_shapes": []}
    torch._dynamo.reset()
    counter = CountingBackend(backend)
    tgt_model = copy.deepcopy(model).to(target.device)
    fn = torch.compile(tgt_model, backend=counter, dynamic=False)
    for i, (x, label) in enumerate(zip(sets, labels, strict=True)):
        row = ShapeRow(label)
        cpu_out, _ = cpu_run(model, x, f"the model (shape set {label})") if i else (None, None)
        try:
            xd = target.to_device(x)
            before = counter.compiles
            t0 = time.perf_counter()
            with torch.no_grad():
                out = fn(*xd)
            target.synchronize()
            if i == 0:
                res.compile["compile_s"] = time.perf_counter() - t0
            row.compiles = counter.compiles - before
            row.recompiled = bool(i and row.compiles)
            ref = cpu_out if i else None
            if ref is None:
                with torch.no_grad():
                    ref = _to_cpu(model(*x))
            row.rel_err = rel_l2(ref, _to_cpu(out))
            row.parity_ok = row.rel_err <= tol
            times = []
            with torch.no_grad():
                for k in range(config.warmup + config.timed_iters):
                    t0 = time.perf_counter()
                    fn(*xd)
                    target.synchronize()
                    if k >= config.warmup:
                        times.append((time.perf_counter() - t0) * 1e3)
            row.p50_ms, row.p99_ms = _percentile(times, 0.5), _percentile(times, 0.99)
        except AuditInputError:
            raise
        except Exception as exc:  # noqa: BLE001
            row.error = _err(exc)[:500]
            res.compile["error"] = res.compile["error"] or f"{label}: {row.error}"
        res.shapes.append(row)
    res.compile["compiles"] = counter.compiles
    res.compile["recompiles"] = sum(r.compiles for r in res.shapes[1:])
    res.compile["recompiled_shapes"] = [r.inputs for r in res.shapes if r.recompiled]
    torch._dynamo.reset()


def _decide(res: AuditResult) -> None:
    blockers: list[str] = []
    if res.target_error:
        blockers.append(f"the model raises on {res.target} {res.build}: {res.target_error.splitlines()[0][:300]}")
    bad_out = [o for o in res.outputs if not o.ok]
    div = f"; first divergent op {res.first_divergent_op}" if res.first_divergent_op else ""
    if bad_out:
        blockers.append(f"forward parity fails for output(s) {', '.join(str(o.index) for o in bad_out)} "
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
    res.blockers = blockers
    res.fallbacks = [o.name for o in res.ops if o.on_target == "fallback" and o.marked != "failing"]
    w = []
    if res.compile.get("recompiles"):
        w.append(f"{res.compile['recompiles']} recompile(s) across the shape sets: "
                 + ", ".join(res.compile["recompiled_shapes"]))
    if res.capture and not res.capture.get("ok"):
        w.append("torch.export cannot capture the model: the audit used eager dispatch tracing")
    for r in res.risks:
        w.append(f"{r.kind}: {r.what}")
    res.warnings = w
    res.verdict = "blocked" if blockers else ("ready with fallbacks" if res.fallbacks else "ready")


# -- rendering -------------------------------------------------------------------------------
def _fmt(v: float | None, digits: int = 3) -> str:
    if v is None:
        return "-"
    if not math.isfinite(v):
        return "inf"
    if v == 0:
        return "0"
    return f"{v:.{digits - 1}e}" if abs(v) < 1e-3 or abs(v) >= 1e5 else f"{v:.{digits}g}"


def verdict_line(res: AuditResult) -> str:
    if res.verdict == "blocked":
        return f"verdict: blocked ({len(res.blockers)} blocker{'s' * (len(res.blockers) != 1)})"
    if res.verdict == "ready with fallbacks":
        n = len(res.fallbacks)
        return (f"verdict: ready with fallbacks ({n} op{'s fall' if n != 1 else ' falls'} back to the CPU: {', '.join(res.fallbacks[:4])}{' ...' if len(res.fallbacks) > 4 else ''})")
    return "verdict: ready"


def text_lines(res: AuditResult, *, timings: bool = True) -> list[str]:
    L = [f"audit of {res.model} on {res.target} {res.build} (torch {res.torch_version})",
         f"inputs: {res.inputs}" + (f"; shape sets: {len(res.shape_sets)}" if len(res.shape_sets) > 1 else ""),
         f"capture: {res.capture.get('detail', '')}"]
    if res.db:
        L.append(f"sweep results: {res.db['detail']}")
    model_ops = [o for o in res.ops if o.name not in PLUMBING]
    marks = Counter(o.marked for o in model_ops)
    L += ["", f"ops ({len(model_ops)} overloads, {sum(o.eager_calls for o in model_ops)} eager calls; "
          + ", ".join(f"{n} {k}" for k, n in sorted(marks.items())) + ")"]
    w = max([len(o.name) for o in model_ops] + [10])
    L.append(f"  {'overload':<{w}}  {'eager':>5}  {'export':>6}  {'on target':<9}  check")
    for o in model_ops:
        exp = "-" if o.export_calls is None else str(o.export_calls)
        check = o.status + (f" ({o.source})" if o.source and o.source != "isolated check" else "")
        if o.err is not None and o.status in ("pass", "mismatch"):
            check += f" err {_fmt(o.err)}"
        if o.status in ("mismatch", "error") or (o.detail and o.status == "skip" and "random" not in o.detail) \
                or (o.detail and o.marked == "fallback"):
            check += f": {o.detail[:140]}"
        L.append(f"  {o.name:<{w}}  {o.eager_calls:>5}  {exp:>6}  {o.marked:<9}  {check}")
    L += ["", "dtype and layout risks"]
    L += [f"  - {r.kind}: {r.what}" + (f" ({r.detail})" if r.detail else "") for r in res.risks] or ["  none"]
    L += ["", f"parity (tolerance ||t - c|| / ||c|| <= {res.tolerance['fwd_rtol']:g}, {res.tolerance['dtype']})"]
    if res.target_error:
        L.append(f"  the model raises on the target: {res.target_error.splitlines()[0][:200]}")
    for o in res.outputs:
        L.append(f"  output {o.index} [{','.join(map(str, o.shape))}] {o.dtype}: {'pass' if o.ok else 'FAIL'}"
                 f"  rel err {_fmt(o.rel_err)}  max abs err {_fmt(o.max_abs_err)}"
                 + (f"  ({o.detail})" if o.detail else ""))
    if res.gradients is not None:
        g = res.gradients
        L.append(f"  gradients ({g.get('parameters', '?')} parameters): {'pass' if g['ok'] else 'FAIL'}  "
                 f"worst rel err {_fmt(g.get('worst_rel_err'))}" + (f"  ({g['detail']})" if g["detail"] else ""))
    if res.training is not None:
        t = res.training
        curve = ""
        if t.get("cpu_loss"):
            curve = "  loss cpu " + " ".join(_fmt(x, 4) for x in t["cpu_loss"]) + " | target " + \
                    " ".join(_fmt(x, 4) for x in t["target_loss"])
        L.append(f"  {t['steps']}-step SGD: {'pass' if t['ok'] else 'FAIL'}{curve}"
                 + (f"  ({t['detail']})" if t["detail"] and not t["ok"] else ""))
    if res.first_divergent_detail:
        L.append(f"  first divergent op: {res.first_divergent_op or '-'}: {res.first_divergent_detail[:400]}")
    if res.compile:
        c = res.compile
        L += ["", f"compile (torch.compile backend={c['backend']!r}, dynamic=False): {c['compiles']} compile(s), "
                  f"{c['recompiles']} recompile(s), first call {_fmt(c['compile_s'])} s"]
        wl = max([len(s.inputs) for s in res.shapes] + [6])
        L.append(f"  {'inputs':<{wl}}  {'compiles':>8}  {'recompiled':>10}  {'parity':>6}  {'p50 ms':>8}  {'p99 ms':>8}")
        for s in res.shapes:
            par = "-" if s.parity_ok is None else ("pass" if s.parity_ok else "FAIL")
            L.append(f"  {s.inputs:<{wl}}  {s.compiles:>8}  {'yes' if s.recompiled else 'no':>10}  {par:>6}  "
                     f"{_fmt(s.p50_ms):>8}  {_fmt(s.p99_ms):>8}" + (f"  error: {s.error[:160]}" if s.error else ""))
    L += ["", verdict_line(res)]
    for i, b in enumerate(res.blockers, 1):
        L.append(f"  {i}. {b[:400]}")
    if timings and res.timings:
        parts = ", ".join(f"{k.removesuffix('_s')} {v:.2f}" for k, v in res.timings.items() if k != "total_s")
        L.append(f"audit took {res.timings.get('total_s', 0):.1f} s ({parts})")
    return L


def write_json(res: AuditResult, path: str | Path) -> None:
    Path(path).write_text(json.dumps(res.as_json(), indent=1, allow_nan=False))


def write_html(res: AuditResult, out_dir: str | Path) -> Path:
    """``out_dir/index.html`` in the report's style (its base template and assets)."""
    import datetime as dt

    from reports.html import ASSETS, make_environment, write_asset

    out = Path(out_dir)
    (out / "assets").mkdir(parents=True, exist_ok=True)
    for name in ASSETS:
        write_asset(name, out / "assets" / name)
    env = make_environment()
    html = env.get_template("audit.html").render(
        title=f"Audit: {res.model} on {res.target} {res.build}", root="", nav=[],
        generated_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        db_label=(res.db or {}).get("path") or "no database", res=res, verdict=verdict_line(res),
        model_ops=[o for o in res.ops if o.name not in PLUMBING], fmt=_fmt,
        st={"native": "pass", "fallback": "pass_fallback", "failing": "error"})
    page = out / "index.html"
    page.write_text(html)
    return page


# -- the whole command, as the CLI calls it ---------------------------------------------------
def run_audit(model_ref: str, *, inputs_ref: str | None = None, input_shapes: tuple[str, ...] = (),
              shapes: tuple[str, ...] = (), target_name: str = "neuron-emu", build: str | None = None,
              train: bool = False, db_path: str | None = None, seed: int = 0,
              timed_iters: int = 5) -> AuditResult:
    from .targets import get_target

    shape_specs = parse_shape_set(";".join(input_shapes)) if input_shapes else None
    extra = [parse_shape_set(s) for s in shapes]
    model, inputs = load_model(model_ref, seed)
    if inputs_ref:
        fn = load_callable(inputs_ref)
        try:
            inputs = _as_inputs(fn(), inputs_ref)
        except AuditInputError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise AuditInputError(f"{inputs_ref} raised {type(exc).__name__}: {exc}") from None
    elif shape_specs:
        inputs = make_inputs(shape_specs, model, seed)
    if inputs is None:
        raise AuditInputError(f"{model_ref} returned no example inputs: give --input-shape or --inputs")
    target = get_target(target_name, build)
    sets = [make_inputs(s, model, seed + 1 + i) for i, s in enumerate(extra)]
    cfg = AuditConfig(train=train, shape_sets=sets, shape_labels=[_label(x) for x in sets], db_path=db_path,
                      model_label=model_ref, seed=seed, timed_iters=timed_iters)
    return audit(model, inputs, target, cfg)
