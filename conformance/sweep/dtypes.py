"""The ``dtypes`` variant: which dtypes an op runs in on the target, against the CPU, forward and
backward (:mod:`conformance.check.dtypeprobe`), for every dtype of the run's ``--dtypes``, whether
the OpInfo claims it on the CPU or not.

Each op x dtype has one probe item, ``op|dtypes|dtype|0``: the OpInfo's first samples for the
dtype (generated even for a dtype it does not claim, as PyTorch's ``TestCommon.test_dtypes``
does), at most :data:`PROBE_SAMPLES` of them, called on the CPU and on the target until one shows
the two sides differ. Several samples, not one: a CPU that refuses a dtype on some samples only
is common (``nn.functional.max_pool1d`` in int64 runs on the CPU with ``return_indices`` and
raises "max_pool1d_impl not implemented for 'Long'" without), and its first sample alone says
nothing. A generator that raises or yields nothing for the dtype leaves nothing to probe: the
item is ``skip`` ("no sample").

Where the items live: a dtype the OpInfo claims on the CPU has a group of the op sweep already,
and its probe is one more item of that group; a dtype it does not claim gets a group of its own
(:meth:`OpInfoSweep.groups <conformance.sweep.opinfo.OpInfoSweep.groups>`) that runs the probe
alone (:func:`probe_only`). So every probe item belongs to the group its key names
(``ItemKey.group_key``): resume, re-runs, shards and every executor handle it as any other item,
and nothing about the group travels but its op and dtype.

The probe runs on eager targets only: on a compiler each call would compile, and what a
compiler accepts is the eager device's dtype set. Of the ledger's expected failures only an entry
naming the ``dtypes`` variant applies (a ``"*"`` entry expects a failure of the op's samples, and
would turn every passing probe of its op x dtype into an ``xpass``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Container, Generator
from typing import Any

import torch

from conformance.check.dtypeprobe import SampleProbe, call_sample, differentiable, differs, judge
from conformance.check.execute import signature
from conformance.check.verdict import Status, decide_unrun
from conformance.inputs.opinfo import cpu_dtypes, samples
from conformance.select import DTYPE_PROBE
from conformance.targets import Target
from conformance.work import Group

VARIANT = DTYPE_PROBE
#: Samples probed per op x dtype at most (fewer when one shows the sides differ).
PROBE_SAMPLES = 4


def probe_only(info: Any, dtype: str) -> bool:
    """Whether a group of this op x dtype holds the probe alone: the OpInfo does not claim the dtype
    on the CPU, so the op sweep has no samples of it."""
    return getattr(torch, dtype) not in cpu_dtypes(info)


def wanted(target: Target, config: Any) -> bool:
    return VARIANT in config.variants and not target.compiler


def claimed(info: Any, dtype: torch.dtype, device_type: str) -> tuple[bool, bool]:
    """What the OpInfo claims for ``device_type`` (for a PrivateUse1 device: the CPU's claim)."""
    return dtype in info.supported_dtypes(device_type), dtype in info.supported_backward_dtypes(device_type)


def rows(target: Target, info: Any, group: Group, config: Any, skip: Container[str],
         on_start: Callable[[str], None] | None, *, run: bool = True) -> Generator[dict[str, Any], None, bool]:
    """The group's probe row (none when not wanted, not ``run`` (a run of other sizes than the
    samples') or recorded already); returns whether the group holds the probe alone
    (:func:`probe_only`), its other items then not to be run."""
    alone = probe_only(info, group.dtype)
    key = str(group.item(VARIANT, 0))
    if not run or not wanted(target, config) or key in skip:
        return alone
    if on_start:
        on_start(key)
    start = time.perf_counter()
    # the probe is a check of its own: no contract is checked on it (as on a canary), said as on every row
    row: dict[str, Any] = {"item_key": key, "op": group.op, "variant": VARIANT, "dtype": group.dtype, "sample": 0,
                           "seed": config.seed, "contracts": None, "contract_failed": None}
    try:
        row.update(_probe(target, info, group, config))
    except Exception as exc:  # noqa: BLE001 - the harness failed on this item
        row.update(status=decide_unrun("harness").value,
                   error=f"infra: the harness failed on this item: {type(exc).__name__}: {exc}"[:2000])
    row["duration_s"] = time.perf_counter() - start
    yield row
    return alone


def _probe(target: Target, info: Any, group: Group, config: Any) -> dict[str, Any]:
    dtype = getattr(torch, group.dtype)
    backward = differentiable(dtype, info)
    probes: list[SampleProbe] = []
    first: Any = None
    gen = samples(info, dtype, seed=config.seed, requires_grad=backward)
    for index in range(PROBE_SAMPLES):
        try:
            sample = next(gen)
        except StopIteration:
            break
        except Exception as exc:  # noqa: BLE001 - the generator raised: the samples before it are probed
            if probes:
                break
            return {"status": Status.SKIP.value, "error": f"no sample: the OpInfo's sample generator raises for "
                                                          f"{group.dtype}: {type(exc).__name__}: {exc}"[:2000]}
        probes.append(call_sample(target, info, index, sample, backward))
        decided = differs(probes[-1]) is not None
        if first is None or decided:
            first = sample  # the signature shown: the sample that decided, else the first
        if decided:
            break
    if not probes:
        return {"status": Status.SKIP.value, "error": f"no sample: the OpInfo's sample generator yields none for {group.dtype}"}
    xfail = config.ledger.expected_failure(group.op, VARIANT, group.dtype, target.name)
    xfail = xfail if xfail is not None and xfail.variant == VARIANT else None
    probe = judge(probes, claimed=claimed(info, dtype, torch.device(target.device).type), dtype=group.dtype,
                  expected_failure=xfail.statuses if xfail else None)
    error = probe.detail
    if probe.status in (Status.XFAIL, Status.XPASS) and xfail is not None:
        error = f"{error or 'passed'} [expected failure: {xfail.where}: {xfail.reason}]"
    return {"status": probe.status.value, "error": error, "signature": signature(first),
            "proof": {"dtypes": probe.as_json()}}
