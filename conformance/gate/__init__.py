"""Gate: is the candidate build worse than the baseline, and since when?

``core`` (regressions, flake confirmation, limits: :func:`run_gate`), ``numerics`` (drift of
passing items' errors), ``finding`` (one finding), ``first_bad`` (each finding's first bad build),
``render`` (console, Markdown, JUnit), ``limits`` (torch-free defaults for the command line),
``nightly`` (the nightly's stages: sweeps, coverage, report and gate over one store).
"""

from conformance._lazy import exports

__getattr__, __dir__ = exports(__name__, {
    "core": ("PER_GROUP", "SELECTION", "GateError", "Confirmation", "GateResult", "resolve", "selection",
             "compare_runs", "confirm", "check_limits", "run_gate"),
})
