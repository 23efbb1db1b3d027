"""Validated loaders for the small declarative data files in ``conformance/data/``.

Every data file goes through a loader that checks each key and value and, on bad input, raises
one :class:`DataFileError` naming file, key, value and what is accepted (the ledger has its own
loader in :mod:`conformance.check.ledger`, the emulator's builds theirs in ``neuron_emu.manifest``).

Example::

    >>> from conformance.datafiles import canaries
    >>> c = canaries()
    >>> c.dtype, c.samples > 0, "add" in c.ops
    ('float32', True, True)
"""

from __future__ import annotations

import functools
import math
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DATA = Path(__file__).parent / "data"
CANARIES = DATA / "canaries.toml"
COMPARATORS = DATA / "comparators.toml"
MODEL_TOLERANCES = DATA / "model_tolerances.toml"

#: The semantic comparators ``comparators.toml`` may name (``allclose`` is the default for the rest).
COMPARATOR_KINDS = ("meta", "random", "indices", "decomposition")
_DTYPES = ("float64", "float32", "bfloat16", "float16", "complex64", "complex128", "int64", "int32", "int16",
           "int8", "uint8", "bool")


class DataFileError(ValueError):
    """A malformed data file; the message names file, key and value."""


def _bad(path: Path, key: str, value: Any, accepted: str) -> DataFileError:
    return DataFileError(f"{path}: {key} = {value!r} is not valid; expected {accepted}")


def read_toml(path: Path) -> dict[str, Any]:
    """The TOML table of ``path``; unreadable, non-UTF-8 or invalid TOML is one DataFileError."""
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise DataFileError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise DataFileError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise DataFileError(f"{path}: not valid TOML ({exc})") from None


def _keys(path: Path, where: str, raw: Any, required: set[str], optional: set[str] = frozenset()) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise _bad(path, where or "(file)", raw, "a table")
    prefix = f"{where}." if where else ""
    unknown = sorted(set(raw) - required - optional)
    if unknown:
        raise _bad(path, prefix + unknown[0], raw[unknown[0]], f"one of the keys {', '.join(sorted(required | optional))}")
    missing = sorted(required - set(raw))
    if missing:
        raise DataFileError(f"{path}: {prefix}{missing[0]} is missing")
    return raw


def _names(path: Path, key: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v.strip() for v in value):
        raise _bad(path, key, value, "a non-empty list of non-blank strings")
    return tuple(value)


def _text(path: Path, key: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _bad(path, key, value, "a non-blank string")
    return value


def _rtol(path: Path, key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise _bad(path, key, value, "a finite number >= 0")
    return float(value)


# -- canaries.toml --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Canaries:
    """Known-good OpInfo ops run first in every run (see the file for why)."""

    ops: tuple[str, ...]
    dtype: str
    samples: int


@functools.cache
def canaries(path: Path = CANARIES) -> Canaries:
    raw = _keys(path, "", read_toml(path), {"ops", "dtype", "samples"})
    if raw["dtype"] not in _DTYPES:
        raise _bad(path, "dtype", raw["dtype"], f"one of {', '.join(_DTYPES)}")
    n = raw["samples"]
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise _bad(path, "samples", n, "an integer >= 1")
    return Canaries(_names(path, "ops", raw["ops"]), raw["dtype"], n)


# -- comparators.toml -----------------------------------------------------------------------------
@dataclass(frozen=True)
class ComparatorRule:
    kind: str  # one of COMPARATOR_KINDS
    reason: str
    ops: tuple[str, ...]  # globs over OpInfo names


@functools.cache
def comparators(path: Path = COMPARATORS) -> dict[str, ComparatorRule]:
    """The semantic comparator of each listed OpInfo glob, by comparator kind (every kind present)."""
    data = read_toml(path)
    out: dict[str, ComparatorRule] = {}
    for kind, raw in data.items():
        if kind not in COMPARATOR_KINDS:
            raise _bad(path, kind, raw, f"tables named {', '.join(COMPARATOR_KINDS)}")
        entry = _keys(path, kind, raw, {"reason", "ops"})
        out[kind] = ComparatorRule(kind, _text(path, f"{kind}.reason", entry["reason"]),
                                   _names(path, f"{kind}.ops", entry["ops"]))
    missing = [k for k in COMPARATOR_KINDS if k not in out]
    if missing:
        raise DataFileError(f"{path}: table [{missing[0]}] is missing (every comparator kind must be listed)")
    return out


# -- model_tolerances.toml ------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelFloor:
    """A model-level tolerance floor for targets and dtypes matching the globs (see the file)."""

    target: str
    dtype: str
    fwd_rtol: float
    grad_rtol: float
    loss_rtol: float
    reason: str


@functools.cache
def model_floors(path: Path = MODEL_TOLERANCES) -> tuple[ModelFloor, ...]:
    data = _keys(path, "", read_toml(path), set(), {"floor"})
    raw = data.get("floor", [])
    if not isinstance(raw, list):
        raise _bad(path, "floor", raw, "an array of tables ([[floor]])")
    floors = []
    for i, f in enumerate(raw):
        where = f"floor[{i}]"
        e = _keys(path, where, f, {"fwd_rtol", "grad_rtol", "loss_rtol", "reason"}, {"target", "dtype"})
        floors.append(ModelFloor(
            target=_text(path, f"{where}.target", e.get("target", "*")),
            dtype=_text(path, f"{where}.dtype", e.get("dtype", "*")),
            fwd_rtol=_rtol(path, f"{where}.fwd_rtol", e["fwd_rtol"]),
            grad_rtol=_rtol(path, f"{where}.grad_rtol", e["grad_rtol"]),
            loss_rtol=_rtol(path, f"{where}.loss_rtol", e["loss_rtol"]),
            reason=_text(path, f"{where}.reason", e["reason"])))
    return tuple(floors)


# -- generation.toml ------------------------------------------------------------------------------
GENERATION = DATA / "generation.toml"


@dataclass(frozen=True)
class Bound:
    target: str
    dtype: str
    value: float  # loglik: nats per token; logits: normwise rtol
    reason: str


@dataclass(frozen=True)
class Generation:
    """The generation lane's settings (see the file for what each means)."""

    buckets: tuple[int, ...]
    new_tokens: int
    prompts: int
    continuation: int
    timing_repeats: int
    initializer_range: float
    near_tie_factor: float
    near_tie_reason: str
    loglik: tuple[Bound, ...]
    logits: tuple[Bound, ...]

    @staticmethod
    def _last(bounds: tuple[Bound, ...], target: str, dtype: str) -> float:
        from fnmatch import fnmatchcase

        found = [b for b in bounds if fnmatchcase(target, b.target) and fnmatchcase(dtype, b.dtype)]
        return found[-1].value if found else 0.0

    def max_shift(self, target: str, dtype: str) -> float:
        """The log-likelihood bound (nats per token) of the last entry matching ``target`` and ``dtype``."""
        return self._last(self.loglik, target, dtype)

    def logits_rtol(self, target: str, dtype: str) -> float:
        """The step logits' normwise tolerance of the last entry matching ``target`` and ``dtype``."""
        return self._last(self.logits, target, dtype)


def _count(path: Path, key: str, value: Any, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise _bad(path, key, value, f"an integer >= {low}")
    return value


@functools.cache
def generation(path: Path = GENERATION) -> Generation:
    ints = {"new_tokens", "prompts", "continuation", "timing_repeats"}
    raw = _keys(path, "", read_toml(path), {"buckets", "initializer_range", "near_tie", *ints}, {"loglik", "logits"})
    buckets = raw["buckets"]
    if (not isinstance(buckets, list) or not buckets
            or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in buckets)
            or len(set(buckets)) != len(buckets)):
        raise _bad(path, "buckets", buckets, "a non-empty list of distinct prompt lengths >= 1")
    nt = _keys(path, "near_tie", raw["near_tie"], {"factor", "reason"})
    return Generation(tuple(sorted(buckets)), *(_count(path, k, raw[k], 0 if k == "timing_repeats" else 1)
                                                for k in ("new_tokens", "prompts", "continuation", "timing_repeats")),
                      _rtol(path, "initializer_range", raw["initializer_range"]),
                      _rtol(path, "near_tie.factor", nt["factor"]), _text(path, "near_tie.reason", nt["reason"]),
                      _bounds(path, raw, "loglik", "max_shift"), _bounds(path, raw, "logits", "rtol"))


def _bounds(path: Path, raw: dict[str, Any], table: str, key: str) -> tuple[Bound, ...]:
    entries = raw.get(table, [])
    if not isinstance(entries, list):
        raise _bad(path, table, entries, f"an array of tables ([[{table}]])")
    out = []
    for i, b in enumerate(entries):
        where = f"{table}[{i}]"
        e = _keys(path, where, b, {key, "reason"}, {"target", "dtype"})
        out.append(Bound(_text(path, f"{where}.target", e.get("target", "*")),
                         _text(path, f"{where}.dtype", e.get("dtype", "*")),
                         _rtol(path, f"{where}.{key}", e[key]), _text(path, f"{where}.reason", e["reason"])))
    return tuple(out)


# -- upstream_inductor.toml, upstream_onnxruntime.toml, upstream_triage.toml ----------------------
# The upstream projects' own expected failures and skips (PyTorch's for Inductor, ONNX Script's
# for the ONNX exporter's torch_lib run in ONNX Runtime), and what a standalone check showed about
# each (the triage against a run is conformance.triage.upstream).
UPSTREAM_INDUCTOR = DATA / "upstream_inductor.toml"
UPSTREAM_ONNXRUNTIME = DATA / "upstream_onnxruntime.toml"
UPSTREAM_FILES = (UPSTREAM_INDUCTOR, UPSTREAM_ONNXRUNTIME)
UPSTREAM_TRIAGE = DATA / "upstream_triage.toml"
#: how much of an op x dtype an upstream fact covers: every sample, or some (upstream matches them)
UPSTREAM_SAMPLES = ("all", "some")
UPSTREAM_DTYPES = ("bool", "float16", "bfloat16", "float32", "float64", "int32", "int64", "uint8", "complex64",
                   "complex128")
UPSTREAM_DEVICES = ("cpu", "cuda", "xpu")
#: what the triage file may say of an expectation (re-found and the rest come from a run)
UPSTREAM_CHECKED = ("stale", "holds", "untestable")
#: which samples a standalone check of an expectation ran: every sample of the OpInfo, or only
#: those the expectation's ``matchers`` pick (a fact of some samples whose list says which)
UPSTREAM_CHECKED_ON = ("every", "matched")


@dataclass(frozen=True)
class Source:
    name: str
    repo: str
    commit: str
    path: str
    note: str = ""
    # the harness targets whose runs this list is about (empty: any); picks a run's default list
    targets: tuple[str, ...] = ()
    # the harness variants upstream's test exercises (empty: all): only their statuses re-find a fact
    variants: tuple[str, ...] = ()

    def __str__(self) -> str:
        return f"{self.repo}@{self.commit} {self.path}"


@dataclass(frozen=True)
class Expectation:
    """One upstream fact: ``op`` in ``dtype`` on ``device`` is an expected failure or a skip."""

    op: str
    dtype: str
    expectation: str  # xfail | skip
    device: str
    source: Source
    reason: str = ""
    samples: str = "all"  # UPSTREAM_SAMPLES: "some" when upstream expects it of matched samples only
    # a "some" fact's samples, as upstream's test data picks them: Python expressions of ``sample``
    # (an OpInfo SampleInput, with ``torch``), any one true picks it. Empty: the list does not say
    # which samples, so a standalone check runs every sample and can show only that the failure
    # holds on some sample (maybe not one upstream means): conformance.triage.upstream.claim
    matchers: tuple[str, ...] = ()


@dataclass(frozen=True)
class Checked:
    """What was shown about one expectation outside the harness (``CHECKED``), and how."""

    source: str
    op: str
    dtype: str
    outcome: str
    reason: str
    evidence: str
    # the targets the note holds for (empty: every target); e.g. a failure only Inductor's
    # implicit_fallbacks=False shows is untestable on ``inductor`` and testable on ``inductor-strict``
    targets: tuple[str, ...] = ()
    # UPSTREAM_CHECKED_ON: the samples the check ran ("matched": only those the fact's matchers pick)
    checked_on: str = "every"

    def holds_for(self, target: str | None) -> bool:
        return not self.targets or target is None or target in self.targets


def _choice(path: Path, key: str, value: object, accepted: tuple[str, ...]) -> str:
    if value not in accepted:
        raise _bad(path, key, value, f"one of {', '.join(accepted)}")
    return str(value)


def _paths(paths: Path | tuple[Path, ...]) -> tuple[Path, ...]:
    return (paths,) if isinstance(paths, Path) else tuple(paths)


@functools.cache
def upstream_expectations(paths: Path | tuple[Path, ...] = UPSTREAM_FILES) -> tuple[Expectation, ...]:
    """Every upstream fact of every file, one per source x device x op x dtype (a duplicate is an
    error; a source name is one list across all files)."""
    out: list[Expectation] = []
    named: dict[str, Path] = {}
    for path in _paths(paths):
        facts = _upstream_file(path)
        for name in dict.fromkeys(e.source.name for e in facts):
            if name in named:
                raise _bad(path, f"source.{name}", name, f"a source name not used by another file ({named[name]})")
            named[name] = path
        out.extend(facts)
    return tuple(out)


def _upstream_file(path: Path) -> tuple[Expectation, ...]:
    data = _keys(path, "", read_toml(path), {"source"}, {"xfail", "skip"})
    sources: dict[str, Source] = {}
    if not isinstance(data["source"], dict) or not data["source"]:
        raise _bad(path, "source", data["source"], "tables [source.NAME] with repo, commit and path")
    for name, raw in data["source"].items():
        e = _keys(path, f"source.{name}", raw, {"repo", "commit", "path"}, {"note", "targets", "variants"})
        commit = _text(path, f"source.{name}.commit", e["commit"])
        if len(commit) != 40 or any(ch not in "0123456789abcdef" for ch in commit):
            raise _bad(path, f"source.{name}.commit", commit, "a full 40-digit lowercase hex commit")
        sources[name] = Source(name, _text(path, f"source.{name}.repo", e["repo"]), commit,
                               _text(path, f"source.{name}.path", e["path"]),
                               _text(path, f"source.{name}.note", e["note"]) if "note" in e else "",
                               _names(path, f"source.{name}.targets", e["targets"]) if "targets" in e else (),
                               _names(path, f"source.{name}.variants", e["variants"]) if "variants" in e else ())
    out: list[Expectation] = []
    seen: set[tuple[str, str, str, str]] = set()
    for kind in ("xfail", "skip"):
        tables = data.get(kind, [])
        if not isinstance(tables, list):
            raise _bad(path, kind, tables, f"an array of tables ([[{kind}]])")
        for i, raw in enumerate(tables):
            where = f"{kind}[{i}]"
            e = _keys(path, where, raw, {"source", "device", "ops", "dtypes"}, {"reason", "samples", "matchers"})
            if e["source"] not in sources:
                raise _bad(path, f"{where}.source", e["source"], f"a [source.NAME] table: {', '.join(sources)}")
            device = _choice(path, f"{where}.device", e["device"], UPSTREAM_DEVICES)
            reason = _text(path, f"{where}.reason", e["reason"]) if "reason" in e else ""
            samples = _choice(path, f"{where}.samples", e["samples"], UPSTREAM_SAMPLES) if "samples" in e else "all"
            matchers = _matchers(path, f"{where}.matchers", e["matchers"], samples) if "matchers" in e else ()
            for dtype in _names(path, f"{where}.dtypes", e["dtypes"]):
                _choice(path, f"{where}.dtypes", dtype, UPSTREAM_DTYPES)
                for op in _names(path, f"{where}.ops", e["ops"]):
                    key = (e["source"], device, op, dtype)
                    if key in seen:
                        raise _bad(path, f"{where}.ops", op, f"an op listed once per source, device and dtype "
                                                            f"({op} {dtype} is listed twice in {e['source']})")
                    seen.add(key)
                    out.append(Expectation(op, dtype, kind, device, sources[e["source"]], reason, samples, matchers))
    return tuple(out)


def _matchers(path: Path, key: str, value: Any, samples: str) -> tuple[str, ...]:
    """A "some" fact's sample matchers: each a Python expression of ``sample``."""
    import ast

    if samples != "some":
        raise _bad(path, key, value, 'matchers only with samples = "some" (a fact of every sample matches them all)')
    for text in _names(path, key, value):
        try:
            ast.parse(text, mode="eval")
        except SyntaxError as exc:
            raise _bad(path, key, text, f"a Python expression of `sample` ({exc.msg})") from None
    return tuple(value)


@functools.cache
def upstream_checks(path: Path = UPSTREAM_TRIAGE, facts: Path | tuple[Path, ...] = UPSTREAM_FILES,
                    ) -> dict[tuple[str, str, str], Checked]:
    """(source, op, dtype) -> what was shown about that expectation outside the harness."""
    known = {(e.source.name, e.op, e.dtype): e for e in upstream_expectations(facts)}
    files = " or ".join(p.name for p in _paths(facts))
    data = _keys(path, "", read_toml(path), set(), {"check"})
    tables = data.get("check", [])
    if not isinstance(tables, list):
        raise _bad(path, "check", tables, "an array of tables ([[check]])")
    out: dict[tuple[str, str, str], Checked] = {}
    for i, raw in enumerate(tables):
        where = f"check[{i}]"
        e = _keys(path, where, raw, {"source", "ops", "dtype", "outcome", "reason", "evidence"},
                  {"targets", "checked_on"})
        targets = _names(path, f"{where}.targets", e["targets"]) if "targets" in e else ()
        checked_on = (_choice(path, f"{where}.checked_on", e["checked_on"], UPSTREAM_CHECKED_ON)
                      if "checked_on" in e else "every")
        outcome = _choice(path, f"{where}.outcome", e["outcome"], UPSTREAM_CHECKED)
        dtype = _choice(path, f"{where}.dtype", e["dtype"], UPSTREAM_DTYPES)
        for op in _names(path, f"{where}.ops", e["ops"]):
            key = (e["source"], op, dtype)
            if key not in known:
                raise _bad(path, f"{where}.ops", op, f"an op {files} lists for source {e['source']!r} "
                                                    f"in {dtype}")
            if key in out:
                raise _bad(path, f"{where}.ops", op, "an op checked once per source and dtype")
            if checked_on == "matched" and not known[key].matchers:
                # the list cannot say which samples upstream means: the check cannot have run only those
                raise _bad(path, f"{where}.checked_on", checked_on,
                           f"'every' for {op}: {files} records no matchers for it, so no check ran only its "
                           f"matched samples")
            out[key] = Checked(e["source"], op, dtype, outcome, _text(path, f"{where}.reason", e["reason"]),
                               _text(path, f"{where}.evidence", e["evidence"]), targets, checked_on)
    return out


# -- no_cpu_reference.toml -------------------------------------------------------------------------
# Overloads the CPU cannot compute although the registry gives them a CPU-side kernel: a composite
# (an out= wrapper, a functional or *_copy twin) whose CPU path calls an op with no CPU kernel. A
# fact of the torch release, learned once by the schema search on the CPU
# (tools/no_cpu_reference.py) and read by conformance.catalog.overloads.
NO_CPU_REFERENCE = DATA / "no_cpu_reference.toml"
_OVERLOAD = re.compile(r"aten::[A-Za-z_][A-Za-z0-9_]*\.[A-Za-z_][A-Za-z0-9_]*")
_OP = re.compile(r"aten::[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?")
_RELEASE = re.compile(r"[0-9]+\.[0-9]+\.[0-9]+")


@dataclass(frozen=True)
class NoCpuReference:
    """For one torch release: overload -> the op its CPU path calls that has no CPU kernel."""

    path: Path
    torch: str  # the release, without a local label ("2.13.0", not "2.13.0+cpu")
    overloads: dict[str, str]


@functools.cache
def no_cpu_reference(path: Path = NO_CPU_REFERENCE) -> NoCpuReference:
    raw = _keys(path, "", read_toml(path), {"torch", "overloads"})
    release = raw["torch"]
    if not isinstance(release, str) or not _RELEASE.fullmatch(release):
        raise _bad(path, "torch", release, 'a torch release such as "2.13.0" (no local label like +cpu)')
    table = raw["overloads"]
    if not isinstance(table, dict):
        raise _bad(path, "overloads", table, 'a table of "aten::name.overload" = "aten::op"')
    out: dict[str, str] = {}
    for name, inner in table.items():
        if not _OVERLOAD.fullmatch(name):
            raise _bad(path, f'overloads."{name}"', inner, 'a key spelled "aten::name.overload" '
                                                          '(".default" when the op has no overload name)')
        if not isinstance(inner, str) or not _OP.fullmatch(inner):
            raise _bad(path, f'overloads."{name}"', inner, 'the op without a CPU kernel that it calls, "aten::op"')
        out[name] = inner
    return NoCpuReference(path, release, out)


# The validators other loaders of declarative data share (the knowledge file, the cause rules).
bad_value = _bad
check_keys = _keys
nonblank = _text
