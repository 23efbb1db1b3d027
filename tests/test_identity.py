"""Behaviour does not change under refactoring: a fixed nightly (two builds, a few ops in three
dtypes, a schema-driven search, one model family, the gate with a confirmed regression) stores
exactly the results of ``tests/data/identity.json``, and the report of a fixed database renders
exactly the pages recorded there (apart from the generation time).

Only what a run cannot reproduce is left out: row ids, timestamps, durations, latencies, host,
git revision, worker console output. Everything else (statuses, errors, error magnitudes,
overload lists, signatures, seeds, gate decisions and evidence, coverage) must be identical.

A change that means to alter stored results or pages regenerates the file on purpose and says why
in its commit::

    CONFORMANCE_UPDATE_IDENTITY=1 python -m pytest tests/test_identity.py
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from opdb import Store
from reports import render_site

GOLDEN = Path(__file__).parent / "data" / "identity.json"
UPDATE = os.environ.get("CONFORMANCE_UPDATE_IDENTITY") == "1"
NIGHTLY = ["--build", "2.32.0", "--build", "2.33.0", "--ops", "abs", "--ops", "cumsum", "--ops", "index_select",
           "--ops", "nn.functional.upsample_nearest", "--ops", "aten::_foreach_abs*",
           "--dtypes", "float32,bfloat16,int64", "--models", "mlp", "--model-limit", "1", "-n", "1",
           "--run-id-prefix", "identity",
           "--reference-inputs", "none"]  # the night's slice of reference inputs rotates with the date
FLOAT_RTOL = 1e-4  # floats agree to this (a result that really changed moves far more)
# What no two runs share: ids, clocks, durations, latencies, machine, revision, console output.
VOLATILE = {"id", "recorded_at", "duration_s", "output", "host", "git_sha", "started_at", "finished_at",
            "decided_at", "compile_s", "p50_ms", "p99_ms", "first_ms", "seconds"}


def _clean(value: Any) -> Any:
    """A stored value without its volatile parts (JSON columns are parsed and cleaned too)."""
    if isinstance(value, str) and value[:1] in "[{":
        try:
            value = json.loads(value)
        except ValueError:
            return value
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in sorted(value.items()) if k not in VOLATILE}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def _rows(con: sqlite3.Connection, table: str, order: str) -> list[dict[str, Any]]:
    con.row_factory = sqlite3.Row
    return [_clean(dict(r)) for r in con.execute(f"select * from {table} order by {order}")]


def _machine_free(row: dict[str, Any]) -> dict[str, Any]:
    """A model row without what depends on the CPU's BLAS kernels beyond a float tolerance: the
    error fingerprint's probes and statistics are in eps, where a last-bit difference is a whole
    unit (the fingerprint's fields are kept, and whether a noise figure was measured)."""
    fp = row.get("fingerprint")
    return {**row, "fingerprint": sorted(fp) if isinstance(fp, dict) else fp, "noise": row.get("noise") is not None}


def stored_results(db: Path) -> dict[str, Any]:
    con = sqlite3.connect(db)
    try:
        coverage = _rows(con, "coverage", "run_id, name")
        return {
            "runs": _rows(con, "runs", "id"),
            "op_results": _rows(con, "op_results", "run_id, item_key"),
            "model_results": [_machine_free(r) for r in _rows(con, "model_results", "run_id, item_key")],
            "gate_items": _rows(con, "gate_items", "baseline_run, candidate_run, category, item_key"),
            "flakes": _rows(con, "flakes", "run_id, item_key"),
            # 3,110 overloads per run: the reached ones in full, the rest as a digest
            "coverage_reached": [r for r in coverage if r["samples"]],
            "coverage_digest": hashlib.sha256(json.dumps(coverage, sort_keys=True).encode()).hexdigest(),
        }
    finally:
        con.close()


def site_pages(out: Path) -> dict[str, str]:
    """sha256 of every file of a rendered site, the generation time blanked."""
    pages = {}
    for p in sorted(out.rglob("*")):
        if p.is_file():
            text = re.sub(r"Generated \S+ from", "Generated - from", p.read_text(encoding="utf-8"))
            pages[p.relative_to(out).as_posix()] = hashlib.sha256(text.encode()).hexdigest()
    return pages


def _report_db(path: Path) -> Path:
    spec = importlib.util.spec_from_file_location("_report_fixture", Path(__file__).with_name("test_report.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.make_report_db(path)


def _compare(name: str, got: Any, want: Any) -> None:
    if isinstance(want, list) and isinstance(got, list):
        assert len(got) == len(want), f"{name}: {len(got)} rows, expected {len(want)}"
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert _same(g, w), f"{name}[{i}] differs:\n got {json.dumps(g, sort_keys=True)[:1500]}\n" \
                           f"want {json.dumps(w, sort_keys=True)[:1500]}"
    elif isinstance(want, dict) and isinstance(got, dict):
        assert sorted(got) == sorted(want), f"{name}: keys {sorted(set(got) ^ set(want))} differ"
        for k in want:
            _compare(f"{name}.{k}", got[k], want[k])
    else:
        assert _same(got, want), f"{name}: {got!r} != {want!r}"


def _same(got: Any, want: Any) -> bool:
    """Equal, floats up to :data:`FLOAT_RTOL`: float results may differ in their last bits between
    CPUs (BLAS kernels of another vector width in the model runs)."""
    if isinstance(got, float) and isinstance(want, float):
        return math.isclose(got, want, rel_tol=FLOAT_RTOL, abs_tol=1e-12)
    if isinstance(got, dict) and isinstance(want, dict):
        return got.keys() == want.keys() and all(_same(got[k], want[k]) for k in want)
    if isinstance(got, list) and isinstance(want, list):
        return len(got) == len(want) and all(_same(g, w) for g, w in zip(got, want, strict=True))
    return got == want


@pytest.fixture(scope="module")
def golden() -> dict[str, Any]:
    if UPDATE:
        return {}
    assert GOLDEN.exists(), f"{GOLDEN} is missing: run with CONFORMANCE_UPDATE_IDENTITY=1 to record it"
    return json.loads(GOLDEN.read_text())


def _record(key: str, value: Any) -> None:
    data = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
    data[key] = value
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    GOLDEN.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


def test_a_fixed_nightly_stores_identical_results(tmp_path, golden):
    db = tmp_path / "o.sqlite"
    r = subprocess.run([sys.executable, "-m", "conformance", "nightly", *NIGHTLY, "--db", str(db),
                        "--site", str(tmp_path / "site")], capture_output=True, text=True, timeout=900)
    assert r.returncode in (0, 1), r.stderr[-3000:]
    got = stored_results(db)
    # the selection must exercise what a refactoring could break
    statuses = {row["status"] for row in got["op_results"]}
    assert {"pass", "pass_fallback", "error"} <= statuses, statuses
    assert any(row["variant"] == "schema" for row in got["op_results"])
    assert got["model_results"] and any(row["category"] == "regression" for row in got["gate_items"])
    if UPDATE:
        _record("nightly", got)
        return
    _compare("nightly", got, golden["nightly"])


def test_a_fixed_database_renders_identical_pages(tmp_path, golden):
    db = _report_db(tmp_path / "rep.sqlite")
    with Store.open(db) as st:
        render_site(st, tmp_path / "site", db_label="fixed.sqlite")
    got = site_pages(tmp_path / "site")
    assert "index.html" in got and len(got) > 10
    if UPDATE:
        _record("site", got)
        return
    _compare("site", got, golden["site"])
