"""The report's serving page (``<build>/serving.html``): the generation lane's rows of two builds,
hand-written, rendered; what it counts, and the items the build-vs-previous-build diff lists."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from opdb import Store
from opdb import gen as gendb
from reports import render_site
from reports.pages.serving import cell_text, changes, status_worse

TARGET = "neuron-emu"


def _run(run_id: str, build: str, started: str, status: str = "finished") -> dict[str, Any]:
    # a run with --generate alone is stored as an "ops" run (the runner's kind)
    return {"id": run_id, "target": TARGET, "build": build, "torch_version": "2.13.0+cpu", "host": "h",
            "git_sha": "abc", "started_at": started, "finished_at": started if status == "finished" else None,
            "status": status, "kind": "ops", "config": "{}"}


def gen(run: str, model: str, mode: str, bucket: int, status: str = "pass", dtype: str = "float32",
        **kw: Any) -> dict[str, Any]:
    variant = "gen_" + mode
    row = {"run_id": run, "item_key": f"gen:{model}|{variant}|{dtype}|{bucket}", "model_id": model, "dtype": dtype,
           "mode": mode, "bucket": bucket, "status": status, "cache": "static", "prompts": 4, "new_tokens": 16,
           "params": json.dumps({"library": "hf", "parameters": 12345}),
           "agreement": 1.0, "near_tie_flips": 0, "wide_flips": 0, "loglik_shift": 0.001, "loglik_tol": 0.05,
           "prefill_ms": 3.0, "decode_p50_ms": 1.0, "decode_p99_ms": 2.0, "cpu_decode_p50_ms": 5.0,
           "cpu_decode_p99_ms": 6.0, "fallback_ops": "[]"}
    if mode == "compile":
        row.update(recompiles=1, graphs=2)
    if status in ("skip", "error"):
        row.update({k: None for k in ("agreement", "near_tie_flips", "wide_flips", "loglik_shift", "prefill_ms",
                                      "decode_p50_ms", "decode_p99_ms", "cpu_decode_p50_ms", "cpu_decode_p99_ms")})
        row["error"] = "fails on the CPU: boom" if status == "skip" else "RuntimeError: <b>device lost</b>"
    return {**row, **kw}


# build 2.31.0 (run g-a) -> 2.33.0 (run g-b); 2.34.0 has an op run only
BEFORE = [gen("g-a", "hf.llama", "eager", 8), gen("g-a", "hf.llama", "eager", 32),
          gen("g-a", "hf.llama", "compile", 8, "mismatch", agreement=0.5, wide_flips=2),
          gen("g-a", "hf.gpt2", "compile", 8), gen("g-a", "hf.gpt2", "compile", 32),
          gen("g-a", "hf.gpt2", "eager", 8, "skip"), gen("g-a", "hf.gpt2", "eager", 32)]
AFTER = [
    # status and agreement worse: a wide flip, localised
    gen("g-b", "hf.llama", "eager", 8, "mismatch", agreement=0.75, wide_flips=1, first_divergence=3, margin=0.9,
        margin_tol=0.02, first_divergent_op="aten::mm", error="1 of 4 sequences flip at a wide margin"),
    # agreement dropped by a near tie: the status stays pass
    gen("g-b", "hf.llama", "eager", 32, agreement=0.75, near_tie_flips=1, first_divergence=5, margin=0.01,
        margin_tol=0.02),
    gen("g-b", "hf.llama", "compile", 8),  # fixed: not a change for the worse
    gen("g-b", "hf.gpt2", "compile", 8, decode_p99_ms=2.5),  # p99 x1.25: timed apart, no reason
    gen("g-b", "hf.gpt2", "compile", 32, decode_p99_ms=2.3),
    gen("g-b", "hf.gpt2", "eager", 8, "error"),  # a skip before: no comparison
    gen("g-b", "hf.gpt2", "eager", 32, "pass_fallback", fallback_ops='["aten::cumsum.default"]'),
    gen("g-b", "hf.llama", "eager", 128, near_tie_flips=1, agreement=0.75),  # new: nothing to compare
    gen("g-b", "hf.llama", "eager", 8, "pass", dtype="bfloat16"),
]
WORSENED = {("hf.llama", "float32", "eager", 8): ["status", "agreement"],
            ("hf.llama", "float32", "eager", 32): ["agreement"],
            ("hf.gpt2", "float32", "eager", 32): ["status"]}


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    st = Store.memory()
    st.insert("runs", [_run("g-a", "2.31.0", "2026-11-01T10:00:00+00:00"),
                       _run("g-b", "2.33.0", "2026-11-02T10:00:00+00:00"),
                       # a later run of 2.33.0 that was interrupted: the finished one is shown
                       _run("g-b-bad", "2.33.0", "2026-11-02T12:00:00+00:00", status="interrupted"),
                       _run("ops-c", "2.34.0", "2026-11-03T10:00:00+00:00")])
    st.insert("gen_results", BEFORE + AFTER + [gen("g-b-bad", "hf.llama", "eager", 8, "crash")])
    out = tmp_path_factory.mktemp("serving")
    render_site(st, out, db_label="gen.sqlite")
    return out


def _spec(html: str, spec_id: str) -> dict[str, Any]:
    m = re.search(rf'<script type="application/json" id="{re.escape(spec_id)}">(.*?)</script>', html, re.S)
    assert m, spec_id
    return json.loads(m.group(1))


def _read(site: Path, rel: str) -> str:
    return (site / rel).read_text(encoding="utf-8")


def test_diff_lists_exactly_the_items_that_got_worse(site):
    html = _read(site, "2.33.0/serving.html")
    spec = _spec(html, "serving-diff-data")
    cols = [c["key"] for c in spec["columns"]]
    got = {(r[cols.index("model")], r[cols.index("dtype")], r[cols.index("mode")], r[cols.index("bucket")]):
           r[cols.index("changes")] for r in spec["rows"]}
    assert got == WORSENED
    assert "<b>3</b> items got worse" in html
    assert 'since <a href="../2.31.0/serving.html">2.31.0</a>' in html
    llama = next(r for r in spec["rows"] if r[cols.index("changes")] == ["status", "agreement"])
    assert llama[cols.index("p99_ratio")] == 1.0  # both builds' p99 shown, for scale


def test_summary_counts_items_statuses_and_near_ties(site):
    html = _read(site, "2.33.0/serving.html")
    assert "g-b-bad" not in html and "Run <code>g-b</code>" in html
    assert 'data-k="models">2<' in html and 'data-k="items">9<' in html
    assert 'data-k="buckets">8, 32, 128<' in html
    assert 'data-k="near_tie">2<' in html and "in 2 items" in html  # counted, never hidden
    assert 'data-k="wide">1<' in html
    assert 'data-k="sequences">32<' in html  # the error item decoded nothing
    for status, n in (("pass", 6), ("pass_fallback", 1), ("mismatch", 1), ("error", 1)):
        assert f'data-status="{status}">{n}<' in html


def test_a_matrix_per_dtype_and_mode_of_models_by_buckets(site):
    html = _read(site, "2.33.0/serving.html")
    assert re.findall(r'<section id="(m-[^"]+)"', html) == ["m-bfloat16-eager", "m-float32-eager",
                                                             "m-float32-compile"]
    spec = _spec(html, "m-float32-eager-data")
    assert [c["label"] for c in spec["columns"] if c["kind"] == "cell"] == ["8 tokens", "32 tokens", "128 tokens"]
    llama = next(r for r in spec["rows"] if r[0] == "hf.llama")
    assert llama[1] == 12345 and llama[3] == "mismatch"  # parameters, worst status
    cell = llama[4]
    assert cell[0] == "mismatch" and cell[5] == "75% · 1 wide" and cell[4] == "#gen:hf.llama|gen_eager|float32|8"
    assert "CPU margin 0.9 vs near-tie bound 0.02" in cell[1] and "first divergent op aten::mm" in cell[1]
    assert llama[5][5] == "75% · 1 near-tie"
    gpt2 = next(r for r in spec["rows"] if r[0] == "hf.gpt2")
    assert gpt2[4][5] == "error" and gpt2[6] is None  # no 128 bucket for gpt2
    compiled = _spec(html, "m-float32-compile-data")
    assert "1 recompiles (2 graphs so far)" in compiled["rows"][0][4][1]


def test_items_table_has_every_figure_and_escapes_errors(site):
    html = _read(site, "2.33.0/serving.html")
    spec = _spec(html, "serving-items-data")
    cols = [c["key"] for c in spec["columns"]]
    assert len(spec["rows"]) == 9 and spec["hashFilter"] is True
    row = next(r for r in spec["rows"] if r[cols.index("item")] == "gen:hf.gpt2|gen_eager|float32|32")
    assert row[cols.index("fallback_ops")] == ["aten::cumsum.default"]
    assert row[cols.index("cpu_decode_p50_ms")] == 5.0 and row[cols.index("agreement")] == 100.0
    assert "<b>device lost</b>" not in html  # in the JSON, escaped for the script block


def test_first_build_and_a_build_without_generation(site):
    first = _read(site, "2.31.0/serving.html")
    assert "no previous build to compare with" in first and "serving-diff-data" not in first
    none = _read(site, "2.34.0/serving.html")
    assert "No generation run for this build" in none and "--generate hf" in none
    assert '<a href="../2.34.0/serving.html" class="current" aria-current="page">Serving</a>' in none
    assert 'href="../2.34.0/serving.html">Serving</a>' in _read(site, "2.34.0/index.html")


def test_rules_and_the_build_run_query():
    assert status_worse("pass", "mismatch") and status_worse("pass", "pass_fallback")
    assert not status_worse("skip", "error") and not status_worse("pass", "skip")
    assert not status_worse("mismatch", "pass")
    assert changes([gen("a", "m", "eager", 8)], [gen("b", "m", "eager", 8, decode_p99_ms=20.0)]) == []  # timed apart
    assert cell_text(gen("a", "m", "eager", 8, "skip")) == "skip"
    st = Store.memory()
    assert gendb.build_run(st, TARGET, "2.33.0") is None
    st.insert("runs", [_run("x", "-", "2026-11-01"), _run("y", "-", "2026-11-02", status="interrupted")])
    st.insert("gen_results", [gen("x", "m", "eager", 8), gen("y", "m", "eager", 8)])
    assert gendb.build_run(st, TARGET, "-")["id"] == "x"
    assert gendb.build_run(st, "cpu", "-") is None
