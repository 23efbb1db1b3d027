"""What the standalone checks of upstream expectations share (``upstream_inductor_check.py``,
``upstream_onnx_check.py``): the listed facts of one source, the OpInfo of a name, the per-op
verdict over its samples, and the printed table.

A check gives ``check_sample(fn, sample) -> str`` ("" when the sample passes, else why it
fails); an op ``holds`` at its first failing sample, is ``stale`` when every sample passes,
``unknown`` when ``--max-samples`` stopped it before either, ``absent`` when this torch has no
such OpInfo (or it lacks the dtype on the CPU, or none of its samples is one the fact is about).

The samples run are those the fact is about: for a fact upstream expects of some samples only,
those its recorded matchers pick (``conformance.triage.upstream.sample_picker``); where the list
records none, every sample, and a failure is printed as "holds on some sample" (it may be
another sample's than upstream means: ``conformance.triage.upstream.claim``), so a note written
from the table (``upstream_triage.toml``, ``checked_on``) claims no more than was checked.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from conformance.datafiles import Expectation  # noqa: E402
from conformance.triage import upstream  # noqa: E402


def listed_facts(source: str, dtype: str, only: list[str] | None) -> list[Expectation]:
    """The facts ``source`` lists in ``dtype`` on the CPU, one per op, by op (those of ``only``, when given)."""
    facts = {e.op: e for e in upstream.expectations() if e.source.name == source and e.dtype == dtype
             and e.device == "cpu"}
    return [facts[o] for o in sorted(facts) if not only or o in only]


class Verdict(NamedTuple):
    outcome: str  # holds | stale | unknown | absent
    why: str  # the first failure, or why nothing was shown
    samples: int  # samples run
    checked_on: str = "every"  # every | matched: the samples run (upstream_triage.toml's checked_on)
    passed_over: int = 0  # samples not run: not ones the fact is about


def check_op(name: str, dtype: torch.dtype, check_sample: Callable, max_samples: int | None,
             grad: bool = False, picks: Callable[[Any], bool] | None = None) -> Verdict:
    """The op's verdict over the samples ``picks`` says the fact is about (None: every sample),
    its first failure and how many samples ran. ``grad``: samples with ``requires_grad`` where the
    op supports autograd in the dtype."""
    from torch.testing._internal.common_methods_invocations import op_db

    on = "every" if picks is None else "matched"
    info = next((i for i in op_db if (f"{i.name}.{i.variant_test_name}" if i.variant_test_name else i.name) == name), None)
    if info is None:
        return Verdict("absent", f"no OpInfo {name} in this torch", 0, on)
    if dtype not in info.supported_dtypes("cpu"):
        return Verdict("absent", f"{name} does not support {dtype} on the CPU", 0, on)
    func = info.get_op()

    def fn(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        return func(*args, **kwargs)

    requires_grad = grad and info.supports_autograd and dtype in info.supported_backward_dtypes("cpu")
    n = other = 0
    for i, sample in enumerate(info.sample_inputs("cpu", dtype, requires_grad=requires_grad)):
        if picks is not None and not picks(sample):
            other += 1
            continue
        if max_samples is not None and n >= max_samples:
            return Verdict("unknown", f"the first {n} samples pass (--max-samples): not shown stale", n, on, other)
        n += 1
        why = check_sample(fn, sample)
        if why:
            return Verdict("holds", f"sample {i}: {why}", n, on, other)
    if picks is not None and not n:
        return Verdict("absent", f"none of its {other} samples is one upstream's matchers pick", 0, on, other)
    return Verdict("stale", "", n, on, other)


def run(facts: list[Expectation], dtype: torch.dtype, check_sample: Callable,
        max_samples: int | None, grad: bool = False) -> None:
    """One line per fact, OpInfo's ``wrapper_set_seed`` made a plain call (as the sweep does): its
    verdict as :func:`conformance.triage.upstream.claim` words it, and the samples it ran."""
    import torch.testing._internal.common_methods_invocations as cmi

    with mock.patch.object(cmi, "wrapper_set_seed", lambda op, *args, **kwargs: op(*args, **kwargs)):
        for fact in facts:
            t0 = time.perf_counter()
            v = check_op(fact.op, dtype, check_sample, max_samples, grad, upstream.sample_picker(fact))
            said = upstream.claim(fact, v.outcome, v.checked_on)
            ran = f"{v.samples:3d} {'matched' if v.checked_on == 'matched' else 'all'} samples"
            print(f"{fact.op:50s} {said:28s} {ran} {time.perf_counter() - t0:6.1f} s  {v.why}", flush=True)
