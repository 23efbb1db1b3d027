"""Inputs from PyTorch's OpInfo database (``torch.testing._internal``).

Example::

    >>> from conformance.inputs.opinfo import infos, full_name
    >>> "abs" in {full_name(i) for i in infos()}
    True
"""

from __future__ import annotations

import random
import warnings
from collections.abc import Callable, Iterator
from functools import cache
from typing import Any

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

DEFAULT_SEED = 20261130


@cache
def infos() -> tuple[Any, ...]:
    """Every OpInfo in ``op_db`` (imported lazily: it takes seconds)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch.testing._internal.common_methods_invocations import op_db
    return tuple(op_db)


def full_name(info: Any) -> str:
    """OpInfo name plus its variant name, e.g. ``nn.functional.conv2d`` or ``max.reduction_with_dim``."""
    return f"{info.name}.{info.variant_test_name}" if info.variant_test_name else info.name


@cache
def by_name() -> dict[str, Any]:
    return {full_name(i): i for i in infos()}


def cpu_dtypes(info: Any) -> set[torch.dtype]:
    return set(info.supported_dtypes("cpu"))


def seed_all(seed: int) -> None:
    # torch.manual_seed is slow here (records a stack for CUDA lazy init); this is not.
    torch.default_generator.manual_seed(seed)


#: The sparse variants: the OpInfo's own samples in that layout (``sample_inputs_sparse_coo_func``
#: and its siblings), called through the function variant. Upstream's test_sparse runs them.
SPARSE_VARIANTS = ("sparse_coo", "sparse_csr", "sparse_csc", "sparse_bsr", "sparse_bsc")
_SUPPORTS = {"sparse_coo": "supports_sparse", "sparse_csr": "supports_sparse_csr", "sparse_csc": "supports_sparse_csc",
             "sparse_bsr": "supports_sparse_bsr", "sparse_bsc": "supports_sparse_bsc"}


def sparse_samples_fn(info: Any, layout: str) -> Callable[..., Any] | None:
    """The OpInfo's sample function for sparse ``layout`` (a :data:`SPARSE_VARIANTS` name), or
    None when it declares no support for the layout or gives no function of its own (upstream
    then raises NotImplementedError, "no sample function specified")."""
    if not getattr(info, _SUPPORTS[layout], False):
        return None
    fn = getattr(info, f"sample_inputs_{layout}_func", None)
    inner = getattr(fn, "__wrapped__", fn)  # torch.no_grad()'s wrapper
    if fn is None or getattr(inner, "__name__", "") == "_sample_inputs_unspecified":
        return None
    return fn


def samples(info: Any, dtype: torch.dtype, *, thorough: bool = False, seed: int = DEFAULT_SEED,
            requires_grad: bool = False, layout: str | None = None) -> Iterator[Any]:
    """SampleInputs on the CPU, generated from a fixed seed; ``layout``: a sparse variant's
    samples (:data:`SPARSE_VARIANTS`) instead of the strided ones.

    Sample ``i`` depends on the seed alone: the generator draws from a torch random state of
    its own, swapped in around each ``next`` and out again, so what the caller runs between two
    samples (a random op, a device drawing from the global generator) cannot change the later
    samples, and ``conformance repro`` regenerates exactly the sample the sweep ran. Python's
    ``random`` and numpy's global state are seeded when the generator starts (OpInfos draw an
    ``eps`` or indices from them; ``random`` was not seeded, and each build of a nightly got
    other inputs under the same item key); the ops and devices do not draw from those two, so
    they are not swapped (numpy's swap costs ~150 us a sample). The global torch state the
    caller sees is seeded (:func:`seed_all`) once, when the generator starts: the items'
    starting point."""
    seed_all(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)
    gen_state = torch.default_generator.get_state()
    # The generator functions are called directly: OpInfo.sample_inputs wraps them in
    # TrackedInputIter, which walks the Python stack and reseeds through torch.manual_seed
    # for every sample (milliseconds each; more than the ops themselves).
    fn = info.sample_inputs_func
    if thorough and info.reference_inputs_func is not None:
        fn = info.reference_inputs_func
    if layout is not None:
        fn = sparse_samples_fn(info, layout)
        if fn is None:
            raise ValueError(f"OpInfo {full_name(info)} has no {layout} samples")
    gen = None
    while True:
        outer = torch.default_generator.get_state()
        torch.default_generator.set_state(gen_state)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                if gen is None:
                    gen = iter(fn(info, "cpu", dtype, requires_grad))
                sample = next(gen)
        except StopIteration:
            return
        finally:
            gen_state = torch.default_generator.get_state()
            torch.default_generator.set_state(outer)
        yield sample


#: The variant of an OpInfo's ``reference_inputs`` that its ``sample_inputs`` do not hold: the
#: function called on them (:func:`reference_only`; :mod:`conformance.sweep.reference` runs them).
REFERENCE = "reference"


def has_reference_inputs(info: Any) -> bool:
    """Whether the OpInfo has a ``reference_inputs_func`` of its own (without one, upstream's
    ``reference_inputs`` are its ``sample_inputs``)."""
    return info.reference_inputs_func is not None


def structure(sample: Any) -> tuple[Any, ...]:
    """A sample's structure, its values aside: each tensor's layout, dtype, shape and strides (and
    whether it requires grad), every other argument by its full ``repr`` (a callable by its name),
    keyword arguments by name. Two generators give one structure different values, so
    :func:`reference_only` compares structures, never values.

        >>> import torch
        >>> from torch.testing._internal.opinfo.core import SampleInput
        >>> a = SampleInput(torch.ones(4, 3).t(), args=(1,), kwargs={"alpha": 2})
        >>> structure(a)
        (('tensor', 'torch.strided', 'torch.float32', (3, 4), (1, 3), False), '1', (('alpha', '2'),))
        >>> structure(a) == structure(SampleInput(torch.zeros(4, 3).t(), args=(1,), kwargs={"alpha": 2}))
        True
    """
    def one(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            strides = tuple(x.stride()) if x.layout == torch.strided else None
            return ("tensor", str(x.layout), str(x.dtype), tuple(x.shape), strides, x.requires_grad)
        if isinstance(x, (list, tuple)):
            return (type(x).__name__, *map(one, x))
        if isinstance(x, dict):
            return ("dict", *((k, one(v)) for k, v in sorted(x.items(), key=lambda kv: str(kv[0]))))
        if callable(x) and not isinstance(x, (torch.dtype, torch.device, torch.layout, torch.memory_format)):
            return ("callable", getattr(x, "__qualname__", None) or type(x).__qualname__)
        return repr(x)

    return (one(sample.input), *map(one, sample.args), tuple((k, one(v)) for k, v in sorted(sample.kwargs.items())))


def reference_only(info: Any, dtype: torch.dtype, *, seed: int = DEFAULT_SEED) -> Iterator[tuple[int, Any]]:
    """``(i, sample)`` of the OpInfo's ``reference_inputs`` whose :func:`structure` none of its
    ``sample_inputs`` has, ``i`` the index within ``reference_inputs`` (stable: it does not depend
    on the dedupe). Nothing for an OpInfo without a ``reference_inputs_func`` of its own. Most
    reference functions yield the samples first and then more (extremal values, larger and
    non-contiguous shapes); a later reference sample of a structure a sample has is left out too,
    whatever its values."""
    if not has_reference_inputs(info):
        return
    known = {structure(s) for s in samples(info, dtype, seed=seed)}
    for i, sample in enumerate(samples(info, dtype, thorough=True, seed=seed)):
        if structure(sample) not in known:
            yield i, sample


def variant_fn(info: Any, variant: str) -> Callable[..., Any] | None:
    """The callable for ``function`` / ``inplace`` / ``out`` / a sparse variant / ``reference``
    (None when the OpInfo lacks it; a sparse variant and ``reference`` call the function on
    samples of their own)."""
    if variant == "function":
        return info.op
    if variant == REFERENCE:
        return info.op if has_reference_inputs(info) else None
    if variant == "inplace":
        return info.inplace_variant
    if variant == "out":
        return info.op if info.supports_out else None
    if variant in SPARSE_VARIANTS:
        return info.op if sparse_samples_fn(info, variant) is not None else None
    raise ValueError(f"unknown variant {variant!r}; expected function, inplace, out, {REFERENCE} or one of "
                     f"{', '.join(SPARSE_VARIANTS)}")


class _Recorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.hits: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        if func.namespace == "aten":
            self.hits.add(f"aten::{func._schema.name.split('::', 1)[1]}.{func._overloadname}")
        return func(*args, **(kwargs or {}))


def _call(fn: Callable[..., Any], sample: Any) -> Any:
    return fn(sample.input, *sample.args, **sample.kwargs)


def first_sample_overloads(seed: int = DEFAULT_SEED) -> dict[str, list[str]]:
    """For each OpInfo: the overloads its first float32 sample reaches (function, in-place and
    out variants), recorded by a dispatch mode below autograd."""
    result: dict[str, list[str]] = {}
    for info in infos():
        name = full_name(info)
        dtype = torch.float32 if torch.float32 in cpu_dtypes(info) else next(
            iter(sorted(cpu_dtypes(info), key=str)), None)
        if dtype is None:
            result[name] = []
            continue
        rec = _Recorder()
        try:
            sample = next(samples(info, dtype, seed=seed))
        except Exception:  # noqa: BLE001 - an OpInfo whose generator fails reaches nothing
            result[name] = []
            continue
        for variant in ("function", "inplace", "out"):
            fn = variant_fn(info, variant)
            if fn is None:
                continue
            try:
                args = sample
                if variant == "inplace":
                    args = sample.transform(lambda t: t.clone() if isinstance(t, torch.Tensor) else t)
                with warnings.catch_warnings(), rec:
                    warnings.simplefilter("ignore")
                    out = _call(fn, args)
                    if variant == "out":
                        outs = out if isinstance(out, (tuple, list)) else (out,)
                        if all(isinstance(o, torch.Tensor) for o in outs):
                            empties = tuple(o.new_empty(0) for o in outs)
                            fn(args.input, *args.args, **args.kwargs,
                               out=empties if isinstance(out, (tuple, list)) else empties[0])
            except Exception:  # noqa: BLE001 - record what was reached before the failure
                pass
        result[name] = sorted(rec.hits)
    return result
