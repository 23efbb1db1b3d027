"""Repro: a standalone script (inputs saved next to it) that reproduces one stored result on
its target and prints both results and the error.

When the stored item failed contract checks (:mod:`conformance.check.contracts`), the script also
runs the item as the sweep does (:func:`conformance.sweep.evaluate`, on the sample regenerated
from the same seed, with only those contracts) and prints each one's outcome and detail; it
exits nonzero while a value or a contract still fails. That part needs the harness installed.

An item of the custom-op lane (``opcheck``, ``custom_fwd``, ``custom_bwd``, ``custom_compile``)
gets a script of its own (:mod:`.repro_customops`): it makes the sample again from code and runs
the lane's check with the harness.

The script is built from data only: every stored value enters it as a Python literal (``repr``
of a checked int, float or str) or as escaped docstring text, op names are resolved only when the
dispatcher or ``op_db`` knows them, and the inputs file is read by a decoder that admits tensors
(``torch.load(..., weights_only=True)``) and plain values only. A tampered database cannot make
``conformance repro`` or the script it writes execute anything.

Example (shell): ``conformance repro 1234 --db results/opdb.sqlite --out repro/``
"""

from __future__ import annotations

import inspect
import json
import shlex
import sys
from functools import cache
from pathlib import Path
from typing import Any

import torch

from conformance.check.comparators import comparator_for
from conformance.check.contracts import CONTRACTS
from conformance.check.dtypeprobe import SampleProbe, differentiable, differs
from conformance.customops import VARIANTS as CUSTOM_VARIANTS
from conformance.inputs.opinfo import DEFAULT_SEED, REFERENCE, SPARSE_VARIANTS, by_name, samples
from conformance.select import DTYPE_PROBE
from conformance.sweep import ladder
from conformance.targets import get_target
from opdb import Store
from opdb.blobs import decode_inputs, dump_inputs, load_inputs
from opdb.queries import op_result

from .repro_contracts import CONTRACTS_PART
from .repro_customops import write_custom_repro
from .repro_fields import (
    check_script,
    doc_text,
    dtype_field,
    env_pairs,
    int_field,
    literal,
    module_names,
    opt_str,
    run_config,
    str_field,
    tol_field,
)

# Which attribute of the OpInfo a variant calls (schema results call the overload itself).
_VARIANT_ATTR = {"function": "op", "canary": "op", "backward": "op", "out": "op", "inplace": "inplace_variant",
                 **dict.fromkeys(SPARSE_VARIANTS, "op"), REFERENCE: "op", "schema": None, "traced": None,
                 "ladder": "op", DTYPE_PROBE: "op"}

_TEMPLATE = '''"""{doc}
"""
from __future__ import annotations

import warnings
from pathlib import Path

import torch

{setup}
RECORD = {record}
DEVICE = RECORD["device"]
VARIANT = RECORD["variant"]


{decoder}

data = decode_inputs(Path(__file__).with_name(RECORD["inputs"]).read_bytes())

warnings.simplefilter("ignore")
{resolve}


def move(x, device, grad=False, copies=None):
    """``x`` with its tensors copied to ``device`` as the sweep copies a sample: in the layout
    each has (strides, storage offset and the rest of its storage, which ``as_strided`` reads),
    tensors that share storage still sharing it (``copies``: one copy per storage)."""
    copies = {{}} if copies is None else copies
    if isinstance(x, str) and x == "<device>":
        return torch.device(device)
    if isinstance(x, str) and x.startswith("<") and x.endswith("_format>"):
        fmt = getattr(torch, x[1:-1], None)
        return fmt if isinstance(fmt, torch.memory_format) else x
    if isinstance(x, torch.UntypedStorage):  # a Storage argument (set_'s): its bytes, on the device
        whole = torch.empty(0, dtype=torch.uint8).set_(x, 0, (x.nbytes(),), (1,))
        return whole.to(device, copy=True).untyped_storage()
    if isinstance(x, torch.Tensor) and grad:  # leaves with the sample's own requires_grad flags
        return x.detach().to(device, copy=True).requires_grad_(x.requires_grad)
    if isinstance(x, torch.Tensor):
        t = x.detach()
        if t.layout != torch.strided or t.numel() == 0:
            return t.to(device, copy=True)
        st = t.untyped_storage()
        if st.data_ptr() not in copies:
            whole = t.new_empty(0).set_(st, 0, (st.nbytes() // t.element_size(),), (1,))
            copies[st.data_ptr()] = whole.to(device, copy=True)
        return copies[st.data_ptr()].as_strided(t.shape, t.stride(), t.storage_offset())
    if isinstance(x, (list, tuple)):
        return type(x)(move(v, device, grad, copies) for v in x)
    if isinstance(x, dict):
        return {{k: move(v, device, grad, copies) for k, v in x.items()}}
    return x


def leaves(x):
    if isinstance(x, (list, tuple)):
        return [y for v in x for y in leaves(v)]
    if isinstance(x, dict):
        return [y for v in x.values() for y in leaves(v)]
    return [x]


def to_cpu(x):
    return move(x, "cpu")


def call(f, device, out_like=None, sized_out=False):
    grad = VARIANT == "backward"
    inp, args, kwargs = move([data["input"], data["args"], data["kwargs"]], device, grad)
    if grad:  # input gradients for a fixed upstream gradient, as the sweep compares them
        outs = [o for o in leaves(f(inp, *args, **kwargs)) if isinstance(o, torch.Tensor) and o.requires_grad]
        ins = [t for t in leaves([inp, args, kwargs]) if isinstance(t, torch.Tensor) and t.requires_grad]
        gen = torch.Generator().manual_seed(len(outs))
        ups = [torch.randn(o.shape, generator=gen, dtype=torch.float32).to(o.dtype).to(device) for o in outs]
        return torch.autograd.grad(outs, ins, ups, allow_unused=True)
    if data["input"] is None:
        return f(*args, **kwargs)
    if VARIANT == "out":
        outs = tuple(torch.empty(t.shape if sized_out else 0, dtype=t.dtype, device=device)
                     for t in (out_like if isinstance(out_like, tuple) else (out_like,)))
        ret = f(inp, *args, **kwargs, out=outs if isinstance(out_like, tuple) else outs[0])
        return ret if ret is not None else outs
    return f(inp, *args, **kwargs)


ref = None
if VARIANT == "out" and data["input"] is not None:
    ref_inp, ref_args, ref_kwargs = move([data["input"], data["args"], data["kwargs"]], "cpu")
    ref = fn_functional(ref_inp, *ref_args, **ref_kwargs)
cpu = call(fn, "cpu", ref, RECORD["sized_out"])
print("CPU result:", cpu)
try:
    target_fn = {wrapped}
    dev = to_cpu(call(target_fn, DEVICE, ref, RECORD["sized_out"]))
except Exception as exc:
    print("target raised:", type(exc).__name__, exc)
    raise SystemExit(1)
print("target result:", dev)
ATOL, RTOL = RECORD["atol"], RECORD["rtol"]
failing = False
try:
    torch.testing.assert_close(dev, cpu, atol=ATOL, rtol=RTOL, equal_nan=True, check_stride=False)
    print(f"within tolerance (atol={{ATOL!r}}, rtol={{RTOL!r}})")
except AssertionError as err:
    print("MISMATCH:", err)
    failing = True
'''

# Appended when the stored item failed contracts: the item evaluated as the sweep evaluates it.
_END = '''
raise SystemExit(1 if failing else 0)
'''

# A dtype-probe item (conformance.sweep.dtypes): the sample on which the CPU and the target first
# differed, in the direction they differed; whether each side runs it is the finding, not values.
_PROBE = _TEMPLATE.split("\nref = None\n")[0] + '''

def attempt(f, device):
    try:
        return to_cpu(call(f, device)), None
    except Exception as exc:  # noqa: BLE001 - which side raises is the finding
        return None, f"{{type(exc).__name__}} {{exc}}"


cpu, cpu_error = attempt(fn, "cpu")
dev, dev_error = attempt({wrapped}, DEVICE)
print("CPU:", cpu_error or "runs")
print("target:", dev_error or "runs")
failing = (cpu_error is None) != (dev_error is None)
if failing and dev_error:
    print("target raised:", dev_error)
elif failing:
    print(f"MISMATCH: the target runs {{RECORD['dtype']}} {{VARIANT}} where the CPU raises {{cpu_error}}")
'''

# A schema (or traced) item whose stored input is one the CPU rejects, kept because the target
# did not raise on it (contract errors, conformance.sweep.schema.rows): both sides raise, or it fails.
_REJECTED = _TEMPLATE.split("\nref = None\n")[0] + '''

def attempt(f, device):
    try:
        return to_cpu(call(f, device)), None
    except Exception as exc:  # noqa: BLE001 - that both sides raise is the contract
        return None, f"{{type(exc).__name__}}: {{exc}}"


cpu, cpu_error = attempt(fn, "cpu")
dev, dev_error = attempt({wrapped}, DEVICE)
print("CPU:", cpu_error or "runs")
print("target:", dev_error or "runs")
failing = cpu_error is not None and dev_error is None
if failing:
    shapes = [list(t.shape) for t in leaves(dev) if isinstance(t, torch.Tensor)]
    print(f"CONTRACT FAILED: errors: an input the CPU rejects returns {{shapes or type(dev).__name__}} on the target")
elif cpu_error is None:
    print("the CPU accepts the stored input now: the errors contract has nothing to check on it")
'''


def write_repro(store: Store, result_id: int, out_dir: str | Path) -> Path:
    """Write ``repro_<id>.py`` and ``repro_<id>_inputs.pt`` into ``out_dir``; returns the script.

    Raises ValueError (one line naming the result and the field) when a stored field is not
    what a result holds: an unknown op or variant, a non-number tolerance, unsafe inputs.
    """
    where = f"result {int(result_id)}"
    row = op_result(store, result_id)
    run = store.get_run(row["run_id"]) or {}
    config = run_config(run.get("config"), where)
    variant = str_field(row, "variant", where)
    if variant in CUSTOM_VARIANTS:  # the custom-op lane's items: their samples are made again from code
        return write_custom_repro(row, run, config, result_id, out_dir)
    if variant not in _VARIANT_ATTR:
        raise ValueError(f"{where}: unknown variant {variant!r} (expected one of "
                         f"{', '.join((*_VARIANT_ATTR, *CUSTOM_VARIANTS))})")
    out = Path(out_dir)
    inputs = f"repro_{int(result_id)}_inputs.pt"
    op = str_field(row, "op", where)
    direction = "forward"  # a dtype-probe item's, below
    rejected = False  # a schema item's input that the CPU rejects (its errors contract failed on it)
    if variant in ("schema", "traced"):  # the overload itself, on the stored input
        if not row.get("inputs"):
            raise ValueError(f"{where}: a passing {variant} result keeps no input; only failing ones store "
                             "their input")
        saved = load_inputs(row["inputs"], where=f"{where}: column inputs")
        if not (isinstance(saved, dict) and isinstance(saved.get("args"), (list, tuple))
                and isinstance(saved.get("kwargs"), dict)):
            raise ValueError(f"{where}: column inputs does not hold args and kwargs")
        rejected = saved.get("role") == "rejected"
        data = {"input": None, "args": tuple(saved["args"]), "kwargs": saved["kwargs"]}
        base, overload = _aten_overload(op, where)
        resolve = f"fn = fn_functional = getattr(getattr(torch.ops.aten, {base!r}), {overload!r})"
    else:
        info = by_name().get(op)
        if info is None:
            raise ValueError(f"{where}: OpInfo {op!r} is not in this torch's op_db")
        dtype = dtype_field(row.get("dtype"), where)
        seed = int_field(row.get("seed") or config.get("seed") or DEFAULT_SEED, where, "seed")
        if variant == ladder.VARIANT:  # the size ladder's grown sample, regrown as the sweep grew it
            try:
                sample = ladder.rung_sample(info, op, str(row["dtype"]), int_field(row.get("sample"), where, "sample"), seed)
            except ValueError as exc:
                raise ValueError(f"{where}: {exc}") from None
        elif variant == DTYPE_PROBE:  # the sample the sides first differed on, in that direction
            index, direction = _probed(row, where)
            sample = _nth(samples(info, dtype, seed=seed, requires_grad=differentiable(dtype, info)), index)
            row = {**row, "sample": index}
        else:
            thorough = bool(config.get("thorough")) or variant == REFERENCE  # its index: within reference_inputs
            sample = _nth(samples(info, dtype, thorough=thorough, seed=seed,
                                  requires_grad=variant == "backward", layout=variant if variant in SPARSE_VARIANTS else None),
                          int_field(row.get("sample"), where, "sample"))
        kwargs = dict(sample.kwargs)
        if kwargs.get("device") in ("cpu", torch.device("cpu")):
            # a factory sample names the device it was generated for: the sweep creates the
            # target's tensors on the target (placement.clone_sample), and so must the script
            kwargs["device"] = "<device>"
        data = {"input": sample.input, "args": sample.args, "kwargs": kwargs}
        resolve = ("from torch.testing._internal.common_methods_invocations import op_db\n"
                   f"info = next(o for o in op_db if o.name == {info.name!r} and "
                   f"o.variant_test_name == {info.variant_test_name!r})\n"
                   f"fn = getattr(info, {_VARIANT_ATTR[variant]!r})\nfn_functional = info.op")
    try:
        blob = dump_inputs(data)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
    env = env_pairs(config.get("env"), where)
    target = get_target(run.get("target", "cpu"), config.get("build_spec") or run.get("build"),
                        tuple(config.get("imports") or ()), env)
    target.use_own_rng(comparator_for(op) == "random")  # as the sweep ran it
    setup, wrapped = target.repro_setup()
    if env:  # the run's --env, before the device package loads
        setup = "import os\n" + "".join(f"os.environ[{n!r}] = {v!r}\n" for n, _, v in
                                         (e.partition("=") for e in env)) + setup
    script = out / f"repro_{int(result_id)}.py"
    # A compiler target gets out= tensors of the result's shapes, on both sides, as in the sweep
    # (execute.run_item).
    probe = variant == DTYPE_PROBE
    record = {"result": int(result_id), "op": op,
              "variant": ("backward" if direction == "backward" else "function") if probe else variant,
              "device": str(target.device),
              "sized_out": bool(target.compiler),
              "inputs": inputs, "atol": tol_field(row.get("atol"), where, "atol"), "rtol": tol_field(row.get("rtol"), where, "rtol")}
    failed = _contracts(row.get("contract_failed"), where)
    if failed and variant not in ("schema", "traced", DTYPE_PROBE):
        # what the script needs to evaluate the item as the sweep did: the same target (the values
        # get_target accepted above), the same sample (dtype, index, seed) and those contracts
        record.update(contracts=failed, target=str_field(run, "target", f"{where}: its run"),
                      build_spec=opt_str(config.get("build_spec") or run.get("build"), where, "build"),
                      imports=module_names(config.get("imports"), where), dtype=str(row["dtype"]),
                      sample=int_field(row.get("sample"), where, "sample"), seed=seed,
                      thorough=bool(config.get("thorough")) or variant == REFERENCE)
    doc = doc_text(
        f"Reproduces opdb result {int(result_id)}: {op} ({variant}, {row.get('dtype')}, sample {row.get('sample')}) "
        f"on target {run.get('target')}\n(build {run.get('build')}). Recorded status: {row.get('status')}.\n"
        f"Recorded error: {str(row.get('error') or '')[:500]}\n"
        f"Run it with the Python that wrote it (torch and the target's package are installed there):\n"
        f"  {shlex.join([sys.executable, str(script.resolve())])}")
    text = _TEMPLATE.format(doc=doc, setup=setup, record=literal(record), decoder=inspect.getsource(decode_inputs),
                            resolve=resolve, wrapped=wrapped.replace("{fn}", "fn"))
    if probe or rejected:
        record["dtype"] = str(row["dtype"])
        text = (_PROBE if probe else _REJECTED).format(doc=doc, setup=setup, record=literal(record), decoder=inspect.getsource(decode_inputs),
                             resolve=resolve, wrapped=wrapped.replace("{fn}", "fn"))
    text += (CONTRACTS_PART if "contracts" in record else "") + _END
    check_script(text, record)
    out.mkdir(parents=True, exist_ok=True)
    (out / inputs).write_bytes(blob)
    script.write_text(text, encoding="utf-8")
    return script


def _probed(row: dict[str, Any], where: str) -> tuple[int, str]:
    """A dtype-probe item's first sample on which the CPU and the target differ, and the direction
    (``forward`` | ``backward``), from its ``proof.dtypes``."""
    try:
        probed = json.loads(row.get("proof") or "{}")["dtypes"]["samples"]
    except (ValueError, KeyError, TypeError):
        raise ValueError(f"{where}: field proof holds no dtype probe (proof.dtypes.samples)") from None
    for s in probed if isinstance(probed, list) else ():
        try:
            first = differs(SampleProbe(int(s["index"]), tuple(s["cpu"]), tuple(s["target"])))
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{where}: field proof.dtypes.samples holds {str(s)[:80]!r}, not a probed sample") from None
        if first is not None:
            return int(s["index"]), first[0]
    raise ValueError(f"{where}: its dtype probe found no sample on which the CPU and the target differ "
                     "(a passing probe has nothing to reproduce)")


def _contracts(value: Any, where: str) -> list[str]:
    """The stored ``contract_failed`` as contract names, each one :data:`CONTRACTS` knows."""
    if value is None or value == "":
        return []
    if not isinstance(value, str):
        raise ValueError(f"{where}: field contract_failed is {value!r}, not a string")
    names = [n.strip() for n in value.split(",") if n.strip()]
    bad = [n for n in names if n not in CONTRACTS]
    if bad:
        raise ValueError(f"{where}: field contract_failed names {bad[0]!r}, not a contract "
                         f"(expected some of {', '.join(CONTRACTS)})")
    return [c for c in CONTRACTS if c in names]


@cache
def _aten_overloads() -> frozenset[str]:
    from conformance.catalog.overloads import aten_names

    return frozenset(aten_names())


def _aten_overload(name: str, where: str) -> tuple[str, str]:
    """``aten::base.overload`` -> (base, overload), only for an overload the dispatcher has."""
    if name not in _aten_overloads():
        raise ValueError(f"{where}: op {name!r} is not an ATen overload this torch's dispatcher knows")
    base, overload = name.split("::", 1)[1].rsplit(".", 1)
    if not (base.isidentifier() and overload.isidentifier()):
        raise ValueError(f"{where}: op {name!r} is not made of Python identifiers")
    return base, overload


def _nth(it: Any, n: int) -> Any:
    for i, s in enumerate(it):
        if i == n:
            return s
    raise ValueError(f"sample {n} no longer exists for this OpInfo (torch changed?)")
