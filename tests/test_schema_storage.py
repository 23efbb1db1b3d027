"""``Storage`` arguments in the schema search (``set_.source_Storage`` and its kin): generated as
an untyped storage sized from the call's common shape, copied to the target as the tensors are
(the CPU and the target calls get equal storages), compared as any result, and stored in the
safe inputs format so that the corpus replays them and ``conformance repro`` reproduces them."""

from __future__ import annotations

import contextlib
import subprocess
import sys

import pytest
import torch
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from torch.testing._internal.opinfo.core import SampleInput

from conformance.check.contracts import noncontiguous_copy
from conformance.check.placement import clone_sample, guarded_inputs, on_device
from conformance.cli import main
from conformance.inputs import corpus
from conformance.inputs.schema import StorageSpec, call_strategy
from conformance.sweep import schema as search
from conformance.sweep.opinfo import SweepConfig
from conformance.targets import get_target
from conformance.targets.cpu import CpuTarget
from conformance.work import Group, Skip
from opdb import Store
from opdb.blobs import dump_inputs, load_inputs
from opdb.corpus import corpus_entries

#: Every overload of torch 2.13 with a Storage argument (the schemas that name the type).
STORAGE_OVERLOADS = ("aten::set.source_Storage", "aten::set.source_Storage_out",
                     "aten::set.source_Storage_storage_offset", "aten::set.source_Storage_storage_offset_out",
                     "aten::set_.source_Storage", "aten::set_.source_Storage_storage_offset")


def _packet(name):
    base, overload = name.removeprefix("aten::").split(".")
    return getattr(getattr(torch.ops.aten, base), overload)


def test_the_list_is_every_overload_with_a_storage_argument():
    named = {f"aten::{s.name.removeprefix('aten::')}.{s.overload_name}" for s in torch._C._jit_get_all_schemas()
             if s.name.startswith("aten::") and any(a.type.kind() == "StorageType" for a in s.arguments)}
    assert named == set(STORAGE_OVERLOADS)


@pytest.mark.parametrize("name", STORAGE_OVERLOADS)
def test_a_storage_argument_is_generated(name):
    seen = []

    @settings(max_examples=20, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
    @given(call_strategy(_packet(name)))
    def collect(call):
        seen.append(call)

    collect()
    assert seen and all(isinstance(c.args[1], StorageSpec) for c in seen)
    for c in seen[:5]:
        args, _ = c.materialize()
        spec, storage = c.args[1], args[1]
        assert isinstance(storage, torch.UntypedStorage) and storage.device.type == "cpu"
        assert storage.nbytes() == spec.numel * spec.dtype.itemsize


def _storage_sample():
    storage = torch.arange(6, dtype=torch.float32).untyped_storage()
    return SampleInput(torch.zeros(2), args=(storage, 1, [2, 2])), storage


def _bytes(storage):
    return bytes(storage.cpu())


@pytest.mark.parametrize("guarded", [False, True])
def test_a_storage_goes_where_the_tensors_go_as_a_copy(guarded):
    sample, storage = _storage_sample()
    with guarded_inputs() if guarded else contextlib.nullcontext() as guards:
        moved = on_device(sample, "cpu")
    got = moved.args[0]
    assert isinstance(got, torch.UntypedStorage) and got.data_ptr() != storage.data_ptr()
    assert got.nbytes() == storage.nbytes() and _bytes(got) == _bytes(storage)
    if guarded:  # between guard regions, as a tensor's copy is (a kernel reading past it reads them)
        assert guards.regions and guards.intact()
        return
    # the copy is the call's: the op may resize it (set_ grows a storage that is too short)
    torch.empty(0).set_(got, 0, (20,), (1,))
    assert storage.nbytes() == 24 and _bytes(on_device(sample, "cpu").args[0]) == _bytes(storage)


def test_a_storage_keeps_its_bytes_under_every_maker():
    """A maker that lays tensors out otherwise (the noncontiguous contract's copies, with gaps)
    leaves a storage as it is (a longer one would be another argument); one with no device
    (the float64 arbiter's recast) copies it too."""
    sample, storage = _storage_sample()
    moved = clone_sample(sample, lambda t: noncontiguous_copy(t.detach(), "cpu"), "cpu")
    assert not moved.input.is_contiguous() or moved.input.numel() < 2
    assert moved.args[0].nbytes() == storage.nbytes() and _bytes(moved.args[0]) == _bytes(storage)
    recast = clone_sample(sample, lambda t: t.to(torch.float64) if t.is_floating_point() else t.clone())
    assert recast.args[0].data_ptr() != storage.data_ptr() and _bytes(recast.args[0]) == _bytes(storage)


def test_a_storage_is_stored_in_the_safe_format():
    storage = torch.arange(3, dtype=torch.int64).untyped_storage()
    back = load_inputs(dump_inputs({"args": [torch.ones(2), storage, 1], "kwargs": {}}))
    assert isinstance(back["args"][1], torch.UntypedStorage) and _bytes(back["args"][1]) == _bytes(storage)
    a = corpus.Stored("valid", False, (torch.ones(1), storage), {})
    assert corpus.same_input(a, corpus.Stored("valid", False, (torch.ones(1), storage.clone()), {}))
    assert not corpus.same_input(a, corpus.Stored("valid", False, (torch.ones(1), torch.zeros(3).untyped_storage()), {}))


@pytest.mark.parametrize("target", ["neuron-emu", "cpu"])
def test_storage_overloads_are_exercised(target):
    """Each runs on the target with its storage there (the output on the target's device) and
    passes: before Storage was generated, each was `no valid input`."""
    t = get_target(target, "2.33.0") if target == "neuron-emu" else get_target(target)
    for name in STORAGE_OVERLOADS:
        row = next(search.run_schema_group(t, Group(name, "any", "schema"), SweepConfig()))
        assert row["status"] == "pass", (name, row["error"])
        assert name in row["reached_ops"] and "storage[" in row["signature"]
        assert row["proof"]["device"] == [str(torch.device(t.device)) if target == "cpu" else "neuron:0"]


class _OffsetIgnored(CpuTarget):
    """The CPU, except that ``set_`` ignores its storage offset (reads the storage from its start)."""

    name = "cpu"

    def wrap(self, fn):
        def call(*args, **kwargs):
            if len(args) > 2 and isinstance(args[1], torch.UntypedStorage):
                args = (*args[:2], 0, *args[3:])
            return fn(*args, **kwargs)

        return call


OFFSET_OP = "aten::set.source_Storage_storage_offset"


@pytest.fixture(scope="module")
def offset_found():
    side: list = []
    rows = list(search.run_schema_group(_OffsetIgnored(), Group(OFFSET_OP, "any", "schema"), SweepConfig(), side=side))
    return rows[0], side[0]


def test_a_misread_storage_is_a_mismatch_shrunk_to_a_replayable_input(offset_found):
    row, side = offset_found
    assert row["status"] == "mismatch" and "minimal failing input" in row["error"], row["error"]
    saved = load_inputs(row["inputs"])
    self_, storage, offset = saved["args"][:3]
    assert isinstance(storage, torch.UntypedStorage) and offset == 1  # shrunk to the smallest offset that differs
    # the corpus keeps it and the next run replays it, failing again without a search
    store = Store.memory()
    store.insert("schema_corpus", [side["entry"]], replace=True)
    entry = corpus_entries(store)[OFFSET_OP]
    assert any(isinstance(a, torch.UntypedStorage) for c in corpus.decode(entry).of("failing") for a in c.args)
    again_side: list = []
    again = next(search.run_schema_group(_OffsetIgnored(), Group(OFFSET_OP, "any", "schema"), SweepConfig(),
                                         skip=Skip(replay=entry), side=again_side))
    assert again_side == [{"how": "replayed"}] and again["status"] == "mismatch"
    assert load_inputs(again["inputs"])["args"][2] == 1


def test_repro_runs_a_stored_storage_input(tmp_path, offset_found):
    """``conformance repro`` of the stored row: its script moves the storage as the sweep does and
    runs the overload on it (the CPU target agrees with itself: within tolerance)."""
    row, _ = offset_found
    db = tmp_path / "t.sqlite"
    with Store.open(db) as st:
        run = st.start_run(target="cpu", build="-", torch_version=torch.__version__, config={"seed": 0})
        st.insert("op_results", [{"run_id": run, "item_key": f"{OFFSET_OP}|schema|any|0", "op": OFFSET_OP,
                                  "variant": "schema", "dtype": row["dtype"], "sample": 0, "status": "mismatch",
                                  "error": row["error"], "inputs": row["inputs"], "atol": 0.0, "rtol": 0.0}])
        rid = next(iter(st.db.query("select id from op_results")))["id"]
    r = CliRunner().invoke(main, ["repro", str(rid), "--db", str(db), "--out", str(tmp_path / "repro")])
    assert r.exit_code == 0, r.output
    script = tmp_path / "repro" / f"repro_{rid}.py"
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "within tolerance" in out.stdout, out.stdout + out.stderr
