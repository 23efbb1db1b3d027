"""Selection vocabulary shared by the work kinds: dtype names, OpInfo globs, shards, the slice of
ops whose ``reference_inputs`` a run sweeps.

The groups a run covers come from the work kinds (:func:`conformance.run.kinds.select_groups`);
this module holds what they share to read a selection, and the shard split.

Example::

    >>> parse_dtypes(["float32,int64"]), parse_shard("2/4"), parse_reference_slice(" 3 / 7 ")
    (('float32', 'int64'), (2, 4), '3/7')
"""

from __future__ import annotations

import datetime as dt
import fnmatch
import hashlib
from collections.abc import Sequence

import torch

from conformance.inputs.opinfo import REFERENCE, SPARSE_VARIANTS, by_name

from .work import Group

DEFAULT_DTYPES = ("float32", "bfloat16", "float16", "int32", "int64", "bool", "float64", "complex64")
VARIANTS = ("function", "inplace", "out", "backward", *SPARSE_VARIANTS, REFERENCE)
#: The dtype probe's variant (conformance.sweep.dtypes): one item per op x dtype of --dtypes, claimed or not
DTYPE_PROBE = "dtypes"
VARIANTS += (DTYPE_PROBE,)
# The dtypes the harness can run: those some OpInfo supports on the CPU in torch 2.13 (quantized,
# bits* and sub-byte dtypes have no OpInfo samples; a test keeps this in step with the OpInfo db).
RUNNABLE_DTYPES = ("bfloat16", "bool", "complex128", "complex32", "complex64", "float16", "float32", "float64",
                   "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "int16", "int32", "int64",
                   "int8", "uint16", "uint32", "uint64", "uint8")


class SelectionError(ValueError):
    """An op glob, dtype or shard spec that selects nothing or cannot be parsed."""


def parse_dtypes(names: Sequence[str] | None) -> tuple[str, ...]:
    """Canonical dtype names from ``--dtypes`` values (comma-separated, repeatable); the
    defaults when there are none. Aliases (``float``, ``long``) and dtypes the harness cannot
    run (``qint8``) are refused with the accepted names."""
    if not names:
        return DEFAULT_DTYPES
    out = []
    for name in names:
        for part in name.split(","):
            part = part.strip()
            if not part:
                continue
            if part not in RUNNABLE_DTYPES:
                dt = getattr(torch, part, None)
                canonical = str(dt).removeprefix("torch.") if isinstance(dt, torch.dtype) else None
                hint = (f" (torch.{part} is {canonical}: use that name)" if canonical in RUNNABLE_DTYPES
                        else f" (torch.{part} exists, but no OpInfo runs it on the CPU)" if canonical else "")
                raise SelectionError(f"--dtypes {part!r}: not a dtype the harness runs{hint}; "
                                     f"accepted: {', '.join(RUNNABLE_DTYPES)}")
            out.append(part)
    if not out:
        raise SelectionError(f"--dtypes {','.join(names)!r}: names no dtype; accepted: {', '.join(RUNNABLE_DTYPES)}")
    return tuple(dict.fromkeys(out))


def parse_shard(spec: str | None) -> tuple[int, int]:
    """``K/N`` -> (K, N) with 1 <= K <= N."""
    if not spec:
        return 1, 1
    try:
        k, n = (int(x) for x in spec.split("/"))
    except ValueError:
        raise SelectionError(f"--shard {spec!r} is not K/N (e.g. 1/4)") from None
    if not 1 <= k <= n:
        raise SelectionError(f"--shard {spec!r}: K must be between 1 and N (e.g. 1/4 .. 4/4)")
    return k, n


def shard_of(groups: Sequence[Group], shard: tuple[int, int]) -> list[Group]:
    """Shard K of N: every N-th group, starting at the K-th."""
    k, n = shard
    return [g for i, g in enumerate(groups) if i % n == k - 1]


def matching(names: Sequence[str], globs: Sequence[str] | None, kind: str, nothing: str) -> list[str]:
    """``names`` matching any of ``globs`` (all when there are none), in ``names`` order; a glob
    that matches nothing raises with ``nothing`` (which names what a good glob looks like)."""
    if not globs:
        return list(names)
    chosen: set[str] = set()
    for g in globs:
        hit = [n for n in names if fnmatch.fnmatchcase(n, g)]
        if not hit:
            raise SelectionError(f"{kind} glob {g!r} {nothing}")
        chosen.update(hit)
    return [n for n in names if n in chosen]


def select_ops(globs: Sequence[str] | None) -> list[str]:
    return matching(sorted(by_name()), globs, "op", "matches no OpInfo (e.g. 'add', 'nn.functional.*', 'linalg.*')")


#: The nights a nightly takes to sweep the reference inputs of every OpInfo that has its own
#: (``conformance nightly --reference-inputs auto``: night ``d`` sweeps slice ``d mod N``). The
#: whole ``reference`` variant added 33% to the float32 OpInfo sweep of 2.33.0 as a night runs it
#: (every variant, samples and ladder; benchmarks/reference_cost.py), so a quarter adds about 8%.
REFERENCE_NIGHTS = 4


def parse_reference_slice(spec: str | None) -> str:
    """``--reference-inputs``: ``none`` (no reference item), ``all`` (every OpInfo's), or ``K/N``
    (the OpInfos whose :func:`reference_hash` modulo N is K, 0 <= K < N), normalised."""
    text = "none" if spec is None else str(spec).strip().lower()
    if text in ("none", "all"):
        return text
    return parse_k_of_n(text, f"--reference-inputs {spec!r}", "none, all or ",
                        "3/7: the OpInfos whose name hashes to 3 modulo 7")


def parse_k_of_n(text: str, what: str, alternatives: str = "", example: str = "3/7") -> str:
    """A slice ``K/N`` (0 <= K < N) normalised, or :class:`SelectionError` naming ``what``."""
    try:
        k, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise SelectionError(f"{what}: expected {alternatives}K/N with 0 <= K < N (e.g. {example})") from None
    if n < 1 or not 0 <= k < n:
        raise SelectionError(f"{what}: K/N needs N >= 1 and 0 <= K < N (e.g. 0/7 .. 6/7)")
    return f"{k}/{n}"


def reference_hash(op: str) -> int:
    """A stable hash of an OpInfo's name (the same in every process and Python version)."""
    return int.from_bytes(hashlib.sha256(op.encode()).digest()[:8], "big")


def in_reference_slice(op: str, spec: str | None) -> bool:
    """Whether ``op``'s reference inputs are in the slice ``spec`` (:func:`parse_reference_slice`)."""
    text = parse_reference_slice(spec)
    if text in ("none", "all"):
        return text == "all"
    k, n = (int(x) for x in text.split("/"))
    return reference_hash(op) % n == k


def night_slice(day: dt.date | None = None, nights: int = REFERENCE_NIGHTS) -> str:
    """The slice a nightly started on ``day`` (UTC; default today) sweeps: ``day.toordinal() mod N``,
    so that N consecutive nights cover every OpInfo."""
    day = day or dt.datetime.now(dt.UTC).date()
    return f"{day.toordinal() % nights}/{nights}"
