"""The pytest plugin: sweep items under pytest-xdist, written to opdb."""

from __future__ import annotations

import pytest

from neuron_emu import _build
from opdb import Store

EMU_CACHE = _build.cache_root()  # at import, while HOME is still the user's
pytest_plugins = ["pytester"]


@pytest.fixture
def emu_cache(monkeypatch):
    """pytester points HOME at a temporary folder, and with it the emulator's default build
    cache (~/.cache/neuron_emu): each run JIT-built the C++ core again (~45 s of g++). The runs
    share this process's cache instead (first-use builds are tested in test_emu_build.py), read
    before pytester moves HOME."""
    monkeypatch.setenv("NEURON_EMU_CACHE", str(EMU_CACHE))


@pytest.mark.parametrize("xdist", [False, True])
def test_plugin_collects_runs_and_records(emu_cache, pytester, tmp_path, xdist):
    db = tmp_path / "pt.sqlite"
    args = ["-p", "no:cacheprovider", "--conformance-target", "neuron-emu", "--conformance-build", "2.33.0",
            "--conformance-ops", "cumsum", "--conformance-ops", "abs", "--conformance-dtypes", "float32,bfloat16",
            "--conformance-db", str(db), "--conformance-max-samples", "2", "-k", "cumsum and bfloat16 or abs"]
    if xdist:
        args += ["-n", "2", "--dist", "loadgroup"]
    result = pytester.runpytest_subprocess(*args)
    outcomes = result.parseoutcomes()
    assert outcomes.get("passed", 0) >= 6, result.stdout.str()
    assert "failed" not in outcomes, result.stdout.str()
    with Store.open(db) as st:
        rows = list(st.db.query("select op, dtype, variant, status, run_id, shard from op_results"))
        runs = st.runs()
    assert len(runs) == 1 and runs[0]["target"] == "neuron-emu" and runs[0]["build"] == "2.33.0"
    assert {r["op"] for r in rows} == {"cumsum", "abs"}
    assert {r["dtype"] for r in rows if r["op"] == "cumsum"} == {"bfloat16"}
    assert len(rows) == outcomes["passed"] + outcomes.get("skipped", 0)
    if xdist:
        assert {r["shard"] for r in rows} <= {"xdist-gw0", "xdist-gw1"}
