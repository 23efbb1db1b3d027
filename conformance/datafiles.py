"""Validated loaders for the small declarative data files in ``conformance/data/``.

Every data file goes through a loader that checks each key and value and, on bad input, raises
one :class:`DataFileError` naming file, key, value and what is accepted (the ledger has its own
loader in :mod:`conformance.ledger`, the emulator's builds theirs in ``neuron_emu.manifest``).

Example::

    >>> from conformance.datafiles import canaries
    >>> c = canaries()
    >>> c.dtype, c.samples > 0, "add" in c.ops
    ('float32', True, True)
"""

from __future__ import annotations

import functools
import math
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
