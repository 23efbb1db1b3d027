"""The op sweep's work kinds: OpInfo samples (``opinfo``: :data:`OPINFO`, :func:`evaluate`, the
one path every op item takes through execute, compare and decide) and the schema-driven search
for overloads no OpInfo reaches (``schema/``: the search, its candidates, preflights, rows and
corpus replay).
"""

from conformance._lazy import exports

__getattr__, __dir__ = exports(__name__, {
    "opinfo": ("SweepConfig", "evaluate", "BACKWARD_DTYPES", "plan", "sparse_plan", "wants_backward",
               "run_group", "batch_size", "harness_error", "OpInfoSweep", "OPINFO"),
})
