"""The data files in conformance/data/ load through validated loaders: the shipped ones load,
and each kind of bad input is one DataFileError naming file, key and value."""

from __future__ import annotations

import pytest

from conformance import datafiles
from conformance.datafiles import DataFileError


def test_shipped_data_files_load():
    c = datafiles.canaries()
    assert c.ops and c.samples >= 1 and c.dtype == "float32"
    rules = datafiles.comparators()
    assert set(rules) == set(datafiles.COMPARATOR_KINDS) and all(r.ops and r.reason for r in rules.values())
    floors = datafiles.model_floors()
    assert floors and all(f.fwd_rtol > 0 and f.reason for f in floors)


GOOD_FLOOR = 'fwd_rtol = 1e-4\ngrad_rtol = 1e-3\nloss_rtol = 1e-4\nreason = "r"\n'
GOOD_RULE = 'reason = "r"\nops = ["x"]\n'


@pytest.mark.parametrize(("loader", "text", "names"), [
    ("canaries", 'ops = ["add"]\ndtype = "float"\nsamples = 2\n', ["dtype", "'float'"]),
    ("canaries", 'ops = ["add"]\ndtype = "float32"\nsamples = 0\n', ["samples", "0"]),
    ("canaries", 'ops = []\ndtype = "float32"\nsamples = 2\n', ["ops", "[]"]),
    ("canaries", 'ops = ["add"]\ndtype = "float32"\n', ["samples is missing"]),
    ("canaries", 'ops = ["add"]\ndtype = "float32"\nsamples = 2\nsample = 3\n', ["sample", "3"]),
    ("canaries", 'ops = ["add"\n', ["not valid TOML"]),
    ("comparators", f"[random]\n{GOOD_RULE}[meta]\n{GOOD_RULE}[indices]\n{GOOD_RULE}[decompositon]\n{GOOD_RULE}",
     ["decompositon", "tables named"]),
    ("comparators", f"[random]\n{GOOD_RULE}[meta]\n{GOOD_RULE}[indices]\n{GOOD_RULE}", ["[decomposition] is missing"]),
    ("comparators", f"[random]\nreason = \"\"\nops = [\"x\"]\n[meta]\n{GOOD_RULE}", ["random.reason", "''"]),
    ("model_floors", f"[[floor]]\ndtype = \"float32\"\n{GOOD_FLOOR.replace('1e-3', 'nan')}", ["floor[0].grad_rtol", "nan"]),
    ("model_floors", f"[[floor]]\n{GOOD_FLOOR.replace('1e-4', '-1', 1)}", ["floor[0].fwd_rtol", "-1"]),
    ("model_floors", f"[[floor]]\n{GOOD_FLOOR}fwd_rtoll = 1\n", ["floor[0].fwd_rtoll"]),
    ("model_floors", "floor = 3\n", ["floor = 3"]),
])
def test_bad_data_file_is_one_clear_error(tmp_path, loader, text, names):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(DataFileError) as exc:
        getattr(datafiles, loader)(path)
    msg = str(exc.value)
    assert msg.startswith(f"{path}:") and "\n" not in msg
    assert all(n in msg for n in names), msg


def test_binary_and_missing_files_are_named(tmp_path):
    path = tmp_path / "utf16.toml"
    path.write_bytes("ops = []".encode("utf-16"))
    with pytest.raises(DataFileError, match="not UTF-8"):
        datafiles.canaries(path)
    with pytest.raises(DataFileError, match="cannot read"):
        datafiles.canaries(tmp_path / "absent.toml")
