"""Which model graphs a run selects: family names, ``all``, ``hf`` (Hugging Face
architectures) or exact model ids, each graph in float32 and, where its family supports it,
bfloat16. Item keys of a graph: :func:`model_key`.

Example::

    >>> [g.key for g in model_groups(["mlp"], ["float32"], limit=1)]
    ['mlp.d1w16.relu.none.bias|float32']
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from conformance.select import SelectionError, parse_dtypes
from conformance.work import Group, ItemKey

MODEL_DTYPES = ("float32", "bfloat16")


def _known() -> list[str]:
    from .registry import FAMILIES

    return ["all", *sorted(FAMILIES), "hf"]


def _specs_for(name: str, limit: int | None) -> list[Any]:
    from .registry import FAMILIES, enumerate_graphs

    if name == "all":
        return [s for fam in FAMILIES for s in enumerate_graphs([fam], limit=limit)]
    if name in FAMILIES:
        return list(enumerate_graphs([name], limit=limit))
    if name == "hf" or name.startswith("hf."):
        from . import hf

        if not hf.available():
            raise SelectionError(f"model selection {name!r} needs Hugging Face transformers: {hf.unavailable_reason()}")
        specs = hf.enumerate_specs(limit=limit)
        if name == "hf":
            return specs
        hit = [s for s in specs if s.model_id == name]
        if not hit:
            raise SelectionError(f"unknown hf model {name!r}; known: {', '.join(s.model_id for s in specs)}")
        return hit
    if "." in name:  # an exact model id
        try:
            return [resolve_spec(name)]
        except (KeyError, ValueError):
            pass
    raise SelectionError(f"unknown model family {name!r}; known: {', '.join(_known())} "
                         "(or an exact model id such as mlp.d1w16.relu.none.bias)")


def model_groups(models: Sequence[str], dtypes: Sequence[str] | None = None,
                 limit: int | None = None) -> list[Group]:
    """One group per graph x dtype: float32 always, bfloat16 where the family supports it.

    ``models``: ``all``, family names, ``hf`` (Hugging Face architectures) or exact model ids.
    ``dtypes`` restricts the dtypes (names as in ``--dtypes``; others are ignored).
    ``limit``: at most this many graphs per family (deterministic grid order).
    """
    if isinstance(models, str):
        models = [models]
    wanted = [d for d in parse_dtypes(dtypes) if d in MODEL_DTYPES] if dtypes else list(MODEL_DTYPES)
    groups: list[Group] = []
    seen: set[str] = set()
    for name in models:
        for spec in _specs_for(name, limit):
            if spec.model_id in seen:
                continue
            seen.add(spec.model_id)
            for d in wanted:
                if d == "bfloat16" and not spec.supports_bf16:
                    continue
                groups.append(Group(spec.model_id, d, "model"))
    return groups


def resolve_spec(model_id: str) -> Any:
    """The spec of a model id (registry families and ``hf.*``); KeyError when unknown."""
    family = model_id.split(".", 1)[0]
    if family == "hf":
        from . import hf

        return hf.spec_by_id(model_id)
    from .registry import FAMILIES, spec_by_id

    if family not in FAMILIES:
        raise KeyError(f"unknown model family {family!r}; known: {', '.join(_known())}")
    return spec_by_id(model_id)


def model_key(model_id: str, mode: str, dtype: str) -> str:
    return str(ItemKey(model_id, mode, dtype, 0))
