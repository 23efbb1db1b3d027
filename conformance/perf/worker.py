"""A perf worker: one process holding one target build, timing the calls it is asked to.

The lane (:mod:`conformance.perf.lane`) starts one worker for the baseline build and one for the
candidate and drives them in turn over a pipe, so the two builds are measured interleaved, in the
same session, on the same inputs (each worker builds them from the same seed). A worker runs one
intra-op thread (``torch.set_num_threads(1)``) so a measurement is one core's work, and times each
call on its own (``time.perf_counter_ns`` around the call and the target's ``synchronize``) with
the garbage collector off, as ``timeit`` does.

Requests (tuples) and replies:

* ``("prepare", item_dict)`` -> ``{"signature", "reached", "first_s"}``: builds the item's call,
  runs it twice (warm-up; the first under the target's op trace, whose overloads are
  ``reached``); an exception is replied as ``{"error": "Type: message"}``.
* ``("time", reps)`` -> ``{"times": [seconds, ...]}``: ``reps`` timed calls of the prepared item.
* ``("stop",)``: the worker exits.

A call that crashes the process or never returns is the lane's to notice (the pipe closes, or no
reply comes within its timeout).
"""

from __future__ import annotations

import gc
import os
import time
from typing import Any


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:500]


def serve(conn: Any, target_name: str, build: str | None, env: tuple[str, ...] = (), threads: int = 1) -> None:
    """The worker's loop (the process's entry point)."""
    import torch

    from conformance.targets import get_target
    from conformance.targets.base import set_env

    set_env(env)
    torch.set_num_threads(threads)
    try:
        target = get_target(target_name, build)
        target.setup()
    except Exception as exc:  # noqa: BLE001 - the lane reports it as the run's infra error
        conn.send({"error": _describe(exc), "infra": True})
        return
    conn.send({"ready": True, "build": target.build, "describe": target.describe()})
    from .items import PerfItem

    call = None
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        op = msg[0]
        if op == "stop":
            return
        try:
            if op == "prepare":
                call = None
                item = PerfItem.from_dict(msg[1])
                fn, sig = prepare(item, target)
                t0 = time.perf_counter()
                with target.trace() as trace:
                    fn()
                    target.synchronize()
                first = time.perf_counter() - t0
                fn()
                target.synchronize()
                call = fn
                conn.send({"signature": sig, "reached": sorted(trace.reached), "first_s": first})
            elif op == "time":
                if call is None:
                    conn.send({"error": "RuntimeError: nothing prepared"})
                    continue
                conn.send({"times": _time(call, int(msg[1]), target.synchronize)})
            else:
                conn.send({"error": f"ValueError: unknown request {op!r}"})
        except Exception as exc:  # noqa: BLE001 - the item's own failure: the lane records it
            call = None
            conn.send({"error": _describe(exc)})


def prepare(item: Any, target: Any) -> tuple[Any, str]:
    """The item's ready-to-time call and its inputs' signature: a decode step
    (:mod:`conformance.perf.decode`), else an op or a model graph (:mod:`conformance.perf.items`)."""
    if item.kind == "decode":
        from .decode import prepare as decode_step

        return decode_step(item, target)
    from .items import prepare as call_of

    return call_of(item, target)


def _time(call: Any, reps: int, sync: Any) -> list[float]:
    clock = time.perf_counter_ns
    out = []
    was = gc.isenabled()
    gc.disable()
    try:
        for _ in range(reps):
            t0 = clock()
            call()
            sync()
            out.append((clock() - t0) * 1e-9)
    finally:
        if was:
            gc.enable()
    return out


def machine() -> dict[str, Any]:
    """The machine a measurement ran on: CPU model, cores, load."""
    import platform

    model = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"cpu": model, "cores": os.cpu_count(), "load": round(os.getloadavg()[0], 2),
            "host": platform.node(), "python": platform.python_version()}


def main(argv: list[str]) -> None:
    """``python -m conformance.perf.worker FD TARGET BUILD ENV_JSON [CORE]``: serve on socket FD,
    pinned to CORE when given."""
    import json
    from multiprocessing.connection import Connection

    from conformance.run.isolation import die_with

    die_with(os.getppid(), os.getppid())  # the lane killed with -9 takes its workers with it
    fd, target, build, env, core = (*argv, "")[:5]
    if core and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {int(core)})
    conn = Connection(int(fd))
    try:
        serve(conn, target, build or None, tuple(json.loads(env)))
    finally:
        conn.close()


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
