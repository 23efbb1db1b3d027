"""Run: what a run is and how its work gets done.

``spec`` (the frozen :class:`RunSpec`) and ``kinds`` (the work kinds a run knows: each implements
:class:`conformance.work.WorkKind`); ``executor`` (the interface every executor implements) with ``supervisor``,
``isolation`` and ``_workerboot`` (the local executor: isolated worker processes); ``progress``
(the console and its ETA); ``runner`` (a run from selection to the one writer: resume, shards,
canaries, re-runs).
"""

from conformance._lazy import exports

__getattr__, __dir__ = exports(__name__, {
    "runner": ("CodeChangedWarning", "EmptyRun", "KilledRunResumed", "Prepared", "check", "config_difference", "execute_run",
               "prepare", "rerun_items", "run_canaries", "run_into", "stderr_progress", "stored_summary"),
    "spec": ("RunSpec",),
    "executor": ("EXECUTORS", "Executor", "Summary", "Work", "executor"),
})
