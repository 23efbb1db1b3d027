"""The signature of a failing item: what its failure says, with what varies between the items of
one cause taken out. Items with equal signatures share a cause (:mod:`conformance.triage.causes`
groups them, stores them and keeps their history).

A signature has four parts:

- ``kind``: ``error`` for an item the target refused by raising (statuses error and
  unsupported*, and a contract check that failed because the target raised), else the item's
  status (``crash``, ``mismatch``, ...), or ``contract:<name>`` for the first contract a
  ``contract`` item failed otherwise;
- ``exc``: the exception type its message starts with (``RuntimeError``), when it has one;
- ``pattern``: the message normalised by the rules of ``conformance/data/cause_rules.toml``
  (numbers, shapes, addresses, paths, versions and op names become placeholders; repeated
  clauses are said once). A value mismatch has no useful message (its numbers are the item's),
  so its pattern is the *class* of its error, read from the stored evidence: wrong dtype, wrong
  shape, NaN/inf where the CPU has numbers (or the reverse), or values that differ;
- ``locus``: where the failure happens, when the message cannot say it: for a value mismatch the
  ATen overload blamed for it (an op item's most suspicious native overload, see
  :func:`conformance.triage.causes.blame`; a model's first divergent op), for a crash or a timeout
  the op or model family that died, for a contract whose detail describes the op's own results
  (variants that differ, inputs it changes) the op. Messages that name their op (an unsupported layout, a
  compiler error) keep the op out of the cause: the ops are its reach.

The ``key`` is a stable hash of the four parts, so a cause keeps its key across builds, runs,
targets and databases (the knowledge file, ``conformance/data/causes.toml``, may name it).

Example::

    >>> s = op_signature({"status": "unsupported_layout", "error": "NotImplementedError: Could not run "
    ...     "'aten::mul.Tensor' on the neuron device with sparse tensors: the neuron device of Neuron SDK "
    ...     "build 2.33.0 supports only strided tensors"})
    >>> s.exc, s.pattern
    ('NotImplementedError', "Could not run '<op>' on the neuron device with sparse tensors: the neuron device of Neuron SDK build <version> supports only strided tensors")
    >>> s.key == op_signature({"status": "unsupported_layout", "error": "NotImplementedError: Could not run "
    ...     "'aten::sum.default' on the neuron device with sparse tensors: the neuron device of Neuron SDK "
    ...     "build 2.31.0 supports only strided tensors"}).key
    True
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conformance.datafiles import DATA, DataFileError, read_toml
from conformance.datafiles import bad_value as _bad
from conformance.datafiles import check_keys as _keys
from conformance.datafiles import nonblank as _text

CAUSE_RULES = DATA / "cause_rules.toml"
PATTERN_CHARS = 300  # of a normalised message: what a cause is named by (long lists vary in their tail)
#: The contracts in the order a ``contract`` item's first failure is taken (opdb.queries_contracts.CONTRACTS).
CONTRACT_ORDER = ("metadata", "aliasing", "noncontiguous", "variants", "out", "errors", "determinism")
#: Statuses whose items the target refused by raising: one kind, ``error``, so that the same
#: exception is one cause whichever status the verdict gave it (the statuses stay in its reach).
_RAISING = {"unsupported": "error", "unsupported_dtype": "error", "unsupported_layout": "error"}
# a contract detail that quotes what the target raised: "on the target they raise X: ...",
# "torch.eq(output, output) raises X: ...", "the method raises on the target: X: ..."
_TARGET_RAISES = re.compile(r"\braises?(?: on the target)?:? ((?:[A-Za-z_]\w*\.)*[A-Z]\w*: .*)$", re.S)
_RAISES = re.compile(r"\b(?:[A-Z]\w*(?:Error|Exception)|raises?)\b")
# the exception type a message starts with: a (dotted) CamelCase name right before ": "
_EXC = re.compile(r"^((?:[A-Za-z_]\w*\.)*[A-Z][A-Za-z0-9_]*)(?::\s+|:?\s*$)")


@dataclass(frozen=True)
class Rules:
    """The normaliser's rules (``cause_rules.toml``) and their ``version`` (a hash of the file)."""

    strips: tuple[re.Pattern[str], ...]
    replaces: tuple[tuple[re.Pattern[str], str], ...]
    version: str
    crashes: tuple[tuple[re.Pattern[str], bool], ...] = ()  # (line pattern, is a stack frame)
    never_blamed: tuple[str, ...] = ()  # globs of overloads a mismatch is never blamed on


def _regex(path: Path, key: str, value: Any) -> re.Pattern[str]:
    text = _text(path, key, value)
    try:
        return re.compile(text)
    except re.error as exc:
        raise _bad(path, key, value, f"a Python regular expression ({exc})") from None


@functools.cache
def rules(path: Path = CAUSE_RULES) -> Rules:
    """The validated rules of ``path``; a bad rule is one DataFileError naming file, rule and value."""
    raw = read_toml(path)
    _keys(path, "", raw, {"strip", "replace"}, {"crash", "blame"})
    strips, replaces = [], []
    for kind, out in (("strip", strips), ("replace", replaces)):
        if not isinstance(raw[kind], list) or not raw[kind]:
            raise _bad(path, kind, raw[kind], "a non-empty array of tables [[" + kind + "]]")
        for i, entry in enumerate(raw[kind]):
            where = f"{kind}[{i}]"
            _keys(path, where, entry, {"pattern", "example"} | ({"why"} if kind == "strip" else {"placeholder"}))
            rx = _regex(path, f"{where}.pattern", entry["pattern"])
            example = _text(path, f"{where}.example", entry["example"])
            if kind == "strip":
                _text(path, f"{where}.why", entry["why"])
                out.append(rx)
                changed = rx.sub("", example) != example
            else:
                placeholder = entry["placeholder"]
                if not isinstance(placeholder, str) or not placeholder:
                    raise _bad(path, f"{where}.placeholder", placeholder, "a non-empty string")
                try:
                    changed = rx.sub(placeholder, example) != example
                except (re.error, IndexError) as exc:
                    raise _bad(path, f"{where}.placeholder", placeholder, f"a replacement text ({exc})") from None
                out.append((rx, placeholder))
            if not changed:
                raise _bad(path, f"{where}.example", example, "a text the rule changes (it shows what the rule is for)")
    crashes = []
    for i, entry in enumerate(raw.get("crash", [])):
        where = f"crash[{i}]"
        _keys(path, where, entry, {"pattern", "frame", "example"})
        rx = _regex(path, f"{where}.pattern", entry["pattern"])
        if not isinstance(entry["frame"], bool):
            raise _bad(path, f"{where}.frame", entry["frame"], "true (a stack frame) or false (an abort message)")
        example = _text(path, f"{where}.example", entry["example"])
        if not rx.search(example):
            raise _bad(path, f"{where}.example", example, "a line the pattern matches (it shows what the rule is for)")
        crashes.append((rx, entry["frame"]))
    never: tuple[str, ...] = ()
    if "blame" in raw:
        blame = _keys(path, "blame", raw["blame"], {"never", "why"})
        _text(path, "blame.why", blame["why"])
        if not isinstance(blame["never"], list) or not all(isinstance(g, str) and g.startswith("aten::")
                                                           for g in blame["never"]):
            raise _bad(path, "blame.never", blame["never"], "a list of globs over ATen overloads (aten::...)")
        never = tuple(blame["never"])
    version = hashlib.blake2b(path.read_bytes(), digest_size=6).hexdigest()
    return Rules(tuple(strips), tuple(replaces), version, tuple(crashes), never)


MAX_FRAMES = 3  # top frames of a native stack that name a crash


def crash_report(output: str | None, rx: Rules | None = None) -> tuple[list[str], str]:
    """What a crashed worker's output says of the crash: its top native stack frames (at most
    :data:`MAX_FRAMES`) and the first abort message, each normalised."""
    rx = rx or rules()
    frames: list[str] = []
    abort = ""
    for line in (output or "").splitlines():
        line = line.strip()
        for pattern, is_frame in rx.crashes:
            m = pattern.search(line)
            if m is None:
                continue
            text = normalise(m.group(1) if m.groups() else m.group(0), rx)
            if is_frame and len(frames) < MAX_FRAMES:
                frames.append(text)
            elif not is_frame and not abort:
                abort = text
            break
    return frames, abort


def _crash(status: str, row: dict[str, Any], where: str, rx: Rules | None) -> Signature:
    """A crash or timeout: named by its top native frames when the worker printed a stack, else
    by the op (or family) that died; an abort message joins the pattern either way."""
    sig = _message(status, row.get("error") or "", rx=rx)
    frames, abort = crash_report(row.get("output"), rx)
    pattern = sig.pattern + (f" | {abort}" if abort else "")
    if frames:
        return Signature(status, sig.exc, f"{pattern} | at {' < '.join(frames)}")
    return Signature(status, sig.exc, pattern, where)


def normalise(text: str, rx: Rules | None = None) -> str:
    """``text`` with the item-specific parts stripped and replaced by placeholders, repeated
    clauses (``; ``-separated) said once, cut to :data:`PATTERN_CHARS`."""
    rx = rx or rules()
    for strip in rx.strips:
        text = strip.sub("", text)
    for pattern, placeholder in rx.replaces:
        text = pattern.sub(placeholder, text)
    clauses = list(dict.fromkeys(c.strip() for c in text.split("; ") if c.strip()))
    return "; ".join(clauses)[:PATTERN_CHARS].strip()


@dataclass(frozen=True)
class Signature:
    kind: str
    exc: str
    pattern: str
    locus: str = ""

    @property
    def key(self) -> str:
        basis = "\x1f".join((self.kind, self.exc, self.pattern, self.locus))
        return "C" + hashlib.blake2b(basis.encode(), digest_size=5).hexdigest()

    def text(self) -> str:
        """One line a person reads: ``mismatch at aten::sin.default: values differ``."""
        where = f" at {self.locus}" if self.locus else ""
        exc = f"{self.exc}: " if self.exc else ""
        return f"{self.kind}{where}: {exc}{self.pattern}"

    def as_json(self) -> dict[str, str]:
        return {"key": self.key, "kind": self.kind, "exc": self.exc, "pattern": self.pattern, "locus": self.locus}


def _message(kind: str, text: str, locus: str = "", rx: Rules | None = None) -> Signature:
    norm = normalise(text or "", rx)
    m = _EXC.match(norm)
    exc = m.group(1) if m else ""
    pattern = norm[m.end():] if m else norm
    return Signature(kind, exc, pattern or "(no message)", locus)


def _json(value: Any) -> Any:
    if isinstance(value, (dict, list)) or value is None:
        return value
    try:
        return json.loads(value)
    except (TypeError, ValueError):
        return None


#: A double-precision item whose error is what computing it in single precision gives (the sweep's
#: single-precision twin, ``proof.single_precision``): the dtype's cause, at no overload.
SINGLE_PRECISION = "values of single precision in double precision"
#: What an op item's value mismatch is, from its stored evidence (the first that holds).
MISMATCH_CLASSES = ("wrong dtype", "wrong shape", "NaN/inf differ", SINGLE_PRECISION, "values differ")


def mismatch_class(row: dict[str, Any], single: bool | None = None) -> str:
    """The class of an op item's value mismatch (:data:`MISMATCH_CLASSES`, or the semantic
    comparator that judged it). ``single``: whether single precision explains a double-precision
    item, as its localisation found kernel by kernel (None: as its whole-item twin,
    ``proof.single_precision``, found)."""
    if row.get("dtype_ok") == 0:
        return "wrong dtype"
    if row.get("shape_ok") == 0:
        return "wrong shape"
    fp = _json(row.get("fingerprint")) or {}
    if row.get("nan_agree") == 0 or fp.get("nonfinite"):
        return "NaN/inf differ"
    if single is None:
        single = bool(((_json(row.get("proof")) or {}).get("single_precision") or {}).get("explains"))
    if single:
        return SINGLE_PRECISION
    comparator = row.get("comparator") or "allclose"
    return "values differ" if comparator == "allclose" else f"values differ ({comparator} comparator)"


def first_contract(row: dict[str, Any]) -> tuple[str, str]:
    """The first failed contract of a ``contract`` item (in :data:`CONTRACT_ORDER`) and its detail."""
    checks = _json(row.get("contracts")) or {}
    failed = [c for c in (row.get("contract_failed") or "").split(",") if c] or [
        name for name, c in checks.items() if isinstance(c, dict) and c.get("outcome") == "fail"]
    if not failed:
        return "", row.get("error") or ""
    name = sorted(failed, key=lambda c: (CONTRACT_ORDER.index(c) if c in CONTRACT_ORDER else 99, c))[0]
    detail = (checks.get(name) or {}).get("detail") if isinstance(checks.get(name), dict) else None
    return name, detail or row.get("error") or ""


def op_signature(row: dict[str, Any], *, blamed: str = "", rx: Rules | None = None,
                 single: bool | None = None) -> Signature:
    """The signature of a failing op result row (``op_results``). ``blamed``: the ATen overload a
    value mismatch is blamed on (else its op); ``single``: see :func:`mismatch_class`."""
    status = row.get("status") or ""
    error = row.get("error") or ""
    if status == "contract":
        name, detail = first_contract(row)
        raised = _TARGET_RAISES.search(detail)
        if raised and "the CPU raises" not in detail:
            # the contract failed because the target raised: the same cause as an item whose
            # plain call raises that (a channels_last rule is one cause, whichever check met it)
            return _message("error", raised.group(1), rx=rx)
        sig = _message(f"contract:{name}" if name else "contract", detail, rx=rx)
        # one that describes how the op's results behave is the op's own
        return sig if _RAISES.search(sig.pattern) else Signature(sig.kind, sig.exc, sig.pattern, row.get("op") or "")
    if status == "mismatch" and not error.startswith("infra:"):
        what = mismatch_class(row, single)
        return Signature("mismatch", "", what, "" if what == SINGLE_PRECISION else (blamed or row.get("op") or ""))
    if status in ("crash", "timeout"):
        return _crash(status, row, row.get("op") or "", rx)
    return _message(_RAISING.get(status, status), error, rx=rx)


def model_signature(row: dict[str, Any], *, rx: Rules | None = None) -> Signature:
    """The signature of a failing model result row (``model_results``)."""
    status = row.get("status") or ""
    error = row.get("error") or ""
    if status == "mismatch":
        locus = row.get("first_divergent_op") or row.get("family") or ""
        return Signature("mismatch", "", model_mismatch_class(row), locus)
    if status in ("crash", "timeout"):
        return _crash(status, row, row.get("family") or "", rx)
    return _message(_RAISING.get(status, status), error, rx=rx)


def model_mismatch_class(row: dict[str, Any]) -> str:
    """Which of a model's checks differ first: its forward, only its gradients, or only training."""
    error = row.get("error") or ""
    fwd = row.get("fwd_rel_err")
    if error.startswith("forward") or (isinstance(fwd, float) and fwd != fwd):
        nonfinite = "= inf" in error.split(";")[0] or "= nan" in error.split(";")[0]
        return "forward NaN/inf differ" if nonfinite else "forward values differ"
    if error.startswith("backward"):
        return "gradients differ"
    if error.startswith("training"):
        return "training diverges"
    return "values differ"


def signature_of(table: str, row: dict[str, Any], *, blamed: str = "", rx: Rules | None = None) -> Signature:
    """:func:`op_signature` or :func:`model_signature` by the row's table."""
    if table == "model_results":
        return model_signature(row, rx=rx)
    return op_signature(row, blamed=blamed, rx=rx)


__all__ = ["CAUSE_RULES", "MISMATCH_CLASSES", "Rules", "Signature", "DataFileError", "crash_report", "first_contract",
           "mismatch_class", "model_signature", "normalise", "op_signature", "rules", "signature_of"]
