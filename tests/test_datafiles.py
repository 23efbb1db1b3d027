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
    gen = datafiles.generation()
    assert gen.buckets == tuple(sorted(gen.buckets)) and gen.near_tie_factor > 0 and gen.near_tie_reason
    assert gen.logits_rtol("neuron-emu", "float32") > gen.logits_rtol("cpu", "float32") > 0  # the last match holds
    assert gen.max_shift("cpu", "bfloat16") > 0 and gen.max_shift("cpu", "int64") == 0.0
    ncr = datafiles.no_cpu_reference()
    assert ncr.torch and ncr.overloads and all(v.startswith("aten::") for v in ncr.overloads.values())


GOOD_FLOOR = 'fwd_rtol = 1e-4\ngrad_rtol = 1e-3\nloss_rtol = 1e-4\nreason = "r"\n'
GOOD_RULE = 'reason = "r"\nops = ["x"]\n'
GEN = ('buckets = [8, 32]\nnew_tokens = 4\nprompts = 2\ncontinuation = 4\ntiming_repeats = 0\n'
       'initializer_range = 0.3\n[near_tie]\nfactor = 2.0\nreason = "r"\n')


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
    ("generation", GEN.replace("[8, 32]", "[8, 8]"), ["buckets", "[8, 8]", "distinct prompt lengths"]),
    ("generation", GEN.replace("new_tokens = 4", "new_tokens = 0"), ["new_tokens", "0", "integer >= 1"]),
    ("generation", GEN.replace("factor = 2.0", "factor = -1"), ["near_tie.factor", "-1"]),
    ("generation", GEN + '[[logits]]\ndtype = "bfloat16"\nrtol = "big"\nreason = "r"\n', ["logits[0].rtol", "'big'"]),
    ("generation", GEN + '[[loglik]]\nmax_shift = 1\n', ["loglik[0].reason is missing"]),
    ("generation", GEN.replace("prompts = 2\n", ""), ["prompts is missing"]),
    ("no_cpu_reference", 'torch = "2.13.0+cpu"\n[overloads]\n', ["torch", "'2.13.0+cpu'", "no local label"]),
    ("no_cpu_reference", 'torch = 2.13\n[overloads]\n', ["torch", "2.13", "a torch release"]),
    ("no_cpu_reference", 'torch = "2.13.0"\n', ["overloads is missing"]),
    ("no_cpu_reference", 'torch = "2.13.0"\noverloads = ["aten::a.out"]\n', ["overloads", "['aten::a.out']"]),
    ("no_cpu_reference", 'torch = "2.13.0"\n[overloads]\n"aten::_copy_from" = "aten::_copy_from"\n',
     ['overloads."aten::_copy_from"', ".default"]),
    ("no_cpu_reference", 'torch = "2.13.0"\n[overloads]\n"aten::_copy_from.out" = "_copy_from"\n',
     ['overloads."aten::_copy_from.out"', "'_copy_from'", "aten::op"]),
    ("no_cpu_reference", 'torch = "2.13.0"\n[overloads]\n"aten::_copy_from.out" = 1\n',
     ['overloads."aten::_copy_from.out" = 1']),
    ("no_cpu_reference", 'torch = "2.13.0"\nversion = 1\n[overloads]\n', ["version = 1", "torch"]),
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


@pytest.fixture
def fresh_catalog(monkeypatch):
    """The catalog re-read under a CONFORMANCE_NO_CPU_REFERENCE the test sets, and again after."""
    from conformance.catalog import overloads as catalog

    def clear():
        catalog.no_cpu_reference.cache_clear()
        catalog._overloads_cached.cache_clear()

    clear()
    yield catalog
    monkeypatch.undo()
    clear()


def test_an_overload_the_dispatcher_does_not_know_is_named(tmp_path, monkeypatch, fresh_catalog):
    import torch

    path = tmp_path / "ncr.toml"
    release = torch.__version__.split("+")[0]
    path.write_text(f'torch = "{release}"\n[overloads]\n"aten::no_such_op.out" = "aten::no_such_op"\n')
    monkeypatch.setenv(fresh_catalog.NO_CPU_REFERENCE_ENV, str(path))
    with pytest.raises(DataFileError) as exc:
        fresh_catalog.overloads()
    msg = str(exc.value)
    assert msg.startswith(f"{path}:") and 'overloads."aten::no_such_op.out"' in msg and "dispatcher knows" in msg


def test_a_file_for_another_torch_is_ignored_with_a_warning(tmp_path, monkeypatch, fresh_catalog):
    path = tmp_path / "ncr.toml"
    path.write_text('torch = "1.0.0"\n[overloads]\n"aten::cudnn_grid_sampler.out" = "aten::cudnn_grid_sampler"\n')
    monkeypatch.setenv(fresh_catalog.NO_CPU_REFERENCE_ENV, str(path))
    with pytest.warns(fresh_catalog.StaleDataFile, match=r"torch = '1\.0\.0'.*ignored"):
        ops = {o.name: o for o in fresh_catalog.overloads()}
    assert not ops["aten::cudnn_grid_sampler.out"].has("no_cpu_kernel")
    # this torch's file: the same overload is one the CPU cannot compute
    fresh_catalog.no_cpu_reference.cache_clear()
    fresh_catalog._overloads_cached.cache_clear()
    monkeypatch.delenv(fresh_catalog.NO_CPU_REFERENCE_ENV)
    assert {o.name: o for o in fresh_catalog.overloads()}["aten::cudnn_grid_sampler.out"].has("no_cpu_kernel")
