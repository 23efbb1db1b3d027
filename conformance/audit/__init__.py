"""Migration-readiness audit of a user's own model on a target (``conformance audit``).

What one audit does, all by running (never by reading a build manifest):

1. **Op inventory.** The model runs once in eager mode on the target under a counting dispatch
   mode inside ``target.trace()`` (every overload with its call count, native or fallback as the
   device reports it); ``torch.export`` captures the graph too (its histogram is shown next to
   the eager counts). A model ``torch.export`` cannot capture is audited from the eager trace
   alone, and the report says so. Each overload's status comes from the stored sweep of the
   same target+build (``--db``: coverage of its latest finished run) or, when the sweep does not
   cover it, from an isolated check: the call's recorded inputs run on the CPU and on the target,
   outputs compared normwise.
2. **Dtype and layout risks:** float64 params/buffers/inputs/intermediates, int64 values outside
   the int32 range, complex tensors, channels_last tensors, ops outside the ``aten`` namespace.
3. **Parity:** each forward output against the CPU (model-level tolerance of the ledger and
   ``data/model_tolerances.toml``); with ``train`` also every parameter gradient and a 3-step SGD run. A
   failure is localized to its first divergent op (:func:`conformance.models.localize.localize`,
   or the first op whose isolated check fails when the graph cannot be traced symbolically).
4. **Compile:** ``torch.compile(backend=<target's>, dynamic=False)`` with a counting backend over
   every input-shape set: compiles, recompiles, compiled parity and p50/p99 latency.
5. **Generation** (``--generate``, a causal LM): greedy decoding on the target against the CPU per
   dtype x mode x prompt-length bucket, by the generation lane's own measurement and rules
   (:mod:`.generate`): token agreement, near-tie and wide flips, log-likelihood shift, prefill and
   per-token latency, recompiles, fallbacks, the first divergent op; a failing bucket blocks.
6. **Verdict:** ``ready`` / ``ready with fallbacks`` / ``blocked`` and the ranked blockers.

The package, by job: ``loading`` (the user's model and inputs), ``trace`` (the recording
dispatch mode, the CPU reference run), ``ops`` (export capture, sweep verdicts, isolated op
checks, risks), ``parity`` (outputs, gradients, training, first divergent op), ``compile_sweep``
(compiles and latency per shape set), ``generate`` (decoding per bucket), ``core`` (the steps in
order and the verdict), ``output`` (text, JSON, HTML), ``results`` (the records all of them fill).

Example::

    >>> import torch
    >>> from conformance.audit import AuditConfig, audit
    >>> from conformance.targets import get_target
    >>> m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    >>> r = audit(m, (torch.randn(2, 4),), get_target("cpu"), AuditConfig(timed_iters=1))
    >>> r.verdict
    'ready'
"""

from __future__ import annotations

from .core import audit, decide, run_audit
from .loading import InputSpec, load_callable, load_model, make_inputs, parse_shape_set
from .output import text_lines, verdict_line, write_html, write_json
from .results import PLUMBING, AuditConfig, AuditInputError, AuditResult, OpRow, OutputParity, Risk, ShapeRow

__all__ = ["PLUMBING", "AuditConfig", "AuditInputError", "AuditResult", "InputSpec", "OpRow", "OutputParity", "Risk",
           "ShapeRow", "audit", "decide", "load_callable", "load_model", "make_inputs", "parse_shape_set",
           "run_audit", "text_lines", "verdict_line", "write_html", "write_json"]
