"""Enumerate: every ATen overload the dispatcher knows, classified from the registry itself.

Nothing here is a hand list: classes come from schemas (alias annotations), tags and the
dispatch keys that have kernels, and ``no_cpu_kernel`` also from what the CPU itself showed for
this torch release (:func:`no_cpu_reference`: a composite whose CPU path calls an op with no CPU
kernel), so which overloads a backend can be compared on is one fact of the torch build, the same
for every run, whatever it searched. The map from overloads to the OpInfos that reach them is
measured by running each OpInfo's first float32 sample under a dispatch mode, and cached per
torch version.

Example::

    >>> from conformance.catalog import overloads
    >>> ops = {o.name: o for o in overloads()}
    >>> sorted(ops["aten::add_.Tensor"].classes)
    ['inplace']
"""

from __future__ import annotations

import json
import os
import time
import warnings
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import torch

from conformance import datafiles

# Class vocabulary (an overload may carry several).
KINDS = ("functional", "inplace", "out", "view", "view_copy")
FLAGS = ("backward", "random", "core", "composite_implicit", "composite_explicit", "private",
         "no_cpu_kernel", "sparse", "quantized", "nested", "mkldnn")
CLASSES = KINDS + FLAGS

_LAYOUT_KEYS = {
    "sparse": ("SparseCPU", "SparseCsrCPU"),
    "quantized": ("QuantizedCPU",),
    "nested": ("NestedTensorCPU",),
    "mkldnn": ("MkldnnCPU",),
}
_LAYOUT_WORDS = {"sparse": ("sparse", "_csr", "_coo", "_bsr", "_bsc", "_csc"),
                 "quantized": ("quantize", "q_", "_qint", "fake_quant", "fbgemm"),
                 "nested": ("nested",), "mkldnn": ("mkldnn", "onednn", "_mkl")}


@dataclass(frozen=True)
class Overload:
    """One ATen overload and what the registry says about it."""

    name: str  # aten::name.overload (overload "default" when it has none)
    op: str  # aten::name
    overload: str
    schema: str
    tags: tuple[str, ...]
    classes: tuple[str, ...]
    opinfos: tuple[str, ...] = field(default=())

    def has(self, cls: str) -> bool:
        return cls in self.classes

    def row(self, torch_version: str) -> dict[str, object]:
        d = asdict(self)
        d["torch_version"] = torch_version
        return d


def canonical(qualified: str) -> str:
    """``aten::add`` -> ``aten::add.default``; ``aten::add.out`` unchanged."""
    ns_name = qualified.split("::", 1)[1]
    return qualified if "." in ns_name else f"{qualified}.default"


def packet_of(name: str) -> torch._ops.OpOverload:
    """The OpOverload object for ``aten::name.overload``."""
    base, overload = name.split("::", 1)[1].rsplit(".", 1)
    return getattr(getattr(torch.ops.aten, base), overload)


def op_name(func: Any) -> str:
    """``namespace::name.overload`` of an OpOverload (the inverse of :func:`packet_of`)."""
    return f"{func.namespace}::{func._schema.name.split('::', 1)[1]}.{func._overloadname}"


def _has_kernel(qualified: str, key: str) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(qualified, key)


def cpu_layout_kernel(qualified: str) -> str | None:
    """The non-strided layout an op has a CPU kernel for (``sparse``, ``sparse_csr``,
    ``quantized``, ``nested``, ``mkldnn``), or None. ``qualified`` may omit the overload."""
    for layout, key in (("sparse_csr", "SparseCsrCPU"), ("sparse", "SparseCPU"), ("quantized", "QuantizedCPU"),
                        ("nested", "NestedTensorCPU"), ("mkldnn", "MkldnnCPU")):
        try:
            if _has_kernel(qualified, key):
                return layout
        except RuntimeError:
            return None
    return None


def classify(qualified: str) -> Overload:
    """Classify one overload (``aten::name`` or ``aten::name.overload``) from the registry."""
    name = canonical(qualified)
    op, overload = name.rsplit(".", 1)
    qualified = op if overload == "default" else name  # the dispatcher's own spelling
    packet = packet_of(name)
    sch = packet._schema
    tags = tuple(sorted(t.name for t in packet.tags))
    writes = [a for a in sch.arguments if a.alias_info is not None and a.alias_info.is_write]
    out_args = [a for a in writes if a.kwarg_only]
    returns_alias = any(r.alias_info is not None and not r.alias_info.is_write for r in sch.returns)
    base = op.split("::", 1)[1]
    kinds: list[str] = []
    if out_args:
        kinds.append("out")
    elif writes:
        kinds.append("inplace")
    elif returns_alias:
        kinds.append("view")
    elif "view_copy" in tags:
        kinds.append("view_copy")
    else:
        kinds.append("functional")
    flags: list[str] = []
    if "_backward" in base:
        flags.append("backward")
    if "nondeterministic_seeded" in tags:
        flags.append("random")
    if "core" in tags:
        flags.append("core")
    if _has_kernel(qualified, "CompositeImplicitAutograd"):
        flags.append("composite_implicit")
    if _has_kernel(qualified, "CompositeExplicitAutograd") or _has_kernel(
            qualified, "CompositeExplicitAutogradNonFunctional"):
        flags.append("composite_explicit")
    if base.startswith("_"):
        flags.append("private")
    has_cpu = _has_kernel(qualified, "CPU")
    if not has_cpu and "composite_implicit" not in flags and "composite_explicit" not in flags:
        flags.append("no_cpu_kernel")
    elif "composite_implicit" not in flags and name in no_cpu_reference():
        flags.append("no_cpu_kernel")  # its CPU path calls an op that has no CPU kernel
    lowered = base.lower()
    for layout, keys in _LAYOUT_KEYS.items():
        by_kernel = any(_has_kernel(qualified, k) for k in keys) and not has_cpu
        by_name = any(w in lowered for w in _LAYOUT_WORDS[layout])
        if by_kernel or by_name:
            flags.append(layout)
    return Overload(name=name, op=op, overload=overload, schema=str(sch), tags=tags,
                    classes=tuple(kinds + flags))


#: A no_cpu_reference.toml to read instead of the shipped one, or "none" for none (its generator
#: sets "none": an overload the file lists would not be searched, so it could not be learned again).
NO_CPU_REFERENCE_ENV = "CONFORMANCE_NO_CPU_REFERENCE"


class StaleDataFile(UserWarning):
    """A data file made for another torch release, ignored."""


@cache
def no_cpu_reference() -> dict[str, str]:
    """Overload -> the op with no CPU kernel that its CPU path calls, for this torch release
    (``conformance/data/no_cpu_reference.toml``, made by ``tools/no_cpu_reference.py``). The
    registry gives such an overload a CPU-side kernel (a composite), yet the CPU cannot compute
    it, so no target's result on it can be compared: it is ``no_cpu_kernel`` in every run. A file
    made for another release is ignored with a warning (such overloads then count as reachable)."""
    choice = os.environ.get(NO_CPU_REFERENCE_ENV, "")
    if choice == "none":
        return {}
    path = Path(choice) if choice else datafiles.NO_CPU_REFERENCE
    data = datafiles.no_cpu_reference(path)
    release = torch.__version__.split("+", 1)[0]
    if data.torch != release:
        warnings.warn(StaleDataFile(
            f"{path}: torch = {data.torch!r}, but this is torch {torch.__version__}: ignored, so overloads whose "
            f"CPU path calls an op with no CPU kernel count as backend-reachable (python tools/no_cpu_reference.py "
            f"makes it for this torch)"), stacklevel=2)
        return {}
    known = set(aten_names())
    for name, inner in data.overloads.items():
        if name not in known:
            raise datafiles.bad_value(path, f'overloads."{name}"', inner,
                                      f"an overload that torch {torch.__version__}'s dispatcher knows")
    return dict(data.overloads)


def aten_names() -> list[str]:
    """Every ``aten::`` overload registered with the dispatcher, in canonical spelling."""
    return sorted(canonical(n) for n in torch._C._dispatch_get_all_op_names() if n.startswith("aten::"))


def cache_dir() -> Path:
    root = os.environ.get("CONFORMANCE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "conformance")
    return Path(root)


def _opinfo_map_path() -> Path:
    return cache_dir() / f"opinfo-map-torch-{torch.__version__}.json"


def opinfo_map(*, use_cache: bool = True) -> dict[str, list[str]]:
    """OpInfo full name -> overloads its first float32 sample reaches (measured, cached)."""
    path = _opinfo_map_path()
    if use_cache and path.exists():
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            pass  # a corrupt cache is rebuilt
    from conformance.inputs.opinfo import first_sample_overloads

    mapping = first_sample_overloads()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(mapping, sort_keys=True))
    tmp.replace(path)
    return mapping


@cache
def _overloads_cached(with_opinfos: bool) -> tuple[Overload, ...]:
    classified = [classify(n) for n in aten_names()]
    if not with_opinfos:
        return tuple(classified)
    reached: dict[str, set[str]] = {}
    for info_name, hits in opinfo_map().items():
        for hit in hits:
            reached.setdefault(hit, set()).add(info_name)
    return tuple(
        Overload(**{**asdict(o), "opinfos": tuple(sorted(reached.get(o.name, ())))})
        for o in classified)


def overloads(*, with_opinfos: bool = False) -> tuple[Overload, ...]:
    """The catalog: every ATen overload, classified (and mapped to OpInfos when asked)."""
    return _overloads_cached(with_opinfos)


@dataclass(frozen=True)
class Summary:
    total: int
    per_class: dict[str, int]
    reached_by_opinfo: int
    reached_per_class: dict[str, int]
    opinfos: int
    build_s: float


def summarize(ops: Sequence[Overload], *, n_opinfos: int, build_s: float) -> Summary:
    per_class: Counter[str] = Counter()
    reached: Counter[str] = Counter()
    for o in ops:
        per_class.update(o.classes)
        if o.opinfos:
            reached.update(o.classes)
    return Summary(total=len(ops), per_class={c: per_class.get(c, 0) for c in CLASSES},
                   reached_by_opinfo=sum(1 for o in ops if o.opinfos),
                   reached_per_class={c: reached.get(c, 0) for c in CLASSES},
                   opinfos=n_opinfos, build_s=build_s)


def build(*, use_cache: bool = True) -> tuple[tuple[Overload, ...], Summary]:
    """Classify every overload and attach the OpInfo map; returns the catalog and its summary."""
    start = time.perf_counter()
    if not use_cache:
        _overloads_cached.cache_clear()
        opinfo_map(use_cache=False)
    ops = overloads(with_opinfos=True)
    n_infos = len(opinfo_map())
    return ops, summarize(ops, n_opinfos=n_infos, build_s=time.perf_counter() - start)


def by_class(ops: Iterable[Overload], cls: str) -> list[Overload]:
    return [o for o in ops if cls in o.classes]
