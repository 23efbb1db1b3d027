"""The progress line's ETA weights the groups left by the time groups of their kind took."""

from __future__ import annotations

from types import SimpleNamespace

from conformance.run import RunSpec, Supervisor
from conformance.work import Group


def test_eta_weights_remaining_groups_by_kind():
    groups = [Group(f"op{i}", "float32") for i in range(100)] + [Group(f"aten::x{i}.default", "any", "schema")
                                                                   for i in range(10)]
    sup = Supervisor(RunSpec(workers=2), None, "r", groups, {}, None)
    assert sup.eta_s() is None  # nothing finished yet: no estimate rather than a wild one
    for _ in range(90):  # 90 OpInfo groups done at 0.1 worker-seconds each
        sup.queue.popleft()
        sup.kind_time["opinfo"] += 0.1
        sup.kind_done["opinfo"] += 1
    sup.slots = [SimpleNamespace(proc=object(), group=None), SimpleNamespace(proc=object(), group=None)]
    # 10 OpInfo + 10 schema groups left; schema unknown yet -> the overall mean (0.1 s)
    assert abs(sup.eta_s() - 20 * 0.1 / 2) < 1e-9
    sup.kind_time["schema"] += 6.0  # one schema group took 6 worker-seconds
    sup.kind_done["schema"] += 1
    sup.queue.pop()
    assert abs(sup.eta_s() - (10 * 0.1 + 9 * 6.0) / 2) < 1e-9
