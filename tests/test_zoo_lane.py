"""The zoo end to end with its real libraries (`nox -s zoo_tests`): real timm, torchvision and
transformers architectures through the per-graph protocol on a clean build and on one with a
seeded defect, and the model-support page's account of which models broke and where."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from conformance.models import tvshim  # noqa: E402 - before timm: it imports torchvision

tvshim.ensure()
pytest.importorskip("timm", reason="the zoo extra (timm, torchvision) is not installed")
pytest.importorskip("transformers", reason="the hf extra (transformers) is not installed")

import neuron_emu  # noqa: E402,F401 - register the device before autograd first runs
from conformance.cli import main  # noqa: E402
from opdb import Store  # noqa: E402
from reports import render_site  # noqa: E402
from reports.pages.support import models  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")

# a ViT and a BERT normalize with layer norm; a ResNet and SqueezeNet with batch norm or not at all
# (a seeded gelu defect is no good here: HF's 0.02-std init leaves BERT's FFN branch so small beside
# the residual that a 100% gelu error moves its output by about 1%, inside the tolerance)
LN = ["timm.vit_tiny_patch16_224", "hf.bert"]
NO_LN = ["timm.resnet18", "tv.squeezenet1_1"]
OP = "aten::native_layer_norm.default"
SEEDED = f"""
[build]
name = "ideal-ln"
inherits = "ideal"
[[defects]]
op = "{OP}"
kind = "wrong_result"
magnitude = 0.05
"""


def _run(db, build):
    res = CliRunner().invoke(main, ["run", "--target", "neuron-emu", "--build", build, "--models", ",".join(LN + NO_LN),
                                    "--dtypes", "float32", "--model-modes", "eager", "-n", "2", "--timeout", "120",
                                    "--db", str(db), "--quiet", "--exit-zero"])
    assert res.exit_code == 0, res.output


def test_a_seeded_layer_norm_defect_breaks_the_zoo_models_that_call_it_and_no_other(tmp_path):
    db = tmp_path / "zoo.sqlite"
    (tmp_path / "ln.toml").write_text(SEEDED)
    _run(db, "ideal")
    _run(db, str(tmp_path / "ln.toml"))
    with Store.open(db, create=False) as st:
        runs = [r["id"] for r in st.db.query("select id from runs order by started_at")]
        before, after = (models(st.db.query("select * from model_results where run_id = ?", [r])) for r in runs)
        for mid in LN + NO_LN:
            b = before[(mid, "float32")]
            assert b["support"] in ("ready", "fallbacks"), b
            assert b["library"] == mid.split(".")[0] and b["arch_family"] not in ("", "-"), b
            assert b["topology"], b  # traced: a size-blind hash for the distinct-architecture count
        for mid in LN:
            a = after[(mid, "float32")]
            assert a["support"] == "mismatch" and a["first_divergent_op"] == OP, a
        for mid in NO_LN:
            assert after[(mid, "float32")]["support"] == before[(mid, "float32")]["support"]
        render_site(st, tmp_path / "site", db_label=str(db))
    html = (tmp_path / "site" / "ideal-ln" / "support.html").read_text()
    spec = json.loads(re.search(r'id="support-diff-data">(.*?)</script>', html, re.S).group(1))
    assert sorted(r[1][1] for r in spec["rows"]) == sorted(LN)
    assert all(r[0] == "broke" and r[5] == "mismatch" and r[6] == OP for r in spec["rows"])
    summary = {m.group(1): m.group(0) for m in re.finditer(r'<tr data-library="(\w+)">.*?</tr>', html, re.S)}
    assert set(summary) == {"hf", "timm", "tv"}
