"""Published claims vs measured: ``conformance claims`` holds a vendor's compatibility table
(Markdown: API | Status | Dtypes | Notes) against a build's stored verdicts."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from conformance.catalog import claims as cl
from conformance.cli import main
from conformance.datafiles import DataFileError
from neuron_emu.manifest import BUILDS_DIR

HEAD = "# t\n\n| API | Status | Dtypes | Notes |\n|---|---|---|---|\n"


def _table(tmp_path, rows: str):
    p = tmp_path / "compat.md"
    p.write_text(HEAD + rows)
    return p


@pytest.mark.parametrize(("rows", "said"), [
    ("| aten::mm | Y | float32 |\n", ":5: a row has 3 cells, expected 4"),
    ("| aten::mm | Yes | float32 | |\n", ":5: Status 'Yes': expected one of Y, CPU_FALLBACK, N"),
    ("| mm | Y | float32 | |\n", ":5: API 'mm': expected an ATen name"),
    ("| aten::no_such_op | Y |  | |\n", ":5: API 'aten::no_such_op': no such ATen op"),
    ("| aten::mm.Nope | Y |  | |\n", ":5: API 'aten::mm.Nope': no such ATen overload"),
    ("| aten::mm | Y | float33 | |\n", ":5: Dtypes 'float33'"),
    ("| aten::mm | Y |  | |\n| `aten::mm` | N |  | |\n", ":6: API 'aten::mm' is claimed twice (first on line 5)"),
])
def test_a_malformed_table_is_one_error_naming_its_line(tmp_path, rows, said):
    p = _table(tmp_path, rows)
    with pytest.raises(DataFileError) as e:
        cl.load(p)
    assert f"{p}{said}" in str(e.value)


def test_a_file_without_the_table_says_so(tmp_path):
    p = tmp_path / "x.md"
    p.write_text("| a | b |\n|---|---|\n| 1 | 2 |\n")
    with pytest.raises(DataFileError, match="exactly one table with the columns API | Status | Dtypes | Notes"):
        cl.load(p)


def test_the_shipped_tables_load():
    for name in ("2.31.0", "2.32.0", "2.33.0"):
        assert len(cl.load(BUILDS_DIR / f"{name}.compat.md")) > 50


def _row(op, dtype, status="pass", native=(), fallback=(), error=None, variant="function"):
    return {"item_key": f"{op}|{variant}|{dtype}|0", "op": op, "variant": variant, "dtype": dtype, "status": status,
            "error": error, "native_ops": json.dumps(list(native)), "fallback_ops": json.dumps(list(fallback)),
            "reached_ops": json.dumps([*native, *fallback])}


def test_each_kind_of_disagreement_and_what_is_kept(tmp_path):
    p = _table(tmp_path, "| aten::mm | Y | float32, bfloat16 | |\n"
                         "| aten::sort | Y | float32 | |\n"
                         "| aten::gelu.default | CPU_FALLBACK | float32 | |\n"
                         "| aten::abs | N |  | |\n"
                         "| aten::exp | Y | float32 | |\n"
                         "| aten::tan | Y | float32 | |\n"
                         "| aten::cumsum | Y | float32 | |\n")
    rows = [
        _row("mm", "float32", native=["aten::mm.default"]),
        _row("mm", "bfloat16", "error", native=["aten::mm.default"],
             error="RuntimeError: neuron: internal compiler/runtime error in aten::mm.default"),
        _row("sort", "float32", "pass_fallback", fallback=["aten::sort.default"]),
        _row("gelu", "float32", native=["aten::gelu.default"]),
        _row("abs", "float32", "pass_fallback", fallback=["aten::abs.default"]),
        _row("exp", "float32", "unsupported_dtype", native=["aten::exp.default"],
             error="TypeError: aten::exp.default: float32 is not supported on the device"),
        _row("cumsum", "float32", "mismatch", native=["aten::cumsum.default"]),  # wrong values: not a claim
    ]
    report = cl.check(cl.load(p), cl.measure(rows))
    kinds = {(f.claim.api, f.dtype): f.kind for f in report.findings}
    assert kinds == {("aten::mm", "float32"): "kept", ("aten::mm", "bfloat16"): "fails",
                     ("aten::sort", "float32"): "not_native", ("aten::gelu.default", "float32"): "native_not_claimed",
                     ("aten::abs", "float32"): "works_not_claimed", ("aten::exp", "float32"): "dtype_not_delivered",
                     ("aten::tan", "float32"): "unchecked", ("aten::cumsum", "float32"): "kept"}
    fails = next(f for f in report.findings if f.kind == "fails")
    assert "internal compiler/runtime error" in fails.example and fails.measured.startswith("aten::mm.default:")
    # an error that names no overload it reached is not blamed on any
    assert not cl.measure([_row("mm", "float32", "error", native=["aten::mm.default"], error="boom")])[
        ("aten::mm.default", "float32")].fails


def test_the_shipped_2_33_table_disagrees_exactly_where_it_is_wrong(tmp_path):
    """Against a real run of 2.33.0: each claim the table gets wrong is listed with its kind, and
    the claims it gets right are kept (the planted ones: upsample_nearest2d native in bfloat16,
    which errors there; kthvalue native, which falls back; gelu on the CPU, which is native;
    linalg_inv_ex not supported, which works)."""
    db = str(tmp_path / "c.sqlite")
    r = CliRunner().invoke(main, ["run", "--build", "2.33.0", "--ops", "nn.functional.interpolate.nearest",
                                  "--ops", "kthvalue", "--ops", "nn.functional.gelu", "--ops", "linalg.inv",
                                  "--ops", "nn.functional.relu", "--dtypes", "float32,bfloat16", "--variants",
                                  "function", "--contracts", "none", "--max-samples", "12", "--db", db, "-n", "1",
                                  "--quiet", "--exit-zero"])
    assert r.exit_code == 0, r.output
    out = tmp_path / "claims.json"
    r = CliRunner().invoke(main, ["claims", "--db", db, "--build", "2.33.0", "--json", str(out),
                                  str(BUILDS_DIR / "2.33.0.compat.md")])
    assert r.exit_code == 1, r.output
    found = {(d["api"], d["dtype"], d["kind"]) for d in json.loads(out.read_text())["disagreements"]}
    assert found == {("aten::upsample_nearest2d.default", "bfloat16", "fails"),
                     ("aten::kthvalue", "float32", "not_native"),
                     ("aten::gelu.default", "float32", "native_not_claimed"),
                     ("aten::gelu.default", "bfloat16", "native_not_claimed"),
                     ("aten::linalg_inv_ex", "float32", "works_not_claimed")}, r.output
    assert json.loads(out.read_text())["kept"] > 0
    # the report's page per build shows what the nightly's stage stored (the table its target publishes)
    from conformance.gate.nightly import claims_stage
    from opdb import Store

    said = []
    with Store.open(db) as st:
        claims_stage(st, [r["id"] for r in st.runs()], said.append)
    assert any("claims of 2.33.0 (2.33.0.compat.md): 5 disagree" in line for line in said), said
    site = tmp_path / "site"
    r = CliRunner().invoke(main, ["report", "--db", db, "--out", str(site)])
    assert r.exit_code == 0, r.output
    page = (site / "2.33.0" / "claims.html").read_text()
    assert "2.33.0.compat.md" in page and 'data-kind="native_not_claimed">2<' in page
    assert "aten::linalg_inv_ex" in page and "works_not_claimed" in page
