"""Check: one item on the target and the CPU, and the one decision.

``execute`` (the calls, the float64 arbiter on demand), ``batching`` (a compiler target's samples
compiled as one graph), ``compare`` and ``comparators`` (numeric and semantic evidence),
``fingerprint`` (how an item's errors lie against the arbiter), ``contracts/`` (what a green cell
promises beyond close values: the vocabulary, the layout checks, the call checks), ``ledger``
(tolerances and expected failures), ``verdict`` (the status).
"""
