"""Which model graphs a run selects: family names, ``all``, the zoo's libraries (``hf``: every
transformers model type, ``timm``, ``tv``: torchvision; ``zoo``: all three), a library's slice
(``timm@3/30``: the architectures whose id hashes to 3 modulo 30, see :func:`in_zoo_slice`) or
exact model ids; a name may hold several, comma-separated (``hf,timm,tv``). Each graph runs in
float32 and, where its family supports it, bfloat16. Item keys of a graph: :func:`model_key`.

Example::

    >>> [g.key for g in model_groups(["mlp"], ["float32"], limit=1)]
    ['mlp.d1w16.relu.none.bias|float32']
    >>> split_names(["hf,timm", " tv "]), parse_zoo_name("timm@3/30")
    (['hf', 'timm', 'tv'], ('timm', '3/30'))
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Sequence
from typing import Any

from conformance.select import SelectionError, parse_dtypes, parse_k_of_n, reference_hash
from conformance.work import Group, ItemKey

from .zoo import LIBRARIES

MODEL_DTYPES = ("float32", "bfloat16")
ZOO = "zoo"  # every library of the zoo
# The nightly's zoo slice: every architecture within this many nights, eager items only (float32 and
# bfloat16): about 12 s of worker time per architecture and build, where the compile path's shape
# sweep makes it about 150 (README, The model zoo; benchmarks/zoo_lane.py)
ZOO_NIGHTS = 120
ZOO_NIGHTLY_MODES = ("eager",)
ZOO_INSTALL = "pip install '.[zoo]' for timm and torchvision, '.[hf]' for transformers"


def _known() -> list[str]:
    from .registry import FAMILIES

    return ["all", *sorted(FAMILIES), *LIBRARIES, ZOO, "LIB@K/N"]


def split_names(models: Sequence[str]) -> list[str]:
    """``--models`` values, each possibly comma-separated, as one list of names (order kept)."""
    return [n.strip() for m in models for n in str(m).split(",") if n.strip()]


def parse_zoo_name(name: str) -> tuple[str, str] | None:
    """``LIB`` or ``LIB@K/N`` (LIB a zoo library or ``zoo``) as (library, slice ``all`` or ``K/N``);
    None for any other name. Raises :class:`SelectionError` on a malformed slice."""
    lib, at, part = name.partition("@")
    if lib not in (*LIBRARIES, ZOO):
        return None
    if not at:
        return lib, "all"
    return lib, parse_k_of_n(part, f"model selection {name!r}", f"{lib}@",
                             "timm@3/30: the timm architectures whose id hashes to 3 modulo 30")


def in_zoo_slice(model_id: str, part: str) -> bool:
    """Whether ``model_id`` is in the slice ``part`` (``all`` or ``K/N``: its stable hash modulo N is K)."""
    if part == "all":
        return True
    k, n = (int(x) for x in part.split("/"))
    return reference_hash(model_id) % n == k


def _library(lib: str) -> Any:
    """The module that enumerates ``lib``'s architectures; SelectionError when it is not installed."""
    if lib == "hf":
        from . import hf

        if not hf.available():
            raise SelectionError(f"model selection {lib!r} needs Hugging Face transformers: {hf.unavailable_reason()}")
        return hf
    from . import vision

    if not vision.available(lib):
        raise SelectionError(f"model selection {lib!r} needs {vision.unavailable_reason(lib)}")
    return vision


def zoo_specs(lib: str, limit: int | None = None) -> list[Any]:
    """Every architecture ``lib`` (a zoo library) lists, in the library's order (the first ``limit``)."""
    return list(_all_zoo_specs(lib)[:limit])


@functools.cache
def _all_zoo_specs(lib: str) -> tuple[Any, ...]:
    mod = _library(lib)  # not cached when it raises: a library installed later is seen
    return tuple(mod.enumerate_specs() if lib == "hf" else mod.enumerate_specs(lib))


def _specs_for(name: str, limit: int | None) -> list[Any]:
    from .registry import FAMILIES, enumerate_graphs

    if name == "all":
        return [s for fam in FAMILIES for s in enumerate_graphs([fam], limit=limit)]
    if name in FAMILIES:
        return list(enumerate_graphs([name], limit=limit))
    zoo = parse_zoo_name(name)
    if zoo is not None:
        lib, part = zoo
        libs = LIBRARIES if lib == ZOO else (lib,)
        if lib == ZOO:  # the whole zoo: only the libraries installed here
            libs = tuple(x for x in libs if _installed(x))
            if not libs:
                raise SelectionError(f"model selection {name!r}: no zoo library is installed ({ZOO_INSTALL})")
        # --model-limit caps a family or a whole library, never a slice (the slice is the selection)
        return [s for x in libs for s in zoo_specs(x, limit if part == "all" else None)
                if in_zoo_slice(s.model_id, part)]
    lib = name.split(".", 1)[0]
    if lib in LIBRARIES:
        specs = zoo_specs(lib)
        hit = [s for s in specs if s.model_id == name]
        if not hit:
            near = difflib.get_close_matches(name, [s.model_id for s in specs], n=5, cutoff=0.6)
            raise SelectionError(f"unknown {lib} model {name!r}; {len(specs)} known"
                                 + (f", such as {', '.join(near)}" if near else ""))
        return hit
    if "." in name:  # an exact model id of a registry family
        try:
            return [resolve_spec(name)]
        except (KeyError, ValueError):
            pass
    raise SelectionError(f"unknown model family {name!r}; known: {', '.join(_known())} "
                         "(or an exact model id such as mlp.d1w16.relu.none.bias)")


def _installed(lib: str) -> bool:
    try:
        _library(lib)
    except SelectionError:
        return False
    return True


def installed_libraries() -> list[str]:
    """The zoo libraries installed here (``hf``, ``timm``, ``tv``, in that order)."""
    return [lib for lib in LIBRARIES if _installed(lib)]


def model_groups(models: Sequence[str], dtypes: Sequence[str] | None = None,
                 limit: int | None = None) -> list[Group]:
    """One group per graph x dtype: float32 always, bfloat16 where the family supports it.

    ``models``: ``all``, family names, zoo libraries and slices, or exact model ids (module doc).
    ``dtypes`` restricts the dtypes (names as in ``--dtypes``; others are ignored).
    ``limit``: at most this many graphs per family (deterministic grid order).
    """
    if isinstance(models, str):
        models = [models]
    wanted = [d for d in parse_dtypes(dtypes) if d in MODEL_DTYPES] if dtypes else list(MODEL_DTYPES)
    groups: list[Group] = []
    seen: set[str] = set()
    for name in split_names(models):
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
    """The spec of a model id (registry families and the zoo's ``hf.*``, ``timm.*``, ``tv.*``);
    KeyError when unknown."""
    family = model_id.split(".", 1)[0]
    if family == "hf":
        from . import hf

        return hf.spec_by_id(model_id)
    if family in LIBRARIES:
        from . import vision

        return vision.spec_by_id(model_id)
    from .registry import FAMILIES, spec_by_id

    if family not in FAMILIES:
        raise KeyError(f"unknown model family {family!r}; known: {', '.join(_known())}")
    return spec_by_id(model_id)


def model_key(model_id: str, mode: str, dtype: str) -> str:
    return str(ItemKey(model_id, mode, dtype, 0))
