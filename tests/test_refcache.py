"""The shared CPU side (conformance.check.refcache): stored values come back as they were, a changed
sample, torch or harness misses, the cache stays within its bounds, and a sweep that takes its
references from it records exactly what one that computes them records."""

from __future__ import annotations

import sqlite3

import pytest
import torch
from torch.testing._internal.opinfo.core import SampleInput

from conformance.check import refcache
from conformance.check.refcache import MISSING, RefCache, Uncacheable, content_digest, decode, encode
from conformance.sweep.opinfo import SweepConfig, run_group
from conformance.targets import get_target
from conformance.work import Group


def test_values_round_trip_with_their_layout_and_aliasing():
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    view = base[1:, ::2]  # offset and strides into a shared storage
    value = (base, view, [torch.tensor([1.5], dtype=torch.bfloat16), torch.tensor([True, False])],
             {"c": torch.tensor([1 + 2j], dtype=torch.complex64), "n": None, "s": "x", "f": 2.5, "d": torch.float16},
             torch.sort(torch.tensor([3.0, 1.0])),
             SampleInput(base, args=(view, 3), kwargs={"dim": 1}))
    back = decode(encode(value))
    assert torch.equal(back[0], base) and torch.equal(back[1], view)
    assert back[1].stride() == view.stride() and back[1].storage_offset() == view.storage_offset()
    assert back[0].untyped_storage().data_ptr() == back[1].untyped_storage().data_ptr()  # still aliased
    assert back[2][0].dtype == torch.bfloat16 and back[2][1].tolist() == [True, False]
    assert back[3]["c"].dtype == torch.complex64 and back[3]["c"].item() == 1 + 2j
    assert back[3]["n"] is None and back[3]["s"] == "x" and back[3]["f"] == 2.5 and back[3]["d"] is torch.float16
    assert type(back[4]).__name__ == "sort" and back[4].values.tolist() == [1.0, 3.0]
    s = back[5]
    assert isinstance(s, SampleInput) and s.args[1] == 3 and s.kwargs == {"dim": 1}
    assert s.input.untyped_storage().data_ptr() == s.args[0].untyped_storage().data_ptr()
    with pytest.raises(Uncacheable):
        encode(torch.eye(2).to_sparse())
    with pytest.raises(Uncacheable):
        encode(object())


def test_the_digest_sees_values_layout_aliasing_and_refuses_what_it_cannot_name():
    x = torch.arange(6.0).reshape(2, 3)
    d = content_digest(("abs", x))
    assert d == content_digest(("abs", x.clone()))
    y = x.clone()
    y[1, 2] = 7
    assert content_digest(("abs", y)) != d  # one element
    assert content_digest(("abs", x.t().contiguous().t())) != d  # strides
    assert content_digest(("abs", x)) != content_digest(("neg", x))
    z = torch.zeros(4)
    assert content_digest((z, z)) != content_digest((z, z.clone()))  # shared storage vs two storages
    with pytest.raises(Uncacheable):
        content_digest((x, object()))
    with pytest.raises(Uncacheable):
        content_digest(torch.eye(2).to_sparse())


def test_a_hit_needs_the_same_content_and_environment(tmp_path):
    path = tmp_path / "refs.sqlite"
    cache = RefCache(path, min_seconds=0)
    assert cache.get("h", lambda: "d1") is MISSING
    cache.put("h", "d1", torch.ones(3), seconds=0.01)
    assert torch.equal(cache.get("h", lambda: "d1"), torch.ones(3))
    assert cache.get("h", lambda: "d2") is MISSING  # the sample changed
    cache.close()
    again = RefCache(path, min_seconds=0)  # another process: from disk
    assert torch.equal(again.get("h", lambda: "d1"), torch.ones(3))
    again.close()
    with sqlite3.connect(path) as db:  # as if written under another torch / harness
        db.execute("UPDATE refs SET env = 'v0 torch 1.0'")
    other = RefCache(path, min_seconds=0)
    assert other.get("h", lambda: "d1") is MISSING and other._disk == 0
    other.close()


def test_only_what_is_worth_it_is_stored_and_the_bounds_hold(tmp_path):
    cache = RefCache(tmp_path / "refs.sqlite", min_seconds=0.002, disk_bytes=40_000, memory_bytes=16_000)
    cache.put("cheap", "d", torch.ones(3), seconds=0.0001)
    assert cache.get("cheap", lambda: "d") is MISSING  # computed faster than a lookup is worth
    cache.put("huge", "d", torch.ones(1_000_000), seconds=0.003)
    assert cache.get("huge", lambda: "d") is MISSING  # 4 MB to save 3 ms: recomputed
    for i in range(20):
        cache.put(f"k{i}", "d", torch.full((1000,), float(i)), seconds=1.0)
    assert cache._disk <= 40_000 and cache._in_memory <= 16_000
    assert torch.equal(cache.get("k19", lambda: "d"), torch.full((1000,), 19.0))  # the newest stay
    assert cache.get("k0", lambda: "d") is MISSING  # the oldest went
    cache.close()


def test_a_damaged_file_is_replaced(tmp_path):
    path = tmp_path / "refs.sqlite"
    path.write_bytes(b"not a database" * 100)
    cache = RefCache(path, min_seconds=0)
    cache.put("h", "d", 1.5, seconds=1.0)
    assert cache.get("h", lambda: "d") == 1.5
    cache.close()


@pytest.mark.parametrize("op", ["nn.functional.batch_norm", "addmm", "sort", "transpose", "split"])
def test_a_sweep_from_the_cache_records_what_a_computed_one_does(tmp_path, monkeypatch, op):
    """batch_norm changes its inputs (running statistics), addmm has in-place and out= variants,
    sort returns a structure, transpose and split return views of their input (the aliasing
    contract looks at which storage the CPU's result shares): the rows with references from the cache equal the computed ones,
    contracts included, on another build than the one that filled it."""
    monkeypatch.setattr(refcache, "_OPEN", {})
    path = str(tmp_path / "refs.sqlite")
    cache = refcache.open_cache(path)
    cache.min_seconds = 0.0  # every reference stored, so that every item is taken from the cache
    config = SweepConfig(variants=("function", "inplace", "out"), max_samples=4, contract_budget=0)
    group = Group(op, "float32")
    list(run_group(get_target("neuron-emu", build="2.32.0"), group, SweepConfig(**{**_plain(config), "refcache": path})))
    assert cache.stored > 0
    target = get_target("neuron-emu", build="2.33.0")
    computed = list(run_group(target, group, config))
    cache.hits = 0
    cached = list(run_group(target, group, SweepConfig(**{**_plain(config), "refcache": path})))
    assert cache.hits > 0
    for a, b in zip(computed, cached, strict=True):
        for row in (a, b):  # the clocks of the two runs
            row.pop("duration_s")
            ((row.get("proof") or {}).get("locus") or {}).pop("seconds", None)
        assert a == b


def _plain(config: SweepConfig) -> dict:
    return {f: getattr(config, f) for f in SweepConfig.__dataclass_fields__}
