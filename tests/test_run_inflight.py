"""The item a worker runs lives in memory it shares with the supervisor (conformance.run.isolation
.Inflight), not in messages: a worker that dies still gets its item's verdict from the phase it
died in, and an item whose row was sent before the death is never blamed for it."""

from __future__ import annotations

import multiprocessing as mp
import os
import re
import select
import signal
import time

import pytest

from conformance.check.batching import BATCH_PHASE
from conformance.run.executor import Work, executor
from conformance.run.isolation import KEY_MAX, Inflight
from conformance.run.spec import RunSpec
from conformance.run.supervisor import PHASES, Supervisor, _Slot
from conformance.work import Group

FORK = mp.get_context("fork")


def _inflight() -> Inflight:
    slot = Inflight(FORK, PHASES, BATCH_PHASE)
    slot.reset()
    return slot


def test_the_slot_holds_the_item_its_phase_and_since_when():
    slot = _inflight()
    assert slot.read() == (0, None, "", 0.0)  # nothing in flight
    before = time.monotonic()
    slot.start("abs|function|float32|3", lambda n, key: pytest.fail("a short key is not sent"))
    count, key, phase, since = slot.read()
    assert (count, key, phase) == (1, "abs|function|float32|3", "") and since >= before
    slot.phase("cpu")
    slot.phase("target")
    assert slot.read() == (1, "abs|function|float32|3", "target", since)  # the item's clock runs on
    slot.clear()
    assert slot.read()[1] is None


def test_a_batch_has_its_own_clock_and_so_has_the_item_after_it():
    slot = _inflight()
    slot.start("abs|function|float32|0", print)
    started = slot.read()[3]
    time.sleep(0.01)
    slot.phase(BATCH_PHASE)
    in_batch = slot.read()[3]
    time.sleep(0.01)
    slot.phase("cpu")
    after = slot.read()[3]
    assert started < in_batch < after
    assert slot.read()[2] == "cpu"


def test_a_key_too_long_for_the_slot_is_announced_before_the_slot_names_it():
    slot = _inflight()
    sent: list[tuple] = []
    long_key = "x" * (KEY_MAX + 1) + "|function|float32|0"
    slot.start("abs|function|float32|0", sent.append)
    slot.start(long_key, lambda n, key: sent.append((n, key, slot.read()[0])))
    assert sent == [(2, long_key, 1)]  # sent while the slot still named the item before
    assert slot.read()[:2] == (2, "")  # the key travels by message, named by its count


def test_a_live_read_mid_write_is_refused():
    slot = _inflight()
    slot.start("abs|function|float32|0", print)
    slot.shared.seq += 1  # the worker is writing
    assert slot.read() is None
    assert slot.read(settled=True)[1] == "abs|function|float32|0"  # a dead worker's slot is final


# -- the supervisor reading a dead worker: pipe first, then the slot --------------------------
def _spec(**kw) -> RunSpec:
    return RunSpec(target="cpu", dtypes=("float32",), workers=1, max_samples=3, variants=("function",),
                   contracts=("none",), **kw)


def _row(key: str) -> dict:
    return {"item_key": key, "op": "mul", "variant": "function", "dtype": "float32", "sample": int(key[-1]),
            "status": "pass", "duration_s": 0.0}


def _dead_worker(tmp_path, steps, *, hang: bool = False):
    """A supervisor whose one slot holds a worker that did ``steps`` (("start", key), ("phase",
    name), ("row", key)) and then was killed (or hangs, ``hang``), and the rows it records."""
    rows: list[dict] = []
    sup = Supervisor(Work(_spec(timeout_s=1.0), "r", [Group("mul", "float32")]), None, None,
                     sink=lambda row, table: rows.append(row))
    group = sup.queue.popleft()
    inflight = Inflight(FORK, PHASES, BATCH_PHASE)
    inflight.reset()
    parent, child = FORK.Pipe()

    def work() -> None:
        for what, arg in steps:
            if what == "start":
                inflight.start(arg, print)
            elif what == "phase":
                inflight.phase(arg)
            elif what == "sleep":
                time.sleep(arg)
            else:
                child.send(("row", _row(arg)))
        if hang:
            time.sleep(600)
        os.kill(os.getpid(), signal.SIGKILL)  # no clean-up, right after the last step

    proc = FORK.Process(target=work, daemon=True)
    proc.start()
    child.close()
    if not hang:
        proc.join(30)
    poller = select.poll()
    poller.register(parent.fileno(), select.POLLIN)
    output = str(tmp_path / "worker.out")
    open(output, "w").close()
    sup.slots = [_Slot(proc, parent, inflight, group=group, ready=True, output=output, poller=poller)]
    restarted: list[set[str]] = []

    def restart(slot: _Slot) -> _Slot:
        sup._kill(slot)
        restarted.append(set(slot.seen))
        slot.proc = None
        return slot

    sup._restart = restart
    return sup, rows, restarted


K0, K1, K2 = (f"mul|function|float32|{i}" for i in range(3))


@pytest.mark.parametrize(("phase", "status", "error"), [
    ("cpu", "skip", "CPU reference crashed (signal 9 (SIGKILL))"),
    ("target", "crash", "process died during the item on the target: signal 9 (SIGKILL)"),
    ("", "crash", "process died during the item on the target"),
])
def test_a_death_is_the_verdict_of_the_phase_it_came_in(tmp_path, phase, status, error):
    steps = [("start", K0), ("phase", "cpu"), ("phase", "target"), ("row", K0), ("start", K1)]
    sup, rows, restarted = _dead_worker(tmp_path, steps + ([("phase", "cpu")] if phase == "target" else [])
                                        + ([("phase", phase)] if phase else []))
    sup._died(0)
    assert [(r["item_key"], r["status"]) for r in rows] == [(K0, "pass"), (K1, status)]
    assert error in rows[1]["error"]
    assert restarted == [{K0, K1}]  # the group goes on after the dead item


def test_a_death_right_after_a_row_blames_the_next_item_not_the_recorded_one(tmp_path):
    # the row of K1 is still in the pipe when the worker dies in K2: it is recorded, K2 is the crash
    sup, rows, restarted = _dead_worker(tmp_path, [("start", K0), ("row", K0), ("start", K1), ("phase", "target"),
                                         ("row", K1), ("start", K2), ("phase", "target")])
    sup._died(0)
    assert [(r["item_key"], r["status"]) for r in rows] == [(K0, "pass"), (K1, "pass"), (K2, "crash")]
    assert restarted == [{K0, K1, K2}]


def test_a_death_between_a_row_and_the_next_item_blames_nobody(tmp_path):
    # died after K1's row was sent, before the slot named K2: K1 keeps its row, K2 runs again
    sup, rows, restarted = _dead_worker(tmp_path, [("start", K0), ("row", K0), ("start", K1), ("phase", "target"),
                                         ("row", K1)])
    sup._died(0)
    assert [(r["item_key"], r["status"]) for r in rows] == [(K0, "pass"), (K1, "pass")]
    assert restarted == [{K0, K1}]


def test_a_silent_worker_is_killed_and_its_item_times_out(tmp_path):
    sup, rows, restarted = _dead_worker(tmp_path, [("start", K0), ("row", K0), ("start", K1), ("phase", "cpu"),
                                         ("phase", "target")], hang=True)
    deadline = time.monotonic() + 30
    while not restarted and time.monotonic() < deadline:
        time.sleep(0.05)
        sup._step()
    assert [(r["item_key"], r["status"]) for r in rows] == [(K0, "pass"), (K1, "timeout")]
    assert "no result after 1 s; worker killed" in rows[1]["error"]


def test_a_timeout_mostly_spent_on_the_cpu_reference_is_no_verdict_about_the_target(tmp_path):
    """The limit covers the item: killed in the target's phase after the CPU reference took most
    of it (0.8 of 1 s), the target is not shown to be slow (multilabel_margin_loss's large ladder
    rungs: the CPU 33 s, the target 15 s, against 60 s)."""
    sup, rows, restarted = _dead_worker(tmp_path, [("start", K0), ("row", K0), ("start", K1), ("phase", "cpu"),
                                         ("sleep", 2.0), ("phase", "target")], hang=True)
    deadline = time.monotonic() + 30
    slot = sup.slots[0].inflight
    while slot.read() is None or slot.read()[2] != "target":  # not looked at while the CPU runs
        assert time.monotonic() < deadline
        time.sleep(0.01)
    while not restarted and time.monotonic() < deadline:
        sup._step()
        time.sleep(0.01)
    assert [(r["item_key"], r["status"]) for r in rows] == [(K0, "pass"), (K1, "skip")]
    assert re.search(r"the CPU reference took [2-9] s of it", rows[1]["error"]), rows[1]["error"]
    assert "no verdict about the target" in rows[1]["error"]
    assert K1 in sup.failed["mul|float32"]  # a size ladder climbs no further past it


def test_the_slot_counts_the_items_cpu_seconds():
    slot = _inflight()
    slot.start("abs|function|float32|0", print)
    t0 = time.monotonic()
    slot.phase("cpu")
    time.sleep(0.05)
    slot.phase("target")
    time.sleep(0.05)
    cpu = slot.cpu_seconds()
    assert 0.05 <= cpu <= time.monotonic() - t0 - 0.05  # the target's phase is not counted
    slot.phase("cpu")
    time.sleep(0.02)
    assert slot.cpu_seconds() >= cpu + 0.02  # the current CPU phase counts too
    slot.start("abs|function|float32|1", print)
    assert slot.cpu_seconds() == 0.0  # a new item starts at zero


def test_a_dead_worker_in_a_batch_blames_no_item(tmp_path):
    sup, rows, restarted = _dead_worker(tmp_path, [("start", K0), ("phase", BATCH_PHASE)])
    sup._died(0)
    assert rows == [] and sup.unbatched == {"mul|float32"} and restarted == [set()]


# -- through real workers ------------------------------------------------------------------
@pytest.mark.parametrize(("target", "status", "error"), [
    ("test-die-cpu", "skip", "CPU reference crashed (signal 11 (SIGSEGV)); no verdict for the target"),
    ("test-die-target", "crash", "process died during the item on the target: signal 11 (SIGSEGV)"),
])
def test_a_worker_dying_in_a_phase_gives_its_item_that_phases_verdict(target, status, error):
    rows: list[dict] = []
    spec = RunSpec(target=target, imports=("dying_targets",), dtypes=("float32",), workers=1, max_samples=3,
                   variants=("function",), contracts=("none",))
    summary = executor(Work(spec, "r", [Group("mul", "float32"), Group("neg", "float32")]),
                       sink=lambda row, table: rows.append(row)).run()
    by_key = {r["item_key"]: r for r in rows}
    assert len(rows) == len(by_key) == summary.items == 4  # every item once: mul's 3 samples, neg's 1
    assert by_key["mul|function|float32|1"]["status"] == status
    assert by_key["mul|function|float32|1"]["error"] == error
    assert {k: r["status"] for k, r in by_key.items() if k != "mul|function|float32|1"} == {
        "mul|function|float32|0": "pass", "mul|function|float32|2": "pass", "neg|function|float32|0": "pass"}
