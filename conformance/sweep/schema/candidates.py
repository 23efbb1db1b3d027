"""The schema search's candidates: the ATen overloads no OpInfo the sweep runs reaches, and the
``aten::`` globs of ``--ops`` that choose among them (:data:`~conformance.sweep.schema.SCHEMA`
makes one group of each).
"""

from __future__ import annotations

from functools import cache

from conformance.catalog import overloads as catalog
from conformance.inputs.opinfo import by_name, cpu_dtypes
from conformance.select import DEFAULT_DTYPES, matching


def select_overloads(globs: list[str]) -> list[str]:
    """Schema-driven candidates (overloads no OpInfo reaches) matching ``aten::`` globs (all
    candidates when there are none)."""
    return matching(schema_candidates(), globs, "overload",
                    "matches no schema-driven candidate (an overload no "
                    "OpInfo reaches, e.g. 'aten::_foreach_*'; see `conformance ops --json`)")


@cache
def schema_candidates() -> tuple[str, ...]:
    """Overloads a backend can see that no OpInfo the sweep runs reaches (the map is measured
    from each OpInfo's first sample; an OpInfo with no default dtype on the CPU runs nothing).
    Layout-specific overloads are candidates too: most take strided inputs, and those that do
    not are told apart by the CPU's own rejections."""
    infos = by_name()

    def runs(name: str) -> bool:
        info = infos.get(name)
        return info is not None and any(str(d).removeprefix("torch.") in DEFAULT_DTYPES
                                        for d in cpu_dtypes(info))

    skip = ("composite_implicit", "no_cpu_kernel")
    return tuple(o.name for o in catalog.overloads(with_opinfos=True)
                 if not any(runs(i) for i in o.opinfos) and not any(o.has(c) for c in skip))
