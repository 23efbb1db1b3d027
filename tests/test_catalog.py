"""The ATen catalog, checked against the live dispatcher registry."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from conformance.catalog import overloads as catalog
from conformance.cli import main


@pytest.fixture(scope="module")
def ops() -> dict[str, catalog.Overload]:
    return {o.name: o for o in catalog.overloads()}


def test_every_aten_overload_is_listed(ops):
    assert len(ops) >= 3000
    assert all(name.startswith("aten::") and "." in name.split("::")[1] for name in ops)


@pytest.mark.parametrize("name, expected, absent", [
    ("aten::add_.Tensor", {"inplace"}, {"out", "functional"}),
    ("aten::add.out", {"out"}, {"inplace", "functional"}),
    ("aten::add.Tensor", {"functional", "core"}, {"composite_implicit"}),
    ("aten::randn.default", {"random", "functional"}, set()),
    ("aten::view.default", {"view"}, {"functional"}),
    ("aten::view_copy.default", {"view_copy"}, {"view"}),
    ("aten::linear.default", {"composite_implicit"}, {"no_cpu_kernel"}),
    ("aten::convolution_backward.default", {"backward"}, set()),
    ("aten::_softmax.default", {"private", "core"}, set()),
    ("aten::_sparse_coo_tensor_unsafe.default", {"sparse"}, set()),
])
def test_classes_come_from_the_registry(ops, name, expected, absent):
    classes = set(ops[name].classes)
    assert expected <= classes, classes
    assert not (absent & classes), classes


def test_every_overload_has_exactly_one_kind(ops):
    for o in ops.values():
        assert len(set(o.classes) & set(catalog.KINDS)) == 1, o


def test_schema_and_tags_are_recorded(ops):
    add = ops["aten::add.Tensor"]
    assert add.schema.startswith("aten::add.Tensor(Tensor self, Tensor other")
    assert "pointwise" in add.tags


def test_opinfo_map_reaches_overloads():
    ops, summary = catalog.build()
    by_name = {o.name: o for o in ops}
    assert "add" in by_name["aten::add.Tensor"].opinfos
    assert "add" in by_name["aten::add_.Tensor"].opinfos  # the in-place variant
    assert "add" in by_name["aten::add.out"].opinfos  # the out= variant
    assert summary.reached_by_opinfo > 600
    assert summary.total == len(ops)


def test_cli_json_lists_every_overload():
    result = CliRunner().invoke(main, ["ops", "--json"])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.output.splitlines()]
    assert len(rows) >= 3000
    add = next(r for r in rows if r["name"] == "aten::add_.Tensor")
    assert "inplace" in add["classes"] and add["schema"] and "add" in add["opinfos"]


def test_cli_store_writes_catalog(tmp_path):
    db = tmp_path / "o.sqlite"
    result = CliRunner().invoke(main, ["ops", "--store", "--db", str(db)])
    assert result.exit_code == 0, result.output
    from opdb import Store

    with Store.open(db) as st:
        assert st.count("ops") >= 3000
