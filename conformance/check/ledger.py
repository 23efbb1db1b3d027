"""Tolerances and expected failures, loaded from validated TOML (``conformance/data/ledger.toml``).

Every entry carries its reason (and optionally an issue link and an expiry date), so a report
can show why a tolerance was widened or a failure is expected. An entry's ``op`` must name ops its
variant's items carry: OpInfo names, ATen overloads and model ids are checked against what exists;
a target's custom ops (``neuron::flash_attention.default``, ``neuron::*``: the custom-op lane's
items, found on the target when it runs) by their form (:func:`custom_op_name`).

Example::

    >>> from conformance.check.ledger import Ledger
    >>> led = Ledger.from_toml('''
    ... [[override]]
    ... op = "cumsum"
    ... dtype = "bfloat16"
    ... rtol = 0.05
    ... atol = 0.01
    ... reason = "accumulates in bf16"
    ... ''', source="inline.toml")
    >>> tol = led.tolerance("cumsum", "function", "bfloat16", "neuron-emu")
    >>> tol.rtol, tol.source
    (0.05, 'inline.toml:override[0] (accumulates in bf16)')
"""

from __future__ import annotations

import datetime as dt
import difflib
import fnmatch
import functools
import math
import re
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from conformance.datafiles import DATA
from conformance.inputs.opinfo import REFERENCE, SPARSE_VARIANTS
from conformance.select import DTYPE_PROBE
from opdb.queries_counts import CUSTOM_OP_VARIANTS
from opdb.status import EXPECTABLE

DEFAULT_LEDGER = DATA / "ledger.toml"
DTYPES = ("float64", "float32", "bfloat16", "float16", "complex64", "complex128", "int64", "int32",
          "int16", "int8", "uint8", "bool")
VARIANTS = ("function", "inplace", "out", "backward", *SPARSE_VARIANTS, REFERENCE, "schema", "canary", "model",
            *CUSTOM_OP_VARIANTS, "*")
VARIANTS += (DTYPE_PROBE,)  # the dtype probe's items (conformance.sweep.dtypes): only an entry naming it applies
STATUSES = EXPECTABLE  # the failing statuses an xfail entry may accept

# torch.testing.assert_close defaults, the baseline every override starts from.
_TORCH_DEFAULTS = {
    "float16": (1e-3, 1e-5), "bfloat16": (1.6e-2, 1e-5), "float32": (1.3e-6, 1e-5),
    "float64": (1e-7, 1e-7), "complex64": (1.3e-6, 1e-5), "complex128": (1e-7, 1e-7),
}


class LedgerError(ValueError):
    """A malformed ledger entry; the message names file, key and value."""


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float
    source: str


@dataclass(frozen=True)
class Entry:
    """One ledger entry: a tolerance (default/override) or an expected failure."""

    kind: str  # default | override | xfail
    index: int
    source: str
    op: str = "*"
    dtype: str = "*"
    target: str = "*"
    variant: str = "*"
    atol: float | None = None
    rtol: float | None = None
    statuses: tuple[str, ...] = STATUSES
    reason: str = ""
    issue: str = ""
    expires: dt.date | None = None

    def matches(self, op: str, variant: str, dtype: str, target: str) -> bool:
        # a reference item is the function called on another input: a function entry covers it too
        return (fnmatch.fnmatchcase(op, self.op) and fnmatch.fnmatchcase(dtype, self.dtype)
                and fnmatch.fnmatchcase(target, self.target)
                and (fnmatch.fnmatchcase(variant, self.variant) or (variant, self.variant) == (REFERENCE, "function")))

    @property
    def where(self) -> str:
        return f"{self.source}:{self.kind}[{self.index}]"

    def expired(self, today: dt.date | None = None) -> bool:
        return self.expires is not None and self.expires < (today or dt.date.today())


_FIELDS = {
    "default": {"dtype", "target", "atol", "rtol", "reason", "issue", "expires"},
    "override": {"op", "dtype", "target", "variant", "atol", "rtol", "reason", "issue", "expires"},
    "xfail": {"op", "dtype", "target", "variant", "status", "reason", "issue", "expires"},
}


def _bad(source: str, key: str, value: Any, accepted: str) -> LedgerError:
    return LedgerError(f"{source}: {key} = {value!r} is not valid; expected {accepted}")


def _entry(kind: str, index: int, raw: Any, source: str) -> Entry:
    where = f"{kind}[{index}]"
    if not isinstance(raw, dict):
        raise _bad(source, where, raw, "a table")
    unknown = set(raw) - _FIELDS[kind]
    if unknown:
        key = sorted(unknown)[0]
        raise _bad(source, f"{where}.{key}", raw[key], f"one of the keys {sorted(_FIELDS[kind])}")
    reason = raw.get("reason")
    if kind != "default" and (not isinstance(reason, str) or not reason.strip()):
        raise _bad(source, f"{where}.reason", reason, "a non-empty string saying why")
    values: dict[str, Any] = {}
    for key in ("op", "target", "issue"):
        if key in raw:
            if not isinstance(raw[key], str) or not raw[key]:
                raise _bad(source, f"{where}.{key}", raw[key], "a non-empty string")
            values[key] = raw[key]
    if "dtype" in raw:
        d = raw["dtype"]
        if not isinstance(d, str) or not any(fnmatch.fnmatchcase(x, d) for x in DTYPES):
            raise _bad(source, f"{where}.dtype", d, f"a dtype name or glob over {', '.join(DTYPES)}")
        values["dtype"] = d
    if "variant" in raw:
        if raw["variant"] not in VARIANTS:
            raise _bad(source, f"{where}.variant", raw["variant"], f"one of {', '.join(VARIANTS)}")
        values["variant"] = raw["variant"]
    for key in ("atol", "rtol"):
        if key in raw:
            v = raw[key]
            # inf or nan would turn every mismatch into a pass (nan compares false both ways)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise _bad(source, f"{where}.{key}", v, "a finite number >= 0")
            values[key] = float(v)
    if kind in ("default", "override") and "atol" not in values and "rtol" not in values:
        raise _bad(source, f"{where}", raw, "at least one of atol, rtol")
    if "status" in raw:
        st = raw["status"]
        st = [st] if isinstance(st, str) else st
        if not isinstance(st, list) or not st or any(s not in STATUSES for s in st):
            raise _bad(source, f"{where}.status", raw["status"], f"one or more of {', '.join(STATUSES)}")
        values["statuses"] = tuple(st)
    if "expires" in raw:
        e = raw["expires"]
        if isinstance(e, str):
            try:
                e = dt.date.fromisoformat(e)
            except ValueError:
                raise _bad(source, f"{where}.expires", raw["expires"], "a date like 2027-01-31") from None
        if not isinstance(e, dt.date):
            raise _bad(source, f"{where}.expires", e, "a date like 2027-01-31")
        values["expires"] = e
    return Entry(kind=kind, index=index, source=source, reason=(reason or "").strip(), **values)


# -- op names: an entry for an op that does not exist is a typo that silently matches nothing ------
# Which names an item's ``op`` holds depends on its variant: OpInfo names (function, inplace, out,
# backward and the canaries), ATen overloads for schema-driven items, model ids for model graphs,
# a target's custom-op overloads for the custom-op lane's items (conformance.customops).
_NAMESPACES: dict[str, tuple[str, ...]] = {
    "function": ("opinfo",), "inplace": ("opinfo",), "out": ("opinfo",), "backward": ("opinfo",),
    REFERENCE: ("opinfo",), "canary": ("opinfo",), "schema": ("aten",), "model": ("model",),
    **dict.fromkeys(CUSTOM_OP_VARIANTS, ("custom",)),
    "*": ("opinfo", "aten", "model", "custom"),
}
_NAMESPACES[DTYPE_PROBE] = ("opinfo",)
_WHAT = {"opinfo": "an OpInfo name (e.g. 'cumsum', 'nn.functional.gelu')",
         "aten": "an ATen overload (e.g. 'aten::add.Tensor')",
         "model": "a model id (e.g. 'mlp.*', 'hf.gpt2')",
         "custom": "a custom op's overload name (e.g. 'neuron::flash_attention.default')"}
# The namespaces whose ops are PyTorch's own (their overloads are checked against the dispatcher),
# never a target's custom op.
_TORCH_NAMESPACES = ("aten", "prims")
_GLOB = "*?["
# A custom op's overload name: namespace, op and overload, identifiers each (a glob may stand
# for any part). A target's custom ops are discovered on it at run time (its package registers
# them), so a name is checked for its form, not against a list.
_CUSTOM_NAME = re.compile(r"[A-Za-z_]\w*::[A-Za-z_]\w*\.[A-Za-z_]\w*\Z")
_CUSTOM_GLOB = re.compile(r"[\w*?\[\]!]+::[\w*?\[\]!.]+\Z")


@functools.cache
def _opinfo_names() -> tuple[str, ...]:
    from conformance.inputs.opinfo import by_name

    return tuple(sorted(by_name()))


@functools.cache
def _aten_names() -> tuple[str, ...]:
    from conformance.catalog.overloads import aten_names

    return tuple(aten_names())


@functools.cache
def _model_ids() -> tuple[str, ...]:
    from conformance.models.registry import enumerate_graphs

    return tuple(g.model_id for g in enumerate_graphs())


# A zoo architecture's id (hf.<model_type>, timm.<name>, tv.<name>) or a glob over them: accepted by
# form, since what the libraries list depends on their versions and on whether they are installed
# here, and a ledger must load the same everywhere.
_ZOO_ID = re.compile(r"(?:hf|timm|tv)\.[A-Za-z0-9*?\[][\w.\-*?\[\]!]*")


def zoo_model_name(op: str) -> bool:
    """Whether ``op`` names zoo architectures by form.

        >>> [zoo_model_name(n) for n in ("hf.gpt2", "timm.vit_*", "tv.resnet18", "mlp.d1w16", "hf.")]
        [True, True, True, False, False]
    """
    return bool(_ZOO_ID.fullmatch(op))


NAMES: dict[str, Callable[[], Sequence[str]]] = {"opinfo": _opinfo_names, "aten": _aten_names, "model": _model_ids}


def custom_op_name(op: str) -> bool:
    """Whether ``op`` can name custom ops: an overload name of a namespace other than PyTorch's
    (``neuron::flash_attention.default``) or a glob over such names (``neuron::*``).

        >>> [custom_op_name(n) for n in ("neuron::rope.default", "neuron::*", "neuron::rope", "aten::add.Tensor")]
        [True, True, False, False]
    """
    ns = op.split("::", 1)[0]
    if ns in _TORCH_NAMESPACES:
        return False
    return bool(_CUSTOM_GLOB.match(op)) if any(ch in op for ch in _GLOB) else bool(_CUSTOM_NAME.match(op))


def _check_op(e: Entry) -> None:
    """Refuse an override or xfail whose op (glob) names no op its variant's items can carry."""
    if e.op == "*":
        return
    spaces = _NAMESPACES[e.variant]
    if "custom" in spaces and custom_op_name(e.op):
        return
    if "model" in spaces and zoo_model_name(e.op):
        return
    names = [n for space in spaces if space in NAMES for n in NAMES[space]()]
    if any(ch in e.op for ch in _GLOB):
        if any(fnmatch.fnmatchcase(n, e.op) for n in names):
            return
    elif e.op in set(names):
        return
    close = difflib.get_close_matches(e.op, names, n=1, cutoff=0.6)
    if "custom" in spaces and custom_op_name(f"{e.op}.default"):
        close = [f"{e.op}.default"]  # a custom op named without its overload matches none of its items
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    listed = [s for s in spaces if s in NAMES]
    accepted = [f"{' or '.join(_WHAT[s] for s in listed)} that exists"
                f"{' for variant ' + repr(e.variant) if e.variant != '*' else ''}, or a glob matching one"] if listed else []
    if "custom" in spaces:  # discovered on the target when it runs: checked for its form only
        accepted.append(f"{_WHAT['custom']} or a glob over them (e.g. 'neuron::*'), of a namespace other than "
                        f"{' and '.join(_TORCH_NAMESPACES)}{'' if listed else ' for variant ' + repr(e.variant)}")
    raise _bad(e.source, f"{e.kind}[{e.index}].op", e.op, "; or ".join(accepted) + hint)


@dataclass(frozen=True)
class Ledger:
    defaults: tuple[Entry, ...] = ()
    overrides: tuple[Entry, ...] = ()
    xfails: tuple[Entry, ...] = ()

    @classmethod
    def from_toml(cls, text: str, *, source: str) -> Ledger:
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise LedgerError(f"{source}: not valid TOML ({exc})") from None
        unknown = set(data) - set(_FIELDS)
        if unknown:
            key = sorted(unknown)[0]
            raise _bad(source, key, data[key], "tables named default, override or xfail")
        parts: dict[str, tuple[Entry, ...]] = {}
        for kind in _FIELDS:
            raw = data.get(kind, [])
            if not isinstance(raw, list):
                raise _bad(source, kind, raw, f"an array of tables ([[{kind}]])")
            parts[kind] = tuple(_entry(kind, i, r, source) for i, r in enumerate(raw))
        for e in parts["override"] + parts["xfail"]:
            _check_op(e)
        return cls(defaults=parts["default"], overrides=parts["override"], xfails=parts["xfail"])

    @classmethod
    def load(cls, path: str | Path | None = None) -> Ledger:
        p = Path(path) if path else DEFAULT_LEDGER
        try:
            text = p.read_text()
        except OSError as exc:
            raise LedgerError(f"{p}: cannot read ledger ({exc.strerror})") from None
        return cls.from_toml(text, source=p.name if p == DEFAULT_LEDGER else str(p))

    def tolerance(self, op: str, variant: str, dtype: str, target: str) -> Tolerance:
        key = (op, variant, dtype, target)
        cache = self.__dict__.setdefault("_cache", {})
        if key not in cache:
            cache[key] = self._tolerance(op, variant, dtype, target)
        return cache[key]

    def _tolerance(self, op: str, variant: str, dtype: str, target: str) -> Tolerance:
        """The tolerance for one item: the last matching override, else the last matching
        default, else torch.testing's default for the dtype (exact for non-float dtypes)."""
        for group in (self.overrides, self.defaults):
            for e in reversed(group):
                if e.matches(op, variant, dtype, target) and not e.expired():
                    base = torch_default(dtype)
                    atol = e.atol if e.atol is not None else base.atol
                    rtol = e.rtol if e.rtol is not None else base.rtol
                    return Tolerance(atol, rtol, f"{e.where} ({e.reason})" if e.reason else e.where)
        return torch_default(dtype)

    def expected_failure(self, op: str, variant: str, dtype: str, target: str) -> Entry | None:
        for e in reversed(self.xfails):
            if e.matches(op, variant, dtype, target) and not e.expired():
                return e
        return None

    def entries(self) -> tuple[Entry, ...]:
        return self.defaults + self.overrides + self.xfails


def torch_default(dtype: str) -> Tolerance:
    """The tolerance every override starts from: torch.testing.assert_close's default, exact for ints."""
    if dtype in _TORCH_DEFAULTS:
        rtol, atol = _TORCH_DEFAULTS[dtype]
        return Tolerance(atol, rtol, f"torch.testing default for {dtype}")
    return Tolerance(0.0, 0.0, f"exact ({dtype})")


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
