"""Loading the user's model and inputs: ``MODULE:CALLABLE`` references and shape sets."""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .results import AuditInputError

DEFAULT_INT_HIGH = 16  # integer inputs are drawn from [0, high): the smallest nn.Embedding size if any


DTYPE_NAMES = {"float32": torch.float32, "float": torch.float32, "float64": torch.float64, "double": torch.float64,
               "float16": torch.float16, "half": torch.float16, "bfloat16": torch.bfloat16,
               "int64": torch.int64, "long": torch.int64, "int32": torch.int32, "int": torch.int32,
               "int16": torch.int16, "int8": torch.int8, "uint8": torch.uint8, "bool": torch.bool,
               "complex64": torch.complex64, "complex128": torch.complex128}


@dataclass(frozen=True)
class InputSpec:
    shape: tuple[int, ...]
    dtype: str

    def label(self) -> str:
        return f"[{','.join(map(str, self.shape))}] {self.dtype}"


def parse_shape_set(text: str) -> list[InputSpec]:
    """``"1,3,224,224:float32"`` (one input) or ``"2,16:int64;2,16:bool"`` (several inputs)."""
    specs = []
    for part in [p.strip() for p in text.split(";")]:
        if not part:
            raise AuditInputError(f"shape {text!r} does not parse: empty input; expected e.g. '1,3,224,224:float32'")
        dims, _, dt = part.partition(":")
        dt = (dt.strip() or "float32").lower().removeprefix("torch.")
        if dt not in DTYPE_NAMES:
            raise AuditInputError(f"shape {text!r} does not parse: unknown dtype {dt!r}; known: "
                                  f"{', '.join(sorted(DTYPE_NAMES))}")
        try:
            shape = tuple(int(d) for d in dims.split(",")) if dims.strip() else ()
        except ValueError:
            raise AuditInputError(f"shape {text!r} does not parse: dimensions must be integers, "
                                  "e.g. '1,3,224,224:float32'") from None
        if any(d < 0 for d in shape):
            raise AuditInputError(f"shape {text!r} does not parse: negative dimension")
        specs.append(InputSpec(shape, str(DTYPE_NAMES[dt]).removeprefix("torch.")))
    return specs


def load_callable(ref: str, what: str = "MODULE:CALLABLE") -> Any:
    if ":" not in ref:
        raise AuditInputError(f"{ref!r} is not {what} (e.g. examples.audit_example:build)")
    mod_name, _, attr = ref.partition(":")
    if "" not in sys.path and "." not in sys.path:
        sys.path.insert(0, "")  # the current directory, as `python -m` has it
    from conformance.models import tvshim

    tvshim.ensure()  # a user's model may import torchvision, timm or transformers (they import torchvision)
    try:
        mod = importlib.import_module(mod_name)
    except Exception as exc:  # noqa: BLE001 - a user module: any import error is bad input
        raise AuditInputError(f"module {mod_name!r} does not import: {type(exc).__name__}: {exc}") from None
    obj: Any = mod
    for name in attr.split("."):
        if not hasattr(obj, name):
            raise AuditInputError(f"module {mod_name!r} has no attribute {attr!r}")
        obj = getattr(obj, name)
    if not callable(obj):
        raise AuditInputError(f"{ref} is not callable")
    return obj


def _int_high(model: nn.Module) -> int:
    sizes = [m.num_embeddings for m in model.modules() if isinstance(m, nn.Embedding)]
    return min(sizes) if sizes else DEFAULT_INT_HIGH


def make_inputs(specs: list[InputSpec], model: nn.Module, seed: int) -> tuple:
    """Seeded inputs: normal floats, integers in ``[0, smallest embedding)``, random bools."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for s in specs:
        dt = DTYPE_NAMES[s.dtype]
        if dt.is_floating_point or dt.is_complex:
            out.append(torch.randn(s.shape, generator=gen, dtype=dt))
        elif dt == torch.bool:
            out.append(torch.randint(0, 2, s.shape, generator=gen).bool())
        else:
            out.append(torch.randint(0, _int_high(model), s.shape, generator=gen, dtype=dt))
    return tuple(out)


def as_inputs(value: Any, where: str) -> tuple:
    if isinstance(value, torch.Tensor):
        return (value,)
    if isinstance(value, (tuple, list)):
        return tuple(value)
    raise AuditInputError(f"{where} returned {type(value).__name__}; expected a tensor or a tuple of inputs")


def load_model(ref: str, seed: int = 0) -> tuple[nn.Module, tuple | None]:
    """Call ``MODULE:CALLABLE`` (seeded): an ``nn.Module``, or ``(module, example_inputs)``."""
    fn = load_callable(ref)
    torch.manual_seed(seed)
    try:
        value = fn()
    except Exception as exc:  # noqa: BLE001
        raise AuditInputError(f"{ref} raised {type(exc).__name__}: {exc}") from None
    inputs = None
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], nn.Module):
        value, inputs = value
        inputs = as_inputs(inputs, ref)
    if not isinstance(value, nn.Module):
        raise AuditInputError(f"{ref} returned {type(value).__name__}; expected an nn.Module "
                              "or a tuple (nn.Module, example inputs)")
    return value, inputs
