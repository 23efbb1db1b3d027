"""Stored inputs: a format that cannot run code when it is read.

A blob is ``MAGIC`` followed by a ``torch.save`` archive of exactly ``{"format", "structure",
"tensors"}``: the tensors (loadable with ``torch.load(..., weights_only=True)``, whose unpickler
admits tensors and plain containers only) and a JSON text that says how they nest among plain
values. Nothing in it names a Python callable, so reading a tampered database cannot execute
anything. Blobs written before this format (a bare ``torch.save`` pickle, which can hold any
object and run code on load) are refused, never unpickled.

Example::

    >>> import torch
    >>> from opdb.blobs import dump_inputs, load_inputs
    >>> blob = dump_inputs({"args": [torch.ones(2), 3, torch.float16], "kwargs": {"alpha": 0.5}})
    >>> back = load_inputs(blob)
    >>> back["args"][1:], back["kwargs"]
    ([3, torch.float16], {'alpha': 0.5})
"""

from __future__ import annotations

import io
import json
from typing import Any

import torch

from .store import OpdbError

MAGIC = b"opdb-inputs/1\n"
FORMAT = "opdb-inputs/1"


class UnsafeInputs(OpdbError):
    """Stored inputs that are not in the safe format (or are damaged); they are never unpickled."""


def _encode(value: Any, tensors: list[torch.Tensor]) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return {"$float": repr(value)}  # repr round-trips nan, inf and -0.0 exactly
    if isinstance(value, torch.Tensor):
        tensors.append(value.detach())
        return {"$tensor": len(tensors) - 1, "grad": bool(value.requires_grad)}
    if isinstance(value, torch.UntypedStorage):  # stored as a uint8 tensor over all of it
        whole = torch.empty(0, dtype=torch.uint8, device=value.device).set_(value, 0, (value.nbytes(),), (1,))
        tensors.append(whole)
        return {"$storage": len(tensors) - 1}
    if isinstance(value, torch.Size):
        return {"$size": [int(v) for v in value]}
    if isinstance(value, list):
        return [_encode(v, tensors) for v in value]
    if isinstance(value, tuple):
        return {"$tuple": [_encode(v, tensors) for v in value]}
    if isinstance(value, dict):
        return {"$dict": [[_encode(k, tensors), _encode(v, tensors)] for k, v in value.items()]}
    if isinstance(value, complex):
        return {"$complex": [repr(value.real), repr(value.imag)]}
    if isinstance(value, torch.dtype):
        return {"$dtype": str(value).removeprefix("torch.")}
    if isinstance(value, torch.layout):
        return {"$layout": str(value).removeprefix("torch.")}
    if isinstance(value, torch.memory_format):
        return {"$memory_format": str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return {"$device": str(value)}
    if isinstance(value, slice):
        return {"$slice": [_encode(v, tensors) for v in (value.start, value.stop, value.step)]}
    if value is Ellipsis:
        return {"$ellipsis": None}
    raise ValueError(f"a value of type {type(value).__name__} cannot be stored as inputs "
                     "(only tensors, storages, numbers, strings, dtypes, devices and containers of them)")


# The decoder is self-contained on purpose: repro scripts embed its source (inspect.getsource)
# so that they load their inputs exactly as opdb does, without importing the harness.
def decode_inputs(raw: bytes) -> Any:
    """Decode a blob: refuses anything but the safe format; never unpickles arbitrary objects."""
    import io as _io
    import json as _json

    import torch as _torch

    magic = b"opdb-inputs/1\n"
    if not raw.startswith(magic):
        if raw[:2] == b"PK" or raw[:1] == b"\x80":
            raise ValueError("stored in the old pickle format, which can run code when loaded; refusing to load "
                             "it (re-run the item to store its inputs in the safe format)")
        raise ValueError(f"not an inputs blob (starts with {raw[:16]!r})")
    try:
        box = _torch.load(_io.BytesIO(raw[len(magic):]), weights_only=True)
    except Exception as exc:  # noqa: BLE001 - the restricted unpickler refused it, or it is damaged
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        raise ValueError(f"damaged or unsafe inputs blob ({type(exc).__name__}: {first})") from None
    if (not isinstance(box, dict) or set(box) != {"format", "structure", "tensors"} or box["format"] != "opdb-inputs/1"
            or not isinstance(box["structure"], str) or not isinstance(box["tensors"], list)
            or not all(isinstance(t, _torch.Tensor) for t in box["tensors"])):
        raise ValueError("inputs blob has an unexpected layout")
    tensors = box["tensors"]

    def member(mod: Any, name: Any, kind: type) -> Any:
        if not isinstance(name, str) or not name.isidentifier() or name.startswith("_"):
            raise ValueError(f"bad {kind.__name__} name {name!r} in inputs blob")
        found = getattr(mod, name, None)
        if not isinstance(found, kind):
            raise ValueError(f"unknown {kind.__name__} {name!r} in inputs blob")
        return found

    def dec(v: Any) -> Any:
        if v is None or isinstance(v, (bool, int, str)):
            return v
        if isinstance(v, list):
            return [dec(x) for x in v]
        if not isinstance(v, dict) or len(v) not in (1, 2):
            raise ValueError(f"unexpected value {str(v)[:80]!r} in inputs blob")
        tag = next(iter(v))
        arg = v[tag]
        if tag == "$tensor" and isinstance(arg, int) and 0 <= arg < len(tensors) and isinstance(v.get("grad"), bool):
            t = tensors[arg]
            return t.requires_grad_(True) if v["grad"] and (t.is_floating_point() or t.is_complex()) else t
        if len(v) != 1:
            raise ValueError(f"unexpected value {str(v)[:80]!r} in inputs blob")
        if tag == "$storage" and isinstance(arg, int) and 0 <= arg < len(tensors) \
                and tensors[arg].dtype == _torch.uint8 and tensors[arg].dim() == 1:
            return tensors[arg].untyped_storage()
        if tag == "$float" and isinstance(arg, str):
            return float(arg)
        if tag == "$complex" and isinstance(arg, list) and len(arg) == 2 and all(isinstance(a, str) for a in arg):
            return complex(float(arg[0]), float(arg[1]))
        if tag == "$size" and isinstance(arg, list) and all(type(a) is int for a in arg):
            return _torch.Size(arg)
        if tag == "$tuple" and isinstance(arg, list):
            return tuple(dec(x) for x in arg)
        if tag == "$dict" and isinstance(arg, list) and all(isinstance(p, list) and len(p) == 2 for p in arg):
            return {dec(k): dec(x) for k, x in arg}
        if tag == "$dtype":
            return member(_torch, arg, _torch.dtype)
        if tag == "$layout":
            return member(_torch, arg, _torch.layout)
        if tag == "$memory_format":
            return member(_torch, arg, _torch.memory_format)
        if tag == "$device" and isinstance(arg, str):
            return _torch.device(arg)
        if tag == "$slice" and isinstance(arg, list) and len(arg) == 3:
            return slice(*(dec(x) for x in arg))
        if tag == "$ellipsis" and arg is None:
            return Ellipsis
        raise ValueError(f"unexpected value {str(v)[:80]!r} in inputs blob")

    try:
        return dec(_json.loads(box["structure"]))
    except (TypeError, RuntimeError, RecursionError) as exc:  # unhashable keys, bad devices, deep nesting
        raise ValueError(f"inputs blob has a malformed structure ({type(exc).__name__}: {exc})") from None


def dump_inputs(value: Any) -> bytes:
    """Serialise ``value`` (tensors, numbers, strings, dtypes, devices, containers) as a safe blob.

    Raises ValueError for anything else. The blob is read back once before it is returned, so
    what is stored is known to load with ``weights_only=True``.
    """
    tensors: list[torch.Tensor] = []
    structure = json.dumps(_encode(value, tensors), allow_nan=False)
    buf = io.BytesIO()
    torch.save({"format": FORMAT, "structure": structure, "tensors": tensors}, buf)
    blob = MAGIC + buf.getvalue()
    try:
        decode_inputs(blob)
    except ValueError as exc:
        raise ValueError(f"inputs cannot be stored safely: {exc}") from None
    return blob


def load_inputs(blob: bytes | None, *, where: str = "stored inputs") -> Any:
    """Read a blob written by :func:`dump_inputs`; raises :class:`UnsafeInputs` naming ``where``
    for old pickle blobs, tampered or damaged ones, without executing anything."""
    if not isinstance(blob, (bytes, bytearray, memoryview)):
        raise UnsafeInputs(f"{where}: not a binary inputs blob (found {type(blob).__name__})")
    try:
        return decode_inputs(bytes(blob))
    except ValueError as exc:
        raise UnsafeInputs(f"{where}: {exc}") from None
