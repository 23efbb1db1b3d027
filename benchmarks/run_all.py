"""Run every benchmark (``benchmarks/benchmarks.toml``) and print one table of their figures.

Each benchmark runs as its own process, in the file's order, with the arguments that keep it to
a minute or two on a 2-core machine; the lines of its output that its ``figures`` patterns match
are quoted in the table, with its wall time. A benchmark that fails, or prints no figure line,
is marked so and makes the exit status 1: the table never quotes a figure that was not produced.
All output goes to ``--out`` (default: a new temporary folder), one log per benchmark.

    python benchmarks/run_all.py                      # everything but the heavy ones (what `nox -s bench` runs)
    python benchmarks/run_all.py --heavy              # and the nightly cold/warm and the test suite (over an hour)
    python benchmarks/run_all.py --only item_cost.py --only bench_gate.py
    python benchmarks/run_all.py --list               # what would run, with why
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
CONFIG = HERE / "benchmarks.toml"


class ConfigError(ValueError):
    """benchmarks.toml is wrong: names the entry, the field and the value."""


@dataclass(frozen=True)
class Benchmark:
    script: str
    args: tuple[str, ...]
    figures: tuple[re.Pattern[str], ...]
    why: str
    label: str  # the script's name, numbered when the list runs it more than once
    heavy: bool = False  # tens of minutes (the whole nightly, the test suite): only with --heavy


def load(path: Path = CONFIG) -> list[Benchmark]:
    """The benchmarks of ``path``, validated: every script exists, every pattern compiles."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read it ({exc})") from None
    entries = data.get("benchmark")
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"{path}: expected [[benchmark]] entries")
    out = []
    for i, e in enumerate(entries):
        where = f"{path.name}: benchmark {i + 1}"
        unknown = set(e) - {"script", "args", "figures", "why", "heavy"}
        if unknown:
            raise ConfigError(f"{where}: unknown field {sorted(unknown)[0]!r} (script, args, figures, why, heavy)")
        heavy = e.get("heavy", False)
        if not isinstance(heavy, bool):
            raise ConfigError(f"{where}: heavy {heavy!r} must be true or false")
        script = e.get("script")
        if not isinstance(script, str) or not (HERE / script).is_file():
            raise ConfigError(f"{where}: script {script!r} is not a file in {HERE}")
        args = e.get("args", [])
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise ConfigError(f"{where} ({script}): args {args!r} must be a list of strings")
        figures = e.get("figures")
        if not isinstance(figures, list) or not figures:
            raise ConfigError(f"{where} ({script}): figures must be a non-empty list of patterns")
        compiled = []
        for f in figures:
            try:
                compiled.append(re.compile(f))
            except (re.error, TypeError) as exc:
                raise ConfigError(f"{where} ({script}): figure pattern {f!r}: {exc}") from None
        why = e.get("why")
        if not isinstance(why, str) or not why:
            raise ConfigError(f"{where} ({script}): why (where the figure is quoted) is missing")
        seen = sum(b.script == script for b in out)
        label = script.removesuffix(".py") + (f" ({seen + 1})" if seen else "")
        out.append(Benchmark(script, tuple(args), tuple(compiled), why, label, heavy))
    return out


def unlisted(benchmarks: list[Benchmark]) -> list[str]:
    """Scripts in benchmarks/ that nothing runs."""
    listed = {b.script for b in benchmarks} | {Path(__file__).name}
    return sorted(p.name for p in HERE.glob("*.py") if p.name not in listed and not p.name.startswith("_"))


@dataclass
class Outcome:
    bench: Benchmark
    rc: int
    wall_s: float
    figures: list[str]
    log: Path


def run(bench: Benchmark, db: Path, out: Path, python: str) -> Outcome:
    args = [a.replace("{db}", str(db)).replace("{tmp}", str(out)) for a in bench.args]
    log = out / f"{bench.label.replace(' (', '-').rstrip(')')}.log"
    start = time.monotonic()
    with log.open("w", encoding="utf-8") as fh:
        proc = subprocess.run([python, str(HERE / bench.script), *args], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, cwd=HERE.parent)
        fh.write(proc.stdout)
    wall = time.monotonic() - start
    lines = [ln.strip() for ln in proc.stdout.splitlines()]
    figures = [ln for ln in lines if ln and any(p.search(ln) for p in bench.figures)]
    return Outcome(bench, proc.returncode, wall, figures, log)


def table(outcomes: list[Outcome]) -> str:
    rows = ["| benchmark | s | figures |", "|---|---:|---|"]
    for o in outcomes:
        if o.rc != 0:
            figs = f"FAILED (exit {o.rc}; see {o.log})"
        elif not o.figures:
            figs = f"NO FIGURE LINE (see {o.log})"
        else:
            figs = "<br>".join(" ".join(f.split()) for f in o.figures)
        rows.append(f"| {o.bench.label} | {o.wall_s:.0f} | {figs} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", action="append", metavar="SCRIPT", help="run just these (repeatable)")
    ap.add_argument("--out", help="folder for the logs and the shared database (default: a new one)")
    ap.add_argument("--list", action="store_true", help="print what would run, and why, then exit")
    ap.add_argument("--heavy", action="store_true",
                    help="also the heavy ones (the nightly cold and warm, the test suite idle and loaded: over an hour)")
    a = ap.parse_args(argv)
    try:
        benchmarks = load()
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    stray = unlisted(benchmarks)
    if stray:
        print(f"error: benchmarks/ scripts that nothing runs (add them to {CONFIG.name}): {', '.join(stray)}",
              file=sys.stderr)
        return 2
    if a.only:
        unknown = sorted(set(a.only) - {b.script for b in benchmarks})
        if unknown:
            print(f"error: --only {unknown[0]!r}: not in {CONFIG.name}", file=sys.stderr)
            return 2
        benchmarks = [b for b in benchmarks if b.script in a.only]
    elif not a.heavy:
        benchmarks = [b for b in benchmarks if not b.heavy]
    if a.list:
        for b in benchmarks:
            print(f"{b.label:28} {' '.join(b.args)}\n{'':28} {b.why}")
        return 0
    out = Path(a.out) if a.out else Path(tempfile.mkdtemp(prefix="bench-"))
    out.mkdir(parents=True, exist_ok=True)
    db = out / "shared.sqlite"
    outcomes = []
    for i, b in enumerate(benchmarks, 1):
        print(f"[{i}/{len(benchmarks)}] {b.label} {' '.join(b.args)}", flush=True)
        try:
            o = run(b, db, out, sys.executable)
        except KeyboardInterrupt:
            print("interrupted: the table holds the benchmarks that finished", file=sys.stderr)
            break
        outcomes.append(o)
        print(f"      {o.wall_s:.0f} s, exit {o.rc}, {len(o.figures)} figure line(s)", flush=True)
    print()
    print(table(outcomes))
    print(f"\nlogs: {out}")
    return 0 if outcomes and all(o.rc == 0 and o.figures for o in outcomes) and len(outcomes) == len(benchmarks) else 1


if __name__ == "__main__":
    sys.exit(main())
