"""The generation lane end to end (conformance run --generate): greedy decoding of a real transformers
causal LM on the emulated device against the CPU, on the clean control build and on builds with one
seeded defect each in an op that decoding uses; the gate between them. Needs transformers (the
zoo_tests session runs this file)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("transformers")

from click.testing import CliRunner  # noqa: E402

from conformance.cli import main  # noqa: E402
from conformance.gate.core import run_gate  # noqa: E402
from opdb import Store  # noqa: E402
from opdb import gen as gdb  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")

ATTN = "aten::_scaled_dot_product_flash_attention_for_cpu.default"
CACHE = "aten::index_copy_.default"
# the static KV cache of the tiny llama holds 2 heads x 16 dims x (prompt + 16 new tokens) values: 768
# at an 8-token prompt, 4,608 at 128, so a defect from 4,000 elements on hits the long bucket only
BUILDS = {
    "attn": f'[[defects]]\nop = "{ATTN}"\ndtypes = ["bfloat16"]\nkind = "wrong_result"\nmagnitude = 0.1\n',
    "cache": f'[[defects]]\nop = "{CACHE}"\nmin_numel = 4000\nkind = "wrong_result"\nmagnitude = 0.5\n',
    "slow": "[[defects]]\nop = \"aten::mm.default\"\nkind = \"slow\"\nmagnitude = 20\n",
}
ARGS = ["--generate", "hf.llama", "--dtypes", "float32,bfloat16", "--buckets", "8,128", "--gen-modes", "eager",
        "-n", "2", "--timeout", "120", "--quiet", "--exit-zero"]


def _build(tmp_path, name):
    p = tmp_path / f"{name}.toml"
    p.write_text(f'[build]\nname = "ideal-{name}"\ninherits = "ideal"\n\n{BUILDS[name]}', encoding="utf-8")
    return str(p)


def _run(db, build):
    res = CliRunner().invoke(main, ["run", "--target", "neuron-emu", "--build", build, *ARGS, "--db", str(db)])
    assert res.exit_code == 0, res.output


def _rows(st, run_id):
    return {(r["dtype"], r["bucket"]): r for r in gdb.results(st, run_id)}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gen")
    db = tmp / "gen.sqlite"
    for build in ("ideal", *(_build(tmp, n) for n in BUILDS)):
        _run(db, build)
    with Store.open(db, create=False) as st:
        ids = [r["id"] for r in st.db.query("select id from runs order by started_at")]
    return db, dict(zip(("ideal", *BUILDS), ids, strict=True))


def test_the_clean_build_generates_what_the_cpu_does_and_counts_its_near_ties(runs):
    db, ids = runs
    with Store.open(db, create=False) as st:
        rows = _rows(st, ids["ideal"])
    assert set(rows) == {(d, b) for d in ("float32", "bfloat16") for b in (8, 128)}
    for r in rows.values():
        assert r["status"] == "pass" and r["agreement"] == 1.0, r
        assert r["near_tie_flips"] == 0 and r["wide_flips"] == 0  # counted (a column), not left out
        assert r["decode_p50_ms"] > 0 and r["decode_p99_ms"] >= r["decode_p50_ms"] and r["prefill_ms"] > 0
        assert json.loads(r["params"])["cache"] == "static" and r["prompts"] == 4 and r["new_tokens"] == 16


def test_a_small_bf16_attention_error_is_a_wide_flip_in_bf16_only_with_its_op(runs):
    db, ids = runs
    with Store.open(db, create=False) as st:
        rows = _rows(st, ids["attn"])
    for (dtype, _bucket), r in rows.items():
        if dtype == "float32":
            assert r["status"] == "pass" and r["agreement"] == 1.0, r
            continue
        assert r["status"] == "mismatch" and r["wide_flips"] >= 1, r
        assert r["margin"] > r["margin_tol"], r  # a wide margin, not a near tie
        assert r["first_divergent_op"] == ATTN, r
        assert "wide margin" in r["error"]


def test_a_cache_update_wrong_for_long_sequences_shows_in_the_long_bucket_only(runs):
    db, ids = runs
    with Store.open(db, create=False) as st:
        rows = _rows(st, ids["cache"])
    for (_dtype, bucket), r in rows.items():
        if bucket == 8:
            assert r["status"] == "pass" and r["agreement"] == 1.0, r
        else:
            assert r["status"] == "mismatch" and r["wide_flips"] >= 1 and r["first_divergent_op"] == CACHE, r


def test_a_slow_decode_op_changes_no_token(runs):
    db, ids = runs
    with Store.open(db, create=False) as st:
        slow = _rows(st, ids["slow"])
    # the lane records its times (runs apart, on a shared machine: no verdict on them); the slowdown's
    # verdict is the perf lane's, paired and interleaved (conformance perf --decode, tests/test_perf_decode.py)
    assert all(r["status"] == "pass" and r["agreement"] == 1.0 and r["decode_p99_ms"] > 0 for r in slow.values())


def test_the_gate_calls_exactly_the_defects_items_regressions(runs):
    db, ids = runs
    with Store.open(db, create=False) as st:
        attn = run_gate(st, ids["ideal"], ids["attn"], attempts=1)
        cache = run_gate(st, ids["ideal"], ids["cache"], attempts=1)
        slow = run_gate(st, ids["ideal"], ids["slow"], attempts=1)
    assert {f.item_key for f in attn.of("regression")} == {
        "gen:hf.llama|gen_eager|bfloat16|8", "gen:hf.llama|gen_eager|bfloat16|128"}
    assert {f.item_key for f in cache.of("regression")} == {
        "gen:hf.llama|gen_eager|float32|128", "gen:hf.llama|gen_eager|bfloat16|128"}
    assert all(f.kind == "generate" for f in attn.of("regression"))
    assert slow.verdict == "pass" and not slow.of("regression")


def test_the_lane_resumes_after_kill_9_with_nothing_lost(tmp_path):
    db = tmp_path / "kill.sqlite"
    cmd = [sys.executable, "-m", "conformance", "run", "--target", "neuron-emu", "--build", "ideal",
           "--generate", "hf.llama,hf.gpt2", "--dtypes", "float32", "--buckets", "8,16", "--new-tokens", "4",
           "--gen-modes", "eager,compile", "-n", "1", "--db", str(db), "--quiet", "--exit-zero"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 600
    try:
        while time.monotonic() < deadline:
            time.sleep(1)
            if db.exists():
                with Store.open(db, create=False) as st:
                    if st.count("gen_results") >= 2:
                        break
        os.killpg(proc.pid, signal.SIGKILL)  # the supervisor and its workers, no clean-up
    finally:
        proc.wait(30)
    with Store.open(db, create=False) as st:
        run_id = st.runs()[0]["id"]
        before = st.count("gen_results", run_id=run_id)
    assert 2 <= before < 8
    res = CliRunner().invoke(main, ["run", "--resume", run_id, "--db", str(db), "--quiet", "--exit-zero"])
    assert res.exit_code == 0, res.output
    with Store.open(db, create=False) as st:
        keys = [r["item_key"] for r in gdb.results(st, run_id)]
        assert st.get_run(run_id)["status"] == "finished"
    assert len(keys) == len(set(keys)) == 8
    assert {k.split("|")[1] for k in keys} == {"gen_eager", "gen_compile"}


def test_the_nightly_decodes_with_the_nights_slice_and_a_resumed_one_keeps_it(tmp_path):
    from conformance.gate import nightly
    from conformance.perf.lane import PerfSpec
    from conformance.run.spec import RunSpec
    from conformance.select import SelectionError, night_slice

    def spec(generate, **kw):
        return nightly.NightlySpec(run=RunSpec(models=()), builds=("2.33.0",), run_id_prefix="n1", generate=generate,
                                   **kw)

    lines: list[str] = []
    with Store.open(tmp_path / "n.sqlite") as st:
        auto = nightly.with_generation_slice(spec("auto"), st, False, lines.append)
        assert auto.run.generate == (f"hf@{night_slice(nights=nightly.GEN_NIGHTS)}",)
        assert f"within {nightly.GEN_NIGHTS} nights" in lines[-1]
        assert nightly.with_generation_slice(spec("none"), st, False, lines.append).run.generate == ()
        assert nightly.with_generation_slice(spec("all"), st, False, lines.append).run.generate == ("hf@0/1",)
        assert nightly.with_generation_slice(spec("3/7"), st, False, lines.append).run.generate == ("hf@3/7",)
        perf = nightly.with_generation_slice(spec("3/7", perf=PerfSpec(ops=("mm",))), st, False, lines.append).perf
        if hasattr(perf, "decode"):  # the perf lane times the slice's decode steps build against build
            assert perf.decode == ("hf@3/7",)
        # resumed: the slice the nightly's first run was started with, whatever the date says now
        stored = spec("auto").run_for(spec("auto").builds[0]).replace(generate=("hf@5/40",))
        st.start_run(target="neuron-emu", build="2.33.0", torch_version="x", config=stored.to_config(),
                     run_id=stored.run_id, kind="generate")
        assert nightly.with_generation_slice(spec("auto"), st, True, lines.append).run.generate == ("hf@5/40",)
    with pytest.raises(SelectionError, match="--generate"):
        spec("9/7")
