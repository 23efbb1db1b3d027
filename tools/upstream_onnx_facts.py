"""Write ``conformance/data/upstream_onnxruntime.toml`` from ONNX Script's own OpInfo test data.

ONNX Script keeps the expected failures and skips of the exporter's torch_lib functions in
``tests/function_libs/torch_lib/ops_test_data.py`` (``TESTED_TORCHLIB_OPS``: each
``TorchLibOpInfo(...)`` chained with ``.xfail(...)`` / ``.skip(...)``). The file is not in any
wheel or sdist, and this machine cannot reach GitHub, so it is read from a local copy (one
version, named by ``--commit``). It is parsed, not imported (it imports onnxscript's test
package). Which entries become facts, for the harness's ``--target onnxruntime``:

- only those that apply to upstream's ``TestOutputConsistencyFullGraph``, i.e. the ONNX graph run
  in ONNX Runtime, what the harness's target runs. Entries scoped to the eager (per-op
  evaluator) test class are left out, and so are entries for a CUDA device;
- only those whose ``enabled_if`` holds for the installed versions (torch, ONNX Runtime, Linux,
  no CUDA). ``version_utils.*_older_than`` is evaluated, and ``_flags`` at its default (off);
- ``dtypes=None`` means every dtype upstream tests. The harness sweeps onnxruntime in float32, so
  only float32 facts are written. ``complex=True`` entries test complex dtypes only, and are left out;
- the name: ``op_info_name[.variant_name]``. A name upstream made with ``duplicate_opinfo``
  (``all_dim`` is a copy of ``all``, for one overload) is mapped to the original OpInfo, and
  covers some of its samples (``samples = "some"``), as does an entry with a ``matcher``. A
  matcher (a lambda of ``sample``) is written as its expression (``matchers``), so that a
  standalone check runs the samples it picks; a copy's entry without one, or a matcher that is no
  lambda, leaves the fact without ``matchers`` (the list cannot say which samples: its check
  runs every sample, see ``conformance.triage.upstream.claim``).
  ``prims_*`` copies test ``prims.*`` functions an ATen graph never reaches, so they are left out.
  ``ops.aten.*`` names come from upstream's own extra OpInfos, which are not in PyTorch's
  ``op_db``. They are kept, and a run shows them as not swept;
- several entries for one op are one fact: an xfail if any is, covering all samples if any does,
  with the reasons and matchers joined (a sample any of them picks).

    python tools/upstream_onnx_facts.py ops_test_data.py --commit SHA > conformance/data/upstream_onnxruntime.toml
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from dataclasses import dataclass, field


@dataclass
class Fact:
    op: str
    kinds: set[str] = field(default_factory=set)
    some: bool = True
    reasons: list[str] = field(default_factory=list)
    # the expressions of ``sample`` its entries' matchers are; None once an entry of some samples
    # says no more (a copy's entry without a matcher, a matcher that is no lambda)
    matchers: list[str] | None = field(default_factory=list)


def _older_than(installed: str):  # noqa: ANN202
    def older(version: str) -> bool:
        from packaging.version import Version

        return Version(installed.split("+")[0]) < Version(version)

    return older


def _namespace(torch_version: str, ort_version: str) -> dict:
    import types

    import torch

    version_utils = types.SimpleNamespace(torch_older_than=_older_than(torch_version),
                                          onnxruntime_older_than=_older_than(ort_version))
    flags = types.SimpleNamespace(EXPERIMENTAL_PREFER_TRACING=False, EXPERIMENTAL_INITIALIZERS_AS_INPUTS=False)
    common = types.SimpleNamespace(IS_WINDOWS=False, IS_MACOS=False)
    cuda = types.SimpleNamespace(is_available=lambda: False)
    return {"version_utils": version_utils, "_flags": flags, "ops_test_common": common, "sys": sys,
            "torch": types.SimpleNamespace(cuda=cuda, **{n: getattr(torch, n) for n in dir(torch)
                                                           if isinstance(getattr(torch, n, None), torch.dtype)})}


def _duplicates(tree: ast.Module) -> dict[str, str]:
    """``duplicate_opinfo(OPS_DB, "all", ("all_dim", "all_dims"))``: copy name -> original."""
    out = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "duplicate_opinfo":
            original, copies = ast.literal_eval(node.args[1]), ast.literal_eval(node.args[2])
            out.update({c: original for c in copies})
    return out


def _tested(tree: ast.Module) -> list[ast.expr]:
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == "TESTED_TORCHLIB_OPS":
            return list(node.value.elts)
    raise SystemExit("no TESTED_TORCHLIB_OPS tuple in the file")


def facts(source: str, torch_version: str, ort_version: str,
          dtype: str = "float32") -> tuple[dict[str, Fact], dict[str, int]]:
    """The facts of ``source`` (the test data file's text) with these installed versions deciding
    each entry's ``enabled_if``, and how many entries each rule left out."""
    import torch

    tree, ns = ast.parse(source), _namespace(torch_version, ort_version)
    copies = _duplicates(tree)
    found: dict[str, Fact] = {}
    left = {"eager test class only": 0, "cuda only": 0, "enabled_if false here": 0, "other dtypes": 0,
            "complex functions": 0, "prims copies": 0}
    for elt in _tested(tree):
        chain, node = [], elt
        while isinstance(node, ast.Call) and getattr(node.func, "attr", "") in ("skip", "xfail"):
            chain.append(node)
            node = node.func.value
        name = ast.literal_eval(node.args[0])
        info = {k.arg: k.value for k in node.keywords}
        complex_fn = "complex" in info and ast.literal_eval(info["complex"])
        for call in reversed(chain):
            kw = {k.arg: k.value for k in call.keywords}
            variant = ast.literal_eval(call.args[0]) if call.args else ast.literal_eval(kw.get("variant_name", ast.Constant("")))
            test_class = ast.literal_eval(kw["test_class_name"]) if "test_class_name" in kw else None
            device = ast.literal_eval(kw["device_type"]) if "device_type" in kw else None
            dtypes = eval(compile(ast.Expression(kw["dtypes"]), "dtypes", "eval"), ns) if "dtypes" in kw else None  # noqa: S307
            if test_class not in (None, "TestOutputConsistencyFullGraph"):
                left["eager test class only"] += 1
            elif device not in (None, "cpu"):
                left["cuda only"] += 1
            elif "enabled_if" in kw and not eval(compile(ast.Expression(kw["enabled_if"]), "enabled_if", "eval"), ns):  # noqa: S307
                left["enabled_if false here"] += 1
            elif complex_fn:
                left["complex functions"] += 1
            elif dtypes is not None and getattr(torch, dtype) not in dtypes:
                left["other dtypes"] += 1
            elif name.startswith("prims_"):
                left["prims copies"] += 1
            else:
                base = copies.get(name, name)
                op = f"{base}.{variant}" if variant else base
                fact = found.setdefault(op, Fact(op))
                fact.kinds.add(call.func.attr)
                fact.some = fact.some and ("matcher" in kw or base != name)
                if "matcher" in kw or base != name:
                    picks = _matcher(kw.get("matcher"))
                    if picks is None or fact.matchers is None:
                        fact.matchers = None
                    elif picks not in fact.matchers:
                        fact.matchers.append(picks)
                why = ast.literal_eval(kw["reason"])
                fact.reasons.append(why if base == name else f"[upstream {name}] {why}")
    return found, left


def _matcher(node: ast.expr | None) -> str | None:
    """A ``matcher=lambda sample: EXPR`` as ``EXPR`` (a lambda naming its argument otherwise is
    called on ``sample``); None for no matcher or one that is not a lambda."""
    if not isinstance(node, ast.Lambda) or len(node.args.args) != 1:
        return None
    if node.args.args[0].arg == "sample":
        return ast.unparse(node.body)
    return f"({ast.unparse(node)})(sample)"


def _toml(value: str) -> str:
    return json.dumps(value, ensure_ascii=False)  # a JSON string is a TOML basic string


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("file", help="a local copy of tests/function_libs/torch_lib/ops_test_data.py")
    parser.add_argument("--commit", required=True, help="the onnxscript commit the copy is of (40 hex)")
    parser.add_argument("--repo", default="microsoft/onnxscript")
    a = parser.parse_args()
    import onnxruntime
    import torch

    with open(a.file, encoding="utf-8") as f:
        found, left = facts(f.read(), torch.__version__, onnxruntime.__version__)
    kept = ", ".join(f"{n} {why}" for why, n in left.items() if n)
    print(f"""# ONNX Script's own expectations for the ONNX exporter's torch_lib functions run in ONNX Runtime
# (tests/function_libs/torch_lib/ops_test_data.py, TESTED_TORCHLIB_OPS .xfail/.skip), float32, as
# facts (op, dtype, expectation, samples, and for a fact of some samples the matchers that pick
# them, as expressions of `sample`). Written by tools/upstream_onnx_facts.py (its
# docstring says which entries become facts) with torch {torch.__version__} and onnxruntime
# {onnxruntime.__version__} deciding each entry's enabled_if. Entries left out: {kept}.
# Loaded and validated by conformance.triage.upstream.expectations(); what a standalone check
# (tools/upstream_onnx_check.py) showed about each is in upstream_triage.toml.
#
# How upstream's test differs from the harness's --target onnxruntime: it calls each torch_lib
# function itself (after an input "wrangler"), where the harness exports the OpInfo's op with
# torch.export + torch.onnx.export, so the exporter picks the function; an entry about a function's
# signature ("this overload requires dim to be a tuple") is no failure of the export path. It
# compares at PyTorch's default tolerances (or the op's own), checks random ops' shapes only, and
# runs no gradients.

[source.onnxscript]
repo = "{a.repo}"
commit = "{a.commit}"
path = "tests/function_libs/torch_lib/ops_test_data.py"
targets = ["onnxruntime"]
variants = ["function"]  # the op's function, forward only (ONNX Runtime runs no gradients)
note = "a mid-2024 version (its enabled_if checks reach torch 2.4 and onnxruntime 1.19)"
""")
    for op in sorted(found):
        fact = found[op]
        kind = "xfail" if "xfail" in fact.kinds else "skip"
        reason = " | ".join(dict.fromkeys(fact.reasons))
        print(f"[[{kind}]]\nsource = \"onnxscript\"\ndevice = \"cpu\"\nops = [{_toml(op)}]\ndtypes = [\"float32\"]")
        if fact.some:
            print('samples = "some"')
            if fact.matchers:
                print(f"matchers = [{', '.join(_toml(m) for m in fact.matchers)}]")
        print(f"reason = {_toml(reason)}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
