"""Repro: a standalone script (inputs saved next to it) that reproduces one stored result on
its target and prints both results and the error.

Example (shell): ``conformance repro 1234 --db results/opdb.sqlite --out repro/``
"""

from __future__ import annotations

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


def move(x, device):
    if isinstance(x, torch.Tensor):
        return x.detach().to(device, copy=True)
    if isinstance(x, (list, tuple)):
        return type(x)(move(v, device) for v in x)
    if isinstance(x, dict):
        return {{k: move(v, device) for k, v in x.items()}}
    return x


def to_cpu(x):
    return move(x, "cpu")


def call(f, device, out_like=None):
    inp, args, kwargs = move(data["input"], device), move(data["args"], device), move(data["kwargs"], device)
    if {variant!r} == "out":
        outs = tuple(torch.empty(0, dtype=t.dtype, device=device) for t in (out_like if isinstance(out_like, tuple) else (out_like,)))
        ret = f(inp, *args, **kwargs, out=outs if isinstance(out_like, tuple) else outs[0])
        return ret if ret is not None else outs
    return f(inp, *args, **kwargs)


ref = None
if {variant!r} == "out":
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
    info = by_name().get(row["op"])
    if info is None:
        raise ValueError(f"result {result_id}: OpInfo {row['op']!r} is not in this torch's op_db")
    dtype = getattr(torch, row["dtype"])
    seed = row.get("seed") or config.get("seed")
    sample = _nth(samples(info, dtype, thorough=bool(config.get("thorough")), seed=seed), row["sample"])
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    inputs = f"repro_{result_id}_inputs.pt"
    torch.save({"input": sample.input, "args": sample.args, "kwargs": sample.kwargs}, out / inputs)
    target = get_target(run.get("target", "cpu"), run.get("build"))
    setup, wrapped = target.repro_setup()
    name, variant_name = info.name, info.variant_test_name
    attr = {"function": "op", "out": "op", "inplace": "inplace_variant"}[row["variant"]]
    resolve = ("from torch.testing._internal.common_methods_invocations import op_db\n"
               f"info = next(o for o in op_db if o.name == {name!r} and o.variant_test_name == {variant_name!r})\n"
               f"fn = info.{attr}\nfn_functional = info.op")
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
