"""The nightly pipeline, sharded as a CI matrix would run it: 2 shards as separate processes,
merged, then finished (coverage, gate, report) — equal to an unsharded nightly."""

from __future__ import annotations

import subprocess
import sys

from opdb import Store

ARGS = ["--build", "2.32.0", "--build", "2.33.0", "--ops", "abs", "--ops", "cumsum",
        "--dtypes", "float32", "--no-models", "--no-schema", "-n", "1"]


def _nightly(*extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "conformance", "nightly", *ARGS, *extra],
                          capture_output=True, text=True, timeout=600)


def _items(db) -> list[tuple[str, str, str]]:
    with Store.open(db) as st:
        return sorted((r["build"], r["item_key"], r["status"]) for r in st.db.query(
            "select runs.build, item_key, op_results.status from op_results join runs on runs.id = run_id"))


def test_two_shards_merge_and_finish_like_the_unsharded_nightly(tmp_path):
    full = tmp_path / "full.sqlite"
    r = _nightly("--db", str(full), "--site", str(tmp_path / "site-full"))
    assert r.returncode in (0, 1), r.stderr[-2000:]
    assert "gate 2.32.0" in r.stdout
    shards = [tmp_path / f"shard{k}.sqlite" for k in (1, 2)]
    procs = [subprocess.Popen([sys.executable, "-m", "conformance", "nightly", *ARGS, "--shard", f"{k}/2",
                               "--run-id-prefix", "n42", "--db", str(p)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for k, p in zip((1, 2), shards, strict=True)]
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-2000:]
        assert "merge the shard databases" in out
    merged = tmp_path / "merged.sqlite"
    m = subprocess.run([sys.executable, "-m", "conformance", "merge", str(merged), *map(str, shards)],
                       capture_output=True, text=True, timeout=900)
    assert m.returncode == 0, m.stderr
    fin = _nightly("--finish", "--db", str(merged), "--site", str(tmp_path / "site"))
    assert fin.returncode == r.returncode, fin.stderr[-2000:]
    assert "gate 2.32.0" in fin.stdout and (tmp_path / "site" / "index.html").exists()
    assert _items(merged) == _items(full)
    with Store.open(merged) as st:
        assert {x["status"] for x in st.runs()} == {"finished"}
        assert st.count("coverage") == 2 * st.count("ops") or st.count("coverage") > 3000
