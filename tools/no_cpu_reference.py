"""Write ``conformance/data/no_cpu_reference.toml``: the overloads the CPU cannot compute in this
torch release although the registry gives them a CPU-side kernel.

Such an overload is a composite (an ``out=`` wrapper, a functional twin of an in-place op, a
``*_copy`` of a view) whose CPU path calls an op that has no CPU kernel (``_copy_from.out`` calls
``_copy_from``; ``cudnn_grid_sampler.out`` calls ``cudnn_grid_sampler``). The registry alone
cannot tell: it says which keys have a kernel, not what a composite kernel calls, and calling the
overload once on a made-up input is no proof either way (an input the op rejects for its own
reasons never reaches the inner call). So it is learned the way the schema search learns
anything: the search runs every candidate overload on the CPU (``--target cpu``: nothing of any
device), and an overload none of whose generated inputs the CPU accepted, at least one of them
rejected with ``Could not run 'aten::Y' with arguments from the 'CPU' backend`` where ``Y`` has
no CPU kernel for any layout, is listed with that ``Y``. (``Y`` with a sparse or other layout's
CPU kernel is a layout need, which coverage tells from the run, not a missing reference.)

A search's row names only its two commonest rejections, and in the run an input the op's own
meta kernel refuses never reaches the CPU (``_thnn_fused_lstm_cell.out``: the meta kernel refuses
all 120 inputs, so the run cannot show that its CPU path calls ``_thnn_fused_lstm_cell``, which
has no CPU kernel). So the run only says which overloads had no valid input; each of those is
searched again, the same derandomized search without the meta pre-check, in a forked child that
keeps every rejection (``--target cpu``; one child per overload, a crash or a hang losing that
overload alone, which is then not listed). It is listed when that search too ran no input and
some input's CPU call reached an op with no CPU kernel: an input outside the op's contract still
shows which op its CPU path dispatches to, and no input inside it was found.

This is a fact of the torch release, the same for every device and every run, so coverage reads
it from the catalog (``conformance.catalog.overloads.no_cpu_reference``) and a run with the
search, one without it and the nightly share one denominator. The search runs with the file
switched off (``CONFORMANCE_NO_CPU_REFERENCE=none``): an overload it lists is no search candidate.

    python tools/no_cpu_reference.py                      # search (about 1 h on 2 busy cores), write the file
    python tools/no_cpu_reference.py --db D.sqlite --run R  # from a stored run of that search

A stored run must have searched every candidate with the file switched off (the tool checks);
``--out -`` prints instead of writing.
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

os.environ["CONFORMANCE_NO_CPU_REFERENCE"] = "none"  # before the catalog is read: every candidate counts

ROOT = Path(__file__).resolve().parent.parent
NO_CPU = re.compile(r"Could not run '(aten::[\w.]+)' with arguments from the 'CPU' backend")


def search(db: Path, run_id: str, workers: int) -> None:
    """The schema search over every candidate overload on the CPU target, stored in ``db``."""
    cmd = [sys.executable, "-m", "conformance", "run", "--target", "cpu", "--ops", "aten::*", "--no-corpus",
           "--contracts", "none", "--sizes", "samples", "--refcache", "none", "-n", str(workers),
           "--db", str(db), "--run-id", run_id]
    print("+", " ".join(cmd), file=sys.stderr)
    subprocess.run(cmd, check=False, cwd=ROOT, env={**os.environ, "CONFORMANCE_NO_CPU_REFERENCE": "none"})


def _rejections_child(name: str, crash_safe: bool, conn: Any) -> None:
    import torch

    from conformance.sweep import schema
    from conformance.sweep.opinfo import SweepConfig
    from conformance.targets import get_target
    from conformance.work import Group

    torch.set_num_threads(1)
    # the run's search without its pre-check against the op's meta kernel ("every"): an input the
    # meta kernel refuses still shows which op the CPU path calls, where no valid input was found
    config = dataclasses.replace(SweepConfig(), reference_check="failing", contracts=("none",))
    try:
        found = schema._search(get_target("cpu"), schema.OverloadInfo(name), Group(name, "any", "schema"), config,
                               crash_safe=crash_safe, check_errors=False)
    except Exception as exc:  # noqa: BLE001 - no input could be made (a Storage argument): nothing learned
        conn.send((0, {f"{type(exc).__name__}: {exc}": 1}))
        return
    conn.send((len(found.accepted), dict(found.rejected)))


def rejections(name: str, timeout_s: float = 180.0) -> tuple[int, dict[str, int]] | None:
    """(accepted inputs, every CPU rejection message and its count) of the search for ``name``,
    in a forked child, searched again crash-safe if the child died; None when it hung (past
    ``timeout_s``) or died twice."""
    ctx = multiprocessing.get_context("fork")
    for crash_safe in (False, True):
        recv, send = ctx.Pipe(duplex=False)
        child = ctx.Process(target=_rejections_child, args=(name, crash_safe, send), daemon=True)
        child.start()
        send.close()
        hung = not recv.poll(timeout_s)
        try:
            got = None if hung else recv.recv()
        except EOFError:  # the child died: an input crashed the CPU
            got = None
        if child.is_alive():
            child.kill()
        child.join()
        if got is not None or hung:
            return got
    return None


def learned(db: Path, run_id: str) -> tuple[str, dict[str, str], list[str], list[str]]:
    """(torch version, overload -> the op without a CPU kernel it calls, candidates the run
    lacks, overloads with no accepted input whose search could not be repeated)."""
    from conformance.catalog.overloads import cpu_layout_kernel
    from conformance.sweep.schema.candidates import schema_candidates
    from opdb import Store

    with Store.open(db, create=False) as st:
        run = st.get_run(run_id)
        if run is None:
            raise SystemExit(f"{db}: no run {run_id!r}")
        rows = list(st.db.execute("select op, status from op_results where run_id = ? and variant = 'schema'",
                                  [run_id]))
    missing = sorted(set(schema_candidates()) - {op for op, _ in rows})
    none_valid = sorted(op for op, status in rows if status == "skip")
    out, lost = {}, []
    for i, op in enumerate(none_valid, 1):
        got = rejections(op)
        if got is None:
            lost.append(op)
            continue
        accepted, rejected = got
        inner = {m.group(1) for text in rejected if (m := NO_CPU.search(text))}
        inner = sorted(y for y in inner if cpu_layout_kernel(y) is None)
        if not accepted and inner:
            out[op] = inner[0]
        print(f"[{i}/{len(none_valid)}] {op}: {out.get(op, '-')}", file=sys.stderr)
    return str(run["torch_version"]), dict(sorted(out.items())), missing, lost


def render(torch_version: str, found: dict[str, str], source: str) -> str:
    release = torch_version.split("+", 1)[0]
    lines = [
        f"# Overloads the CPU cannot compute in torch {release}, although the registry gives them a CPU-side",
        "# kernel: a composite whose CPU path calls an op with no CPU kernel (the value). No target's result",
        "# on one can be compared, so coverage counts each as no_cpu_kernel in every run, searched or not.",
        "# Learned by the schema search on the CPU, not written by hand; ignored (with a warning) on",
        "# another torch release. Made by tools/no_cpu_reference.py from",
        f"# {source}.",
        f'torch = "{release}"',
        "",
        "[overloads]",
    ]
    lines += [f'"{name}" = "{inner}"' for name, inner in found.items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", type=Path, help="a database holding the search's run (default: a new temporary one)")
    ap.add_argument("--run", help="the stored run to read (default: run the search now)")
    ap.add_argument("-n", "--workers", type=int, default=2)
    ap.add_argument("--out", default=str(ROOT / "conformance" / "data" / "no_cpu_reference.toml"),
                    help="where to write ('-': stdout)")
    args = ap.parse_args(argv)
    import torch

    run_id = args.run
    with tempfile.TemporaryDirectory() as tmp:
        db = args.db or Path(tmp) / "no_cpu_reference.sqlite"
        if run_id is None:
            run_id = f"no-cpu-reference-{torch.__version__}"
            search(db, run_id, args.workers)
        version, found, missing, lost = learned(db, run_id)
    if version.split("+", 1)[0] != torch.__version__.split("+", 1)[0]:
        print(f"run {run_id} is of torch {version}, this is {torch.__version__}: its catalog differs", file=sys.stderr)
        return 2
    if missing:
        print(f"run {run_id} did not search {len(missing)} candidate overloads (e.g. {', '.join(missing[:3])}): "
              "a file from it would leave them out; run the search with CONFORMANCE_NO_CPU_REFERENCE=none",
              file=sys.stderr)
        return 2
    if lost:
        print(f"{len(lost)} overloads' searches died or hung twice and are not listed: {', '.join(lost)}",
              file=sys.stderr)
    source = (f"its own search ({run_id}: conformance run --target cpu --ops 'aten::*' --no-corpus)"
              if args.run is None else f"the search of stored run {run_id}")
    text = render(version, found, source)
    if args.out == "-":
        sys.stdout.write(text)
    else:
        Path(args.out).write_text(text)
        print(f"{args.out}: {len(found)} overloads for torch {version.split('+', 1)[0]}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
