"""The distributed lane: collectives on the device's c10d backend, per build.

- :mod:`.items` what is checked (collective x reduce op x dtype x world size x shape), the seeded
  per-rank inputs and the exact answer each rank must hold;
- :mod:`.rank`  one rank's process: the target's process group, one item at a time;
- :mod:`.lane`  the session: a process group per world size, crash and hang isolation, storage.

The command is ``conformance dist``; results live in opdb's ``dist_runs`` / ``dist_results``.
"""
