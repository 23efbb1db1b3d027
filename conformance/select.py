"""Select work: which OpInfo x dtype groups a run covers, their stable keys, and sharding.

A *group* is one OpInfo and one dtype (samples are generated once per group); an *item* is one
sample of one variant in a group. Item keys are stable across runs and processes, which is what
resume and merge rely on.

Example::

    >>> from conformance.select import select_groups
    >>> [g.key for g in select_groups(["abs"], ["float32", "int64"])]
    ['abs|float32', 'abs|int64']
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .inputs.opinfo import by_name, cpu_dtypes

DEFAULT_DTYPES = ("float32", "bfloat16", "float16", "int32", "int64", "bool", "float64", "complex64")
VARIANTS = ("function", "inplace", "out", "backward")
# The dtypes the harness can run: those some OpInfo supports on the CPU in torch 2.13 (quantized,
# bits* and sub-byte dtypes have no OpInfo samples; a test keeps this in step with the OpInfo db).
RUNNABLE_DTYPES = ("bfloat16", "bool", "complex128", "complex32", "complex64", "float16", "float32", "float64",
                   "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "int16", "int32", "int64",
                   "int8", "uint16", "uint32", "uint64", "uint8")


class SelectionError(ValueError):
    """An op glob, dtype or shard spec that selects nothing or cannot be parsed."""


TABLE_OF = {"opinfo": "op_results", "schema": "op_results", "model": "model_results"}


@dataclass(frozen=True)
class Group:
    """A unit of work a worker process takes: an OpInfo x dtype, an ATen overload whose inputs
    come from its schema (``schema``), or a model graph x dtype (``model``)."""

    op: str
    dtype: str
    kind: str = "opinfo"

    @property
    def key(self) -> str:
        return f"{self.op}|{self.dtype}"

    @property
    def table(self) -> str:
        return TABLE_OF[self.kind]


def item_key(op: str, variant: str, dtype: str, sample: int) -> str:
    return f"{op}|{variant}|{dtype}|{sample}"


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


def _matching(names: Sequence[str], globs: Sequence[str] | None, kind: str, nothing: str) -> list[str]:
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
    return _matching(sorted(by_name()), globs, "op", "matches no OpInfo (e.g. 'add', 'nn.functional.*', 'linalg.*')")


def select_overloads(globs: Sequence[str]) -> list[str]:
    """Schema-driven candidates (overloads no OpInfo reaches) matching ``aten::`` globs (all
    candidates when there are none)."""
    from .inputs.schema import schema_candidates

    return _matching(schema_candidates(), globs, "overload", "matches no schema-driven candidate (an overload no OpInfo "
                     "reaches, e.g. 'aten::_foreach_*'; see `conformance ops --json`)")


def select_groups(ops: Sequence[str] | None = None, dtypes: Sequence[str] | None = None,
                  shard: tuple[int, int] = (1, 1), *, opinfo: bool = True, schema: bool = False,
                  models: Sequence[str] = (), model_limit: int | None = None) -> list[Group]:
    """The run's groups in a stable order, restricted to one shard: every (OpInfo, dtype) pair
    the CPU supports; with ``schema``, every overload no OpInfo reaches that a backend could
    see (``aten::`` globs in ``ops`` select among those, and alone select nothing else); with
    ``models``, every graph of those families (``all`` for every family)."""
    groups: list[Group] = []
    aten_globs = [g for g in ops or () if g.startswith("aten::")]
    info_globs = [g for g in ops or () if not g.startswith("aten::")]
    if opinfo and (info_globs or not aten_globs):
        infos = by_name()
        wanted = parse_dtypes(dtypes)
        for name in select_ops(info_globs):
            supported = {str(d).removeprefix("torch.") for d in cpu_dtypes(infos[name])}
            groups.extend(Group(name, d) for d in wanted if d in supported)
    if schema or aten_globs:
        groups.extend(Group(name, "any", "schema") for name in select_overloads(aten_globs))
    if models:
        from .models.runner import model_groups

        groups.extend(model_groups(models, dtypes, limit=model_limit))
    return shard_of(groups, shard)
