"""The test suite's wall time, idle and under load, in one run on this machine.

Runs the README's test command as ``nox -s tests`` runs it (``pytest -n 2 --dist loadgroup``,
``PYTHONHASHSEED=0``) with this interpreter, once as the machine is, then once with two
processes burning a core each (a shared CI machine), and prints each pass's wall time (pytest's
own, from its summary line) and its result. A pass that fails exits 1 after both are printed.

Example (in the environment `nox -s tests` made)::

    .nox/tests/bin/python benchmarks/suite_time.py
    .nox/tests/bin/python benchmarks/suite_time.py --passes idle
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SUMMARY = re.compile(r"^=*\s*(\d+ (?:passed|failed).*?) in ([0-9.]+)s", re.M)  # with -q: no '=' around it


def one(label: str, burners: int) -> int:
    procs = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(burners)]
    try:
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-q",
                               "-p", "no:cacheprovider"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, env={**os.environ, "PYTHONHASHSEED": "0"})
        wall = time.monotonic() - t0
    finally:
        for p in procs:
            p.kill()
            p.wait()
    found = SUMMARY.findall(proc.stdout)
    result, took = (found[-1][0], float(found[-1][1])) if found else ("no summary line", wall)
    print(f"{label}: pytest {took / 60:.1f} min ({wall / 60:.1f} min wall), exit {proc.returncode}: {result}")
    return proc.returncode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--passes", default="idle,loaded", help="idle, loaded (two busy loops), or both")
    args = ap.parse_args()
    try:
        import xdist  # noqa: F401
    except ImportError:
        sys.exit("pytest-xdist is missing: run this with the interpreter of `nox -s tests` (.nox/tests/bin/python)")
    rcs = [one(p, 2 if p == "loaded" else 0) for p in args.passes.split(",")]
    sys.exit(1 if any(rcs) else 0)


if __name__ == "__main__":
    main()
