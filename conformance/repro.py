"""Repro: a standalone script (inputs saved next to it) that reproduces one stored result on
its target and prints both results and the error.

Example (shell): ``conformance repro 1234 --db results/opdb.sqlite --out repro/``
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import torch

from opdb import Store
from opdb.queries import op_result

from .inputs.opinfo import by_name, samples
from .targets import get_target

_TEMPLATE = '''"""Reproduces opdb result {rid}: {op} ({variant}, {dtype}, sample {sample}) on target {target}
(build {build}). Recorded status: {status}.
Recorded error: {error}
Run: python {script}
"""
import warnings
from pathlib import Path

import torch

{setup}
DEVICE = {device!r}
data = torch.load(Path(__file__).with_name({inputs!r}), weights_only=False)

warnings.simplefilter("ignore")
{resolve}


def move(x, device, grad=False):
    if isinstance(x, str) and x == "<device>":
        return torch.device(device)
    if isinstance(x, str) and x.startswith("<") and x.endswith("_format>"):
        return getattr(torch, x[1:-1])
    if isinstance(x, torch.Tensor) and grad:  # keep the sample's own requires_grad flags
        return x.detach().to(device, copy=True).requires_grad_(x.requires_grad)
    if isinstance(x, torch.Tensor):
        return x.detach().to(device, copy=True)
    if isinstance(x, (list, tuple)):
        return type(x)(move(v, device, grad) for v in x)
    if isinstance(x, dict):
        return {{k: move(v, device, grad) for k, v in x.items()}}
    return x


def leaves(x):
    if isinstance(x, (list, tuple)):
        return [y for v in x for y in leaves(v)]
    if isinstance(x, dict):
        return [y for v in x.values() for y in leaves(v)]
    return [x]


def to_cpu(x):
    return move(x, "cpu")


def call(f, device, out_like=None):
    grad = {variant!r} == "backward"
    inp, args, kwargs = (move(data["input"], device, grad), move(data["args"], device, grad),
                         move(data["kwargs"], device, grad))
    if grad:  # input gradients for a fixed upstream gradient, as the sweep compares them
        outs = [o for o in leaves(f(inp, *args, **kwargs)) if isinstance(o, torch.Tensor) and o.requires_grad]
        ins = [t for t in leaves([inp, args, kwargs]) if isinstance(t, torch.Tensor) and t.requires_grad]
        gen = torch.Generator().manual_seed(len(outs))
        ups = [torch.randn(o.shape, generator=gen, dtype=torch.float32).to(o.dtype).to(device) for o in outs]
        return torch.autograd.grad(outs, ins, ups, allow_unused=True)
    if data["input"] is None:
        return f(*args, **kwargs)
    if {variant!r} == "out":
        outs = tuple(torch.empty(0, dtype=t.dtype, device=device) for t in (out_like if isinstance(out_like, tuple) else (out_like,)))
        ret = f(inp, *args, **kwargs, out=outs if isinstance(out_like, tuple) else outs[0])
        return ret if ret is not None else outs
    return f(inp, *args, **kwargs)


ref = None
if {variant!r} == "out" and data["input"] is not None:
    ref = fn_functional(move(data["input"], "cpu"), *move(data["args"], "cpu"), **move(data["kwargs"], "cpu"))
cpu = call(fn, "cpu", ref)
print("CPU result:", cpu)
try:
    dev = to_cpu(call({wrapped}, DEVICE, ref))
except Exception as exc:
    print("target raised:", type(exc).__name__, exc)
    raise SystemExit(1)
print("target result:", dev)
try:
    torch.testing.assert_close(dev, cpu, atol={atol!r}, rtol={rtol!r}, equal_nan=True, check_stride=False)
    print("within tolerance (atol={atol!r}, rtol={rtol!r})")
except AssertionError as err:
    print("MISMATCH:", err)
    raise SystemExit(1)
'''


def write_repro(store: Store, result_id: int, out_dir: str | Path) -> Path:
    """Write ``repro_<id>.py`` and ``repro_<id>_inputs.pt`` into ``out_dir``; returns the script."""
    row = op_result(store, result_id)
    run = store.get_run(row["run_id"]) or {}
    config = json.loads(run.get("config") or "{}")
    out = Path(out_dir)
    inputs = f"repro_{result_id}_inputs.pt"
    if row["variant"] == "schema":
        if not row.get("inputs"):
            raise ValueError(f"result {result_id}: a passing schema-driven result keeps no input; only failing "
                             "ones store their shrunk input")
        saved = torch.load(io.BytesIO(row["inputs"]), weights_only=False)
        data = {"input": None, "args": tuple(saved["args"]), "kwargs": saved["kwargs"]}
        base, overload = row["op"].split("::", 1)[1].rsplit(".", 1)
        resolve = f"fn = fn_functional = torch.ops.aten.{base}.{overload}"
    else:
        info = by_name().get(row["op"])
        if info is None:
            raise ValueError(f"result {result_id}: OpInfo {row['op']!r} is not in this torch's op_db")
        seed = row.get("seed") or config.get("seed")
        sample = _nth(samples(info, getattr(torch, row["dtype"]), thorough=bool(config.get("thorough")), seed=seed,
                              requires_grad=row["variant"] == "backward"), row["sample"])
        data = {"input": sample.input, "args": sample.args, "kwargs": sample.kwargs}
        attr = {"function": "op", "canary": "op", "backward": "op", "out": "op",
                "inplace": "inplace_variant"}[row["variant"]]
        resolve = ("from torch.testing._internal.common_methods_invocations import op_db\n"
                   f"info = next(o for o in op_db if o.name == {info.name!r} and "
                   f"o.variant_test_name == {info.variant_test_name!r})\nfn = info.{attr}\nfn_functional = info.op")
    out.mkdir(parents=True, exist_ok=True)
    torch.save(data, out / inputs)
    target = get_target(run.get("target", "cpu"), (json.loads(run.get("config") or "{}").get("build_spec")
                                                     or run.get("build")))
    setup, wrapped = target.repro_setup()
    script = out / f"repro_{result_id}.py"
    script.write_text(_TEMPLATE.format(
        rid=result_id, op=row["op"], variant=row["variant"], dtype=row["dtype"], sample=row["sample"],
        target=run.get("target"), build=run.get("build"), status=row["status"],
        error=(row.get("error") or "").replace('"""', "'''")[:500], script=script.name, setup=setup,
        device=target.device, inputs=inputs, resolve=resolve, wrapped=wrapped.format(fn="fn"),
        atol=row.get("atol") or 0.0, rtol=row.get("rtol") or 0.0))
    return script


def _nth(it: Any, n: int) -> Any:
    for i, s in enumerate(it):
        if i == n:
            return s
    raise ValueError(f"sample {n} no longer exists for this OpInfo (torch changed?)")
