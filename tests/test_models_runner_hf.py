"""Hugging Face architectures (optional ``transformers`` extra): selection and one graph on the emulator."""

from __future__ import annotations

import pytest

import neuron_emu  # noqa: F401  register the device before autograd first runs
from conformance.models import hf
from conformance.models.runner import run_model_group
from conformance.models.selection import model_groups
from conformance.select import SelectionError
from conformance.sweep.opinfo import SweepConfig
from conformance.targets import get_target
from conformance.work import Group

needs_hf = pytest.mark.skipif(not hf.available(), reason=f"transformers not installed ({hf.INSTALL_HINT})")
pytestmark = pytest.mark.filterwarnings("ignore:neuron. operator", "ignore::UserWarning")


def test_hf_selection_without_transformers(monkeypatch):
    monkeypatch.setattr(hf, "available", lambda: False)
    with pytest.raises(SelectionError, match="install the hf extra: pip install transformers"):
        model_groups(["hf"])


@needs_hf
def test_hf_corpus_has_50_architectures():
    specs = hf.enumerate_specs()
    assert len(specs) >= 50
    assert len({s.model_id for s in specs}) == len(specs)
    groups = model_groups(["hf"], ["float32"])
    assert len(groups) == len(specs) and groups[0].op.startswith("hf.")
    assert [g.op for g in model_groups(["hf.bert"], ["float32"])] == ["hf.bert"]


@needs_hf
def test_hf_bert_on_emulator():
    target = get_target("neuron-emu", "2.33.0")
    (row,) = run_model_group(target, Group("hf.bert", "float32", "model"), SweepConfig(), modes=("eager",))
    assert row["status"] in ("pass", "pass_fallback"), row["error"]
    assert row["family"] == "hf" and row["params"]["model_type"] == "bert"
    assert row["aten_ops"].get("aten::mm.default") or row["aten_ops"].get("aten::addmm.default")
    assert len(row["loss_curve"]["target"]) == 3
