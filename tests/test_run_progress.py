"""Progress: the ETA prices every group (what it took before, else its kind's typical time),
calibrates the prices by what finished, and bounds the end by the longest group left; the
schedule runs the expensive groups first; the console writes one line per stage on a terminal
and a line every few seconds in a log; a run stores its groups' times for the next run."""

from __future__ import annotations

import io
from dataclasses import replace
from types import SimpleNamespace

import pytest

from conformance.run.executor import Work
from conformance.run.progress import LINE, PRIOR_S, Console, Eta, Pricer, Snapshot, duration
from conformance.run.runner import RunSpec, Supervisor
from conformance.work import Group


def _groups(n_op: int = 100, n_schema: int = 10) -> list[Group]:
    return [Group(f"op{i}", "float32") for i in range(n_op)] + [Group(f"aten::x{i}.default", "any", "schema")
                                                               for i in range(n_schema)]


def test_without_history_the_eta_waits_then_calibrates_each_kind(monkeypatch):
    monkeypatch.setattr(Eta, "PSEUDO", 0)  # the raw calibration (its shrinkage: below)
    groups = _groups()
    eta = Eta(Pricer(), workers=2)
    queue = eta.schedule(groups)
    assert sorted(g.key for g in queue) == sorted(g.key for g in groups)
    # the slow tail (the dearest tenth by price: the schema searches, by their prior) starts first
    # and has started by the middle of the schedule
    assert queue[0].kind == "schema"
    assert all(g.kind == "opinfo" for g in queue[len(queue) // 2:])
    assert not eta.ready()  # nothing finished, nothing timed before: no estimate rather than a wild one
    schema = [g for g in queue if g.kind == "schema"]
    opinfo = [g for g in queue if g.kind == "opinfo"]
    for g in schema[:3]:  # three schema groups took 6 s each
        eta.finish(g, 6.0)
    assert eta.ready()
    # schema groups are priced by what schema groups took; OpInfo groups, none finished yet,
    # by the calibration over every kind
    scale = 18.0 / (3 * PRIOR_S["schema"])
    assert eta.remaining(schema[3:] + opinfo, []) == pytest.approx((7 * 6.0 + 100 * PRIOR_S["opinfo"] * scale) / 2)
    for g in opinfo[:40]:  # 40 OpInfo groups took 0.1 s each: OpInfo gets its own scale
        eta.finish(g, 0.1)
    assert eta.remaining(schema[3:] + opinfo[40:], []) == pytest.approx((7 * 6.0 + 60 * 0.1) / 2)


def test_an_unpriced_run_is_shuffled_so_early_groups_calibrate_fairly():
    # a run lists its groups by name and size, cheap first: calibrated on the first ones finished,
    # the ETA would say a fraction of the truth; a fixed shuffle samples them evenly
    groups = [Group(f"op{i:03d}", "float32") for i in range(200)]
    queue = Eta(Pricer(), workers=1).schedule(groups)
    assert queue == Eta(Pricer(), workers=1).schedule(groups)  # the same order every time
    early = {g.op for g in queue[:50]}
    assert 10 <= sum(op < "op100" for op in early) <= 40  # both halves of the given order


def test_the_slow_tail_is_calibrated_apart_from_the_rest(monkeypatch):
    monkeypatch.setattr(Eta, "PSEUDO", 0)  # the raw calibration (its shrinkage: below)
    # a build that fails more pays more per item: its cheap groups slow down 3x, its dear ones not
    groups = _groups(100, 0)
    history = {g.key: (20.0 if i < 10 else 0.2) for i, g in enumerate(groups)}
    eta = Eta(Pricer(history), workers=1)
    queue = eta.schedule(groups)
    assert queue[0].op == "op0" and {g.op for g in queue[:60]} >= {f"op{i}" for i in range(10)}  # by the middle
    done = queue[:30]
    for g in done:
        eta.finish(g, history[g.key] * (1.0 if history[g.key] > 1 else 3.0))
    left = queue[30:]
    truth = sum(history[g.key] * (1.0 if history[g.key] > 1 else 3.0) for g in left)
    assert eta.remaining(left, []) == pytest.approx(truth)


def test_a_few_groups_do_not_swing_the_calibration():
    # heavy-tailed kinds: one OpInfo group of 60 s among ones of 0.3 s; after it alone, the
    # estimate moves toward it by what one group of PSEUDO + 1 can say
    groups = _groups(100, 0)
    eta = Eta(Pricer({g.key: 1.0 for g in groups}), workers=1)
    queue = eta.schedule(groups)
    eta.finish(queue[0], 0.3)
    eta.finish(queue[1], 60.0)
    scale = (60.3 + Eta.PSEUDO * 1.0) / (2.0 + Eta.PSEUDO * 1.0)
    assert eta.cost(queue[2]) == pytest.approx(scale) and scale < 60.3 / 2


def test_a_group_past_its_price_is_expected_to_run_a_while_longer():
    g = Group("slow", "float32")
    eta = Eta(Pricer({g.key: 10.0}), workers=1)
    eta.schedule([g])
    assert eta.remaining([], [(g, 4.0)]) == pytest.approx(6.0)
    assert eta.remaining([], [(g, 40.0)]) == pytest.approx(10.0)  # a quarter of what it ran, not 0


def test_history_prices_each_group_and_the_longest_bounds_the_end():
    groups = _groups(20, 0)
    history = {g.key: 0.1 for g in groups} | {"op7|float32": 30.0}
    eta = Eta(Pricer(history), workers=2)
    queue = eta.schedule(groups)
    assert queue[0].op == "op7"  # the slow tail first
    assert eta.ready()  # every group timed before: an estimate from the start
    assert eta.remaining(queue, []) == pytest.approx(30.0)  # 31.9 s of work on 2 workers, but op7 alone takes 30
    # op7 has run 10 s: 20 s of it left, beside 1.9 s of the rest
    assert eta.remaining(queue[1:], [(queue[0], 10.0)]) == pytest.approx(20.0)
    # a group not timed before costs its kind's median
    assert Pricer(history).price(Group("new", "float32")) == pytest.approx(0.1)


def test_a_measured_history_corrects_a_slower_machine(monkeypatch):
    monkeypatch.setattr(Eta, "PSEUDO", 0)  # the raw calibration (its shrinkage: below)
    groups = _groups(10, 0)
    eta = Eta(Pricer({g.key: 1.0 for g in groups}), workers=1)
    queue = eta.schedule(groups)
    for g in queue[:2]:
        eta.finish(g, 3.0)  # this machine is 3x slower than the one that timed them
    assert eta.remaining(queue[2:], []) == pytest.approx(8 * 3.0)


def test_supervisor_schedules_by_history_and_estimates_with_its_workers():
    groups = _groups(4, 0)
    history = {"op0|float32": 1.0, "op1|float32": 1.0, "op2|float32": 9.0, "op3|float32": 1.0}
    sup = Supervisor(Work(RunSpec(workers=2), "r", groups, history=history), None, None)
    assert [g.op for g in sup.queue] == ["op2", "op0", "op1", "op3"]
    sup.slots = [SimpleNamespace(proc=None, group=None)]
    assert sup.eta_s() == pytest.approx(9.0)
    line = sup.snapshot().line()
    assert line.startswith("sweep [") and "OpInfo 0/4" in line and "eta 9s" in line


def test_console_in_a_log_writes_a_line_every_few_seconds_and_always_the_last():
    out = io.StringIO()
    console = Console(out, every_s=3600)
    for i in range(50):
        console(f"line {i}")
    console.end("final")
    assert out.getvalue().splitlines() == ["line 0", "final"]


def test_console_on_a_terminal_redraws_one_line():
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Tty()
    console = Console(out)
    console("a")
    console("b")
    console.end("c")
    assert out.getvalue() == "\r\033[Ka\r\033[Kb\r\033[Kc\n"


def test_snapshot_line_names_each_kind_of_work():
    snap = Snapshot("sweep neuron-emu 2.33.0", {"opinfo": 5, "schema": 1}, {"opinfo": 10, "schema": 4, "model": 0},
                    1234, 7, 95.0, 4000.0)
    assert snap.line() == ("sweep neuron-emu 2.33.0 [########------------]  42% OpInfo 5/10 · schema search 1/4 "
                           "· 1,234 items, 7 failing · 1m35s, eta 1h06m")
    assert LINE.match(snap.line()) and LINE.match(replace(snap, eta_s=None).line())
    assert not LINE.match("run 2026...: 49 items in 1.5 s")
    assert [duration(s) for s in (0, 59.4, 60, 3599, 3600)] == ["0s", "59s", "1m00s", "59m59s", "1h00m"]


def test_a_run_stores_its_group_times_and_the_next_run_is_priced_by_them(tmp_path):
    import torch

    from conformance.run.runner import execute_run
    from opdb import Store
    from opdb.queries import group_seconds

    db = tmp_path / "r.sqlite"
    spec = RunSpec(target="cpu", ops=("abs", "sin"), dtypes=("float32", "int64"), variants=("function",), workers=1)
    first = execute_run(spec, db)
    lines: list[str] = []
    second = execute_run(spec, db, progress=lines.append)
    with Store.open(db) as store:
        times = group_seconds(store, target="cpu", torch_version=torch.__version__, exclude_run=second.run_id)
        assert set(times) == {"abs|float32", "abs|int64", "sin|float32", "sin|int64"}
        assert all(t > 0 for t in times.values())
        mine = group_seconds(store, target="cpu", torch_version=torch.__version__, exclude_run=first.run_id)
        assert set(mine) == set(times)  # the second run's own times, for the run after it
    assert "eta " in lines[0]  # the second run had prices before any group finished
    assert lines[-1].startswith("sweep cpu") and " 100% " in lines[-1]
