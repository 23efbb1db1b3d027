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

import re
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

#: The contracts that cost calls on every item they apply to, and are checked on a budget per op x
#: variant x dtype (:class:`Budget`): the first ``--contract-budget`` samples offered to them, then
#: every sample of a shape class not yet checked. Their recall against checking every sample,
#: measured over the three shipped builds and every OpInfo: README, "Contracts".
BUDGETED: tuple[str, ...] = ("noncontiguous", "variants", "out")
DEFAULT_BUDGET = 2
SAMPLED_OUT = "not checked on this sample: the group's contract budget"

_DIMS = re.compile(r"\[([0-9,]*)\]")
_STRIDES = re.compile(r"\{[0-9,-]*\}")
_FLOAT = re.compile(r"(?<![\w\[,{.])-?\d+\.\d*(?:e-?\d+)?|(?<![\w\[,{.])-?\d+e-?\d+")


def shape_class(signature: str) -> str:
    """A sample's signature (:func:`conformance.check.execute.signature`) with every size above 1
    as ``n``, strides as ``{s}`` and a float argument other than 0, 1 and -1 as ``f``: what decides
    which path a kernel takes (rank, broadcast and empty dimensions, non-contiguity, dtypes,
    integer and special arguments), not how far it walks or what it multiplies by.

        >>> shape_class("f32[3,1,0]{4,1,1}, f32[5]; alpha=2, eps=1e-05, beta=0.5, gamma=1.0")
        'f32[n,1,0]{s}, f32[n]; alpha=2, eps=f, beta=f, gamma=1.0'
    """
    dims = _DIMS.sub(lambda m: "[" + ",".join(d if d in ("0", "1") else "n" for d in m.group(1).split(",") if d) + "]",
                     signature)
    return _FLOAT.sub(lambda m: m.group(0) if m.group(0) in ("0.0", "1.0", "-1.0") else "f", _STRIDES.sub("{s}", dims))


class Budget:
    """Which samples of one op x dtype group the budgeted contracts check: the first ``k`` offered
    to each (per variant), then each sample whose :func:`shape_class` is new. ``k`` 0: all.

        >>> b = Budget(1)
        >>> [b.wants("noncontiguous", "function", i, sig) for i, sig in enumerate(["f32[3]", "f32[4]", "f32[1]"])]
        [True, False, True]
    """

    def __init__(self, k: int = DEFAULT_BUDGET) -> None:
        self.k = k
        self.offered: dict[tuple[str, str], int] = {}
        self.seen: dict[tuple[str, str], set[str]] = {}
        self.decided: dict[tuple[str, str, int], bool] = {}  # a sample asked twice gets one answer

    def wants(self, name: str, variant: str, index: int, signature: str) -> bool:
        if not self.k or name not in BUDGETED:
            return True
        known = self.decided.get((name, variant, index))
        if known is not None:
            return known
        key = (name, variant)
        n = self.offered.get(key, 0)
        self.offered[key] = n + 1
        cls = shape_class(signature)
        seen = self.seen.setdefault(key, set())
        wanted = n < self.k or cls not in seen
        seen.add(cls)
        self.decided[(name, variant, index)] = wanted
        return wanted

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
    # the group's contract budget (None: every budgeted contract on every sample) and the sample's
    # signature, which its shape class is read from
    budget: Budget | None = None
    signature: str = ""

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

    def within_noise(self, again: Callable[[], Any], first: Any, got: Any, cpu: Any, what: str) -> tuple[bool, str]:
        """Whether a variant's result ``got``, which differs from the function's ``first``, is
        excused by the target's own noise: (True, "") when ``again()`` (one more identical call of
        the function) differs from ``first`` too and ``got`` is within the item's tolerance of the
        CPU's ``cpu``; else (False, what to add to the variant's failure, "" where the function
        is steady). A device that is not deterministic here (stochastic rounding, racing
        reductions) cannot hold its variants to each other more tightly than to itself; the
        determinism contract reports the nondeterminism itself."""
        try:
            steady, why = self.same(again(), first)
        except Exception:  # noqa: BLE001 - a second call that raises is no evidence of noise
            return False, ""
        if steady:
            return False, ""
        close, detail = self.close(got, cpu)
        if close:
            return True, ""
        return False, (f"; the function itself differs between two identical calls on the target ({why}), "
                       f"and {what} not within the item's tolerance of the CPU ({detail})")

    def on_device(self, sample: Any | None = None) -> Any:
        return on_device(sample or self.sample, self.device)

    def on_cpu(self, sample: Any | None = None) -> Any:
        return on_device(sample or self.sample, "cpu")

