"""Which custom ops a target has: found by asking the dispatcher, never from a list.

A *custom op* of a target is an operator registered with a kernel for the target's device
dispatch key (``PrivateUse1`` for an out-of-tree device such as ``neuron``, ``CPU``, ``CUDA``)
outside PyTorch's own namespaces. Which namespaces are PyTorch's is measured, not listed:

- the namespaces a fresh Python process holds after ``import torch`` alone (device backend
  autoload off, so that no device package registers anything there), measured once per torch
  version and cached (:func:`torch_namespaces`);
- and an op of another namespace whose schema was defined from a file inside torch's own package
  (``fsdp::``, ``quantized_decomposed::``: modules of torch that register ops when they are first
  imported), except through torch's custom-op API (``torch.library``, ``torch._library``), which
  defines every caller's op from its own lines (:func:`defined_by_torch`).

On the CPU target this finds nothing; on a device whose package registers kernels for its key
(the emulated neuron device's ``neuron::rms_norm``, an NKI kernel's ``@nki_op("ns::name")``) it
finds those.

Example::

    >>> device_key("cpu"), device_key("meta")
    ('CPU', 'Meta')
    >>> "aten" in torch_namespaces() and "prims" in torch_namespaces()
    True
    >>> discover("cpu")
    []
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

# What the fresh process prints: the namespaces of every op registered once torch is imported.
_PROBE = ("import json, torch; "
          "print(json.dumps(sorted({n.split('::', 1)[0] for n in torch._C._dispatch_get_all_op_names()})))")
#: Environment of the probe: torch's device-backend autoload (entry points ``torch.backends``) off,
#: so that an installed device package (torch-neuronx autoloads) registers nothing in it.
PROBE_ENV = {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
PROBE_TIMEOUT_S = 300


class DiscoveryError(RuntimeError):
    """PyTorch's own namespaces could not be measured (the probe process failed)."""


def device_key(device: str) -> str:
    """The dispatch key of a device's kernels (``neuron`` -> ``PrivateUse1``)."""
    return torch._C._dispatch_key_for_device(torch.device(device).type)


def _cache_path() -> Path:
    from conformance.catalog.overloads import cache_dir

    return cache_dir() / f"torch-namespaces-{torch.__version__}.json"


@functools.cache
def torch_namespaces() -> frozenset[str]:
    """The op namespaces of ``import torch`` alone, measured in a fresh process (a few seconds,
    once per torch version: cached beside the overload catalog's cache)."""
    path = _cache_path()
    try:
        return frozenset(json.loads(path.read_text()))
    except (OSError, ValueError):
        pass  # not measured yet (or a damaged cache): measure
    try:
        done = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True,
                              timeout=PROBE_TIMEOUT_S, env={**os.environ, **PROBE_ENV})
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DiscoveryError(f"measuring PyTorch's own op namespaces: {exc}") from exc
    try:
        names = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        raise DiscoveryError(f"measuring PyTorch's own op namespaces: `{sys.executable} -c ...` exited "
                             f"{done.returncode}: {done.stderr.strip()[-500:]}") from None
    if "aten" not in names:
        raise DiscoveryError(f"measuring PyTorch's own op namespaces: no aten among {names}")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(names))
    tmp.replace(path)
    return frozenset(names)


@functools.cache
def _torch_dirs() -> tuple[str, tuple[str, ...]]:
    """(torch's package folder, the folders and files of its custom-op API)."""
    import torch._library
    import torch.library

    root = os.path.dirname(os.path.realpath(torch.__file__)) + os.sep
    api = (os.path.dirname(os.path.realpath(torch._library.__file__)) + os.sep,
           os.path.realpath(torch.library.__file__))
    return root, api


def defined_by_torch(name: str) -> bool:
    """Whether the op ``name`` (``ns::op`` or ``ns::op.overload``) was defined by a module of torch
    itself (its schema registered from a file in torch's package, outside its custom-op API)."""
    base, _, overload = name.partition(".")
    try:
        debug = torch._C._dispatch_find_schema_or_throw(base, overload).debug()
    except RuntimeError:
        return False
    where = debug.removeprefix("registered at ").rsplit(":", 1)[0]
    where = os.path.realpath(where) if os.path.isabs(where) else where
    root, api = _torch_dirs()
    return where.startswith(root) and not any(where == a or where.startswith(a) for a in api if a)


def overload_name(name: str) -> str:
    """The dispatcher's name as an overload (``neuron::rms_norm`` -> ``neuron::rms_norm.default``)."""
    return name if "." in name.split("::", 1)[1] else f"{name}.default"


def discover(device: str) -> list[str]:
    """The custom ops registered for ``device``'s dispatch key, as sorted overload names."""
    key, own = device_key(device), torch_namespaces()
    found = []
    for name in torch._C._dispatch_get_all_op_names():
        if name.split("::", 1)[0] in own or not torch._C._dispatch_has_kernel_for_dispatch_key(name, key):
            continue
        if not defined_by_torch(name):
            found.append(overload_name(name))
    return sorted(found)


def resolve(name: str) -> torch._ops.OpOverload:
    """The ``OpOverload`` of an overload name (``neuron::rms_norm.default``)."""
    ns, rest = name.split("::", 1)
    op, _, overload = rest.partition(".")
    return getattr(getattr(getattr(torch.ops, ns), op), overload or "default")
