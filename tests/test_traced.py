"""Op signatures traced from model graphs and replayed at their real sizes (issue #47): what a
signature keeps, the shipped 2.33.0 bf16 cumsum defect found through a model's own call and named
by the gate, nothing flagged on the ideal build, and the trace command."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from conformance.cli import main
from conformance.gate.core import run_gate
from conformance.run.runner import RunSpec, run_into, traced_replays
from conformance.sweep import traced as tr
from opdb import Store
from opdb import traced as stored


class Scan(torch.nn.Module):
    """A model's running sum over a sequence longer than the 2.33.0 bf16 cumsum kernel's 4,096."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cumsum(x, dim=-1)


def test_a_signature_keeps_the_structure_and_the_kind_of_values():
    emb = torch.nn.Embedding(50, 8)
    ids = torch.tensor([[3, 7, 49, 7]])
    got = tr.trace_module(emb, (ids,), "emb", loss=lambda out: out.sum())
    sig = next(s for s in got.signatures.values() if s.op == "aten::embedding.default")
    weight, index = (a["T"] for a in sig.spec["args"])
    assert weight["shape"] == [50, 8] and weight["values"]["range"][0] < 0 < weight["values"]["range"][1]
    assert index["values"] == {"exact": [3, 7, 49, 7]}  # indices stay valid: the model's own
    args, _ = tr.materialize(sig.spec, seed=1)
    assert args[1].tolist() == [[3, 7, 49, 7]]
    lo, hi = weight["values"]["range"]
    assert args[0].shape == (50, 8) and lo <= args[0].min() and args[0].max() <= hi
    assert not torch.equal(args[0], emb.weight.detach())  # fresh values, of the traced range
    # a view keeps its strides and offset; two calls that differ in values are one signature
    base = torch.randn(6, 5)
    again = tr.trace_module(lambda a, b: (a.t().exp(), b.t().exp()), (base, base + 1), "views")
    exp = [k for k, s in again.signatures.items() if s.op == "aten::exp.default"]
    assert len(exp) == 1 and again.calls[(exp[0], "views")] == 2
    t_arg = again.signatures[exp[0]].spec["args"][0]["T"]
    assert (t_arg["shape"], t_arg["stride"]) == ([5, 6], [1, 5])
    assert tr.materialize(again.signatures[exp[0]].spec, seed=0)[0][0].stride() == (1, 5)
    # random ops are no verdict: not traced
    drop = tr.trace_module(torch.nn.Dropout(0.5).train(), (torch.ones(4, 4),), "drop")
    assert not any("dropout" in s.op or "bernoulli" in s.op for s in drop.signatures.values())


@pytest.fixture(scope="module")
def traced_db(tmp_path_factory):
    """A database holding the signatures of a model that scans 5,000 bf16 elements per row."""
    db = tmp_path_factory.mktemp("traced") / "t.sqlite"
    got = tr.trace_module(Scan(), (torch.randn(2, 5000, dtype=torch.bfloat16),), "scan.long|bfloat16")
    got.merge(tr.trace_module(Scan(), (torch.randn(2, 100, dtype=torch.bfloat16),), "scan.short|bfloat16"))
    with Store.open(db) as st:
        assert stored.record(st, torch.__version__, [s.row() for s in got.signatures.values()], got.calls) == 2
    return db


def _run(db, build):
    spec = RunSpec(target="neuron-emu", build=build, ops=("cumsum",), dtypes=("bfloat16",), sizes="traced",
                   contracts=("none",), workers=1)
    with Store.open(db) as st:
        summary = run_into(spec, st)
        rows = list(st.db.query("select * from op_results where run_id = ? and variant = 'traced'", [summary.run_id]))
    return summary.run_id, rows


def test_the_broken_build_fails_at_the_models_size_and_the_gate_names_it(traced_db):
    ideal_id, ideal = _run(traced_db, "ideal")
    old_id, old = _run(traced_db, "2.32.0")
    new_id, new = _run(traced_db, "2.33.0")
    assert len(ideal) == len(old) == len(new) == 2
    assert all(r["status"] == "pass" for r in ideal) and all(r["status"].startswith("pass") for r in old)
    by_size = {json.loads(r["proof"])["traced"]["key"]: r for r in new}
    sizes = {k: s["numel"] for k, s in ((s["key"], s) for s in stored.selected(Store.open(traced_db, create=False),
                                                                                 torch.__version__))}
    long_row = by_size[max(sizes, key=sizes.get)]
    short_row = by_size[min(sizes, key=sizes.get)]
    assert long_row["status"] == "mismatch" and "used by 1 model: scan.long|bfloat16" in long_row["error"]
    assert short_row["status"].startswith("pass")  # 100 elements: below the kernel's threshold
    assert long_row["op"] == "aten::cumsum.default" and long_row["item_key"].startswith("aten::cumsum.default|traced|")
    assert long_row["inputs"]  # what repro replays
    with Store.open(traced_db) as st:
        # a re-run replays the signature from the database: the gate confirms the regression
        replay = traced_replays(RunSpec.from_run(st.get_run(new_id)), st, [long_row["item_key"]])
        assert [s["key"] for s in replay["aten::cumsum.default|bfloat16"]["signatures"]][:1]
        result = run_gate(st, old_id, new_id, attempts=1)
    regs = [f for f in result.of("regression") if f.variant == "traced"]
    assert [f.item_key for f in regs] == [long_row["item_key"]]
    assert result.confirmation.confirmed == 1 and not result.of("flaky")


def test_the_op_page_and_the_summary_show_the_traced_verdicts(traced_db, tmp_path):
    import shutil

    from reports import render_site

    db = tmp_path / "all.sqlite"
    shutil.copy(traced_db, db)
    spec = RunSpec(target="neuron-emu", build="2.33.0", ops=("cumsum",), dtypes=("bfloat16",), sizes="all",
                   variants=("function",), max_samples=1, contracts=("none",), workers=1)
    with Store.open(db) as st:  # the samples, the ladder and the traced signatures
        run_into(spec, st)
        render_site(st, tmp_path, db_label="all.sqlite")
    page = (tmp_path / "2.33.0/ops/cumsum.html").read_text()  # the OpInfo op's page names its overload's
    section = page.split('<section id="traced">', 1)[1].split("</section>", 1)[0]
    row = section.split('data-overload="aten::cumsum.default" data-dtype="bfloat16" class="failing">', 1)[1]
    assert "1 of 2 fail" in row and "10,000" in row and "scan.long|bfloat16" in row
    own = (tmp_path / "2.33.0/ops/aten_cumsum.default.html").read_text()
    assert 'id="traced"' in own and ',"traced",' in own  # the overload's page: the section and its rows
    summary = (tmp_path / "2.33.0/index.html").read_text()
    assert 'data-k="traced"' in summary and "traced model calls give the CPU's values" in summary
    assert '<span class="v">50.0%</span><span class="l">of 2 traced' in summary  # the long scan fails, the short passes


def test_the_trace_command_stores_the_model_graphs_signatures(tmp_path):
    db = tmp_path / "cli.sqlite"
    r = CliRunner().invoke(main, ["trace", "--models", "mlp", "--model-limit", "1", "--dtypes", "float32",
                                  "--quiet", "--db", str(db)])
    assert r.exit_code == 0, r.output
    assert "traced 1 model graphs (float32)" in r.output and "new in the database" in r.output
    with Store.open(db, create=False) as st:
        have = stored.summary(st, torch.__version__)
        assert have["models"] == 1 and have["signatures"] > 5
        assert {"aten::addmm.default", "aten::mm.default"} & {s["op"] for s in stored.selected(st, torch.__version__)}
    bad = CliRunner().invoke(main, ["trace", "--dtypes", "int64", "--db", str(db)])
    assert bad.exit_code == 2 and "--dtypes 'int64'" in bad.output
    unknown = CliRunner().invoke(main, ["trace", "--models", "nosuch", "--db", str(db)])
    assert unknown.exit_code == 2 and "unknown model family 'nosuch'" in unknown.output


def test_the_selection_picks_traced_overloads_by_their_aten_or_their_own_name():
    from conformance.work import Selection

    assert tr.selects(Selection(), "aten::cumsum.default", "bfloat16")
    assert tr.selects(Selection(ops=("cumsum",)), "aten::cumsum.out", "float32")
    assert tr.selects(Selection(ops=("aten::cumsum.*",)), "aten::cumsum.default", "float32")
    assert tr.selects(Selection(ops=("add",)), "aten::add_.Tensor", "float32")  # its in-place form too
    assert not tr.selects(Selection(ops=("cumsum",)), "aten::cumprod.default", "float32")
    assert not tr.selects(Selection(dtypes=("float32,int64",)), "aten::cumsum.default", "bfloat16")


def test_the_nightly_traces_once_and_every_later_night_reuses_the_signatures():
    from conformance.gate.nightly import NightlySpec, trace_stage

    store, said = Store.memory(), []
    spec = NightlySpec(run=RunSpec(models=("mlp",), model_limit=1, dtypes=("float32,int64",), sizes="auto"))
    trace_stage(spec, store, None, said.append)
    assert said[0].startswith("== trace: the op signatures of the model graphs (mlp)") and "traced 1 model graphs" in said[1]
    n = stored.summary(store, torch.__version__)["signatures"]
    assert n > 5
    trace_stage(spec, store, None, said.append)
    assert said[-1] == (f"== trace: {n} op signatures of 1 model graphs stored for torch {torch.__version__}, "
                        "replayed by every build ==")
    quiet = []  # no traced sizes asked for, or no model graphs: nothing traced
    trace_stage(NightlySpec(run=RunSpec(models=("mlp",), sizes="samples")), Store.memory(), None, quiet.append)
    trace_stage(NightlySpec(run=RunSpec(models=(), sizes="all")), Store.memory(), None, quiet.append)
    assert quiet == []
