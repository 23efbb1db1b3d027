"""What the standalone checks of upstream expectations share (``upstream_inductor_check.py``,
``upstream_onnx_check.py``): the listed ops of one source, the OpInfo of a name, the per-op
verdict over its samples, and the printed table.

A check gives ``check_sample(fn, sample) -> str`` ("" when the sample passes, else why it
fails); an op ``holds`` at its first failing sample, is ``stale`` when every sample passes,
``unknown`` when ``--max-samples`` stopped it before either, ``absent`` when this torch has no
such OpInfo (or it lacks the dtype on the CPU).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from conformance.triage import upstream  # noqa: E402


def listed_ops(source: str, dtype: str, only: list[str] | None) -> list[str]:
    """The ops ``source`` lists in ``dtype`` on the CPU (those of ``only``, when given)."""
    ops = sorted({e.op for e in upstream.expectations() if e.source.name == source and e.dtype == dtype
                  and e.device == "cpu"})
    return [o for o in ops if not only or o in only]


def check_op(name: str, dtype: torch.dtype, check_sample: Callable, max_samples: int | None,
             grad: bool = False) -> tuple[str, str, int]:
    """(holds | stale | unknown | absent, first failure, samples run). ``grad``: samples with
    ``requires_grad`` where the op supports autograd in the dtype."""
    from torch.testing._internal.common_methods_invocations import op_db

    info = next((i for i in op_db if (f"{i.name}.{i.variant_test_name}" if i.variant_test_name else i.name) == name), None)
    if info is None:
        return "absent", f"no OpInfo {name} in this torch", 0
    if dtype not in info.supported_dtypes("cpu"):
        return "absent", f"{name} does not support {dtype} on the CPU", 0
    func = info.get_op()

    def fn(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        return func(*args, **kwargs)

    requires_grad = grad and info.supports_autograd and dtype in info.supported_backward_dtypes("cpu")
    n = 0
    for sample in info.sample_inputs("cpu", dtype, requires_grad=requires_grad):
        if max_samples is not None and n >= max_samples:
            return "unknown", f"the first {n} samples pass (--max-samples): not shown stale", n
        n += 1
        why = check_sample(fn, sample)
        if why:
            return "holds", f"sample {n - 1}: {why}", n
    return "stale", "", n


def run(ops: list[str], dtype: torch.dtype, check_sample: Callable, max_samples: int | None,
        grad: bool = False) -> None:
    """One line per op, OpInfo's ``wrapper_set_seed`` made a plain call (as the sweep does)."""
    import torch.testing._internal.common_methods_invocations as cmi

    with mock.patch.object(cmi, "wrapper_set_seed", lambda op, *args, **kwargs: op(*args, **kwargs)):
        for op in ops:
            t0 = time.perf_counter()
            verdict, why, n = check_op(op, dtype, check_sample, max_samples, grad)
            print(f"{op:50s} {verdict:7s} {n:3d} samples {time.perf_counter() - t0:6.1f} s  {why}", flush=True)
