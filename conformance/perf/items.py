"""What the perf lane measures: op items (OpInfo x dtype x input size), model items (model graph
x shape variant) and decode items (one decode step of a causal LM x dtype x prompt bucket:
:mod:`conformance.perf.decode`), and how a worker turns one into a ready-to-time call.

**Op sizes.** An OpInfo's own samples (function variant, seeded as the sweep seeds them) give the
sizes: among the samples whose tensors are all strided and not empty, ordered by the elements of
their tensor arguments, the smallest is ``small`` and the largest ``medium``; ``large`` is a
sample grown to :data:`LARGE_NUMEL` input elements the way the size ladder grows it
(:func:`conformance.sweep.ladder.grow`: the dimension the op runs along lengthened, fresh values in
the sample's range), where one grows, the CPU accepts it, its output stays under
:data:`conformance.sweep.ladder.MAX_BYTES` and its CPU call is predicted to take less than
:data:`LARGE_CPU_S`. OpInfo's samples hold a few dozen elements, where a
call costs what its dispatch costs; the grown sample is where a kernel's own time shows. Each item
stores its sample's index (the element count for ``large``) and its signature (dtypes and shapes
of its tensor arguments), so a later run of the same torch measures the same input.

**Model sizes.** A model graph's own shape variants (``v0``, ``v1``, ...), in inference
(``torch.no_grad``), float32.

Example::

    >>> from conformance.perf.items import PerfItem
    >>> item = PerfItem("op", "mm", "float32", "medium", index=3, signature="f32[10,10] f32[10,10]")
    >>> item.key
    'op|mm|float32|medium'
    >>> PerfItem.from_dict(item.as_dict()) == item
    True
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch

SIZE_LABELS = ("small", "medium", "large")
#: Input elements of an op's ``large`` size (a ladder rung: 2^16 + 1).
LARGE_NUMEL = 2**16 + 1
_SHORT = {torch.float32: "f32", torch.float64: "f64", torch.float16: "f16", torch.bfloat16: "bf16",
          torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8", torch.uint8: "u8",
          torch.bool: "b8", torch.complex64: "c64", torch.complex128: "c128"}


@dataclass(frozen=True)
class PerfItem:
    """One measured call: an op at one input size, a model graph at one shape variant, or a causal
    LM's decode step after a prompt bucket."""

    kind: str  # op | model | decode
    subject: str  # OpInfo name, or model id (a causal LM's for decode)
    dtype: str
    shape: str  # small | medium | large, or v0, v1, ..., or b8, b32, ... (the bucket)
    index: int = 0  # the OpInfo sample's index, the model's shape variant, or the bucket's length
    signature: str = ""  # its tensor arguments' dtypes and shapes

    @property
    def key(self) -> str:
        return f"{self.kind}|{self.subject}|{self.dtype}|{self.shape}"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PerfItem:
        return cls(**{k: d[k] for k in ("kind", "subject", "dtype", "shape", "index", "signature")})


def _tensors(value: Any) -> list[torch.Tensor]:
    from conformance.structure import tensor_leaves

    return tensor_leaves(value)


def signature(value: Any) -> str:
    """``f32[4,5] i64[3]``: the dtypes and shapes of the tensors in ``value``."""
    return " ".join(f"{_SHORT.get(t.dtype, str(t.dtype).removeprefix('torch.'))}[{','.join(map(str, t.shape))}]"
                    for t in _tensors(value))


def _sample_parts(sample: Any) -> tuple[Any, ...]:
    return (sample.input, tuple(sample.args), dict(sample.kwargs))


def op_sizes(info: Any, dtype: str) -> list[tuple[str, int, str]]:
    """``[(label, sample index, signature)]`` of an OpInfo in ``dtype`` (see the module doc)."""
    from conformance.inputs.opinfo import samples

    dt = getattr(torch, dtype)
    sized: list[tuple[int, int, str]] = []
    for i, sample in enumerate(samples(info, dt)):
        ts = _tensors(_sample_parts(sample))
        if (not isinstance(sample.input, torch.Tensor) or not ts
                or any(t.layout != torch.strided or t.numel() == 0 for t in ts)):
            continue
        sized.append((sum(t.numel() for t in ts), i, signature(_sample_parts(sample))))
    if not sized:
        return []
    small, medium = min(sized), max(sized)
    out = [("small", small[1], small[2])]
    if medium[0] != small[0]:
        out.append(("medium", medium[1], medium[2]))
    grown = _grown(info, dtype)
    if grown is not None:
        out.append(("large", LARGE_NUMEL, signature(_sample_parts(grown))))
    return out


#: A ``large`` input whose CPU call would take longer than this is not used (a pairwise loss grown to
#: 65,537 elements takes minutes): predicted from two CPU trials on the ladder's first rungs.
LARGE_CPU_S = 0.1


def _grown(info: Any, dtype: str, *, check: bool = True) -> Any | None:
    """The op's sample grown to :data:`LARGE_NUMEL` elements; None where none grows, its output
    would be too large, or (``check``: when the items are chosen, not when a worker rebuilds the
    chosen one, whose machine may be slower) its CPU call would be too slow
    (:data:`LARGE_CPU_S`) or the CPU refuses it grown (an even-size rule the grown length breaks)."""
    import math
    import time
    import warnings

    from conformance.inputs.opinfo import DEFAULT_SEED, full_name, samples
    from conformance.sweep import ladder

    op = full_name(info)
    found = ladder.seed_sample(info, enumerate(samples(info, getattr(torch, dtype))), op, dtype, DEFAULT_SEED)
    if isinstance(found, str):
        return None
    if found.out0 and found.out0 * (LARGE_NUMEL / max(found.in0, 1)) ** found.power > ladder.MAX_BYTES:
        return None

    def grown(numel: int) -> Any:
        return ladder.grow(found.sample, numel, seed=ladder.rung_seed(op, dtype, numel, DEFAULT_SEED))

    if not check:
        return grown(LARGE_NUMEL)

    def cpu_seconds(g: Any) -> float:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            t0 = time.perf_counter()
            info.op(g.input, *g.args, **g.kwargs)
            return time.perf_counter() - t0

    try:
        # two trials a quarter and a sixteenth of the size, the fastest of three calls each (a
        # loaded machine's stalls must not read as growth); the larger one only when even linear
        # growth from the smaller stays in budget (a pairwise loss is quadratic)
        quarter, sixteenth = grown(LARGE_NUMEL // 4), grown(LARGE_NUMEL // 16)
        if quarter is None or sixteenth is None:
            return None
        cpu_seconds(sixteenth)  # warm
        t0 = max(min(cpu_seconds(sixteenth) for _ in range(3)), 1e-6)
        if t0 * 16 > LARGE_CPU_S:
            return None
        t1 = max(min(cpu_seconds(quarter) for _ in range(3)), 1e-6)
        n0, n1 = sixteenth.input.numel(), quarter.input.numel()
        power = min(max(1.0, math.log(t1 / t0) / math.log(n1 / n0)), 3.0) if n1 > n0 else 1.0
        if t1 * (LARGE_NUMEL / n1) ** power > LARGE_CPU_S:
            return None
        sample = grown(LARGE_NUMEL)
        if sample is None:
            return None
        cpu_seconds(sample)  # the CPU must accept it grown
    except Exception:  # noqa: BLE001 - the CPU refuses it grown: no large size
        return None
    return sample


def op_items(ops: list[str], dtypes: tuple[str, ...]) -> tuple[list[PerfItem], list[tuple[str, str, str]]]:
    """The op items of OpInfos ``ops`` in ``dtypes`` (those each OpInfo supports on the CPU), and
    ``(op, dtype, why)`` for each pair that has none."""
    from conformance.inputs.opinfo import by_name, cpu_dtypes

    items, none = [], []
    for op in ops:
        info = by_name()[op]
        have = {str(d).removeprefix("torch.") for d in cpu_dtypes(info)}
        for dtype in dtypes:
            if dtype not in have:
                continue
            try:
                sizes = op_sizes(info, dtype)
            except Exception as exc:  # noqa: BLE001 - the OpInfo's generator itself failed: say so
                none.append((op, dtype, f"its samples could not be generated: {type(exc).__name__}: {exc}"))
                continue
            if not sizes:
                none.append((op, dtype, "no sample with only strided, non-empty tensors"))
            items.extend(PerfItem("op", op, dtype, label, index, sig) for label, index, sig in sizes)
    return items, none


def model_items(models: list[str], dtype: str = "float32") -> list[PerfItem]:
    """One item per model graph and shape variant."""
    from conformance.models.selection import resolve_spec

    out = []
    for model_id in models:
        spec = resolve_spec(model_id)
        for v in range(len(spec.shape_variants())):
            out.append(PerfItem("model", model_id, dtype, f"v{v}", v, signature(spec.example_inputs(v))))
    return out


def prepare(item: PerfItem, target: Any) -> tuple[Callable[[], Any], str]:
    """A zero-argument call that runs ``item`` once on ``target`` (its inputs already on the
    device), and the signature of the inputs it was built from (which must equal the item's)."""
    if item.kind == "op":
        import itertools

        from conformance.check.placement import on_cpu_where_wanted, on_device
        from conformance.inputs.opinfo import by_name, samples

        info = by_name()[item.subject]
        if item.shape == "large":
            sample = _grown(info, item.dtype, check=False)
            if sample is None:
                raise ValueError(f"{item.subject} {item.dtype}: its sample no longer grows to {item.index:,} elements")
        else:
            sample = next(itertools.islice(samples(info, getattr(torch, item.dtype)), item.index, None))
        sig = signature(_sample_parts(sample))
        fn = target.wrap(info.op)
        placed: list[Any] = []

        def run() -> tuple[Any, Any]:
            dev = on_device(sample, target.device)
            placed[:] = [dev]
            return fn(dev.input, *dev.args, **dev.kwargs), dev

        # arguments the op wants on the CPU (tensor_split's indices) are learned from its error
        on_cpu_where_wanted(sample, f"perf|{item.subject}", run)
        dev = placed[0]
        x, args, kwargs = dev.input, tuple(dev.args), dict(dev.kwargs)
        return (lambda: fn(x, *args, **kwargs)), sig
    if item.kind == "model":
        from conformance.models.selection import resolve_spec

        spec = resolve_spec(item.subject)
        model = spec.build().eval()
        inputs = spec.example_inputs(item.index)
        sig = signature(inputs)
        model = model.to(target.device)
        inputs = target.to_device(inputs)
        fwd = target.wrap(model)

        def call() -> Any:
            with torch.no_grad():
                return fwd(*inputs)
        return call, sig
    raise ValueError(f"perf item kind {item.kind!r}: expected op or model (decode items: conformance.perf.decode)")
