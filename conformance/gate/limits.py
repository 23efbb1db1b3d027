"""The gate's flake-confirmation defaults, torch-free.

The command line shows them in its help without importing the gate (which imports torch), so
that ``conformance`` starts, and refuses a bad option, in well under a second.
"""

CONFIRM_BUDGET_S = 600.0  # seconds the whole confirmation may spend (default)
MAX_RERUNS = 500  # re-runs the whole confirmation may do (default)
