"""What an audit reports: per-op rows, risks, parity, shape rows, the whole result; its configuration."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

# Overloads every device run reaches (copies to/from the device, allocation): not model ops.
PLUMBING = frozenset({"aten::_copy_from.default", "aten::empty_strided.default", "aten::empty.memory_format",
                      "aten::_to_copy.default", "aten::copy_.default", "aten::_copy_from_and_resize.default",
                      "aten::_local_scalar_dense.default",
                      "aten::_assert_tensor_metadata.default"})


class AuditInputError(ValueError):
    """Bad audit input (module path, callable, shapes, a model whose CPU run fails): exit 2."""


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
    name: str = ""  # the leaf's path: "logits", "cache.layers[0].keys", "output[1]" (conformance.structure)


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
    # the error causes its failures fall into (conformance.triage.causes.explain): key, text,
    # where, the knowledge file's explanation and workaround, the sweep's builds that show it
    causes: list[dict[str, Any]] = field(default_factory=list)
    # ``--generate``: greedy decoding against the CPU per dtype x mode x bucket
    # (conformance.audit.generate): {"settings", "rows", "summary"}
    generation: dict[str, Any] | None = None
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


@dataclass(frozen=True)
class GenerateConfig:
    """``conformance audit --generate``: what to decode (empty/None: generation.toml's defaults)."""

    buckets: tuple[int, ...] = ()
    new_tokens: int | None = None
    modes: tuple[str, ...] = ("eager", "compile")
    dtypes: tuple[str, ...] = ("float32",)


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
    generate: GenerateConfig | None = None  # greedy decoding of a causal LM as well
