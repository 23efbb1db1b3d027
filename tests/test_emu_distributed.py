"""The c10d backend "neuron" (neuron_emu.distributed): every collective against float64 math on the
ideal and a release build (one after the other in one job) at world sizes 2 and 3, the build's reduce numerics ([distributed]),
defects on collectives (c10d:: ops) and their manifest validation.

Each multi-process test starts one process per rank running this file as a script (``python
test_emu_distributed.py <scenario> <rank> <world size> <store> <timeout s>``): the scenario checks
its results itself (an AssertionError fails the process) and prints one ``RESULT <json>`` line
that the test compares across ranks.  Every process a test starts is gone when it ends.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
D = "neuron"


# ================================================================================ the launcher
def _launch(tmp_path: Path, scenario: str, world: int, build: str | Path, *, timeout: float = 40.0,
            pg_timeout: float = 30.0, must_finish: list[int] | None = None) -> list[dict]:
    """Runs `scenario` on `world` ranks under `build`; returns per rank {"rc", "out", "err",
    "result"}.  Ranks not in `must_finish` (default: all) that are still running once those have
    finished are killed (their rc is None)."""
    store = tmp_path / f"store-{uuid.uuid4().hex}"
    env = dict(os.environ, PYTHONPATH=str(REPO), NEURON_EMU_BUILD=str(build), PYTHONUNBUFFERED="1")
    env.pop("NEURON_EMU_STRICT", None)
    procs, files = [], []
    try:
        for r in range(world):
            out = open(tmp_path / f"{scenario}-{r}.out", "w+")  # noqa: SIM115 - closed below
            err = open(tmp_path / f"{scenario}-{r}.err", "w+")  # noqa: SIM115
            files.append((out, err))
            procs.append(subprocess.Popen(
                [sys.executable, __file__, scenario, str(r), str(world), str(store), str(pg_timeout)],
                stdout=out, stderr=err, env=env, cwd=REPO))
        wait = range(world) if must_finish is None else must_finish
        deadline = time.monotonic() + timeout
        for r in wait:
            try:
                procs[r].wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
    finally:
        rcs = []
        for p in procs:
            rcs.append(p.poll())
            if p.poll() is None:
                p.kill()
                p.wait()
    res = []
    for rc, (out, err) in zip(rcs, files, strict=True):
        out.seek(0)
        err.seek(0)
        o, e = out.read(), err.read()
        out.close()
        err.close()
        line = next((ln for ln in o.splitlines() if ln.startswith("RESULT ")), None)
        res.append({"rc": rc, "out": o, "err": e, "result": json.loads(line[7:]) if line else None})
    if must_finish is None:
        for r, x in enumerate(res):
            assert x["rc"] == 0, f"rank {r} of {scenario!r} (build {build}, world {world}) failed, rc {x['rc']}:\n{x['err'][-4000:]}"
    return res


def _manifest(tmp_path: Path, body: str, name: str = "dist") -> Path:
    p = tmp_path / f"{name}.toml"
    p.write_text(textwrap.dedent(body))
    return p


# ============================================================================ the collectives
BUILDS = ("ideal", "2.33.0")   # the control and a release: every rank switches builds between runs


@pytest.mark.parametrize("world", [2, 3])
def test_every_collective_matches_float64_math(tmp_path, world):
    res = _launch(tmp_path, "collectives", world, BUILDS[0])
    for b in BUILDS:
        digests = [x["result"][b]["digest"] for x in res]
        assert len(set(digests)) == 1, f"ranks disagree on the replicated results on {b}: {digests}"
        for r, x in enumerate(res):
            assert x["result"][b]["build"] == b and x["result"][b]["rank"] == r


def test_native_accumulation_loses_bf16_precision(tmp_path):
    m = _manifest(tmp_path, """
        [build]
        name = "native-acc"
        inherits = "2.33.0"

        [distributed]
        reduce_accumulate = "native"
    """)
    res = _launch(tmp_path, "native", 4, m)
    for x in res:
        assert x["result"] == {"native": 256.0, "fp32": 260.0, "float32": 259.0}


def test_defects_on_collectives(tmp_path):
    m = _manifest(tmp_path, """
        [build]
        name = "dist-defects"
        inherits = "2.33.0"

        [[defects]]
        op = "c10d::all_reduce"
        kind = "wrong_result"
        dtypes = ["bfloat16"]
        world_sizes = [3]
        magnitude = 0.5

        [[defects]]
        op = "c10d::broadcast"
        kind = "error"
        note = "injected broadcast bug"

        [[defects]]
        op = "c10d::all_gather_into_tensor"
        kind = "wrong_result"
        probability = 0.5
        magnitude = 1.0
    """)
    res = _launch(tmp_path, "defects", 3, m)
    patterns = [x["result"]["pattern"] for x in res]
    assert len(set(map(tuple, patterns))) == 1, f"the ranks rolled differently: {patterns}"
    assert 0 < sum(patterns[0]) < len(patterns[0]), patterns[0]
    for x in res:
        err = x["result"]["broadcast_error"]
        assert "c10d::broadcast" in err and "dist-defects" in err and "dist.toml:defects[1]" in err
        assert "injected broadcast bug" in err


def test_crash_aborts_the_last_rank_and_the_others_fail_in_the_transport(tmp_path):
    m = _manifest(tmp_path, """
        [build]
        name = "dist-crash"
        inherits = "ideal"

        [[defects]]
        op = "c10d::all_reduce"
        kind = "crash"
    """)
    res = _launch(tmp_path, "peer_fails", 2, m, timeout=30, pg_timeout=20, must_finish=[0, 1])
    assert res[1]["rc"] == -signal.SIGABRT, res[1]
    assert "NRT device fault (SIGABRT) in c10d::all_reduce" in res[1]["err"]
    assert res[0]["rc"] == 0, res[0]["err"][-3000:]
    assert res[0]["result"]["raised"]


def test_hang_blocks_the_last_rank_and_the_others_time_out(tmp_path):
    m = _manifest(tmp_path, """
        [build]
        name = "dist-hang"
        inherits = "ideal"

        [[defects]]
        op = "c10d::all_reduce"
        kind = "hang"
    """)
    t0 = time.monotonic()
    res = _launch(tmp_path, "peer_fails", 2, m, timeout=30, pg_timeout=3, must_finish=[0])
    assert res[0]["rc"] == 0, res[0]["err"][-3000:]
    assert res[0]["result"]["raised"]
    assert res[1]["rc"] is None, "the hung rank returned"   # still blocked when rank 0 was done: killed
    assert "device hang in c10d::all_reduce" in res[1]["err"]
    assert time.monotonic() - t0 < 30


# ============================================================================== the manifests
def _bad(tmp_path, body):
    from neuron_emu import ManifestError, load_build

    p = _manifest(tmp_path, body, name=f"bad-{uuid.uuid4().hex[:8]}")
    with pytest.raises(ManifestError) as exc:
        load_build(p)
    return p, str(exc.value)


_DEFECT = '[build]\nname = "x"\ninherits = "2.33.0"\n\n[[defects]]\n'


@pytest.mark.parametrize("body, key, value, accepted", [
    (_DEFECT + 'op = "c10d::allreduce"\nkind = "error"\n', "defects[0].op", "'c10d::allreduce'",
     "c10d::all_reduce"),
    (_DEFECT + 'op = "c10d::all_reduce"\nkind = "error"\nworld_sizes = [0]\n', "defects[0].world_sizes", "[0]",
     "integers >= 1"),
    (_DEFECT + 'op = "c10d::all_reduce"\nkind = "error"\nworld_sizes = []\n', "defects[0].world_sizes", "[]",
     "non-empty"),
    (_DEFECT + 'op = "c10d::all_reduce"\nkind = "error"\nworld_sizes = 2\n', "defects[0].world_sizes", "2",
     "list"),
    (_DEFECT + 'op = "aten::mm.default"\nkind = "error"\nworld_sizes = [2]\n', "defects[0].world_sizes", "[2]",
     "c10d::"),
    (_DEFECT + 'op = "c10d::all_reduce"\nkind = "wrong_dtype"\n', "defects[0].kind", "'wrong_dtype'",
     "wrong_result, nan, error, crash, hang"),
    (_DEFECT + 'op = "c10d::*"\nkind = "slow"\nmagnitude = 2\n', "defects[0].kind", "'slow'",
     "wrong_result, nan, error, crash, hang"),
    ('[build]\nname = "x"\n\n[distributed]\nreduce_accumulate = "bf16"\n', "distributed.reduce_accumulate",
     "'bf16'", "'fp32', 'native'"),
    ('[build]\nname = "x"\n\n[distributed]\naccumulate = "fp32"\n', "distributed.accumulate", "'fp32'",
     "reduce_accumulate"),
])
def test_validation_errors_name_file_key_value(tmp_path, body, key, value, accepted):
    p, msg = _bad(tmp_path, body)
    assert str(p) in msg and f"'{key}'" in msg and value in msg and accepted in msg, msg
    assert msg.count("\n") == 0


def test_distributed_section_defaults_and_inheritance(tmp_path):
    from neuron_emu import load_build, shipped_builds
    from neuron_emu.manifest import C10D_COLLECTIVES

    for name in shipped_builds(include_controls=True):
        b = load_build(name)
        assert b.distributed.reduce_accumulate == "fp32", name
        assert not any(d.is_c10d for d in b.defects), name
    _manifest(tmp_path, '[build]\nname = "p"\ninherits = "2.32.0"\n\n[distributed]\nreduce_accumulate = "native"\n',
              name="parent")
    child = _manifest(tmp_path, '[build]\nname = "c"\ninherits = "parent.toml"\n\n[[defects]]\n'
                                'op = "c10d::all_*"\nkind = "nan"\nworld_sizes = [2, 4]\ndtypes = ["float32"]\n',
                      name="child")
    b = load_build(child)
    assert b.distributed.reduce_accumulate == "native"
    (d,) = [d for d in b.defects if d.is_c10d]
    assert d.world_sizes == (2, 4) and d.dtypes == ("float32",) and d.kind == "nan"
    assert {"all_reduce", "all_to_all_single", "send", "recv", "barrier"} <= set(C10D_COLLECTIVES)


def test_method_names_map_onto_the_c10d_names():
    import torch.distributed as dist

    from neuron_emu import distributed as nd
    from neuron_emu.manifest import C10D_ALIASES, C10D_COLLECTIVES

    assert set(nd.METHOD_COLLECTIVE.values()) | set(C10D_ALIASES) == set(C10D_COLLECTIVES)
    for name in C10D_COLLECTIVES:
        assert hasattr(dist, name), name          # each names a torch.distributed function
    for method in nd.METHOD_COLLECTIVE:
        assert callable(getattr(nd.NeuronProcessGroup, method)), method
    assert nd.collective_names("all_gather_into_tensor") == ("c10d::all_gather_into_tensor", "c10d::all_gather_single")


# ================================================================== the scenarios (one rank each)
def _data(r: int, shape, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """Rank r's input: every rank can compute every rank's."""
    g = torch.Generator().manual_seed(7919 * seed + r + 1)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    return torch.randint(-60, 60, shape, generator=g).to(dtype)


def _bf16_ulp(x: torch.Tensor) -> torch.Tensor:
    a = x.abs().clamp_min(2.0 ** -120)
    return torch.exp2(torch.floor(torch.log2(a)) - 7)


def _close(got: torch.Tensor, exact: torch.Tensor, what: str) -> None:
    """`got` (on the device) equals the float64 `exact`: float32 within rounding, bf16 within one
    bf16 ulp (what accumulating in float32 and rounding once gives), integers exactly."""
    g = got.cpu()
    if g.dtype == torch.bfloat16:
        err = (g.double() - exact).abs()
        ok = err <= _bf16_ulp(exact)
        assert bool(ok.all()), f"{what}: {g.tolist()} vs {exact.tolist()}"
    elif g.dtype.is_floating_point:
        torch.testing.assert_close(g.double(), exact, rtol=2e-6, atol=2e-6, msg=lambda m: f"{what}: {m}")
    else:
        assert torch.equal(g, exact.to(g.dtype)), f"{what}: {g.tolist()} vs {exact.tolist()}"


_REF = {
    "SUM": lambda xs: torch.stack(xs).sum(0),
    "PRODUCT": lambda xs: torch.stack(xs).prod(0),
    "MIN": lambda xs: torch.stack(xs).amin(0),
    "MAX": lambda xs: torch.stack(xs).amax(0),
    "AVG": lambda xs: torch.stack(xs).mean(0),
}


def _scenario_collectives(rank: int, world: int) -> dict:
    import neuron_emu

    out = {}
    for b in BUILDS:
        neuron_emu.use_build(b)
        out[b] = _collectives(rank, world)
    return out


def _collectives(rank: int, world: int) -> dict:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    import neuron_emu

    R = dist.ReduceOp
    digest = hashlib.sha256()

    def keep(t):  # a result that every rank must hold bitwise alike
        digest.update(t.cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())

    # all_reduce: every op on float32 and bfloat16 against float64 math
    for seed, dt in enumerate((torch.float32, torch.bfloat16)):
        for op in ("SUM", "PRODUCT", "MIN", "MAX", "AVG"):
            xs = [_data(r, (5, 3), dt, seed) for r in range(world)]
            t = xs[rank].to(D)
            dist.all_reduce(t, op=getattr(R, op))
            _close(t, _REF[op]([x.double() for x in xs]), f"all_reduce {op} {dt}")
            keep(t)
    # integers: arithmetic and bitwise
    xs = [_data(r, (7,), torch.int32, 3) for r in range(world)]
    for op, fn in (("SUM", lambda a, b: a + b), ("MIN", torch.minimum), ("MAX", torch.maximum),
                   ("BAND", torch.bitwise_and), ("BOR", torch.bitwise_or), ("BXOR", torch.bitwise_xor)):
        t = xs[rank].to(D)
        dist.all_reduce(t, op=getattr(R, op))
        want = xs[0].long()
        for x in xs[1:]:
            want = fn(want, x.long())
        assert torch.equal(t.cpu(), want.int()), (op, t.cpu(), want)
        keep(t)
    big = [torch.full((3,), 2 ** 40 + r, dtype=torch.int64) for r in range(world)]
    t = big[rank].to(D)
    dist.all_reduce(t)
    assert t.cpu().tolist() == [sum(2 ** 40 + r for r in range(world))] * 3  # int64 bytes intact
    bools = [_data(r, (6,), torch.bool, 4) for r in range(world)]
    t = bools[rank].to(D)
    dist.all_reduce(t, op=R.MAX)
    assert torch.equal(t.cpu(), torch.stack(bools).any(0))
    w = dist.all_reduce(torch.ones(2, device=D), async_op=True)
    assert w.wait() and w.is_completed()
    t = torch.ones(3, dtype=torch.bfloat16, device=D)
    with neuron_emu.op_tracking() as ops:
        dist.all_reduce(t)
    assert ops == {}, ops          # the backend's own copies are not the user's ops

    # broadcast from the last rank
    for dt in (torch.bfloat16, torch.int64, torch.float64):
        t = _data(rank, (4, 2), dt, 5).to(D)
        dist.broadcast(t, src=world - 1)
        assert torch.equal(t.cpu(), _data(world - 1, (4, 2), dt, 5)), dt
        keep(t)

    # all_gather, all_gather_into_tensor (and its 2.13 name), all_gather_object
    xs = [_data(r, (3, 2), torch.bfloat16, 6) for r in range(world)]
    outs = [torch.empty(3, 2, dtype=torch.bfloat16, device=D) for _ in range(world)]
    dist.all_gather(outs, xs[rank].to(D))
    for r in range(world):
        assert torch.equal(outs[r].cpu(), xs[r])
    out = torch.empty(world * 3, 2, dtype=torch.bfloat16, device=D)
    dist.all_gather_into_tensor(out, xs[rank].to(D))
    assert torch.equal(out.cpu(), torch.cat(xs))
    keep(out)
    out = torch.empty(world * 6, dtype=torch.bfloat16, device=D)
    dist.all_gather_single(out, xs[rank].to(D))
    assert torch.equal(out.cpu(), torch.cat(xs).reshape(-1))
    objs = [None] * world
    dist.all_gather_object(objs, {"rank": rank})
    assert objs == [{"rank": r} for r in range(world)]

    # reduce_scatter_tensor (SUM, float32 and bf16) and reduce_scatter (lists, MAX)
    for seed, dt in enumerate((torch.float32, torch.bfloat16), start=7):
        xs = [_data(r, (world * 4,), dt, seed) for r in range(world)]
        out = torch.empty(4, dtype=dt, device=D)
        dist.reduce_scatter_tensor(out, xs[rank].to(D))
        exact = torch.stack([x.double() for x in xs]).sum(0)[rank * 4:(rank + 1) * 4]
        _close(out, exact, f"reduce_scatter_tensor {dt}")
    lists = [[_data(r * world + q, (3,), torch.float32, 9) for q in range(world)] for r in range(world)]
    out = torch.empty(3, device=D)
    dist.reduce_scatter(out, [t.to(D) for t in lists[rank]], op=R.MAX)
    _close(out, torch.stack([lists[r][rank].double() for r in range(world)]).amax(0), "reduce_scatter MAX")

    # all_to_all_single: even, and uneven with empty chunks
    inp = (torch.arange(world * 2, dtype=torch.float32) + 100 * rank).to(D)
    out = torch.empty(world * 2, device=D)
    dist.all_to_all_single(out, inp)
    want = torch.cat([torch.arange(rank * 2, rank * 2 + 2, dtype=torch.float32) + 100 * r for r in range(world)])
    assert torch.equal(out.cpu(), want)

    def rows(r, q):  # rows rank r sends rank q (0 for some pairs)
        return (r + q) % 3

    send = [rows(rank, q) for q in range(world)]
    recv = [rows(r, rank) for r in range(world)]
    inp = torch.cat([torch.full((rows(rank, q), 2), 1000.0 * rank + 10 * q) for q in range(world)]).to(D)
    out = torch.full((sum(recv), 2), -1.0, device=D)
    dist.all_to_all_single(out, inp, output_split_sizes=recv, input_split_sizes=send)
    want = torch.cat([torch.full((rows(r, rank), 2), 1000.0 * r + 10 * rank) for r in range(world)])
    assert torch.equal(out.cpu(), want), (out.cpu(), want)

    # all_to_all (lists, a different size per destination)
    outs = [torch.empty(rank + 1, dtype=torch.int64, device=D) for _ in range(world)]
    dist.all_to_all(outs, [torch.full((q + 1,), 10 * rank + q, device=D) for q in range(world)])
    assert [o.cpu().tolist() for o in outs] == [[10 * r + rank] * (rank + 1) for r in range(world)]

    # send / recv around the ring, and a receive from any source
    x = _data(rank, (5,), torch.bfloat16, 11).to(D)
    y = torch.empty(5, dtype=torch.bfloat16, device=D)
    w = dist.isend(x, (rank + 1) % world)
    dist.recv(y, (rank - 1) % world)
    w.wait()
    assert torch.equal(y.cpu(), _data((rank - 1) % world, (5,), torch.bfloat16, 11))
    if rank == 1:
        dist.send(torch.arange(3, device=D), 0, tag=7)
    elif rank == 0:
        z = torch.empty(3, dtype=torch.int64, device=D)
        assert dist.recv(z, tag=7) == 1 and z.cpu().tolist() == [0, 1, 2]
    dist.barrier()

    # reduce, gather, scatter
    xs = [_data(r, (4,), torch.float32, 12) for r in range(world)]
    t = xs[rank].to(D)
    dist.reduce(t, dst=0)
    if rank == 0:
        _close(t, torch.stack([x.double() for x in xs]).sum(0), "reduce")
    else:
        assert torch.equal(t.cpu(), xs[rank])   # a non-root tensor is left alone
    root = world - 1
    gl = [torch.empty(4, device=D) for _ in range(world)] if rank == root else None
    dist.gather(xs[rank].to(D), gl, dst=root)
    if rank == root:
        assert all(torch.equal(gl[r].cpu(), xs[r]) for r in range(world))
    out = torch.empty(2, 2, device=D)
    dist.scatter(out, [torch.full((2, 2), 3.0 * q).to(D) for q in range(world)] if rank == 0 else None, src=0)
    assert torch.equal(out.cpu(), torch.full((2, 2), 3.0 * rank))

    # empty tensors
    e = torch.empty(0, device=D)
    dist.all_reduce(e)
    dist.broadcast(torch.empty(0, 3, dtype=torch.bfloat16, device=D), src=0)
    out = torch.empty(0, device=D)
    dist.all_gather_into_tensor(out, torch.empty(0, device=D))
    dist.all_to_all_single(torch.empty(0, device=D), torch.empty(0, device=D), [0] * world, [0] * world)

    # what the real backends refuse: non-contiguous tensors, mismatched shapes (on every rank)
    nc = torch.ones(4, 3, device=D).t()
    for name, call in (("all_reduce", lambda: dist.all_reduce(nc)),
                       ("broadcast", lambda: dist.broadcast(nc, 0)),
                       ("all_to_all_single", lambda: dist.all_to_all_single(torch.empty(3, 4, device=D), nc)),
                       ("all_gather_into_tensor", lambda: dist.all_gather_into_tensor(
                           torch.empty(world * 12, device=D), nc))):
        try:
            call()
        except ValueError as err:
            assert "Tensors must be contiguous" in str(err), (name, err)
        else:
            raise AssertionError(f"{name} took a non-contiguous tensor")
    for name, call in (("all_reduce", lambda: dist.all_reduce(torch.ones(3 + rank, device=D))),
                       ("all_to_all_single", lambda: dist.all_to_all_single(
                           torch.empty(world, device=D), torch.empty(world, device=D),
                           [1] * world, [2] + [1] * (world - 2) + [0] if rank == 0 else [1] * world))):
        try:
            call()
        except RuntimeError as err:
            assert f"c10d::{name}" in str(err), err
        else:
            raise AssertionError(f"{name} took mismatched tensors")

    # still usable afterwards; a device mesh and the functional collectives work on it
    mesh = init_device_mesh(D, (world,))
    t = torch.full((2,), float(rank), device=D)
    dist.all_reduce(t, group=mesh.get_group())
    assert t.cpu().tolist() == [float(sum(range(world)))] * 2
    import torch.distributed._functional_collectives as fc

    got = fc.all_reduce(torch.full((3,), float(rank + 1), device=D), "sum", mesh.get_group())
    assert got.cpu().tolist() == [float(sum(range(1, world + 1)))] * 3
    assert dist.get_backend() == "neuron"
    return {"digest": digest.hexdigest(), "build": neuron_emu.active_build().name, "rank": rank}


def _scenario_native(rank: int, world: int) -> dict:
    import torch.distributed as dist

    import neuron_emu

    assert world == 4
    vals = [256.0, 1.0, 1.0, 1.0]   # 259: fp32 rounds it once to bf16 260; bf16 steps stay at 256

    def total(dt):
        t = torch.full((3,), vals[rank], dtype=dt, device=D)
        dist.all_reduce(t)
        got = t.cpu().tolist()
        assert len(set(got)) == 1
        return got[0]

    out = {"native": total(torch.bfloat16), "float32": total(torch.float32)}
    neuron_emu.use_build("2.33.0")         # every rank: the default numerics
    out["fp32"] = total(torch.bfloat16)
    return out


def _scenario_defects(rank: int, world: int) -> dict:
    import torch.distributed as dist

    assert world == 3
    t = torch.ones(4, dtype=torch.bfloat16, device=D)
    dist.all_reduce(t)                              # world size 3, bf16: wrong by 1.5x
    assert t.cpu().tolist() == [4.5] * 4, t.cpu()
    t = torch.ones(4, device=D)
    dist.all_reduce(t)                              # float32: not in the defect's dtypes
    assert t.cpu().tolist() == [3.0] * 4
    sub = dist.new_group([0, 1])
    if rank < 2:
        t = torch.ones(4, dtype=torch.bfloat16, device=D)
        dist.all_reduce(t, group=sub)               # a group of 2: not in world_sizes
        assert t.cpu().tolist() == [2.0] * 4
    try:
        dist.broadcast(torch.ones(2, device=D), src=0)
    except RuntimeError as err:
        broadcast_error = str(err)
    else:
        raise AssertionError("the error defect did not fire")
    pattern = []
    for i in range(20):
        out = torch.empty(3, device=D)
        dist.all_gather_into_tensor(out, torch.full((1,), float(i + rank), device=D))
        want = torch.tensor([float(i + r) for r in range(world)])
        got = out.cpu()
        assert torch.equal(got, want) or torch.equal(got, want * 2), (got, want)
        pattern.append(not torch.equal(got, want))
    assert (torch.ones(3, device=D) + 1).cpu().tolist() == [2.0] * 3    # ATen ops untouched
    return {"pattern": pattern, "broadcast_error": broadcast_error}


def _scenario_peer_fails(rank: int, world: int) -> dict:
    import torch.distributed as dist

    try:
        dist.all_reduce(torch.ones(4, device=D))
    except RuntimeError as err:
        return {"raised": str(err)[:300]}
    raise AssertionError("the collective returned although a peer failed")


_SCENARIOS = {"collectives": _scenario_collectives, "native": _scenario_native,
              "defects": _scenario_defects, "peer_fails": _scenario_peer_fails}


def _worker(argv: list[str]) -> None:
    scenario, rank, world, store, pg_timeout = argv[0], int(argv[1]), int(argv[2]), argv[3], float(argv[4])
    import torch.distributed as dist

    import neuron_emu

    neuron_emu.register_distributed()
    neuron_emu.register_distributed()           # idempotent
    dist.init_process_group("neuron", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=pg_timeout))
    try:
        result = _SCENARIOS[scenario](rank, world)
    except BaseException:
        import traceback

        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    print("RESULT " + json.dumps(result), flush=True)
    sys.stderr.flush()
    os._exit(0)   # no teardown: a scenario may leave a failed peer behind


if __name__ == "__main__":
    import warnings

    warnings.simplefilter("ignore")
    _worker(sys.argv[1:])
