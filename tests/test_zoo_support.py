"""The model-support page and the zoo's selection and skips, without the zoo's libraries: the
harness's own families stand in (the page is the same for every library), and a fake zoo spec
stands in for an architecture its library cannot give."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import pytest
from click.testing import CliRunner

import neuron_emu  # noqa: F401 - register the device before autograd first runs
from conformance.cli import main
from conformance.models import item as model_item
from conformance.models import runner as model_runner
from conformance.models.runner import run_model_group
from conformance.models.selection import in_zoo_slice, parse_zoo_name, split_names
from conformance.models.zoo import ZooSkip
from conformance.select import SelectionError
from conformance.sweep.opinfo import SweepConfig
from conformance.targets import get_target
from conformance.work import Group
from opdb import Store
from reports import render_site
from reports.pages.support import changes, models, summary, support_of

pytestmark = pytest.mark.filterwarnings("ignore:neuron. operator", "ignore::UserWarning")

GELU_BUILD = """
[build]
name = "2.33.0-gelu"
inherits = "2.33.0"
[ops]
native = ["aten::gelu.default"]
[[defects]]
op = "aten::gelu.default"
kind = "wrong_result"
magnitude = 0.05
"""


def test_support_classes_rank_the_worst_item():
    assert support_of(["pass", "pass"]) == "ready"
    assert support_of(["pass", "pass_fallback"]) == "fallbacks"
    assert support_of(["pass_fallback", "mismatch"]) == "mismatch"
    assert support_of(["mismatch", "error"]) == "blocked"
    assert support_of(["crash"]) == support_of(["unsupported_dtype"]) == support_of(["timeout"]) == "blocked"
    assert support_of(["xfail", "pass"]) == "expected"
    assert support_of(["skip", "skip"]) == "skipped"
    assert support_of(["skip", "pass"]) == "ready"  # a skipped mode says nothing; the other ran


def test_zoo_names_and_slices():
    assert split_names(["hf,timm", "tv", " mlp , gpt "]) == ["hf", "timm", "tv", "mlp", "gpt"]
    assert parse_zoo_name("timm") == ("timm", "all") and parse_zoo_name("zoo@0/1") == ("zoo", "0/1")
    assert parse_zoo_name("mlp") is None and parse_zoo_name("timm.resnet18") is None
    for bad in ("timm@", "timm@3", "timm@3/3", "tv@-1/4", "hf@a/b"):
        with pytest.raises(SelectionError, match=re.escape(bad)):
            parse_zoo_name(bad)
    ids = [f"timm.m{i}" for i in range(200)]
    slices = [[m for m in ids if in_zoo_slice(m, f"{k}/7")] for k in range(7)]
    assert sorted(m for s in slices for m in s) == sorted(ids)  # N nights cover every model once
    assert all(10 < len(s) < 50 for s in slices)


@dataclass(frozen=True)
class _ZooSpec:
    """An architecture its library cannot give here (e.g. over the parameter budget)."""

    model_id: str = "timm.too_big"
    family: str = "timm"
    params: dict[str, Any] = field(default_factory=lambda: {"library": "timm", "arch_family": "vit"})
    supports_bf16: bool = True

    def build(self):
        raise ZooSkip("over budget: 632,000,000 parameters > 60,000,000 (CONFORMANCE_ZOO_MAX_PARAMS)")

    def example_inputs(self, v=0):
        raise AssertionError("never reached")


def test_an_architecture_the_library_cannot_give_is_a_skip_with_its_reason(monkeypatch):
    spec = _ZooSpec()
    monkeypatch.setattr(model_item, "resolve_spec", lambda mid: spec)
    monkeypatch.setattr(model_runner, "resolve_spec", lambda mid: spec)
    rows = list(run_model_group(get_target("cpu"), Group(spec.model_id, "float32", "model"), SweepConfig()))
    assert [r["mode"] for r in rows] == ["eager", "compile"]
    # the nightly's slice: a zoo architecture's items are zoo_modes, a family's stay model_modes
    eager = SweepConfig(zoo_modes=("eager",))
    assert [r["mode"] for r in run_model_group(get_target("cpu"), Group(spec.model_id, "float32", "model"), eager)] \
        == ["eager"]
    for r in rows:
        assert r["status"] == "skip", r
        assert r["error"].startswith("skipped by the zoo: over budget: 632,000,000 parameters")
        assert r["params"] == {"library": "timm", "arch_family": "vit"}
    recs = models([{**r, "id": i, "params": json.dumps(r["params"]), "graph_hash": None, "fallback_ops": None,
                    "first_divergent_op": None} for i, r in enumerate(rows)])
    (rec,) = recs.values()
    assert rec["support"] == "skipped" and rec["library"] == "timm" and rec["arch_family"] == "vit"
    assert "over budget" in rec["reason"]
    (row,) = summary(recs.values())
    assert (row.library, row.models, row.graphs, row.topologies, row.counts) == ("timm", 1, 0, 0, [("skipped", 1)])


MLPS = ["mlp.d1w16.relu.none.bias", "mlp.d1w16.relu.ln.bias", "mlp.d1w16.gelu.none.bias", "mlp.d1w16.gelu.ln.bias"]


def _run(db, build, *extra):
    res = CliRunner().invoke(main, ["run", "--target", "neuron-emu", "--build", build, "--models", ",".join(MLPS),
                                    "--dtypes", "float32", "--model-modes", "eager",
                                    "-n", "1", "--db", str(db), "--quiet", *extra])
    assert res.exit_code in (0, 1), res.output


def test_a_seeded_defect_moves_the_models_that_call_it_from_ready_to_mismatch(tmp_path):
    db = tmp_path / "opdb.sqlite"
    manifest = tmp_path / "gelu.toml"
    manifest.write_text(GELU_BUILD)
    _run(db, "2.33.0")
    _run(db, str(manifest))
    with Store.open(db, create=False) as st:
        runs = list(st.db.query("select id, build from runs order by started_at"))
        before, after = (models(st.db.query("select * from model_results where run_id = ?", [run["id"]]))
                         for run in runs)
        gelu = {m for (m, _), r in after.items() if ".gelu." in m}
        assert gelu and all(before[(m, "float32")]["support"] in ("ready", "fallbacks") for m in gelu)
        moved = changes(before, after)
        assert {(c, a["model_id"]) for c, _, a in moved} == {("broke", m) for m in gelu}
        assert all(a["support"] == "mismatch" and a["first_divergent_op"] == "aten::gelu.default" for _, _, a in moved)
        render_site(st, tmp_path / "site", db_label=str(db))
    html = (tmp_path / "site" / "2.33.0-gelu" / "support.html").read_text()
    assert f"<b>{len(gelu)}</b> models broke in this build" in html or f"<b>{len(gelu)}</b> model broke" in html
    spec = json.loads(re.search(r'id="support-diff-data">(.*?)</script>', html, re.S).group(1))
    assert {r[1][1] for r in spec["rows"]} == gelu and {r[0] for r in spec["rows"]} == {"broke"}
    assert all(r[4] in ("ready", "fallbacks") and r[5] == "mismatch" and r[6] == "aten::gelu.default"
               for r in spec["rows"])
    models_spec = json.loads(re.search(r'id="support-models-data">(.*?)</script>', html, re.S).group(1))
    assert {r[1] for r in models_spec["rows"]} == {"harness"} and len(models_spec["rows"]) == 4
    assert "support.html\">Model support</a>" in (tmp_path / "site" / "2.33.0-gelu" / "index.html").read_text()


# -- the nightly's zoo slice -------------------------------------------------------------------
def _nightly(zoo, **run):
    from conformance.gate.nightly import NightlySpec
    from conformance.run.spec import RunSpec

    return NightlySpec(run=RunSpec(**{"models": ("all",), **run}), builds=("2.33.0",), run_id_prefix="n1", zoo=zoo)


def test_the_nightly_runs_the_nights_zoo_slice_or_says_why_not(monkeypatch, tmp_path):
    import conformance.gate.nightly as nightly
    import conformance.gate.nightly_spec as slices
    from conformance.models.selection import ZOO_NIGHTS
    from conformance.run.spec import RunSpec
    from conformance.select import night_slice

    lines: list[str] = []
    with Store.open(tmp_path / "n.sqlite") as st:
        monkeypatch.setattr(slices, "installed_libraries", lambda: [])
        assert nightly.with_zoo_slice(_nightly("auto"), st, False, lines.append).run.models == ("all",)
        assert "no zoo library is installed" in lines[-1] and "runs without the zoo" in lines[-1]
        with pytest.raises(SelectionError, match=r"--zoo 3/7: no zoo library is installed .*\[zoo\]"):
            nightly.with_zoo_slice(_nightly("3/7"), st, False, lines.append)
        assert nightly.with_zoo_slice(_nightly("none"), st, False, lines.append).run.models == ("all",)

        monkeypatch.setattr(slices, "installed_libraries", lambda: ["timm", "tv"])
        today = night_slice(nights=ZOO_NIGHTS)
        auto = nightly.with_zoo_slice(_nightly("auto"), st, False, lines.append).run
        assert auto.models == ("all", f"zoo@{today}") and auto.zoo_modes == ("eager",)
        assert f"slice {today} of timm, tv (every architecture within {ZOO_NIGHTS} nights)" in lines[-1]
        assert nightly.with_zoo_slice(_nightly("all"), st, False, lines.append).run.models == ("all", "zoo@0/1")
        assert nightly.with_zoo_slice(_nightly("2/5"), st, False, lines.append).run.models == ("all", "zoo@2/5")
        assert nightly.with_zoo_slice(_nightly("auto", models=()), st, False, lines.append).run.models == ()
        with pytest.raises(SelectionError, match="zoo@9/5"):
            _nightly("9/5")
        # resumed after midnight: the slice the nightly's stored run started with, not tonight's
        spec = _nightly("auto")
        stored = RunSpec(models=("all", "zoo@17/30"), build="2.33.0")
        st.insert("runs", [{"id": spec.run_for(spec.builds[0]).run_id, "target": "cpu", "build": "2.33.0",
                            "torch_version": "x", "status": "interrupted", "kind": "ops",
                            "started_at": "2026-12-06T00:00:00", "config": json.dumps(stored.to_config())}])
        resumed = nightly.with_zoo_slice(spec, st, True, lines.append).run
        assert resumed.models == ("all", "zoo@17/30") and resumed.zoo_modes == ("eager",)


def test_the_nightly_help_states_the_zoo_nights():
    from conformance.models.selection import ZOO_NIGHTS

    res = CliRunner().invoke(main, ["nightly", "--help"])
    assert f"N = {ZOO_NIGHTS}" in " ".join(res.output.split()) and f"within {ZOO_NIGHTS} nights" in res.output


def test_a_model_item_tells_the_supervisor_its_sides(monkeypatch):
    """Building, tracing and the CPU's training steps are the CPU's phase (a real architecture that
    times out there is no verdict about the target); the target's steps are the target's."""
    from conformance.check.execute import set_phase_hook

    seen: list[str] = []
    set_phase_hook(seen.append)
    try:
        (row,) = run_model_group(get_target("cpu"), Group(MLPS[0], "float32", "model"), SweepConfig(),
                                 modes=("eager",))
    finally:
        set_phase_hook(None)
    assert row["status"] == "pass" and seen == ["cpu", "cpu", "target"], seen


def test_zoo_modes_leave_the_families_alone():
    rows = list(run_model_group(get_target("cpu"), Group(MLPS[0], "float32", "model"), SweepConfig(zoo_modes=("eager",))))
    assert [r["mode"] for r in rows] == ["eager", "compile"] and {r["status"] for r in rows} == {"pass"}


def test_a_model_the_meta_device_cannot_build_is_built_for_real_and_counted_after(monkeypatch):
    import torch

    from conformance.models.zoo import build_within_budget

    class Checks(torch.nn.Module):  # reads a value while building: impossible on the meta device
        def __init__(self, width):
            super().__init__()
            self.lin = torch.nn.Linear(width, width)
            assert float(self.lin.weight.abs().sum()) >= 0

    model = build_within_budget("timm.checks", lambda: Checks(4), seed=7, stage="timm.create_model")
    assert isinstance(model, Checks)
    again = build_within_budget("timm.checks", lambda: Checks(4), seed=7, stage="timm.create_model")
    assert torch.equal(model.lin.weight, again.lin.weight)  # seeded
    monkeypatch.setenv("CONFORMANCE_ZOO_MAX_PARAMS", "1_000_000")
    with pytest.raises(ZooSkip, match=r"^over budget: 4,002,000 parameters > 1,000,000"):
        build_within_budget("timm.big", lambda: Checks(2000), seed=0, stage="timm.create_model")

    def broken():
        raise ValueError("in_channels must be divisible by groups")

    with pytest.raises(ZooSkip, match=r"^build failed: ValueError: in_channels must be divisible by groups"):
        build_within_budget("hf.x", broken, seed=0, stage="build")
