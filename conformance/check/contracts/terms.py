"""Contract terms: the contracts' names, how ``--contracts`` picks them, one check's result and the
item the checks look at (:mod:`conformance.check.contracts` holds the checks' table and entry point).

Example::

    >>> from conformance.check.contracts.terms import Check, failed, parse_contracts
    >>> parse_contracts(["determinism,out"])
    ('out', 'determinism')
    >>> failed({"out": Check("fail", "data_ptr changed"), "errors": Check("pass")})
    ['out']
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any, Literal

import torch

from conformance.check import execute
from conformance.check.compare import compare, leaves
from conformance.check.execute import Outcome, on_device, phase, to_cpu
from conformance.check.ledger import torch_default
from conformance.targets import Target

#: Every contract, in the order rows and reports show them.
CONTRACTS: tuple[str, ...] = ("metadata", "aliasing", "noncontiguous", "variants", "out", "errors",
                              "determinism")
#: The contracts checked on a compiler target unless ``--contracts`` names others: the rest call
#: the compiled function with new input layouts or dtypes, and every such call compiles again.
COMPILER_DEFAULT: tuple[str, ...] = ("metadata", "variants", "determinism")

#: Samples per op x dtype called twice for "determinism" (a kernel that is not deterministic
#: rarely is so for one input only; every sample would add a call to every function item).
DETERMINISM_SAMPLES = 2
#: Calls on the CPU that must all be bitwise equal before a target is held to determinism.
CPU_DETERMINISM_TRIES = 6

Outcome_ = Literal["pass", "fail", "n/a"]


@dataclass(frozen=True)
class Check:
    """One contract's result on one item."""

    outcome: Outcome_
    detail: str = ""

    def as_json(self) -> dict[str, str]:
        return {"outcome": self.outcome, "detail": self.detail}


PASS = Check("pass")


def na(why: str) -> Check:
    """A check that cannot be made on the item, and why."""
    return Check("n/a", why)


def fail(why: str) -> Check:
    """A check that failed, with its evidence."""
    return Check("fail", why)


def parse_contracts(values: Collection[str], target: Target | None = None) -> tuple[str, ...]:
    """``--contracts`` values: names, ``all``, ``none`` or ``default`` (every contract on an
    eager target, :data:`COMPILER_DEFAULT` on a compiler target); comma-separated or repeated.

        >>> parse_contracts(["out,errors"]), parse_contracts(["none"])
        (('out', 'errors'), ())
    """
    names = [n.strip() for v in values for n in str(v).split(",") if n.strip()]
    if names == ["none"]:
        return ()
    if "all" in names:
        return CONTRACTS
    if names == ["default"] or not names:
        return CONTRACTS if target is None else default_for(target)
    bad = [n for n in names if n not in CONTRACTS]
    if bad:
        raise ValueError(f"unknown contract {bad[0]!r}; expected one of {', '.join(CONTRACTS)}, all or none")
    return tuple(c for c in CONTRACTS if c in names)


def default_for(target: Target) -> tuple[str, ...]:
    if target.default_contracts is not None:
        return tuple(c for c in CONTRACTS if c in target.default_contracts)
    return COMPILER_DEFAULT if target.compiler else CONTRACTS


def failed(checks: dict[str, Check]) -> list[str]:
    return [name for name, c in checks.items() if c.outcome == "fail"]


def summary(checks: dict[str, Check]) -> str:
    """The failed contracts as one line for the item's error text."""
    return "; ".join(f"contract {name}: {checks[name].detail}" for name in failed(checks))


@dataclass
class Subject:
    """One executed item, as the contracts see it."""

    target: Target
    info: Any
    variant: str
    dtype: str
    index: int
    sample: Any  # the CPU sample as generated (never mutated by the item's calls)
    fn: Callable[..., Any]  # the variant's callable
    outcome: Outcome
    atol: float
    rtol: float
    per_tensor: Any = None  # the item's semantic comparator (None: allclose)
    comparator: str = "allclose"
    # the function variant's results on this sample, {"cpu": ..., "target": ...} (copied to the
    # CPU), when the sweep already has them; computed on demand otherwise
    peer: dict[str, Any] | None = None
    # the group's compiled batches (conformance.check.batching.OpBatches) on a compiler target that
    # batches: a call of this function item's sample is taken from them where they hold it
    batches: Any = None

    @property
    def device(self) -> torch.device | str:
        return self.target.device

    def call_on_target(self, fn: Callable[..., Any], repeat: int = 0) -> Any:
        """``fn`` on this item's sample on the target, copied to the CPU: from the group's
        compiled batch where one holds it (``repeat`` k: the k-th later identical call of the
        same compiled graph), else wrapped and called on its own."""
        if self.batches is not None and self.variant == "function":
            got = self.batches.get("function", fn, self.index)
            if got is not None and repeat == 0:
                return to_cpu(got.result)
            if got is not None and len(got.repeats) >= repeat:
                return got.repeats[repeat - 1]
        phase("target")
        # execute.invoke looked up at the call, as contract_layout and contract_calls do: a benchmark that
        # counts calls by replacing it (benchmarks/item_cost.py) sees the contracts' calls too
        return to_cpu(execute.invoke(self.target.wrap(fn), "function", self.on_device(), self.device, None))

    def close(self, a: Any, b: Any) -> tuple[bool, str]:
        """``a`` against ``b`` with the item's tolerance (the ledger's, for target vs CPU)."""
        ev = compare(b, a, atol=self.atol, rtol=self.rtol, per_tensor=self.per_tensor,
                     comparator=self.comparator)
        return ev.close, ev.detail

    def same(self, a: Any, b: Any) -> tuple[bool, str]:
        """``a`` against ``b``, two results of the same device, with torch.testing's default
        tolerance for the dtype: a ledger entry that accepts a device's numerics against the
        CPU does not let its own variants or layouts disagree with each other."""
        dtype = next((str(x.dtype).removeprefix("torch.") for x in leaves(b) if isinstance(x, torch.Tensor)),
                     "float32")
        tol = torch_default(dtype)
        ev = compare(b, a, atol=tol.atol, rtol=tol.rtol, per_tensor=self.per_tensor,
                     comparator=self.comparator)
        return ev.close, ev.detail

    def on_device(self, sample: Any | None = None) -> Any:
        return on_device(sample or self.sample, self.device)

    def on_cpu(self, sample: Any | None = None) -> Any:
        return on_device(sample or self.sample, "cpu")

