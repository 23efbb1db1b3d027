"""conformance audit --generate: a user's causal LM greedy-decoded on the target against the CPU per
dtype x mode x bucket, by the generation lane's own measurement. Needs the `hf` extra."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("transformers", reason="the hf extra (transformers) is not installed")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from test_audit import _restore_emulator, audit  # noqa: E402,F401  (the fixture restores the build)

FAST = ("--generate", "--buckets", "8,32", "--new-tokens", "4")

# a wrong silu (scaled by 1.5) in llama's MLP moves every decode step's logits far beyond the
# near-tie bound: the target's tokens flip at a wide margin
DEFECT = """
[build]
name = "gen-defect"
inherits = "ideal"
[[defects]]
op = "aten::silu.default"
kind = "wrong_result"
magnitude = 0.5
"""


def test_ideal_build_generates_the_same(tmp_path):
    # bucket 64 does not fit the model's 64 positions with the new tokens: a skip saying so, no failure
    r, data = audit("audit_gen_models:tiny_llama", "--build", "ideal", "--generate", "--buckets", "8,32,64",
                    "--new-tokens", "4", "--gen-modes", "eager", "--html", str(tmp_path / "html"), tmp_path=tmp_path)
    assert r.exit_code == 0, r.output
    gen = data["generation"]
    assert [(g["mode"], g["bucket"], g["status"]) for g in gen["rows"]] == [
        ("eager", 8, "pass"), ("eager", 32, "pass"), ("eager", 64, "skip")]
    assert gen["rows"][2]["error"].startswith("the model has 64 positions; bucket 64 needs 80")
    assert any(w.startswith("generation skipped at float32 eager 64") for w in data["warnings"])
    for g in gen["rows"][:2]:
        assert g["agreement"] == 1.0 and g["wide_flips"] == 0 and g["near_tie_flips"] == 0
        assert all(s["kind"] == "agree" for s in g["sequences"]) and len(g["sequences"]) == gen["settings"]["prompts"]
        assert g["loglik_shift"] <= g["loglik_tol"] and g["decode_p50_ms"] > 0 and g["cpu_decode_p50_ms"] > 0
        assert g["fallback_ops"] == []
    assert gen["settings"]["new_tokens"] == 4 and gen["settings"]["vocab"] > 0
    assert data["inputs"] == "[1,8] int64"  # the smallest bucket's prompt: the forward audit's example
    assert "generates the same as the CPU in 2 of 3 buckets" in gen["summary"] and "skip at float32 eager 64" in gen["summary"]
    assert f"  {gen['summary']}" in r.output.splitlines()
    assert "generation (greedy" in r.output
    page = (tmp_path / "html" / "index.html").read_text()
    assert 'id="generation"' in page and gen["summary"] in page


def test_defect_is_a_wide_flip_localised(tmp_path):
    manifest = tmp_path / "defect.toml"
    manifest.write_text(DEFECT)
    r, data = audit("audit_gen_models:tiny_llama", "--build", str(manifest), *FAST, tmp_path=tmp_path)
    assert r.exit_code == 1, r.output
    rows = data["generation"]["rows"]
    assert [(g["mode"], g["bucket"]) for g in rows] == [("eager", 8), ("eager", 32), ("compile", 8), ("compile", 32)]
    eager = [g for g in rows if g["mode"] == "eager"]
    for g in eager:
        assert g["status"] == "mismatch", g
        assert g["wide_flips"] > 0 or g["loglik_shift"] > g["loglik_tol"]
        assert g["first_divergent_op"] == "aten::silu.default", g.get("first_divergent_detail")
    wide = next(g for g in eager if g["wide_flips"])
    flip = wide["flip"]
    assert flip["kind"] == "wide" and flip["margin"] > flip["bound"] and flip["cpu_token"] != flip["target_token"]
    assert wide["first_divergence"] == min(s["position"] for s in wide["sequences"] if "position" in s)
    compiled = [g for g in rows if g["mode"] == "compile"]
    assert all(g["recompiles"] is not None for g in compiled)
    assert "generates the same as the CPU in" in data["generation"]["summary"]
    assert "mismatch at float32 eager 8, float32 eager 32" in data["generation"]["summary"]
    blocker = next(b for b in data["blockers"] if b.startswith("generation differs from the CPU"))
    assert "first divergent op aten::silu.default" in blocker
    assert "sequences flip wide; the first (prompt" in r.output and "first divergent op: aten::silu.default" in r.output


def test_a_model_that_is_no_lm_is_bad_input():
    r, _ = audit("audit_gen_models:not_an_lm", "--generate")
    assert r.exit_code == 2, r.output
    assert "--generate needs a causal language model" in r.output and "lacks a generate method" in r.output


def test_generation_options_need_generate():
    r, _ = audit("audit_gen_models:tiny_llama", "--buckets", "8")
    assert r.exit_code == 2 and "--buckets only apply with --generate" in r.output
    r, _ = audit("audit_gen_models:tiny_llama", "--generate", "--dtypes", "float16")
    assert r.exit_code == 2 and "--dtypes 'float16'" in r.output
