"""The ``reference`` variant: an OpInfo's ``reference_inputs`` that its ``sample_inputs`` lack.

PyTorch's own device tests (``TestCommon.test_compare_cpu``) run every ``reference_inputs`` sample;
the sweep runs the ``sample_inputs``. For an OpInfo with a ``reference_inputs_func`` of its own
(252 of op_db's 702 in torch 2.13) the reference inputs are mostly the samples again followed by
more: extremal values, larger, empty and non-contiguous shapes (over op_db in float32, 30,805
reference inputs against 18,751 samples). The ``reference`` variant calls the function on each
reference input whose structure (shapes, dtypes, strides, the other arguments; never values: two
generators give other values) no sample has (:func:`conformance.inputs.opinfo.reference_only`).
Its item keys are ``op|reference|dtype|i``, ``i`` the input's index within ``reference_inputs``,
so a key means the same input on every night. Each item is decided as a function item is (values
against the CPU, the float64 arbiter where it can change the answer, the ledger's tolerances and
expected failures: an entry for the ``function`` variant covers it too), and of the contracts only
those that hold for every item (``metadata``): the function variant's items check the rest (aliasing,
non-contiguous copies, the other variants, ``out=``, errors, determinism) on the samples, and the
reference inputs are there for what the samples' sizes and values miss. On a compiler target its
items are never batched.

Which OpInfos' reference inputs a run sweeps is a slice (``--reference-inputs``,
:func:`conformance.select.parse_reference_slice`): ``none`` (the default of ``conformance run``),
``all``, or ``K/N``, the OpInfos whose stable name hash is K modulo N. The nightly sweeps one slice
a night (:func:`conformance.select.night_slice`), every OpInfo within
:data:`conformance.select.REFERENCE_NIGHTS` nights; the slice is stored with the run, so a resume
and a re-run sweep the same one, and the gate compares reference items only where both runs' slices
hold the op (:func:`conformance.gate.core.compare_runs`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from itertools import islice
from typing import Any

import torch

from conformance.inputs.opinfo import REFERENCE, reference_only, variant_fn
from conformance.select import in_reference_slice
from conformance.work import Group

VARIANT = REFERENCE


def wanted(info: Any, group: Group, config: Any) -> bool:
    """Whether the group has reference items in this run: the variant asked for, the OpInfo with
    reference inputs of its own, and its name in the run's slice."""
    return (VARIANT in config.variants and variant_fn(info, VARIANT) is not None
            and in_reference_slice(group.op, config.reference_inputs))


def rows(info: Any, group: Group, config: Any, run: Callable[[Iterator[tuple[int, Any]]], Iterator[dict[str, Any]]],
         failed: Callable[[Exception], Iterator[dict[str, Any]]]) -> Iterator[dict[str, Any]]:
    """The group's reference rows: ``run`` evaluates the ``(index, sample)`` pairs (the sweep's
    loop over a variant's own samples, which skips recorded items); a generator that fails gives
    ``failed``'s row (item -1 of the variant) after the rows before it."""
    if not wanted(info, group, config):
        return
    try:  # --max-samples: at most that many reference items too
        yield from run(islice(reference_only(info, getattr(torch, group.dtype), seed=config.seed), config.max_samples))
    except Exception as exc:  # noqa: BLE001 - the reference generator itself failed
        yield from failed(exc)
