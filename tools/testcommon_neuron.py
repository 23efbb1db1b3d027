"""PyTorch's ``TestCommon`` device tests, run on the emulated ``neuron`` device, per build.

PyTorch's own ``test/test_ops.py`` is not installed with the torch wheel, so this module carries
its own copies of six ``TestCommon`` tests, written to check what upstream's check, and runs them
through PyTorch's device-test machinery (``instantiate_device_type_tests`` on
``PrivateUse1TestBase``, ``op_db`` OpInfos, ``TestCase.assertEqual``).  The class is named
``TestCommon`` so the OpInfos' own ``DecorateInfo`` skips, xfails and tolerance overrides for
``TestCommon`` apply here exactly as upstream (those keyed on device type ``cpu``/``cuda`` do not
apply to ``neuron``, as upstream):

* ``test_compare_cpu``     every ``reference_inputs`` sample on the device vs the CPU, after
                           ``output_process_fn_grad``; atol=rtol=1e-3 for floating dtypes, exact
                           for the others.
* ``test_out``             per sample: the op's ``supports_out=False`` claim (``out=`` must raise);
                           case 0 an ``out`` of the right shape full of NaN / the integer maximum
                           equals the function; case 1 a non-contiguous ``out`` equals it and keeps
                           its strides and data pointers; case 2 an empty ``out`` is resized without
                           the resize warning; case 3 an ``out`` on the CPU raises ``RuntimeError``
                           (factory functions called without ``device=`` excepted); case 4 a
                           ``torch.long`` ``out`` for a floating result raises (``TypeError`` for the
                           ``cat`` family, as upstream; factory functions without ``dtype=`` excepted).
* ``test_out_warning``     per sample: an ``out`` one element too long in the last dimension (``[2]``
                           for a 0-d result) gets the right values, and, when non-empty, the warning
                           "An output with one or more elements was resized".  Added to upstream's
                           test: an ``out`` of the right shape must *not* give that warning.
* ``test_noncontiguous_samples``  each sample vs its ``noncontiguous()`` twin, forward exactly, then,
                           for dtypes the OpInfo lists as differentiable, the gradients w.r.t. every
                           input requiring grad, with a ``noncontiguous_like`` grad for the twin.
* ``test_variant_consistency_eager``  method, in-place, ``operator`` and in-place ``operator``
                           variants and every alias's function/method/in-place variant vs the
                           function, forward and the gradient of ``sample.input``; an in-place
                           variant on a sample that ``broadcasts_input`` must raise; in-place
                           variants must return ``self`` (same data pointer).
* ``test_dtypes``          upstream's dtype probe (forward, then backward where an input requires
                           grad) compared with the dtypes the OpInfo claims for the device type;
                           claimed-but-failing and working-but-unclaimed are both failures.

Dtypes (``--dtype-policy upstream``, the default) are upstream's, intersected with ``--dtypes``:
``test_compare_cpu`` one dtype per op, the first of ``ANY_DTYPE_ORDER`` the OpInfo lists (upstream's
``any_common_cpu_cuda_one`` with the device in CUDA's place); ``test_out`` ``OpDTypes.any_one``;
``test_out_warning`` float32, else the first listed dtype; ``test_noncontiguous_samples`` every listed
dtype of float32/long/complex64; ``test_variant_consistency_eager`` float32/cfloat;
``test_dtypes`` probes only the ``--dtypes`` (upstream probes all twelve; this keeps the run short)
and compares with the claims among them.  ``--dtype-policy all`` runs every test over every listed
dtype in ``--dtypes`` instead (more op x dtype pairs, no longer upstream's selection).

Where this differs from upstream, and why:

* Upstream runs ``test_compare_cpu`` only on CUDA/XPU (``onlyOn``) and only for OpInfos without a
  NumPy ``ref`` (those are compared with NumPy by ``test_numpy_ref`` instead).  Here it runs on the
  device for all of ``op_db``: ``test_numpy_ref`` is not run, so nothing else would compare those ops.
* Upstream compares ``out`` data pointers only on cpu/cuda, because "some device types don't have
  storage".  ``neuron`` tensors have storage, so the pointers are compared on it too.
* Upstream's ``test_out``/``test_out_warning``/``test_dtypes`` also take ``python_ref_db``; here only
  ``op_db`` (the refs are Python decompositions, not the device's kernels).
* Upstream skip rules kept: ``skipMeta`` (no meta device here), ``skipXPU``/``with_tf32_off`` (no XPU,
  no CUDA), ``onlyNativeDeviceTypes`` (the PrivateUse1 backend is native), the "only single tensor or
  iterable of tensor outputs" skips of ``test_out``/``test_out_warning``, and the OpInfos' own
  ``DecorateInfo`` entries as said above.

Usage (the backend is registered before ``common_device_type`` is imported, as it must be)::

    PYTHONPATH=. python tools/testcommon_neuron.py --build 2.33.0 --dtypes float32,bfloat16,int64 \\
        --cpu-too --shard 0/16 --json /tmp/tc.json --raw /tmp/tc.raw --timeout 1800 -- -n 1

Prints one line per test kind and device: passed/failed/skipped/xfailed, then the failures grouped
by first error line.  ``--cpu-too`` runs the same tests on the CPU device as well (kinds and causes
marked ``[CPU]``): a test that fails there too is no finding about the device.  On the CPU device
``test_compare_cpu`` compares the CPU with itself, so ``--cpu-too`` cannot clear a compare failure;
a re-check with a control each (stop 21) examined the failures on ``ideal``
that are not device bugs.  ``--shard K/N`` takes the OpInfos whose op_db index is K mod N.
``--json PATH`` writes the counts and one record per failed item, ``{"test", "op" (OpInfo name and
variant joined with '.'), "dtype", "device" ("neuron"|"cpu"), "cause" (first error line)}``;
``--merge OUT IN...`` merges such files (shards) into one and adds ``device_only``: the op x dtype
pairs failing a test on neuron that the same op and dtype pass on the CPU device (neither fail nor
xfail; a ``test_dtypes`` failure stands for the dtypes its message names).  The JSON also lists the
xfailed and passed items (``"xfailed"``, ``"passed"``).  ``dtype`` is the test's dtype; for ``test_out_warning`` the one the
test picks (float32, else the first listed); ``null`` for ``test_dtypes`` (its cause names the dtypes).
``--timeout S`` stops pytest after S seconds; what finished is still counted (its causes then read
"cause not captured").  ``--from-raw PATH`` recounts a kept ``--raw`` output without running pytest.
Exit code: 0 when nothing failed, 1 otherwise, 2 on bad arguments or no test result.
"""

from __future__ import annotations

import os
import sys

_KINDS = ("test_compare_cpu", "test_out_warning", "test_out", "test_noncontiguous_samples",
          "test_variant_consistency_eager", "test_dtypes")  # test_out_warning before its prefix test_out
_DEVICES = {"PRIVATEUSE1": "neuron", "CPU": "cpu"}
_OUTCOMES = {"PASSED": "passed", "FAILED": "failed", "ERROR": "failed", "SKIPPED": "skipped",
             "XFAIL": "xfailed", "XPASS": "xpassed"}


def _parse_id(test_id: str) -> tuple[str, str, str | None]:
    """``test_out_nn_functional_gelu_neuron_float32`` -> (kind, formatted op name, dtype or None)."""
    import re
    for kind in _KINDS:
        if test_id.startswith(kind + "_"):
            m = re.fullmatch(r"(.+)_(?:neuron|cpu)(?:_([a-z]+\d*))?", test_id[len(kind) + 1:])
            if m:
                return kind, m.group(1), m.group(2)
    raise ValueError(f"testcommon_neuron: cannot parse test id {test_id!r}")


def _op_names() -> tuple[dict[str, str], dict[tuple[str, str], str]]:
    """OpInfo formatted name (the one in test ids, '.' mangled to '_') -> 'name.variant', and
    (formatted name, device) -> the dtype ``test_out_warning`` picks inside the test (as the test does)."""
    import importlib
    importlib.import_module("neuron_emu")  # registered first, as in the test module
    import torch
    from torch.testing._internal.common_methods_invocations import op_db
    names: dict[str, str] = {}
    warning_dtype: dict[tuple[str, str], str] = {}
    for op in op_db:
        full = op.name + ("." + op.variant_test_name if op.variant_test_name else "")
        if names.setdefault(op.formatted_name, full) != full:  # instantiate_device_type_tests forbids it too
            raise RuntimeError(f"two OpInfos share the test name {op.formatted_name!r}")
        for device in ("neuron", "cpu"):
            supported = op.supported_dtypes(device)
            if supported:
                dt = torch.float32 if torch.float32 in supported else next(iter(supported))
                warning_dtype[(op.formatted_name, device)] = str(dt).removeprefix("torch.")
    return names, warning_dtype


def _parse_output(out: str):
    """pytest ``-rA -v`` output -> ({(kind, device): Counter}, [failure dicts], [xfailed item dicts],
    [passed item dicts]).

    Outcomes come from the ``-v`` progress lines (the ``-rA`` summary folds skips into one line per
    reason, without test ids); causes from the ``-rA`` summary, one line per failed item with its
    first error line.  A run stopped by ``--timeout`` has no summary: its causes read "cause not
    captured"."""
    import collections
    import re
    counts: dict[tuple[str, str], collections.Counter] = collections.defaultdict(collections.Counter)
    failures: list[dict] = []
    xfailed: list[dict] = []
    passed: list[dict] = []
    words = "PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS"
    summary = re.compile(rf"({words}) \S*::TestCommon(PRIVATEUSE1|CPU)::(\w+)(?: - (.*))?$")
    progress_xdist = re.compile(rf"\[gw\d+\] \[ *\d+%\] ({words}) \S*::TestCommon(PRIVATEUSE1|CPU)::(\w+)\s*$")
    progress_plain = re.compile(rf"\S*::TestCommon(PRIVATEUSE1|CPU)::(\w+) ({words})")
    causes: dict[tuple[str, str], str] = {}
    outcomes: dict[tuple[str, str], str] = {}
    have_summary = False
    for ln in out.splitlines():
        m = summary.match(ln)
        if m:
            have_summary = True
            if m.group(4):
                causes.setdefault((m.group(2), m.group(3)), m.group(4))
            continue
        m = progress_xdist.match(ln)
        fields = m and (m.group(1), m.group(2), m.group(3))
        if not m:
            m = progress_plain.match(ln)
            fields = m and (m.group(3), m.group(1), m.group(2))
        if not fields or not fields[2].startswith(_KINDS):
            continue
        outcome = _OUTCOMES[fields[0]]
        key = (fields[1], fields[2])
        if key not in outcomes or outcome == "failed":  # an ERROR in teardown after PASSED: failed, once
            outcomes[key] = outcome
    for (cls, test_id), outcome in outcomes.items():
        device = _DEVICES[cls]
        kind, op, dtype = _parse_id(test_id)
        counts[(kind, device)][outcome] += 1
        if outcome in ("failed", "xpassed"):
            cause = causes.get((cls, test_id)) or ("unexpected success" if outcome == "xpassed" else
                                                   "?" if have_summary else "cause not captured (run stopped)")
            failures.append({"test": kind, "id": test_id, "op": op, "dtype": dtype, "device": device,
                             "cause": cause})
        elif outcome == "xfailed":
            xfailed.append({"test": kind, "id": test_id, "op": op, "dtype": dtype, "device": device})
        elif outcome == "passed":
            passed.append({"test": kind, "id": test_id, "op": op, "dtype": dtype, "device": device})
    return counts, failures, xfailed, passed


def _print_summary(header: str, counts: dict, failures: list[dict]) -> None:
    import collections
    import re
    print(header)
    for (kind, device), c in sorted(counts.items()):
        label = kind + ("" if device == "neuron" else " [CPU]")
        print(f"{label:40s} passed {c['passed']:5d}  failed {c['failed'] + c['xpassed']:5d}  "
              f"skipped {c['skipped']:5d}  xfailed {c['xfailed']:4d}")
    causes: collections.Counter = collections.Counter()
    ids: dict[str, list[str]] = collections.defaultdict(list)
    for f in failures:
        cause = ("[CPU] " if f["device"] == "cpu" else "") + re.sub(r"0x[0-9a-f]+|\d+(\.\d+)?", "#", f["cause"])[:150]
        causes[cause] += 1
        ids[cause].append(f["id"])
    for cause, n in causes.most_common(40):
        print(f"  {n:4d}  {cause}")
        print(f"        {', '.join(ids[cause][:6])}{' ...' if n > 6 else ''}")


def _device_only(failures: list[dict], xfailed: list[dict]) -> list[dict]:
    """The op x dtype pairs that fail a test on neuron which the same op and dtype neither fail nor
    xfail (an OpInfo's expected failure for the CPU) on the CPU device, with the tests.  A
    ``test_dtypes`` failure stands for the dtypes its message names."""
    import re

    def pairs(f):
        if f["test"] != "test_dtypes":
            return [(f["op"], f["dtype"])]
        return [(f["op"], d) for d in sorted(set(re.findall(r"torch\.(\w+)", f["cause"])))] or [(f["op"], None)]

    on_cpu = {(f["test"], p) for f in failures if f["device"] == "cpu" for p in pairs(f)}
    on_cpu |= {(f["test"], (f["op"], f["dtype"])) for f in xfailed if f["device"] == "cpu"}
    found: dict[tuple, set] = {}
    for f in failures:
        if f["device"] == "neuron":
            for p in pairs(f):
                if (f["test"], p) not in on_cpu:
                    found.setdefault(p, set()).add(f["test"])
    return [{"op": op, "dtype": dt, "tests": sorted(t)} for (op, dt), t in sorted(found.items(), key=str)]


def _main() -> int:
    import argparse
    import json
    import re
    import signal
    import subprocess
    import time
    from pathlib import Path

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="ideal", help="emulator build: a shipped name or a manifest path")
    ap.add_argument("--dtypes", default="float32,bfloat16,int64")
    ap.add_argument("--dtype-policy", choices=("upstream", "all"), default="upstream",
                    help="upstream: each test's own dtype selection within --dtypes; all: every listed one")
    ap.add_argument("--ops", default="", help="comma-separated OpInfo names (default: all of op_db)")
    ap.add_argument("--shard", default="", metavar="K/N",
                    help="only the OpInfos whose op_db index is K modulo N (a deterministic part)")
    ap.add_argument("--cpu-too", action="store_true",
                    help="run the same tests on the CPU device as well (what fails there too is no device bug)")
    ap.add_argument("--raw", default="", metavar="PATH", help="also write pytest's whole output there")
    ap.add_argument("--json", default="", metavar="PATH", help="write counts and failed items as JSON there")
    ap.add_argument("--timeout", type=float, default=0, metavar="S", help="stop pytest after S seconds")
    ap.add_argument("--merge", nargs="+", metavar="PATH",
                    help="merge --json files: OUT IN... (no tests are run)")
    ap.add_argument("--from-raw", default="", metavar="PATH",
                    help="count a kept --raw output instead of running pytest (wall_s is then null)")
    ap.add_argument("pytest_args", nargs="*", help="after --: passed to pytest (e.g. -n 1)")
    a = ap.parse_args()

    if a.merge:
        if len(a.merge) < 2:
            print("testcommon_neuron: --merge: expected OUT IN...", file=sys.stderr)
            return 2
        merged: dict = {"inputs": [], "counts": {}, "failures": [], "xfailed": [], "passed": [], "timed_out": False,
                        "wall_s": 0.0}
        for p in a.merge[1:]:
            try:
                d = json.loads(Path(p).read_text())
                d["counts"], d["failures"]
            except (OSError, ValueError, KeyError, TypeError) as e:
                print(f"testcommon_neuron: --merge: {p}: not a --json output ({e})", file=sys.stderr)
                return 2
            merged["inputs"].append({k: d.get(k) for k in ("build", "dtypes", "dtype_policy", "shard", "ops")}
                                    | {"path": p})
            for kind, per_dev in d["counts"].items():
                for dev, c in per_dev.items():
                    tgt = merged["counts"].setdefault(kind, {}).setdefault(dev, {})
                    for k, v in c.items():
                        tgt[k] = tgt.get(k, 0) + v
            merged["failures"] += d["failures"]
            merged["xfailed"] += d.get("xfailed", [])
            merged["passed"] += d.get("passed", [])
            merged["timed_out"] |= bool(d.get("timed_out"))
            merged["wall_s"] += d.get("wall_s") or 0.0
        merged["device_only"] = _device_only(merged["failures"], merged["xfailed"])
        Path(a.merge[0]).write_text(json.dumps(merged, indent=1) + "\n")
        print(f"{len(merged['failures'])} failed items; {len(merged['device_only'])} op x dtype pairs fail a test "
              "on neuron that the CPU device passes (needs --cpu-too runs)")
        return 0

    m = re.fullmatch(r"(\d+)/([1-9]\d*)", a.shard)
    if a.shard and not (m and int(m.group(1)) < int(m.group(2))):
        print(f"testcommon_neuron: --shard: expected K/N with 0 <= K < N, got {a.shard!r}", file=sys.stderr)
        return 2
    if a.timeout < 0:
        print(f"testcommon_neuron: --timeout: expected seconds >= 0, got {a.timeout}", file=sys.stderr)
        return 2
    env = dict(os.environ, NEURON_EMU_BUILD=a.build, TESTCOMMON_DTYPES=a.dtypes, TESTCOMMON_OPS=a.ops,
               TESTCOMMON_SHARD=a.shard, TESTCOMMON_POLICY=a.dtype_policy,
               TESTCOMMON_DEVICES="privateuse1,cpu" if a.cpu_too else "privateuse1",
               COLUMNS="1000")  # pytest cuts summary lines to the terminal width
    repo = Path(__file__).resolve().parents[1]
    env["PYTHONPATH"] = str(repo) + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, "-m", "pytest", __file__, "-p", "no:randomly", "-p", "no:cacheprovider",
           "-m", "", "-rA", "-v", "--tb=no", "-W", "ignore", *a.pytest_args]
    raw = Path(a.raw) if a.raw else Path(os.devnull)
    t0 = time.monotonic()
    timed_out = False
    if a.from_raw:
        try:
            out = Path(a.from_raw).read_text()
        except OSError as e:
            print(f"testcommon_neuron: --from-raw: cannot read {a.from_raw}: {e}", file=sys.stderr)
            return 2
        return _report(a, out, None, timed_out=False)
    # pytest writes straight into the raw file, so a stopped run still leaves what it got done.
    with open(a.raw or os.devnull, "w") as sink, subprocess.Popen(
            cmd, env=env, cwd=repo, stdout=subprocess.PIPE if not a.raw else sink, stderr=subprocess.STDOUT,
            text=True, start_new_session=True) as proc:
        try:
            piped, _ = proc.communicate(timeout=a.timeout or None)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(proc.pid, signal.SIGKILL)  # pytest and its xdist workers: the session we started
            piped, _ = proc.communicate()
    wall = time.monotonic() - t0
    out = raw.read_text() if a.raw else (piped or "")
    return _report(a, out, wall, timed_out=timed_out)


def _report(a, out: str, wall: float | None, *, timed_out: bool) -> int:
    import json
    from pathlib import Path
    counts, failures, xfailed, passed = _parse_output(out)
    if not counts:
        print(out[-4000:])
        return 2
    if a.json:
        names, warning_dtype = _op_names()
        for f in failures + xfailed + passed:
            if f["op"] not in names:
                raise RuntimeError(f"test id {f['id']!r}: no OpInfo is named {f['op']!r}")
            if f["test"] == "test_out_warning":  # the test picks its dtype itself; test_dtypes probes several
                f["dtype"] = warning_dtype.get((f["op"], f["device"]))
            f["op"] = names[f["op"]]
        by_kind: dict[str, dict[str, dict[str, int]]] = {}
        for (kind, device), c in counts.items():
            by_kind.setdefault(kind, {})[device] = {k: c[k] for k in ("passed", "failed", "skipped",
                                                                      "xfailed", "xpassed")}
        Path(a.json).write_text(json.dumps(
            {"build": a.build, "dtypes": a.dtypes, "dtype_policy": a.dtype_policy, "ops": a.ops or "all of op_db",
             "shard": a.shard or "0/1", "cpu_too": a.cpu_too, "timed_out": timed_out,
             "wall_s": None if wall is None else round(wall, 1),
             "counts": by_kind, "failures": failures, "xfailed": xfailed, "passed": passed}, indent=1) + "\n")
    _print_summary(f"build {a.build}  dtypes {a.dtypes} ({a.dtype_policy})  ops {a.ops or 'all of op_db'}"
                   + (f"  shard {a.shard} (op_db index mod N)" if a.shard else "")
                   + ("" if wall is None else f"  wall {wall:.0f}s") + ("  STOPPED BY --timeout" if timed_out else ""),
                   counts, failures)
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(_main())

# ---------------------------------------------------------------- the test module (under pytest)
import copy  # noqa: E402, I001  (the import order below matters)
import warnings  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from functools import partial  # noqa: E402

import torch  # noqa: E402

import neuron_emu  # noqa: E402,F401  (registers 'neuron' before common_device_type is imported)
from torch.testing import make_tensor  # noqa: E402
from torch.testing._internal.common_device_type import (  # noqa: E402
    ANY_DTYPE_ORDER,
    OpDTypes,
    instantiate_device_type_tests,
    ops,
)
from torch.testing._internal.common_dtype import (  # noqa: E402
    _dispatch_dtypes,
    floating_and_complex_types_and,
)
from torch.testing._internal.common_methods_invocations import op_db  # noqa: E402
from torch.testing._internal.common_utils import (  # noqa: E402
    TestCase,
    clone_input_helper,
    is_iterable_of_tensors,
    noncontiguous_like,
    suppress_warnings,
)

_DT = {n: getattr(torch, n) for n in os.environ.get("TESTCOMMON_DTYPES", "float32,bfloat16,int64").split(",")}
_SEL = tuple(_DT.values())
_ALL = os.environ.get("TESTCOMMON_POLICY", "upstream") == "all"
_WANT = {s for s in os.environ.get("TESTCOMMON_OPS", "").split(",") if s}
_K, _, _N = (os.environ.get("TESTCOMMON_SHARD") or "0/1").partition("/")
_OPS = [op for i, op in enumerate(op_db) if i % int(_N) == int(_K) and (
        not _WANT or op.name in _WANT or
        (op.name + ("." + op.variant_test_name if op.variant_test_name else "")) in _WANT)]
_RESIZE_WARNING = "An output with one or more elements"


def _upstream(allowed):
    """The selected dtypes among upstream's ``allowed_dtypes`` for a test (all selected under policy all)."""
    return _SEL if _ALL else tuple(d for d in _SEL if d in allowed)


def _compare_cpu_ops(op_list):
    """Upstream's ``any_common_cpu_cuda_one`` (the first of ANY_DTYPE_ORDER that both the CPU and
    CUDA list), with the device in CUDA's place: the OpInfos are copied with ``dtypesIfCUDA`` set to
    the one dtype the CPU and the device both list, so ``ops`` picks it; nothing else reads it here."""
    out = []
    for op in op_list:
        common = set(op.dtypes) & set(op.supported_dtypes(torch._C._get_privateuse1_backend_name()))
        first = next((d for d in ANY_DTYPE_ORDER if d in common), None)
        if first is None:  # no test for it: and torch's `ops` would fail on the empty choice ({}.intersection)
            continue
        c = copy.copy(op)
        c.dtypesIf = dict(op.dtypesIf)  # the copy's own: setting dtypesIfCUDA writes dtypesIf["cuda"]
        c.dtypesIfCUDA = _dispatch_dtypes((first,) if first is not None else ())
        out.append(c)
    return out


def _any_one_exists(op):
    """Whether ``OpDTypes.any_one`` finds a dtype for the op on the device (torch's ``ops`` fails,
    ``{}.intersection``, on an op for which it finds none; such an op gets no test anyway)."""
    device = torch._C._get_privateuse1_backend_name()
    return any(d in set(op.supported_dtypes(device)) | set(op.supported_dtypes("cpu")) for d in ANY_DTYPE_ORDER)


def _to_cpu(arg):
    return arg.to(device="cpu") if isinstance(arg, torch.Tensor) else arg


def _apply_out_transform(fn, out):
    return fn(out) if isinstance(out, torch.Tensor) else tuple(map(fn, out))


def _strides(out):
    return (out.stride(),) if isinstance(out, torch.Tensor) else tuple(t.stride() for t in out)


def _data_ptrs(out):
    # Upstream compares pointers on cpu/cuda only ("some device types don't have storage");
    # neuron tensors have storage, so they are compared here too.
    return (out.data_ptr(),) if isinstance(out, torch.Tensor) else tuple(t.data_ptr() for t in out)


class TestCommon(TestCase):
    exact_dtype = True

    def _compare_out(self, op_out, expected, transform, *, compare_strides_and_data_ptrs=True):
        out = _apply_out_transform(transform, expected)
        original_strides, original_ptrs = _strides(out), _data_ptrs(out)
        op_out(out=out)
        final_strides, final_ptrs = _strides(out), _data_ptrs(out)
        self.assertEqual(expected, out)
        if compare_strides_and_data_ptrs:
            self.assertEqual(original_strides, final_strides,
                             msg=f"Strides are not the same! Original strides were {original_strides} "
                                 f"and strides are now {final_strides}")
            self.assertEqual(original_ptrs, final_ptrs, msg="out= storage was replaced")

    @suppress_warnings
    @ops(_OPS if _ALL else _compare_cpu_ops(_OPS), allowed_dtypes=_SEL,
         dtypes=OpDTypes.supported if _ALL else OpDTypes.any_common_cpu_cuda_one)
    def test_compare_cpu(self, device, dtype, op):
        for sample in op.reference_inputs(device, dtype):
            cpu_sample = sample.transform(_to_cpu)
            dev = op(sample.input, *sample.args, **sample.kwargs)
            cpu = op(cpu_sample.input, *cpu_sample.args, **cpu_sample.kwargs)
            dev = sample.output_process_fn_grad(dev)
            cpu = cpu_sample.output_process_fn_grad(cpu)
            tol = 1e-3 if dtype.is_floating_point or dtype.is_complex else 0
            self.assertEqual(dev, cpu, atol=tol, rtol=tol, exact_device=False)

    @ops(_OPS if _ALL else [op for op in _OPS if _any_one_exists(op)], allowed_dtypes=_SEL,
         dtypes=OpDTypes.supported if _ALL else OpDTypes.any_one)
    def test_out(self, device, dtype, op):
        for sample in op.sample_inputs(device, dtype):
            expected = op(sample.input, *sample.args, **sample.kwargs)
            op_out = partial(op, sample.input, *sample.args, **sample.kwargs)
            if not isinstance(expected, torch.Tensor) and not is_iterable_of_tensors(expected, include_empty=True):
                self.skipTest("Skipped! Only supports single tensor or iterable of tensor outputs.")
            if not op.supports_out:  # the OpInfo's claim: out= must not work
                with self.assertRaises(Exception):  # noqa: B017  (upstream: any way of refusing out=)
                    assert op_out(out=expected) != NotImplemented
                return

            # Case 0: right shape, dtype and device, full of NaN (floating) / the maximum (integer).
            def _case_zero(t):
                try:
                    return torch.full_like(t, torch.iinfo(t.dtype).max)
                except TypeError:
                    return torch.full_like(t, float("nan"))

            self._compare_out(op_out, expected, _case_zero)

            # Case 1: non-contiguous: strides honoured, storage kept.
            self._compare_out(op_out, expected, lambda t: make_tensor(t.shape, dtype=t.dtype, device=t.device,
                                                                      noncontiguous=True))

            # Case 2: no elements: resized, without the resize warning.
            def _case_two(t):
                return make_tensor((0,), dtype=t.dtype, device=t.device)

            self._compare_out(op_out, expected, _case_two, compare_strides_and_data_ptrs=False)
            out = _apply_out_transform(_case_two, expected)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                op_out(out=out)
            if any(_RESIZE_WARNING in str(w.message) for w in caught):
                self.fail("Resizing an out= argument with no elements threw a resize warning!")

            factory_fn_msg = ("\n\nNOTE: If your op is a factory function (i.e., it accepts TensorOptions) you "
                              "should mark its OpInfo with `is_factory_function=True`.")
            # Case 3: right shape and dtype, wrong device (for a PrivateUse1 device: the CPU).
            if torch.device(device).type != "cpu":
                out = _apply_out_transform(lambda t: make_tensor(t.shape, dtype=t.dtype, device="cpu"), expected)
                if op.is_factory_function and sample.kwargs.get("device", None) is None:
                    op_out(out=out)
                else:
                    with self.assertRaises(RuntimeError, msg=f"Expected RuntimeError when calling with "
                                           f"input.device={device} and out.device=cpu." + factory_fn_msg):
                        op_out(out=out)

            # Case 4: right shape and device, a dtype the result cannot safely be cast to (long).
            fl = floating_and_complex_types_and(torch.float16, torch.bfloat16)
            if (isinstance(expected, torch.Tensor) and expected.dtype in fl
                    or not isinstance(expected, torch.Tensor) and any(t.dtype in fl for t in expected)):
                out = _apply_out_transform(lambda t: make_tensor(t.shape, dtype=torch.long, device=t.device),
                                           expected)
                msg = ("Expected RuntimeError when doing an unsafe cast!" if not isinstance(expected, torch.Tensor)
                       else f"Expected RuntimeError when doing an unsafe cast from a result of dtype "
                            f"{expected.dtype} into an out= with dtype torch.long") + factory_fn_msg
                if op.is_factory_function and sample.kwargs.get("dtype", None) is None:
                    op_out(out=out)
                else:
                    exc_type = TypeError if op.name in ("_chunk_cat", "cat", "column_stack", "dstack", "hstack",
                                                        "vstack", "stack") else RuntimeError
                    with self.assertRaises(exc_type, msg=msg):
                        op_out(out=out)

    @ops(_OPS, dtypes=OpDTypes.none)
    def test_out_warning(self, device, op):
        supported = op.supported_dtypes(self.device_type)
        if len(supported) == 0:
            self.skipTest("Skipped! Op has not supported dtypes on this device.")
        dtype = torch.float32 if torch.float32 in supported else next(iter(supported))
        if dtype not in _SEL:
            self.skipTest(f"upstream's dtype for this op, {dtype}, is not among the selected dtypes")
        for sample in op.sample_inputs(device, dtype):
            expected = op(sample.input, *sample.args, **sample.kwargs)
            op_out = partial(op, sample.input, *sample.args, **sample.kwargs)
            if not isinstance(expected, torch.Tensor) and not is_iterable_of_tensors(expected, include_empty=True):
                self.skipTest("Skipped! Only supports single tensor or iterable of tensor outputs.")
            if not op.supports_out:
                with self.assertRaises(Exception):  # noqa: B017  (upstream: any way of refusing out=)
                    assert op_out(out=expected) != NotImplemented
                return

            def _wrong_shape(t):
                shape = list(t.shape)
                shape = [2] if not shape else shape[:-1] + [shape[-1] + 1]
                return make_tensor(shape, dtype=t.dtype, device=t.device)

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self._compare_out(op_out, expected, _wrong_shape, compare_strides_and_data_ptrs=False)
            out = _apply_out_transform(_wrong_shape, expected)
            if (out.numel() > 0 if isinstance(out, torch.Tensor) else any(x.numel() > 0 for x in out)):
                with self.assertWarnsRegex(UserWarning, _RESIZE_WARNING,
                                           msg="Resized a non-empty tensor but did not warn about it."):
                    op_out(out=out)
            # Not upstream's: an out= of the right shape is not resized, so it must not warn.
            out = _apply_out_transform(lambda t: make_tensor(t.shape, dtype=t.dtype, device=t.device), expected)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                op_out(out=out)
            if any(_RESIZE_WARNING in str(w.message) for w in caught):
                self.fail("An out= of the right shape gave the resize warning")

    @suppress_warnings
    @ops(_OPS, allowed_dtypes=_upstream((torch.float32, torch.long, torch.complex64)))
    def test_noncontiguous_samples(self, device, dtype, op):
        test_grad = dtype in op.supported_backward_dtypes(torch.device(device).type)
        for sample_input in op.sample_inputs(device, dtype, requires_grad=test_grad):
            t_inp, t_args, t_kwargs = sample_input.input, sample_input.args, sample_input.kwargs
            nc = sample_input.noncontiguous()
            n_inp, n_args, n_kwargs = nc.input, nc.args, nc.kwargs
            expected = op(t_inp, *t_args, **t_kwargs)
            actual = op(n_inp, *n_args, **n_kwargs)
            self.assertEqual(actual, expected)
            if not test_grad:
                continue
            expected = sample_input.output_process_fn_grad(expected)
            actual = sample_input.output_process_fn_grad(actual)
            if isinstance(expected, torch.Tensor):
                grad_for_expected = torch.randn_like(expected)
                grad_for_actual = noncontiguous_like(grad_for_expected)
            elif isinstance(expected, Sequence):
                expected = [t for t in expected if isinstance(t, torch.Tensor) and t.requires_grad]
                actual = [n for n in actual if isinstance(n, torch.Tensor) and n.requires_grad]
                grad_for_expected = [torch.randn_like(t) for t in expected]
                grad_for_actual = [noncontiguous_like(n) for n in grad_for_expected]
            else:
                continue
            t_inputs = (t_inp,) + t_args if isinstance(t_inp, torch.Tensor) else tuple(t_inp) + t_args
            n_inputs = (n_inp,) + n_args if isinstance(n_inp, torch.Tensor) else tuple(n_inp) + n_args
            t_input_tensors = [t for t in t_inputs if isinstance(t, torch.Tensor) and t.requires_grad]
            n_input_tensors = [n for n in n_inputs if isinstance(n, torch.Tensor) and n.requires_grad]
            self.assertEqual(len(t_input_tensors), len(n_input_tensors))
            t_grads = torch.autograd.grad(expected, t_input_tensors, grad_for_expected, allow_unused=True)
            n_grads = torch.autograd.grad(actual, n_input_tensors, grad_for_actual, allow_unused=True)
            for i, (t, n) in enumerate(zip(t_grads, n_grads, strict=True)):
                self.assertEqual(t, n, msg=f"Got different gradients for contiguous / non-contiguous inputs "
                                           f"wrt input {i}.")

    @ops(_OPS, allowed_dtypes=_upstream((torch.float32, torch.complex64)))
    def test_variant_consistency_eager(self, device, dtype, op):
        method, inplace = op.method_variant, op.inplace_variant
        operator, inplace_operator = op.operator_variant, op.inplace_operator_variant
        inplace_ops = [inplace, inplace_operator]
        variants = [method, inplace, operator, inplace_operator]
        operators = [operator, inplace_operator]
        for a_op in op.aliases:
            variants += [a_op.op, a_op.method_variant, a_op.inplace_variant]
            inplace_ops.append(a_op.inplace_variant)
        inplace_variants = tuple(filter(None, inplace_ops))
        variants = tuple(filter(None, variants))
        operators = tuple(filter(None, operators))
        requires_grad = dtype in op.supported_backward_dtypes(torch.device(device).type)
        samples = list(op.sample_inputs(device, dtype, requires_grad=requires_grad,
                                        include_conjugated_inputs=op.test_conjugated_samples and dtype.is_complex))

        for sample in samples:
            tensor = sample.input if isinstance(sample.input, torch.Tensor) else sample.input[0]
            tensor.grad = None
            expected_forward = op(sample.input, *sample.args, **sample.kwargs)
            expected_grad = None
            process = sample.output_process_fn_grad or (lambda x: x)
            skip_inplace = isinstance(expected_forward, torch.Tensor) and expected_forward.dtype is not tensor.dtype
            if isinstance(expected_forward, torch.Tensor) and requires_grad:
                out = process(expected_forward).sum()
                (out.abs() if out.dtype.is_complex else out).backward()
                expected_grad = tensor.grad
            for variant in variants:
                if variant in inplace_ops and skip_inplace:
                    continue
                tensor.grad = None
                cloned = clone_input_helper(sample.input) if variant in inplace_ops else sample.input
                if variant in inplace_ops and sample.broadcasts_input:
                    with self.assertRaises(RuntimeError, msg="inplace variant either incorrectly allowed resizing "
                                           f"or you have marked the sample {sample.summary()} incorrectly with "
                                           "`broadcasts_self=True"):
                        variant(cloned, *sample.args, **sample.kwargs)
                    continue
                if variant in operators and sample.kwargs:
                    continue
                variant_forward = variant(cloned, *sample.args, **sample.kwargs)
                self.assertEqual(expected_forward, variant_forward)
                if expected_grad is not None and (variant not in inplace_ops or op.supports_inplace_autograd):
                    out = process(variant_forward).sum()
                    (out.abs() if out.dtype.is_complex else out).backward()
                    self.assertEqual(expected_grad, tensor.grad)

        # In-place variants return self (upstream: "_test_inplace_preserve_storage").
        if len(inplace_ops) > 0:
            for sample in (s for s in samples if not s.broadcasts_input):
                expected_forward = op(sample.input, *sample.args, **sample.kwargs)
                tensor = sample.input if isinstance(sample.input, torch.Tensor) else sample.input[0]
                if isinstance(expected_forward, torch.Tensor) and expected_forward.dtype is not tensor.dtype:
                    return  # upstream returns here (not continue): later samples go unchecked too
                for variant in inplace_variants:
                    cloned = clone_input_helper(sample.input)
                    data_ptr = (cloned if isinstance(cloned, torch.Tensor) else cloned[0]).data_ptr()
                    if variant in operators and sample.kwargs:
                        continue
                    variant_forward = variant(cloned, *sample.args, **sample.kwargs)
                    if isinstance(variant_forward, torch.Tensor):
                        self.assertEqual(data_ptr, variant_forward.data_ptr(), atol=0, rtol=0,
                                         msg="the in-place variant did not return self")
                    else:
                        self.fail("Non-tensor outputs for inplace ops are not supported")

    @ops(_OPS, dtypes=OpDTypes.none)
    def test_dtypes(self, device, op):
        device_type = torch.device(device).type
        allowed_backward = floating_and_complex_types_and(torch.half, torch.bfloat16)
        supported, unsupported = set(), set()
        supported_bw, unsupported_bw = set(), set()
        dtype_error: dict = {}

        def _unsupported(dtype, e):
            dtype_error[dtype] = e
            unsupported.add(dtype)
            if dtype in allowed_backward:
                unsupported_bw.add(dtype)

        def _requires_grad(x):
            if isinstance(x, dict):
                return any(_requires_grad(v) for v in x.values())
            if isinstance(x, (list, tuple)):
                return any(_requires_grad(v) for v in x)
            return isinstance(x, torch.Tensor) and x.requires_grad

        for dtype in _SEL:  # upstream: all_types_and_complex_and(half, bfloat16, bool)
            try:
                samples = tuple(op.sample_inputs(device, dtype, requires_grad=dtype in allowed_backward))
            except Exception as e:
                _unsupported(dtype, e)
                continue
            for sample in samples:
                try:
                    result = op(sample.input, *sample.args, **sample.kwargs)
                    supported.add(dtype)
                except Exception as e:
                    _unsupported(dtype, e)
                    continue
                if not (_requires_grad(sample.input) or _requires_grad(sample.args) or _requires_grad(sample.kwargs)):
                    continue
                try:
                    result = sample.output_process_fn_grad(result)
                    if isinstance(result, torch.Tensor):
                        backward_tensor = result
                    elif isinstance(result, Sequence) and isinstance(result[0], torch.Tensor):
                        backward_tensor = result[0]
                    else:
                        continue
                    backward_tensor.backward(torch.randn_like(backward_tensor))
                    supported_bw.add(dtype)
                except Exception as e:
                    dtype_error[dtype] = e
                    unsupported_bw.add(dtype)

        supported_forward = supported - unsupported
        unsupported_forward = unsupported - supported
        supported_backward = supported_bw - unsupported_bw
        unsupported_backward = unsupported_bw - supported_bw
        claimed_forward = set(op.supported_dtypes(device_type)) & set(_SEL)
        claimed_backward = set(op.supported_backward_dtypes(device_type)) & set(_SEL)
        problems = {
            "worked in forward but are not listed by the OpInfo": supported_forward - claimed_forward,
            "worked in backward but are not listed by the OpInfo": supported_backward - claimed_backward,
            "did not work in forward but are listed by the OpInfo": claimed_forward & unsupported_forward,
            "did not work in backward but are listed by the OpInfo": claimed_backward & unsupported_backward,
        }
        if not any(problems.values()):
            return
        msg = f"The supported dtypes for {op.name} on device type {device_type} are incorrect! " + "; ".join(
            f"The following dtypes {what}: {sorted(map(str, ds))}" for what, ds in problems.items() if ds)
        for dtype in sorted(problems["did not work in forward but are listed by the OpInfo"]
                            | problems["did not work in backward but are listed by the OpInfo"], key=str):
            msg += f"; {dtype} - {str(dtype_error[dtype]).splitlines()[0] if str(dtype_error[dtype]) else ''}"
        self.fail(msg)


instantiate_device_type_tests(TestCommon, globals(),
                              only_for=tuple(os.environ.get("TESTCOMMON_DEVICES", "privateuse1").split(",")))
