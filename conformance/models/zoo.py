"""The model zoo's common ground: what every library's architecture spec shares.

The zoo enumerates architectures from the libraries themselves (``transformers`` through its auto
mappings, ``timm.list_models()``, ``torchvision.models.list_models()``); each one becomes a spec
with the ``GraphSpec`` interface (``model_id``, ``family``, ``params``, ``supports_bf16``,
``build()``, ``example_inputs(v)``, ``shape_variants()``, ``loss(out)``, ``trace()``). Model ids:
``hf.<model_type>``, ``timm.<name>``, ``tv.<name>``; ``family`` is the library (``hf``, ``timm``,
``tv``) and ``params["arch_family"]`` the architecture family inside it (timm's module,
torchvision's task and module, the transformers model type's modality).

An architecture the library cannot give us (over the budget, fails to build, its inputs cannot be
built, it fails on the CPU itself) is no finding about a target: the spec raises :class:`ZooSkip`
with the library's own reason, and the model lane stores a ``skip`` row that says so. Nothing is
dropped silently.

The budget is decided before anything is allocated: :func:`count_params` builds the module on the
``meta`` device and counts its parameters.

Example::

    >>> from torch import nn
    >>> count_params(lambda: nn.Linear(1000, 1000))
    1001000
    >>> try:
    ...     check_budget("timm.big", lambda: nn.Linear(10_000, 10_000), max_params=1_000_000)
    ... except ZooSkip as s:
    ...     print(s)
    over budget: 100,010,000 parameters > 1,000,000 (CONFORMANCE_ZOO_MAX_PARAMS)
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch
from torch import nn

__all__ = ["LIBRARIES", "OverBudget", "ZooSkip", "build_within_budget", "check_budget", "count_params", "max_params"]

LIBRARIES = ("hf", "timm", "tv")  # model id prefixes of the zoo's libraries

DEFAULT_MAX_PARAMS = 100_000_000  # ViT-B and CLIP-B (~86M) fit; a float32 copy is 400 MB, an item keeps about eight


class ZooSkip(Exception):
    """The library cannot give this architecture here; ``str()`` is the reason, stored in ``error``."""


class OverBudget(ZooSkip):
    """More parameters than the budget: no other build of the architecture (another image size) fits either."""


def max_params() -> int:
    """The parameter budget of one architecture (``CONFORMANCE_ZOO_MAX_PARAMS``, a positive integer)."""
    raw = os.environ.get("CONFORMANCE_ZOO_MAX_PARAMS")
    if raw is None:
        return DEFAULT_MAX_PARAMS
    try:
        value = int(raw.replace("_", ""))
    except ValueError:
        value = 0
    if value <= 0:
        raise ValueError(f"CONFORMANCE_ZOO_MAX_PARAMS={raw!r}: expected a positive integer (parameters per model)")
    return value


def count_params(build: Callable[[], nn.Module]) -> int:
    """Parameters of the module ``build()`` makes, built on the ``meta`` device (nothing allocated)."""
    with torch.device("meta"):
        module = build()
    return sum(p.numel() for p in module.parameters())


def check_budget(model_id: str, build: Callable[[], nn.Module], max_params: int | None = None) -> int:
    """The parameter count, or :class:`ZooSkip` when it is over the budget or cannot be counted."""
    limit = max_params if max_params is not None else globals()["max_params"]()
    try:
        n = count_params(build)
    except Exception as exc:  # noqa: BLE001 - the library's own reason
        raise ZooSkip(f"{META}: {type(exc).__name__}: {exc}"[:2000]) from exc
    if n > limit:
        raise OverBudget(f"over budget: {n:,} parameters > {limit:,} (CONFORMANCE_ZOO_MAX_PARAMS)")
    return n


META = "cannot be built on the meta device"


def build_within_budget(model_id: str, make: Callable[[], nn.Module], seed: int, stage: str) -> nn.Module:
    """``make()`` with the default generator seeded by ``seed`` (restored after), within the budget.

    The parameters are counted on the meta device first; a model whose construction fails there
    (a library that allocates or checks values while building) is built for real and counted
    after, so that its reason is the real build's. A failing build is :class:`ZooSkip`
    ``"{stage} failed: ..."`` with the library's message.
    """
    try:
        check_budget(model_id, make)
        counted = True
    except ZooSkip as skip:
        if not str(skip).startswith(META):
            raise
        counted = False
    gen = torch.default_generator
    saved = gen.get_state()
    gen.manual_seed(seed)
    try:
        model = make()
    except Exception as exc:  # noqa: BLE001 - the library's own reason
        raise ZooSkip(f"{stage} failed: {type(exc).__name__}: {exc}"[:2000]) from exc
    finally:
        gen.set_state(saved)
    if not counted:
        check_budget(model_id, lambda: model)
    return model
