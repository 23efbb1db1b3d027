"""The perf lane: op, model-graph and decode-step latency per build, and a regression call that
holds on a noisy machine.

- :mod:`.items`  what is measured: OpInfo x dtype x size, model graph x shape variant;
- :mod:`.decode` one decode step of a causal LM x dtype x prompt bucket (per-token decode latency);
- :mod:`.worker` a process holding one build, timing calls;
- :mod:`.stats`  paired rounds -> ratio, bootstrap interval, verdict;
- :mod:`.lane`   the session: two workers interleaved, adaptive rounds, confirmation, storage;
- :mod:`.gate`   the gate's perf section and each regression's first bad build.

The command is ``conformance perf``; results live in opdb's ``perf_runs`` / ``perf_results``.
"""
