"""One rank of the distributed lane: a process in the target's process group, running the items
the lane sends it and judging its own result against the exact answer (:mod:`.items`).

``python -m conformance.dist.rank FD RANK WORLD TARGET BUILD STORE ENV_JSON TIMEOUT_S``: serves on
socket FD; rendezvous through the FileStore at STORE. Requests: ``("item", item_dict)`` ->
``{"status", "error", "evidence"}``; ``("stop",)``.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
from typing import Any

import torch

from .items import FLOATING, DistItem, expected, rank_input, split_sizes, tolerance

_OPS = {"sum": "SUM", "product": "PRODUCT", "min": "MIN", "max": "MAX", "avg": "AVG"}


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:500]


def call(item: DistItem, rank: int, x: torch.Tensor, device: str) -> torch.Tensor | None:
    """Runs ``item``'s collective on ``x`` (this rank's input, on the device); what this rank holds
    after it."""
    import torch.distributed as dist

    ws = item.world_size
    c = item.collective
    op = getattr(dist.ReduceOp, _OPS[item.reduce_op]) if item.reduce_op else None
    if c == "all_reduce":
        dist.all_reduce(x, op=op)
        return x
    if c == "reduce_scatter_tensor":
        out = torch.empty((x.shape[0] // ws, *x.shape[1:]), dtype=x.dtype, device=device)
        dist.reduce_scatter_tensor(out, x, op=op)
        return out
    if c == "all_gather_into_tensor":
        out = torch.empty((x.shape[0] * ws, *x.shape[1:]), dtype=x.dtype, device=device)
        dist.all_gather_into_tensor(out, x)
        return out
    if c == "all_gather":
        outs = [torch.empty_like(x, memory_format=torch.contiguous_format) for _ in range(ws)]
        dist.all_gather(outs, x)
        return torch.stack(outs)
    if c == "broadcast":
        dist.broadcast(x, src=0)
        return x
    if c == "all_to_all_single":
        sends, recvs = split_sizes(item, rank)
        out = torch.empty(sum(recvs) if recvs is not None else x.shape[0], dtype=x.dtype, device=device)
        dist.all_to_all_single(out, x, output_split_sizes=recvs, input_split_sizes=sends)
        return out
    if c == "send":
        buf = torch.empty_like(x, memory_format=torch.contiguous_format)
        dst, src = (rank + 1) % ws, (rank - 1) % ws
        if rank % 2 == 0:
            dist.send(x, dst)
            dist.recv(buf, src)
        else:
            dist.recv(buf, src)
            dist.send(x, dst)
        return buf
    if c == "barrier":
        dist.barrier()
        return None
    raise ValueError(f"collective {c!r}")


def judge(item: DistItem, rank: int, got: torch.Tensor | None) -> dict[str, Any]:
    """This rank's verdict on its result: pass, or mismatch with the first wrong element."""
    inputs = [rank_input(item, r) for r in range(item.world_size)]
    want = expected(item, inputs, rank)
    if want is None:
        return {"status": "pass"}
    if got is None:
        return {"status": "mismatch", "error": "no result", "evidence": {"rank": rank}}
    got = got.cpu()
    if got.dtype != getattr(torch, item.dtype):
        return {"status": "mismatch", "error": f"rank {rank}: dtype {got.dtype}, expected torch.{item.dtype}",
                "evidence": {"rank": rank, "class": "wrong dtype"}}
    if tuple(got.shape) != tuple(want.shape):
        return {"status": "mismatch", "error": f"rank {rank}: shape {tuple(got.shape)}, expected {tuple(want.shape)}",
                "evidence": {"rank": rank, "class": "wrong shape"}}
    g = got.double() if item.dtype in FLOATING else got.long()
    tol = tolerance(item, inputs, rank, want)
    if tol is None:
        bad = ~((g == want) | (g.isnan() & want.isnan())) if item.dtype in FLOATING else g != want
    else:
        bad = ~((g - want).abs() <= tol) | (g.isnan() != want.isnan())
    if not bool(bad.any()):
        return {"status": "pass"}
    flat = bad.reshape(-1).nonzero()[0].item()
    gv, wv = g.reshape(-1)[flat].item(), want.reshape(-1)[flat].item()
    ev: dict[str, Any] = {"rank": rank, "index": flat, "got": gv, "expected": wv, "elements": int(bad.sum())}
    if item.dtype in FLOATING:
        eps = torch.finfo(getattr(torch, item.dtype)).eps
        ev["error_eps"] = abs(gv - wv) / (eps * max(abs(wv), torch.finfo(torch.float32).tiny))
        if tol is not None:
            ev["tolerance_eps"] = tol.reshape(-1)[flat].item() / (eps * max(abs(wv), torch.finfo(torch.float32).tiny))
    return {"status": "mismatch", "evidence": ev,
            "error": f"rank {rank}: {int(bad.sum())} of {bad.numel()} elements wrong; element {flat}: "
                     f"{gv!r}, expected {wv!r}"}


def run_item(item: DistItem, rank: int, target: Any) -> dict[str, Any]:
    x = rank_input(item, rank)
    try:
        dev = target.to_device(x)
        got = call(item, rank, dev, target.device)
        target.synchronize()
    except Exception as exc:  # noqa: BLE001 - the collective's own failure is the verdict
        if item.shape == "noncontiguous":
            # gloo and NCCL refuse non-contiguous tensors: a backend that does too is right
            return {"status": "pass", "evidence": {"refused": _describe(exc)}}
        return {"status": "error", "error": f"rank {rank}: {_describe(exc)}"}
    return judge(item, rank, got)


def serve(conn: Any, rank: int, world: int, target_name: str, build: str | None, store_path: str,
          env: tuple[str, ...], timeout_s: float) -> None:
    import torch.distributed as dist

    from conformance.targets import get_target
    from conformance.targets.base import set_env

    set_env(env)
    torch.set_num_threads(1)
    try:
        target = get_target(target_name, build)
        target.setup()
        backend = target.dist_backend()
        if backend is None:
            raise RuntimeError(f"target {target_name} has no torch.distributed backend for device {target.device!r}")
        store = dist.FileStore(store_path, world)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout_s))
    except Exception as exc:  # noqa: BLE001 - the lane reports it as the run's infra error
        conn.send({"error": _describe(exc), "infra": True})
        return
    conn.send({"ready": True, "build": target.build, "backend": backend})
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            break
        if msg[0] == "stop":
            break
        try:
            reply = run_item(DistItem.from_dict(msg[1]), rank, target)
        except Exception as exc:  # noqa: BLE001 - a harness failure: say so, keep serving
            reply = {"status": "error", "error": f"rank {rank}: harness: {_describe(exc)}"}
        conn.send(reply)
    try:
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001,S110 - a broken group at exit
        pass


def main(argv: list[str]) -> None:
    from multiprocessing.connection import Connection

    from conformance.run.isolation import die_with

    die_with(os.getppid(), os.getppid())
    fd, rank, world, target, build, store, env, timeout = argv
    conn = Connection(int(fd))
    try:
        serve(conn, int(rank), int(world), target, build or None, store, tuple(json.loads(env)), float(timeout))
    finally:
        conn.close()


if __name__ == "__main__":
    main(sys.argv[1:])
