"""benchmarks/run_all.py: every script in benchmarks/ is run by `nox -s bench`, and its list is
validated data whose errors name the entry, the field and the value."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("run_all", Path(__file__).resolve().parents[1] / "benchmarks" / "run_all.py")
run_all = sys.modules["run_all"] = importlib.util.module_from_spec(_spec)  # its dataclasses look it up
_spec.loader.exec_module(run_all)


def test_every_benchmark_script_is_listed_and_every_listed_one_exists():
    benchmarks = run_all.load()
    assert benchmarks and not run_all.unlisted(benchmarks)
    assert all(b.figures and b.why for b in benchmarks)


@pytest.mark.parametrize(("text", "message"), [
    ('[[benchmark]]\nscript = "nope.py"\nfigures = ["x"]\nwhy = "w"', "script 'nope.py' is not a file"),
    ('[[benchmark]]\nscript = "bench_gate.py"\nfigures = ["("]\nwhy = "w"', "figure pattern '\\('"),
    ('[[benchmark]]\nscript = "bench_gate.py"\nfigures = []\nwhy = "w"', "figures must be a non-empty list"),
    ('[[benchmark]]\nscript = "bench_gate.py"\nfigures = ["x"]', "why .* is missing"),
    ('[[benchmark]]\nscript = "bench_gate.py"\nfigures = ["x"]\nwhy = "w"\nargz = []', "unknown field 'argz'"),
    ("[benchmark", "cannot read it"),
])
def test_a_bad_entry_is_one_error_naming_it(tmp_path, text, message):
    path = tmp_path / "benchmarks.toml"
    path.write_text(text)
    with pytest.raises(run_all.ConfigError, match=message):
        run_all.load(path)


def test_the_table_marks_a_failed_or_silent_benchmark_and_never_invents_a_figure(tmp_path):
    b = run_all.load()[0]
    rows = run_all.table([run_all.Outcome(b, 1, 2.0, ["x 1"], tmp_path / "a.log"),
                          run_all.Outcome(b, 0, 3.0, [], tmp_path / "b.log"),
                          run_all.Outcome(b, 0, 4.0, ["add   (native) 1.2"], tmp_path / "c.log")]).splitlines()
    assert "FAILED (exit 1" in rows[2] and "x 1" not in rows[2]
    assert "NO FIGURE LINE" in rows[3]
    assert rows[4].endswith("| 4 | add (native) 1.2 |")
